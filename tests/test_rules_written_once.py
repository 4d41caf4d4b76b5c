"""Every lifecycle rule is written once, in the core: the runtime modules ask it, they do not re-decide.

Read from the source (the AST) of every runtime module (``engines/``, ``rollout/``, ``trainer/``,
``engines/cpu/``, ``engines/models/``):

* **no predicate outside the spec machinery**: no import of ``lifecycle.decide.predicates``, no read of a
  compiled predicate vector (``core.predicates[...]``), no ``ft_components`` comparison -- a guard of a spec
  decides, and the runtime executes the core's commands;
* **no state set typed out by hand**: no tuple, list or set literal of two or more state names (the
  groups are the specs' tags: ``core.live``, ``core.gone``, ...), and every state name a comparison
  uses is one a spec has (a renamed state cannot become a comparison that is silently ``False``;
  mypy catches the ``==`` case through :mod:`lifecycle.decide.names`);
* **no branch on a backend's name** anywhere in the four packages (``lifecycle/`` too): no ``==``/``!=`` with
  ``"vllm"`` or ``"sglang"``, no ``in`` a literal collection of them, no ``case "vllm":`` -- what differs per
  backend is a column of its row (``engines/backends.py``, its abilities in ``lifecycle/decide/backends.py``),
  so a third backend is one row, not an edit of every branch.

Each check is shown to fail on a re-introduced violation (``test_the_scan_finds_*``).
"""

from __future__ import annotations

import ast
from pathlib import Path

from lifecycle.decide.backends import BACKENDS
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


# The backend tables: the only modules that name backends to tell them apart (each row is a backend).
BACKEND_TABLES = {
    "engines/backends.py": "the runtime half of each backend, one row each",
    "lifecycle/decide/backends.py": "what each backend can do, one row per device",
}


def backend_branches(source: str, path: str) -> list[str]:
    """Where a module branches on a backend's name (a comparison with it, or a ``case`` of it)."""
    names = frozenset(BACKENDS)
    problems: list[str] = []
    for node in ast.walk(ast.parse(source)):
        named: list[object] = []
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            for op, left, right in zip(node.ops, operands[:-1], operands[1:], strict=True):
                if isinstance(op, (ast.Eq, ast.NotEq, ast.Is, ast.IsNot)):
                    named += [o.value for o in (left, right) if isinstance(o, ast.Constant) and o.value in names]
                elif isinstance(op, (ast.In, ast.NotIn)) and isinstance(right, (ast.Tuple, ast.List, ast.Set)):
                    named += [e.value for e in right.elts if isinstance(e, ast.Constant) and e.value in names]
        elif isinstance(node, ast.MatchValue) and isinstance(node.value, ast.Constant) and node.value.value in names:
            named.append(node.value.value)
        if named:
            problems.append(f"{path}:{node.lineno}: branches on the backend name {named[0]!r} (a column of its row)")
    return problems


def _runtime_modules() -> list[Path]:
    return [p for pkg in RUNTIME for p in sorted((ROOT / pkg).rglob("*.py")) if "__pycache__" not in p.parts]


def test_no_runtime_module_re_decides_a_lifecycle_rule() -> None:
    problems = [problem for p in _runtime_modules() for problem in scan(p.read_text(), p.relative_to(ROOT).as_posix())]
    assert not problems, "\n".join(problems)


def test_no_module_branches_on_a_backend_name() -> None:
    modules = [p for pkg in ("lifecycle", *RUNTIME) for p in sorted((ROOT / pkg).rglob("*.py"))]
    problems = [
        problem
        for p in modules
        if "__pycache__" not in p.parts and p.relative_to(ROOT).as_posix() not in BACKEND_TABLES
        for problem in backend_branches(p.read_text(), p.relative_to(ROOT).as_posix())
    ]
    assert not problems, "\n".join(problems)


def test_the_scan_finds_a_branch_on_a_backend_name() -> None:
    bad = (
        "def f(config, backend):\n"
        "    if config.rollout_backend == 'vllm':\n"
        "        return 300.0\n"
        "    if 'sglang' != backend or backend in ('vllm', 'other'):\n"
        "        return 1\n"
        "    match backend:\n"
        "        case 'vllm':\n"
        "            return 2\n"
        "    return 'vllm' in SOMETHING  # a membership in a name's collection: not a branch on the name\n"
    )
    found = backend_branches(bad, "trainer/app/job.py")
    assert [p.split(":")[1] for p in found] == ["2", "4", "4", "7"], found
    assert all("a column of its row" in p for p in found)


def test_the_allow_list_is_still_needed() -> None:
    """An exception that no longer reads predicates is removed, so the list cannot grow stale."""
    for path in PREDICATE_READERS:
        assert "lifecycle.decide.predicates" in (ROOT / path).read_text(), f"{path} no longer reads predicates: drop it"
    for path in BACKEND_TABLES:
        assert (ROOT / path).exists(), f"{path} is gone: drop it from BACKEND_TABLES"


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
