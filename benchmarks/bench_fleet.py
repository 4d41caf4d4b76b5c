"""Benchmark P7 (fleet operations at scale): one per-step fleet operation's cost vs the number of engines.

N simulated SGLang engines (``engines.sim``: one process, a port each, up to 1,024) answer
``/update_weights_from_disk``, ``/release_memory_occupation`` and ``/resume_memory_occupation`` after a latency
L, as a real server spends seconds in them. For each N the rollout manager runs offload (one release request per
engine carrying both tags), onload weights, a weight update and onload KV (each one operation of the core: its
engine commands go out at once and come back in slot order).

**The floor** (P7's baseline, issue 45): the same exchanges with the project's own client and no lifecycle at all
(no core, no record, no trainer): every engine at once (``asyncio.gather``), each engine sent exactly the requests
our operation sent it, in the same order -- one release (both tags), one resume, and for the update the session
SGLang's API asks for, in sequence per engine: ``/begin_weight_update``, ``/update_weights_from_disk``,
``/end_weight_update``, ``/model_info`` (the version read back). The fleet's own per-engine counts are compared
after every operation: a floor that sent different requests than ours stops the run. Ours and the floor alternate,
operation by operation, for ``--repeat`` rounds (the same machine load for both), and the medians are printed:
``ours/floor`` (goal <= 1.2 for every operation at every N) and each round's ratio. The update's trainer checkpoint
write is part of ours (the floor has no trainer): its wall time is printed apart (``ckpt``).

Printed per operation besides: its wall time in units of L, the speed-up over the sequential baseline (the same
exchanges one engine after another), the driver's whole CPU per operation (process time), of it the time the
cyclic garbage collector took (wall clock) and, for the floor too, how many full collections ran; the lifecycle
layer's own CPU in it (P9: <= 100 ms at 1,024) and the growth of the driver's and the layer's CPU against the
previous N: ``(CPU_N / CPU_prev) / (N / N_prev)`` -- at most about 1 is no worse than linear (P9: <= 1.1). The
last lines say met or MISSED for P7 and P9, with the load.

The layer is timed as P3 times it (``layer_timing.timed_layer``, every call counted): the runner's bursts (the
core's decision, the moves replayed, the ledger, the event log and its one write per burst), thread CPU inside the
outermost calls, a garbage collection that runs inside one taken out. The rest of the driver's CPU is the HTTP
client (aiohttp: one request per engine an offload or onload, four an update), the event loop, the runner's
dispatch of the commands, the trainer's checkpoint write and the garbage collector. The simulated fleet shares
the 2 cores with the driver: its CPU during ours and during the floor is printed (``fleet CPU``, ``(floor)``).

The sequential baseline walks the fleet one engine at a time, so it costs N x (L + one call) per operation: it is
measured for N <= ``--baseline-max`` (64: ~20 s an operation at L = 0.3) and, above it, extrapolated from the
largest measured N's per-engine time (marked ``~``), which keeps the default run (16, 64, 256, 1,024) to a few
minutes.

``--gateway``: the same calls once more through the SMG gateway's RL fan-out (``/v1/rl/engine/PATH?selector=``,
``--enable-rl``), every engine registered there -- what the lifecycle would pay if its fleet operations went
through the gateway instead of straight to the engines (``docs/gateway.md``). SMG fans out at most
``--rl-fanout-concurrency`` (32) calls at once.

The job is measured as every job runs: :class:`trainer.app.Job` freezes its start-up heap (~420k objects at 1,024
engines: the imports, the engines' clients, the machines) once it has started (``gc.freeze()``), so the
collector's full collections, which a fleet operation's in-flight requests trigger, do not walk it; the title
line prints how many objects it froze. ``--unfrozen``: ``gc.unfreeze()`` once the job has started -- what the
driver paid before (issue 32's first measurement: 190-445 ms of GC per operation at 1,024); a what-if.

Run: python benchmarks/bench_fleet.py [--latency 0.3] [--sizes 16,64,256,1024] [--repeat 3] [--baseline-max 64]
[--gateway] [--unfrozen]
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import gc
import itertools
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from engines.client import EngineClient
from engines.sim.launcher import SimFleet
from lifecycle import LifecycleConfig
from rollout.pattern import PatternTask
from trainer.app import Job, RunOptions

sys.path.insert(0, str(Path(__file__).resolve().parent))  # layer_timing, also when a test loads this file by path
from layer_timing import Timer, timed_layer

SLOW = ("/update_weights_from_disk", "/release_memory_occupation", "/resume_memory_occupation")
OPS = ("offload", "onload_weights", "update_weights", "onload_kv")


class Collector:
    """Seconds the cyclic garbage collector ran in this process (``gc.callbacks``), since the last reset."""

    def __init__(self) -> None:
        self.seconds, self._start = 0.0, 0.0
        gc.callbacks.append(self._note)

    def _note(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._start = time.perf_counter()
        else:
            self.seconds += time.perf_counter() - self._start

    def reset(self) -> float:
        seconds, self.seconds = self.seconds, 0.0
        return seconds


COLLECTOR = Collector()
LAYER = Timer()  # the lifecycle layer's calls, while :func:`timed_layer` is on (the rollout manager's operations)


FLEET: list[int] = []  # the simulated fleet's process id, while one runs


def _fleet_cpu() -> float:
    """CPU seconds the simulated fleet's process has used (Linux /proc; 0 elsewhere): its own request handling
    shares this machine's cores with the driver."""
    try:
        with open(f"/proc/{FLEET[-1]}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime
    except (IndexError, OSError, ValueError):
        return 0.0


async def _timed(fn: Callable[[], Awaitable[object]]) -> tuple[float, float, float, float, float, int]:
    """(wall s, driver CPU s, of it the garbage collector's s, of it the lifecycle layer's CPU s, the simulated
    fleet's CPU s, the full collections that ran)."""
    COLLECTOR.reset()
    layer = LAYER.cpu
    fleet = _fleet_cpu()
    full = gc.get_stats()[2]["collections"]
    wall, cpu = time.perf_counter(), time.process_time()
    await fn()
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    full = gc.get_stats()[2]["collections"] - full
    return wall, cpu, COLLECTOR.reset(), LAYER.cpu - layer, _fleet_cpu() - fleet, full


async def through_gateway(urls: list[str], weights: str) -> dict[str, float]:
    """Each operation as one SMG RL fan-out to every registered engine: its wall time."""
    from engines.router import Router

    gateway = Router("router-bench", rl=True, membership_timeout=60.0)
    out: dict[str, float] = {}
    try:
        url = await gateway.start()
        await asyncio.gather(*(gateway.add(u) for u in urls))
        bodies: dict[str, tuple[str, dict[str, object]]] = {
            "offload": ("release_memory_occupation", {"tags": ["weights", "kv_cache"]}),
            "onload_weights": ("resume_memory_occupation", {"tags": ["weights"]}),
            "update_weights": ("update_weights_from_disk", {"model_path": weights, "weight_version": "c"}),
            "onload_kv": ("resume_memory_occupation", {"tags": ["kv_cache"]}),
        }
        fan = EngineClient(url, engine_id="router-bench", timeout=600.0)
        try:
            for op in OPS:
                path, body = bodies[op]
                route = f"/v1/rl/engine/{path}"
                answer: list[str] = []

                async def fan_out(
                    route: str = route, body: dict[str, object] = body, answer: list[str] = answer
                ) -> None:
                    params = {"selector": "engine=sglang"}
                    answer.append(await fan._call("POST", route, body=body, send_body=True, params=params))

                out[op] = (await _timed(fan_out))[0]
                done = fan._json(route, answer[-1])
                if done.get("succeeded") != len(urls):  # a 207: some engines failed the call
                    raise RuntimeError(f"{route}: {done.get('succeeded')} of {len(urls)} engines answered: {done}")
        finally:
            await fan.close()
    finally:
        await gateway.close()
    return out


# ours wall s, driver CPU s, GC s, layer CPU s, sequential s, via SMG s, bare fan-out wall s and its driver CPU s,
# the simulated fleet's CPU s during ours and during the bare fan-out, of ours the trainer's checkpoint write s, the
# floor's GC s, the full collections during ours and during the floor
Row = tuple[float, float, float, float, float, float, float, float, float, float, float, float, float, float]


FROZEN: dict[int, int] = {}  # per N: the objects the job froze at its start (gc.get_freeze_count())
WRITE: list[float] = [0.0]  # wall seconds inside the trainer's checkpoint write (TrainerGroup._write_weights)


def exchanges(before: dict[str, dict[str, int]], after: dict[str, dict[str, int]]) -> dict[str, dict[str, int]]:
    """Per engine slot, the requests (path -> count) its server answered between two reads of the fleet's counts."""
    out: dict[str, dict[str, int]] = {}
    for slot, paths in after.items():
        done = {path: n - before.get(slot, {}).get(path, 0) for path, n in paths.items()}
        out[slot] = {path: n for path, n in done.items() if n}
    return out


async def exchange(client: EngineClient, op: str, weights: tuple[str, str]) -> None:
    """One engine's share of ``op`` as the floor sends it: the requests our operation sends that engine, in its
    order, with the project's own client and nothing else (the update: begin the session, load, end it, read the
    version back -- what :meth:`engines.api.SGLangAPI.load` asks)."""
    if op == "offload":
        await client.release_memory_occupation(["weights", "kv_cache"])
    elif op == "onload_weights":
        await client.resume_memory_occupation(["weights"])
    elif op == "onload_kv":
        await client.resume_memory_occupation(["kv_cache"])
    else:
        await client.begin_weight_update()
        await client.update_weights_from_disk(weights[0], weight_version=weights[1])
        await client.end_weight_update()
        if (await client.model_info()).weight_version != weights[1]:
            raise RuntimeError(f"{client.engine_id}: the floor's update did not take")


async def measure(
    size: int,
    latency: float,
    gateway: bool = False,
    baseline: bool = True,
    unfrozen: bool = False,
    repeat: int = 3,
    young_default: bool = False,
) -> dict[str, Row]:
    """Per operation, the median over ``repeat`` rounds of: (ours wall s, ours driver CPU s, of it GC s, of it the
    lifecycle layer's CPU s, sequential wall s or NaN when not measured, via SMG s or NaN, the floor's wall s and
    driver CPU s, the fleet's CPU s during ours and during the floor, the trainer's checkpoint write s in ours).

    In each round every operation runs as ours and then as the floor, alternating (the same machine load for both);
    the floor sends each engine exactly the requests ours sent it in the round (checked against the fleet's own
    counts: a different exchange is an error, not a ratio). The run is assembled as every run is
    (:class:`trainer.app.Job`, the fleet as its engines); the weight update includes the real trainer's checkpoint
    write, which the floor (engines only) does not pay: it is printed apart."""
    from trainer.group import TrainerGroup

    fleet = SimFleet(size, dict.fromkeys(SLOW, latency))
    FLEET.append(fleet.process.pid)
    config = LifecycleConfig.from_mapping({"rollout_num_gpus": size, "offload_rollout": True})
    samples: dict[str, list[Row]] = {op: [] for op in OPS}
    write = TrainerGroup._write_weights

    async def timed_write(self: TrainerGroup, version: str) -> tuple[str, str]:
        start = time.perf_counter()
        try:
            return await write(self, version)
        finally:
            WRITE[0] += time.perf_counter() - start

    TrainerGroup._write_weights = timed_write  # type: ignore[method-assign]
    try:
        with tempfile.TemporaryDirectory() as run_dir:
            options = RunOptions(router=False)
            async with Job(config, PatternTask(), run_dir=run_dir, engines=fleet.launcher, options=options) as job:
                FROZEN[size] = gc.get_freeze_count()
                if unfrozen:
                    gc.unfreeze()
                young = gc.get_threshold()
                if young_default:
                    gc.set_threshold(700, *young[1:])
                engines = job.manager.controller.engines
                clients = [EngineClient(e.url or "", engine_id=e.id, timeout=60.0) for e in engines]
                version = [0]

                async def update() -> None:
                    version[0] += 1
                    await job.trainer.update_weights(version[0])

                ours = {
                    "offload": job.manager.offload,
                    "onload_weights": job.manager.onload_weights,
                    "update_weights": update,
                    "onload_kv": job.manager.onload_kv,
                }

                async def bare(op: str) -> None:  # the floor: the same exchanges, every engine at once, no lifecycle
                    weights = job.runner.committed or ("", "")
                    await asyncio.gather(*(exchange(c, op, weights) for c in clients))

                async def sequential(op: str) -> None:
                    weights = job.runner.committed or ("", "")
                    for c in clients:  # the baseline: one engine after another, as a for-loop over the fleet
                        await exchange(c, op, weights)

                LAYER.by_machine.clear()  # per N: the parts of the layer over its operations
                LAYER.inner.clear()
                for _ in range(repeat):
                    for op in OPS:
                        before = fleet.calls()
                        WRITE[0] = 0.0
                        with timed_layer(LAYER, every_call=True):  # a fleet operation runs outside a loop step
                            mine = await _timed(ours[op])
                        written = WRITE[0]
                        middle = fleet.calls()
                        floor = await _timed(functools.partial(bare, op))
                        sent, asked = exchanges(before, middle), exchanges(middle, fleet.calls())
                        if sent != asked:
                            wrong = [
                                (slot, sent.get(slot), asked.get(slot))
                                for slot in sent
                                if sent[slot] != asked.get(slot)
                            ]
                            raise RuntimeError(
                                f"{op}: the floor's exchanges differ from ours (slot, ours, floor): {wrong[:3]}"
                            )
                        if len(sent) != size or not all(sent.values()):
                            raise RuntimeError(
                                f"{op}: ours reached {sum(1 for v in sent.values() if v)} of {size} engines"
                            )
                        wall, cpu, gc_s, layer, fleet_s, full = mine
                        nan = float("nan")
                        row = (wall, cpu, gc_s, layer, nan, nan, *floor[:2], fleet_s, floor[4], written, floor[2])
                        samples[op].append((*row, full, floor[5]))
                releases = [r for asked in fleet.memory_requests().values() for r in asked if "release" in r[0]]
                if len(releases) != 2 * repeat * size or any(
                    sorted(tags or ()) != ["kv_cache", "weights"] for _, tags in releases
                ):
                    raise RuntimeError(f"offload: expected one release with both tags per engine, got {releases[:4]}")
                via = (
                    await through_gateway(
                        [e.url or "" for e in engines], job.runner.committed[0] if job.runner.committed else ""
                    )
                    if gateway
                    else {}
                )
                out: dict[str, Row] = {}
                for op in OPS:
                    seq = (await _timed(functools.partial(sequential, op)))[0] if baseline else float("nan")
                    rows = samples[op]
                    median = tuple(statistics.median(r[k] for r in rows) for k in range(len(rows[0])))
                    out[op] = (*median[:4], seq, via.get(op, float("nan")), *median[6:])  # type: ignore[assignment]
                    RATIOS.setdefault(size, {})[op] = [r[0] / r[6] for r in rows]
                for c in clients:
                    await c.close()
                gc.set_threshold(*young)
    finally:
        TrainerGroup._write_weights = write  # type: ignore[method-assign]
        fleet.close()
        FLEET.clear()
    return out


RATIOS: dict[int, dict[str, list[float]]] = {}  # per N, per operation: ours/floor of each round


async def measure_all(
    sizes: list[int],
    latency: float,
    gateway: bool = False,
    baseline_max: int = 64,
    report: Callable[[int, dict[str, Row]], None] | None = None,
    unfrozen: bool = False,
    repeat: int = 3,
    young_default: bool = False,
) -> list[tuple[int, dict[str, Row]]]:
    out = []
    for size in sizes:
        row = await measure(size, latency, gateway, size <= baseline_max, unfrozen, repeat, young_default)
        out.append((size, row))
        if report is not None:
            report(*out[-1])
    return out


GOAL_RATIO = 1.2  # P7: ours / the floor, every operation at every size
GOAL_LAYER_MS = 100.0  # P9: the lifecycle layer's own CPU per operation at 1,024 engines
GOAL_GROWTH = 1.1  # P9: the layer's CPU growth per 4x engines (1: linear)


def _ratio(size: int, op: str, row: Row) -> float:
    """P7's figure: the median of the rounds' ours/floor (each round's pair ran back to back, under the same load)."""
    rounds = RATIOS.get(size, {}).get(op)
    return statistics.median(rounds) if rounds else row[0] / row[6]


def verdicts(results: list[tuple[int, dict[str, Row]]]) -> list[str]:
    """P7 and P9, met or missed, from the measured rows: one line each."""
    lines = []
    ratios = {(size, op): _ratio(size, op, row) for size, ops in results for op, row in ops.items()}
    worst = max(((r, size, op) for (size, op), r in ratios.items()), default=None)
    if worst is not None:
        ratio, size, op = worst
        met = "met" if ratio <= GOAL_RATIO else "MISSED"
        cells = "; ".join(
            f"N={size}: " + ", ".join(f"{op} {ratios[size, op]:.2f}" for op in ops) for size, ops in results
        )
        lines.append(
            f"P7 ours/floor (each round's ratio, the median) <= {GOAL_RATIO}: {met} "
            f"(worst {ratio:.2f}, {op} at N={size}); " + cells
        )
    largest = max((size for size, _ in results), default=0)
    if largest >= 1024:
        ops = dict(results)[largest]
        layer = max(row[3] for row in ops.values()) * 1000
        met = "met" if layer <= GOAL_LAYER_MS else "MISSED"
        per_op = ", ".join(f"{op} {row[3] * 1000:.1f} ms" for op, row in ops.items())
        lines.append(f"P9 the layer's CPU per operation at N={largest} <= {GOAL_LAYER_MS:g} ms: {met} ({per_op})")
    growth = []
    for (n0, ops0), (n1, ops1) in itertools.pairwise(results):
        for op in ops1:
            growth.append(((ops1[op][3] / ops0[op][3]) / (n1 / n0), n0, n1, op))
    if growth:
        g, n0, n1, op = max(growth)
        met = "met" if g <= GOAL_GROWTH else "MISSED"
        lines.append(
            f"P9 the layer's growth (CPU_N / CPU_prev) / (N / N_prev) <= {GOAL_GROWTH}: {met} (worst {g:.2f}, {op} "
            f"{n0} -> {n1})"
        )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--latency", type=float, default=0.3, help="L: seconds each slow endpoint takes (0.3)")
    parser.add_argument("--sizes", default="16,64,256,1024", help="engine counts (default 16,64,256,1024)")
    parser.add_argument(
        "--baseline-max", type=int, default=64, help="measure the sequential baseline up to this N (64)"
    )
    parser.add_argument("--repeat", type=int, default=3, help="rounds of ours and the floor, alternating (3)")
    parser.add_argument("--gateway", action="store_true", help="also through SMG's RL fan-out (needs smg)")
    parser.add_argument(
        "--unfrozen", action="store_true", help="what-if: gc.unfreeze() once the job started (the driver before)"
    )
    parser.add_argument(
        "--young-default",
        action="store_true",
        help="what-if: CPython's young-generation threshold (700) once the job started (the driver before issue 45)",
    )
    args = parser.parse_args()
    latency = args.latency
    sizes = sorted(int(s) for s in args.sizes.split(","))
    what_if = " (what-if: gc.unfreeze() once the job started)" if args.unfrozen else ""
    what_if += " (what-if: the young threshold 700 once the job started)" if args.young_default else ""
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    print(
        f"P7: one fleet operation vs N engines, every slow endpoint answering after L = {latency:g} s{what_if}; "
        f"{args.repeat} rounds, ours and the floor alternating; load {load}"
    )
    head = (
        f"{'N':>5}  {'operation':<15} {'ours':>8} {'ours/L':>7} {'sequential':>11} {'speed-up':>9} "
        f"{'CPU/op':>9} {'of it GC':>9} {'growth':>7} {'layer':>9} {'growth':>7} {'ckpt':>7} {'floor/L':>7} "
        f"{'floor CPU':>9} {'(GC)':>7} {'ours/floor':>10} {'(rounds)':>16} {'full GCs':>8} "
        f"{'fleet CPU':>9} {'(floor)':>9}"
    )
    print(head + (f" {'via SMG':>9} {'SMG/ours':>9}" if args.gateway else ""), flush=True)  # flushes the title
    per_engine: dict[str, float] = {}  # the sequential baseline's seconds per engine at the largest measured N
    previous: dict[str, tuple[int, float, float]] = {}

    def report(size: int, ops: dict[str, Row]) -> None:
        now = ", ".join(f"{x:.2f}" for x in os.getloadavg())
        print(f"{size:>5}  (the job froze {FROZEN.get(size, 0):,} objects at its start; load {now})", flush=True)
        for op, row in ops.items():
            wall, cpu, gc_s, layer, seq, via, bare, bare_cpu, fleet_s, bare_fleet, written, bare_gc, full, bare_full = (
                row
            )
            mark = " "
            if seq == seq:  # measured
                per_engine[op] = seq / size
            elif op in per_engine:
                seq, mark = per_engine[op] * size, "~"  # extrapolated: N x the measured time per engine
            growth = layer_growth = ""
            if op in previous:
                n0, cpu0, layer0 = previous[op]
                growth = f"{(cpu / cpu0) / (size / n0):.2f}"
                layer_growth = f"{(layer / layer0) / (size / n0):.2f}"
            previous[op] = (size, cpu, layer)
            rounds = "/".join(f"{r:.2f}" for r in RATIOS.get(size, {}).get(op, []))
            line = (
                f"{size:>5}  {op:<15} {wall:>7.3f}s {wall / latency:>7.2f} {mark}{seq:>9.3f}s {seq / wall:>8.1f}x "
                f"{cpu * 1000:>7.1f}ms {gc_s * 1000:>7.1f}ms {growth:>7} {layer * 1000:>7.1f}ms {layer_growth:>7} "
                f"{written * 1000:>5.0f}ms {bare / latency:>7.2f} {bare_cpu * 1000:>7.1f}ms {bare_gc * 1000:>5.0f}ms "
                f"{_ratio(size, op, row):>10.2f} {rounds:>16} {full:>3.0f}/{bare_full:<4.0f} {fleet_s * 1000:>7.0f}ms "
                f"{bare_fleet * 1000:>7.0f}ms"
            )
            print(line + (f" {via:>8.3f}s {via / wall:>8.2f}x" if args.gateway else ""), flush=True)
        parts = ", ".join(
            f"{name} {cpu * 1000 / args.repeat:.1f} ms ({int(calls) // args.repeat} calls)"
            for name, (cpu, calls) in sorted(LAYER.by_machine.items(), key=lambda kv: -kv[1][0])
        )
        parts += "".join(
            f"; of them {name} {cpu * 1000 / args.repeat:.1f} ms ({int(calls) // args.repeat} calls)"
            for name, (cpu, calls) in LAYER.inner.items()
        )
        print(f"{size:>5}  the layer's CPU by part, the four operations together, per round: {parts}", flush=True)

    results = asyncio.run(
        measure_all(
            sizes, latency, args.gateway, args.baseline_max, report, args.unfrozen, args.repeat, args.young_default
        )
    )
    print(
        "layer: the lifecycle layer's own CPU in the operation (the core's decision and the record, GC taken out; "
        "goal <= 100 ms at 1,024); growth: (CPU_N / CPU_prev) / (N / N_prev) for the same operation, the driver's "
        "and the layer's (<= ~1: no worse than linear); ckpt: of ours, the trainer's checkpoint write (the floor "
        "has none); floor: each engine's same requests at once with the project's client, no lifecycle; "
        "~: sequential extrapolated from the largest N measured (--baseline-max); medians over the rounds (ours/floor: "
        "the median of the rounds' ratios, each listed)",
        flush=True,
    )
    end = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    for line in verdicts(results):
        print(line, flush=True)
    print(f"load at the end {end}", flush=True)


if __name__ == "__main__":
    main()
