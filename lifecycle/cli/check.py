"""``lifecycle check``: prove the invariants over every reachable state of every config."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Iterator
from typing import Any

from lifecycle.check.explore import Result, StateLimitError, check_train_only_ft_equals_no_ft, lattice, run_check
from lifecycle.check.invariants import INVARIANTS
from lifecycle.check.mutants import MUTANTS
from lifecycle.cli.args import add_config_arguments, add_debug_argument, config_from_args, explicit_flags
from lifecycle.decide.config import Bounded, LifecycleConfig
from lifecycle.decide.errors import ConfigError
from lifecycle.decide.machines import MACHINES
from lifecycle.decide.presets import PRESETS, preset

MAX_JOBS = 256  # worker processes; more only queue (and past a C int, multiprocessing overflows)
# the job states grow about 2.5x with each fault allowed (2 engines, rollout FT: 2 faults 2.2k states, 4 faults 20k,
# 8 faults 149k in 7.5 s); past 8 the larger configs run into the checker's state limit after minutes and a GB
MAX_FAULTS = 8
FAULTS_WHY = "each fault allowed multiplies the job states to explore; past 8 they outgrow the checker's memory"


def register(sub: Any) -> None:
    p = sub.add_parser(
        "check",
        help="explore every reachable job state and check the lifecycle invariants",
        description=(
            "Breadth-first exploration of the lifecycle core -- Core.step, the function the runtime executes "
            "-- driven by every operation a loop may call in any order, every answer the shells may give and "
            "the world's faults (kill, hang, HTTP death, refused loads, worker crashes), over every machine of "
            "one job (rollout manager, monitor, N engines, eval fleet, trainer, weight-update group), for every "
            "valid config of the lattice (FT x components x mode x ci-test x eval fleet x offload; external "
            "engines; broadcast weight updates; an elastic fleet whose engines join and leave, up to N), or for "
            "one config when --preset, --config or any lifecycle flag is given. Prints states/s. Exits 1 with the "
            "shortest counterexample on a violation."
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="invariants:\n"
        + "\n".join(f"  {i.name:<42} {i.doc}" for i in INVARIANTS.values())
        + "\n\nmutants (--mutant):\n"
        + "\n".join(f"  {m.name:<42} {m.bug}" for m in MUTANTS.values()),
    )
    p.add_argument("--engines", type=Bounded(1, 4), default=2, metavar="N", help="engines per job, 1..4 (default 2)")
    p.add_argument(
        "--faults",
        type=Bounded(0, MAX_FAULTS, why=FAULTS_WHY),
        default=2,
        metavar="N",
        help="faults injected per run at most (default 2)",
    )
    p.add_argument("--invariant", action="append", metavar="NAME", help="check only this invariant (repeatable)")
    p.add_argument("--mutant", metavar="NAME", help="check a deliberately broken copy of the specs")
    p.add_argument(
        "--jobs",
        type=Bounded(1, MAX_JOBS, why="each is a worker process"),
        default=os.cpu_count() or 1,
        metavar="N",
        help="worker processes",
    )
    p.add_argument(
        "--preset", choices=PRESETS, help="check one named config (lifecycle graph's presets) instead of the lattice"
    )
    p.add_argument("--json", action="store_true", help="machine-readable results")
    add_debug_argument(p)
    add_config_arguments(p)
    p.set_defaults(func=cmd_check, config=None)


def _single_config(ns: argparse.Namespace) -> LifecycleConfig | None:
    if ns.preset is not None:
        explicit = sorted(explicit_flags(ns))
        if explicit or ns.config is not None:
            given = ", ".join("--" + k.replace("_", "-") for k in explicit) or f"--config {ns.config}"
            problem = f"a preset is a whole config, but {given} was given too"
            raise ConfigError("--preset", ns.preset, problem, "use either --preset or config flags")
        return preset(ns.preset)
    if ns.config is None and not explicit_flags(ns):
        return None
    return config_from_args(ns, check_paths=False)


def _within_limit(results: Iterator[Result], ns: argparse.Namespace) -> Iterator[Result]:
    """The explorations' results; one that outgrows the checker's state limit is an error naming the flags that
    size the exploration."""
    try:
        yield from results
    except StateLimitError as exc:
        raise ConfigError(
            "--faults",
            ns.faults,
            f"with --engines {ns.engines} the job states outgrow what the checker holds ({exc})",
            "lower --faults (default 2) or --engines (default 2), or check one config (--config FILE or its flags)",
        ) from None


def cmd_check(ns: argparse.Namespace) -> int:
    only = frozenset(ns.invariant) if ns.invariant else None
    for name in only or ():
        if name not in INVARIANTS:
            raise ConfigError("--invariant", name, "unknown invariant", f"choose from: {', '.join(INVARIANTS)}")
    if ns.mutant is not None and ns.mutant not in MUTANTS:
        raise ConfigError("--mutant", ns.mutant, "unknown mutant", f"choose from: {', '.join(MUTANTS)}")
    if ns.engines < 1 or ns.engines > 4:
        raise ConfigError("--engines", ns.engines, "explore 1 to 4 engines", "use --engines 2 (default) or 3")
    if ns.faults < 0:
        raise ConfigError("--faults", ns.faults, "must not be negative", "use --faults 0 (no faults) or more")
    if ns.jobs < 1:
        raise ConfigError("--jobs", ns.jobs, "must be at least 1", "use --jobs 1 to explore in this process")
    single = _single_config(ns)
    if single is not None:
        groups = [[single]]
        skipped = 0
    else:
        lat = lattice()
        groups = lat.largest_first()
        skipped = len(lat.invalid)
    t0 = time.perf_counter()
    rows: list[dict[str, Any]] = []
    violations = []
    if not ns.json:
        print(f"{'states':>8} {'transitions':>11} {'inv':>4} {'time':>7} {'covers':>6}  config")
    results = run_check(
        groups, engines=ns.engines, mutant=ns.mutant, only=only, max_faults=ns.faults, jobs=ns.jobs, stop_at_first=False
    )
    for result in _within_limit(results, ns):
        flags = " ".join(result.config.to_flags()) or "(defaults)"
        row = {
            "config": result.config.to_flags(),
            "covers": len(result.covers),
            "states": result.states,
            "transitions": result.transitions,
            "invariants": result.invariants,
            "seconds": round(result.seconds, 3),
            "ok": result.ok,
        }
        rows.append(row)
        violations.extend(result.violations)
        if not ns.json:
            mark = "" if result.ok else "  ✗ " + result.violations[0].invariant
            print(
                f"{result.states:>8} {result.transitions:>11} {result.invariants:>4} {result.seconds:>6.2f}s "
                f"{len(result.covers):>6}  {flags}{mark}",
                flush=True,
            )
    if only is None or "train_only_ft_rollout_side_equals_no_ft" in only:
        machines = MUTANTS[ns.mutant].machines() if ns.mutant else MACHINES
        violations.extend(check_train_only_ft_equals_no_ft(machines))
    elapsed = time.perf_counter() - t0
    states = sum(r["states"] for r in rows)
    transitions = sum(r["transitions"] for r in rows)
    configs = sum(r["covers"] for r in rows)
    rate = states / max(elapsed, 1e-9)
    if ns.json:
        print(
            json.dumps(
                {
                    "ok": not violations,
                    "configs": configs,
                    "explorations": len(rows),
                    "invalid_configs_skipped": skipped,
                    "engines": ns.engines,
                    "max_faults": ns.faults,
                    "jobs": ns.jobs,
                    "states": states,
                    "transitions": transitions,
                    "seconds": round(elapsed, 3),
                    "states_per_second": round(rate),
                    "results": rows,
                    "violations": [v.to_json() for v in violations],
                },
                indent=2,
            )
        )
    else:
        print(
            f"\n{configs} configs ({len(rows)} distinct predicate vectors, {skipped} invalid combinations "
            f"skipped), {ns.engines} engines, <= {ns.faults} faults: {states:,} states, {transitions:,} transitions "
            f"in {elapsed:.1f}s ({rate:,.0f} states/s, {ns.jobs} worker processes)"
        )
        for v in violations:
            print()
            print(v.render())
        print("\nOK: every invariant holds" if not violations else f"\nFAILED: {len(violations)} violation(s)")
    sys.stdout.flush()
    return 1 if violations else 0
