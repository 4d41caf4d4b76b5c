"""The CPU engine serving a Hugging Face model (a tiny Llama built here), as a real process over HTTP.

Started with ``--weights DIR``: the directory's ``model_type`` picks the family, so the engine serves
``LlamaForCausalLM`` with the directory's own tokenizer, context and EOS. Same checks as the char
model's (tests/engines/cpu/test_http_api.py): generation is the reference model's, weights load by
directory and change outputs, memory is really released and restored, errors are SGLang's bodies.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("transformers", reason="the hf extra is not installed: pip install 'rl-lifecycle[hf]'")

from engines.client import EngineClient
from engines.errors import EngineHTTPError
from engines.models import TinyCausalLM, build_tiny_llama, load_causal_lm, load_tokenizer
from engines.models.hf import HFCausalLM
from engines.process import ServerProcess, torch_engine_command
from engines.protocol import SamplingParams

GREEDY = SamplingParams(max_new_tokens=16, temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_llama(tmp_path_factory.mktemp("hf-engine") / "model", seed=0)


@pytest.fixture(scope="module")
def engine(llama_dir: Path) -> Iterator[ServerProcess]:
    proc = ServerProcess(torch_engine_command(seed=4, weights=llama_dir), engine_id="test-llama")
    proc.spawn()
    try:
        proc.wait_ready(120.0)
        yield proc
    finally:
        proc.close()


@pytest.fixture(scope="module")
def ref(llama_dir: Path) -> HFCausalLM:
    torch.set_num_threads(1)
    model = load_causal_lm(llama_dir)
    assert isinstance(model, HFCausalLM)
    return model


def client_for(engine: ServerProcess) -> EngineClient:
    return EngineClient(engine.url, engine_id="llama-0", timeout=30.0)


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def test_generation_on_text_and_input_ids_is_the_reference_models(support, engine, ref, llama_dir):
    tokenizer = load_tokenizer(llama_dir)  # what the rollout side tokenizes prompts with
    prompts = ["qwer:", "abcd:", "zz:"]
    sampled = SamplingParams(max_new_tokens=12, temperature=1.0, ignore_eos=True, sampling_seed=3)

    async def main() -> tuple[Any, ...]:
        async with client_for(engine) as client:
            texts = [await client.generate(p, sampling_params=GREEDY, return_logprob=True) for p in prompts]
            ids = await client.generate_batch(
                input_ids=[tokenizer.encode(p) for p in prompts], sampling_params=[GREEDY] * 3
            )
            hot = await client.generate(
                "qwer:", sampling_params=sampled, return_logprob=True, return_text_in_logprobs=True
            )
            hot_ids = await client.generate_batch(input_ids=[tokenizer.encode("qwer:")], sampling_params=[sampled])
            return texts, ids, hot, hot_ids[0]

    texts, ids, hot, hot_ids = run(main())
    for prompt, res in zip(prompts, texts, strict=True):
        expected, lps = support.reference_greedy(ref, prompt, 16)
        assert res.output_ids == expected and res.text == ref.tokenizer.decode(expected)
        assert res.meta_info.prompt_tokens == len(tokenizer.encode(prompt))
        assert [lp for lp, _, _ in res.meta_info.output_token_logprobs] == pytest.approx(lps, abs=1e-4)
    assert [r.output_ids for r in ids] == [r.output_ids for r in texts]  # text == load_tokenizer(dir).encode(text)
    assert hot.output_ids == hot_ids.output_ids
    engine_lps = [lp for lp, _, _ in hot.meta_info.output_token_logprobs]
    trainer_lps = support.teacher_forced_logprobs(ref, "qwer:", hot.output_ids, temperature=1.0)
    assert engine_lps == pytest.approx(trainer_lps, abs=1e-4)
    assert [t for _, _, t in hot.meta_info.output_token_logprobs] == [
        ref.tokenizer.token_text(i) for i in hot.output_ids
    ]


def test_load_tokenizer_is_the_engines_text_tokenization_for_the_char_model_too(main_engine, tmp_path):
    """The char family's half of the equality the rollout side relies on (the main engine serves seed 7)."""
    char_dir = TinyCausalLM("tiny", seed=7).save_pretrained(tmp_path / "char")
    tokenizer = load_tokenizer(char_dir)

    async def main() -> tuple[Any, Any]:
        async with client_for(main_engine) as client:
            text = await client.generate("Hello", sampling_params=GREEDY)
            ids = await client.generate_batch(input_ids=[tokenizer.encode("Hello")], sampling_params=[GREEDY])
            return text, ids[0]

    text, ids = run(main())
    assert text.output_ids == ids.output_ids and text.meta_info.prompt_tokens == len(tokenizer.encode("Hello"))


def test_stop_strings_vocabulary_and_context_are_the_models(support, engine, ref):
    expected, _ = support.reference_greedy(ref, "qwer:", 16)
    text = ref.tokenizer.decode(expected)
    stop = text[6:8]

    async def main() -> tuple[Any, ...]:
        async with client_for(engine) as client:
            stopped = await client.generate(
                "qwer:", sampling_params=SamplingParams(max_new_tokens=16, temperature=0.0, stop=stop)
            )
            vocab = await support.raw(engine.url, "POST", "/generate", body={"input_ids": [1, 128]})
            context = await support.raw(
                engine.url, "POST", "/generate", body={"text": "abcd:", "sampling_params": {"max_new_tokens": 200}}
            )
            _, info = await support.raw(engine.url, "GET", "/server_info")
            return stopped, vocab, context, json.loads(info)

    stopped, vocab, context, info = run(main())
    assert stopped.meta_info.finish_reason.model_dump(exclude_none=True) == {"type": "stop", "matched": stop}
    assert text.startswith(stopped.text) and not stopped.text.endswith(stop)
    assert vocab[0] == 400 and "outside the vocabulary [0, 128)" in vocab[1]
    assert context[0] == 400 and "maximum context length of 128 tokens" in context[1]
    assert info["context_length"] == 128 and info["model_size"] is None


@pytest.mark.weight_update
def test_update_weights_from_a_trainer_written_directory_changes_outputs(support, engine, ref, llama_dir, tmp_path):
    trained = load_causal_lm(llama_dir)
    with torch.no_grad():
        for p in trained.parameters():
            p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(1)) * 0.05)
    step1 = trained.save_pretrained(tmp_path / "step-1")

    async def main() -> dict[str, Any]:
        out: dict[str, Any] = {}
        async with client_for(engine) as client:
            out["info0"] = await client.model_info()
            out["before"] = await client.generate("qwer:", sampling_params=GREEDY)
            out["update"] = await client.update_weights_from_disk(str(step1), weight_version="v1")
            out["info1"] = await client.model_info()
            out["after"] = await client.generate("qwer:", sampling_params=GREEDY)
            await client.update_weights_from_disk(str(llama_dir), weight_version="default")
            out["back"] = await client.generate("qwer:", sampling_params=GREEDY)
        return out

    out = run(main())
    info0, info1 = out["info0"], out["info1"]
    assert info0.model_path == str(llama_dir) and info0.architectures == ["LlamaForCausalLM"]
    assert info0.model_type == "llama" and info0.tokenizer_path == str(llama_dir)
    assert out["update"].success and info1.weight_version == "v1" and info1.model_path == str(step1)
    assert out["after"].meta_info.weight_version == "v1"
    assert out["after"].output_ids == support.reference_greedy(trained, "qwer:", 16)[0] != out["before"].output_ids
    assert out["back"].output_ids == out["before"].output_ids


def test_a_directory_of_another_architecture_is_refused_naming_it(engine, llama_dir, tmp_path):
    char = TinyCausalLM("tiny", seed=1).save_pretrained(tmp_path / "char")
    wide = build_tiny_llama(tmp_path / "wide", seed=0, hidden_size=128)

    async def main() -> tuple[Any, list[EngineHTTPError], Any]:
        async with client_for(engine) as client:
            before = await client.generate("qwer:", sampling_params=GREEDY)
            errors = []
            for path in (char, wide):
                try:
                    await client.update_weights_from_disk(str(path), weight_version="never")
                except EngineHTTPError as exc:
                    errors.append(exc)
            return before, errors, await client.generate("qwer:", sampling_params=GREEDY)

    before, errors, after = run(main())
    bodies = [json.loads(e.body) for e in errors]
    assert [e.status for e in errors] == [400, 400] and all(b["success"] is False for b in bodies)
    assert set(bodies[0]) == {"success", "message", "num_paused_requests"}
    assert (
        f"{char}/config.json" in bodies[0]["message"]
        and "'rl-lifecycle-char' is not this engine's 'llama'" in (bodies[0]["message"])
    )
    assert f"{wide}/model.safetensors" in bodies[1]["message"] and "'model.embed_tokens.weight'" in bodies[1]["message"]
    assert after.output_ids == before.output_ids and after.meta_info.weight_version == before.meta_info.weight_version


def test_release_and_resume_of_weights_and_kv_restore_exactly(support, engine):
    async def main() -> dict[str, Any]:
        out: dict[str, Any] = {}
        async with client_for(engine) as client:
            out["before"] = await client.generate("abcd:", sampling_params=GREEDY)
            out["mem0"] = await support.internal_state(client)
            await client.release_memory_occupation()
            out["mem1"] = await support.internal_state(client)
            body = {"text": "abcd:", "sampling_params": {"max_new_tokens": 4}}  # SGLang's default 128: past context
            out["generate"] = await support.raw(engine.url, "POST", "/generate", body=body)
            await client.resume_memory_occupation()
            out["mem2"] = await support.internal_state(client)
            out["after"] = await client.generate("abcd:", sampling_params=GREEDY)
        return out

    out = run(main())
    mem0, mem1, mem2 = out["mem0"], out["mem1"], out["mem2"]
    assert mem0["weights_bytes"] == 361_728 and mem0["kv_cache_bytes"] == 2 * 2 * 16 * 2 * 128 * 16 * 4
    assert (mem1["weights_bytes"], mem1["kv_cache_bytes"], mem1["weights_resident"]) == (0, 0, False)
    assert out["generate"][0] == 503 and "weights are released" in out["generate"][1]
    assert (mem2["weights_bytes"], mem2["kv_cache_bytes"]) == (mem0["weights_bytes"], mem0["kv_cache_bytes"])
    assert out["after"].output_ids == out["before"].output_ids
