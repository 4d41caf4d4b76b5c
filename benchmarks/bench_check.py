"""Benchmark: exhaustive `lifecycle check` over the config lattice (Verification issue).

Prints, for 2 engines (1 and 2 worker processes) and 3 engines (2 processes): configs, distinct
explorations, states, transitions, seconds and states/s; plus the symmetry reduction measured in
the same run: states of one representative config with engines sorted (ours) vs unsorted.

Run: python benchmarks/bench_check.py [--faults 2] [--skip-3]
"""

from __future__ import annotations

import argparse
import time

from lifecycle.check import world as world_module
from lifecycle.check.explore import explore, lattice, run_check
from lifecycle.decide.presets import preset


def full(engines: int, jobs: int, faults: int) -> tuple[int, int, int, int, float]:
    lat = lattice()
    groups = lat.largest_first()  # as `lifecycle check` does
    t0 = time.perf_counter()
    states = transitions = 0
    for r in run_check(groups, engines=engines, jobs=jobs, max_faults=faults):
        assert r.ok, r.violations[0].render()
        states += r.states
        transitions += r.transitions
    return len(lat.valid), len(groups), states, transitions, time.perf_counter() - t0


def symmetry(engines: int, faults: int) -> tuple[int, int]:
    config = preset("ft-rollout")
    reduced = explore(config, engines=engines, max_faults=faults).states
    original = world_module.Checker.key
    world_module.Checker.key = lambda self, n: world_module.Node(*world_module._normal(n.job, n.world))  # type: ignore[method-assign]
    try:
        unreduced = explore(config, engines=engines, max_faults=faults).states
    finally:
        world_module.Checker.key = original  # type: ignore[method-assign]
    return reduced, unreduced


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--faults", type=int, default=2)
    parser.add_argument("--skip-3", action="store_true", help="skip the 3-engine lattice")
    args = parser.parse_args()
    print(
        f"{'engines':>7} {'jobs':>4} {'configs':>7} {'explored':>8} {'states':>9} {'transitions':>11} "
        f"{'seconds':>8} {'states/s':>9}"
    )
    runs = [(2, 1), (2, 2)] + ([] if args.skip_3 else [(3, 2)])
    base = None
    for engines, jobs in runs:
        configs, groups, states, transitions, seconds = full(engines, jobs, args.faults)
        print(
            f"{engines:>7} {jobs:>4} {configs:>7} {groups:>8} {states:>9} {transitions:>11} {seconds:>8.1f} "
            f"{states / seconds:>9,.0f}",
            flush=True,
        )
        if engines == 2 and jobs == 1:
            base = seconds
        elif engines == 2 and base:
            print(f"        2 processes vs 1: {base / seconds:.2f}x faster (goal: 2 engines <= 30 s)")
    reduced, unreduced = symmetry(2, args.faults)
    print(
        f"symmetry (ft-rollout preset, 2 engines): {reduced} states sorted vs {unreduced} unsorted "
        f"= {unreduced / reduced:.2f}x fewer"
    )


if __name__ == "__main__":
    main()
