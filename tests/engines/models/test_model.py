"""The model in-process: tokenizer, deterministic init, training path, KV decoding, weights files, sampling."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import save_file

from engines.models import (
    BOS_ID,
    EOS_ID,
    UNK_ID,
    VOCAB_SIZE,
    CharTokenizer,
    KVCache,
    ModelConfig,
    TinyCausalLM,
    WeightsFileError,
    read_weights_file,
    sample_token,
)


@pytest.fixture(scope="module")
def model() -> TinyCausalLM:
    return TinyCausalLM("tiny", seed=3)


def test_tokenizer_round_trip_and_specials():
    tok = CharTokenizer()
    ids = tok.encode("Hi there!\n")
    assert ids[0] == BOS_ID and len(ids) == 11 and max(ids) < VOCAB_SIZE
    assert tok.decode(ids) == "Hi there!\n"
    assert tok.decode([*ids, EOS_ID], skip_special_tokens=False) == "<bos>Hi there!\n<eos>"
    assert tok.encode("é", add_bos=False) == [UNK_ID] and tok.decode([UNK_ID]) == "\ufffd"
    with pytest.raises(ValueError, match="outside the vocabulary"):
        tok.token_text(VOCAB_SIZE)


def test_init_depends_on_seed_only(model):
    torch.manual_seed(12345)  # the global RNG must not matter
    same = TinyCausalLM("tiny", seed=3)
    other = TinyCausalLM("tiny", seed=4)
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), same.state_dict().values(), strict=True))
    assert not torch.equal(model.lm_head.weight, other.lm_head.weight)


def test_forward_is_causal_and_differentiable():
    model = TinyCausalLM("tiny", seed=3)
    ids = torch.tensor([model.tokenizer.encode("abcdef")])
    logits = model(ids)
    assert logits.shape == (1, 7, VOCAB_SIZE)
    changed = ids.clone()
    changed[0, -1] = 50
    assert torch.allclose(model(changed)[0, :-1], logits[0, :-1])  # the future does not leak backwards
    loss = -model.token_logprobs(ids).mean()
    loss.backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in model.parameters())


def test_incremental_decoding_matches_the_full_forward(model):
    ids = model.tokenizer.encode("incremental")
    full = model(torch.tensor([ids]))[0].detach()
    cache = KVCache(model.config, num_slots=2)
    slot = cache.acquire()
    assert torch.allclose(model.prefill(cache, slot, ids[:4]), full[3], atol=1e-5)
    for pos in range(4, len(ids)):
        assert torch.allclose(model.decode_step(cache, slot, ids[pos], pos), full[pos], atol=1e-5)


def test_kv_cache_release_frees_the_tensors(model):
    cache = KVCache(model.config, num_slots=4)
    expected = 2 * 4 * model.config.n_layers * model.config.max_seq_len * model.config.d_model * 4
    assert cache.nbytes == expected
    slot = cache.acquire()
    with pytest.raises(RuntimeError, match="slots are in use"):
        cache.release()
    cache.free(slot)
    cache.release()
    assert cache.nbytes == 0 and cache.k is None and not cache.resident
    with pytest.raises(RuntimeError, match="released"):
        model.prefill(cache, cache.acquire(), [1, 5])
    cache.allocate()
    assert cache.nbytes == expected


def test_release_and_init_weights_restore_the_seed_exactly():
    model = TinyCausalLM("tiny", seed=9)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    model.release_weights()
    assert not model.weights_resident and model.weight_bytes == 0
    assert model.expected_tensors()["lm_head.weight"] == (VOCAB_SIZE, 32)
    model.init_weights(9)
    assert model.weights_resident
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


@pytest.mark.parametrize("suffix", [".safetensors", ".pt"])
def test_weights_round_trip(tmp_path, model, suffix):
    path = model.save_weights(tmp_path / f"w{suffix}")
    fresh = TinyCausalLM("tiny", seed=99)
    loaded = fresh.load_weights(path)
    assert loaded.load_format == ("pt" if suffix == ".pt" else "safetensors") and len(loaded.sha256) == 64
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), fresh.state_dict().values(), strict=True))


def test_a_directory_with_one_weights_file_is_accepted(tmp_path, model):
    model.save_weights(tmp_path / "model.safetensors")
    assert read_weights_file(tmp_path, model.expected_tensors()).path == tmp_path / "model.safetensors"


def test_wrong_shape_names_file_and_tensor_and_changes_nothing(tmp_path, model):
    wide = ModelConfig("wide", d_model=64, n_layers=2, n_heads=2, max_seq_len=256)  # same names, other shapes
    path = TinyCausalLM(wide, seed=0).save_weights(tmp_path / "wide.safetensors")
    target = TinyCausalLM("tiny", seed=5)
    before = target.lm_head.weight.clone()
    with pytest.raises(WeightsFileError) as info:
        target.load_weights(path)
    err = info.value
    assert err.path == str(path) and err.tensor == "tok_emb.weight"
    assert (
        str(err)
        == f"weights file {path}: tensor 'tok_emb.weight': shape (100, 64) does not match the model's (100, 32)"
    )
    assert torch.equal(target.lm_head.weight, before)


def test_every_bad_file_is_one_weights_file_error(tmp_path, model):
    state = {k: v.clone() for k, v in model.state_dict().items()}
    expected = model.expected_tensors()
    cases = {}
    save_file({k: v for k, v in state.items() if k != "ln_f.bias"}, str(tmp_path / "missing.safetensors"))
    cases["missing"] = "missing tensors: ln_f.bias"
    save_file({**state, "extra": torch.zeros(1)}, str(tmp_path / "extra.safetensors"))
    cases["extra"] = "unexpected tensors: extra"
    save_file({**state, "ln_f.bias": torch.full((32,), float("nan"))}, str(tmp_path / "nan.safetensors"))
    cases["nan"] = "tensor 'ln_f.bias': contains NaN or inf values"
    save_file({**state, "ln_f.bias": torch.zeros(32, dtype=torch.int64)}, str(tmp_path / "int.safetensors"))
    cases["int"] = "tensor 'ln_f.bias': dtype torch.int64 is not a floating-point dtype"
    (tmp_path / "junk.safetensors").write_bytes(b"\x00" * 64)
    cases["junk"] = "cannot be read as safetensors"
    torch.save({"state_dict": state}, tmp_path / "nested.pt")
    cases["nested"] = "expected a flat mapping of tensor name -> tensor"
    TinyCausalLM("small", seed=0).save_weights(tmp_path / "small.safetensors")
    cases["small"] = "unexpected tensors: blocks.2."
    cases["absent"] = "no such file or directory"
    for name, message in cases.items():
        suffix = ".pt" if name == "nested" else ".safetensors"
        with pytest.raises(WeightsFileError, match=r"^weights file ") as info:
            read_weights_file(tmp_path / f"{name}{suffix}", expected)
        assert message in str(info.value), name
    with pytest.raises(WeightsFileError, match="load_format 'gguf' is not supported"):
        read_weights_file(tmp_path / "extra.safetensors", expected, load_format="gguf")
    torch.save(state, tmp_path / "ok.bin")
    assert set(read_weights_file(tmp_path / "ok.bin", expected, load_format="pt").state) == set(expected)


def test_bf16_weights_are_accepted_as_float32(tmp_path, model):
    save_file({k: v.to(torch.bfloat16) for k, v in model.state_dict().items()}, str(tmp_path / "bf16.safetensors"))
    state = read_weights_file(tmp_path / "bf16.safetensors", model.expected_tensors()).state
    assert all(t.dtype == torch.float32 for t in state.values())


def test_sampling_greedy_temperature_topk_topp():
    logits = torch.tensor([0.0, 3.0, 1.0, 2.9, -1.0])
    token, lp = sample_token(logits, temperature=0.0)
    assert token == 1 and lp == pytest.approx(float(torch.log_softmax(logits, -1)[1]))
    token, lp = sample_token(logits, temperature=0.5, generator=torch.Generator().manual_seed(0))
    assert lp == pytest.approx(float(torch.log_softmax(logits / 0.5, -1)[token]))  # temperature-scaled logprob
    draws = {
        sample_token(logits, temperature=1.0, top_k=2, generator=torch.Generator().manual_seed(s))[0] for s in range(60)
    }
    assert draws == {1, 3}
    draws = {
        sample_token(logits, temperature=1.0, top_p=0.3, generator=torch.Generator().manual_seed(s))[0]
        for s in range(60)
    }
    assert draws == {1}
    assert sample_token(logits, temperature=0.0, banned=[1])[0] == 3


def test_same_generator_seed_same_samples():
    logits = torch.zeros(VOCAB_SIZE)
    a = [sample_token(logits, temperature=1.0, generator=g)[0] for g in [torch.Generator().manual_seed(1)] * 20]
    b = [sample_token(logits, temperature=1.0, generator=g)[0] for g in [torch.Generator().manual_seed(1)] * 20]
    assert a == b and len(set(a)) > 5
