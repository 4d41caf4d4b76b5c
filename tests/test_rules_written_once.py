"""Every lifecycle rule is written once, in the core: the runtime modules ask it, they do not re-decide.

Read from the source (the AST) of every runtime module (``engines/``, ``rollout/``, ``trainer/``,
``engines/cpu/``, ``engines/models/``):

* **no predicate outside the spec machinery**: no import of ``lifecycle.decide.predicates``, no read of a
  compiled predicate vector (``core.predicates[...]``), no ``ft_components`` comparison -- a guard of a spec
  decides, and the runtime executes the core's commands;
* **no state set typed out by hand**: no tuple, list or set literal of two or more state names (the
  groups are the specs' tags: ``core.live``, ``core.gone``, ...), and every state name a comparison
  uses is one a spec has (a renamed state cannot become a comparison that is silently ``False``;
  mypy catches the ``==`` case through :mod:`lifecycle.decide.names`).

Each check is shown to fail on a re-introduced violation (``test_the_scan_finds_*``).
"""

from __future__ import annotations

import ast
from pathlib import Path

from lifecycle.decide.machines import MACHINES

ROOT = Path(__file__).resolve().parent.parent
RUNTIME = ("engines", "rollout", "trainer")
STATES = frozenset(name for spec in MACHINES.values() for name in spec.state_names)
# Modules that read predicates for something other than a lifecycle decision, and why.
PREDICATE_READERS = {
    "trainer/app/checks.py": "pre-flight checks of lifecycle run's own options, one ConfigError naming the flag",
    "trainer/app/faults.py": "--inject pre-flight checks, and expected(): the fault matrix's contract (a test oracle)",
}


def _looks_like_state(value: object) -> bool:
    return isinstance(value, str) and value[:1].isupper() and value.isalpha() and not value.isupper()


def scan(source: str, path: str) -> list[str]:
    """The rule violations in one module's source."""
    tree = ast.parse(source)
    problems: list[str] = []
    for node in ast.walk(tree):
        if path not in PREDICATE_READERS:
            if isinstance(node, ast.ImportFrom) and node.module == "lifecycle.decide.predicates":
                problems.append(f"{path}:{node.lineno}: imports lifecycle.decide.predicates")
            if isinstance(node, ast.Import) and any(a.name == "lifecycle.decide.predicates" for a in node.names):
                problems.append(f"{path}:{node.lineno}: imports lifecycle.decide.predicates")
            if (
                isinstance(node, ast.Subscript)
                and isinstance(node.value, ast.Attribute)
                and node.value.attr in ("p", "predicates")
            ):
                problems.append(f"{path}:{node.lineno}: reads a predicate value (.{node.value.attr}[...])")
            if isinstance(node, ast.Attribute) and node.attr == "ft_components":
                problems.append(f"{path}:{node.lineno}: reads ft_components (a predicate decides)")
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            named = [e.value for e in node.elts if isinstance(e, ast.Constant) and e.value in STATES]
            if len(named) >= 2:
                problems.append(f"{path}:{node.lineno}: a state set typed out by hand: {named}")
        if isinstance(node, ast.Compare):
            for operand in [node.left, *node.comparators]:
                constants = operand.elts if isinstance(operand, (ast.Tuple, ast.List, ast.Set)) else [operand]
                for c in constants:
                    if isinstance(c, ast.Constant) and _looks_like_state(c.value) and c.value not in STATES:
                        problems.append(f"{path}:{node.lineno}: compares with {c.value!r}, which no spec has")
    return problems


def _runtime_modules() -> list[Path]:
    return [p for pkg in RUNTIME for p in sorted((ROOT / pkg).rglob("*.py")) if "__pycache__" not in p.parts]


def test_no_runtime_module_re_decides_a_lifecycle_rule() -> None:
    problems = [problem for p in _runtime_modules() for problem in scan(p.read_text(), p.relative_to(ROOT).as_posix())]
    assert not problems, "\n".join(problems)


def test_the_allow_list_is_still_needed() -> None:
    """An exception that no longer reads predicates is removed, so the list cannot grow stale."""
    for path in PREDICATE_READERS:
        assert "lifecycle.decide.predicates" in (ROOT / path).read_text(), f"{path} no longer reads predicates: drop it"


def test_the_scan_finds_a_predicate_call_in_runtime_code() -> None:
    bad = (
        "from lifecycle.decide.predicates import rollout_ft\n"
        "def on_death(config, core):\n"
        "    if rollout_ft(config) or core.predicates['monitors_rollout'] or 'rollout' in config.ft_components:\n"
        "        pass\n"
    )
    found = scan(bad, "rollout/controller.py")
    assert [p.split(": ", 1)[1] for p in found] == [
        "imports lifecycle.decide.predicates",
        "reads a predicate value (.predicates[...])",
        "reads ft_components (a predicate decides)",
    ], found


def test_the_scan_finds_a_hand_typed_state_set_and_a_renamed_state() -> None:
    bad = (
        "def f(engine):\n"
        "    if engine.state in ('Unhealthy', 'Failed', 'Recovering'):\n"
        "        return engine.state == 'Serveing'\n"
    )
    found = scan(bad, "rollout/controller.py")
    assert any("state set typed out by hand" in p for p in found), found
    assert any("'Serveing', which no spec has" in p for p in found), found
