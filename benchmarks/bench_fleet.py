"""Benchmark P7 (fleet operations at scale): one per-step fleet operation's cost vs the number of engines.

N simulated SGLang engines (``engines.sim``: one process, a port each) answer ``/update_weights_from_disk``,
``/release_memory_occupation`` and ``/resume_memory_occupation`` after a latency L, as a real server spends
seconds in them. For each N the rollout manager runs offload, onload weights, a weight update and onload KV
(each one operation of the core: its engine commands go out at once and come back in slot order), and the
same calls are made one engine after another with the project's own client -- the sequential baseline, in
the same run. Printed: each operation's wall time in units of L, the speed-up over the baseline, and the
lifecycle's own CPU time per operation (driver process time), which must grow about linearly in N.

``--gateway``: the same calls once more through the SMG gateway's RL fan-out (``/v1/rl/engine/PATH?selector=``,
``--enable-rl``), every engine registered there -- what the lifecycle would pay if its fleet operations went
through the gateway instead of straight to the engines (README, "The gateway"). SMG fans out at most
``--rl-fanout-concurrency`` (32) calls at once.

Run: python benchmarks/bench_fleet.py [--latency 0.3] [--sizes 1,4,16,64] [--gateway]
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

                out[op], _ = await _timed(fan_out)
                done = fan._json(route, answer[-1])
                if done.get("succeeded") != len(urls):  # a 207: some engines failed the call
                    raise RuntimeError(f"{route}: {done.get('succeeded')} of {len(urls)} engines answered: {done}")
        finally:
            await fan.close()
    finally:
        await gateway.close()
    return out


async def measure(size: int, latency: float, gateway: bool = False) -> dict[str, tuple[float, float, float, float]]:
    """Per operation: (ours wall s, ours driver CPU s, sequential wall s). The run is assembled as every run
    is (:class:`trainer.app.Job`, the fleet as its engines); the weight update includes the real trainer's
    checkpoint write, which the sequential baseline (engines only) does not pay."""
    fleet = SimFleet(size, dict.fromkeys(SLOW, latency))
    config = LifecycleConfig.from_mapping({"rollout_num_gpus": size, "offload_rollout": True})
    out: dict[str, tuple[float, float, float, float]] = {}
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

                via = await through_gateway([e.url or "" for e in engines], weights) if gateway else {}
                for op in OPS:
                    seq, _ = await _timed(lambda op=op: sequential(op))  # type: ignore[misc]
                    out[op] = (*measured[op], seq, via.get(op, float("nan")))
                for c in clients:
                    await c.close()
    finally:
        fleet.close()
    return out


async def measure_all(
    sizes: list[int], latency: float, gateway: bool = False
) -> list[tuple[int, dict[str, tuple[float, float, float, float]]]]:
    return [(size, await measure(size, latency, gateway)) for size in sizes]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--latency", type=float, default=0.3, help="L: seconds each slow endpoint takes (0.3)")
    parser.add_argument("--sizes", default="1,4,16,64", help="engine counts (default 1,4,16,64)")
    parser.add_argument("--gateway", action="store_true", help="also through SMG's RL fan-out (needs smg)")
    args = parser.parse_args()
    latency = args.latency
    print(f"P7: one fleet operation vs N engines, every slow endpoint answering after L = {latency:g} s")
    head = f"{'N':>4}  {'operation':<15} {'ours':>8} {'ours/L':>7} {'sequential':>11} {'speed-up':>9} {'CPU/op':>9}"
    print(head + (f" {'via SMG':>9} {'SMG/ours':>9}" if args.gateway else ""))
    for size, ops in asyncio.run(measure_all([int(s) for s in args.sizes.split(",")], latency, args.gateway)):
        for op, (wall, cpu, seq, via) in ops.items():
            row = (
                f"{size:>4}  {op:<15} {wall:>7.3f}s {wall / latency:>7.2f} {seq:>10.3f}s {seq / wall:>8.1f}x "
                f"{cpu * 1000:>7.1f}ms"
            )
            print(row + (f" {via:>8.3f}s {via / wall:>8.2f}x" if args.gateway else ""))


if __name__ == "__main__":
    main()
