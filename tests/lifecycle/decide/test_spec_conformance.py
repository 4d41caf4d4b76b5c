"""The pure table the explorer uses and the `transitions` machines the runtime uses agree.

For every machine, every distinct predicate vector of the lattice, every state and every
trigger: a plain `transitions` machine built from the spec, the compiled lookup table, and the
runtime `LifecycleMachine` give the same answer -- same destination and effects, blocked when the
table says Blocked, an error when the table has no entry.
"""

from __future__ import annotations

import pytest
from transitions.core import MachineError

from lifecycle.check.explore import lattice
from lifecycle.decide.errors import IllegalTransition
from lifecycle.decide.machines import MACHINES
from lifecycle.decide.runtime import LifecycleMachine, build_transitions_machine
from lifecycle.decide.spec import Blocked, Step

CONFIGS = [group[0] for group in lattice().groups.values()]


class Model:
    state: str


def _check_config(spec, config) -> int:
    table = spec.compile(config).table
    model = Model()
    raw = build_transitions_machine(spec, config, model=model)
    checked = 0
    for state in spec.state_names:
        for trigger in spec.triggers:
            # the plain transitions machine
            raw.set_state(state, model)
            try:
                moved = raw.events[trigger].trigger(model)
                raw_out, raw_dest = ("moved" if moved else "blocked"), model.state
            except MachineError:
                raw_out, raw_dest = "illegal", None
            # the runtime machine layer
            rt = LifecycleMachine(spec, config, "x")
            rt.state = state
            try:
                result = rt.fire(trigger)
                run_out, run_dest, effects = ("moved" if result.ok else "blocked"), rt.state, tuple(result.effects)
            except IllegalTransition:
                run_out, run_dest, effects = "illegal", None, ()
            out = table.get((state, trigger))
            where = (spec.name, state, trigger, config.to_flags())
            if out is None:
                assert raw_out == "illegal" and run_out == "illegal", where
            elif isinstance(out, Blocked):
                assert raw_out == "blocked" and run_out == "blocked", where
                assert raw_dest == run_dest == state, where
            else:
                assert isinstance(out, Step)
                assert raw_out == "moved" and run_out == "moved", where
                assert raw_dest == run_dest == out.dest, where
                assert effects == out.effects, where
            checked += 1
    return checked


@pytest.mark.parametrize("name", sorted(MACHINES))
def test_transitions_table_and_runtime_agree_for_every_state_event_and_config(name):
    spec = MACHINES[name]
    checked = sum(_check_config(spec, config) for config in CONFIGS)
    assert checked == len(CONFIGS) * len(spec.state_names) * len(spec.triggers)
