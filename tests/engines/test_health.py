"""The health monitor's mechanics: concurrency, threshold, stale results after a pause, grace, jitter, stop.

The monitor runs on a fake time source (its ``clock`` and ``sleep``), so every round is driven exactly;
its reports are collected as they would reach the runner; what a report *does* (mark, count, discard) is
the core's, tested in ``tests/lifecycle/decide/test_core.py`` and, with real engines, in ``tests/rollout``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from engines.health import HealthMonitor
from lifecycle import LifecycleConfig
from lifecycle.decide.core import Command, Outcome

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


class FakeTime:
    """The monitor's clock and sleep as one fake time source: a sleep moves ``now`` on by its length at once
    (``hold``: it lasts until cancelled), so each test drives the probe rounds exactly, with no real-time race."""

    def __init__(self, *, hold: bool = False) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []
        self.hold = hold

    def clock(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        if self.hold:
            await asyncio.Future()
        self.now += seconds
        await asyncio.sleep(0)  # let the test look between two rounds


async def until(done: Callable[[], bool], turns: int = 10_000) -> None:
    """Let the event loop run until ``done``; a bounded number of turns, not of seconds."""
    for _ in range(turns):
        if done():
            return
        await asyncio.sleep(0)
    raise AssertionError(f"not done after {turns} turns of the event loop")


def _monitor(config: LifecycleConfig, time: FakeTime | None = None) -> tuple[HealthMonitor, list[Outcome]]:
    reports: list[Outcome] = []

    async def report(outcome: Outcome) -> None:
        reports.append(outcome)

    if time is None:
        return HealthMonitor(config, report), reports
    return HealthMonitor(config, report, clock=time.clock, sleep=time.sleep), reports


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
        clock = FakeTime()
        monitor, reports = _monitor(_config(), clock)
        monitor.add_engine(("rollout", 0), _ok())
        monitor.add_engine(("rollout", 1), _failing())
        await monitor.resume(CMD)
        await until(lambda: any(o.name == "threshold_reached" for o in reports))
        marked_at = len(clock.sleeps)
        await until(lambda: len(clock.sleeps) >= marked_at + 3)  # three more rounds: no second verdict
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
    probes = 0

    async def probe(timeout: float) -> Outcome:
        nonlocal probes
        probes += 1
        return Outcome("probe_failed", reason="connection refused")

    async def run() -> HealthMonitor:
        clock = FakeTime()
        monitor, _ = _monitor(_config(), clock)
        monitor.add_engine(("rollout", 0), probe)
        await monitor.resume(CMD)
        await until(lambda: not monitor.members)
        marked_at = len(clock.sleeps)
        await until(lambda: len(clock.sleeps) >= marked_at + 3)  # three more rounds
        await monitor.stop()
        return monitor

    monitor = asyncio.run(run())
    assert monitor.members == () and probes == 2  # the threshold's two, none after


def test_a_probe_failure_returning_after_a_pause_is_reported_as_stale():
    """The probe is held in flight until the monitor has been paused, then fails: a stale result, not a count."""

    async def run() -> list[Outcome]:
        sent, answer = asyncio.Event(), asyncio.Event()

        async def probe(timeout: float) -> Outcome:
            sent.set()
            await answer.wait()
            return Outcome("probe_failed", reason="connection refused")

        monitor, reports = _monitor(_config(rollout_health_check_failure_threshold=1), FakeTime())
        monitor.add_engine(("rollout", 0), probe)
        await monitor.resume(CMD)
        await sent.wait()  # the first probe is in flight
        await monitor.pause(CMD)
        answer.set()  # it fails after the pause
        await until(lambda: any(o.name != "probe" for o in reports))
        await monitor.stop()
        return reports

    reports = asyncio.run(run())
    assert [o.name for o in reports if o.name != "probe"] == ["stale_result"]


def test_startup_grace_delays_the_first_probe():
    async def run() -> tuple[list[float], list[float]]:
        clock = FakeTime()
        calls: list[float] = []

        async def probe(timeout: float) -> Outcome:
            calls.append(clock.now)
            return Outcome("probe_ok")

        monitor, _ = _monitor(_config(rollout_health_check_interval=0.25, rollout_health_check_first_wait=1.0), clock)
        monitor.add_engine(("rollout", 0), probe)
        await monitor.resume(CMD)
        await until(lambda: bool(calls))
        await monitor.stop()
        return calls, clock.sleeps

    calls, sleeps = asyncio.run(run())
    assert calls[0] == 1.0  # the first round due after the grace, none before it
    assert sleeps[:4] == [0.25] * 4


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
        clock = FakeTime(hold=True)  # every sleep lasts until it is cancelled
        monitor, _ = _monitor(_config(rollout_health_check_interval=30.0, rollout_health_check_timeout=1.0), clock)
        monitor.add_engine(("rollout", 0), _ok())
        await monitor.resume(CMD)
        await until(lambda: len(clock.sleeps) == 1)  # one round done, now sleeping 30 s
        loops = list(monitor._loops)
        await monitor.pause(CMD)
        await monitor.resume(CMD)  # a second loop while the first still sleeps
        await until(lambda: len(clock.sleeps) == 2)
        loops += [t for t in monitor._loops if t not in loops]
        await monitor.stop()
        return [t.done() for t in loops], len(monitor._loops)

    done, left = asyncio.run(run())
    assert len(done) == 2 and all(done) and left == 0


def test_a_probe_that_runs_out_of_its_timeout_is_a_failure():
    """The per-probe bound is the event loop's own timer (``asyncio.wait_for``); the probe never answers."""

    async def run() -> list[Outcome]:
        verdict = asyncio.Event()
        reports: list[Outcome] = []

        async def report(outcome: Outcome) -> None:
            reports.append(outcome)
            if outcome.name != "probe":
                verdict.set()

        async def never(timeout: float) -> Outcome:
            await asyncio.Future()  # never answers
            raise AssertionError("unreachable")

        monitor = HealthMonitor(
            _config(rollout_health_check_failure_threshold=1), report, sleep=FakeTime(hold=True).sleep
        )
        monitor.add_engine(("rollout", 0), never)
        await monitor.resume(CMD)
        await verdict.wait()
        await monitor.stop()
        return reports

    reports = asyncio.run(run())
    (verdict,) = [o for o in reports if o.name != "probe"]
    assert verdict.name == "threshold_reached" and "no answer within 0.05s" in verdict.reason
