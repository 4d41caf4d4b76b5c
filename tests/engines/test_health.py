"""The health monitor's mechanics: concurrency, threshold, stale results after a pause, grace, jitter, stop.

Probes here are coroutines with real latency (asyncio.sleep) and the monitor's reports are collected
as they would reach the runner; what a report *does* (mark, count, discard) is the core's, tested in
``tests/lifecycle/test_core.py`` and, with real engines, in ``tests/rollout``.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from engines.health import HealthMonitor
from lifecycle import LifecycleConfig
from lifecycle.core import Command, Outcome

pytestmark = pytest.mark.monitor
CMD = Command("resume_monitor", "monitor", "monitor")


def _config(**kw: object) -> LifecycleConfig:
    base = {
        "use_fault_tolerance": True,
        "rollout_num_gpus": 2,
        "rollout_health_check_interval": 0.05,
        "rollout_health_check_timeout": 0.05,
        "rollout_health_check_failure_threshold": 2,
        "rollout_health_check_jitter": 0.0,
    }
    return LifecycleConfig.from_mapping({**base, **kw}, check_paths=False)


def _ok(latency: float = 0.0):
    async def probe(timeout: float) -> Outcome:
        await asyncio.sleep(latency)
        return Outcome("probe_ok")

    return probe


def _failing(latency: float = 0.0):
    async def probe(timeout: float) -> Outcome:
        await asyncio.sleep(latency)
        return Outcome("probe_failed", reason="connection refused")

    return probe


def _monitor(config: LifecycleConfig) -> tuple[HealthMonitor, list[Outcome]]:
    reports: list[Outcome] = []

    async def report(outcome: Outcome) -> None:
        reports.append(outcome)

    return HealthMonitor(config, report), reports


def test_probes_run_concurrently_so_a_round_costs_one_latency():
    """All 16 probes of a round are in flight together (sequential probing would have one at a time);
    the time it saves is measured by benchmarks/bench_engines.py (P2), not asserted here."""
    in_flight, most = 0, 0

    async def probe(timeout: float) -> Outcome:
        nonlocal in_flight, most
        in_flight += 1
        most = max(most, in_flight)
        await asyncio.sleep(0.02)
        in_flight -= 1
        return Outcome("probe_ok")

    async def run() -> None:
        monitor, _ = _monitor(_config(rollout_health_check_interval=1.0, rollout_health_check_timeout=1.0))
        for i in range(16):
            monitor.add_engine(("rollout", i), probe)
        await monitor.probe_round()

    asyncio.run(run())
    assert most == 16


def test_threshold_of_consecutive_failures_is_reported_once():
    async def run() -> list[Outcome]:
        monitor, reports = _monitor(_config())
        monitor.add_engine(("rollout", 0), _ok())
        monitor.add_engine(("rollout", 1), _failing())
        await monitor.resume(CMD)
        await asyncio.sleep(0.5)
        await monitor.stop()
        return reports

    reports = asyncio.run(run())
    verdicts = [(o.name, o.engine) for o in reports if o.name != "probe"]
    assert verdicts == [("probe_failed", 1), ("threshold_reached", 1)]  # the first failure only counts
    last = next(o for o in reports if o.name == "threshold_reached")
    assert "2 consecutive failed probes" in last.reason and "connection refused" in last.reason
    assert sum(o.name == "probe" for o in reports) >= 2  # one probe round report per round


def test_only_consecutive_failures_count_a_success_starts_the_count_again():
    """fail, ok, fail, ok, fail never reaches a threshold of 2 (a flaky but healthy engine stays); fail, fail does.
    Rounds are driven one by one (no sleeps): the probe answers from a script, whoever sends it."""
    script = ["failed", "ok", "failed", "ok", "failed", "failed"]

    async def probe(timeout: float) -> Outcome:
        answer = script.pop(0)
        return Outcome("probe_ok") if answer == "ok" else Outcome("probe_failed", reason=f"answer {len(script)}")

    async def run() -> list[Outcome]:
        monitor, reports = _monitor(_config(rollout_health_check_interval=3600.0, rollout_health_check_timeout=5.0))
        monitor.add_engine(("rollout", 0), probe)
        await monitor.resume(CMD)  # running; its own loop sends the first round, then sleeps an hour
        while script and monitor.members:  # a marked engine leaves the monitor
            await monitor.probe_round()
        await monitor.stop()
        return reports

    verdicts = [o.name for o in asyncio.run(run()) if o.name != "probe"]
    assert verdicts == ["probe_failed"] * 3 + ["threshold_reached"]  # a success is not reported
    assert not script


def test_a_marked_engine_is_not_probed_again():
    async def run() -> HealthMonitor:
        monitor, _ = _monitor(_config())
        monitor.add_engine(("rollout", 0), _failing())
        await monitor.resume(CMD)
        await asyncio.sleep(0.4)
        await monitor.stop()
        return monitor

    monitor = asyncio.run(run())
    assert monitor.members == ()


def test_a_probe_failure_returning_after_a_pause_is_reported_as_stale():
    async def run() -> list[Outcome]:
        monitor, reports = _monitor(_config(rollout_health_check_failure_threshold=1))
        monitor.add_engine(("rollout", 0), _failing(latency=0.03))
        await monitor.resume(CMD)
        await asyncio.sleep(0.01)  # the first probe is in flight
        await monitor.pause(CMD)
        await asyncio.sleep(0.1)  # it fails after the pause
        await monitor.stop()
        return reports

    reports = asyncio.run(run())
    assert [o.name for o in reports if o.name != "probe"] == ["stale_result"]


def test_startup_grace_delays_the_first_probe():
    async def run() -> tuple[float, list[float]]:
        calls: list[float] = []

        async def probe(timeout: float) -> Outcome:
            calls.append(time.perf_counter())
            return Outcome("probe_ok")

        monitor, _ = _monitor(_config(rollout_health_check_first_wait=0.3))
        t0 = time.perf_counter()
        monitor.add_engine(("rollout", 0), probe)
        await monitor.resume(CMD)
        await asyncio.sleep(0.5)
        await monitor.stop()
        return t0, calls

    t0, calls = asyncio.run(run())
    assert calls, "probed after the grace period"
    assert calls[0] - t0 >= 0.29


def test_jitter_keeps_the_period_within_bounds():
    config = _config(
        rollout_health_check_interval=10.0, rollout_health_check_timeout=1.0, rollout_health_check_jitter=0.2
    )
    monitor, _ = _monitor(config)
    periods = [monitor._period() for _ in range(200)]
    assert min(periods) >= 8.0 and max(periods) <= 12.0
    assert max(periods) - min(periods) > 1.0  # it does vary


def test_stop_ends_every_probe_loop_also_one_a_pause_left_sleeping():
    """A pause lets the probe loop finish its sleep; stop must not leave it pending (a leaked task)."""

    async def run() -> tuple[list[bool], int]:
        monitor, _ = _monitor(_config(rollout_health_check_interval=30.0, rollout_health_check_timeout=1.0))
        monitor.add_engine(("rollout", 0), _ok())
        await monitor.resume(CMD)
        await asyncio.sleep(0.05)  # one round done, now sleeping 30 s
        loops = list(monitor._loops)
        await monitor.pause(CMD)
        await monitor.resume(CMD)  # a second loop while the first still sleeps
        loops += [t for t in monitor._loops if t not in loops]
        await monitor.stop()
        return [t.done() for t in loops], len(monitor._loops)

    done, left = asyncio.run(run())
    assert len(done) == 2 and all(done) and left == 0


def test_a_probe_that_runs_out_of_its_timeout_is_a_failure():
    async def run() -> list[Outcome]:
        monitor, reports = _monitor(_config(rollout_health_check_failure_threshold=1))
        monitor.add_engine(("rollout", 0), _ok(latency=1.0))  # never answers within 0.05 s
        await monitor.resume(CMD)
        await asyncio.sleep(0.2)
        await monitor.stop()
        return reports

    reports = asyncio.run(run())
    (verdict,) = [o for o in reports if o.name != "probe"]
    assert verdict.name == "threshold_reached" and "no answer within 0.05s" in verdict.reason
