"""benchmarks/bench_streaming.py's measurements, on made-up data and against a real CPU engine's load report, so the
benchmark (run by hand) cannot rot: the occupancy arithmetic, the lag distribution, the table's ratios, the hooks on
the loop's step functions and the routings, and the engine's own ``/server_info`` load fields."""

from __future__ import annotations

import asyncio
import importlib.util
import sys
from collections import Counter
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest

from engines.client import EngineClient
from engines.protocol import SamplingParams

PATH = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_streaming.py"


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_streaming_under_test", PATH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve their annotations through it
    spec.loader.exec_module(module)
    return module


def test_occupancy_holds_each_poll_until_the_next_and_clips_to_the_window(bench: ModuleType) -> None:
    load = bench.Load
    loads = [
        load(0.0, "e0", 0, False),  # idle from 0 (counted from 0.5, the window's start)
        load(1.0, "e0", 2, False),  # generating 1 s
        load(2.0, "e0", 2, True),  # held (paused with its requests) until the window's end at 3
        load(1.5, "e1", 0, False),  # e1: idle from its first poll only
    ]
    occ = bench.occupancy(loads, 0.5, 3.0)
    assert (occ["e0"].idle, occ["e0"].generating, occ["e0"].held) == (0.5, 1.0, 1.0)
    assert (occ["e1"].idle, occ["e1"].seconds) == (1.5, 1.5)
    assert occ["e0"].share("idle") == pytest.approx(0.2)
    assert bench.occupancy([load(5.0, "e0", 1, False)], 0.0, 3.0)["e0"].seconds == 0.0  # after the window


def test_uncovered_is_the_window_less_the_union_of_the_calls(bench: ModuleType) -> None:
    calls = [(1.0, 3.0), (2.0, 4.0), (6.0, 12.0), (-1.0, 0.5)]  # overlapping, and out of the window [0, 10]
    assert bench.uncovered(calls, 0.0, 10.0) == 0.5 + 2.0
    assert bench.uncovered([], 0.0, 10.0) == 10.0


def test_lag_distributions(bench: ModuleType) -> None:
    rows = [{"samples": 16, "staleness": [0, 1]}, {"samples": 8, "staleness": [1]}, {"samples": 8}]
    assert bench.lag_distribution(rows) == Counter({1: 2, 0: 1})
    assert bench.lockstep_lags(rows, 8, async_mode=False) == Counter({0: 4})
    assert bench.lockstep_lags(rows, 8, async_mode=True) == Counter({0: 2, 1: 2})  # step 0 on the initial weights


def run_of(bench: ModuleType, mode: str, seconds: float, idle: float, lags: dict[int, int]) -> Any:
    engines = {"e0": bench.Occupancy(idle=idle * seconds, generating=(1 - idle) * seconds)}
    rewards = [0.1] * 5 + [0.7] * 5
    return bench.Run(mode, seconds, 320, 400, engines, seconds / 4, rewards, Counter(lags), 3, 8)


def test_the_table_prints_ratios_against_the_same_runs_lock_step(bench: ModuleType) -> None:
    lock, stream = bench.Summary("lock-step"), bench.Summary("stream K=1")
    lock.runs.append(run_of(bench, "lock-step", 20.0, 0.4, {0: 40}))
    stream.runs.append(run_of(bench, "stream K=1", 10.0, 0.1, {0: 10, 1: 30}))
    text = bench.table([lock, stream])
    lock_row, stream_row = text.splitlines()[2:]
    assert (
        "| 16.0 (1.00x) | 20.0 (1.00x) | 40.0% (1.00x) | 0.0% | 25.0% |" in lock_row and "(by construction)" in lock_row
    )
    assert "| 32.0 (2.00x) | 40.0 (2.00x) | 10.0% (0.25x) |" in stream_row
    assert "0.100 → 0.700" in stream_row and "| 0: 10, 1: 30 | 3 |" in stream_row
    lock.runs.append(run_of(bench, "lock-step", 40.0, 0.4, {0: 40}))  # a second, slower round: its range shows
    assert "| 10.7 (1.00x; rounds 8-16) |" in bench.table([lock, stream]).splitlines()[2]


def test_the_hooks_find_the_loops_step_functions_and_count_answers_in_the_window(bench: ModuleType) -> None:
    from rollout import routing
    from trainer.app import loop

    originals = [getattr(loop, name) for name in bench.STEP_FUNCTIONS]
    generate = routing.LocalRouting.generate
    rec = bench.Recorder(poll=0.01)
    with bench.hooked(rec):
        assert [getattr(loop, n) for n in bench.STEP_FUNCTIONS] != originals
        assert routing.LocalRouting.generate is not generate
    assert [getattr(loop, n) for n in bench.STEP_FUNCTIONS] == originals
    assert routing.LocalRouting.generate is generate

    def answer(finish: str) -> Any:
        return SimpleNamespace(
            response=SimpleNamespace(meta_info=SimpleNamespace(finish_reason=SimpleNamespace(type=finish)))
        )

    async def fake_generate(*args: Any, **kwargs: Any) -> dict[int, Any]:
        return {0: answer("length"), 1: answer("abort"), 2: answer("stop")}

    engine = SimpleNamespace(id="e0", client=None)  # no server: polled, skipped
    job = SimpleNamespace(
        manager=SimpleNamespace(controller=SimpleNamespace(engines=[engine])), task=SimpleNamespace(group_size=8)
    )
    counting = bench.counted(rec, fake_generate)

    async def steps(opts: Any, job: Any) -> None:
        await counting()
        await asyncio.sleep(0.03)

    async def main() -> None:
        await counting()  # before the window: not counted
        await bench.windowed(rec, steps)(None, job)
        await counting()  # after it: not counted

    asyncio.run(main())
    assert rec.generated == 2 and rec.group_size == 8  # the aborted answer is sent again, not counted
    assert rec.start is not None and rec.end is not None and rec.end - rec.start >= 0.03
    assert len(rec.calls) == 1 and rec.start <= rec.calls[0][0] <= rec.calls[0][1] <= rec.end


def test_engine_load_reads_a_real_cpu_engines_own_report(bench: ModuleType, slow_engine: Any, support: Any) -> None:
    """Idle, a request in flight, it and a later one held while paused in place (running and waiting), idle again."""

    async def main() -> list[tuple[int, bool]]:
        seen = []
        async with EngineClient(slow_engine.url, engine_id="slow-0", timeout=20.0) as client:
            seen.append(await bench.engine_load(client))
            params = SamplingParams(max_new_tokens=40, temperature=0.0, ignore_eos=True)
            task = asyncio.create_task(client.generate("Once", sampling_params=params))

            async def running() -> bool:
                return bool((await support.internal_state(client))["num_running_reqs"] >= 1)

            await support.wait_for(running, what="a running request")
            seen.append(await bench.engine_load(client))
            await client.pause_generation("in_place")
            late = asyncio.create_task(client.generate("Twice", sampling_params={"max_new_tokens": 2}))

            async def queued() -> bool:
                return bool((await support.internal_state(client))["num_waiting_reqs"] >= 1)

            await support.wait_for(queued, what="a request waiting behind the pause")
            seen.append(await bench.engine_load(client))
            await client.continue_generation()
            await asyncio.gather(task, late)
            seen.append(await bench.engine_load(client))
        return seen

    assert asyncio.run(main()) == [(0, False), (1, False), (2, True), (0, False)]
