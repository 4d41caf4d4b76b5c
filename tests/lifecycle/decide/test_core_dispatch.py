"""The core's dispatch table classifies every effect of every spec exactly once: coupled (the core does it
itself), ledger-only (a label of the move) or a command (a shell's handler). An effect a spec gains that
the table does not know would silently become a command nobody meant; one listed twice would make what
the core does with it depend on the order of the rows. Both are caught here, and shown to be."""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Mapping

import pytest

from lifecycle.decide.config import LifecycleConfig
from lifecycle.decide.core import DISPATCH, EFFECT_TABLE, Core
from lifecycle.decide.core.tables import EffectRow, coupled, dispatch, ledger
from lifecycle.decide.effects import EFFECTS
from lifecycle.decide.machines import MACHINES
from lifecycle.decide.presets import PRESETS, preset
from lifecycle.decide.spec import MachineSpec, T

# commands the core issues from its own couplings and phases, not from a spec's move
ISSUED_BY_THE_CORE = frozenset({("engine", "probe_engine"), ("engine", "inject_ci_fault"), ("rollout", "read_gateway")})


def problems(rows: tuple[EffectRow, ...], specs: Mapping[str, MachineSpec]) -> list[str]:
    """What is wrong with a table for these specs: effects in no class, in two, or in the table for nothing."""
    wanted = {(name, e.name) for name, spec in specs.items() for t in spec.transitions for e in t.effects}
    wanted |= ISSUED_BY_THE_CORE
    counts = Counter((machine, effect) for machine, effect, _ in rows)
    out = [f"{m}.{e} is in no class" for m, e in sorted(wanted - counts.keys())]
    out += [f"{m}.{e} is classified {n} times" for (m, e), n in sorted(counts.items()) if n > 1]
    out += [f"{m}.{e} is classified but nothing issues it" for m, e in sorted(counts.keys() - wanted)]
    out += [f"{m}.{e} is not in lifecycle.decide.effects" for m, e in sorted(counts) if e not in EFFECTS]
    return out


def test_every_effect_of_every_spec_is_classified_exactly_once() -> None:
    assert problems(EFFECT_TABLE, MACHINES) == []
    assert {h.kind for h in DISPATCH.values()} == {"coupled", "ledger", "command"}


def test_an_effect_a_spec_gains_that_the_table_does_not_know_is_caught() -> None:
    engine = MACHINES["engine"]
    planted = dataclasses.replace(
        engine, transitions=(*engine.transitions, T("probe", "Serving", "Serving", effects=["save_rollout_data"]))
    )
    assert problems(EFFECT_TABLE, {**MACHINES, "engine": planted}) == ["engine.save_rollout_data is in no class"]
    dropped = tuple(row for row in EFFECT_TABLE if row[:2] != ("monitor", "discard_probe_result"))
    assert problems(dropped, MACHINES) == ["monitor.discard_probe_result is in no class"]


def test_an_effect_in_two_classes_is_caught_and_never_silently_overridden() -> None:
    twice = (*EFFECT_TABLE, ("engine", "kill_engine", ledger("planted: a label as well as a command")))
    assert problems(twice, MACHINES) == ["engine.kill_engine is classified 2 times"]
    with pytest.raises(ValueError, match=r"engine\.kill_engine is classified twice \(command, ledger\)"):
        dispatch(twice)
    again = (*EFFECT_TABLE, ("rollout", "release_engine_lock", coupled("planted: the same class again")))
    assert problems(again, MACHINES) == ["rollout.release_engine_lock is classified 2 times"]
    with pytest.raises(ValueError, match="classified twice"):
        dispatch(again)


BROADCAST_MODE = {"rollout_num_gpus": 2, "update_weight_transfer_mode": "broadcast"}


@pytest.mark.parametrize("name", [*sorted(PRESETS), "broadcast"])
def test_every_command_a_config_can_issue_is_a_command_in_the_table(name: str) -> None:
    """What a runtime must bind (``Core.commands``) is read off the table, under every preset."""
    config = LifecycleConfig.from_mapping(BROADCAST_MODE, check_paths=False) if name == "broadcast" else preset(name)
    commands = Core(config).commands()
    assert (("engine", "transfer_weights.broadcast") in commands) == (name == "broadcast")
    for machine, effect in commands:
        if effect == "transfer_weights.broadcast":  # a member's receive: the same effect, the group's handler
            effect = "transfer_weights"
        assert DISPATCH[machine, effect].kind == "command", (machine, effect)
