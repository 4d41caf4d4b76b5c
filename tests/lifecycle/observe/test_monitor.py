"""The live invariant monitor: a real run's log passes, and each rule fails on the log of the bug it names.

The passing log is a real ``lifecycle run`` (2 engines, rollout FT, offload, engine-1 SIGKILLed at step 3
and recovered). Each failing case re-introduces one bug class into that log the way the shell would have
written it (an engine caught up with an old version, a monitor that keeps probing, ...); the runtime
mutants themselves run against ``trace check`` in ``tests/mutants/test_trace_check_mutants.py``.
"""

from __future__ import annotations

import copy
import json
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from lifecycle.cli import main
from lifecycle.decide.config import LifecycleConfig
from lifecycle.decide.events import VIOLATED, EventLog, JsonlSink, read_jsonl
from lifecycle.observe.monitor import JUDGED, EventMonitor, InvariantViolated, MonitorSink
from tests.helpers import EVENT_LOGS

LOG = EVENT_LOGS / "rollout_ft_kill_events.jsonl"
Event = dict[str, Any]


def real() -> list[Event]:
    return read_jsonl(LOG)


def shifted(ts: str, seconds: float) -> str:
    """A log timestamp ``seconds`` later, in the log's own fixed-width form."""
    moved = datetime.fromisoformat(ts.replace("Z", "+00:00")) + timedelta(seconds=seconds)
    return moved.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def names(events: list[Event]) -> list[str]:
    return [v.invariant for v in EventMonitor().feed_all(events)]


def where(events: list[Event], **match: Any) -> list[int]:
    return [i for i, e in enumerate(events) if all(e.get(k) == v for k, v in match.items())]


def transition(machine: str, instance: str, src: str, dst: str, trigger: str, effects: tuple[str, ...] = ()) -> Event:
    return {
        "event": "lifecycle.transition",
        "machine": machine,
        "instance": instance,
        "src": src,
        "dst": dst,
        "trigger": trigger,
        "effects": list(effects),
    }


def started(**flags: Any) -> Event:
    config = LifecycleConfig.from_mapping(flags, check_paths=False)
    return {"event": "lifecycle.started", "config": config.to_dict()}


def test_the_real_fault_run_breaks_no_invariant() -> None:
    events = real()
    assert {"engine.weights", "engine.memory", "engine.probe", "engine.routed", "weights.committed"} <= {
        e["event"] for e in events
    }  # the log holds every kind of fact the rules read
    assert names(events) == []


def test_an_engine_caught_up_with_an_old_version_is_serving_without_the_committed_weights() -> None:
    events = real()
    recovered = next(
        i for i in where(events, event="engine.weights", instance="engine-1") if events[i].get("step") == 3
    )
    events[recovered]["weight_version"] = "0"  # what recovered_engine_gets_old_weights makes the engine load
    found = EventMonitor().feed_all(events)
    assert [v.invariant for v in found] == ["serving_engines_hold_current_weights"]
    assert "engine-1 entered Serving holding weight version 0, the committed version is 3" in found[0].problem
    assert recovered in found[0].related  # the context names the weights the engine reported


def test_a_monitor_that_keeps_probing_after_its_pause_is_caught_and_a_late_result_in_the_pause_window_is_not() -> None:
    events = real()
    pause = where(events, event="lifecycle.transition", machine="monitor", trigger="pause")[1]
    probe = {"event": "engine.probe", "instance": "engine-0", "by": "monitor", "outcome": "ok", "stale": False}
    in_window = [*events[: pause + 1], probe, *events[pause + 1 :]]  # before the pause handler ran: tolerated
    assert names(in_window) == []
    next_rollout = next(i for i in range(pause + 1, len(events)) if events[i].get("machine") == "rollout")
    late = [*events[: next_rollout + 1], probe, *events[next_rollout + 1 :]]
    assert names(late) == ["monitors_run_only_during_generate_or_eval"]
    stale = [*events[: next_rollout + 1], {**probe, "stale": True}, *events[next_rollout + 1 :]]
    assert names(stale) == []  # a result the monitor discarded is no violation


def test_an_engine_published_to_the_router_while_quiesced_is_caught() -> None:
    events = real()
    drain = where(events, event="lifecycle.transition", instance="engine-0", trigger="drain")[0]
    routed = {"event": "engine.routed", "instance": "engine-0", "router": "router-rollout"}
    assert names([*events[: drain + 1], routed, *events[drain + 1 :]]) == ["traffic_only_to_serving"]


def test_a_routed_fact_is_judged_at_the_time_its_publish_was_done_not_when_its_batch_came_back() -> None:
    """vLLM's hang-engine cell: the engine was published while Serving, then marked Unhealthy (the probes) while
    another command of the same batch hung; the fact is logged after the mark. Its ``done_at`` (the runner's
    stamp) places it before the mark: no violation. A publish done *after* the mark is one."""
    events = real()
    enter = where(events, event="lifecycle.transition", instance="engine-1", dst="Serving")[0]
    leave = next(
        i
        for i in range(enter + 1, len(events))
        if events[i].get("instance") == "engine-1" and events[i].get("event") == "lifecycle.transition"
    )
    assert events[leave]["dst"] != "Serving"
    between = shifted(events[enter]["ts"], 1e-6)  # right after it entered Serving
    assert events[enter]["ts"] < between < events[leave]["ts"]
    routed = {"event": "engine.routed", "instance": "engine-1", "router": "local-rollout"}
    late_log = [*events[: leave + 1], {**routed, "done_at": between}, *events[leave + 1 :]]
    assert names(late_log) == []
    late_publish = [
        *events[: leave + 1],
        {**routed, "done_at": shifted(events[leave]["ts"], 1e-6)},
        *events[leave + 1 :],
    ]
    assert names(late_publish) == ["traffic_only_to_serving"]
    unstamped = [*events[: leave + 1], routed, *events[leave + 1 :]]  # the runner's stamp is what tells them apart
    assert names(unstamped) == ["traffic_only_to_serving"]


def test_an_update_that_does_not_release_the_engine_lock_is_caught() -> None:
    events = real()
    done = where(events, event="lifecycle.transition", machine="rollout", trigger="update_done")[2]
    events[done]["effects"] = []
    assert names(events)[0] == "engine_lock_held_only_while_updating"


def test_an_onload_that_never_resumes_the_kv_cache_is_caught_when_the_engine_serves() -> None:
    events = real()
    resume_kv = where(events, event="engine.memory", instance="engine-0", op="resume", tag="kv_cache")[0]
    events[resume_kv]["tag"] = "weights"  # onload_restores_one_tag: the weights resumed twice
    found = names(events)
    assert found and set(found) == {"onload_restores_what_offload_released"}


def test_replay_that_calls_the_rollout_function_is_caught() -> None:
    replay = started(load_debug_rollout_data="/data/rollout_{rollout_id}.pt")
    source = {"event": "rollout.source", "rollout_id": 0, "source": "rollout_fn"}
    assert names([replay, {**source, "source": "replay"}]) == []
    assert names([replay, source]) == ["replay_never_constructs"]
    construct = transition("rollout", "rollout", "Init", "Constructed", "init", ("construct_rollout_fn",))
    assert names([replay, construct]) == ["replay_never_constructs"]


def test_train_only_ft_never_recovers_a_rollout_engine_and_never_creates_a_monitor() -> None:
    train_only = started(use_fault_tolerance=True, ft_components=["train"], rollout_num_gpus=2)
    recover = transition("engine", "engine-0", "Unhealthy", "Recovering", "recover", ("recover_engine",))
    monitor = transition("monitor", "monitor", "Init", "Paused", "create", ("start_monitor",))
    assert names([train_only, recover]) == ["recover_only_with_rollout_ft", "train_only_ft_never_recovers_rollout"]
    assert names([train_only, monitor]) == ["train_only_ft_never_recovers_rollout"]
    never_created = transition("monitor", "monitor", "Init", "Stopped", "dispose")  # disposing what never existed
    assert names([train_only, never_created]) == []
    rollout_ft = started(use_fault_tolerance=True, ft_components=["rollout"], rollout_num_gpus=2)
    assert names([rollout_ft, recover, monitor]) == []


def test_only_restricts_the_rules_and_an_unknown_name_is_refused() -> None:
    events = real()
    events[where(events, event="lifecycle.transition", machine="rollout", trigger="update_done")[0]]["effects"] = []
    assert EventMonitor(only=["traffic_only_to_serving"]).feed_all(events) == []
    with pytest.raises(ValueError, match="not judged from events: no_deadlock"):
        EventMonitor(only=["no_deadlock"])


def test_the_live_sink_logs_each_violation_right_after_its_event_at_the_index_trace_check_reports(
    tmp_path: Path,
) -> None:
    path = tmp_path / "events.jsonl"
    log = EventLog([JsonlSink(path)])
    sink = MonitorSink(log, LifecycleConfig.from_mapping({"rollout_num_gpus": 1}))
    log.add_sink(sink)
    start = transition("engine", "engine-0", "Init", "Starting", "start")
    log.emit(start.pop("event"), **start)
    log.emit("engine.routed", instance="engine-0", router="local-rollout")
    sink.log.remove_sink(sink)
    written = read_jsonl(path)
    assert [e["event"] for e in written] == ["lifecycle.transition", "engine.routed", VIOLATED]
    assert written[2]["invariant"] == "traffic_only_to_serving" and written[2]["at"] == 1
    assert written[2]["events"] == ["engine.routed engine-0 router=local-rollout"]  # the event that broke it
    assert written[2]["instance"] == "engine-0"  # the lane the timeline marks it on
    with pytest.raises(InvariantViolated, match="invariant traffic_only_to_serving violated"):
        sink.raise_if_violated()
    assert [v.index for v in EventMonitor(LifecycleConfig.from_mapping({"rollout_num_gpus": 1})).feed_all(written)] == [
        1
    ]


def _write(tmp_path: Path, events: list[Event]) -> Path:
    path = tmp_path / "events.jsonl"
    path.write_text("".join(json.dumps(e) + "\n" for e in events))
    return path


def test_trace_check_passes_a_good_log_and_names_the_first_violation_with_its_context(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["trace", "check", str(LOG)]) == 0
    assert f"no violation of {len(JUDGED)} invariants" in capsys.readouterr().out
    events = real()
    for i in where(events, event="engine.weights", instance="engine-1"):
        if events[i].get("step") == 3:
            events[i]["weight_version"] = "0"
    path = _write(tmp_path, events)
    assert main(["trace", "check", str(path)]) == 1
    out = capsys.readouterr().out
    assert out.startswith("invariant serving_engines_hold_current_weights violated at event ")
    assert "rule: (4) Every Serving (routable) engine holds the committed weight version" in out
    assert ">>" in out and "engine[engine-1] Quiesced --resume--> Serving" in out  # the event that showed it
    assert " * " in out and "engine.weights engine-1 weight_version=0" in out  # the related event, marked
    assert main(["trace", "check", str(path), "--invariant", "traffic_only_to_serving"]) == 0


def test_trace_check_of_a_torn_log_judges_every_whole_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "events.jsonl"
    path.write_bytes(LOG.read_bytes() + b'{"event": "lifecycle.trans')
    assert main(["trace", "check", str(path)]) == 0
    assert "the last line is incomplete" in capsys.readouterr().err


def test_trace_check_without_the_config_line_asks_for_config(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    events = [e for e in real() if e["event"] != "lifecycle.started"]
    path = _write(tmp_path, copy.deepcopy(events))
    assert main(["trace", "check", str(path)]) == 2
    err = capsys.readouterr().err
    assert "no lifecycle.started line" in err and "pass --config FILE" in err
    settings = tmp_path / "run.toml"
    settings.write_text('use_fault_tolerance = true\nft_components = ["rollout"]\nrollout_num_gpus = 2\n')
    assert main(["trace", "check", str(path), "--config", str(settings)]) == 0


def test_the_runner_writes_its_config_line_once_first() -> None:
    from lifecycle.decide.events import capture
    from lifecycle.decide.runner import Runner

    log = EventLog()
    runner = Runner(LifecycleConfig.from_mapping({"debug_train_only": True}), log=log)
    runner.provide({f"{m}.{e}": lambda c: None for m, e in runner.core.commands()})  # type: ignore[misc]
    with capture(log) as events:
        runner.check()
        runner.check()
    assert [e["event"] for e in events] == ["lifecycle.started"]
    assert LifecycleConfig.from_mapping(events[0]["config"]) == runner.config  # the config, whole


# -- resume (issue 18): weight versions never go backwards ------------------------------------------------------------
RESUMED_LOG = EVENT_LOGS / "resumed_run_events.jsonl"


def resumed() -> list[Event]:
    """A real run SIGKILLed at step 3 (checkpoint after step 2, step 2 run once more) and resumed, in one file."""
    return read_jsonl(RESUMED_LOG)


def test_the_real_resumed_run_breaks_no_invariant() -> None:
    events = resumed()
    kinds = [e["event"] for e in events]
    assert kinds.count("lifecycle.started") == 2 and kinds.count("job.resumed") == 1
    commits = [e["weight_version"] for e in events if e["event"] == "weights.committed"]
    assert commits == ["0", "1", "2", "3", "2", "3", "4"]  # the dead driver's 3 is discarded with its step
    assert names(events) == []


def test_a_committed_version_older_than_the_last_one_is_caught() -> None:
    events = resumed()
    third = where(events, event="weights.committed", weight_version="3")[0]
    events[third]["weight_version"] = "1"  # after 2: backwards
    found = EventMonitor().feed_all(events)
    assert [v.invariant for v in found] == ["weight_version_never_goes_backwards"]
    assert "weight version 1 was committed after version 2" in found[0].problem


def test_a_resumed_run_that_first_commits_another_version_than_its_checkpoint_is_caught() -> None:
    events = resumed()
    at = where(events, event="job.resumed")[0]
    first = next(i for i in where(events, event="weights.committed") if i > at)
    events[first]["weight_version"] = "0"  # engines relaunched with the seed's weights, not the checkpoint's
    found = EventMonitor().feed_all(events)
    assert "weight_version_never_goes_backwards" in [v.invariant for v in found]
    assert "committed version 0 first, its checkpoint's is 2" in found[0].problem


def test_resuming_from_a_checkpoint_older_than_the_last_one_written_is_caught() -> None:
    events = resumed()
    at = where(events, event="job.resumed")[0]
    late = {"event": "job.checkpointed", "resume_at": 3, "weight_version": "3", "path": "ckpt/job-000003"}
    events.insert(at, late)  # the dead driver had written a newer checkpoint than the one resumed from
    found = EventMonitor().feed_all(events)
    assert [v.invariant for v in found] == ["weight_version_never_goes_backwards"]
    assert "resumed at weight version 2, but version 3 was checkpointed" in found[0].problem


def test_a_resumed_log_is_judged_under_each_drivers_own_config() -> None:
    events = resumed()
    configs = [e["config"]["load"] for e in events if e["event"] == "lifecycle.started"]
    assert configs[0] is None and configs[1] is not None  # the second driver resumed (--load)
    monitor = EventMonitor()
    monitor.feed_all(events)
    assert monitor.p["resumes"] is True


def test_a_second_fresh_run_in_the_same_run_directory_is_judged_afresh() -> None:
    """events.jsonl is appended to: a new run (no job.resumed) starts from version 0 again, legitimately."""
    events = real()
    assert [e["event"] for e in events].count("lifecycle.started") == 1
    assert EventMonitor().feed_all(events + real()) == []
