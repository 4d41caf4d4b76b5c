"""Stateful property tests of the lifecycle core in its world (and of the transitions machines against it).

The rules are the checker's own step families (see :mod:`jobmodel`); every step is checked with
``check_step``, every state with ``check_state``. The hypothesis profile (``dev``/``ci``) sets the
number of runs; ``stateful_step_count`` is hypothesis' default (50 steps per run).
"""

from __future__ import annotations

import pytest
from hypothesis import Phase, settings
from hypothesis.stateful import run_state_machine_as_test
from jobmodel import (
    REPLAY,
    TRAIN_ONLY_FT,
    make_machine,
    make_runtime_machine,
    replay_machine,
    train_only_ft_machine,
)

from lifecycle.check.explore import ELASTIC_CONFIGS
from lifecycle.check.mutants import MUTANTS

# every valid config of the lattice, 1-3 engines, <= 2 faults per run
TestJobModel = make_machine().TestCase

# the runtime machine layer replays every step and must agree with the model
TestRuntimeMatchesModel = make_runtime_machine().TestCase

# an elastic fleet only (6 of the lattice's ~150 configs): its scales, retirements, notices and drains drawn in every
# run, replayed on the runtime machines too
TestElasticFleetMatchesModel = make_runtime_machine(configs=ELASTIC_CONFIGS).TestCase


@pytest.mark.recovery
@pytest.mark.lifecycle_gate
def test_train_only_ft_never_reaches_rollout_recovery():
    assert {c.ft_components for c in TRAIN_ONLY_FT} == {frozenset({"train"})}
    run_state_machine_as_test(train_only_ft_machine())


@pytest.mark.construction_gate
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
