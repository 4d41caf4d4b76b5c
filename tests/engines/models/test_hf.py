"""The Hugging Face model family in-process: the tiny Llama builder, the HFCausalLM wrapper, the family dispatch.

A real ``LlamaForCausalLM`` and a tokenizer trained here with ``tokenizers`` (nothing from a hub): the
directory the builder and the wrapper write is what ``transformers`` itself loads.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers", reason="the hf extra is not installed: pip install 'rl-lifecycle[hf]'")

from engines.models import (
    CharTokenizer,
    CheckpointError,
    TinyCausalLM,
    WeightsFileError,
    build_tiny_llama,
    load_causal_lm,
    load_tokenizer,
    sample_token,
)
from engines.models.hf import HFCausalLM


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_llama(tmp_path_factory.mktemp("llama") / "model", seed=0)


@pytest.fixture(scope="module")
def llama(llama_dir: Path) -> HFCausalLM:
    model = load_causal_lm(llama_dir)
    assert isinstance(model, HFCausalLM)
    return model


def _digests(directory: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(directory.iterdir())}


def test_the_same_seed_builds_bitwise_the_same_directory(tmp_path: Path, llama_dir: Path) -> None:
    again = build_tiny_llama(tmp_path / "again", seed=0)
    other = build_tiny_llama(tmp_path / "other", seed=1)
    assert _digests(again) == _digests(llama_dir)
    assert set(_digests(llama_dir)) >= {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"}
    assert _digests(other)["model.safetensors"] != _digests(llama_dir)["model.safetensors"]
    config = json.loads((llama_dir / "config.json").read_text())
    assert config["model_type"] == "llama" and config["architectures"] == ["LlamaForCausalLM"]
    assert config["vocab_size"] == 128 and config["num_key_value_heads"] == 2


def test_transformers_loads_the_built_and_a_written_directory(tmp_path: Path, llama_dir: Path, llama) -> None:
    """The format is real, not private: AutoModelForCausalLM / AutoTokenizer read what we write, offline."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    written = llama.save_pretrained(tmp_path / "step-1")
    for directory in (llama_dir, written):
        net = AutoModelForCausalLM.from_pretrained(directory, local_files_only=True)
        tok = AutoTokenizer.from_pretrained(directory, local_files_only=True)
        ids = tok.encode("qwer:abab")
        assert ids == llama.tokenizer.encode("qwer:abab") and ids[0] == tok.bos_token_id == 1
        with torch.no_grad():
            assert torch.equal(net(torch.tensor([ids])).logits, llama.forward(torch.tensor([ids])))


def test_the_tokenizer_is_small_adds_bos_and_round_trips(llama) -> None:
    tok = llama.tokenizer
    assert tok.vocab_size == 128 and (tok.pad_id, tok.bos_id, tok.eos_id) == (0, 1, 2)
    ids = tok.encode("abcd:abababab")
    assert ids[0] == tok.bos_id and tok.decode(ids) == "abcd:abababab"
    assert tok.decode(ids, skip_special_tokens=False) == "<bos>abcd:abababab"
    assert "".join(tok.token_text(i) for i in ids[1:]) == "abcd:abababab"
    with pytest.raises(ValueError, match="outside the vocabulary"):
        tok.token_text(tok.vocab_size)


def test_incremental_decoding_matches_the_full_forward(llama) -> None:
    ids = llama.tokenizer.encode("qwer:abababab")
    with torch.no_grad():
        full = llama.forward(torch.tensor([ids]))[0]
    cache = llama.new_kv_cache(2)
    slot = cache.acquire()
    steps = [llama.prefill(cache, slot, ids[:4])]
    steps += [llama.decode_step(cache, slot, ids[i], i) for i in range(4, len(ids))]
    assert torch.allclose(torch.stack(steps), full[3:], atol=1e-5)


def _greedy(model: HFCausalLM, cache, slot: int, prompt: list[int], n: int, *, retract_at: int | None = None):
    logits = model.prefill(cache, slot, prompt)
    out: list[int] = []
    for i in range(n):
        token, _ = sample_token(logits, temperature=0.0)
        out.append(token)
        if i == retract_at:  # the scheduler's retract: free the slot, prefill again, replay the output
            cache.free(slot)
            slot = cache.acquire()
            model.prefill(cache, slot, prompt)
            for j, t in enumerate(out[:-1]):
                model.decode_step(cache, slot, t, len(prompt) + j)
        logits = model.decode_step(cache, slot, token, len(prompt) + i)
    return out, logits


def test_retract_and_prefill_again_continue_bitwise_the_same(llama) -> None:
    prompt = llama.tokenizer.encode("zzzz:")
    cache = llama.new_kv_cache(2)
    plain, last = _greedy(llama, cache, cache.acquire(), prompt, 12)
    cache = llama.new_kv_cache(2)
    retracted, last_again = _greedy(llama, cache, cache.acquire(), prompt, 12, retract_at=5)
    assert plain == retracted and torch.equal(last, last_again)


def test_kv_pool_and_weights_release_really_free(llama_dir: Path) -> None:
    model = load_causal_lm(llama_dir)
    cache = model.new_kv_cache(4)
    layout = (2, 4, 2, 128, 16)  # layers, slots, kv heads (grouped-query), context, head dim
    assert cache.shape == layout and cache.nbytes == 2 * 4 * 2 * 4 * 2 * 128 * 16
    slot = cache.acquire()
    with pytest.raises(RuntimeError, match="1 slots are in use"):
        cache.release()
    cache.free(slot)
    cache.release()
    assert cache.nbytes == 0 and not cache.resident
    before = model.weight_bytes
    ids = torch.tensor([model.tokenizer.encode("abcd:")])
    with torch.no_grad():
        expected = model.forward(ids)
    model.release_weights()
    assert model.weight_bytes == 0 and not model.weights_resident
    assert model.expected_tensors()["model.embed_tokens.weight"] == (128, 64)
    model.load_pretrained(llama_dir)
    assert model.weight_bytes == before and model.weights_resident
    with torch.no_grad():
        assert torch.equal(model.forward(ids), expected)


def test_training_moves_the_weights_and_a_written_directory_round_trips(tmp_path: Path, llama_dir: Path) -> None:
    model = load_causal_lm(llama_dir)
    ids = torch.tensor([model.tokenizer.encode("abcd:abab")])
    loss = -model.token_logprobs(ids, temperature=1.0).mean()
    loss.backward()
    assert all(p.grad is not None for p in model.parameters())
    torch.optim.SGD(model.parameters(), lr=0.5).step()
    written = model.save_pretrained(tmp_path / "trained")
    back = load_causal_lm(written)
    with torch.no_grad():
        assert torch.equal(back.forward(ids), model.forward(ids))
        assert not torch.equal(back.forward(ids), load_causal_lm(llama_dir).forward(ids))
    assert (written / "tokenizer.json").read_bytes() == (llama_dir / "tokenizer.json").read_bytes()


def test_a_directory_of_another_architecture_is_refused_by_name(tmp_path: Path, llama, llama_dir: Path) -> None:
    wide = build_tiny_llama(tmp_path / "wide", seed=0, hidden_size=128)
    char = TinyCausalLM("tiny", seed=0).save_pretrained(tmp_path / "char")
    with pytest.raises(WeightsFileError, match=r"wide/model\.safetensors.*'model\.embed_tokens\.weight'.*\(128, 128\)"):
        llama.load_pretrained(wide)
    with pytest.raises(CheckpointError, match=r"char/config\.json.*'rl-lifecycle-char' is not this engine's 'llama'"):
        llama.load_pretrained(char)
    with pytest.raises(CheckpointError, match="'llama' is not this engine's 'rl-lifecycle-char'"):
        TinyCausalLM("tiny").load_pretrained(llama_dir)


def test_the_family_is_the_directorys_and_errors_name_the_path_and_fix(
    tmp_path: Path, llama_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    char = TinyCausalLM("small", seed=2).save_pretrained(tmp_path / "char")
    model = load_causal_lm(char)
    assert isinstance(model, TinyCausalLM) and model.config.name == "small"
    assert isinstance(load_tokenizer(char), CharTokenizer)
    assert load_tokenizer(llama_dir).encode("abcd:") == load_causal_lm(llama_dir).tokenizer.encode("abcd:")
    (tmp_path / "garbage").mkdir()
    (tmp_path / "garbage" / "config.json").write_text('{"model_type": "llama"}')  # defaults: a 7B model
    (tmp_path / "garbage" / "model.safetensors").write_bytes(b"\0" * 16)
    with pytest.raises(WeightsFileError, match=r"garbage/model\.safetensors: cannot be read as safetensors"):
        load_causal_lm(tmp_path / "garbage")  # refused from the header, before a 7B model is allocated
    (tmp_path / "garbage" / "config.json").write_text("{}")
    with pytest.raises(CheckpointError, match=r"garbage/config\.json: has no model_type"):
        load_causal_lm(tmp_path / "garbage")
    with pytest.raises(CheckpointError, match="no such directory"):
        load_tokenizer(tmp_path / "absent")
    monkeypatch.setitem(sys.modules, "transformers", None)  # as if the hf extra were not installed
    with pytest.raises(CheckpointError, match=r"model.*needs transformers.*pip install 'rl-lifecycle\[hf\]'"):
        load_causal_lm(llama_dir)
    assert isinstance(load_causal_lm(char), TinyCausalLM)  # the char model never needs it
