"""The monitor's elastic-fleet rules over hand-written event logs: the clean log passes, and each planted bug fails
naming its invariant -- in the monitor and through ``lifecycle trace check``.

The clean log (``tests/lifecycle/data/elastic_events.jsonl``) is what an elastic lock-step run with broadcast
updates writes (the events of :mod:`lifecycle.decide.events`): bounds 1..4 engines, two engines at start; step 1
scales 2 -> 3 (engine-2 joins, loads the committed weights, then serves; the weight group re-forms as generation
2); step 2 retires engine-1 (Quiesced: stopped at once) and a preemption notice withdraws engine-2 mid-generate,
which drains, is stopped and retired (generation 3 has engine-0 alone); step 3 replaces it in engine-1's slot
with a new process (epoch 2) and the group re-forms again (generation 4). Each gateway read lists exactly the
Serving engines as ``ready``.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from lifecycle.cli import main
from lifecycle.decide.config import LifecycleConfig
from lifecycle.decide.machines import MACHINES
from lifecycle.decide.spec import Step
from lifecycle.observe.monitor import JUDGED, LEAVING, RETIRED, EventMonitor, fleet_bounds
from tests.helpers import EVENT_LOGS

Event = dict[str, Any]
ELASTIC = EVENT_LOGS / "elastic_events.jsonl"
# the run's settings without the bounds (the log's own lifecycle.started line carries them)
SETTINGS = {"rollout_num_gpus": 2, "update_weight_transfer_mode": "broadcast"}
CONFIG = LifecycleConfig.from_mapping(SETTINGS, check_paths=False)
ELASTIC_CONFIG = "rollout_min_num_gpus" in CONFIG.to_dict()  # the bounds are settings of this version


def clean() -> list[Event]:
    return [json.loads(line) for line in ELASTIC.read_text().splitlines() if line.strip()]


def judge(events: list[Event]) -> list[tuple[str, str]]:
    monitor = EventMonitor(CONFIG)
    return [(v.invariant, v.problem) for v in monitor.feed_all(events) + monitor.finish()]


def find(events: list[Event], kind: str, nth: int = 0, **fields: Any) -> int:
    """The index of the nth event of ``kind`` whose fields include ``fields``."""
    hits = [i for i, e in enumerate(events) if e["event"] == kind and all(e.get(k) == v for k, v in fields.items())]
    assert len(hits) > nth, (kind, fields, hits)
    return hits[nth]


def move(events: list[Event], instance: str, trigger: str, nth: int = 0, **fields: Any) -> int:
    return find(events, "lifecycle.transition", nth, instance=instance, trigger=trigger, **fields)


# -- the planted bugs: each takes the clean log and returns it with one thing wrong -------------------------------
def stray_worker_of_a_retired_process(ev: list[Event]) -> None:
    """SMG still routes to engine-1's first process (epoch 1, retired at step 2) after its slot got a new one."""
    i = find(ev, "gateway.members", 0, step=3)
    old = {"instance": "engine-1", "url": "http://127.0.0.1:31011", "epoch": 1, "status": "ready"}
    old["weight_version"] = "3"
    ev[i]["workers"].append(old)


def worker_of_no_engine(ev: list[Event]) -> None:
    i = find(ev, "gateway.members", 0, step=0)
    ev[i]["workers"].append({"instance": None, "url": "http://127.0.0.1:39999", "status": "ready"})


def draining_engine_still_ready(ev: list[Event]) -> None:
    """The notice withdrew engine-2 in the lifecycle, but SMG still routes to it."""
    i = find(ev, "gateway.members", 2, step=2)
    for w in ev[i]["workers"]:
        if w["instance"] == "engine-2":
            w["status"] = "ready"


def serving_engine_missing(ev: list[Event]) -> None:
    i = find(ev, "gateway.members", 1, step=1)
    ev[i]["workers"] = [w for w in ev[i]["workers"] if w["instance"] != "engine-2"]


def joiner_serves_without_catch_up(ev: list[Event]) -> None:
    """engine-2 joins at step 1 and is routed on its launch weights: its catch-up load never happened."""
    del ev[find(ev, "engine.weights", 0, instance="engine-2", step=1)]


def rejoin_vouched_for_by_the_old_process(ev: list[Event]) -> None:
    """engine-1's new process (epoch 2) did not load; the report that came back is the retired process's."""
    i = find(ev, "engine.weights", 0, instance="engine-1", step=3)
    ev[i]["epoch"] = 1


def drain_without_withdrawal(ev: list[Event]) -> None:
    i = move(ev, "engine-2", "retire")
    ev[i]["effects"] = ["drain_requests"]


def draining_engine_routed(ev: list[Event]) -> None:
    i = move(ev, "engine-2", "retire")
    ev.insert(i + 1, {**ev[i], "event": "engine.routed", "instance": "engine-2", "router": "router-rollout"})
    for k in ("machine", "src", "dst", "trigger", "effects", "reason"):
        ev[i + 1].pop(k, None)


def broadcast_to_a_departed_member(ev: list[Event]) -> None:
    """Step 2's update broadcasts over generation 2 (engine-1 retired, engine-2 preempted): no re-form."""
    for kind in ("weight_sync.destroyed", "weight_sync.connected"):
        del ev[find(ev, kind, 0, step=2)]


def generation_goes_back(ev: list[Event]) -> None:
    ev[find(ev, "weight_sync.connected", 0, step=2)]["generation"] = 2


def broadcast_on_a_destroyed_group(ev: list[Event]) -> None:
    del ev[find(ev, "weight_sync.connected", 0, step=3)]


def notice_treated_as_a_death(ev: list[Event]) -> None:
    """The notice on engine-2 is handled as a death: marked Unhealthy, then the run fails."""
    i = move(ev, "engine-2", "retire")
    ev[i].update(dst="Unhealthy", trigger="mark_unhealthy", effects=["stop_routing"])


def run_failure_names_a_retired_engine(ev: list[Event]) -> None:
    i = move(ev, "engine-1", "retired")
    failure = {**ev[i], "machine": "rollout", "instance": "rollout", "src": "Ready", "dst": "Failed"}
    ev.insert(i + 1, {**failure, "trigger": "fail", "effects": ["report_failure"], "reason": "engine-1 exited"})


def bounds(**settings: int) -> Callable[[list[Event]], None]:
    def plant(ev: list[Event]) -> None:
        ev[0]["config"].update(settings)

    plant.__name__ = "bounds_" + "_".join(f"{k}_{v}" for k, v in settings.items())
    return plant


def replacement_not_resumed(ev: list[Event]) -> None:
    """With a minimum of 2 engines, step 3's generate starts with engine-0 alone: the replacement stays Quiesced."""
    bounds(rollout_min_num_gpus=2)(ev)
    for trigger in ("resume", "drain"):
        del ev[move(ev, "engine-1", trigger, step=3)]
    del ev[find(ev, "engine.routed", 0, instance="engine-1", step=3)]
    i = find(ev, "gateway.members", 0, step=3)
    ev[i]["workers"] = [w for w in ev[i]["workers"] if w["instance"] != "engine-1"]


PLANTED: list[tuple[Callable[[list[Event]], None], str, str]] = [
    (stray_worker_of_a_retired_process, "gateway_agrees_with_lifecycle", "engine-1's process of epoch 1"),
    (worker_of_no_engine, "gateway_agrees_with_lifecycle", "a worker of no engine"),
    (draining_engine_still_ready, "gateway_agrees_with_lifecycle", "routes to engine-2, which is Draining"),
    (serving_engine_missing, "gateway_agrees_with_lifecycle", "does not route to engine-2, which is Serving"),
    (joiner_serves_without_catch_up, "serving_engines_hold_current_weights", "engine-2 entered Serving holding no"),
    (rejoin_vouched_for_by_the_old_process, "serving_engines_hold_current_weights", "engine-1 entered Serving"),
    (drain_without_withdrawal, "withdrawn_before_it_leaves", "left Serving for Draining (retire) without"),
    (draining_engine_routed, "withdrawn_before_it_leaves", "engine-2 was added to router-rollout while Draining"),
    (broadcast_to_a_departed_member, "no_broadcast_on_stale_group", "its member engine-1 has since moved to Retiring"),
    (generation_goes_back, "no_broadcast_on_stale_group", "generation 2 connected after generation 2"),
    (broadcast_on_a_destroyed_group, "no_broadcast_on_stale_group", "after the weight group was destroyed"),
    (notice_treated_as_a_death, "planned_leave_never_fails_the_run", "engine-2 was given a preemption notice"),
    (run_failure_names_a_retired_engine, "planned_leave_never_fails_the_run", "naming engine-1, which was retired"),
    (bounds(rollout_max_num_gpus=2), "fleet_within_bounds", "made the fleet 3 members, above its maximum of 2"),
    (bounds(rollout_max_num_gpus=2), "fleet_within_bounds", "scaled to 3 engines, outside its bounds 1..2"),
    (replacement_not_resumed, "fleet_within_bounds", "started with 1 engines Serving, below the minimum of 2"),
]


def test_the_clean_elastic_log_passes() -> None:
    events = clean()
    assert judge(events) == []
    kinds = {e["event"] for e in events}
    assert {"fleet.scaled", "engine.preempt_notice", "engine.drained", "gateway.members"} <= kinds
    assert {"weight_sync.connected", "weight_sync.destroyed", "weight_sync.bucket"} <= kinds
    dst = {e["dst"] for e in events if e["event"] == "lifecycle.transition"}
    assert {"Joining", "Draining", "Retiring", "Retired"} <= dst


@pytest.mark.parametrize(("plant", "invariant", "says"), PLANTED, ids=lambda x: getattr(x, "__name__", None))
def test_each_planted_bug_is_caught_naming_its_invariant(
    plant: Callable[[list[Event]], None], invariant: str, says: str
) -> None:
    events = copy.deepcopy(clean())
    plant(events)
    found = judge(events)
    assert any(name == invariant and says in problem for name, problem in found), found
    assert invariant in JUDGED


def test_a_fixed_fleet_is_judged_neither_against_bounds_nor_for_planned_leaves() -> None:
    events = clean()
    for key in ("rollout_min_num_gpus", "rollout_max_num_gpus", "rollout_drain_timeout"):
        del events[0]["config"][key]
    replacement_not_resumed(events)
    del events[0]["config"]["rollout_min_num_gpus"]
    notice_treated_as_a_death(events)  # a fixed fleet ignores a notice: the death that follows fails it fast
    assert [v for v in judge(events) if v[0] in ("fleet_within_bounds", "planned_leave_never_fails_the_run")] == []
    monitor = EventMonitor(CONFIG)
    monitor.feed_all(events)
    assert monitor.bounds is None


def test_bounds_are_engines_of_the_gpus() -> None:
    assert fleet_bounds({}) is None
    assert fleet_bounds({"rollout_min_num_gpus": 2, "rollout_max_num_gpus": 8, "rollout_num_gpus_per_engine": 2}) == (
        1,
        4,
    )
    assert fleet_bounds({"rollout_max_num_gpus": 4, "rollout_num_gpus": 2}) == (1, 4)  # min: one engine's worth
    assert fleet_bounds({"rollout_min_num_gpus": 1, "rollout_num_gpus": 3}) == (1, 3)  # max: the initial fleet


def test_the_leaving_names_are_the_engine_spec_s() -> None:
    spec = MACHINES["engine"]
    if RETIRED not in spec.state_names:
        pytest.skip("the engine spec has no elastic states yet")
    assert spec.tagged("leaving") == LEAVING
    assert RETIRED in spec.tagged("gone")


def _settings(tmp_path: Path) -> Path:
    path = tmp_path / "settings.json"
    path.write_text(json.dumps(SETTINGS))
    return path


def test_trace_check_passes_the_clean_log_and_names_each_new_rule(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["trace", "check", str(ELASTIC), "--config", str(_settings(tmp_path))]) == 0
    assert "no violation" in capsys.readouterr().out
    assert main(["trace", "check", "--list"]) == 0
    listed = capsys.readouterr().out
    for name in ("withdrawn_before_it_leaves", "planned_leave_never_fails_the_run", "fleet_within_bounds"):
        assert f"{name}\n  " in listed


@pytest.mark.parametrize(("plant", "invariant", "says"), PLANTED[::3], ids=lambda x: getattr(x, "__name__", None))
def test_trace_check_fails_on_a_planted_log(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], plant: Callable[[list[Event]], None], invariant: str, says: str
) -> None:
    events = copy.deepcopy(clean())
    plant(events)
    log = tmp_path / "events.jsonl"
    log.write_text("".join(json.dumps(e) + "\n" for e in events))
    assert main(["trace", "check", str(log), "--config", str(_settings(tmp_path)), "--all"]) == 1
    out = capsys.readouterr().out
    assert f"invariant {invariant} violated" in out and says in out


@pytest.mark.skipif(not ELASTIC_CONFIG, reason="the bounds are not settings of this version yet")
def test_trace_check_reads_the_bounds_from_the_log_s_own_config(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["trace", "check", str(ELASTIC)]) == 0
    assert "no violation" in capsys.readouterr().out


@pytest.mark.skipif(not ELASTIC_CONFIG, reason="the bounds are not settings of this version yet")
def test_the_hand_written_log_moves_only_along_the_spec_s_edges() -> None:
    """Every move of the clean log is an edge of its machine's spec, compiled for the log's own config, with
    exactly that edge's effects: the log is one the runtime can write, not a picture of it."""
    events = clean()
    config = LifecycleConfig.from_mapping(events[0]["config"], check_paths=False)
    tables = {name: spec.compile(config).table for name, spec in MACHINES.items()}
    for i, e in enumerate(events):
        if e["event"] == "lifecycle.transition":
            step = tables[e["machine"]].get((e["src"], e["trigger"]))
            where = f"event {i + 1}: {e['machine']} {e['src']} --{e['trigger']}--> {e['dst']}"
            assert isinstance(step, Step) and step.dest == e["dst"], where
            assert tuple(e["effects"]) == step.effects, where
