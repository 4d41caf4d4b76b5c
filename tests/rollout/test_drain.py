"""A leaving engine's drain on real parts: a CPU engine behind the real SMG gateway, withdrawn while a long request
it was forwarded runs. SMG drops the worker from its list at once (``GET /workers`` no longer names it) and still
answers the forwarded request; the controller's drain watches the engine's own running count to 0, bounded, and logs
``engine.drained``. A bound shorter than the request ends the drain timed out, with the count left, and -- in a
stream -- hands the request back (its caller gets it back aborted): never a hang."""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("smg")

from engines.drain import drain, parse_running, read_running
from engines.errors import EngineProtocolError
from engines.process import torch_engine_command
from lifecycle.decide.backends import RunningCount, capabilities
from lifecycle.decide.config import LifecycleConfig
from lifecycle.decide.core import ROLLOUT, Command
from lifecycle.decide.events import DRAINED, HANDED_BACK, EventLog, MemorySink
from lifecycle.decide.runner import Runner
from rollout.controller import DRAIN_MARGIN_S, InferenceController
from rollout.executor import RolloutManager
from rollout.routing import RouterRouting

from .conftest import routed_manager

pytestmark = pytest.mark.routing

N = 220  # new tokens (the tiny model's context is 256): 220 steps of 12 ms, ~2.6 s on its own
LONG = {"max_new_tokens": N, "ignore_eos": True, "temperature": 0.0}
CMD = Command("drain_requests", "engine", "engine-0", group=ROLLOUT, engine=0)


class Rig:
    """One CPU engine (12 ms per decode step) behind a real SMG gateway, launched and loaded by the lifecycle."""

    def __init__(self, tmp: Path) -> None:
        self.config = LifecycleConfig.from_mapping({"rollout_num_gpus": 1})
        self.loop = asyncio.new_event_loop()
        self.events = MemorySink()
        self.runner = Runner(self.config, log=EventLog([self.events]))
        command = functools.partial(torch_engine_command, step_delay_s=0.012)
        self.manager: RolloutManager = routed_manager(self.config, self.runner, tmp, self.run, command)

    @property
    def controller(self) -> InferenceController:
        return self.manager.controller

    @property
    def routing(self) -> RouterRouting:
        routing = self.controller.routing()
        assert isinstance(routing, RouterRouting)
        return routing

    def run(self, coro: Any) -> Any:
        return self.loop.run_until_complete(coro)

    async def running(self) -> int:
        engine = self.controller.engines[0]
        assert engine.server is not None
        source = capabilities("sglang", "cpu").running
        assert source is not None
        return await read_running(engine.server.client, source, 5.0)

    async def long_request(self, *, through_gateway: bool) -> asyncio.Task[Any]:
        """An N-token request, sent and seen running on the engine."""
        engine = self.controller.engines[0]
        client: Any = self.routing.gateway if through_gateway else engine.client
        assert client is not None
        task = asyncio.create_task(client.generate("drain me", sampling_params=LONG))
        deadline = time.monotonic() + 30
        while await self.running() < 1:
            assert time.monotonic() < deadline and not task.done(), "the long request never ran"
            await asyncio.sleep(0.02)
        return task

    def close(self) -> None:
        self.run(self.manager.dispose())
        self.loop.close()


@pytest.fixture(scope="module")
def rig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rig]:
    r = Rig(tmp_path_factory.mktemp("drain"))
    yield r
    r.close()


def test_a_withdrawn_engine_finishes_its_forwarded_request_during_the_drain(rig: Rig) -> None:
    async def main() -> dict[str, Any]:
        engine = rig.controller.engines[0]
        assert (await rig.routing.publish(engine)).name == "done"
        task = await rig.long_request(through_gateway=True)
        out: dict[str, Any] = {"withdraw": await rig.routing.withdraw(engine)}
        out["listed"] = sorted(await rig.routing.router.workers())  # SMG's list right after the DELETE
        out["running_after_withdraw"] = await rig.running()
        with rig.runner.log.capture() as events:
            out["news"] = await rig.controller.drain_requests(CMD)
        out["answer"] = await asyncio.wait_for(task, 30)
        out["drained"] = [e for e in events if e["event"] == DRAINED]
        return out

    out = rig.run(main())
    assert out["withdraw"].name == "done" and out["listed"] == []  # SMG lists no draining worker: it is gone
    assert out["running_after_withdraw"] == 1  # ... yet the engine still runs what SMG forwarded
    news = out["news"]
    assert (news.name, news.group, news.engine, news.reason) == ("drained", ROLLOUT, 0, "")
    assert news.epoch == rig.controller.engines[0].epoch
    (drained,) = out["drained"]
    assert drained["running"] == 0 and drained["timed_out"] is False and drained["handed_back"] == 0
    assert drained["instance"] == "engine-0" and drained["seconds"] > 0.3  # it waited for the request's tail
    finish = out["answer"].meta_info.finish_reason
    assert finish is not None and finish.type == "length" and len(out["answer"].output_ids) == N  # 0 failed


def test_a_bound_shorter_than_the_request_times_out_reports_the_count_and_hands_it_back(rig: Rig) -> None:
    async def main() -> dict[str, Any]:
        task = await rig.long_request(through_gateway=False)
        sent = time.monotonic()
        with rig.runner.log.capture() as events:
            # a notice whose deadline leaves 0.5 s once the margin is kept
            news = await rig.controller.drain_requests(CMD, deadline_s=DRAIN_MARGIN_S + 0.5, hand_back=True)
        took = time.monotonic() - sent
        answer = await asyncio.wait_for(task, 10)
        await rig.controller.engines[0].continue_generation()  # the hand back leaves it paused, for the next test
        return {"news": news, "took": took, "answer": answer, "events": list(events)}

    out = rig.run(main())
    assert 0.4 < out["took"] < 3.0, out["took"]  # the bound, not the request's 2.6 s, and never a hang
    assert "1 requests still running" in out["news"].reason
    (drained,) = [e for e in out["events"] if e["event"] == DRAINED]
    assert drained["timed_out"] is True and drained["running"] == 1 and drained["handed_back"] == 1
    assert [e["instance"] for e in out["events"] if e["event"] == HANDED_BACK] == ["engine-0"]
    finish = out["answer"].meta_info.finish_reason
    assert finish is not None and finish.type == "abort" and len(out["answer"].output_ids) < N  # handed back


def test_a_request_queued_at_the_engine_is_drained_too(rig: Rig) -> None:
    """A request the engine holds but does not run -- re-queued by a retract pause (a stream's in-flight update, which
    a notice can land on), or queued behind a full batch -- is still the engine's to answer: the drain waits for it.
    Counting running requests only, the drain ended at once and the engine was stopped with the request in it
    (benchmarks/bench_elastic.py: its tries failed through SMG, sent again elsewhere)."""

    async def main() -> dict[str, Any]:
        engine = rig.controller.engines[0]
        assert engine.client is not None
        task = await rig.long_request(through_gateway=False)
        await engine.client.pause_generation("retract")  # running 0, the request waiting
        with rig.runner.log.capture() as events:
            drain = asyncio.create_task(rig.controller.drain_requests(CMD))
            await asyncio.sleep(0.3)
            ended_while_queued = drain.done()
            await engine.client.continue_generation()
            await drain
        return {"ended_while_queued": ended_while_queued, "answer": await asyncio.wait_for(task, 30), "events": events}

    out = rig.run(main())
    assert not out["ended_while_queued"]
    (drained,) = [e for e in out["events"] if e["event"] == DRAINED]
    assert drained["running"] == 0 and not drained["timed_out"] and drained["seconds"] > 0.3, drained
    finish = out["answer"].meta_info.finish_reason
    assert finish is not None and finish.type == "length" and len(out["answer"].output_ids) == N


def test_the_drain_bound_is_the_drain_timeout_and_never_past_a_notice_deadline(rig: Rig) -> None:
    bound = rig.controller.drain_bound
    assert bound() == 30.0  # --rollout-drain-timeout's default
    assert bound(10.0) == 10.0 - DRAIN_MARGIN_S and bound(1.0) == 0.0 and bound(100.0) == 30.0


def test_the_running_count_is_read_where_the_backend_row_says() -> None:
    cpu = RunningCount("/server_info", "num_running_reqs", "json")
    assert parse_running(cpu, '{"internal_states": [{"num_running_reqs": 2}, {"num_running_reqs": 1}]}') == 3
    prom = RunningCount("/metrics", "vllm:num_requests_running", "prometheus")
    text = (
        "# HELP vllm:num_requests_running x\n"
        'vllm:num_requests_running{engine="0",model_name="m"} 2.0\n'
        'vllm:num_requests_running{engine="1",model_name="m"} 1.0\n'
        'vllm:num_requests_running_other{engine="0"} 7.0\n'
    )
    assert parse_running(prom, text) == 3
    with pytest.raises(EngineProtocolError, match="no series"):
        parse_running(prom, "vllm:num_requests_waiting 1.0\n")
    # a queued request is the server's too: the rows name where it says how many wait
    queued = RunningCount("/metrics", "vllm:num_requests_running", "prometheus", "vllm:num_requests_waiting")
    assert parse_running(queued, text + 'vllm:num_requests_waiting{engine="0"} 4.0\n') == 7
    with pytest.raises(EngineProtocolError, match="no series 'vllm:num_requests_waiting'"):
        parse_running(queued, text)
    both = RunningCount("/server_info", "num_running_reqs", "json", "num_waiting_reqs")
    assert parse_running(both, '{"internal_states": [{"num_running_reqs": 0, "num_waiting_reqs": 2}]}') == 2
    assert {capabilities(b, d).running.waiting for b, d in (("sglang", "cpu"), ("vllm", "cpu"))} == {  # type: ignore[union-attr]
        "num_waiting_reqs",
        "vllm:num_requests_waiting",
    }
    with pytest.raises(EngineProtocolError, match="no integer"):
        parse_running(cpu, '{"internal_states": [{}]}')
    assert {b: capabilities(b, "cpu").running is not None for b in ("sglang", "vllm")} == {"sglang": True, "vllm": True}


def test_a_real_sglang_servers_gauges_are_read_as_its_row_names_them() -> None:
    """SGLang on a GPU (no SGLang here): its scheduler's gauges as its /metrics answers them with --enable-metrics
    (SGLang's production-metrics docs: ``sglang:num_running_reqs`` and ``sglang:num_queue_reqs``, a ``model_name``
    label, float values, HELP and TYPE lines)."""
    row = capabilities("sglang", "cuda").running
    assert row is not None and row.path == "/metrics"
    text = (
        "# HELP sglang:num_running_reqs The number of running requests\n"
        "# TYPE sglang:num_running_reqs gauge\n"
        'sglang:num_running_reqs{model_name="m"} 3.0\n'
        "# HELP sglang:num_used_tokens The number of used tokens\n"
        'sglang:num_used_tokens{model_name="m"} 4096.0\n'
        "# HELP sglang:num_queue_reqs The number of requests in the waiting queue\n"
        "# TYPE sglang:num_queue_reqs gauge\n"
        'sglang:num_queue_reqs{model_name="m"} 2.0\n'
    )
    assert parse_running(row, text) == 5
    assert parse_running(row, text.replace(" 3.0", " 0.0").replace(" 2.0", " 0.0")) == 0
    with pytest.raises(EngineProtocolError, match="no series 'sglang:num_running_reqs'"):
        parse_running(row, "sglang:num_queue_reqs 0.0\n")  # an answer without the running gauge: an error, never 0


def test_the_effect_handler_answers_done_at_once_and_reports_the_end_as_news(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``engine.drain_requests`` is bound: the lane is not held by the drain (``done`` while the request still
    runs), and the drain's end comes back as the news ``drained`` about this process."""
    reported: list[Any] = []

    async def report(outcome: Any) -> None:
        reported.append(outcome)

    monkeypatch.setattr(rig.runner, "report", report)

    async def main() -> dict[str, Any]:
        task = await rig.long_request(through_gateway=False)
        answered = await rig.runner.handlers["engine.drain_requests"](CMD)
        running_then = await rig.running()
        await asyncio.gather(*rig.controller.drains)
        return {"answered": answered, "running_then": running_then, "answer": await asyncio.wait_for(task, 10)}

    out = rig.run(main())
    assert out["answered"].name == "done" and out["running_then"] == 1
    (news,) = reported
    assert (news.name, news.engine, news.reason, news.epoch) == ("drained", 0, "", rig.controller.engines[0].epoch)
    assert len(out["answer"].output_ids) == N


def test_a_single_zero_read_between_counts_does_not_end_the_drain() -> None:
    """A gauge that reads 0 once while the request runs on (seen on a real vLLM server) is not the end: the drain
    ends on the second 0 in a row, or on the bound with the count it read last."""
    reads = iter([1, 0, 1, 1, 0, 0, 1])
    seen: list[int] = []

    async def read(timeout: float) -> int:
        seen.append(next(reads))
        return seen[-1]

    done = asyncio.run(drain(read, 10.0, poll=0.001))
    assert (done.running, done.timed_out) == (0, False) and seen == [1, 0, 1, 1, 0, 0]
    flicker = iter([1, 0] * 1000)

    async def flickering(timeout: float) -> int:
        return next(flicker)

    ended = asyncio.run(drain(flickering, 0.05, poll=0.001))
    assert ended.timed_out and ended.running in (0, 1)
