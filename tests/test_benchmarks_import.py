"""Every benchmark still imports: they run by hand (``make bench``), so a renamed module must fail here."""

from __future__ import annotations

import ast
import importlib.util
import sys
from pathlib import Path

import pytest

BENCHMARKS = sorted((Path(__file__).resolve().parents[1] / "benchmarks").glob("bench_*.py"))


def test_there_are_benchmarks() -> None:
    assert len(BENCHMARKS) >= 4, BENCHMARKS


@pytest.mark.parametrize("path", BENCHMARKS, ids=[p.stem for p in BENCHMARKS])
def test_benchmark_imports(path: Path) -> None:
    spec = importlib.util.spec_from_file_location(f"bench_import_{path.stem}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # as an import does: a dataclass finds its module's names through it
    try:
        spec.loader.exec_module(module)  # its main() runs only under __main__
    finally:
        sys.modules.pop(spec.name, None)
    assert callable(getattr(module, "main", None)), f"{path.name} has no main()"


def private_imports(source: str) -> list[str]:
    """``from M import _name`` in a benchmark: a private name it would break on when M is refactored."""
    return [
        f"{node.module}.{alias.name}"
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.ImportFrom) and node.module != "__future__"
        for alias in node.names
        if alias.name.startswith("_")
    ]


def test_benchmarks_import_no_private_name() -> None:
    found = {p.name: private_imports(p.read_text()) for p in BENCHMARKS}
    assert not any(found.values()), found
    assert private_imports("from lifecycle.cli.check import _expected_cost") == ["lifecycle.cli.check._expected_cost"]
