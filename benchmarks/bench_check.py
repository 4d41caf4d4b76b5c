"""Benchmark: exhaustive `lifecycle check` over the config lattice (issues: Verification, Performance).

For 2 engines (2 worker processes, as `lifecycle check` runs on this 2-core machine) and 3 engines: configs,
distinct explorations, states, transitions, seconds and states/s -- of the compiled checker (``make compiled``:
the core and the explorer compiled with mypyc) and, in the same run, of the pure-Python one (``LIFECYCLE_PURE=1``),
each lattice explored in its own child process (a process imports one or the other), compiled first, then pure.
Also the pure checker with ``remember=False`` (the core asked anew at every node and every invariant judged at every
node: what the checker did before issue 32), and the symmetry reduction: states of one representative config with
engines sorted (ours) vs unsorted. Goals (issue 45): the 2-engine lattice in <= 12 s at >= 45,000 states/s, the
3-engine lattice in <= 30 s (judged on the compiled checker where it is built, else on the pure one). The machine's
load (1-minute average) is printed before and after: others' work on a 2-core machine moves every number.

Run: python benchmarks/bench_check.py [--faults 2] [--jobs 2] [--skip-3] [--skip-baseline] [--skip-pure]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
GOAL_SECONDS, GOAL_RATE, GOAL_SECONDS_3 = 12.0, 45_000, 30.0


def full(engines: int, jobs: int, faults: int, remember: bool = True) -> dict[str, Any]:
    """(child) The whole lattice, largest group first as `lifecycle check` runs it, and which checker ran it."""
    from lifecycle.check.explore import lattice, run_check
    from lifecycle.compiled import in_use

    lat = lattice()
    groups = lat.largest_first()
    t0 = time.perf_counter()
    states = transitions = 0
    for r in run_check(groups, engines=engines, jobs=jobs, max_faults=faults, remember=remember):
        assert r.ok, r.violations[0].render()
        states += r.states
        transitions += r.transitions
    seconds = time.perf_counter() - t0
    return {
        "configs": len(lat.valid),
        "groups": len(groups),
        "states": states,
        "transitions": transitions,
        "seconds": seconds,
        "compiled": in_use(),
    }


def symmetry(faults: int) -> dict[str, Any]:
    """(child, pure: it swaps the checker's key) One preset's states with engines sorted and unsorted."""
    from lifecycle.check import world as world_module
    from lifecycle.check.explore import explore
    from lifecycle.decide.presets import preset

    config = preset("ft-rollout")
    reduced = explore(config, engines=2, max_faults=faults).states
    original = world_module.Checker.key
    world_module.Checker.key = lambda self, n: world_module.Node(*world_module._normal(n.job, n.world))  # type: ignore[method-assign]
    try:
        unreduced = explore(config, engines=2, max_faults=faults).states
    finally:
        world_module.Checker.key = original  # type: ignore[method-assign]
    return {"reduced": reduced, "unreduced": unreduced}


def child(pure: bool, *args: str) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    env["LIFECYCLE_PURE"] = "1" if pure else "0"
    done = subprocess.run(
        [sys.executable, __file__, "--child", *args], env=env, capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise SystemExit(done.stderr[-3000:])
    result: dict[str, Any] = json.loads(done.stdout.splitlines()[-1])
    return result


def load() -> str:
    return f"{os.getloadavg()[0]:.2f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--faults", type=int, default=2)
    parser.add_argument("--jobs", type=int, default=2, help="worker processes (default 2: this machine's cores)")
    parser.add_argument("--skip-3", action="store_true", help="skip the 3-engine lattice")
    parser.add_argument("--skip-baseline", action="store_true", help="skip the remember=False baseline")
    parser.add_argument("--skip-pure", action="store_true", help="skip the pure checker (no compiled vs pure ratio)")
    parser.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        if args.child[0] == "symmetry":
            print(json.dumps(symmetry(args.faults)))
        else:
            engines, remember = int(args.child[1]), args.child[2] == "1"
            print(json.dumps(full(engines, args.jobs, args.faults, remember)))
        return
    from lifecycle.compiled import built

    missing = built()
    print(f"load (1 min) before: {load()}; compiled checker: {missing or 'built'}")
    print(
        f"{'engines':>7} {'checker':>18} {'configs':>7} {'explored':>8} {'states':>9} {'transitions':>11} "
        f"{'seconds':>8} {'states/s':>9}"
    )
    checkers = ([] if missing else [("compiled", False)]) + ([] if args.skip_pure and not missing else [("pure", True)])
    for engines in (2,) if args.skip_3 else (2, 3):
        runs = [(label, pure, True) for label, pure in checkers]
        if engines == 2 and not args.skip_baseline:
            runs.append(("pure, asking anew", True, False))
        seconds: dict[str, float] = {}
        for label, pure, remember in runs:
            r = child(pure, "lattice", str(engines), "1" if remember else "0")
            assert r["compiled"] == (not pure), f"{label}: the child ran the {'compiled' if r['compiled'] else 'pure'}"
            seconds[label] = r["seconds"]
            print(
                f"{engines:>7} {label:>18} {r['configs']:>7} {r['groups']:>8} {r['states']:>9} {r['transitions']:>11} "
                f"{r['seconds']:>8.1f} {r['states'] / r['seconds']:>9,.0f}   (load {load()})",
                flush=True,
            )
            if label == checkers[0][0] and remember:
                rate, s = r["states"] / r["seconds"], r["seconds"]
                goal = GOAL_SECONDS if engines == 2 else GOAL_SECONDS_3
                line = f"        goal ({label}): <= {goal:.0f} s ({'met' if s <= goal else 'MISSED'})"
                if engines == 2:
                    line += f", >= {GOAL_RATE:,} states/s ({'met' if rate >= GOAL_RATE else 'MISSED'})"
                print(line, flush=True)
        if "compiled" in seconds and "pure" in seconds:
            print(f"        compiled vs pure (same run): {seconds['pure'] / seconds['compiled']:.2f}x faster")
        if "pure, asking anew" in seconds:
            print(
                "        pure: remembering vs asking anew (same run): "
                f"{seconds['pure, asking anew'] / seconds['pure']:.2f}x faster"
            )
    sym = child(True, "symmetry")
    print(
        f"symmetry (ft-rollout preset, 2 engines): {sym['reduced']} states sorted vs {sym['unreduced']} unsorted "
        f"= {sym['unreduced'] / sym['reduced']:.2f}x fewer"
    )
    print(f"load (1 min) after: {load()}")


if __name__ == "__main__":
    main()
