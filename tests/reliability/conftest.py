"""Reliability tests: the fault matrix collector.

Every matrix cell records its result in the session-scoped :func:`matrix_results` once it passed; the
session then writes ``docs/reliability.md`` (``reliability_report.render``) from those results and, for the
cells that did not run (``-k``, a failure), their committed rows -- when every cell of the contract has one.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:  # matrix_audit and report are imported by name (also by `lifecycle run`)
    sys.path.insert(0, str(HERE))

from reliability_report import DOC, CellResult, contract_rows, parse_results, render  # noqa: E402


@pytest.fixture(scope="session")
def matrix_results() -> Iterator[dict[tuple[str, str], CellResult]]:
    """A cell records itself only once all its assertions passed."""
    results: dict[tuple[str, str, str], CellResult] = {}
    yield results
    want = {(f, mode, ft) for f, mode, ft, _ in contract_rows()}
    if not results:
        return
    # cells that did not run this time keep their committed row (a run of new or changed cells updates those)
    merged = {**(parse_results(DOC.read_text()) if DOC.exists() else {}), **results}
    if want <= set(merged):
        DOC.write_text(render(merged, sum(merged[k].seconds for k in want)))
