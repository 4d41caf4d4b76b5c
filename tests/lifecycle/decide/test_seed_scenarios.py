"""The two miles regressions, at spec level (the replay crash and the train-only FT leak).

1. Replay (--load-debug-rollout-data) must never construct the rollout function, start servers
   or start monitors -- and plain --debug-train-only still constructs the rollout function.
2. Train-only FT (--use-fault-tolerance --ft-components train) must start no monitor and no
   trainer transition may perform recover_engine; no engine may enter Recovering.

Each is checked twice: exhaustively over every reachable state of each machine (compiled spec),
and by driving the lifecycle core through a job's steps as the runner does (each job check is shown to
fail on the spec mutant that re-introduces its bug).
"""

from __future__ import annotations

from collections.abc import Mapping

import pytest

from lifecycle import LifecycleConfig
from lifecycle.check.mutants import MUTANTS
from lifecycle.decide.core import ROLLOUT as ROLLOUT_GROUP
from lifecycle.decide.core import Outcome, Refusal
from lifecycle.decide.machines import ENGINE, EVAL_FLEET, MONITOR, ROLLOUT, TRAINER
from lifecycle.decide.spec import MachineSpec

from .test_core import Drive

REPLAY = LifecycleConfig(load_debug_rollout_data="runs/x/{rollout_id}.json", use_fault_tolerance=True, eval_num_gpus=2)
TRAIN_ONLY = LifecycleConfig(debug_train_only=True)
FT_TRAIN = LifecycleConfig(
    use_fault_tolerance=True, ft_components=["train"], rollout_num_gpus=2, eval_num_gpus=2, ci_test=True
)
FT_ROLLOUT = LifecycleConfig(
    use_fault_tolerance=True, ft_components=["rollout"], rollout_num_gpus=2, eval_num_gpus=2, ci_test=True
)

NEVER_IN_REPLAY = {"construct_rollout_fn", "construct_eval_fn", "start_servers", "start_monitor", "start_eval_fleet"}


def _reach(spec, config):
    return spec.compile(config).reachable()


@pytest.mark.construction_gate
def test_replay_reaches_replay_and_constructs_nothing_exhaustively():
    states, effects = _reach(ROLLOUT, REPLAY)
    assert "Replay" in states
    assert not NEVER_IN_REPLAY & effects
    assert {"Constructed", "StartingServers", "Generating"}.isdisjoint(states)
    monitor_states, monitor_effects = _reach(MONITOR, REPLAY)
    assert monitor_states == {"Init", "Stopped"} and not monitor_effects  # never created, only disposed
    fleet_states, _ = _reach(EVAL_FLEET, REPLAY)
    assert fleet_states <= {"Init", "Disposed"}


@pytest.mark.construction_gate
def test_plain_train_only_still_constructs_the_rollout_function_but_starts_no_server():
    states, effects = _reach(ROLLOUT, TRAIN_ONLY)
    assert "construct_rollout_fn" in effects
    assert "start_servers" not in effects and "Replay" not in states


@pytest.mark.recovery
@pytest.mark.lifecycle_gate
def test_train_only_ft_never_reaches_rollout_recovery_exhaustively():
    _, rollout_effects = _reach(ROLLOUT, FT_TRAIN)
    assert "start_monitor" not in rollout_effects
    assert "arm_ci_fault_injection" not in rollout_effects
    engine_states, engine_effects = _reach(ENGINE, FT_TRAIN)
    assert "Recovering" not in engine_states and "recover_engine" not in engine_effects
    _, trainer_effects = _reach(TRAINER, FT_TRAIN)
    assert "recover_engine" not in trainer_effects
    monitor_states, _ = _reach(MONITOR, FT_TRAIN)
    assert monitor_states == {"Init", "Stopped"}
    _, fleet_effects = _reach(EVAL_FLEET, FT_TRAIN)
    assert "probe_engine" in fleet_effects  # no monitor, so the eval fleet probes itself


@pytest.mark.lifecycle_gate
def test_rollout_ft_turns_every_rollout_site_on():
    _, rollout_effects = _reach(ROLLOUT, FT_ROLLOUT)
    assert {"start_monitor", "arm_ci_fault_injection"} <= rollout_effects
    assert "Recovering" in _reach(ENGINE, FT_ROLLOUT)[0]
    assert "recover_engine" in _reach(TRAINER, FT_ROLLOUT)[1]
    assert "probe_engine" not in _reach(EVAL_FLEET, FT_ROLLOUT)[1]  # the monitors probe instead


class Job:
    """One job's lifecycle core, driven as the training loop drives it through the runner: each operation
    runs to its end with every command the core hands out answered by plain success (``Drive``), and a
    fault is the news a shell would report. The tests read what the *core* did -- its moves, its commands,
    its state -- never what they fired themselves."""

    def __init__(self, config: LifecycleConfig, machines: Mapping[str, MachineSpec] | None = None) -> None:
        self.drive = Drive(config, machines=machines)  # type: ignore[arg-type]
        self.refused: list[tuple[str, Refusal]] = []

    def op(self, name: str) -> None:
        refusal = self.drive.op(name)
        if refusal is not None:
            assert refusal.kind in ("blocked", "not_applicable", "failed"), (name, refusal)  # the shells' allow
            self.refused.append((name, refusal))

    def start(self) -> Job:
        self.op("trainer.start")
        self.op("init")
        return self

    def step(self, kill_engine: int | None = None) -> None:
        self.op("generate")
        if kill_engine is not None:  # its server died mid-rollout: the watcher's report
            self.drive.do(Outcome("died", ROLLOUT_GROUP, kill_engine, "exit code -9"))
        if self.drive.s.rollout != "Replay":  # a replayed rollout has no generate_done (rollout/executor.py)
            self.op("generate_done")
        self.op("train")
        self.op("update_weights")

    def effects(self, machine: str | None = None) -> list[str]:
        return [e for m in self.drive.moves if machine in (None, m.machine) for e in m.effects]

    def states(self, instance: str) -> list[str]:
        return [m.dst for m in self.drive.moves if m.instance == instance]


@pytest.mark.construction_gate
@pytest.mark.parametrize("mutant", [None, "replay_constructs_rollout_fn"])
def test_replay_job_ledger_never_constructs(mutant: str | None) -> None:
    job = Job(REPLAY, MUTANTS[mutant].machines() if mutant else None).start()
    for _ in range(3):
        job.step()
    constructed = NEVER_IN_REPLAY & set(job.effects())
    if mutant:  # the check can fail: the miles bug re-introduced into the spec is caught here
        assert constructed == {"construct_rollout_fn", "construct_eval_fn"}
        return
    assert job.drive.s.rollout == "Replay" and not constructed
    assert job.effects("rollout") == ["load_replay_data"] * 3
    assert {(c.machine, c.effect) for c in job.drive.commands if c.machine != "trainer"} == {
        ("rollout", "load_replay_data")
    }
    assert job.drive.s.engines == ()  # no server was ever started
    assert [(name, r.blocked_by) for name, r in job.refused] == [("update_weights", ("updates_rollout_weights",))] * 3


@pytest.mark.recovery
@pytest.mark.monitor
@pytest.mark.lifecycle_gate
@pytest.mark.parametrize("mutant", [None, "monitors_on_ft_master_switch", "trainer_recovery_on_ft_master_switch"])
def test_train_only_ft_job_ledger_has_no_monitor_and_no_trainer_recovery(mutant: str | None) -> None:
    job = Job(FT_TRAIN, MUTANTS[mutant].machines() if mutant else None).start()
    job.step()
    job.step(kill_engine=1)
    leaks = {"start_monitor"} & set(job.effects()) | {"recover_engine"} & set(job.effects("trainer"))
    if mutant:  # the check can fail: each train-only FT leak re-introduced into the spec is caught here
        assert leaks
        return
    assert not leaks and job.drive.s.monitor == "Init"
    assert "Recovering" not in job.states("engine-1")
    assert job.drive.engines() == ["Serving", "Failed"]  # rollout FT is off: the dead engine fails the run
    assert "engine-1" in str(job.drive.s.failed)
    assert {name for name, r in job.refused if r.kind == "failed"} == {"generate_done", "train", "update_weights"}


@pytest.mark.recovery
@pytest.mark.lifecycle_gate
def test_rollout_ft_job_recovers_the_killed_engine() -> None:
    job = Job(FT_ROLLOUT).start()
    job.step(kill_engine=1)
    assert "start_monitor" in job.effects("rollout")
    assert "recover_engine" in job.effects("trainer")
    after = job.states("engine-1")[job.states("engine-1").index("Unhealthy") :]
    assert after[:2] == ["Unhealthy", "Recovering"] and after[-1] == "Quiesced"  # relaunched, then loaded
    assert job.drive.s.engines[1].current and not job.drive.s.failed and not job.refused
