"""Benchmark: exhaustive `lifecycle check` over the config lattice (issues: Verification, Performance).

For 2 engines (2 worker processes, as `lifecycle check` runs on this 2-core machine) and 3 engines: configs,
distinct explorations, states, transitions, seconds and states/s -- and, in the same run, the same lattice
explored with ``remember=False`` (the core asked anew at every node and every invariant judged at every node:
what the checker did before issue 32), the baseline the speed-up is printed against. Goals (issue 32): the 2-engine
lattice in <= 12 s, >= 40,000 states/s. Also the symmetry reduction: states of one representative config with
engines sorted (ours) vs unsorted.

Run: python benchmarks/bench_check.py [--faults 2] [--jobs 2] [--skip-3] [--skip-baseline]
"""

from __future__ import annotations

import argparse
import time

from lifecycle.check import world as world_module
from lifecycle.check.explore import explore, lattice, run_check
from lifecycle.decide.presets import preset

GOAL_SECONDS, GOAL_RATE = 12.0, 40_000


def full(engines: int, jobs: int, faults: int, remember: bool = True) -> tuple[int, int, int, int, float]:
    lat = lattice()
    groups = lat.largest_first()  # as `lifecycle check` does
    t0 = time.perf_counter()
    states = transitions = 0
    for r in run_check(groups, engines=engines, jobs=jobs, max_faults=faults, remember=remember):
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
    parser.add_argument("--jobs", type=int, default=2, help="worker processes (default 2: this machine's cores)")
    parser.add_argument("--skip-3", action="store_true", help="skip the 3-engine lattice")
    parser.add_argument("--skip-baseline", action="store_true", help="skip the remember=False baseline")
    args = parser.parse_args()
    print(
        f"{'engines':>7} {'checker':>13} {'configs':>7} {'explored':>8} {'states':>9} {'transitions':>11} "
        f"{'seconds':>8} {'states/s':>9}"
    )
    runs = [(2, True)] + ([] if args.skip_baseline else [(2, False)]) + ([] if args.skip_3 else [(3, True)])
    seconds_of: dict[tuple[int, bool], float] = {}
    for engines, remember in runs:
        configs, groups, states, transitions, seconds = full(engines, args.jobs, args.faults, remember)
        seconds_of[(engines, remember)] = seconds
        label = "remembering" if remember else "asking anew"
        print(
            f"{engines:>7} {label:>13} {configs:>7} {groups:>8} {states:>9} {transitions:>11} {seconds:>8.1f} "
            f"{states / seconds:>9,.0f}",
            flush=True,
        )
        if engines == 2 and remember:
            rate = states / seconds
            print(
                f"        goal: <= {GOAL_SECONDS:.0f} s ({'met' if seconds <= GOAL_SECONDS else 'MISSED'}), "
                f">= {GOAL_RATE:,} states/s ({'met' if rate >= GOAL_RATE else 'MISSED'})",
                flush=True,
            )
    if (2, False) in seconds_of:
        ratio = seconds_of[(2, False)] / seconds_of[(2, True)]
        print(f"        remembering vs asking anew (same run): {ratio:.2f}x faster")
    reduced, unreduced = symmetry(2, args.faults)
    print(
        f"symmetry (ft-rollout preset, 2 engines): {reduced} states sorted vs {unreduced} unsorted "
        f"= {unreduced / reduced:.2f}x fewer"
    )


if __name__ == "__main__":
    main()
