"""Pause, continue and abort with requests really in flight (a CPU engine slowed to ~100 tokens/s).

Each mode is checked by what it does to the requests and to the engine's memory, and by the
tokens: a request paused in place or retracted and then continued produces exactly the tokens of
an uninterrupted run.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from engines.client import EngineClient
from engines.errors import EngineHTTPError, EngineTimeout
from engines.models import TinyCausalLM
from engines.process import ServerProcess
from engines.protocol import GenerateResponse, SamplingParams

SEED = 5  # the slow engine's (conftest.ENGINE_SPECS): 10 ms per decode step
N = 40  # tokens per request: ~0.45 s at the engine's step delay
LONG = SamplingParams(max_new_tokens=N, temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module")
def engine(slow_engine) -> ServerProcess:
    return slow_engine


@pytest.fixture(scope="module")
def expected(support) -> dict[str, list[int]]:
    model = TinyCausalLM("tiny", seed=SEED)
    return {p: support.reference_greedy(model, p, N)[0] for p in ("Once", "Twice", "Thrice")}


def client_for(engine: ServerProcess) -> EngineClient:
    return EngineClient(engine.url, engine_id="slow-0", timeout=20.0)


async def start(client: EngineClient, prompt: str, rid: str | None = None) -> asyncio.Task[GenerateResponse]:
    return asyncio.create_task(client.generate(prompt, sampling_params=LONG, rid=rid))


async def running(support: Any, client: EngineClient, count: int) -> None:
    async def probe() -> bool:
        return bool((await support.internal_state(client))["num_running_reqs"] >= count)

    await support.wait_for(probe, what=f"{count} running requests")


def test_in_place_pause_freezes_decoding_and_continue_finishes_identically(support, engine, expected):
    async def main() -> dict[str, Any]:
        out: dict[str, Any] = {}
        async with client_for(engine) as client:
            task = await start(client, "Once")
            await running(support, client, 1)
            out["pause"] = await client.pause_generation("in_place")
            out["s1"] = await support.internal_state(client)
            late = asyncio.create_task(client.generate("Twice", sampling_params={"max_new_tokens": 2}))
            await asyncio.sleep(0.3)
            out["s2"] = await support.internal_state(client)
            out["frozen"] = not task.done() and not late.done()
            out["continue"] = await client.continue_generation()
            out["result"], out["late"] = await task, await late
        return out

    out = run(main())
    s1, s2 = out["s1"], out["s2"]
    assert out["pause"].model_dump() == {"message": "Generation paused successfully.", "status": "ok"}
    assert out["continue"].model_dump() == {"message": "Generation continued successfully.", "status": "ok"}
    assert out["frozen"] and s1["paused"] and s1["pause_mode"] == "in_place"
    assert s2["num_generated_tokens"] == s1["num_generated_tokens"]  # no token decoded while paused
    assert (s2["num_running_reqs"], s2["kv_slots_in_use"], s2["num_waiting_reqs"]) == (1, 1, 1)  # KV kept
    result = out["result"]
    assert result.output_ids == expected["Once"] and result.meta_info.num_retractions == 0
    assert result.meta_info.finish_reason.type == "length" and out["late"].meta_info.completion_tokens == 2


def test_retract_frees_the_kv_and_continue_recomputes_identically(support, engine, expected):
    async def main() -> dict[str, Any]:
        out: dict[str, Any] = {}
        async with client_for(engine) as client:
            task = await start(client, "Twice")
            await running(support, client, 1)
            await asyncio.sleep(0.05)
            await client.pause_generation("retract")
            out["s1"] = await support.internal_state(client)
            await asyncio.sleep(0.2)
            out["frozen"] = not task.done()
            await client.continue_generation()
            out["result"] = await task
        return out

    out = run(main())
    s1 = out["s1"]
    assert (s1["num_running_reqs"], s1["kv_slots_in_use"], s1["num_waiting_reqs"]) == (0, 0, 1)  # KV freed
    assert s1["pause_mode"] == "retract" and out["frozen"]
    result = out["result"]
    assert result.output_ids == expected["Twice"]
    assert result.meta_info.num_retractions == 1 and result.meta_info.finish_reason.type == "length"


@pytest.mark.memory
def test_offload_while_retracted_then_onload_and_continue_finishes_identically(support, engine, expected):
    """The partial-rollout offload: retract, release everything, resume, continue -- same tokens."""

    async def main() -> dict[str, Any]:
        out: dict[str, Any] = {}
        async with client_for(engine) as client:
            task = await start(client, "Thrice")
            await running(support, client, 1)
            await client.pause_generation("retract")
            await client.release_memory_occupation(["weights", "kv_cache"])
            out["released"] = await support.internal_state(client)
            await client.resume_memory_occupation(["weights", "kv_cache"])
            await client.continue_generation()
            out["result"] = await task
        return out

    out = run(main())
    released = out["released"]
    assert (released["weights_bytes"], released["kv_cache_bytes"], released["num_waiting_reqs"]) == (0, 0, 1)
    assert out["result"].output_ids == expected["Thrice"] and out["result"].meta_info.num_retractions == 1


def test_abort_mode_ends_in_flight_requests_and_holds_new_ones(support, engine, expected):
    async def main() -> dict[str, Any]:
        out: dict[str, Any] = {}
        async with client_for(engine) as client:
            tasks = [await start(client, p) for p in ("Once", "Thrice")]
            await running(support, client, 2)
            await asyncio.sleep(0.05)
            await client.pause_generation("abort")
            out["aborted"] = await asyncio.wait_for(asyncio.gather(*tasks), 2.0)
            out["s1"] = await support.internal_state(client)
            late = asyncio.create_task(client.generate("Once", sampling_params=LONG))
            await asyncio.sleep(0.2)
            out["held"] = not late.done()
            await client.continue_generation()
            out["late"] = await late
        return out

    out = run(main())
    for prompt, res in zip(("Once", "Thrice"), out["aborted"], strict=True):
        reason = res.meta_info.finish_reason
        assert reason.type == "abort" and "pause_generation" in reason.message
        assert 0 < res.meta_info.completion_tokens < N
        assert res.output_ids == expected[prompt][: len(res.output_ids)]  # a prefix of the real run
    assert out["s1"]["kv_slots_in_use"] == 0 and out["s1"]["paused"]
    assert out["held"] and out["late"].output_ids == expected["Once"]


def test_abort_request_by_rid_and_all(support, engine, expected):
    async def main() -> dict[str, Any]:
        out: dict[str, Any] = {}
        async with client_for(engine) as client:
            victim, survivor = await start(client, "Once", "victim"), await start(client, "Twice", "survivor")
            await running(support, client, 2)
            await client.abort_request("victim")
            await client.abort_request("no-such-request")  # unknown rid: ignored, as SGLang does
            out["victim"], out["survivor"] = await victim, await survivor
            tasks = [await start(client, p) for p in ("Once", "Thrice")]
            await running(support, client, 2)
            await client.abort_request(abort_all=True, abort_message="rollout cancelled")
            out["all"] = await asyncio.gather(*tasks)
        return out

    out = run(main())
    assert out["victim"].meta_info.id == "victim" and out["victim"].meta_info.finish_reason.type == "abort"
    assert out["victim"].meta_info.completion_tokens < N
    assert out["survivor"].output_ids == expected["Twice"] and out["survivor"].meta_info.finish_reason.type == "length"
    for res in out["all"]:
        assert res.meta_info.finish_reason.model_dump(exclude_none=True) == {
            "type": "abort",
            "message": "rollout cancelled",
        }


def test_weights_update_waits_for_running_requests_or_lands_between_tokens_when_paused(
    support, engine, expected, tmp_path
):
    new_file = TinyCausalLM("tiny", seed=99).save_pretrained(tmp_path / "new")
    old_file = TinyCausalLM("tiny", seed=SEED).save_pretrained(tmp_path / "old")

    async def main() -> dict[str, Any]:
        out: dict[str, Any] = {}
        async with client_for(engine) as client:
            # not paused: like SGLang's writer lock, the update waits for the running request
            task = await start(client, "Once")
            await running(support, client, 1)
            await client.update_weights_from_disk(str(old_file), weight_version="same")
            out["waited"] = task.done()
            # paused in place: the update lands between two tokens (a partial rollout)
            task = await start(client, "Twice")
            await running(support, client, 1)
            await client.pause_generation("in_place")
            try:
                await client.release_memory_occupation(["kv_cache"])
            except EngineHTTPError as exc:
                out["release_refused"] = exc
            out["update"] = await client.update_weights_from_disk(str(new_file), weight_version="new")
            await client.continue_generation()
            out["partial"] = await task
            await client.update_weights_from_disk(str(old_file), weight_version="default")
        return out

    out = run(main())
    assert out["waited"]
    assert out["release_refused"].status == 400 and "hold KV cache slots" in out["release_refused"].body
    assert out["update"].success and out["update"].num_paused_requests == 1
    partial = out["partial"]
    assert partial.meta_info.weight_version == "new" and partial.meta_info.completion_tokens == N
    assert partial.output_ids != expected["Twice"]  # the tail came from the new weights


def test_a_client_that_gives_up_leaves_no_request_behind(support, engine):
    async def main() -> tuple[Any, dict[str, Any]]:
        async with client_for(engine) as client:
            try:
                very_long = SamplingParams(max_new_tokens=200, temperature=0.0, ignore_eos=True)  # ~2 s
                await client.generate("Once", sampling_params=very_long, timeout=0.15)
                error = None
            except EngineTimeout as exc:
                error = exc

            async def idle() -> bool:
                state = await support.internal_state(client)
                return bool(state["num_running_reqs"] == 0 and state["kv_slots_in_use"] == 0)

            await support.wait_for(idle, timeout=0.8, what="the abandoned request to be aborted")
            return error, await support.internal_state(client)

    error, state = run(main())
    assert isinstance(error, EngineTimeout) and error.endpoint == "/generate"
    assert state["num_generated_tokens"] > 0


def run(coro: Any) -> Any:
    return asyncio.run(coro)
