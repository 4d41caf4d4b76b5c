"""One client cannot harm the others (issue 27, cause 7), in-process against the real scheduler.

Two layers, each with a test that puts the old code back and shows the witness then fails:

* the validator (``check_sampling_values``) refuses, per request and before anything is queued, every
  sampling parameter the engine cannot compute (NaN, infinities, 64-bit overflows, huge stop lists; a
  temperature below 1e-6, whose logits would overflow, is sampled greedily as SGLang does) -- 400 in
  SGLang's ``{"error": {"message"}}`` shape;
* the scheduler fails only the request whose step raised: its batch-mates and other clients' requests
  complete (before, one request's sampling error aborted every request in flight).
"""

from __future__ import annotations

import asyncio
import math
import traceback
from typing import Any

import pytest

import engines.cpu.scheduler as scheduler_module
from engines.cpu.engine import TorchEngine
from engines.cpu.scheduler import Scheduler
from engines.cpu.validation import MAX_STOP_STRINGS, EngineRequestError
from engines.protocol import GenerateReqInput, SamplingParams

NORMAL = {"max_new_tokens": 40, "temperature": 1.0, "ignore_eos": True}
BAD_PARAMS: list[tuple[str, dict[str, Any], str]] = [
    ("temperature-nan", {"temperature": math.nan}, "temperature"),
    ("temperature-inf", {"temperature": math.inf}, "temperature"),
    ("temperature-negative-inf", {"temperature": -math.inf}, "temperature"),
    ("top-p-nan", {"top_p": math.nan}, "top_p"),
    ("top-p-zero", {"top_p": 0.0}, "top_p"),
    ("top-k-zero", {"top_k": 0}, "top_k"),
    ("top-k-past-64-bits", {"top_k": 1 << 70}, "top_k"),
    ("min-p-nan", {"min_p": math.nan}, "min_p"),
    ("frequency-penalty-nan", {"frequency_penalty": math.nan}, "frequency_penalty"),
    ("repetition-penalty-inf", {"repetition_penalty": math.inf}, "repetition_penalty"),
    ("max-new-tokens-huge", {"max_new_tokens": 10**30}, "maximum context length"),
    ("min-new-tokens-negative", {"min_new_tokens": -1}, "min_new_tokens"),
    ("sampling-seed-past-64-bits", {"sampling_seed": 1 << 64}, "sampling_seed"),
    ("stop-list-huge", {"stop": ["x"] * (MAX_STOP_STRINGS + 1)}, "stop holds"),
    ("stop-string-huge", {"stop": "x" * 5000}, "stop string"),
    ("stop-token-ids-huge", {"stop_token_ids": [1] * 5000}, "stop_token_ids"),
]


async def _engine() -> TorchEngine:
    engine = TorchEngine(seed=3)
    engine.load()
    await engine.start()
    engine.mark_ready()
    return engine


def _body(params: dict[str, Any], prompt: str = "hello") -> GenerateReqInput:
    return GenerateReqInput(text=prompt, sampling_params=params)


async def _neighbours_and_bad(bad: dict[str, Any]) -> tuple[list[Any], Any]:
    """Three normal requests in flight, then the bad one; every answer (or exception) as it came back."""
    engine = await _engine()
    try:
        normal = [asyncio.ensure_future(engine.generate(_body(NORMAL, f"p{i}"))) for i in range(3)]
        await asyncio.sleep(0)  # they are queued (and being stepped) before the bad one arrives
        bad_answer: Any
        try:
            bad_answer = await engine.generate(_body({**NORMAL, **bad}))
        except EngineRequestError as exc:
            bad_answer = exc
        return list(await asyncio.gather(*normal)), bad_answer
    finally:
        await engine.shutdown()


def _assert_isolated(normal: list[Any], bad: Any) -> None:
    reasons = [a["meta_info"]["finish_reason"] for a in normal]
    assert all(r["type"] == "length" for r in reasons), f"other clients' requests were harmed: {reasons}"
    assert not isinstance(bad, EngineRequestError)
    assert bad["meta_info"]["finish_reason"]["type"] == "abort"
    assert bad["meta_info"]["finish_reason"]["err_type"] == "InternalError"


@pytest.mark.parametrize(("params", "needle"), [(p, n) for _, p, n in BAD_PARAMS], ids=[c for c, _, _ in BAD_PARAMS])
def test_the_validator_refuses_what_the_engine_cannot_compute(params: dict[str, Any], needle: str) -> None:
    async def main() -> EngineRequestError:
        engine = await _engine()
        try:
            with pytest.raises(EngineRequestError) as info:
                await engine.generate(_body({**NORMAL, **params}))
            return info.value
        finally:
            await engine.shutdown()

    exc = asyncio.run(main())
    assert exc.status == 400 and needle in exc.message, exc.message
    assert isinstance(exc.body(), dict) and set(exc.body()["error"]) == {"message"}  # type: ignore[index]
    assert len(exc.message) < 400, "the refusal echoes what it refuses, bounded"


def test_good_edge_values_still_pass() -> None:
    async def main() -> list[Any]:
        engine = await _engine()
        try:
            edges: list[dict[str, Any]] = [
                {"temperature": 0.0},
                {"temperature": 1e-6},
                {"temperature": 1e300},
                {"top_k": 1 << 40},
            ]
            edges += [{"sampling_seed": (1 << 64) - 1}, {"stop": ["x"] * MAX_STOP_STRINGS}]
            return [await engine.generate(_body({**NORMAL, **e, "max_new_tokens": 4})) for e in edges]
        finally:
            await engine.shutdown()

    for answer in asyncio.run(main()):
        assert answer["meta_info"]["finish_reason"]["type"] == "length"


POISON = 0.123456  # a temperature the planted fault below fails on: any exception at sampling time


def _without_validation(monkeypatch: pytest.MonkeyPatch) -> None:
    """A request whose sampling raises (before the validator, 1e-300 did: logits / T overflowed to NaN):
    planted, so the scheduler's isolation is judged whatever the validator lets through."""
    real = scheduler_module.sample_token

    def sample(logits: Any, **kwargs: Any) -> tuple[int, float]:
        if kwargs["temperature"] == POISON:
            raise RuntimeError("probability tensor contains either `inf`, `nan` or element < 0")
        return real(logits, **kwargs)

    monkeypatch.setattr(scheduler_module, "sample_token", sample)


def test_a_request_failing_at_sampling_time_fails_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    _without_validation(monkeypatch)
    normal, bad = asyncio.run(_neighbours_and_bad({"temperature": POISON}))
    _assert_isolated(normal, bad)


def test_a_failing_batch_item_fails_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    _without_validation(monkeypatch)

    async def main() -> Any:
        engine = await _engine()
        try:
            body = GenerateReqInput(
                text=["a", "b", "c"], sampling_params=[NORMAL, {**NORMAL, "temperature": POISON}, NORMAL]
            )
            return await engine.generate(body)
        finally:
            await engine.shutdown()

    answers = asyncio.run(main())
    assert [a["meta_info"]["finish_reason"]["type"] for a in answers] == ["length", "abort", "length"]


# -- the old behaviour, re-introduced, is caught -------------------------------------------------------------------
def _old_step(self: Scheduler) -> None:
    """The step before the fix: no per-request isolation (the loop's catch then aborted everything)."""
    fresh: set[int] = set()
    while self.waiting and not self._updating and self.memory.kv.free_slots:
        req = self.waiting.popleft()
        fresh.add(id(req))
        self._prefill(req)
    for req in list(self.running):
        if id(req) not in fresh:
            self._decode(req)


def test_catches_one_request_aborting_every_client(monkeypatch: pytest.MonkeyPatch) -> None:
    _without_validation(monkeypatch)
    monkeypatch.setattr(Scheduler, "_step", _old_step)
    monkeypatch.setattr(traceback, "print_exc", lambda *a, **k: None)  # the old path prints one per failure
    normal, bad = asyncio.run(_neighbours_and_bad({"temperature": POISON}))
    with pytest.raises(AssertionError, match="other clients' requests were harmed"):
        _assert_isolated(normal, bad)


def _old_check(p: SamplingParams, vocab_size: int, **_: Any) -> None:
    """The range checks before the fix: comparisons a NaN passes."""
    if p.temperature < 0:
        raise EngineRequestError(400, f"temperature must be >= 0, got {p.temperature}")


@pytest.mark.parametrize("params", [{"temperature": math.nan}, {"top_p": math.nan}], ids=["nan", "top-p-nan"])
def test_catches_a_sampling_parameter_the_engine_cannot_compute(
    monkeypatch: pytest.MonkeyPatch, params: dict[str, Any]
) -> None:
    monkeypatch.setattr(scheduler_module, "check_sampling_values", _old_check)
    with pytest.raises(pytest.fail.Exception, match="DID NOT RAISE"):
        test_the_validator_refuses_what_the_engine_cannot_compute(params, next(iter(params)))


def test_a_tiny_temperature_is_greedy_as_in_sglang() -> None:
    """SGLang samples greedily below 1e-6 (logits / 1e-300 would be NaN): the same tokens as temperature 0."""

    async def main() -> list[Any]:
        engine = await _engine()
        try:
            params = {"max_new_tokens": 12, "ignore_eos": True}
            return [await engine.generate(_body({**params, "temperature": t}, "tiny")) for t in (0.0, 1e-300, 9e-7)]
        finally:
            await engine.shutdown()

    greedy, tiny, below = asyncio.run(main())
    assert tiny["text"] == greedy["text"] == below["text"]
    assert tiny["meta_info"]["finish_reason"]["type"] == "length"
