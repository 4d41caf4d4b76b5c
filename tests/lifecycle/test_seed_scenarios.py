"""The two miles regressions, at spec level (the replay crash and the train-only FT leak).

1. Replay (--load-debug-rollout-data) must never construct the rollout function, start servers
   or start monitors -- and plain --debug-train-only still constructs the rollout function.
2. Train-only FT (--use-fault-tolerance --ft-components train) must start no monitor and no
   trainer transition may perform recover_engine; no engine may enter Recovering.

Each is checked twice: exhaustively over every reachable state of each machine (compiled spec),
and by driving real machine instances through a job's step with a shared ledger.
"""

from __future__ import annotations

import pytest

from lifecycle import (
    ENGINE,
    EVAL_FLEET,
    MONITOR,
    ROLLOUT,
    TRAINER,
    EffectLedger,
    IllegalTransition,
    LifecycleConfig,
    LifecycleMachine,
)

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
    """Real machine instances of one job sharing a ledger, stepped like miles' train loop."""

    def __init__(self, config: LifecycleConfig, engines: int = 2) -> None:
        self.ledger = EffectLedger()
        kw = {"ledger": self.ledger}
        self.rollout = LifecycleMachine(ROLLOUT, config, "rollout", **kw)
        self.trainer = LifecycleMachine(TRAINER, config, "trainer", **kw)
        self.monitor = LifecycleMachine(MONITOR, config, "monitor-0", **kw)
        self.engines = [LifecycleMachine(ENGINE, config, f"engine-{i}", **kw) for i in range(engines)]

    def try_fire(self, machine: LifecycleMachine, trigger: str) -> bool:
        try:
            return machine.fire(trigger).ok
        except IllegalTransition:
            return False

    def start(self) -> None:
        self.try_fire(self.rollout, "init")
        if self.try_fire(self.rollout, "start_servers"):
            for e in self.engines:
                for t in ("start", "ready", "begin_update", "finish_update", "resume"):
                    e.fire(t)
            self.rollout.fire("servers_ready")
            if "start_monitor" in self.ledger.effects("rollout"):
                self.monitor.fire("create")
        else:
            self.try_fire(self.rollout, "skip_servers")
        for t in ("allocate", "initialize", "ready"):
            self.trainer.fire(t)

    def step(self, kill_engine: int | None = None) -> None:
        self.rollout.fire("generate")
        if self.monitor.state == "Paused":
            self.monitor.fire("resume")
        if kill_engine is not None:
            self.engines[kill_engine].fire("mark_unhealthy")
        if self.rollout.state == "Generating":
            self.rollout.fire("generate_done")
        if self.monitor.state == "Running":
            self.monitor.fire("pause")
        self.trainer.fire("train")
        self.trainer.fire("train_done")
        if self.trainer.fire("update_weights").ok:
            for e in self.engines:
                if e.state == "Unhealthy":
                    self.try_fire(e, "recover")
            self.trainer.fire("update_done")


@pytest.mark.construction_gate
def test_replay_job_ledger_never_constructs():
    job = Job(REPLAY)
    job.start()
    for _ in range(3):
        job.step()
    assert job.rollout.state == "Replay"
    assert job.ledger.effects("rollout") == ["load_replay_data"] * 3
    assert not NEVER_IN_REPLAY & set(job.ledger.effects())
    assert all(e.state == "Init" for e in job.engines)


@pytest.mark.recovery
@pytest.mark.monitor
@pytest.mark.lifecycle_gate
def test_train_only_ft_job_ledger_has_no_monitor_and_no_trainer_recovery():
    job = Job(FT_TRAIN)
    job.start()
    job.step()
    job.step(kill_engine=1)
    assert "start_monitor" not in job.ledger.effects()
    assert "recover_engine" not in job.ledger.effects("trainer")
    assert job.engines[1].state == "Unhealthy"
    assert job.engines[1].fire("recover").blocked_by == ("rollout_ft",)


@pytest.mark.recovery
@pytest.mark.lifecycle_gate
def test_rollout_ft_job_recovers_the_killed_engine():
    job = Job(FT_ROLLOUT)
    job.start()
    job.step(kill_engine=1)
    assert "start_monitor" in job.ledger.effects("rollout")
    assert "recover_engine" in job.ledger.effects("trainer")
    assert job.engines[1].state == "Recovering"
