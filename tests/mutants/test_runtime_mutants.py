"""Mutation proof reaches the runtime: every runtime mutant fails the fast suite (its killing tests).

Each case copies the tree, applies one mutant to one runtime module (:mod:`runtime_mutants`) and runs
the fast tests named as its killers there; they must fail -- with the real tree they pass (they are
part of the fast suite this run also runs).
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor

import pytest

from .runtime_mutants import MUTANTS, ROOT, RuntimeMutant, child_environ, kill, markdown_table


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


KILL_TEST = "test_the_fast_suite_kills_the_runtime_mutant"


@pytest.fixture(scope="module")
def kills(request: pytest.FixtureRequest) -> Iterator[dict[str, Future[subprocess.CompletedProcess[str]]]]:
    """Every selected mutant's kill, two at a time: each is a pytest of its own in a copy of the tree, mostly
    waiting on its engines and its imports, so two share the 2 cores well (a kill is a failing test: load can
    slow it, not save the mutant)."""
    chosen = [
        item.callspec.params["mutant"]
        for item in request.session.items
        if getattr(item, "originalname", "") == KILL_TEST and hasattr(item, "callspec")
    ]
    environ = child_environ()  # read here: see child_environ
    with ThreadPoolExecutor(max_workers=2, thread_name_prefix="mutant") as pool:
        yield {m.name: pool.submit(kill, m, None, environ) for m in chosen}


@pytest.mark.slow  # each mutant copies the tree and starts a pytest of its own
@pytest.mark.parametrize("mutant", MUTANTS, ids=[m.name for m in MUTANTS])
def test_the_fast_suite_kills_the_runtime_mutant(
    mutant: RuntimeMutant, kills: dict[str, Future[subprocess.CompletedProcess[str]]]
) -> None:
    run = kills[mutant.name].result()
    tail = (run.stdout + run.stderr)[-2500:]
    assert run.returncode == 1, f"{mutant.name} survived its killers (exit {run.returncode}):\n{tail}"
    assert "FAILED tests/" in run.stdout, tail  # a test failed (not a collection error or an empty run)


def test_the_docs_list_every_runtime_mutant() -> None:
    from pathlib import Path

    page = (Path(__file__).resolve().parents[2] / "docs" / "checking.md").read_text()
    assert markdown_table() in page, (
        "docs/checking.md's runtime mutant table is stale: python tests/mutants/runtime_mutants.py --table"
    )
