"""Mutation proof reaches the runtime: every runtime mutant fails the fast suite (its killing tests).

Each case copies the tree, applies one mutant to one runtime module (:mod:`runtime_mutants`) and runs
the fast tests named as its killers there; they must fail -- with the real tree they pass (they are
part of the fast suite this run also runs).
"""

from __future__ import annotations

import pytest

from .runtime_mutants import MUTANTS, ROOT, RuntimeMutant, kill, markdown_table


def test_there_are_at_least_twelve_runtime_mutants_in_runtime_modules() -> None:
    assert len(MUTANTS) >= 12 and len({m.name for m in MUTANTS}) == len(MUTANTS)
    assert all(not m.path.startswith(("lifecycle/machines", "lifecycle/mutants")) for m in MUTANTS)  # not the specs
    assert all(k.startswith("tests/") and "::" in k for m in MUTANTS for k in m.killers)


@pytest.mark.parametrize("mutant", MUTANTS, ids=[m.name for m in MUTANTS])
def test_every_mutant_still_applies_and_names_real_killers(mutant: RuntimeMutant) -> None:
    """Fast: a mutant whose text has drifted out of its module would only fail the slow run below."""
    text = (ROOT / mutant.path).read_text()
    assert text.count(mutant.old) == 1, f"{mutant.name}: its text occurs {text.count(mutant.old)}x in {mutant.path}"
    for killer in mutant.killers:
        path, _, name = killer.partition("::")
        assert f"def {name.split('[')[0]}(" in (ROOT / path).read_text(), f"{mutant.name}: no test {killer}"


@pytest.mark.slow  # each mutant copies the tree and starts a pytest of its own
@pytest.mark.parametrize("mutant", MUTANTS, ids=[m.name for m in MUTANTS])
def test_the_fast_suite_kills_the_runtime_mutant(mutant: RuntimeMutant) -> None:
    run = kill(mutant)
    tail = (run.stdout + run.stderr)[-2500:]
    assert run.returncode == 1, f"{mutant.name} survived its killers (exit {run.returncode}):\n{tail}"
    assert "FAILED tests/" in run.stdout, tail  # a test failed (not a collection error or an empty run)


def test_the_readme_lists_every_runtime_mutant() -> None:
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    assert markdown_table() in readme, (
        "README's runtime mutant table is stale: python tests/mutants/runtime_mutants.py --table"
    )
