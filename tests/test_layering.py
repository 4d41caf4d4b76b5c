"""Imports flow one way, layer by layer, with no cycle.

Only the card's four packages exist (lifecycle <- engines <- rollout <- trainer); inside them the
layers are sub-packages: lifecycle's decide <- check <- observe <- graph <- cli; engines' model
families (engines.models) <- the client shell (engines) <- the engine programs (engines.cpu,
engines.sim) and the vLLM backend (engines.vllm) <- the backend table (engines.backends: a row per
backend, above the packages its rows point at); trainer's shell <- the application (trainer.app: the
run's assembly, loop, CLI).

Read from the source (the AST), not from ``sys.modules``: an import inside a function, a string
given to ``importlib.import_module`` or ``__import__`` counts the same as a top-level import, so a
rule cannot be dodged by importing late. Only ``if TYPE_CHECKING:`` blocks are left out (they never
run).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("lifecycle", "engines", "rollout", "trainer")  # the card's four, and nothing else is installed
_DECIDE = frozenset({"lifecycle.decide"})
_CHECK = _DECIDE | {"lifecycle.check"}
_OBSERVE = _CHECK | {"lifecycle.observe"}
_GRAPH = _OBSERVE | {"lifecycle.graph"}
LIFECYCLE = _GRAPH | {"lifecycle.cli", "lifecycle"}
# What each layer may import (besides itself and third-party code). A module's layer is the longest
# layer name that is a prefix of its dotted name. lifecycle/ is the pure core.
ALLOWED: dict[str, frozenset[str]] = {
    "lifecycle.decide": frozenset(),
    "lifecycle.check": _DECIDE,
    "lifecycle.observe": _CHECK,
    "lifecycle.graph": _OBSERVE,
    "lifecycle.cli": _GRAPH,
    "lifecycle": _DECIDE,  # the package's public names, re-exported
    "engines.models": LIFECYCLE,
    "engines": LIFECYCLE,
    "engines.cpu": LIFECYCLE | {"engines.models", "engines"},
    "engines.sim": LIFECYCLE | {"engines.models", "engines"},
    "engines.vllm": LIFECYCLE | {"engines.models", "engines"},  # the vLLM client, and the plugin vLLM loads
    # the backend table: one row per backend, so it sits above the backends' packages it points at
    "engines.backends": LIFECYCLE | {"engines.models", "engines", "engines.vllm"},
    "rollout": LIFECYCLE | {"engines.models", "engines", "engines.vllm", "engines.backends"},
    "trainer": LIFECYCLE | {"engines.models", "engines", "engines.vllm", "rollout"},
    "trainer.app": LIFECYCLE
    | {
        "engines.models",
        "engines",
        "engines.cpu",
        "engines.sim",
        "engines.vllm",
        "engines.backends",
        "rollout",
        "trainer",
    },
}
# The core imports no runtime code at all (DEVELOPERS.md: no Ray, torch or HTTP in lifecycle/).
CORE_FORBIDDEN = (
    "ray",
    "torch",
    "aiohttp",
    "httpx",
    "requests",
    "urllib",
    "sglang",
    "sglang_router",
    "smg",
    "prometheus_client",
)


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES: dict[str, Path] = {
    _module_name(p): p
    for package in PACKAGES
    for p in sorted((ROOT / package).rglob("*.py"))
    if "__pycache__" not in p.parts
}


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _walk_runtime(node: ast.AST) -> Iterator[ast.AST]:
    """Every node that can run, skipping the bodies of ``if TYPE_CHECKING:``."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.If) and _is_type_checking(child.test):
            for other in child.orelse:
                yield other
                yield from _walk_runtime(other)
            continue
        yield child
        yield from _walk_runtime(child)


def imports_of(module: str) -> list[tuple[int, str]]:
    """(line, imported module) for every import the module can execute, resolved to a known module if possible."""
    path = MODULES[module]
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: list[tuple[int, str]] = []
    for node in _walk_runtime(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                candidate = f"{base}.{alias.name}"
                found.append((node.lineno, candidate if candidate in MODULES else base))
        elif isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if name in ("import_module", "__import__") and node.args:
                arg = node.args[0]
                if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                    found.append((node.lineno, arg.value))
    return found


def _shown(path: Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else path.name


def _top(name: str) -> str:
    """The layer a module belongs to (the longest layer name it starts with), else its top-level name."""
    layers = [layer for layer in ALLOWED if name == layer or name.startswith(layer + ".")]
    return max(layers, key=len) if layers else name.split(".")[0]


def test_every_layer_is_scanned() -> None:
    assert {_top(m) for m in MODULES} == set(ALLOWED)
    assert "trainer.app.cli" in MODULES and "lifecycle.cli" in MODULES


def upward_imports(package: str) -> list[str]:
    """Imports of ``package``'s modules that the layering forbids, as ``file:line imports target``."""
    return [
        f"{_shown(MODULES[m])}:{line} imports {target}"
        for m in MODULES
        if _top(m) == package
        for line, target in imports_of(m)
        if _top(target) in ALLOWED and _top(target) != package and _top(target) not in ALLOWED[package]
    ]


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_imports_flow_one_way(package: str) -> None:
    wrong = upward_imports(package)
    assert not wrong, f"{package}/ may import only {sorted(ALLOWED[package])}:\n" + "\n".join(wrong)


def test_the_core_imports_no_runtime_code() -> None:
    wrong = [
        f"{_shown(MODULES[m])}:{line} imports {target}"
        for m in MODULES
        if m.split(".")[0] == "lifecycle"
        for line, target in imports_of(m)
        if _top(target) in CORE_FORBIDDEN
    ]
    assert not wrong, "\n".join(wrong)


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one node (Tarjan), i.e. import cycles."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def module_graph() -> dict[str, set[str]]:
    return {m: {t for _, t in imports_of(m) if t in MODULES and t != m} for m in MODULES}


def test_no_module_import_cycle() -> None:
    cycles = _cycles(module_graph())
    assert not cycles, "import cycles (imports inside functions count):\n" + "\n".join(" -> ".join(c) for c in cycles)


def test_no_package_import_cycle() -> None:
    packages: dict[str, set[str]] = {}
    for m, targets in module_graph().items():
        packages.setdefault(_top(m), set()).update(_top(t) for t in targets if _top(t) != _top(m))
    assert not _cycles(packages)


def test_the_checks_can_fail(tmp_path: Path) -> None:
    """Re-introduce the old dodges into a probe module of lifecycle/: the scan reports both, and a cycle."""
    probe = ROOT / "lifecycle" / "_layering_probe.py"
    source = (
        "import importlib\n"
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n"
        "    import trainer.group  # typing only: never runs, not counted\n"
        "def run() -> None:\n"
        "    import trainer.app.loop  # an import inside a function\n"
        "    importlib.import_module('rollout.replay')  # an importlib string\n"
    )
    fake = tmp_path / "_layering_probe.py"
    fake.write_text(source)
    MODULES["lifecycle._layering_probe"] = fake
    try:
        wrong = [w.rsplit(" imports ", 1)[1] for w in upward_imports("lifecycle") if "_layering_probe" in w]
    finally:
        del MODULES["lifecycle._layering_probe"]
    assert not probe.exists()
    assert wrong == ["trainer.app.loop", "rollout.replay"]
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []
