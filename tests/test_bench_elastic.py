"""benchmarks/bench_elastic.py's measurements, on hand-written event logs and a real CPU engine's own report, so the
benchmark (run by hand) cannot rot: a join's stages and its ratio to the cold start, a leave's stages and the
requests counted in its window, the routing hooks, and the engine's answered-request counter. The harness itself
(a real elastic job through SMG) runs in the slow suite."""

from __future__ import annotations

import asyncio
import importlib.util
import sys
from datetime import UTC, datetime
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest

from engines.client import EngineClient
from engines.protocol import SamplingParams

PATH = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_elastic.py"
T0 = 1_800_000_000.0  # the call's time in the hand-written logs


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_elastic_under_test", PATH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve their annotations through it
    spec.loader.exec_module(module)
    return module


def ts(seconds: float) -> str:
    """The log's timestamp ``seconds`` after the call."""
    return datetime.fromtimestamp(T0 + seconds, UTC).isoformat().replace("+00:00", "Z")


def move(at: float, instance: str, trigger: str, src: str, dst: str) -> dict[str, Any]:
    machine = "engine" if instance.startswith("engine") else instance
    return {
        "event": "lifecycle.transition",
        "ts": ts(at),
        "machine": machine,
        "instance": instance,
        "trigger": trigger,
        "src": src,
        "dst": dst,
    }


def routed(at: float, instance: str, done: float) -> dict[str, Any]:
    return {"event": "engine.routed", "ts": ts(at), "instance": instance, "done_at": ts(done)}


# engine-0 starts cold (before the call); engine-1 joins after it, is routed at the next generate
LOG = [
    move(-20.0, "engine-0", "start", "Init", "Starting"),
    move(-14.0, "engine-0", "ready", "Starting", "PendingWeights"),
    move(-14.0, "engine-0", "begin_update", "PendingWeights", "LoadingWeights"),
    move(-13.0, "engine-0", "finish_update", "LoadingWeights", "Quiesced"),
    move(-12.0, "engine-0", "resume", "Quiesced", "Serving"),
    routed(-11.9, "engine-0", -11.95),
    move(-10.0, "engine-0", "drain", "Serving", "Quiesced"),
    move(0.5, "engine-1", "join", "Init", "Joining"),
    move(4.5, "engine-1", "ready", "Joining", "PendingWeights"),
    move(4.5, "engine-1", "begin_update", "PendingWeights", "LoadingWeights"),
    move(5.0, "engine-1", "finish_update", "LoadingWeights", "Quiesced"),
    move(6.0, "engine-1", "resume", "Quiesced", "Serving"),
    routed(6.3, "engine-1", 6.2),
]


def test_a_joins_stages_from_the_call_and_the_cold_start_of_the_same_job(bench: ModuleType) -> None:
    counts = [(T0 + 5.5, 1), (T0 + 6.1, 1), (T0 + 7.0, 2)]  # one answer before the routing: a probe's, not counted
    w = bench.way_in(LOG, "engine-1", T0, counts)
    assert (w.launch, w.load, w.started) == pytest.approx((4.0, 0.5, 4.5))
    assert (w.quiesced, w.routed, w.answered) == pytest.approx((5.0, 6.2, 7.0))  # routed: the gateway's answer
    assert w.registration == pytest.approx(0.2)
    assert bench.way_in(LOG, "engine-1", T0 + 1.0) is None  # no launch after that time
    assert bench.way_in(LOG[:-5], "engine-1", T0) is None  # never got to Quiesced
    cold = bench.cold_starts(LOG)
    assert [(c.instance, c.launch, c.load) for c in cold] == [("engine-0", 6.0, 1.0)]
    rounds = [bench.Round("lock-step", cold, [("scale-up", w)], [])]
    row = bench.table(rounds).splitlines()[2]
    assert row == "| lock-step | scale-up (engine-1) | 7.00 | 4.00 | 0.50 | 0.20 | 5.00 | 6.20 | 7.00 | 0.64x |"
    assert "join launch + load 4.50 s vs cold start 7.00 s (0.64x)" in bench.summary(rounds)


def test_the_first_answer_is_the_first_rise_of_the_count_after_the_routing(bench: ModuleType) -> None:
    assert bench.first_answer([(1.0, 0), (2.0, 3), (3.0, 3), (4.0, 4)], 2.5) == 4.0
    assert bench.first_answer([(1.0, 0), (3.0, 1)], 2.5) == 3.0
    assert bench.first_answer([(3.0, 0), (4.0, 0)], 2.5) is None  # never answered
    assert bench.first_answer([(3.0, 1)], None) is None  # never routed


def test_when_reads_a_facts_done_time_only_when_asked(bench: ModuleType) -> None:
    e = routed(2.0, "engine-1", 1.5)
    assert bench.when(e) - T0 == pytest.approx(2.0)
    assert bench.when(e, done=True) - T0 == pytest.approx(1.5)
    assert bench.when({"ts": ts(3.0)}, done=True) - T0 == pytest.approx(3.0)  # no done_at: its own time


LEAVE = [
    *LOG,
    move(9.9, "engine-1", "pause", "Serving", "Paused"),  # before the call: a stream's update holds it
    move(10.0, "engine-1", "retire", "Paused", "Draining"),
    {"event": "engine.drained", "ts": ts(10.5), "instance": "engine-1", "seconds": 0.4, "timed_out": False},
    move(10.5, "engine-1", "drained", "Draining", "Retiring"),
    move(10.7, "engine-1", "retired", "Retiring", "Retired"),
    move(12.0, "engine-1", "join", "Retired", "Joining"),  # a replacement in the same slot: not this leave's
    move(15.0, "engine-1", "ready", "Joining", "PendingWeights"),
    move(16.0, "engine-1", "resume", "Quiesced", "Serving"),
    move(20.0, "engine-1", "retire", "Serving", "Draining"),
]  # fmt: skip


def test_a_leaves_stages_and_the_requests_of_its_window(bench: ModuleType) -> None:
    requests = bench.Requests(
        resent=[(T0 + 9.0, 5), (T0 + 10.2, 3), (T0 + 11.5, 2), (T0 + 12.0, 7)],  # before, in, in (1 s margin), after
        failed=[(T0 + 10.3, 1)],
    )
    x = bench.leave_of(LEAVE, "stream", "preempt", "engine-1", T0 + 9.95, 32, 7.0, requests)
    assert (x.found, x.in_flight, x.withdrawn) == ("Paused", 32, None)  # unrouted already: the later one not its own
    assert (x.draining, x.drain, x.stopped) == pytest.approx((0.05, 0.4, 0.75))
    assert (x.resent, x.failed, x.handed_back, x.timed_out) == (5, 1, 0, False)
    rows = bench.table([bench.Round("stream", [], [], [x])]).splitlines()
    assert (
        "| stream | preempt (engine-1) | Paused | 32 | unrouted already | 0.050 | 0.40 / 7 | 0 | 5 | 1 | 0.75 |" in rows
    )
    y = bench.leave_of(LEAVE, "stream", "scale-down", "engine-1", T0 + 19.0, 3, 10.0, requests)
    assert (y.found, y.withdrawn, y.drain, y.stopped) == ("Serving", pytest.approx(1.0), None, None)
    assert bench.state_at(LEAVE, "engine-1", T0) == "Init" and bench.state_at(LEAVE, "engine-1", T0 + 11) == "Retired"


def test_the_hooks_count_failed_tries_through_a_gateway_and_requests_left_after_the_routers_retries(
    bench: ModuleType,
) -> None:
    from rollout import routing

    requests = bench.Requests()
    gateways: set[int] = set()
    gateway, direct = SimpleNamespace(), SimpleNamespace()

    async def failing(self: Any, *args: Any, **kwargs: Any) -> Any:
        raise ConnectionError("upstream gone")

    async def answers_one(self: Any, todo: list[Any], *args: Any, **kwargs: Any) -> dict[int, Any]:
        return {0: "answer"}

    tried = bench.tried(requests, gateways, failing)
    counted = bench.counted(requests, gateways, answers_one)

    async def main() -> None:
        await counted(SimpleNamespace(gateway=gateway), [1, 2, 3])  # the router loop's tries spent: 2 failed
        await counted(SimpleNamespace(gateway=None), [1, 2], max_tries=1)  # a stream's: sent again, not failed
        for client in (gateway, direct):
            with pytest.raises(ConnectionError):
                await tried(client)

    asyncio.run(main())
    assert [n for _, n in requests.failed] == [2]
    assert [n for _, n in requests.resent] == [1] and "upstream gone" in requests.errors[0][1]  # the gateway's only
    saved = (routing.LocalRouting.generate, routing.RouterRouting.generate, EngineClient.generate)
    with bench.hooked(bench.Requests()):
        assert routing.RouterRouting.generate is not saved[1] and EngineClient.generate is not saved[2]
    assert (routing.LocalRouting.generate, routing.RouterRouting.generate, EngineClient.generate) == saved


def test_engine_counts_reads_a_real_cpu_engines_own_answered_count(bench: ModuleType, slow_engine: Any) -> None:
    """A request in flight is at the engine, not answered; once answered, the counter says so."""

    async def main() -> list[tuple[int, int]]:
        async with EngineClient(slow_engine.url, engine_id="slow-0", timeout=20.0) as client:
            before = await bench.engine_counts(client)
            params = SamplingParams(max_new_tokens=20, temperature=0.0, ignore_eos=True)
            task = asyncio.create_task(client.generate("Once", sampling_params=params))
            while (now := await bench.engine_counts(client))[0] < 1:
                assert not task.done(), "the request ended before it was seen at the engine"
                await asyncio.sleep(0.01)
            await task
            return [before, now, await bench.engine_counts(client)]

    before, during, after = asyncio.run(main())
    assert (during[0], during[1] - before[1]) == (1, 0)
    assert (after[0], after[1] - before[1]) == (0, 1)


@pytest.mark.slow
@pytest.mark.usefixtures("ray_cluster")
def test_the_harness_measures_a_lock_step_job(bench: ModuleType, tmp_path: Path) -> None:
    """One real lock-step job (CPU engines through SMG where installed): the scale-up and the replacement are timed
    from the call to the first answer, each leave found the engine Serving with requests, and none failed."""
    import argparse

    args = argparse.Namespace(seed=0, backend="cpu", notice=10.0, poll=0.02, keep=tmp_path)
    done = asyncio.run(bench.one_job(args, "lock-step", tmp_path / "run"))
    assert len(done.cold) == 1 and [what for what, _ in done.joins] == [
        "scale-up",
        "replacement (preempt during generate)",
    ]
    for _, w in done.joins:
        assert w.answered is not None and w.routed is not None and 0 < w.quiesced <= w.routed <= w.answered
    assert [x.kind.split(",")[0] for x in done.leaves] == ["preempt during generate", "scale-down during generate"]
    for x in done.leaves:
        assert x.found == "Serving" and x.in_flight > 0 and x.failed == 0, x
        assert x.drain is not None and x.drain <= x.bound and not x.timed_out and x.stopped is not None, x
    print(bench.table([done]))
