"""The fault kinds are one table (``lifecycle.decide.faults.FAULT_KINDS``): every reader of a kind takes it from there.

:func:`missing` names, for each kind of a table, every consumer that does not know it: the CLI's parsing
and ``--inject`` help, the injector, the promised outcome, the reliability matrix's cells, its report's
table of faults and the run timeline. The shipped table has none missing; a kind added to the table
alone is reported by every one of them.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

import pytest
from reliability_report import CELLS, FT_CONFIGS, render

from lifecycle.decide.errors import ConfigError
from lifecycle.decide.faults import FAULT_INJECTED, FAULT_KINDS, FaultKind
from lifecycle.observe.timeline import build_timeline
from trainer.app.faults import HEALS, INJECTORS, OUTCOMES, expected, parse_fault


def _inject_help() -> str:
    from trainer.app.cli import register

    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    run = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices["run"]
    return str(next(a for a in run._actions if "--inject" in a.option_strings).help)


def _report() -> str:
    from reliability_report import CellResult

    return render({cell: CellResult(*cell, "observed", 0.0) for cell in CELLS}, 0.0)


def missing(kinds: Sequence[FaultKind]) -> list[str]:
    """``kind: consumer`` for every consumer that does not know a kind of ``kinds``."""
    found: list[str] = []
    help_text, report = _inject_help(), _report()
    for kind in kinds:
        name = kind.name
        try:
            parse_fault(f"{name}:0@1")
        except ConfigError:
            found.append(f"{name}: --inject parsing")
        if name not in help_text:
            found.append(f"{name}: --inject help")
        if name not in INJECTORS:
            found.append(f"{name}: injector")
        if name not in OUTCOMES or kind.target not in HEALS:
            found.append(f"{name}: outcome")
        else:
            modes = {m for k, m, _ in CELLS if k == name} or {"normal"}
            if not all(expected(name, ft, mode).text for ft in FT_CONFIGS for mode in modes):
                found.append(f"{name}: outcome (an empty promise)")
        if not any(k == name for k, _, _ in CELLS):
            found.append(f"{name}: matrix cells")
        if f"| `{name}` | {kind.doc} |" not in report:
            found.append(f"{name}: report")
        timeline = build_timeline([{"event": FAULT_INJECTED, "fault": f"{name}:0@1", "target": "x"}])
        if [m.label for m in timeline.markers] != [f"{name}:0@1"]:
            found.append(f"{name}: timeline")
    return found


def test_every_consumer_knows_every_fault_kind() -> None:
    assert missing(FAULT_KINDS) == []


def test_injectors_and_outcomes_are_of_the_table_s_kinds_only() -> None:
    names = [k.name for k in FAULT_KINDS]
    assert len(set(names)) == len(names)
    assert set(INJECTORS) == set(OUTCOMES) == set(names)


@pytest.mark.parametrize("target", ["engine", "trainer", "router", "driver"])
def test_a_kind_added_to_the_table_alone_is_caught_by_every_consumer(target: str) -> None:
    new = FaultKind("melt-part", target, "the part melts")  # type: ignore[arg-type]
    found = missing([*FAULT_KINDS, new])
    consumers = ["--inject parsing", "--inject help", "injector", "outcome", "matrix cells", "report"]
    assert found == [f"melt-part: {c}" for c in consumers]  # the timeline draws any fault it is given
