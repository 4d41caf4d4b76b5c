"""Reliability tests: the fault matrix collector.

Every matrix cell records its result in the session-scoped :func:`matrix_results`; when all its
cells ran and passed, the session writes ``docs/reliability.md`` (``reliability_report.render``). A partial
run (``-k``, ``-x``, a failure) leaves the committed file alone.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:  # matrix_audit and report are imported by name (also by `lifecycle run`)
    sys.path.insert(0, str(HERE))

from reliability_report import DOC, CellResult, contract_rows, render  # noqa: E402


@pytest.fixture(scope="session")
def matrix_results() -> Iterator[dict[tuple[str, str], CellResult]]:
    """A cell records itself only once all its assertions passed."""
    results: dict[tuple[str, str, str], CellResult] = {}
    t0 = time.monotonic()
    yield results
    want = {(f, mode, ft) for f, mode, ft, _ in contract_rows()}
    if want <= set(results):
        DOC.write_text(render(results, time.monotonic() - t0))
