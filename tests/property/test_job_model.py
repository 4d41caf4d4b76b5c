"""Stateful property tests of the job's product model (and of the runtime machines against it).

The rules are the product model's own events (see :mod:`jobmodel`); every step is checked with
``check_step``, every state with ``check_state``. The hypothesis profile (``dev``/``ci``) sets the
number of runs; ``stateful_step_count`` is hypothesis' default (50 steps per run).
"""

from __future__ import annotations

import pytest
from hypothesis import Phase, settings
from hypothesis.stateful import invariant, run_state_machine_as_test

from lifecycle.invariants import NEVER_IN_REPLAY
from lifecycle.job import Product, Transition
from lifecycle.mutants import MUTANTS

from .jobmodel import JobModelBase, configs_where, make_machine, make_runtime_machine

# every valid config of the lattice, 1-3 engines, <= 2 faults per run
TestJobModel = make_machine().TestCase

# the runtime machine layer replays every step and must agree with the model
TestRuntimeMatchesModel = make_runtime_machine().TestCase

TRAIN_ONLY_FT = configs_where(ft_enabled=True, train_ft=True, rollout_ft=False)
REPLAY = configs_where(replay=True)
ROLLOUT_RECOVERY = frozenset({"recover_engine", "start_monitor", "probe_engine", "arm_ci_fault_injection"})


def train_only_ft_machine(machines=None) -> type[JobModelBase]:
    """``--use-fault-tolerance --ft-components train``: nothing rollout-side recovers or monitors."""

    class TrainOnlyFT(make_machine(machines, TRAIN_ONLY_FT)):
        def observe(self, t: Transition, before: Product) -> None:
            for m in t.moves:
                # probe_engine is the monitor's probe; the eval fleet probing itself is expected here
                forbidden = ROLLOUT_RECOVERY - ({"probe_engine"} if m.machine == "eval_fleet" else set())
                bad = forbidden & set(m.effects)
                assert not bad, f"{m.instance}.{m.trigger} performed {sorted(bad)} under train-only FT\n{self.where()}"

        @invariant()
        def no_rollout_recovery_state(self) -> None:
            s = self.state
            assert s is not None
            assert not any(e.state == "Recovering" for e in s.engines), f"an engine is Recovering: {s.engines}"
            assert s.monitor in ("Init", "Stopped"), f"a rollout monitor is {s.monitor} under train-only FT"

    return TrainOnlyFT


def replay_machine(machines=None) -> type[JobModelBase]:
    """``--load-debug-rollout-data``: the job never constructs, starts servers, monitors or a fleet."""

    class Replay(make_machine(machines, REPLAY)):
        def observe(self, t: Transition, before: Product) -> None:
            for m in t.moves:
                bad = NEVER_IN_REPLAY & set(m.effects)
                assert not bad, f"{m.instance}.{m.trigger} performed {sorted(bad)} while replaying\n{self.where()}"

        @invariant()
        def nothing_built(self) -> None:
            s = self.state
            assert s is not None
            assert s.rollout in ("Init", "Replay"), s.rollout
            assert s.monitor == "Init" and s.fleet == "Init"
            assert all(e.state == "Init" for e in s.engines)

    return Replay


def test_train_only_ft_never_reaches_rollout_recovery():
    assert {c.ft_components for c in TRAIN_ONLY_FT} == {frozenset({"train"})}
    run_state_machine_as_test(train_only_ft_machine())


def test_replay_never_constructs():
    assert all(c.load_debug_rollout_data is not None for c in REPLAY)
    run_state_machine_as_test(replay_machine())


def test_runtime_comparison_detects_a_runtime_that_drifts_from_the_model():
    """The runtime machines built from different specs than the model's must be caught."""
    drifted = MUTANTS["replay_constructs_rollout_fn"].machines()

    class Drifted(make_runtime_machine(configs=REPLAY)):
        def on_start(self):
            specs, self.specs = self.specs, drifted
            try:
                super().on_start()
            finally:
                self.specs = specs

    with pytest.raises(AssertionError, match="construct_rollout_fn"):
        run_state_machine_as_test(
            Drifted, settings=settings(max_examples=50, database=None, derandomize=True, phases=[Phase.generate])
        )
