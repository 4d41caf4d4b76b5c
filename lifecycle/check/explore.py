"""Exhaustive exploration of the lifecycle core, and the config lattice.

Breadth-first search over :class:`lifecycle.check.world.Checker` -- the core's own step function, driven
by every operation a loop may call, every result a command may have and every fault -- with
identical engines sorted (symmetry) and a parent pointer per state, so the first violation found
comes with a *shortest* counterexample. Configs only matter through their predicate vector, so the
lattice explores each distinct vector once and reports which configs it covers.
"""

from __future__ import annotations

import gc
import itertools
import time
from collections import deque
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from lifecycle.check.invariants import INVARIANTS, Verdicts, check_reach, check_state, check_step
from lifecycle.check.world import Checker, Node, Transition
from lifecycle.decide.config import LifecycleConfig
from lifecycle.decide.errors import ConfigError, LifecycleError
from lifecycle.decide.predicates import behaviour, evaluate
from lifecycle.decide.spec import MachineSpec, Step

ROLLOUT_SIDE = ("rollout", "engine", "monitor", "eval_fleet")


@dataclass
class Violation:
    invariant: str
    problem: str
    path: list[Transition]
    config: LifecycleConfig

    def render(self) -> str:
        """A counterexample for someone who has never seen the code."""
        flags = " ".join(self.config.to_flags()) or "(miles defaults)"
        lines = [f"config: {flags}"]
        for n, t in enumerate(self.path, start=1):
            where = ""
            moved = [f"{m.instance} {m.src}→{m.dst}" for m in t.moves if m.src != m.dst]
            if moved:
                where = "  (" + ", ".join(moved) + ")"
            lines.append(f"  {n}. {t.action.label()}{where}")
        lines.append(f"  ✗ invariant {self.invariant}: {self.problem}")
        return "\n".join(lines)

    def to_json(self) -> dict[str, Any]:
        return {
            "invariant": self.invariant,
            "problem": self.problem,
            "config": self.config.to_flags(),
            "steps": [
                {
                    "n": n,
                    "action": t.action.name,
                    "engine": t.action.engine,
                    "fault": t.action.fault,
                    "label": t.action.label(),
                    "moves": [
                        {
                            "machine": m.machine,
                            "instance": m.instance,
                            "trigger": m.trigger,
                            "src": m.src,
                            "dst": m.dst,
                            "effects": list(m.effects),
                        }
                        for m in t.moves
                    ],
                }
                for n, t in enumerate(self.path, start=1)
            ],
        }


@dataclass
class Result:
    config: LifecycleConfig
    engines: int
    states: int = 0
    transitions: int = 0
    seconds: float = 0.0
    invariants: int = 0
    violations: list[Violation] = field(default_factory=list)
    covers: list[LifecycleConfig] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.violations


class StateLimitError(LifecycleError):
    """One exploration held more job states than the checker keeps (memory: ~500 bytes a state). Picklable (its
    arguments are its ``args``): raised in a worker process, re-raised by ``run_check``."""

    def __init__(self, limit: int, flags: str) -> None:
        super().__init__(limit, flags)
        self.limit, self.flags = limit, flags

    def __str__(self) -> str:
        return f"more than {self.limit:,} job states exploring {self.flags}"


def explore(
    config: LifecycleConfig,
    *,
    engines: int = 2,
    machines: Mapping[str, MachineSpec] | None = None,
    only: frozenset[str] | None = None,
    max_faults: int = 2,
    max_states: int = 2_000_000,
    evals: int | None = None,
    remember: bool = True,
) -> Result:
    """Explore every reachable state of one config; stop at the first violation. ``remember=False`` asks the core
    and the invariants anew at every node (slower, the same result: the baseline of ``bench_check.py``)."""
    collecting = gc.isenabled()
    gc.disable()  # ~10^6 tuples a second and no cycle among them: the cyclic collector only costs (20 %)
    try:
        return _explore(config, engines, machines, only, max_faults, max_states, evals, remember)
    finally:
        if collecting:
            gc.enable()


def _explore(
    config: LifecycleConfig,
    engines: int,
    machines: Mapping[str, MachineSpec] | None,
    only: frozenset[str] | None,
    max_faults: int,
    max_states: int,
    evals: int | None,
    remember: bool,
) -> Result:
    t0 = time.perf_counter()
    job = Checker(config, engines=engines, evals=evals, machines=machines, max_faults=max_faults, remember=remember)
    result = Result(config, engines)
    selected = [i for i in INVARIANTS.values() if only is None or i.name in only]
    result.invariants = len(selected)
    start = job.initial().key()
    parents: dict[Node, tuple[Node | None, Transition | None]] = {start.key(): (None, None)}
    # no_stuck_recovery reads the graph backwards; no_deadlock needs only each state's first calm successor
    recovers = job.p["rollout_ft"] and (only is None or "no_stuck_recovery" in only)
    reverse: dict[Node, list[Node]] | None = {} if recovers else None
    deadlocks = only is None or "no_deadlock" in only
    stuck: Node | None = None
    verdicts = Verdicts() if remember else None
    queue: deque[Node] = deque([start])

    def path_to(key: Node, last: Transition | None = None) -> list[Transition]:
        steps: list[Transition] = [] if last is None else [last]
        k: Node | None = key
        while k is not None:
            parent, via = parents[k]
            if via is not None:
                steps.append(via)
            k = parent
        return steps[::-1]

    for name, problem in check_state(job, start, only):
        result.violations.append(Violation(name, problem, [], config))
    while queue and not result.violations:
        s = queue.popleft()
        key = s  # the queue holds keys: a sorted, normalised node is as good a state as any
        calm = False  # some successor is not a fault: the run can go on by itself
        for t in job.successors(s):
            result.transitions += 1
            child = job.key(t.node)
            new = child not in parents
            problems = check_step(job, t, s, only, with_state=new, verdicts=verdicts) if t.moves or new else []
            if problems:
                name, problem = problems[0]
                result.violations.append(Violation(name, problem, path_to(key, t), config))
                break
            calm = calm or not t.action.fault
            if reverse is not None:
                reverse.setdefault(child, []).append(key)
            if new:
                parents[child] = (key, t)
                queue.append(child)
        if stuck is None and not calm and deadlocks and not job.terminal(key):
            stuck = key  # the first in breadth-first order: the shortest way there
        if len(parents) > max_states:
            raise StateLimitError(max_states, " ".join(config.to_flags()) or "(defaults)")
    result.states = len(parents)
    if not result.violations:
        for name, problem in check_reach(job, job.seen_effects(), only):
            result.violations.append(Violation(name, problem, [], config))
    if not result.violations:
        _graph_checks(job, parents, reverse, stuck, result, only, path_to)
    result.seconds = time.perf_counter() - t0
    return result


def _graph_checks(
    job: Checker,
    parents: Mapping[Node, Any],
    reverse: Mapping[Node, list[Node]] | None,
    stuck: Node | None,
    result: Result,
    only: frozenset[str] | None,
    path_to: Any,
) -> None:
    if stuck is not None:
        where = ", ".join(f"{n}={getattr(stuck.job, n)}" for n in ("rollout", "trainer", "monitor", "fleet"))
        engines = ", ".join(e.state for e in stuck.job.engines)
        result.violations.append(
            Violation(
                "no_deadlock",
                f"no controller event is enabled ({where}; engines {engines})",
                path_to(stuck),
                job.config,
            )
        )
        return
    if reverse is not None:
        sick = job.core.marked - job.core.specs["engine"].terminal_states  # marked, not over: Unhealthy, Recovering

        unready = sick | {"Starting"}

        def good(k: Node) -> bool:
            return bool(k.job.failed) or not any(e.state in unready for e in k.job.engines)

        ok = {k for k in parents if good(k)}
        queue = deque(ok)
        while queue:
            for prev in reverse.get(queue.popleft(), ()):
                if prev not in ok:
                    ok.add(prev)
                    queue.append(prev)
        for key in parents:
            if key not in ok and any(e.state in sick for e in key.job.engines):
                result.violations.append(
                    Violation(
                        "no_stuck_recovery",
                        "an Unhealthy/Recovering engine can never serve again or fail",
                        path_to(key),
                        job.config,
                    )
                )
                return


# -- the config lattice --------------------------------------------------------------------------------
MODES = ("normal", "train-only", "rollout-only", "replay")
COMPONENTS: tuple[tuple[str, ...], ...] = ((), ("train",), ("rollout",), ("train", "rollout"))


_MODE_FLAGS: dict[str, dict[str, Any]] = {
    "normal": {},
    "train-only": {"debug_train_only": True},
    "rollout-only": {"debug_rollout_only": True},
    "replay": {"load_debug_rollout_data": "runs/replay/{rollout_id}.json"},
}


# An elastic fleet (--rollout-min/max-num-gpus): engines join and leave mid-run, the checker's --engines slots from
# one engine up to all of them. Lock-step without FT and with rollout FT, disk and broadcast updates; streaming
# without FT and with rollout FT, disk updates -- never with offload (refused), the eval fleet, external or kept
# engines, or a resume: each multiplies a space that membership already multiplies by 3-14.
ELASTIC_BOUNDS: dict[str, Any] = {
    "rollout_num_gpus": 2,
    "rollout_min_num_gpus": 1,
    "rollout_max_num_gpus": 3,
    "engine_max_restarts": 1,
}
ELASTIC_CONFIGS: list[LifecycleConfig] = [
    LifecycleConfig.from_mapping(
        {
            **ELASTIC_BOUNDS,
            "use_fault_tolerance": bool(comps),
            "ft_components": list(comps) or None,
            **({"update_weight_transfer_mode": "broadcast"} if engines == "broadcast" else {}),
            **({"fully_async": True} if engines == "stream" else {}),
        },
        check_paths=False,
    )
    for engines in ("disk", "broadcast", "stream")
    for comps in ((), ("rollout",))
]


@dataclass
class Lattice:
    valid: list[LifecycleConfig]
    invalid: list[tuple[dict[str, Any], str]]
    groups: dict[tuple[bool, ...], list[LifecycleConfig]]

    def largest_first(self) -> list[list[LifecycleConfig]]:
        """The groups, largest expected exploration first, so that parallel workers finish together."""
        return sorted(self.groups.values(), key=_expected_cost, reverse=True)


def _expected_cost(group: list[LifecycleConfig]) -> float:
    """A guess of the exploration's size from what multiplies states (measured on the 2-engine lattice: the eval
    fleet about 3x, rollout monitors 2x, broadcast updates, a resumed job, kept engines, offload and CI's injection
    1.3-1.6x each; a stream about 4x, an elastic fleet 5x), so that the parallel workers finish together."""
    p = evaluate(group[0])
    factors = (
        ("eval_fleet_enabled", 3.0),
        ("monitors_rollout", 2.0),
        ("broadcasts_weights", 1.6),
        ("resumes", 1.5),
        ("keeps_engines", 1.3),
        ("offloads_rollout", 1.5),
        ("ci_injects_rollout_faults", 1.6),
        ("elastic", 5.0),
        ("streaming", 4.0),
    )
    cost = 1.0
    for name, factor in factors:
        if p[name]:
            cost *= factor
    return cost


def lattice() -> Lattice:
    """use_fault_tolerance x ft_components x mode x ci_test x eval fleet x offload, validated; an elastic fleet
    (:data:`ELASTIC_CONFIGS`, last: the groups before it keep their order); external
    engines (--rollout-external-engine-addrs) under every FT configuration, mode and offload; and broadcast
    weight updates (--update-weight-transfer-mode broadcast) under every FT configuration and offload; and a
    resumed job that writes checkpoints (--load, --save) under every FT configuration; and the vLLM backend
    (--rollout-backend vllm) under every FT configuration and mode, and with broadcast updates (with offload
    too: refused on this CPU platform where a trainer would offload, so those land in ``invalid``)."""
    valid: list[LifecycleConfig] = []
    invalid: list[tuple[dict[str, Any], str]] = []
    flags_ = (False, True)
    axes = itertools.product(flags_, COMPONENTS, MODES, flags_, flags_, flags_, flags_, flags_)
    for ft, comps, mode, ci, fleet, offload, external, broadcast in axes:
        if external and (ci or fleet):
            continue  # CI injection and the eval fleet do not depend on who started the rollout engines
        if broadcast and (ci or fleet or external or mode != "normal"):
            continue  # the group exists only where the trainer updates engines; the fleet loads from disk
        flags: dict[str, Any] = {
            "use_fault_tolerance": ft,
            "ft_components": list(comps) or None,
            "ci_test": ci,
            "eval_num_gpus": 2 if fleet else 0,
            "offload": offload,
            "rollout_num_gpus": 2,
            "engine_max_restarts": 1,  # a second restart gives up: the checker reaches Failed through the budget
        }
        flags.update(_MODE_FLAGS[mode])
        if broadcast:
            flags["update_weight_transfer_mode"] = "broadcast"
        if external:
            flags["rollout_external_engine_addrs"] = ["127.0.0.1:30000", "127.0.0.1:30001"]
            del flags["rollout_num_gpus"]
        if not ft and comps:
            invalid.append((flags, "--ft-components without --use-fault-tolerance has no effect (a warning)"))
            continue
        try:
            valid.append(LifecycleConfig.from_mapping(flags, check_paths=False))
        except ConfigError as exc:
            invalid.append((flags, str(exc)))
    # a job resumed from its checkpoint, and writing more: under every FT configuration with local engines and
    # disk or broadcast updates (a new driver connects a new weight-update group), and with external engines
    # (they outlive the driver, still holding what it last pushed)
    for comps, engines in itertools.product(COMPONENTS, ("disk", "broadcast", "external", "kept", "kept-broadcast")):
        resumed: dict[str, object] = {
            "use_fault_tolerance": bool(comps),
            "ft_components": list(comps) or None,
            "rollout_num_gpus": 2,
            "engine_max_restarts": 1,
            "save": "runs/job/checkpoints",
            "save_interval": 1,
            "load": "runs/job/checkpoints",
        }
        if engines in ("broadcast", "kept-broadcast"):
            resumed["update_weight_transfer_mode"] = "broadcast"
        if engines.startswith("kept"):  # --detach-engines: the driver dies anywhere, its engines are adopted
            resumed["detach_engines"] = True
        if engines == "external":
            resumed["rollout_external_engine_addrs"] = ["127.0.0.1:30000", "127.0.0.1:30001"]
            del resumed["rollout_num_gpus"]
        valid.append(LifecycleConfig.from_mapping(resumed, check_paths=False))
    # the vLLM backend on this CPU platform (no memory release: offloading is refused) under every FT
    # configuration, mode and offload, and with broadcast updates
    for comps, mode, offload, broadcast in itertools.product(COMPONENTS, MODES, flags_, flags_):
        if broadcast and mode != "normal":
            continue
        on_vllm: dict[str, Any] = {
            "use_fault_tolerance": bool(comps),
            "ft_components": list(comps) or None,
            "rollout_backend": "vllm",
            "offload": offload,
            "rollout_num_gpus": 2,
            "engine_max_restarts": 1,
            **_MODE_FLAGS[mode],
        }
        if broadcast:
            on_vllm["update_weight_transfer_mode"] = "broadcast"
        try:
            valid.append(LifecycleConfig.from_mapping(on_vllm, check_paths=False))
        except ConfigError as exc:
            invalid.append((on_vllm, str(exc)))
    # streaming RL (--fully-async, K = 1) under every FT configuration: disk and broadcast updates, and a resumed
    # job writing checkpoints (its driver may die mid-stream)
    for comps, engines in itertools.product(COMPONENTS, ("disk", "broadcast", "resume")):
        stream: dict[str, object] = {
            "use_fault_tolerance": bool(comps),
            "ft_components": list(comps) or None,
            "rollout_num_gpus": 2,
            "engine_max_restarts": 1,
            "fully_async": True,
        }
        if engines == "broadcast":
            stream["update_weight_transfer_mode"] = "broadcast"
        if engines == "resume":
            stream.update(save="runs/job/checkpoints", save_interval=1, load="runs/job/checkpoints")
        valid.append(LifecycleConfig.from_mapping(stream, check_paths=False))
    valid += ELASTIC_CONFIGS
    groups: dict[tuple[bool, ...], list[LifecycleConfig]] = {}
    for c in valid:
        groups.setdefault(behaviour(c), []).append(c)
    return Lattice(valid, invalid, groups)


def rollout_side_equal(a: LifecycleConfig, b: LifecycleConfig, machines: Mapping[str, MachineSpec]) -> list[str]:
    """Where the rollout-side machines behave differently under ``a`` and ``b`` (empty: identical)."""
    diffs: list[str] = []
    for name in ROLLOUT_SIDE:
        spec = machines[name]
        ta, tb = spec.compile(a).table, spec.compile(b).table
        for k in sorted(set(ta) | set(tb)):
            va, vb = ta.get(k), tb.get(k)
            sa = (va.dest, va.effects) if isinstance(va, Step) else None
            sb = (vb.dest, vb.effects) if isinstance(vb, Step) else None
            if sa != sb:
                diffs.append(f"{name}: {k[1]} in {k[0]}: {sa} vs {sb}")
    return diffs


def check_train_only_ft_equals_no_ft(machines: Mapping[str, MachineSpec]) -> list[Violation]:
    """Invariant 8 over the lattice: train-only FT changes nothing rollout-side."""
    out: list[Violation] = []
    for c in lattice().valid:
        if c.use_fault_tolerance and c.ft_components == {"train"}:
            base = LifecycleConfig.from_mapping(
                {**c.to_dict(), "use_fault_tolerance": False, "ft_components": None}, check_paths=False
            )
            diffs = rollout_side_equal(c, base, machines)
            if diffs:
                out.append(
                    Violation(
                        "train_only_ft_rollout_side_equals_no_ft",
                        "rollout-side behaviour differs from the same run without FT: " + "; ".join(diffs[:3]),
                        [],
                        c,
                    )
                )
                break
    return out


# -- parallel lattice run and the `lifecycle check` command -----------------------------------------
def _explore_group(args: tuple[list[LifecycleConfig], int, str | None, frozenset[str] | None, int, bool]) -> Result:
    configs, engines, mutant, only, max_faults, remember = args
    machines = None
    if mutant is not None:
        from lifecycle.check.mutants import MUTANTS

        machines = MUTANTS[mutant].machines()
    result = explore(
        configs[0], engines=engines, machines=machines, only=only, max_faults=max_faults, remember=remember
    )
    result.covers = configs
    return result


def _abandon(pool: Any, futures: list[Any]) -> None:
    """Stop a pool at once: queued explorations cancelled, running ones' processes ended (each may take minutes)."""
    for f in futures:
        f.cancel()
    for process in list(getattr(pool, "_processes", {}).values()):  # the executor has no public kill
        process.terminate()
    pool.shutdown(wait=True, cancel_futures=True)


def run_check(
    configs: list[list[LifecycleConfig]],
    *,
    engines: int = 2,
    mutant: str | None = None,
    only: frozenset[str] | None = None,
    max_faults: int = 2,
    jobs: int = 1,
    stop_at_first: bool = False,
    remember: bool = True,
) -> Iterator[Result]:
    """Explore each config group (largest first, spread over ``jobs`` processes); yield results in order."""
    work = [(group, engines, mutant, only, max_faults, remember) for group in configs]
    if jobs <= 1 or len(work) <= 1:
        for item in work:
            result = _explore_group(item)
            yield result
            if stop_at_first and result.violations:
                return
        return
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    ctx = multiprocessing.get_context("fork")
    with ProcessPoolExecutor(max_workers=jobs, mp_context=ctx) as pool:
        futures = [pool.submit(_explore_group, item) for item in work]
        for future in futures:
            try:
                result = future.result()
            except BaseException:  # (a state limit): the other explorations are not waited for
                _abandon(pool, futures)
                raise
            yield result
            if stop_at_first and result.violations:
                for f in futures:
                    f.cancel()
                return
