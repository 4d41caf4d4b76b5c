"""The compiled checker (``make compiled``: mypyc) finds exactly what the pure one finds.

Two child processes explore the same groups -- a plain lattice group with the eval fleet and CI's injection, a
streaming one, an elastic one -- and the same spec mutants' groups (a streaming, an elastic and a broadcast bug:
each a counterexample), one with the compiled modules and one with ``LIFECYCLE_PURE=1``; every state count,
transition count and counterexample (each step, each move) must be identical. Skips only where no compiled build
exists and ``LIFECYCLE_REQUIRE_ALL`` is unset (CI sets it, and ``make test`` builds it).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[3]
GROUPS = (
    "--ci-test --rollout-num-gpus 2 --eval-num-gpus 2 --engine-max-restarts 1",
    "--rollout-num-gpus 2 --engine-max-restarts 1 --fully-async",
    "--rollout-num-gpus 2 --rollout-min-num-gpus 1 --rollout-max-num-gpus 3 --engine-max-restarts 1",
    "--use-fault-tolerance --rollout-num-gpus 2 --rollout-min-num-gpus 1 --rollout-max-num-gpus 3 "
    "--engine-max-restarts 1 --update-weight-transfer-mode broadcast",
)
MUTANTS = {  # a mutant and a group where the checker finds its bug
    "staleness_guard_dropped": "--rollout-num-gpus 2 --engine-max-restarts 1 --fully-async",
    "preempted_engine_failed": GROUPS[2],
    "stale_group_broadcast": "--use-fault-tolerance --rollout-num-gpus 2 --engine-max-restarts 1 "
    "--update-weight-transfer-mode broadcast",
}


def explore_all() -> dict[str, Any]:
    """(child) Every group's and mutant's results, and which checker found them."""
    from lifecycle.check.explore import lattice, run_check
    from lifecycle.compiled import in_use

    by_flags = {" ".join(g[0].to_flags()): g for g in lattice().groups.values()}
    runs = [(flags, None) for flags in GROUPS] + [(flags, name) for name, flags in MUTANTS.items()]
    out: dict[str, Any] = {"compiled": in_use(), "runs": []}
    for flags, mutant in runs:
        (r,) = run_check([by_flags[flags]], mutant=mutant)
        out["runs"].append(
            {
                "flags": flags,
                "mutant": mutant,
                "states": r.states,
                "transitions": r.transitions,
                "violations": [v.to_json() | {"rendered": v.render()} for v in r.violations],
            }
        )
    return out


def child(pure: bool) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "LIFECYCLE_PURE": "1" if pure else "0"}
    done = subprocess.run(
        [sys.executable, __file__], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def test_the_compiled_checker_finds_what_the_pure_one_finds() -> None:
    from lifecycle.compiled import built

    missing = built()
    if missing is not None:
        if os.environ.get("LIFECYCLE_REQUIRE_ALL") == "1":
            pytest.fail(f"no compiled checker to compare ({missing}); make test builds it (make compiled)")
        pytest.skip(f"no compiled checker to compare: {missing}")
    compiled, pure = child(pure=False), child(pure=True)
    assert compiled["compiled"] and not pure["compiled"]
    for c, p in zip(compiled["runs"], pure["runs"], strict=True):
        assert c == p, f"{p['mutant'] or 'no mutant'} on {p['flags']}: the compiled checker differs"
    found = [r for r in pure["runs"] if r["mutant"]]
    assert found and all(r["violations"] and r["violations"][0]["steps"] for r in found)  # real counterexamples
    assert all(r["states"] > 1000 for r in pure["runs"] if not r["mutant"])


def test_the_compiled_checker_loads_where_only_the_package_is_on_the_path(tmp_path: Path) -> None:
    """As an installed package (an editable install maps the packages, not the repository root): the compiled
    modules' shared library lives inside ``lifecycle/``, so the ``lifecycle`` command imports it from anywhere
    (a library at the root, ``lifecycle_compiled__mypyc``, broke the installed command in CI)."""
    from lifecycle.compiled import built

    if built() is not None:
        pytest.skip(f"no compiled checker: {built()}")
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "lifecycle").symlink_to(ROOT / "lifecycle")
    code = "from lifecycle import compiled; import lifecycle.check.explore, lifecycle.cli; print(compiled.in_use())"
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "site"), "LIFECYCLE_PURE": "0"}
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "True"


if __name__ == "__main__":
    print(json.dumps(explore_all()))
