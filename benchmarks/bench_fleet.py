"""Benchmark P7 (fleet operations at scale): one per-step fleet operation's cost vs the number of engines.

N simulated SGLang engines (``engines.sim``: one process, a port each) answer ``/update_weights_from_disk``,
``/release_memory_occupation`` and ``/resume_memory_occupation`` after a latency L, as a real server spends
seconds in them. For each N the rollout manager runs offload, onload weights, a weight update and onload KV
(each one operation of the core: its engine commands go out at once and come back in slot order), and the
same calls are made one engine after another with the project's own client -- the sequential baseline, in
the same run. Printed: each operation's wall time in units of L, the speed-up over the baseline, and the
lifecycle's own CPU time per operation (driver process time), which must grow about linearly in N.

Run: python benchmarks/bench_fleet.py [--latency 0.3] [--sizes 1,4,16,64]
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from collections.abc import Awaitable, Callable

from engines.client import EngineClient
from engines.sim.launcher import SimFleet
from lifecycle import LifecycleConfig
from rollout.pattern import PatternTask
from trainer.app import Job

SLOW = ("/update_weights_from_disk", "/release_memory_occupation", "/resume_memory_occupation")
OPS = ("offload", "onload_weights", "update_weights", "onload_kv")


async def _timed(fn: Callable[[], Awaitable[object]]) -> tuple[float, float]:
    wall, cpu = time.perf_counter(), time.process_time()
    await fn()
    return time.perf_counter() - wall, time.process_time() - cpu


async def measure(size: int, latency: float) -> dict[str, tuple[float, float, float]]:
    """Per operation: (ours wall s, ours driver CPU s, sequential wall s). The run is assembled as every run
    is (:class:`trainer.app.Job`, the fleet as its engines); the weight update includes the real trainer's
    checkpoint write, which the sequential baseline (engines only) does not pay."""
    fleet = SimFleet(size, dict.fromkeys(SLOW, latency))
    config = LifecycleConfig.from_mapping({"rollout_num_gpus": size, "offload_rollout": True})
    out: dict[str, tuple[float, float, float]] = {}
    try:
        with tempfile.TemporaryDirectory() as run_dir:
            async with Job(config, PatternTask(), run_dir=run_dir, engines=fleet.launcher, router=False) as job:
                ours = {
                    "offload": job.manager.offload,
                    "onload_weights": job.manager.onload_weights,
                    "update_weights": lambda: job.trainer.update_weights(1),
                    "onload_kv": job.manager.onload_kv,
                }
                measured = {op: await _timed(ours[op]) for op in OPS}
                weights = job.weights[0] if job.weights else ""
                engines = job.manager.controller.engines
                clients = [EngineClient(e.url or "", engine_id=e.id, timeout=60.0) for e in engines]

                async def sequential(op: str) -> None:
                    for c in clients:  # the baseline: one engine after another, as a for-loop over the fleet
                        if op == "offload":
                            await c.release_memory_occupation(["weights", "kv_cache"])
                        elif op == "onload_weights":
                            await c.resume_memory_occupation(["weights"])
                        elif op == "update_weights":
                            await c.update_weights_from_disk(weights, weight_version="b")
                        else:
                            await c.resume_memory_occupation(["kv_cache"])

                for op in OPS:
                    seq, _ = await _timed(lambda op=op: sequential(op))  # type: ignore[misc]
                    out[op] = (*measured[op], seq)
                for c in clients:
                    await c.close()
    finally:
        fleet.close()
    return out


async def measure_all(sizes: list[int], latency: float) -> list[tuple[int, dict[str, tuple[float, float, float]]]]:
    return [(size, await measure(size, latency)) for size in sizes]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--latency", type=float, default=0.3, help="L: seconds each slow endpoint takes (0.3)")
    parser.add_argument("--sizes", default="1,4,16,64", help="engine counts (default 1,4,16,64)")
    args = parser.parse_args()
    latency = args.latency
    print(f"P7: one fleet operation vs N engines, every slow endpoint answering after L = {latency:g} s")
    print(f"{'N':>4}  {'operation':<15} {'ours':>8} {'ours/L':>7} {'sequential':>11} {'speed-up':>9} {'CPU/op':>9}")
    for size, ops in asyncio.run(measure_all([int(s) for s in args.sizes.split(",")], latency)):
        for op, (wall, cpu, seq) in ops.items():
            print(
                f"{size:>4}  {op:<15} {wall:>7.3f}s {wall / latency:>7.2f} {seq:>10.3f}s {seq / wall:>8.1f}x "
                f"{cpu * 1000:>7.1f}ms"
            )


if __name__ == "__main__":
    main()
