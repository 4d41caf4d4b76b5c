"""The health monitor's semantics: concurrency, threshold, pause discards, death, grace, gating.

Probes here are coroutines with real latency (asyncio.sleep) -- the unit under test is the
monitor's timing logic; tests against real engine processes live with the engine tests.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from engines.health import HealthMonitor, create_monitor
from lifecycle import EffectLedger, LifecycleConfig


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
    async def probe(timeout: float) -> None:
        await asyncio.sleep(latency)

    return probe


def _failing(latency: float = 0.0):
    async def probe(timeout: float) -> None:
        await asyncio.sleep(latency)
        raise ConnectionError("connection refused")

    return probe


async def _monitor(config: LifecycleConfig, ledger: EffectLedger | None = None):
    marked: list[tuple[str, str]] = []
    monitor = await create_monitor(config, "rollout", lambda e, r: marked.append((e, r)), ledger=ledger)
    assert monitor is not None
    return monitor, marked


@pytest.mark.monitor
def test_probes_run_concurrently_so_a_round_costs_one_latency():
    """All 16 probes of a round are in flight together (sequential probing would have one at a time);
    the time it saves is measured by benchmarks/bench_engines.py (P2), not asserted here."""
    in_flight, most = 0, 0

    async def probe(timeout: float) -> None:
        nonlocal in_flight, most
        in_flight += 1
        most = max(most, in_flight)
        await asyncio.sleep(0.05)
        in_flight -= 1

    async def run() -> None:
        config = _config(rollout_health_check_interval=1.0, rollout_health_check_timeout=1.0)
        monitor, _ = await _monitor(config)
        for i in range(16):
            monitor.add_engine(f"engine-{i}", probe)
        await monitor.machine.fire("resume")  # Running, without the background loop
        await monitor.probe_round()

    asyncio.run(run())
    assert most == 16


def test_threshold_of_consecutive_failures_marks_the_engine_once():
    async def run():
        ledger = EffectLedger()
        monitor, marked = await _monitor(_config(), ledger)
        monitor.add_engine("engine-0", _ok())
        monitor.add_engine("engine-1", _failing())
        await monitor.resume()
        await asyncio.sleep(0.5)
        await monitor.stop()
        return ledger, marked

    ledger, marked = asyncio.run(run())
    assert [e for e, _ in marked] == ["engine-1"]
    assert "2 consecutive failed probes" in marked[0][1] and "connection refused" in marked[0][1]
    assert ledger.count("count_probe_failure") == 1
    assert ledger.count("mark_engine_unhealthy") == 1
    assert ledger.count("probe_engine") >= 2


@pytest.mark.monitor
def test_a_probe_failure_returning_after_pause_is_discarded():
    async def run():
        ledger = EffectLedger()
        monitor, marked = await _monitor(
            _config(
                rollout_health_check_failure_threshold=1,
                rollout_health_check_timeout=0.05,
                rollout_health_check_interval=0.05,
            ),
            ledger,
        )
        monitor.add_engine("engine-0", _failing(latency=0.03))
        await monitor.resume()
        await asyncio.sleep(0.01)  # the first probe is in flight
        await monitor.pause()
        await asyncio.sleep(0.1)  # it fails after the pause
        return monitor, ledger, marked

    monitor, ledger, marked = asyncio.run(run())
    assert marked == []
    assert monitor.discarded == 1
    assert ledger.count("discard_probe_result") == 1
    assert ledger.count("mark_engine_unhealthy") == 0


def test_death_is_acted_on_at_once_even_while_paused():
    async def run():
        ledger = EffectLedger()
        monitor, marked = await _monitor(_config(), ledger)
        monitor.add_engine("engine-0", _ok())
        assert monitor.state == "Paused"
        await monitor.engine_died("engine-0", "exit code -9")  # no probe round in between: it acts now
        return monitor.health("engine-0").probes if "engine-0" in monitor._engines else 0, marked

    probes, marked = asyncio.run(run())
    assert marked == [("engine-0", "process died: exit code -9")]
    assert probes == 0


@pytest.mark.monitor
def test_startup_grace_delays_the_first_probe():
    async def run():
        calls: list[float] = []

        async def probe(timeout: float) -> None:
            calls.append(time.perf_counter())

        monitor, _ = await _monitor(_config(rollout_health_check_first_wait=0.3))
        t0 = time.perf_counter()
        monitor.add_engine("engine-0", probe)
        await monitor.resume()
        await asyncio.sleep(0.5)
        await monitor.stop()
        return t0, calls

    t0, calls = asyncio.run(run())
    assert calls, "probed after the grace period"
    assert calls[0] - t0 >= 0.29


def test_jitter_keeps_the_period_within_bounds():
    monitor = HealthMonitor(
        _config(rollout_health_check_interval=10.0, rollout_health_check_timeout=1.0, rollout_health_check_jitter=0.2),
        "g",
        lambda e, r: None,
    )
    periods = [monitor._period() for _ in range(200)]
    assert min(periods) >= 8.0 and max(periods) <= 12.0
    assert max(periods) - min(periods) > 1.0  # it does vary


@pytest.mark.parametrize(
    "flags",
    [
        {"ft_components": ["train"]},  # train-only FT: no monitor, no probe
        {"use_fault_tolerance": False},
        {"debug_train_only": True},
    ],
)
@pytest.mark.monitor
def test_no_monitor_without_monitors_rollout(flags):
    async def run():
        ledger = EffectLedger()
        monitor = await create_monitor(_config(**flags), "rollout", lambda e, r: None, ledger=ledger)
        return monitor, ledger

    monitor, ledger = asyncio.run(run())
    assert monitor is None
    assert len(ledger) == 0


@pytest.mark.monitor
def test_stop_ends_every_probe_loop_also_one_a_pause_left_sleeping():
    """A pause lets the probe loop finish its sleep; stop must not leave it pending (a leaked task)."""

    async def run() -> tuple[list[bool], int]:
        config = _config(rollout_health_check_interval=30.0, rollout_health_check_timeout=1.0)
        monitor, _ = await _monitor(config)
        monitor.add_engine("engine-0", _ok())
        await monitor.resume()
        await asyncio.sleep(0.05)  # one round done, now sleeping 30 s
        loops = list(monitor._loops)
        await monitor.pause()
        await monitor.resume()  # a second loop while the first still sleeps
        loops += [t for t in monitor._loops if t not in loops]
        await monitor.stop()
        return [t.done() for t in loops], len(monitor._loops)

    done, left = asyncio.run(run())
    assert len(done) == 2 and all(done) and left == 0
