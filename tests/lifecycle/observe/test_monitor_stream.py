"""The monitor's streaming rules (--fully-async) over hand-written event logs: a clean stream passes, and each
planted bug fails naming its invariant -- in the monitor and through ``lifecycle trace check``.

The clean log is what the stream's runtime writes (the events of :mod:`lifecycle.decide.events`): two engines,
K = 1, in-flight updates (pause, load, commit, resume), a group spanning an update, a stale group dropped, an
update that fails on both engines (one aborts mid-transfer, one took the unpublished weights and reverts) and
their catch-up on the committed weights, a checkpoint, the driver's death and a resume that restores a buffered
group with its recorded oldest version.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from lifecycle.cli import main
from lifecycle.decide.config import LifecycleConfig
from lifecycle.decide.events import VIOLATED, EventLog, capture
from lifecycle.observe.monitor import JUDGED, EventMonitor, MonitorSink

Event = dict[str, Any]
ENGINES = ("engine-0", "engine-1")
K = 1


class Log:
    """A stream's event log, written event by event; every event is stamped a microsecond after the last."""

    def __init__(self, **flags: Any) -> None:
        self.events: list[Event] = []
        self.clock = 0
        self.started(**flags)

    def ts(self) -> str:
        self.clock += 1
        return f"2026-12-06T15:00:00.{self.clock:06d}Z"

    def add(self, event: str, **fields: Any) -> Event:
        e = {"event": event, **fields, "ts": self.ts()}
        self.events.append(e)
        return e

    def started(self, **flags: Any) -> None:
        settings = {"fully_async": True, "max_weight_staleness": K, "rollout_num_gpus": 2, **flags}
        config = LifecycleConfig.from_mapping(settings, check_paths=False)
        self.add("lifecycle.started", config=config.to_dict(), engines=2, evals=0)

    def move(self, machine: str, instance: str, src: str, dst: str, trigger: str, *effects: str) -> None:
        self.add(
            "lifecycle.transition",
            machine=machine,
            instance=instance,
            src=src,
            dst=dst,
            trigger=trigger,
            effects=list(effects),
        )

    def engines(self, src: str, dst: str, trigger: str, *effects: str, only: tuple[str, ...] = ENGINES) -> None:
        for e in only:
            self.move("engine", e, src, dst, trigger, *effects)

    def loaded(self, version: str, only: tuple[str, ...] = ENGINES) -> None:
        for e in only:
            self.add("engine.weights", instance=e, weight_version=version, transfer="disk", outcome="loaded")

    def commit(self, version: str, step: int | None = None) -> None:
        context = {} if step is None else {"step": step}
        self.add("weights.committed", weight_version=version, **context)

    def group(self, kind: str, name: str, oldest: int, *versions: int, **fields: Any) -> None:
        spans = [str(v) for v in (versions or (oldest,))]
        self.add(f"stream.group_{kind}", group=name, oldest=str(oldest), versions=spans, **fields)

    def buffered(
        self, name: str, oldest: int, *versions: int, engines: tuple[str, ...] = ENGINES, **fields: Any
    ) -> None:
        self.group("buffered", name, oldest, *versions, engines=list(engines), **fields)

    def taken(self, name: str, oldest: int, version: int, *versions: int) -> None:
        self.group("taken", name, oldest, *versions, version=str(version), bound=K)

    def dropped(self, name: str, oldest: int, version: int, *versions: int) -> None:
        self.move("rollout", "rollout", "Streaming", "Streaming", "drop_stale", "requeue_prompts")
        self.group("dropped", name, oldest, *versions, version=str(version), bound=K, prompts=1)

    # -- whole operations, as the runner moves the machines ---------------------------------------------------------
    def launch(self, version: str) -> None:
        """Servers start, load the committed weights (the initial ones, or a resumed run's checkpoint's), stream."""
        self.move("rollout", "rollout", "Init", "Constructed", "init", "construct_rollout_fn", "construct_eval_fn")
        self.move("rollout", "rollout", "Constructed", "StartingServers", "start_servers", "start_servers")
        self.engines("Init", "Starting", "start", "launch_engine")
        self.engines("Starting", "PendingWeights", "ready")
        self.engines("PendingWeights", "LoadingWeights", "begin_update", "transfer_weights")
        self.loaded(version)
        self.commit(version)
        self.engines("LoadingWeights", "Quiesced", "finish_update")
        self.move("rollout", "rollout", "StartingServers", "Ready", "servers_ready")
        self.move("rollout", "rollout", "Ready", "Streaming", "stream", "start_stream")
        self.engines("Quiesced", "Serving", "resume", "continue_generation", "route_traffic")

    def pause(self) -> None:
        self.move("rollout", "rollout", "Streaming", "PausedForUpdate", "begin_update", "acquire_engine_lock")
        self.engines("Serving", "Paused", "pause", "stop_routing", "pause_generation")
        self.engines("Paused", "UpdatingInFlight", "begin_update", "transfer_weights")

    def update(self, version: int, step: int) -> None:
        """An in-flight update that succeeds: paused, loaded, committed, resumed; the stream never stopped."""
        self.pause()
        self.loaded(str(version))
        self.commit(str(version), step)
        self.engines("UpdatingInFlight", "Paused", "finish_update")
        self.engines("Paused", "Serving", "resume", "continue_generation", "route_traffic")
        self.move("rollout", "rollout", "PausedForUpdate", "Streaming", "update_done", "release_engine_lock")

    def failed_update(self, version: int) -> None:
        """engine-0 took the new weights, engine-1's transfer failed: nothing committed, both hand back their
        kept requests and wait for the committed weights."""
        self.pause()
        self.loaded(str(version), only=("engine-0",))
        self.move("engine", "engine-0", "UpdatingInFlight", "Paused", "finish_update")
        self.move("engine", "engine-1", "UpdatingInFlight", "PendingWeights", "abort_update", "hand_back_requests")
        self.add("stream.handed_back", instance="engine-1", requests=3)
        self.move("engine", "engine-0", "Paused", "PendingWeights", "revert", "hand_back_requests")
        self.add("stream.handed_back", instance="engine-0", requests=2)
        self.move("rollout", "rollout", "PausedForUpdate", "Streaming", "update_failed", "release_engine_lock")

    def catch_up(self, version: str) -> None:
        self.move("rollout", "rollout", "Streaming", "StreamCatchingUp", "catch_up", "acquire_engine_lock")
        self.engines("PendingWeights", "LoadingWeights", "begin_update", "transfer_weights")
        self.loaded(version)
        self.engines("LoadingWeights", "Quiesced", "finish_update")
        self.engines("Quiesced", "Serving", "resume", "continue_generation", "route_traffic")
        self.move("rollout", "rollout", "StreamCatchingUp", "Streaming", "update_done", "release_engine_lock")

    def checkpoint(self, version: str, resume_at: int) -> None:
        self.add("job.checkpointed", resume_at=resume_at, weight_version=version, path=f"ckpt/job-{resume_at:06d}")


def clean(*, until: str = "end") -> Log:
    """The clean stream, cut before the part named ``until`` (``failure``, ``resume``) for the planted cases."""
    log = Log()
    log.launch("0")
    log.buffered("g0", 0)
    log.update(1, step=0)
    log.buffered("g1", 0, 0, 1, engines=("engine-0",))  # a request that spanned the update: versions 0 and 1
    log.taken("g0", 0, 1)  # 1 stale: within K
    log.update(2, step=1)
    log.dropped("g1", 0, 2, 0, 1)  # 2 stale: beyond K, dropped (its prompt re-queued)
    log.buffered("g2", 1, 1, 2, engines=("engine-1",))
    log.taken("g2", 1, 2)
    if until == "failure":
        return log
    log.failed_update(3)
    log.catch_up("2")  # both load the committed weights: they serve again
    log.buffered("g3", 2, engines=("engine-1",))
    log.taken("g3", 2, 2)
    log.update(3, step=2)
    log.buffered("g4", 2, 2, 3)  # generated across the update, buffered at the checkpoint
    log.checkpoint("3", resume_at=3)
    if until == "resume":
        return log
    log.add("fault.injected", fault="kill-driver", target="driver", pid=1)
    log.add("job.resumed", resume_at=3, weight_version="3", checkpoint="ckpt/job-000003", discarded_steps=[])
    log.started(load="ckpt")
    log.buffered("g4", 2, 2, 3)  # restored with its recorded versions (AReaL #1388), judged against version 3
    log.launch("3")  # the resumed run's first commit: the checkpoint's version
    log.taken("g4", 2, 3)
    log.update(4, step=3)
    log.buffered("g5", 3, 3, 4)
    log.taken("g5", 3, 4)
    return log


def names(events: list[Event]) -> list[str]:
    return [v.invariant for v in EventMonitor().feed_all(events)]


def test_the_clean_stream_breaks_no_invariant() -> None:
    events = clean().events
    kinds = {e["event"] for e in events}
    assert {"stream.group_buffered", "stream.group_taken", "stream.group_dropped", "job.resumed"} <= kinds
    assert {e["trigger"] for e in events if e["event"] == "lifecycle.transition"} >= {"abort_update", "revert"}
    monitor = EventMonitor()
    assert monitor.feed_all(events) == []
    assert monitor.p["streaming"] and monitor.core is not None and monitor.core.bound == K


def test_the_new_rules_are_judged_and_listed(capsys: pytest.CaptureFixture[str]) -> None:
    new = ("no_trained_group_beyond_staleness", "no_group_newer_than_the_version", "no_generation_after_failed_update")
    assert set(new) <= set(JUDGED)
    assert main(["trace", "check", "--list"]) == 0
    out = capsys.readouterr().out
    assert all(f"{name}\n  " in out for name in JUDGED)


# -- no_trained_group_beyond_staleness ---------------------------------------------------------------------------------
def test_a_trained_group_three_versions_stale_with_k_1_is_caught() -> None:
    log = clean(until="resume")
    log.taken("g-old", 0, 3)  # oldest token of version 0, taken at 3: 3 stale
    found = EventMonitor().feed_all(log.events)
    assert [v.invariant for v in found] == ["no_trained_group_beyond_staleness"]
    assert "took group g-old, 3 versions stale (oldest 0, committed 3), beyond the bound 1" in found[0].problem
    commit = max(i for i, e in enumerate(log.events) if e["event"] == "weights.committed")
    assert found[0].related == (commit,)  # the commit it is counted against


def test_staleness_is_counted_against_the_logs_own_version_not_the_events() -> None:
    """The runtime says it judged g-old against version 1 (its own counter went back): the monitor counts 3."""
    log = clean(until="resume")
    log.taken("g-old", 0, 1)
    found = [v.problem for v in EventMonitor().feed_all(log.events)]
    assert len(found) == 2
    assert "judged group g-old against weight version 1, the committed version is 3" in found[0]
    assert "3 versions stale" in found[1]


def test_a_group_stamped_newer_than_its_oldest_span_is_judged_by_the_span() -> None:
    """rllm #622: a sample stamped at dispatch or finish hides its older tokens; its spans do not."""
    log = clean(until="resume")
    log.taken("g-stamped", 3, 3, 1, 3)  # stamped 3, but it holds tokens of version 1: 2 stale
    found = [v.problem for v in EventMonitor().feed_all(log.events)]
    assert "stamped oldest 3 but holds tokens of version 1" in found[0]
    assert "2 versions stale" in found[1]


def test_areal_1388_a_resumed_stream_that_restamps_its_restored_groups_is_caught() -> None:
    """The checkpoint kept g4 (oldest 2); the resumed run restores it stamped at its own version, 3, and takes it at
    4: counted from the stamp it looks 1 stale, but its tokens are of version 2."""
    log = clean(until="resume")
    log.add("job.resumed", resume_at=3, weight_version="3", checkpoint="ckpt/job-000003", discarded_steps=[])
    log.started(load="ckpt")
    log.buffered("g4", 3, restored=True)  # restored from the checkpoint, re-stamped at its version
    log.launch("3")
    log.update(4, step=3)
    log.taken("g4", 3, 4)
    found = EventMonitor().feed_all(log.events)
    assert {v.invariant for v in found} == {"no_trained_group_beyond_staleness"}
    assert "g4 was buffered again with oldest 3, first buffered with oldest 2" in found[0].problem
    assert any("2 versions stale (oldest 2, committed 4)" in v.problem for v in found)


def test_a_group_the_dead_driver_completed_after_its_checkpoint_is_generated_again_with_a_new_stamp() -> None:
    """The checkpoint recorded g4's prompt (in flight when it was written); the dead driver completed g4 after it
    (oldest 2), and the resumed run generates it again (oldest 3): not a restored group, so its new stamp is right,
    and it is judged by it."""
    log = clean(until="resume")
    log.add("job.resumed", resume_at=3, weight_version="3", checkpoint="ckpt/job-000003", discarded_steps=[])
    log.started(load="ckpt")
    log.launch("3")
    log.buffered("g4", 3)  # generated again by the resumed run
    log.update(4, step=3)
    log.taken("g4", 3, 4)
    assert EventMonitor().feed_all(log.events) == []


def test_a_fresh_group_dropped_as_stale_is_caught() -> None:
    """The guard drops exactly the groups beyond K: a fresh one dropped shows it counted against another version."""
    log = clean(until="failure")
    log.dropped("g-fresh", 1, 2)  # 1 stale, K = 1: it should have been trained
    found = EventMonitor().feed_all(log.events)
    assert [v.invariant for v in found] == ["no_trained_group_beyond_staleness"]
    assert "dropped as too stale at 1 versions" in found[0].problem and "within the bound 1" in found[0].problem


def test_a_lock_step_log_is_not_judged_for_staleness() -> None:
    log = Log(fully_async=False, max_weight_staleness=None)
    log.commit("5")
    log.taken("g", 0, 5)  # no stream: no bound to judge against
    assert names(log.events) == []


# -- no_group_newer_than_the_version -----------------------------------------------------------------------------------
def test_a_group_newer_than_the_committed_version_is_caught() -> None:
    log = clean(until="failure")
    log.buffered("g-new", 3, engines=("engine-0",))  # version 3 is not committed yet (2 is)
    found = EventMonitor().feed_all(log.events)
    assert [v.invariant for v in found] == ["no_group_newer_than_the_version"]
    assert "holds tokens of weight version 3, newer than the committed version 2" in found[0].problem


def test_a_newer_group_taken_is_negative_staleness_too() -> None:
    log = clean(until="failure")
    log.taken("g-new", 3, 2)
    assert names(log.events) == ["no_group_newer_than_the_version", "no_trained_group_beyond_staleness"]


# -- weight_version_never_goes_backwards -------------------------------------------------------------------------------
def resume_at_57(version: str, *, with_checkpoint_line: bool = True) -> Log:
    """A stream at version 57 (K = 1), checkpointed, its driver dead, resumed at ``version``."""
    log = Log()
    log.launch("0")
    log.commit("57", step=56)
    if with_checkpoint_line:
        log.checkpoint("57", resume_at=57)
    log.add("job.resumed", resume_at=57, weight_version=version, checkpoint="ckpt/job-000057", discarded_steps=[])
    log.started(load="ckpt")
    log.buffered("g-restored", 56, 56, 57)  # restored with its recorded versions
    return log


def test_miles_2244_version_57_to_1_across_a_resume_is_caught() -> None:
    assert names(resume_at_57("57").events) == []
    found = EventMonitor().feed_all(resume_at_57("1").events)
    assert [v.invariant for v in found] == ["weight_version_never_goes_backwards", "no_group_newer_than_the_version"]
    assert "resumed at weight version 1, but version 57 was checkpointed after it" in found[0].problem
    assert "weight version 57, newer than the committed version 1" in found[1].problem  # the restored group
    resumed = next(i for i, e in enumerate(resume_at_57("1").events) if e["event"] == "job.resumed")
    assert found[1].related == (resumed,)  # counted against the version the run resumed at


def test_a_resume_below_a_commit_before_its_step_is_caught_without_the_checkpoints_line() -> None:
    """The checkpoint's line was lost with the driver: the commits before the step resumed at still say 57."""
    found = EventMonitor().feed_all(resume_at_57("1", with_checkpoint_line=False).events)
    assert found[0].invariant == "weight_version_never_goes_backwards"
    assert "resumed at step 57 with weight version 1, but version 57 was committed at step 56" in found[0].problem


def test_a_second_resume_forgets_the_commits_the_first_one_voided() -> None:
    """The first driver committed 58 at step 57 and died; the resumed one replayed step 57 (committing 58 again) and
    died too: its own checkpoint at 58 is the one to judge against, not the voided commit."""
    log = resume_at_57("57")
    log.launch("57")
    log.commit("58", step=57)
    log.checkpoint("58", resume_at=58)
    log.add("job.resumed", resume_at=58, weight_version="58", checkpoint="ckpt/job-000058", discarded_steps=[])
    log.started(load="ckpt")
    log.launch("58")
    assert names(log.events) == []
    voided = resume_at_57("57")
    voided.events[-3:-3] = [{"event": "weights.committed", "weight_version": "60", "step": 57}]  # before the death
    voided.launch("57")
    voided.commit("58", step=57)
    voided.add("job.resumed", resume_at=58, weight_version="58", checkpoint="ckpt/job-000058", discarded_steps=[])
    assert names(voided.events) == []  # 60 was voided with step 57 at the first resume


def test_a_resumed_stream_that_first_commits_from_zero_is_caught() -> None:
    log = resume_at_57("57")
    log.launch("1")  # the resumed core counted from 0 (mutant version_reset_on_resume)
    log.taken("g-restored", 56, 1)
    found = names(log.events)
    assert found[0] == "weight_version_never_goes_backwards"
    assert {"no_group_newer_than_the_version", "no_trained_group_beyond_staleness"} <= set(found)


def test_a_version_that_goes_back_after_a_trainer_workers_heal_is_caught() -> None:
    log = clean(until="failure")
    log.move("trainer", "trainer", "UpdatingWeights", "Errored", "worker_crashed")
    log.move("trainer", "trainer", "Errored", "Healing", "heal", "replace_worker")
    log.move("trainer", "trainer", "Healing", "Ready", "healed", "restore_from_peer")
    good = [*log.events]
    log.update(1, step=2)  # the healed worker's counter came from a stale peer
    found = EventMonitor().feed_all(log.events)
    assert found[0].invariant == "weight_version_never_goes_backwards"
    assert "weight version 1 was committed after version 2" in found[0].problem
    log.events = [*good]
    log.update(2, step=2)  # the same version again: a commit the stream's staleness never saw
    found = EventMonitor().feed_all(log.events)
    assert [v.invariant for v in found] == ["weight_version_never_goes_backwards"]
    assert "committed twice in a row" in found[0].problem
    log.events = [*good]
    log.update(3, step=2)
    assert names(log.events) == []


def test_a_version_that_goes_back_after_an_engines_recovery_is_caught() -> None:
    """The recovered engine's own counter published (miles #2244's failover): the monitor counts from the log."""
    log = Log(use_fault_tolerance=True, ft_components=["rollout"])
    log.launch("0")
    log.commit("57", step=56)
    one = ("engine-1",)
    log.engines("Serving", "Unhealthy", "mark_unhealthy", "stop_routing", only=one)
    log.engines("Unhealthy", "Recovering", "recover", "recover_engine", "kill_engine", only=one)
    log.engines("Recovering", "Starting", "restart", "launch_engine", only=one)
    log.engines("Starting", "PendingWeights", "ready", only=one)
    log.move("rollout", "rollout", "Streaming", "StreamCatchingUp", "catch_up", "acquire_engine_lock")
    log.engines("PendingWeights", "LoadingWeights", "begin_update", "transfer_weights", only=one)
    log.loaded("57", only=one)
    log.engines("LoadingWeights", "Quiesced", "finish_update", only=one)
    log.engines("Quiesced", "Serving", "resume", "continue_generation", "route_traffic", only=one)
    log.move("rollout", "rollout", "StreamCatchingUp", "Streaming", "update_done", "release_engine_lock")
    log.buffered("g", 57, engines=one)
    assert names(log.events) == []
    log.commit("1", step=57)
    log.taken("g", 57, 1)
    found = names(log.events)
    assert found[0] == "weight_version_never_goes_backwards"
    assert "no_group_newer_than_the_version" in found


# -- no_generation_after_failed_update ---------------------------------------------------------------------------------
def test_a_failed_refit_engine_that_serves_without_a_reload_is_caught() -> None:
    """SMG's ``paused()``: after the failed update, engine-1 resumes its kept requests (mutant failed_refit_resumes:
    abort_update back to Paused, then resume)."""
    log = clean(until="failure")
    log.pause()
    log.move("engine", "engine-1", "UpdatingInFlight", "Paused", "abort_update")
    log.move("engine", "engine-1", "Paused", "Serving", "resume", "continue_generation", "route_traffic")
    found = EventMonitor().feed_all(log.events)
    assert [v.invariant for v in found] == ["no_generation_after_failed_update"]
    assert "engine-1 entered Serving after its in-flight weight update failed" in found[0].problem
    abort = next(i for i, e in enumerate(log.events) if e.get("trigger") == "abort_update")
    assert found[0].related == (abort,)


def test_a_failed_refit_engine_reloaded_with_a_failed_load_still_may_not_serve() -> None:
    log = clean(until="failure")
    log.failed_update(3)
    one = ("engine-1",)
    log.engines("PendingWeights", "LoadingWeights", "begin_update", "transfer_weights", only=one)
    log.engines("LoadingWeights", "PendingWeights", "abort_update", only=one)  # the reload failed too
    log.engines("PendingWeights", "Serving", "resume", "route_traffic", only=one)
    assert "no_generation_after_failed_update" in names(log.events)


def test_an_engine_serving_the_failed_updates_unpublished_weights_is_caught() -> None:
    """engine-0 took version 3, the update failed, and it resumed instead of reverting."""
    log = clean(until="failure")
    log.pause()
    log.loaded("3", only=("engine-0",))
    log.move("engine", "engine-0", "UpdatingInFlight", "Paused", "finish_update")
    log.move("engine", "engine-0", "Paused", "Serving", "resume", "continue_generation", "route_traffic")
    found = EventMonitor().feed_all(log.events)
    assert "no_generation_after_failed_update" in [v.invariant for v in found]
    assert any("holding weight version 3, which was never committed" in v.problem for v in found)


def test_a_group_a_failed_engine_generated_before_its_reload_is_caught() -> None:
    log = clean(until="failure")
    log.failed_update(3)
    failure = log.events[-1]["ts"]
    log.buffered("g-after", 2, engines=("engine-1",))  # engine-1 kept generating after its failed refit
    found = EventMonitor().feed_all(log.events)
    assert [v.invariant for v in found] == ["no_generation_after_failed_update"]
    assert "group g-after was generated by engine-1 after its in-flight weight update failed" in found[0].problem
    # not judged: one completed before the failure (the stream's done_at), and one another engine shares
    log.events[-1]["done_at"] = "2026-12-06T14:59:59.000000Z"
    assert failure > log.events[-1]["done_at"] and names(log.events) == []
    log.events.pop()
    log.catch_up("2")
    log.buffered("g-reloaded", 2, engines=("engine-1",))  # after its reload: fine
    assert names(log.events) == []


# -- the CLI and the live sink -----------------------------------------------------------------------------------------
def _write(tmp_path: Path, events: list[Event]) -> Path:
    path = tmp_path / "events.jsonl"
    path.write_text("".join(json.dumps(e) + "\n" for e in events))
    return path


PLANTED: dict[str, Callable[[], Log]] = {}


def _stale() -> Log:
    log = clean(until="resume")
    log.taken("g-old", 0, 3)
    return log


def _resumed_at_1() -> Log:
    return resume_at_57("1")


def _serves_after_failed_refit() -> Log:
    log = clean(until="failure")
    log.pause()
    log.move("engine", "engine-1", "UpdatingInFlight", "Paused", "abort_update")
    log.move("engine", "engine-1", "Paused", "Serving", "resume", "continue_generation", "route_traffic")
    return log


def _newer() -> Log:
    log = clean(until="failure")
    log.buffered("g-new", 3, engines=("engine-0",))
    return log


PLANTED.update(
    {
        "no_trained_group_beyond_staleness": _stale,
        "weight_version_never_goes_backwards": _resumed_at_1,
        "no_generation_after_failed_update": _serves_after_failed_refit,
        "no_group_newer_than_the_version": _newer,
    }
)


def test_trace_check_passes_the_clean_stream(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["trace", "check", str(_write(tmp_path, clean().events))]) == 0
    assert capsys.readouterr().out.startswith("ok: ")


@pytest.mark.parametrize("invariant", sorted(PLANTED))
def test_trace_check_fails_each_planted_bug_naming_its_invariant(
    invariant: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _write(tmp_path, PLANTED[invariant]().events)
    assert main(["trace", "check", str(path)]) == 1
    out = capsys.readouterr().out
    assert out.startswith(f"invariant {invariant} violated at event ")
    assert main(["trace", "check", str(path), "--invariant", invariant]) == 1
    capsys.readouterr()


def test_the_live_sink_logs_a_stale_group_taken() -> None:
    log = EventLog()
    sink = MonitorSink(log)
    log.add_sink(sink)
    with capture(log) as written:
        for e in _stale().events:
            fields = {k: v for k, v in e.items() if k not in ("event", "ts")}
            log.emit(e["event"], **fields)
    log.remove_sink(sink)
    violated = [e for e in written if e["event"] == VIOLATED]
    assert [e["invariant"] for e in violated] == ["no_trained_group_beyond_staleness"]
    assert violated[0]["events"][-1].startswith("stream.group_taken")
