"""The checker explores the stream (--fully-async): the real specs hold every invariant, and the two streaming bugs
of the field -- a staleness filter that is gone, a failed refit that resumes -- are caught with short
counterexamples. (The large streaming explorations -- the preset, the lattice groups -- are pinned in the slow run.)"""

from __future__ import annotations

import pytest

from lifecycle.check.explore import explore, lattice
from lifecycle.check.mutants import MUTANTS
from lifecycle.decide.config import LifecycleConfig
from lifecycle.decide.predicates import evaluate

STREAM = LifecycleConfig.from_mapping(
    {"rollout_num_gpus": 2, "engine_max_restarts": 1, "fully_async": True}, check_paths=False
)


def test_the_stream_holds_every_invariant() -> None:
    r = explore(STREAM, engines=2)
    assert r.ok, r.violations[0].render()
    assert r.states > 1000  # the stream's states are explored, not refused


@pytest.mark.parametrize("k", [0, 2])
def test_other_bounds_hold_too(k: int) -> None:
    c = LifecycleConfig.from_mapping({**STREAM.to_dict(), "max_weight_staleness": k}, check_paths=False)
    r = explore(c, engines=1)
    assert r.ok, r.violations[0].render()


@pytest.mark.parametrize(
    ("mutant", "invariant", "most"),
    [
        ("staleness_guard_dropped", "no_trained_group_beyond_staleness", 8),
        ("failed_refit_resumes", "no_generation_after_failed_update", 9),
    ],
)
def test_each_streaming_bug_is_caught_with_a_short_counterexample(mutant: str, invariant: str, most: int) -> None:
    r = explore(STREAM, engines=2, machines=MUTANTS[mutant].machines())
    assert [v.invariant for v in r.violations] == [invariant]
    assert len(r.violations[0].path) <= most, r.violations[0].render()


def test_a_version_reset_on_resume_is_caught() -> None:
    """miles #2244 planted: the resumed stream's version starts from 0 again; the groups its checkpoint buffered are
    newer than it (negative staleness, which no filter rejects)."""
    c = LifecycleConfig.from_mapping(
        {**STREAM.to_dict(), "save": "ck", "save_interval": 1, "load": "ck"}, check_paths=False
    )
    r = explore(c, engines=1, machines=MUTANTS["version_reset_on_resume"].machines())
    assert [v.invariant for v in r.violations] == ["no_group_newer_than_the_version"]
    assert len(r.violations[0].path) <= 13, r.violations[0].render()
    assert "driver_death" in " ".join(t.action.name for t in r.violations[0].path)
    assert explore(c, engines=1).ok


def test_the_lattice_grows_by_the_streaming_configurations() -> None:
    groups = [g for g in lattice().groups.values() if evaluate(g[0])["streaming"] and not evaluate(g[0])["elastic"]]
    assert len(groups) == 12  # every FT configuration x (disk, broadcast, a resumed job); and 2 elastic fleets
    assert all(evaluate(c)["streaming"] == c.fully_async for g in lattice().groups.values() for c in g)
