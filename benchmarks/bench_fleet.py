"""Benchmark P7 (fleet operations at scale): one per-step fleet operation's cost vs the number of engines.

N simulated SGLang engines (``engines.sim``: one process, a port each, up to 1,024) answer
``/update_weights_from_disk``, ``/release_memory_occupation`` and ``/resume_memory_occupation`` after a latency
L, as a real server spends seconds in them. For each N the rollout manager runs offload (one release request per
engine carrying both tags), onload weights, a weight update and onload KV (each one operation of the core: its
engine commands go out at once and come back in slot order), and the same calls are made one engine after
another with the project's own client -- the sequential baseline, in the same run. Printed per operation: its
wall time in units of L (goal <= 1.2 L at N = 64 and 1,024), the speed-up over the baseline, the driver's whole
CPU per operation (process time), of it the time the cyclic garbage collector took (wall clock), the lifecycle
layer's own CPU in it (the goal's figure: <= 100 ms at 1,024), and the growth of both against the previous N:
``(CPU_N / CPU_prev) / (N / N_prev)`` -- at most about 1 is no worse than linear.

The layer is timed as P3 times it (``layer_timing.timed_layer``, every call counted): the core's decision
(``Core.step``) and the record (the runner's ``_apply``/``_record``, ``EventLog.flush``, the batch's start),
thread CPU inside the outermost calls, a garbage collection that runs inside one taken out. The rest of the
driver's CPU is the HTTP client (aiohttp: one request per engine an offload or onload, four an update), the
event loop, the runner's dispatch of the commands, the trainer's checkpoint write and the garbage collector.

The floor, in the same run: every engine's call at once (``asyncio.gather`` over the project's own clients, no
lifecycle at all: no core, no record, no trainer). Its wall time in L (``bare/L``), its driver CPU, and ours over it
(``ours/bare``) say how much of an operation's time is the lifecycle's and how much this machine's HTTP round trips
cost (the simulated fleet shares the 2 cores with the driver: at 1,024 engines its own request handling is in
the wall time too: its CPU during ours and during the floor is printed, ``fleet CPU`` and ``(bare)``). A weight
update sends four requests per engine (begin, load, end, version check), the floor one.

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

Run: python benchmarks/bench_fleet.py [--latency 0.3] [--sizes 16,64,256,1024] [--baseline-max 64] [--gateway]
[--unfrozen]
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import gc
import os
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


async def _timed(fn: Callable[[], Awaitable[object]]) -> tuple[float, float, float, float, float]:
    """(wall s, driver CPU s, of it the garbage collector's s, of it the lifecycle layer's CPU s, the simulated
    fleet's CPU s)."""
    COLLECTOR.reset()
    layer = LAYER.cpu
    fleet = _fleet_cpu()
    wall, cpu = time.perf_counter(), time.process_time()
    await fn()
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    return wall, cpu, COLLECTOR.reset(), LAYER.cpu - layer, _fleet_cpu() - fleet


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
# the simulated fleet's CPU s during ours and during the bare fan-out
Row = tuple[float, float, float, float, float, float, float, float, float, float]


FROZEN: dict[int, int] = {}  # per N: the objects the job froze at its start (gc.get_freeze_count())


async def measure(
    size: int, latency: float, gateway: bool = False, baseline: bool = True, unfrozen: bool = False
) -> dict[str, Row]:
    """Per operation: (ours wall s, ours driver CPU s, of it GC s, of it the lifecycle layer's CPU s, sequential
    wall s or NaN when not measured, via SMG s or NaN). The run is assembled as every run is
    (:class:`trainer.app.Job`, the fleet as its engines); the weight update includes the real trainer's
    checkpoint write, which the sequential baseline (engines only) does not pay."""
    fleet = SimFleet(size, dict.fromkeys(SLOW, latency))
    FLEET.append(fleet.process.pid)
    config = LifecycleConfig.from_mapping({"rollout_num_gpus": size, "offload_rollout": True})
    out: dict[str, Row] = {}
    try:
        with tempfile.TemporaryDirectory() as run_dir:
            options = RunOptions(router=False)
            async with Job(config, PatternTask(), run_dir=run_dir, engines=fleet.launcher, options=options) as job:
                FROZEN[size] = gc.get_freeze_count()
                if unfrozen:
                    gc.unfreeze()
                ours = {
                    "offload": job.manager.offload,
                    "onload_weights": job.manager.onload_weights,
                    "update_weights": lambda: job.trainer.update_weights(1),
                    "onload_kv": job.manager.onload_kv,
                }
                LAYER.by_machine.clear()  # per N: the parts of the layer over its four operations
                with timed_layer(LAYER, every_call=True):  # a fleet operation runs outside a loop step
                    measured = {op: await _timed(ours[op]) for op in OPS}
                releases = [r for asked in fleet.memory_requests().values() for r in asked if "release" in r[0]]
                if len(releases) != size or any(sorted(tags or ()) != ["kv_cache", "weights"] for _, tags in releases):
                    raise RuntimeError(f"offload: expected one release with both tags per engine, got {releases}")
                weights = job.weights[0] if job.weights else ""
                engines = job.manager.controller.engines
                clients = [EngineClient(e.url or "", engine_id=e.id, timeout=60.0) for e in engines]

                async def call(c: EngineClient, op: str) -> None:
                    if op == "offload":
                        await c.release_memory_occupation(["weights", "kv_cache"])
                    elif op == "onload_weights":
                        await c.resume_memory_occupation(["weights"])
                    elif op == "update_weights":
                        await c.update_weights_from_disk(weights, weight_version="b")
                    else:
                        await c.resume_memory_occupation(["kv_cache"])

                async def sequential(op: str) -> None:
                    for c in clients:  # the baseline: one engine after another, as a for-loop over the fleet
                        await call(c, op)

                async def bare(op: str) -> None:  # the floor: every engine's call at once, no lifecycle at all
                    await asyncio.gather(*(call(c, op) for c in clients))

                via = await through_gateway([e.url or "" for e in engines], weights) if gateway else {}
                for op in OPS:
                    seq = (await _timed(functools.partial(sequential, op)))[0] if baseline else float("nan")
                    floor = await _timed(functools.partial(bare, op))
                    wall, cpu, gc_s, layer, fleet_s = measured[op]
                    out[op] = (wall, cpu, gc_s, layer, seq, via.get(op, float("nan")), *floor[:2], fleet_s, floor[4])
                for c in clients:
                    await c.close()
    finally:
        fleet.close()
        FLEET.clear()
    return out


async def measure_all(
    sizes: list[int],
    latency: float,
    gateway: bool = False,
    baseline_max: int = 64,
    report: Callable[[int, dict[str, Row]], None] | None = None,
    unfrozen: bool = False,
) -> list[tuple[int, dict[str, Row]]]:
    out = []
    for size in sizes:
        out.append((size, await measure(size, latency, gateway, size <= baseline_max, unfrozen)))
        if report is not None:
            report(*out[-1])
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--latency", type=float, default=0.3, help="L: seconds each slow endpoint takes (0.3)")
    parser.add_argument("--sizes", default="16,64,256,1024", help="engine counts (default 16,64,256,1024)")
    parser.add_argument(
        "--baseline-max", type=int, default=64, help="measure the sequential baseline up to this N (64)"
    )
    parser.add_argument("--gateway", action="store_true", help="also through SMG's RL fan-out (needs smg)")
    parser.add_argument(
        "--unfrozen", action="store_true", help="what-if: gc.unfreeze() once the job started (the driver before)"
    )
    args = parser.parse_args()
    latency = args.latency
    sizes = sorted(int(s) for s in args.sizes.split(","))
    what_if = " (what-if: gc.unfreeze() once the job started)" if args.unfrozen else ""
    print(f"P7: one fleet operation vs N engines, every slow endpoint answering after L = {latency:g} s{what_if}")
    head = (
        f"{'N':>5}  {'operation':<15} {'ours':>8} {'ours/L':>7} {'sequential':>11} {'speed-up':>9} "
        f"{'CPU/op':>9} {'of it GC':>9} {'growth':>7} {'layer':>9} {'growth':>7} {'bare/L':>6} {'bare CPU':>9} "
        f"{'ours/bare':>9} {'fleet CPU':>9} {'(bare)':>9}"
    )
    print(head + (f" {'via SMG':>9} {'SMG/ours':>9}" if args.gateway else ""), flush=True)  # flushes the title
    per_engine: dict[str, float] = {}  # the sequential baseline's seconds per engine at the largest measured N
    previous: dict[str, tuple[int, float, float]] = {}

    def report(size: int, ops: dict[str, Row]) -> None:
        print(f"{size:>5}  (the job froze {FROZEN.get(size, 0):,} objects at its start)", flush=True)
        for op, (wall, cpu, gc_s, layer, seq, via, bare, bare_cpu, fleet_s, bare_fleet) in ops.items():
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
            row = (
                f"{size:>5}  {op:<15} {wall:>7.3f}s {wall / latency:>7.2f} {mark}{seq:>9.3f}s {seq / wall:>8.1f}x "
                f"{cpu * 1000:>7.1f}ms {gc_s * 1000:>7.1f}ms {growth:>7} {layer * 1000:>7.1f}ms {layer_growth:>7} "
                f"{bare / latency:>6.2f} {bare_cpu * 1000:>7.1f}ms {wall / bare:>9.2f} "
                f"{fleet_s * 1000:>7.0f}ms {bare_fleet * 1000:>7.0f}ms"
            )
            print(row + (f" {via:>8.3f}s {via / wall:>8.2f}x" if args.gateway else ""), flush=True)
        parts = ", ".join(
            f"{name} {cpu * 1000:.1f} ms ({int(calls)} calls)"
            for name, (cpu, calls) in sorted(LAYER.by_machine.items(), key=lambda kv: -kv[1][0])
        )
        print(f"{size:>5}  the layer's CPU by part, the four operations together: {parts}", flush=True)

    asyncio.run(measure_all(sizes, latency, args.gateway, args.baseline_max, report, args.unfrozen))
    print(
        "layer: the lifecycle layer's own CPU in the operation (the core's decision and the record, GC taken out; "
        "goal <= 100 ms at 1,024); growth: (CPU_N / CPU_prev) / (N / N_prev) for the same operation, the driver's "
        "and the layer's (<= ~1: no worse than linear); ~: sequential extrapolated from the largest N measured "
        "(--baseline-max)",
        flush=True,
    )


if __name__ == "__main__":
    main()
