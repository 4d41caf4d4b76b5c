"""Engine benchmarks P1, P2, P6 (Engines issue), each a ratio against a baseline of the same run.

P1  process death -> Unhealthy: our path (Ray/OS reports the death; the monitor's ``engine_died``)
    vs a sequential poller with miles' semantics (every interval, probe the engines one after
    another, each with the probe timeout) at the same settings (--interval/--timeout, default 2 s).
P2  one probe round over N engines with injected probe latency L: concurrent rounds (ours) vs the
    sequential baseline; simulated engines (one local aiohttp server, N routes) for N = 64 and real
    CPU engine processes for N = 4.
P6  recovery (kill -> Serving with the current weights) vs a cold start of the same engine.

Run: python benchmarks/bench_engines.py [--trials 5] [--interval 2] [--timeout 2]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path

from aiohttp import web

from engines.client import EngineClient
from engines.engine import Engine
from engines.errors import EngineError
from engines.health import HealthMonitor
from engines.launcher import LocalLauncher
from engines.process import torch_engine_command
from lifecycle import LifecycleConfig
from models import TinyCausalLM


def config(interval: float, timeout: float) -> LifecycleConfig:
    return LifecycleConfig.from_mapping(
        {
            "use_fault_tolerance": True,
            "rollout_num_gpus": 4,
            "rollout_health_check_interval": interval,
            "rollout_health_check_timeout": timeout,
            "rollout_health_check_failure_threshold": 1,
            "rollout_health_check_jitter": 0.0,
            "engine_restart_backoff": 0.01,
        },
        check_paths=False,
    )


async def sequential_poller(
    clients: list[EngineClient], interval: float, timeout: float, dead: asyncio.Event, found: list[str]
) -> None:
    """miles' semantics: every interval, probe each engine in turn; a failed probe marks it dead."""
    while not found:
        for c in clients:
            try:
                await c.health_generate(timeout=timeout)
            except EngineError:
                found.append(c.engine_id)
                dead.set()
                return
        await asyncio.sleep(interval)


async def p1_trial(mode: str, phase: float, interval: float, timeout: float) -> float:
    """Seconds from SIGKILL of one of two real engines until it is marked Unhealthy."""
    launchers = [LocalLauncher(f"e{i}", lambda i=i: torch_engine_command(seed=i)) for i in range(2)]
    urls = await asyncio.gather(*(lch.launch() for lch in launchers))
    clients = [EngineClient(u, engine_id=f"e{i}", timeout=timeout) for i, u in enumerate(urls)]
    victim = launchers[1]
    dead = asyncio.Event()
    found: list[str] = []
    monitor: HealthMonitor | None = None
    if mode == "ours":

        async def on_unhealthy(eid: str, why: str) -> None:
            found.append(eid)
            dead.set()

        monitor = HealthMonitor(config(interval, timeout), "rollout", on_unhealthy)
        await monitor.create()
        for c in clients:
            monitor.add_engine(c.engine_id, lambda t, c=c: c.health_generate(timeout=t))
        await monitor.resume()

        async def watcher(m: HealthMonitor) -> None:
            await m.engine_died("e1", await victim.watch())

        task = asyncio.create_task(watcher(monitor))
    else:
        task = asyncio.create_task(sequential_poller(clients, interval, timeout, dead, found))
    await asyncio.sleep(interval * phase)  # kill at varying phases of the probe period
    t0 = time.perf_counter()
    await victim.kill()
    await asyncio.wait_for(dead.wait(), 60)
    elapsed = time.perf_counter() - t0
    task.cancel()
    if monitor is not None:
        await monitor.stop()
    for c in clients:
        await c.close()
    for lch in launchers:
        await lch.kill()
        await lch.wait_dead(10)
    return elapsed


async def p1(trials: int, interval: float, timeout: float) -> tuple[list[float], list[float]]:
    ours: list[float] = []
    base: list[float] = []
    for trial in range(trials):
        phase = 0.1 + 0.8 * ((trial * 0.37) % 1)
        ours.append(await p1_trial("ours", phase, interval, timeout))
        base.append(await p1_trial("baseline", phase, interval, timeout))
    return ours, base


async def probe_rounds(clients: list[EngineClient]) -> tuple[float, float]:
    """One concurrent monitor round vs the same probes one after another (warm pools); closes the clients."""
    monitor = HealthMonitor(config(interval=10.0, timeout=5.0), "rollout", lambda e, r: None)
    await monitor.create()
    for c in clients:
        monitor.add_engine(c.engine_id, lambda t, c=c: c.health_generate(timeout=t))
    await monitor.machine.fire("resume")
    await monitor.probe_round()  # warm the connection pools
    t0 = time.perf_counter()
    await monitor.probe_round()
    concurrent = time.perf_counter() - t0
    t0 = time.perf_counter()
    for c in clients:
        await c.health_generate(timeout=5)
    sequential = time.perf_counter() - t0
    for c in clients:
        await c.close()
    return concurrent, sequential


async def p2_simulated(n: int, latency: float) -> tuple[float, float]:
    async def health(request: web.Request) -> web.Response:
        await asyncio.sleep(latency)
        return web.Response()

    app = web.Application()
    app.router.add_get("/e{i}/health_generate", health)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    clients = [EngineClient(f"http://127.0.0.1:{port}/e{i}", engine_id=f"e{i}", timeout=5) for i in range(n)]
    try:
        return await probe_rounds(clients)
    finally:
        await runner.cleanup()


async def p2_real(n: int) -> tuple[float, float]:
    launchers = [LocalLauncher(f"e{i}", lambda i=i: torch_engine_command(seed=i)) for i in range(n)]
    urls = await asyncio.gather(*(lch.launch() for lch in launchers))
    clients = [EngineClient(u, engine_id=f"e{i}", timeout=10) for i, u in enumerate(urls)]
    concurrent, sequential = await probe_rounds(clients)
    for lch in launchers:
        await lch.kill()
    return concurrent, sequential


async def p6(trials: int) -> tuple[list[float], list[float]]:
    cfg = config(2.0, 2.0)
    tmp = Path(tempfile.mkdtemp())
    weights = tmp / "w.safetensors"
    TinyCausalLM("tiny", seed=3).save_weights(weights)
    cold: list[float] = []
    recovery: list[float] = []
    for _ in range(trials):
        engine = Engine("e0", cfg, LocalLauncher("e0", lambda: torch_engine_command(seed=0)))
        t0 = time.perf_counter()
        await engine.start()
        await engine.load_weights(str(weights), "v1")
        await engine.resume()
        cold.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        await engine.launcher.kill()
        await engine.mark_unhealthy("killed")
        await engine.recover()
        await engine.load_weights(str(weights), "v1")
        await engine.resume()
        recovery.append(time.perf_counter() - t0)
        assert engine.routable
        await engine.stop()
    return cold, recovery


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--interval", type=float, default=2.0)
    parser.add_argument("--timeout", type=float, default=2.0)
    parser.add_argument("--latency", type=float, default=0.1)
    args = parser.parse_args()

    ours, base = asyncio.run(p1(args.trials, args.interval, args.timeout))
    mo, mb = statistics.median(ours), statistics.median(base)
    print(f"P1 death -> Unhealthy ({args.trials} trials, interval {args.interval:g}s, timeout {args.timeout:g}s)")
    print(f"  ours (Ray/OS death report)   median {mo * 1000:8.1f} ms   (goal <= 500 ms)")
    print(f"  sequential poller (miles)    median {mb * 1000:8.1f} ms")
    print(f"  speed-up {mb / mo:6.1f}x (goal >= 20x)")

    conc, seq = asyncio.run(p2_simulated(64, args.latency))
    print(f"P2 one probe round, 64 simulated engines, probe latency {args.latency * 1000:.0f} ms")
    print(f"  concurrent {conc * 1000:8.1f} ms ({conc / args.latency:.2f} L)   sequential {seq * 1000:8.1f} ms")
    print(f"  speed-up {seq / conc:6.1f}x (goal >= 30x, round ~ L)")
    conc, seq = asyncio.run(p2_real(4))
    print("P2 one probe round, 4 real CPU engine processes (/health_generate = a real 1-token generation)")
    print(f"  concurrent {conc * 1000:8.1f} ms   sequential {seq * 1000:8.1f} ms   speed-up {seq / conc:5.2f}x")

    cold, rec = asyncio.run(p6(max(2, args.trials // 2)))
    mc, mr = statistics.median(cold), statistics.median(rec)
    print("P6 recovery (kill -> Serving with current weights) vs cold start")
    print(f"  cold start median {mc:6.2f} s   recovery median {mr:6.2f} s   ratio {mr / mc:.2f}x (goal <= 1.5x)")


if __name__ == "__main__":
    main()
