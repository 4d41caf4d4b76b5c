"""Engine benchmarks P1, P2, P6 (Engines issue), each a ratio against a baseline of the same run.

P1  process death -> Unhealthy: our path (the launcher's death watcher reports it; the core marks it)
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
from engines.errors import EngineError
from engines.health import HealthMonitor
from engines.launcher import LocalLauncher, launcher_factory
from engines.models import TinyCausalLM
from engines.process import torch_engine_command
from lifecycle import LifecycleConfig
from lifecycle.decide.core import ROLLOUT, Command, Outcome
from lifecycle.decide.runner import Runner
from rollout.executor import RolloutManager
from rollout.pattern import PatternTask


def _weights() -> tuple[str, str]:
    path = TinyCausalLM("tiny", seed=3).save_pretrained(Path(tempfile.mkdtemp()) / "step-3")
    return str(path), "v1"


def _manager(interval: float, timeout: float, engines: int) -> tuple[RolloutManager, Runner]:
    """A rollout manager on real CPU engines under rollout FT; the trainer's part answers at once."""
    cfg = LifecycleConfig.from_mapping(
        {**config(interval, timeout).to_dict(), "rollout_num_gpus": engines, "engine_max_restarts": 100}
    )
    runner = Runner(cfg)

    async def done(cmd: Command) -> Outcome:
        return Outcome("done")

    runner.provide({f"trainer.{e}": done for m, e in runner.core.commands() if m == "trainer"})
    manager = RolloutManager(cfg, PatternTask(), runner=runner, launcher_factory=launcher_factory("local"))
    return manager, runner


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


async def p1_ours(phase: float, interval: float, timeout: float) -> float:
    """Seconds from SIGKILL of one of two real engines until the core has it Unhealthy (the real runtime:
    the launcher's death watcher reports ``died``, the core moves the engine)."""
    manager, runner = _manager(interval, timeout, engines=2)
    marked = asyncio.Event()
    runner.watch(lambda m: marked.set() if m.instance == "engine-1" and m.dst == "Unhealthy" else None)
    try:
        await manager.init(_weights())
        await manager.runner.operate("generate")  # the monitor is running, as during a rollout
        await asyncio.sleep(interval * phase)  # kill at varying phases of the probe period
        t0 = time.perf_counter()
        await manager.controller.engines[1].launcher.kill()
        await asyncio.wait_for(marked.wait(), 60)
        return time.perf_counter() - t0
    finally:
        await manager.dispose()


async def p1_baseline(phase: float, interval: float, timeout: float) -> float:
    """The same death found by miles' sequential poller."""
    launchers = [LocalLauncher(f"e{i}", lambda i=i: torch_engine_command(seed=i)) for i in range(2)]
    urls = await asyncio.gather(*(lch.launch() for lch in launchers))
    clients = [EngineClient(u, engine_id=f"e{i}", timeout=timeout) for i, u in enumerate(urls)]
    dead = asyncio.Event()
    found: list[str] = []
    task = asyncio.create_task(sequential_poller(clients, interval, timeout, dead, found))
    await asyncio.sleep(interval * phase)
    t0 = time.perf_counter()
    await launchers[1].kill()
    await asyncio.wait_for(dead.wait(), 60)
    elapsed = time.perf_counter() - t0
    task.cancel()
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
        ours.append(await p1_ours(phase, interval, timeout))
        base.append(await p1_baseline(phase, interval, timeout))
    return ours, base


async def probe_rounds(clients: list[EngineClient]) -> tuple[float, float]:
    """One concurrent monitor round vs the same probes one after another (warm pools); closes the clients."""

    async def report(outcome: Outcome) -> None:
        return None

    monitor = HealthMonitor(config(interval=10.0, timeout=5.0), report)
    for i, c in enumerate(clients):

        async def probe(t: float, c: EngineClient = c) -> Outcome:
            await c.health_generate(timeout=t)
            return Outcome("probe_ok")

        monitor.add_engine((ROLLOUT, i), probe)
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
    """Cold start (launch, load, serve) vs recovery (SIGKILL -> Unhealthy -> recover, restart, catch up,
    serve), both through the real runtime on one CPU engine."""
    cold: list[float] = []
    recovery: list[float] = []
    for _ in range(trials):
        manager, runner = _manager(2.0, 2.0, engines=1)
        try:
            t0 = time.perf_counter()
            await manager.init(_weights())
            await runner.operate("generate")
            assert runner.state.engines[0].state == "Serving"
            cold.append(time.perf_counter() - t0)
            await runner.operate("generate_done")
            t0 = time.perf_counter()
            await manager.controller.kill_engine(0)
            await runner.operate("generate")  # recovers, catches up, routes
            assert runner.state.engines[0].state == "Serving"
            recovery.append(time.perf_counter() - t0)
            await runner.operate("generate_done")
        finally:
            await manager.dispose()
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
