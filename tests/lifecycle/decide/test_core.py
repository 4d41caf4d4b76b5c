"""The lifecycle core, step by step: operations, the results of commands, news, refusals.

A tiny driver plays the shells: it answers every command the core hands out (by default with plain
success) until the operation is done, so each test reads as the sequence of moves a runtime would make.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from lifecycle import LifecycleConfig
from lifecycle.decide.core import (
    ROLLOUT,
    Command,
    Completed,
    Core,
    Failure,
    JobState,
    Move,
    Op,
    Outcome,
    Refusal,
    next_delay,
)
from lifecycle.decide.core.plan import RESULTS
from lifecycle.decide.presets import preset

Answer = Callable[[Command], Outcome]
SUCCESS = ("ready", "dead", "loaded", "probe_ok", "trained", "saved", "checkpointed", "restored", "healed", "done")


def ok(cmd: Command) -> Outcome:
    possible = RESULTS.get(cmd.effect, frozenset({"done"}))
    return Outcome(next(name for name in SUCCESS if name in possible))


class Drive:
    """The job's state and every move so far; ``do`` runs one event to its end like the runner does."""

    def __init__(self, config: LifecycleConfig, **kw: int) -> None:
        self.core = Core(config, **kw)
        self.s: JobState = self.core.initial()
        self.moves: list[Move] = []
        self.commands: list[Command] = []

    def do(self, event: Op | Outcome, answer: Answer = ok) -> Refusal | None:
        r = self.core.step(self.s, event)
        if r.refused is not None:
            return r.refused
        self.s, cmds = r.state, r.commands
        self.moves += r.moves
        while cmds:
            self.commands += cmds
            r = self.core.step(self.s, Completed(tuple((c, answer(c)) for c in cmds)))
            self.s, cmds = r.state, r.commands
            self.moves += r.moves
        return None

    def op(self, name: str, engine: int | None = None, answer: Answer = ok) -> Refusal | None:
        return self.do(Op(name, engine), answer)

    def start(self) -> Drive:
        for name in ("trainer.start", "init"):
            self.op(name)
        return self

    def engines(self) -> list[str]:
        return [e.state for e in self.s.engines]

    def triggers(self, instance: str) -> list[str]:
        return [m.trigger for m in self.moves if m.instance == instance]


def cfg(**flags: object) -> LifecycleConfig:
    return LifecycleConfig.from_mapping({"rollout_num_gpus": 2, **flags}, check_paths=False)


RFT = {"use_fault_tolerance": True, "ft_components": ["rollout"], "engine_restart_backoff": 0.5}


# -- a whole step -----------------------------------------------------------------------------------------
def test_init_starts_every_engine_loads_the_initial_weights_then_serves_only_at_generate():
    d = Drive(cfg(**RFT)).start()
    assert d.engines() == ["Quiesced", "Quiesced"] and d.s.rollout == "Ready" and d.s.monitor == "Paused"
    assert all(e.current for e in d.s.engines) and d.s.committed
    assert d.triggers("engine-0") == ["start", "ready", "begin_update", "finish_update"]
    d.op("generate")
    assert d.engines() == ["Serving", "Serving"] and d.s.monitor == "Running"
    d.op("generate_done")
    assert d.engines() == ["Quiesced", "Quiesced"] and d.s.monitor == "Paused"


@pytest.mark.weight_update
def test_a_weight_update_is_one_snapshot_under_the_lock_then_committed():
    d = Drive(cfg(**RFT)).start()
    d.op("generate")
    d.op("generate_done")
    locks: list[bool] = []

    def answer(cmd: Command) -> Outcome:
        locks.append(d.s.lock)
        return ok(cmd)

    d.op("train")
    d.op("update_weights", answer=answer)
    rollout = [m.trigger for m in d.moves if m.machine == "rollout"][-2:]
    assert rollout == ["begin_update", "update_done"]
    assert locks[-2:] == [True, True]  # the engines' loads ran while the lock was held
    assert not d.s.lock and d.s.trainer == "Ready" and all(e.current for e in d.s.engines)
    writes = [c for c in d.commands if c.machine == "trainer" and c.effect == "transfer_weights"]
    assert len(writes) == 1 and writes[0].lane == "trainer"


# -- the two bugs the old runtime had ---------------------------------------------------------------------
@pytest.mark.lifecycle_gate
def test_rollout_only_allocates_no_trainer_and_fires_no_trainer_event():
    d = Drive(cfg(debug_rollout_only=True))
    refusal = d.op("trainer.start")
    assert refusal is not None and refusal.kind == "blocked" and refusal.blocked_by == ("trains",)
    d.op("init")
    d.op("generate")
    d.op("generate_done")
    for name in ("train", "update_weights", "save"):
        refusal = d.op(name)
        assert refusal is not None and refusal.kind == "blocked", name
    assert d.s.trainer == "Init" and not any(m.machine == "trainer" for m in d.moves)


@pytest.mark.recovery
def test_rollout_only_under_rollout_ft_recovers_a_dead_engine_at_the_next_generate():
    d = Drive(cfg(debug_rollout_only=True, **RFT))
    d.op("init")
    d.do(Outcome("died", ROLLOUT, 1, "exit code -9"))
    assert d.engines() == ["Quiesced", "Unhealthy"]
    d.op("generate")  # no trainer, no update_weights: the generate boundary recovers it
    assert d.triggers("engine-1") == [
        "start",
        "ready",
        "begin_update",
        "finish_update",  # the initial weights
        "mark_unhealthy",
        "recover",
        "restart",
        "ready",
        "begin_update",
        "finish_update",  # the catch-up: the committed weights before it is routed
        "resume",
    ]
    assert d.engines() == ["Serving", "Serving"] and all(e.current for e in d.s.engines)
    launch = [c for c in d.commands if c.effect == "launch_engine" and c.engine == 1][-1]
    assert launch.delay == 0.5  # the restart's backoff


@pytest.mark.recovery
@pytest.mark.lifecycle_gate
def test_without_rollout_ft_a_dead_engine_fails_at_once_and_the_run_stops():
    d = Drive(cfg()).start()
    d.do(Outcome("died", ROLLOUT, 0, "exit code -9"))
    assert d.engines() == ["Failed", "Quiesced"] and d.s.failed == Failure("engine", "engine-0", "Unhealthy")
    assert str(d.s.failed) == "engine-0 failed"
    assert "recover" not in d.triggers("engine-0")
    refusal = d.op("generate")
    assert refusal is not None and refusal.kind == "failed"
    assert d.op("dispose") is None  # disposal still runs


# -- the restart budget ---------------------------------------------------------------------------------------
@pytest.mark.recovery
def test_backoff_doubles_and_is_capped_then_the_budget_is_spent():
    config = cfg(engine_max_restarts=4, engine_restart_backoff=1.0, engine_restart_backoff_max=3.0)
    times: tuple[float, ...] = ()
    delays = []
    for _ in range(5):
        delay, times = next_delay(times, 0.0, config)
        delays.append(delay)
    assert delays == [1.0, 2.0, 3.0, 3.0, None]


@pytest.mark.recovery
def test_restarts_age_out_of_the_window():
    config = cfg(engine_max_restarts=1, engine_restart_window=10.0)
    delay, times = next_delay((), 0.0, config)
    assert delay is not None and next_delay(times, 5.0, config)[0] is None
    assert next_delay(times, 11.0, config)[0] is not None


@pytest.mark.recovery
def test_an_engine_that_keeps_dying_spends_its_budget_then_fails_the_run():
    d = Drive(cfg(**RFT, engine_max_restarts=1)).start()
    d.do(Outcome("died", ROLLOUT, 0))
    d.op("generate")
    d.op("generate_done")
    d.do(Outcome("died", ROLLOUT, 0))
    d.op("generate")
    assert d.triggers("engine-0")[-2:] == ["recover", "give_up"]
    assert d.s.failed == Failure("engine", "engine-0", "Recovering")


@pytest.mark.recovery
def test_a_restart_that_fails_to_start_is_tried_again_within_the_budget():
    d = Drive(cfg(**RFT, engine_max_restarts=3)).start()
    d.do(Outcome("died", ROLLOUT, 1))
    first = {"done": False}

    def flaky(cmd: Command) -> Outcome:
        if cmd.effect == "launch_engine" and not first["done"]:
            first["done"] = True
            return Outcome("start_failed", reason="port taken")
        return ok(cmd)

    d.op("generate", answer=flaky)
    assert d.triggers("engine-1").count("recover") == 2 and d.engines() == ["Serving", "Serving"]
    assert len(d.s.engines[1].restarts) == 2


# -- refusals -------------------------------------------------------------------------------------------------
def test_refusals_say_why_and_are_typed():
    d = Drive(cfg(**RFT)).start()
    assert d.op("onload_weights") == Refusal(
        "not_applicable", "onload_weights: rollout 'onload_weights' is not allowed in state 'Ready'"
    )
    offload = d.op("offload")
    assert offload is not None and offload.kind == "blocked" and offload.blocked_by == ("offloads_rollout",)
    d.op("generate")
    again = d.op("generate")
    assert again is not None and again.kind == "illegal" and "Generating" in again.reason
    update = d.op("update_weights")
    assert update is not None and update.kind == "illegal" and "Ready or WeightsOnly" in update.reason


def test_an_operation_waits_for_its_commands_and_its_lane_is_busy_meanwhile():
    core = Core(cfg(**RFT))
    d = Drive(cfg(**RFT)).start()
    r = core.step(d.s, Op("train"))
    assert [c.effect for c in r.commands] == ["train_step"] and r.state.trainer_op == "train"
    busy = core.step(r.state, Op("train")).refused
    assert busy is not None and busy.kind == "busy"
    assert core.step(r.state, Op("generate")).refused is None  # the rollout lane is free: the async loop


# -- the monitor ----------------------------------------------------------------------------------------------
@pytest.mark.monitor
def test_probe_verdicts_mark_only_while_running_and_deaths_at_once():
    d = Drive(cfg(**RFT)).start()
    d.do(Outcome("threshold_reached", ROLLOUT, 0))  # paused: a stale verdict is discarded
    assert d.engines()[0] == "Quiesced"
    d.do(Outcome("died", ROLLOUT, 1))  # a death is acted on paused or not
    assert d.engines()[1] == "Unhealthy"
    d.op("generate")
    d.do(Outcome("stale_result", ROLLOUT, 0))
    assert d.engines()[0] == "Serving"
    d.do(Outcome("threshold_reached", ROLLOUT, 0))
    assert d.engines()[0] == "Unhealthy"
    monitor = [m.trigger for m in d.moves if m.machine == "monitor"]
    assert monitor[-2:] == ["stale_result", "threshold_reached"]


@pytest.mark.monitor
@pytest.mark.lifecycle_gate
@pytest.mark.parametrize("name", ["ft-train", "no-ft"])
def test_no_monitor_and_no_probe_without_rollout_ft(name: str):
    d = Drive(preset(name), engines=2, evals=1).start()
    d.op("generate")
    d.do(Outcome("probe"))
    assert d.s.monitor == "Init" and not any(m.machine == "monitor" for m in d.moves)


# -- a failed update, a failed handler --------------------------------------------------------------------------
@pytest.mark.weight_update
def test_a_weight_update_whose_shell_fails_releases_the_lock_and_blocks_generation_until_redone():
    d = Drive(cfg(**RFT)).start()

    def broken(cmd: Command) -> Outcome:
        if cmd.machine == "engine" and cmd.effect == "transfer_weights" and cmd.engine == 1:
            return Outcome("error", reason="disk gone")
        return ok(cmd)

    d.op("update_weights", answer=broken)
    assert not d.s.lock and d.s.rollout == "Ready" and d.s.dirty and d.s.trainer == "Ready"
    assert not d.s.engines[0].current  # it took weights that were never committed
    refusal = d.op("generate")
    assert refusal is not None and "failed and was not redone" in refusal.reason
    d.op("update_weights")
    assert not d.s.dirty and d.op("generate") is None


@pytest.mark.weight_update
@pytest.mark.routing
def test_an_engine_that_refuses_the_weights_never_serves_with_the_old_ones():
    d = Drive(cfg(**RFT)).start()

    def refuse(cmd: Command) -> Outcome:
        if cmd.effect == "transfer_weights" and cmd.machine == "engine" and cmd.engine == 0 and cmd.lane == "trainer":
            return Outcome("refused", reason="wrong shape")
        return ok(cmd)

    d.op("update_weights", answer=refuse)
    assert d.engines() == ["Unhealthy", "Quiesced"] and d.s.engines[1].current
    d.op("generate")  # recovered, caught up on the committed (new) weights, then routed
    assert d.engines() == ["Serving", "Serving"] and all(e.current for e in d.s.engines)


# -- the trainer ------------------------------------------------------------------------------------------------
@pytest.mark.recovery
def test_a_crashed_worker_is_healed_under_train_ft_and_the_step_runs_again():
    d = Drive(cfg(use_fault_tolerance=True, ft_components=["train"])).start()
    crashes = {"n": 0}

    def crash_once(cmd: Command) -> Outcome:
        if cmd.effect == "train_step" and crashes["n"] == 0:
            crashes["n"] += 1
            return Outcome("worker_crashed", reason="actor died")
        return ok(cmd)

    d.op("train", answer=crash_once)
    assert d.triggers("trainer")[-6:] == ["train", "worker_crashed", "heal", "healed", "train", "train_done"]
    assert not d.s.failed


@pytest.mark.recovery
def test_a_crashed_worker_without_train_ft_fails_the_run():
    d = Drive(cfg(**RFT)).start()
    d.op("train", answer=lambda c: Outcome("worker_crashed") if c.effect == "train_step" else ok(c))
    assert d.triggers("trainer")[-2:] == ["worker_crashed", "fail"]
    assert d.s.failed == Failure("trainer", "trainer", "Errored")


# -- the eval fleet and CI ----------------------------------------------------------------------------------------
@pytest.mark.lifecycle_gate
def test_the_eval_fleet_probes_its_engines_itself_only_without_rollout_ft():
    for flags, probes in (({}, 1), (RFT, 0)):
        d = Drive(cfg(eval_num_gpus=1, **flags)).start()
        d.op("eval")
        d.op("pin")
        assert d.s.fleet == "Pinned" and [e.state for e in d.s.evals] == ["Serving"]
        assert sum(c.effect == "probe_engine" for c in d.commands) == probes


def test_a_pin_that_cannot_load_one_snapshot_is_a_typed_skip():
    d = Drive(cfg(eval_num_gpus=1)).start()
    d.op("eval")
    d.op("pin", answer=lambda c: Outcome("refused") if c.effect == "transfer_weights" else ok(c))
    assert d.s.fleet == "SkippedPinViolation" and [e.state for e in d.s.evals] == ["Unhealthy"]
    d.op("release")
    d.op("eval_done")
    d.op("eval")
    d.op("pin")  # the next pin stops and starts the unhealthy engine again
    assert d.s.fleet == "Pinned"
    assert d.triggers("eval-0")[-7:] == [
        "stop",
        "confirm_dead",
        "start",
        "ready",
        "begin_update",
        "finish_update",
        "resume",
    ]


def test_ci_injection_kills_one_engine_once_and_only_under_rollout_ft():
    d = Drive(cfg(ci_test=True, **RFT)).start()
    d.op("generate")
    d.op("generate_done")
    d.op("generate")
    injected = [c for c in d.commands if c.effect == "inject_ci_fault"]
    assert len(injected) == 1 and injected[0].engine == 1
    d = Drive(cfg(ci_test=True)).start()
    d.op("generate")
    assert not any(c.effect == "inject_ci_fault" for c in d.commands)


# -- the groups the core reads off the specs ------------------------------------------------------------------
def test_transient_states_always_wait_for_a_command():
    """The spec's ``transient`` tag and the core agree: an engine in a transient state has a command out."""
    from lifecycle.check.world import Checker

    checker = Checker(preset("ft-both"), engines=2, evals=1, max_faults=1)
    seen, frontier = set(), [checker.initial().key()]
    while frontier:
        node = frontier.pop()
        for group, engines in (("rollout", node.job.engines), ("eval", node.job.evals)):
            for i, e in enumerate(engines):
                if e.state in checker.core.transient:
                    out = {(c.group, c.engine) for c in node.job.awaiting}
                    assert (group, i) in out, (e.state, node.job.awaiting)
        for t in checker.successors(node):
            k = t.node.key()
            if k not in seen and len(seen) < 3000:
                seen.add(k)
                frontier.append(k)


def test_a_step_leaves_nothing_for_the_cyclic_collector():
    """Core.step is called 10^5-10^6 times by the checker and once per event by the loop: a reference cycle in what
    a step builds (its transaction reading itself as ``tx.s``) left every step's lists to the cyclic collector --
    15 % of a check, and full collections in the loop. Everything a step makes must be freed by refcounting."""
    import gc

    gc.collect()
    collecting = gc.isenabled()
    gc.disable()
    try:
        d = Drive(cfg(**RFT)).start()
        for name in ("generate", "generate_done", "train", "update_weights"):
            assert d.op(name) is None, name
        assert d.op("generate") is None
        d.do(Outcome("died", "rollout", 0))  # news: an engine's death while it serves
        assert gc.collect() == 0  # no unreachable object: nothing waited for the collector
    finally:
        if collecting:
            gc.enable()
