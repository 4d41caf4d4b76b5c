"""The resume lifecycle in the core (issue 18): a job checkpoint is written only on the committed weights, a
resumed job's trainer restores before it is Ready, its engines are relaunched and serve only once they hold
the checkpoint's weights, and the checker catches a core that checkpoints anywhere else."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from lifecycle.check.explore import explore, lattice
from lifecycle.check.invariants import INVARIANTS
from lifecycle.decide.core import Command, Failure, Op, Outcome, StepDraft, operations

from .test_core import RFT, Drive, cfg, ok

SAVE = {"save": "runs/job/checkpoints", "save_interval": 1}
RESUME = {**SAVE, "load": "runs/job/checkpoints"}


def _step(d: Drive) -> None:
    for name in ("generate", "generate_done", "train", "update_weights"):
        assert d.op(name) is None, name


def test_a_checkpoint_is_written_after_the_update_and_refused_between_train_and_update() -> None:
    d = Drive(cfg(**RFT, **SAVE)).start()
    assert d.op("checkpoint") is None  # the initial weights are committed: a checkpoint of step 0 is fine
    for name in ("generate", "generate_done", "train"):
        d.op(name)
    refusal = d.op("checkpoint")
    assert (
        refusal is not None and refusal.kind == "illegal" and "trained since the last weight update" in refusal.reason
    )
    d.op("update_weights")
    assert d.op("checkpoint") is None
    assert d.triggers("trainer")[-2:] == ["checkpoint", "checkpoint_done"]
    assert [c.effect for c in d.commands if c.machine == "trainer"][-1] == "save_job_state"


def test_a_failed_update_blocks_the_checkpoint_until_one_goes_through() -> None:
    d = Drive(cfg(**RFT, **SAVE)).start()
    for name in ("generate", "generate_done", "train"):
        d.op(name)

    def refuse(cmd: Command) -> Outcome:
        if cmd.machine == "engine" and cmd.effect == "transfer_weights" and cmd.engine == 1:
            return Outcome("error", reason="disk gone")
        return ok(cmd)

    d.op("update_weights", answer=refuse)
    assert d.s.dirty
    refusal = d.op("checkpoint")
    assert refusal is not None and "the last weight update failed" in refusal.reason
    d.op("update_weights")  # redone: the engines hold the trainer's weights again
    assert d.op("checkpoint") is None


def test_without_save_the_checkpoint_is_blocked_by_its_predicate() -> None:
    d = Drive(cfg(**RFT)).start()
    refusal = d.op("checkpoint")
    assert refusal is not None and refusal.kind == "blocked" and refusal.blocked_by == ("saves_job",)


def test_a_resumed_trainer_restores_before_it_is_ready_and_a_fresh_one_never_restores() -> None:
    fresh = Drive(cfg(**RFT, **SAVE)).start()
    assert fresh.triggers("trainer") == ["allocate", "initialize", "ready"]
    resumed = Drive(cfg(**RFT, **RESUME)).start()
    assert resumed.triggers("trainer") == ["allocate", "initialize", "restore", "restored"]
    assert [c.effect for c in resumed.commands if c.machine == "trainer"][-1] == "restore_job_state"
    # its engines are new processes: started, loaded, and routed only at the first generate
    assert resumed.triggers("engine-0") == ["start", "ready", "begin_update", "finish_update"]
    assert resumed.op("generate") is None and all(e.current for e in resumed.s.engines)


def test_a_worker_crash_while_restoring_stops_the_run_even_under_train_ft() -> None:
    """No peer holds the checkpoint's state yet, so a heal would continue from the wrong one; --resume again."""
    d = Drive(cfg(use_fault_tolerance=True, ft_components=["train"], **RESUME))

    def crash(cmd: Command) -> Outcome:
        return Outcome("worker_crashed", reason="died") if cmd.effect == "restore_job_state" else ok(cmd)

    d.op("trainer.start", answer=crash)
    assert d.triggers("trainer")[-2:] == ["restore", "worker_crashed"]
    assert d.s.trainer == "Failed" and d.s.failed == Failure("trainer", "trainer", "Restoring")


def test_restart_budgets_carry_over_to_the_resumed_engines() -> None:
    d = Drive(cfg(**RFT, **RESUME))
    state = d.core.with_restarts(d.s, ((), (100.0, 101.0)))
    assert [e.restarts for e in state.engines] == [(), (100.0, 101.0)]
    with pytest.raises(ValueError, match="for 1 engines, but the job has 2"):  # a checkpoint's load checks first
        d.core.with_restarts(d.s, ((1.0,),))
    d.start()
    with pytest.raises(ValueError, match="before the first operation"):
        d.core.with_restarts(d.s, ((), ()))


@pytest.mark.slow
@pytest.mark.recorded  # 115-130 s in CI, where the 2-engine lattice explores every resumed group (its first config)
def test_the_checker_explores_resumed_jobs_under_every_ft_configuration() -> None:
    resumed = [c for c in lattice().valid if c.load is not None]
    fleets = {(c.update_weight_transfer_mode, bool(c.rollout_external_engine_addrs)) for c in resumed}
    assert fleets == {("disk", False), ("broadcast", False), ("disk", True)}
    assert sorted({tuple(sorted(c.ft_components)) for c in resumed}) == [
        (),
        ("rollout",),
        ("rollout", "train"),
        ("train",),
    ]
    # 8 of them keep their engines (--detach-engines): the driver dies anywhere; 4 stream (--fully-async)
    assert len(resumed) == 24
    assert sum(c.fully_async for c in resumed) == 4
    # each config on its own (not one per lattice group), in a child that may run the compiled checker
    env = {**os.environ, "LIFECYCLE_PURE": "0"}
    done = subprocess.run(
        [sys.executable, "-c", _EXPLORE_RESUMED], env=env, capture_output=True, text=True, timeout=1800
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout)
    assert result["explored"] == len(resumed) and not result["bad"], result["bad"][:1]


# The resumed configs explored one by one in a child process, which imports the compiled checker where it is built
# (``make compiled``; the suite's own process runs the pure one, which tests patch): the same results either way
# (tests/lifecycle/check/test_compiled_equal.py), ~2x sooner.
_EXPLORE_RESUMED = """
import json, sys
from lifecycle.check.explore import lattice, run_check
resumed = [[c] for c in lattice().valid if c.load is not None]
results = list(run_check(resumed, engines=2))
json.dump({"explored": len(results), "bad": [r.violations[0].render() for r in results if not r.ok]}, sys.stdout)
"""


def test_the_checker_catches_a_core_that_checkpoints_between_train_and_update(monkeypatch: pytest.MonkeyPatch) -> None:
    """Re-introduce the bug: drop the core's checkpoint precondition; the step invariant names it."""
    config = cfg(**RFT, **RESUME)
    assert explore(config, engines=2, only=frozenset({"job_checkpoint_holds_committed_weights"})).ok
    original = operations.precondition

    def anything_goes(step: StepDraft, op: Op) -> str | None:
        if op.name == "checkpoint":
            return None
        return original(step, op)

    monkeypatch.setattr(operations, "precondition", anything_goes)
    result = explore(config, engines=2, only=frozenset({"job_checkpoint_holds_committed_weights"}))
    assert [v.invariant for v in result.violations] == ["job_checkpoint_holds_committed_weights"]
    assert "trained since the last commit" in result.violations[0].problem
    assert INVARIANTS["job_checkpoint_holds_committed_weights"].kind == "step"
