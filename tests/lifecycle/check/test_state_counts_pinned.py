"""``lifecycle check`` finds exactly the states it found before: the counts per config are pinned.

A refactoring of the core or of the checker must leave the explored space as it is -- the same states, the same
transitions, for every preset and (in the slow suite) every group of the 2- and 3-engine lattices. A change that
is meant regenerates the file (``REGENERATE_PINS=1 pytest -m slow tests/lifecycle/check/test_state_counts_pinned.py
-k regenerate``) and says why.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from lifecycle.check.explore import explore, lattice, run_check
from lifecycle.decide.presets import PRESETS, preset

PINNED = Path(__file__).resolve().parent / "data" / "state_counts.json"
SLOW_PRESETS = ("resume", "streaming")  # 44,000 and 300,000 states: in the slow run
FAST_PRESETS = [name for name in PRESETS if name not in SLOW_PRESETS]


def pinned() -> dict[str, dict[str, object]]:
    doc: dict[str, dict[str, object]] = json.loads(PINNED.read_text())
    return doc


def counts(engines: int) -> dict[str, list[int]]:
    """Per lattice group (its first config's flags): states and transitions, 2 faults."""
    out: dict[str, list[int]] = {}
    for r in run_check(lattice().largest_first(), engines=engines, jobs=2):
        assert r.ok, r.violations[0].render()
        out[" ".join(r.config.to_flags()) or "(defaults)"] = [r.states, r.transitions]
    return out


@pytest.mark.parametrize("name", FAST_PRESETS)
def test_each_preset_explores_the_pinned_states(name: str) -> None:
    r = explore(preset(name), engines=2)
    assert [r.states, r.transitions] == pinned()["presets"][name]


@pytest.mark.slow
@pytest.mark.parametrize("name", SLOW_PRESETS)
def test_the_large_presets_explore_the_pinned_states(name: str) -> None:
    r = explore(preset(name), engines=2)
    assert [r.states, r.transitions] == pinned()["presets"][name]


@pytest.mark.slow
@pytest.mark.parametrize("engines", [2, 3])
def test_every_lattice_group_explores_the_pinned_states(engines: int) -> None:
    assert counts(engines) == pinned()["lattice"][str(engines)]


@pytest.mark.slow
@pytest.mark.skipif(not os.environ.get("REGENERATE_PINS"), reason="REGENERATE_PINS=1 writes the pinned counts")
def test_regenerate() -> None:
    presets = {}
    for name in PRESETS:
        r = explore(preset(name), engines=2)
        presets[name] = [r.states, r.transitions]
    doc = json.loads(PINNED.read_text())
    doc.update(presets=presets, lattice={str(n): counts(n) for n in (2, 3)})
    PINNED.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
