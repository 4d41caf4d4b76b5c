"""The core's phases and what each command result does are tables, held to what names them.

``PHASES``: every phase an operation's program (``plan.OPERATIONS``), an effect (``EFFECT_TABLE``) or a phase
itself (``step.prepend``) names has a row, and no row is unused; a machine-event phase names a real machine
event. ``RESULT_TABLE``: every row names a machine, an effect and an outcome that exist
(``plan.RESULTS``), and no two rows of one key could both apply unconditionally. Each check is shown to fail.
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

from lifecycle.decide.core import EFFECT_TABLE, OPERATIONS, PHASES, RESULT_TABLE, RESULTS, Operation, ResultRow
from lifecycle.decide.core.parts import PARTS
from lifecycle.decide.core.plan import ERROR
from lifecycle.decide.core.tables import ANY, DISPATCH, candidates
from lifecycle.decide.machines import MACHINES

CORE = Path(__file__).resolve().parents[3] / "lifecycle" / "decide" / "core"


def prepended(sources: Iterable[str]) -> set[str]:
    """The phase names the core's modules put in front of an operation's program: ``*.prepend(lane, (...))``."""
    found: set[str] = set()
    for source in sources:
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "prepend":
                for arg in node.args[1:]:
                    found |= {
                        c.value for c in ast.walk(arg) if isinstance(c, ast.Constant) and isinstance(c.value, str)
                    }
    return found


def named_phases(operations: Mapping[str, Operation], sources: Iterable[str]) -> set[str]:
    named = {p for op in operations.values() for p in op.program}
    named |= {p for _, _, handling in EFFECT_TABLE for p in handling.phases}
    return named | prepended(sources)


def phase_problems(
    phases: Mapping[str, Callable[..., object]], operations: Mapping[str, Operation], sources: Iterable[str]
) -> list[str]:
    named = named_phases(operations, sources)
    own = {p for p in named if "." not in p}
    out = [f"phase {p!r} is named but has no row" for p in sorted(own - phases.keys())]
    out += [f"phase {p!r} has a row but nothing names it" for p in sorted(phases.keys() - own)]
    for p in sorted(named - own):
        part, trigger = p.split(".", 1)
        spec = MACHINES.get(PARTS.get(part, ""))
        if spec is None or all(t.trigger != trigger for t in spec.transitions):
            out.append(f"phase {p!r} names no machine event")
    return out


def core_sources() -> list[str]:
    return [p.read_text() for p in sorted(CORE.glob("*.py"))]


def test_every_phase_named_has_a_row_and_every_row_is_named() -> None:
    assert phase_problems(PHASES, OPERATIONS, core_sources()) == []
    assert "catch_up_done" in prepended(core_sources())  # the scan sees the phases the phases prepend


def test_a_phase_without_a_row_or_a_row_nobody_names_is_caught() -> None:
    sources = core_sources()
    missing = {name: run for name, run in PHASES.items() if name != "fleet_alive"}
    assert phase_problems(missing, OPERATIONS, sources) == ["phase 'fleet_alive' is named but has no row"]
    unused = {**PHASES, "warm_up": lambda step: None}
    assert phase_problems(unused, OPERATIONS, sources) == ["phase 'warm_up' has a row but nothing names it"]
    typo = {**OPERATIONS, "eval": Operation("rollout", ("recover", "catch_up", "rollout.evaluate"))}
    assert phase_problems(PHASES, typo, sources) == ["phase 'rollout.evaluate' names no machine event"]
    dropped = {name: op for name, op in OPERATIONS.items() if name != "trainer.start"}
    assert phase_problems(PHASES, dropped, sources) == ["phase 'trainer_ready' has a row but nothing names it"]


def result_problems(rows: Iterable[ResultRow]) -> list[str]:
    """Rows that name something that does not exist, or that another row of the same key always hides."""
    out: list[str] = []
    seen: dict[tuple[str, str, str], ResultRow] = {}
    for row in rows:
        key = (row.machine, row.effect, row.outcome)
        if row.machine != ANY and row.machine not in MACHINES:
            out.append(f"{key}: no machine {row.machine!r}")
        elif row.effect != ANY and (row.machine, row.effect) not in DISPATCH:
            out.append(f"{key}: {row.machine} has no effect {row.effect!r}")
        elif row.outcome not in (ANY, ERROR):
            effects = [row.effect] if row.effect != ANY else [e for m, e in DISPATCH if m == row.machine]
            if not any(row.outcome in RESULTS.get(e, frozenset({"done"})) for e in effects):
                out.append(f"{key}: no result {row.outcome!r} of {row.machine}.{row.effect}")
        if key in seen and seen[key].when is None:
            out.append(f"{key}: never applies (an earlier row of its key always does)")
        seen[key] = row
    return out


def test_every_result_row_names_a_real_result_and_applies_somewhere() -> None:
    assert result_problems(RESULT_TABLE) == []


def test_a_result_row_for_nothing_or_hidden_by_another_is_caught() -> None:
    first = RESULT_TABLE[0]
    planted = (
        *RESULT_TABLE,
        first._replace(outcome="started"),
        first._replace(effect="launch"),
        first._replace(when=None),
    )
    assert result_problems(planted) == [
        "('engine', 'launch_engine', 'started'): no result 'started' of engine.launch_engine",
        "('engine', 'launch', 'ready'): engine has no effect 'launch'",
        "('engine', 'launch_engine', 'ready'): never applies (an earlier row of its key always does)",
    ]


def test_what_a_failed_launch_does_is_one_row_to_find() -> None:
    rows = candidates("engine", "launch_engine", "start_failed")
    assert rows[0].effect == "launch_engine" and "start_failed" in rows[0].doc
    raised = candidates("engine", "launch_engine", ERROR)
    assert raised[0].outcome == ERROR and raised[-1].machine == ANY  # then a marked engine, then the run stops
