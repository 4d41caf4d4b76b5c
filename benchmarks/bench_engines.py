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
import functools
import statistics
import tempfile
import time

from aiohttp import web

from engines.client import EngineClient
from engines.errors import EngineError
from engines.health import HealthMonitor
from engines.launcher import LocalLauncher
from engines.process import torch_engine_command
from lifecycle import LifecycleConfig
from lifecycle.decide.core import ROLLOUT, Outcome
from rollout.pattern import PatternTask
from trainer.app import Job, RunOptions


def _job(interval: float, timeout: float, engines: int, run_dir: str) -> Job:
    """A run under rollout FT on real CPU engine processes (local launcher, no router), assembled as every
    run is (:class:`trainer.app.Job`): the trainer group is real but idle -- only the engine side is timed."""
    cfg = LifecycleConfig.from_mapping(
        {**config(interval, timeout).to_dict(), "rollout_num_gpus": engines, "engine_max_restarts": 100}
    )
    return Job(cfg, PatternTask(), run_dir=run_dir, options=RunOptions(launcher="local", router=False))


def _entered(job: Job, instance: str, state: str) -> asyncio.Event:
    """Set when ``instance`` enters ``state`` (cleared by the caller between trials)."""
    event = asyncio.Event()
    job.runner.watch(lambda m: event.set() if m.instance == instance and m.dst == state else None)
    return event


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


async def p1_ours(phases: list[float], interval: float, timeout: float) -> list[float]:
    """Seconds from SIGKILL of one of two real engines until the core has it Unhealthy (the real runtime:
    the launcher's death watcher reports ``died``, the core moves the engine), once per phase of the probe
    period; between trials the next rollout recovers the engine (rollout FT)."""
    out: list[float] = []
    with tempfile.TemporaryDirectory() as run_dir:
        async with _job(interval, timeout, engines=2, run_dir=run_dir) as job:
            marked = _entered(job, "engine-1", "Unhealthy")
            for phase in phases:
                marked.clear()
                await job.runner.operate("generate")  # the monitor is running, as during a rollout
                await asyncio.sleep(interval * phase)  # kill at varying phases of the probe period
                t0 = time.perf_counter()
                await job.manager.controller.engines[1].launcher.kill()
                await asyncio.wait_for(marked.wait(), 60)
                out.append(time.perf_counter() - t0)
                await job.runner.operate("generate_done")
    return out


async def p1_baseline(phase: float, interval: float, timeout: float) -> float:
    """The same death found by miles' sequential poller."""
    launchers = [LocalLauncher(f"e{i}", functools.partial(torch_engine_command, seed=i)) for i in range(2)]
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
    phases = [0.1 + 0.8 * ((trial * 0.37) % 1) for trial in range(trials)]
    ours = await p1_ours(phases, interval, timeout)
    base = [await p1_baseline(phase, interval, timeout) for phase in phases]
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
    launchers = [LocalLauncher(f"e{i}", functools.partial(torch_engine_command, seed=i)) for i in range(n)]
    urls = await asyncio.gather(*(lch.launch() for lch in launchers))
    clients = [EngineClient(u, engine_id=f"e{i}", timeout=10) for i, u in enumerate(urls)]
    concurrent, sequential = await probe_rounds(clients)
    for lch in launchers:
        await lch.kill()
    return concurrent, sequential


async def p6(trials: int) -> tuple[list[float], list[float]]:
    """Cold start (launch, load, serve: Starting -> Serving) vs recovery (SIGKILL -> Unhealthy -> recover,
    restart, catch up, serve), both through the real runtime on one CPU engine, timed from the core's moves."""
    timed = [await _p6_trial() for _ in range(trials)]
    return [cold for cold, _ in timed], [recovery for _, recovery in timed]


async def _p6_trial() -> tuple[float, float]:
    with tempfile.TemporaryDirectory() as run_dir:
        job = _job(2.0, 2.0, engines=1, run_dir=run_dir)
        started: list[float] = []
        job.log.add_sink(lambda e: started.append(time.perf_counter()) if _starting(e) else None)
        async with job:
            serving = _entered(job, "engine-0", "Serving")
            await job.runner.operate("generate")
            await serving.wait()
            cold = time.perf_counter() - started[0]
            await job.runner.operate("generate_done")
            serving.clear()
            t0 = time.perf_counter()
            await job.manager.controller.kill_engine(0)
            await job.runner.operate("generate")  # recovers, catches up, routes
            await serving.wait()
            recovery = time.perf_counter() - t0
            await job.runner.operate("generate_done")
    return cold, recovery


def _starting(event: dict[str, object]) -> bool:
    """engine-0's launch: its first move into Starting (the log exists before the job starts)."""
    return event.get("instance") == "engine-0" and event.get("dst") == "Starting"


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
