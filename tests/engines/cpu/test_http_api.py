"""The CPU torch engine as a real process, through EngineClient and raw HTTP.

Behaviour (generation is the seeded model's, weights load and change outputs, memory is really
released and restored exactly, errors are SGLang's bodies) and the contract: responses are checked
against ``response_from_source`` in sglang-lifecycle-endpoints.json.
"""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any

import pytest
from pydantic import BaseModel

from engines.client import EngineClient
from engines.errors import EngineHTTPError
from engines.models import CharTokenizer, ModelConfig, TinyCausalLM
from engines.process import ServerProcess
from engines.protocol import (
    GateErrorBody,
    MessageErrorBody,
    SamplingParams,
    ValidationErrorBody,
)

SEED = 7  # the main engine's (conftest.ENGINE_SPECS)
GREEDY = SamplingParams(max_new_tokens=24, temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module")
def engine(main_engine) -> ServerProcess:
    return main_engine


@pytest.fixture(scope="module")
def ref() -> TinyCausalLM:
    return TinyCausalLM("tiny", seed=SEED)


def client_for(engine: ServerProcess) -> EngineClient:
    return EngineClient(engine.url, engine_id="cpu-0", timeout=20.0)


def run(coro: Any) -> Any:
    return asyncio.run(coro)


# -- health ------------------------------------------------------------------------------------


@pytest.mark.recovery
@pytest.mark.monitor
def test_health_endpoints_answer_200_with_an_empty_body(support, engine):
    async def main() -> list[tuple[int, str]]:
        return [await support.raw(engine.url, "GET", p) for p in ("/health", "/health_generate", "/ready")]

    assert run(main()) == [(200, ""), (200, ""), (200, "")]


# -- generation ------------------------------------------------------------------------------------


@pytest.mark.determinism
def test_greedy_generation_is_the_seeded_model_and_deterministic(support, engine, ref):
    expected_ids, expected_lps = support.reference_greedy(ref, "Hello", 24)

    async def main() -> list[Any]:
        async with client_for(engine) as client:
            return [await client.generate("Hello", sampling_params=GREEDY, return_logprob=True) for _ in range(2)]

    first, second = run(main())
    assert first.output_ids == second.output_ids == expected_ids
    assert first.text == ref.tokenizer.decode(expected_ids)
    got_lps = [lp for lp, _, _ in first.meta_info.output_token_logprobs]
    assert got_lps == pytest.approx(expected_lps, abs=1e-4)
    assert [tok for _, tok, _ in first.meta_info.output_token_logprobs] == expected_ids
    meta = first.meta_info
    assert (meta.prompt_tokens, meta.completion_tokens, meta.weight_version) == (6, 24, "default")
    assert meta.finish_reason is not None and meta.finish_reason.model_dump(exclude_none=True) == {
        "type": "length",
        "length": 24,
    }
    assert meta.id != second.meta_info.id


def test_temperature_sampling_is_seeded_and_its_logprobs_are_the_trainers(support, engine, ref):
    def params(seed: int | None) -> SamplingParams:
        return SamplingParams(max_new_tokens=32, temperature=0.8, ignore_eos=True, sampling_seed=seed)

    async def main() -> list[Any]:
        async with client_for(engine) as client:
            return [
                await client.generate("Tell me", sampling_params=params(s), return_logprob=True)
                for s in (11, 11, 12, None, None)
            ]

    a, b, c, d, e = run(main())
    assert a.output_ids == b.output_ids
    assert c.output_ids != a.output_ids and d.output_ids != e.output_ids
    greedy_ids, _ = support.reference_greedy(ref, "Tell me", 32)
    assert a.output_ids != greedy_ids
    for res in (a, c, d):
        engine_lps = [lp for lp, _, _ in res.meta_info.output_token_logprobs]
        trainer_lps = support.teacher_forced_logprobs(ref, "Tell me", res.output_ids, temperature=0.8)
        assert engine_lps == pytest.approx(trainer_lps, abs=1e-4)


def test_batches_of_text_and_input_ids_equal_single_requests(support, engine, ref):
    prompts = ["ab", "Hello", "xyz!"]

    async def main() -> tuple[list[Any], list[Any], list[Any]]:
        async with client_for(engine) as client:
            singles = [await client.generate(p, sampling_params=GREEDY) for p in prompts]
            texts = await client.generate_batch(prompts, sampling_params=GREEDY, rids=["r0", "r1", "r2"])
            ids = await client.generate_batch(
                input_ids=[ref.tokenizer.encode(p) for p in prompts], sampling_params=[GREEDY] * 3
            )
            return singles, texts, ids

    singles, texts, ids = run(main())
    assert [r.output_ids for r in texts] == [r.output_ids for r in ids] == [r.output_ids for r in singles]
    assert [r.meta_info.id for r in texts] == ["r0", "r1", "r2"]
    assert [r.output_ids for r in singles] == [support.reference_greedy(ref, p, 24)[0] for p in prompts]


def test_stop_token_ids_stop_strings_and_zero_tokens(support, engine, ref):
    ref_ids, _ = support.reference_greedy(ref, "Hello", 24)
    stop_id = ref_ids[6]
    cut = ref_ids.index(stop_id)
    ref_text = ref.tokenizer.decode(ref_ids)
    stop_str = ref_text[7:9]
    first = ref_text.index(stop_str)

    async def main() -> list[Any]:
        async with client_for(engine) as client:
            base = GREEDY.model_dump(exclude_unset=True)
            return [
                await client.generate("Hello", sampling_params={**base, "stop_token_ids": [stop_id]}),
                await client.generate("Hello", sampling_params={**base, "stop": [stop_str, "never-matches"]}),
                await client.generate("Hello", sampling_params={**base, "stop": stop_str, "no_stop_trim": True}),
                await client.generate("Hello", sampling_params={"max_new_tokens": 0}),
            ]

    by_id, by_str, untrimmed, empty = run(main())
    assert by_id.output_ids == ref_ids[: cut + 1]
    assert by_id.meta_info.finish_reason.model_dump(exclude_none=True) == {"type": "stop", "matched": stop_id}
    assert by_str.text == ref_text[:first] and by_str.meta_info.finish_reason.matched == stop_str
    assert untrimmed.text == ref_text[: first + len(stop_str)]
    assert (empty.output_ids, empty.text, empty.meta_info.completion_tokens) == ([], "", 0)
    assert empty.meta_info.finish_reason.model_dump(exclude_none=True) == {"type": "length", "length": 0}


# -- contract shapes ---------------------------------------------------------------------------------


def _words(text: str) -> set[str]:
    return set(re.findall(r"[a-z0-9_]+", text))


def test_generate_response_has_sglangs_shape(support, engine, contracts):
    prose = contracts.endpoint("/generate")["response_from_source"]

    async def main() -> tuple[int, str]:
        body = {"text": "Hi", "sampling_params": {"max_new_tokens": 3, "temperature": 0.0, "ignore_eos": True}}
        return await support.raw(engine.url, "POST", "/generate", body={**body, "return_logprob": True})

    status, text = run(main())
    answer = json.loads(text)
    assert status == 200 and set(answer) == {"text", "output_ids", "meta_info"}
    meta = answer["meta_info"]
    required = {"id", "finish_reason", "prompt_tokens", "completion_tokens", "cached_tokens", "weight_version"}
    required |= {"num_retractions", "e2e_latency", "output_token_logprobs"}
    assert required <= set(meta) and required <= _words(prose)
    assert meta["finish_reason"] == {"type": "length", "length": 3}
    assert all(
        isinstance(e, list) and len(e) == 3 and isinstance(e[0], float) and isinstance(e[1], int) and e[2] is None
        for e in meta["output_token_logprobs"]
    )

    async def with_text() -> Any:
        async with client_for(engine) as client:
            return await client.generate(
                "Hi", sampling_params={"max_new_tokens": 3}, return_logprob=True, return_text_in_logprobs=True
            )

    res = run(with_text())
    tokenizer = CharTokenizer()
    assert [t for _, _, t in res.meta_info.output_token_logprobs] == [tokenizer.token_text(i) for i in res.output_ids]


def test_model_info_and_server_info_have_sglangs_fields(support, engine, contracts):
    model_prose = contracts.endpoint("/model_info")["response_from_source"]
    listed = model_prose.split("JSON object:", 1)[1].split("(+", 1)[0]
    model_fields = {f.strip().rstrip(".") for f in listed.split(",")}
    server_prose = contracts.endpoint("/server_info")["response_from_source"]

    async def main() -> tuple[dict[str, Any], dict[str, Any], Any]:
        _, m = await support.raw(engine.url, "GET", "/model_info")
        _, s = await support.raw(engine.url, "GET", "/server_info")
        async with client_for(engine) as client:
            return json.loads(m), json.loads(s), await client.server_info()

    model_info, server_info, parsed = run(main())
    assert len(model_fields) == 14 and model_fields <= set(model_info)
    assert model_info["weight_version"] == "default" and model_info["is_generation"] is True
    for key in ("launch_command", "startup_time", "internal_states", "version", "frontend"):
        assert key in server_prose and key in server_info
    assert server_info["frontend"] == "python" and isinstance(server_info["internal_states"], list)
    memory = parsed.engine_memory()
    assert memory is not None and memory.weights_bytes > 0 and memory.kv_cache_bytes > 0


def test_refusals_use_sglangs_status_codes_and_bodies(support, engine, contracts):
    assert "400" in contracts.endpoints["validation_errors_note"]
    gen = {"text": "Hi", "sampling_params": {"max_new_tokens": 4}}
    cases: list[tuple[str, dict[str, Any], type[BaseModel], str]] = [
        ("unknown sampling key", {**gen, "sampling_params": {"max_new_tokens": 4, "foo": 1}}, GateErrorBody, "foo"),
        ("wrong JSON type", {**gen, "sampling_params": {"max_new_tokens": 8.0}}, GateErrorBody, "max_new_tokens"),
        ("bool for int", {**gen, "sampling_params": {"max_new_tokens": True}}, GateErrorBody, "max_new_tokens"),
        ("SGLang-only key", {**gen, "sampling_params": {"regex": "a+"}}, GateErrorBody, "does not implement"),
        ("schema type", {"text": 5}, ValidationErrorBody, "body.text"),
        ("text and ids", {"text": "a", "input_ids": [1, 2]}, MessageErrorBody, "Either text or input_ids"),
        ("neither", {"sampling_params": {}}, MessageErrorBody, "Either text or input_ids"),
        ("temperature", {**gen, "sampling_params": {"temperature": -1.0}}, MessageErrorBody, "temperature must be"),
        ("vocabulary", {"input_ids": [1, 5000]}, MessageErrorBody, "outside the vocabulary"),
        ("context", {**gen, "sampling_params": {"max_new_tokens": 1000}}, MessageErrorBody, "maximum context length"),
        ("stream", {**gen, "stream": True}, MessageErrorBody, "stream=true"),
        ("batch size", {"text": ["a", "b"], "sampling_params": [{}]}, MessageErrorBody, "batch has 2"),
    ]

    async def main() -> list[tuple[int, str]]:
        out = [await support.raw(engine.url, "POST", "/generate", body=body) for _, body, _, _ in cases]
        out.append(await support.raw(engine.url, "POST", "/generate", data=b""))
        out.append(await support.raw(engine.url, "POST", "/generate", data=b"{not json"))
        out.append(await support.raw(engine.url, "GET", "/release_memory_occupation"))
        out.append(await support.raw(engine.url, "POST", "/pause_generation", body={"mode": "sideways"}))
        out.append(await support.raw(engine.url, "POST", "/update_weights_from_disk", body={}))
        return out

    answers = run(main())
    for (name, _, model, needle), (status, text) in zip(cases, answers, strict=False):
        assert status == 400, name
        model.model_validate_json(text)
        assert needle in text, f"{name}: {text}"
        if model is GateErrorBody:
            assert isinstance(json.loads(text)["error"], str), name
    for status, text in answers[len(cases) :]:
        body = ValidationErrorBody.model_validate_json(text)
        assert status == 400 and body.code == 400 and body.param is None and body.type == "Bad Request"
    assert "Field required" in answers[len(cases)][1] and "Field required" in answers[-3][1]
    assert "JSON decode error" in answers[len(cases) + 1][1]
    assert "mode" in answers[-2][1] and "model_path" in answers[-1][1]


# -- weights ---------------------------------------------------------------------------------------------


@pytest.mark.weight_update
def test_update_weights_from_disk_sets_the_version_and_changes_outputs(support, engine, ref, tmp_path):
    new = TinyCausalLM("tiny", seed=123)
    new_file = new.save_pretrained(tmp_path / "step-1")  # checkpoint directories, as SGLang takes
    back_file = ref.save_pretrained(tmp_path / "step-2")  # the original values

    async def main() -> dict[str, Any]:
        out: dict[str, Any] = {}
        async with client_for(engine) as client:
            out["before"] = await client.generate("Hello", sampling_params=GREEDY)
            status, text = await support.raw(
                engine.url,
                "POST",
                "/update_weights_from_disk",
                body={"model_path": str(new_file), "weight_version": "v1"},
            )
            out["raw"] = (status, json.loads(text))
            out["info1"] = await client.model_info()
            out["after"] = await client.generate("Hello", sampling_params=GREEDY)
            out["update2"] = await client.update_weights_from_disk(str(back_file), weight_version="v2")
            out["no_version"] = await client.update_weights_from_disk(str(back_file))
            out["info2"] = await client.model_info()
            out["restored"] = await client.generate("Hello", sampling_params=GREEDY)
            await client.update_weight_version("default")
        return out

    out = run(main())
    status, body = out["raw"]
    assert status == 200 and set(body) == {"success", "message", "num_paused_requests"}
    assert body["success"] is True and body["num_paused_requests"] == 0
    assert out["info1"].weight_version == "v1" and out["info1"].model_path == str(new_file)
    assert out["after"].meta_info.weight_version == "v1"
    assert out["after"].output_ids == support.reference_greedy(new, "Hello", 24)[0] != out["before"].output_ids
    assert out["update2"].success and out["info2"].weight_version == "v2"  # no weight_version: unchanged
    assert out["info2"].load_format == "safetensors" and out["info2"].model_path == str(back_file)
    assert out["restored"].output_ids == out["before"].output_ids


def test_wrong_shape_weights_are_refused_by_name_and_change_nothing(engine, tmp_path):
    wide = ModelConfig("wide", d_model=64, n_layers=2, n_heads=2, max_seq_len=256)
    bad_file = TinyCausalLM(wide, seed=1).save_pretrained(tmp_path / "wide")
    loose = TinyCausalLM("tiny", seed=1).save_weights(tmp_path / "loose.safetensors")  # a file, not a directory
    (tmp_path / "no-config").mkdir()
    TinyCausalLM("tiny", seed=1).save_weights(tmp_path / "no-config" / "model.safetensors")

    async def main() -> tuple[Any, ...]:
        async with client_for(engine) as client:
            before = await client.generate("Hello", sampling_params=GREEDY)
            version = (await client.model_info()).weight_version
            errors = []
            for path in (bad_file, tmp_path / "absent", loose, tmp_path / "no-config"):
                try:
                    await client.update_weights_from_disk(str(path), weight_version="never")
                except EngineHTTPError as exc:
                    errors.append(exc)
            after = await client.generate("Hello", sampling_params=GREEDY)
            return before, version, errors, after, (await client.model_info()).weight_version

    before, version, errors, after, version_after = run(main())
    assert [e.status for e in errors] == [400, 400, 400, 400]
    bodies = [json.loads(e.body) for e in errors]
    assert all(b["success"] is False and set(b) == {"success", "message", "num_paused_requests"} for b in bodies)
    assert str(bad_file) in bodies[0]["message"] and "'tok_emb.weight'" in bodies[0]["message"]
    assert "shape (100, 64) does not match the model's (100, 32)" in bodies[0]["message"]
    assert "no such directory" in bodies[1]["message"]
    assert f"{loose}: is a file" in bodies[2]["message"]  # SGLang would try a hub download with a file path
    assert "Hugging Face checkpoint directory" in bodies[2]["message"]
    assert "has no config.json" in bodies[3]["message"]
    assert version_after == version and after.output_ids == before.output_ids


# -- memory ------------------------------------------------------------------------------------------------


def test_release_really_frees_and_resume_restores_exactly(support, engine):
    async def main() -> dict[str, Any]:
        out: dict[str, Any] = {}
        async with client_for(engine) as client:
            out["before"] = await client.generate("Hello", sampling_params=GREEDY)
            out["mem0"] = await support.internal_state(client)
            status, text = await support.raw(engine.url, "POST", "/release_memory_occupation", body={})
            out["release_raw"] = (status, text)
            out["mem1"] = await support.internal_state(client)
            out["health"] = [await support.raw(engine.url, "GET", p) for p in ("/health", "/health_generate")]
            out["generate"] = await support.raw(engine.url, "POST", "/generate", body={"text": "Hello"})
            out["model_info"] = (await client.model_info()).weight_version
            try:
                await client.release_memory_occupation(["weights"])
            except EngineHTTPError as exc:
                out["again"] = exc
            await client.resume_memory_occupation(["weights"])
            out["mem2"] = await support.internal_state(client)
            out["kv_still_released"] = await support.raw(engine.url, "POST", "/generate", body={"text": "Hello"})
            status, text = await support.raw(
                engine.url, "POST", "/resume_memory_occupation", body={"tags": ["kv_cache"]}
            )
            out["resume_raw"] = (status, text)
            out["mem3"] = await support.internal_state(client)
            out["health_after"] = await support.raw(engine.url, "GET", "/health_generate")
            out["after"] = await client.generate("Hello", sampling_params=GREEDY)
            await client.release_memory_occupation(["kv_cache", "cuda_graph"])
            out["mem4"] = await support.internal_state(client)
            await client.resume_memory_occupation()  # None: every released tag (only the KV cache here)
            out["mem5"] = await support.internal_state(client)
        return out

    out = run(main())
    mem0, mem1, mem2, mem3 = out["mem0"], out["mem1"], out["mem2"], out["mem3"]
    assert mem0["weights_bytes"] > 100_000 and mem0["kv_cache_bytes"] > 1_000_000
    assert out["release_raw"] == (200, "null")
    assert (mem1["weights_bytes"], mem1["kv_cache_bytes"], mem1["weights_resident"], mem1["kv_cache_resident"]) == (
        0,
        0,
        False,
        False,
    )
    assert mem1["memory_usage"]["weight"] == 0.0 and mem1["memory_usage"]["kvcache"] == 0.0
    assert out["health"] == [(503, ""), (503, "")]
    status, text = out["generate"]
    assert status == 503 and "weights are released" in MessageErrorBody.model_validate_json(text).error.message
    assert out["model_info"] == "default"
    assert out["again"].status == 400 and "weights is already released" in out["again"].body
    assert mem2["weights_bytes"] == mem0["weights_bytes"] and mem2["kv_cache_bytes"] == 0
    assert out["kv_still_released"][0] == 503 and "KV cache is released" in out["kv_still_released"][1]
    assert out["resume_raw"] == (200, "null")
    assert (mem3["weights_bytes"], mem3["kv_cache_bytes"]) == (mem0["weights_bytes"], mem0["kv_cache_bytes"])
    assert out["health_after"] == (200, "")
    assert out["after"].output_ids == out["before"].output_ids
    assert out["mem4"]["kv_cache_bytes"] == 0 and out["mem4"]["weights_bytes"] == mem0["weights_bytes"]
    assert out["mem5"]["kv_cache_bytes"] == mem0["kv_cache_bytes"]


def test_resume_refuses_a_weights_file_that_changed_since_it_was_loaded(support, engine, ref, tmp_path):
    path = ref.save_pretrained(tmp_path / "live")
    original = (path / "model.safetensors").read_bytes()

    async def main() -> tuple[Any, ...]:
        async with client_for(engine) as client:
            before = await client.generate("Hello", sampling_params=GREEDY)
            await client.update_weights_from_disk(str(path))
            await client.release_memory_occupation(["weights"])
            TinyCausalLM("tiny", seed=8).save_pretrained(path)  # the trainer overwrote it meanwhile
            try:
                await client.resume_memory_occupation(["weights"])
                refused = None
            except EngineHTTPError as exc:
                refused = exc
            still_released = (await support.internal_state(client))["weights_resident"] is False
            (path / "model.safetensors").write_bytes(original)
            await client.resume_memory_occupation(["weights"])
            after = await client.generate("Hello", sampling_params=GREEDY)
            return before, refused, still_released, after

    before, refused, still_released, after = run(main())
    assert refused is not None and refused.status == 400
    assert "changed since it was loaded" in refused.body and str(path) in refused.body
    assert still_released and after.output_ids == before.output_ids


# -- cache and version --------------------------------------------------------------------------------------


def test_flush_cache_and_update_weight_version(support, engine, contracts):
    assert "Cache flushed." in contracts.endpoint("/flush_cache")["response_from_source"]

    async def main() -> list[Any]:
        async with client_for(engine) as client:
            out: list[Any] = [await client.flush_cache(), await support.raw(engine.url, "GET", "/flush_cache")]
            out.append(await support.raw(engine.url, "POST", "/flush_cache?timeout=-1"))
            status, text = await support.raw(
                engine.url, "POST", "/update_weight_version", body={"new_version": "v9", "abort_all_requests": True}
            )
            out.append((status, json.loads(text)))
            out.append((await client.model_info()).weight_version)
            out.append((await client.generate("Hi", sampling_params={"max_new_tokens": 2})).meta_info.weight_version)
            await client.update_weight_version("default")
        return out

    flushed, get_form, bad_timeout, version, info, meta = run(main())
    assert flushed.startswith("Cache flushed.") and get_form[0] == 200 and get_form[1].startswith("Cache flushed.")
    assert bad_timeout[0] == 400 and ValidationErrorBody.model_validate_json(bad_timeout[1])
    assert version == (200, {"success": True, "message": "Weight version updated to v9.", "new_version": "v9"})
    assert info == meta == "v9"


def test_the_command_line_binds_the_port_before_importing_torch() -> None:
    """Why a taken port fails in well under a second: the CLI module imports no torch; only ``run`` does."""
    import subprocess
    import sys

    code = "import sys, engines.cpu.cli; print('torch' in sys.modules, 'engines.cpu.app' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]


def test_a_bad_request_is_refused_alone_while_other_clients_complete(support, engine):
    """Issue 27, cause 7, on a real process: several clients generate while others send what the engine cannot
    compute (a NaN or infinite temperature; a seed past 64 bits); each bad one is a 400 in SGLang's message
    shape, every normal one completes. (The in-process witnesses that re-introduce the old validator and the old
    scheduler step are in test_sampling_isolation.py.)"""
    normal = {"max_new_tokens": 40, "temperature": 1.0, "ignore_eos": True}
    bad = [
        {"temperature": float("nan")},
        {"temperature": float("inf")},
        {"sampling_seed": 1 << 64},
    ]

    async def main() -> tuple[list[tuple[int, str]], list[tuple[int, str]]]:
        good = [
            asyncio.ensure_future(
                support.raw(engine.url, "POST", "/generate", body={"text": f"p{i}", "sampling_params": normal})
            )
            for i in range(4)
        ]
        refused = [
            await support.raw(engine.url, "POST", "/generate", body={"text": "x", "sampling_params": {**normal, **b}})
            for b in bad
        ]
        return list(await asyncio.gather(*good)), refused

    good, refused = run(main())
    for status, text in good:
        assert status == 200 and json.loads(text)["meta_info"]["finish_reason"]["type"] == "length", text
    for (status, text), b in zip(refused, bad, strict=True):
        assert status == 400, (b, text)
        assert next(iter(b)) in MessageErrorBody.model_validate_json(text).error.message, text


@pytest.mark.weight_update
def test_the_weight_update_session_brackets_one_update_at_a_time(support, engine, contracts):
    """SGLang 0.5.23's /begin_weight_update ... /end_weight_update: one session at a time, ended only once."""
    assert contracts.endpoint("/begin_weight_update")["request_body"]["schema_name"] == "BeginWeightUpdateReqInput"

    async def main() -> list[tuple[int, Any]]:
        calls = [("/begin_weight_update", {}), ("/begin_weight_update", {"selector": "all"})]
        calls += [("/end_weight_update", {}), ("/end_weight_update", {}), ("/begin_weight_update", {"selector": "x"})]
        out = []
        for path, body in calls:
            status, text = await support.raw(engine.url, "POST", path, body=body)
            out.append((status, json.loads(text)))
        return out

    begun, again, ended, unmatched, bad = run(main())
    assert begun == (200, {"success": True, "message": "Weight update session begun."})
    assert again[0] == 400 and again[1]["success"] is False and "already open" in again[1]["message"]
    assert ended == (200, {"success": True, "message": "Weight update session ended."})
    assert unmatched[0] == 400 and "no weight-update session is open" in unmatched[1]["message"]
    assert bad[0] == 400 and ValidationErrorBody.model_validate_json(json.dumps(bad[1]))
