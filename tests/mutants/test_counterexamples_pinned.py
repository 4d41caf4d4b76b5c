"""Every checker mutant's shortest counterexample is pinned: the invariant, its length and every step.

A refactoring of the core or of the checker must find each mutant's bug through the very same events. A change
that is meant regenerates the file (``REGENERATE_PINS=1 pytest tests/mutants/test_counterexamples_pinned.py``)
and says why.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from lifecycle.check.mutants import MUTANTS

from .harness import explorer_kill

PINNED = Path(__file__).resolve().parent / "data" / "counterexamples.json"


def kill_of(name: str) -> dict[str, object] | None:
    k = explorer_kill(name)
    if k is None:
        return None
    return {"invariant": k.invariant, "steps": k.steps, "groups_tried": k.groups_tried, "rendered": k.rendered}


@pytest.mark.parametrize("name", list(MUTANTS))
def test_each_mutants_counterexample_is_the_pinned_one(name: str) -> None:
    assert kill_of(name) == json.loads(PINNED.read_text())[name]


def test_every_mutant_is_pinned() -> None:
    if os.environ.get("REGENERATE_PINS"):
        PINNED.write_text(json.dumps({n: kill_of(n) for n in MUTANTS}, indent=1, sort_keys=True) + "\n")
    assert set(json.loads(PINNED.read_text())) == set(MUTANTS)
