"""Checkpoint directories: the format SGLang's --model-path and /update_weights_from_disk take, written
whole or not at all, pruned to the last K, and every wrong path one error naming it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import engines.models.checkpoint as checkpoint
from engines.models import TinyCausalLM
from engines.models.checkpoint import CheckpointError, checkpoint_config, checkpoint_steps, prune_checkpoints


def _same(a: TinyCausalLM, b: TinyCausalLM) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values(), strict=True))


def test_a_checkpoint_directory_round_trips_and_says_what_it_holds(tmp_path: Path) -> None:
    model = TinyCausalLM("tiny", seed=4)
    path = model.save_pretrained(tmp_path / "step-4")
    assert sorted(p.name for p in path.iterdir()) == ["config.json", "model.safetensors", "tokenizer_config.json"]
    config = json.loads((path / "config.json").read_text())
    assert config["model_type"] == "rl-lifecycle-char" and config["hidden_size"] == model.config.d_model
    assert config["architectures"] == ["TinyCausalLM"] and config["vocab_size"] == model.config.vocab_size
    assert json.loads((path / "tokenizer_config.json").read_text())["tokenizer_class"] == "CharTokenizer"
    other = TinyCausalLM("tiny", seed=5)
    assert not _same(model, other)
    loaded = other.load_pretrained(path)
    assert _same(model, other) and loaded.path == path / "model.safetensors"


def test_a_write_that_fails_leaves_the_previous_directory_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Atomic: a reader never sees half a checkpoint, and a failed rewrite keeps the old one and no leftover."""
    old = TinyCausalLM("tiny", seed=1)
    path = old.save_pretrained(tmp_path / "step-1")

    def crash(*args: object, **kwargs: object) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(checkpoint, "save_file", crash)
    with pytest.raises(OSError, match="disk full"):
        TinyCausalLM("tiny", seed=2).save_pretrained(path)
    monkeypatch.undo()
    fresh = TinyCausalLM("tiny", seed=3)
    fresh.load_pretrained(path)
    assert _same(fresh, old)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-1"]  # the failed write removed its sibling


def test_a_rename_that_fails_puts_the_old_directory_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    old = TinyCausalLM("tiny", seed=1)
    path = old.save_pretrained(tmp_path / "step-1")
    real = checkpoint.os.rename

    def rename(src: object, dst: object) -> None:
        if ".tmp-" in str(src):
            raise OSError("rename failed")
        real(src, dst)  # type: ignore[arg-type]

    monkeypatch.setattr(checkpoint.os, "rename", rename)
    with pytest.raises(OSError, match="rename failed"):
        TinyCausalLM("tiny", seed=2).save_pretrained(path)
    monkeypatch.undo()
    fresh = TinyCausalLM("tiny", seed=3)
    fresh.load_pretrained(path)
    assert _same(fresh, old) and sorted(p.name for p in tmp_path.iterdir()) == ["step-1"]


def test_prune_keeps_the_newest_k_and_never_a_protected_one(tmp_path: Path) -> None:
    model = TinyCausalLM("tiny", seed=0)
    for step in (0, 1, 2, 10, 11):
        model.save_pretrained(tmp_path / f"step-{step}")
    (tmp_path / "notes").mkdir()  # not a step directory: never touched
    (tmp_path / ".step-3.tmp-999999").mkdir()  # a writer killed mid-write (another process)
    removed = prune_checkpoints(tmp_path, 2, protect=[tmp_path / "step-1"])
    assert sorted(p.name for p in removed) == [".step-3.tmp-999999", "step-0", "step-2"]
    assert [n for n, _ in checkpoint_steps(tmp_path)] == [1, 10, 11]  # numeric order, not text order
    assert (tmp_path / "notes").is_dir()
    with pytest.raises(ValueError, match="--keep-checkpoints"):
        prune_checkpoints(tmp_path, 0)


def test_prune_among_ranks_only_this_runs_checkpoints(tmp_path: Path) -> None:
    """A reused run folder: an earlier, longer run's step-10/11 must not push this run's out."""
    model = TinyCausalLM("tiny", seed=0)
    earlier = [model.save_pretrained(tmp_path / f"step-{n}") for n in (10, 11)]
    mine = [model.save_pretrained(tmp_path / f"step-{n}") for n in (1, 2, 3)]
    removed = prune_checkpoints(tmp_path, 2, among=mine)
    assert removed == [mine[0]]
    assert all(p.is_dir() for p in (*earlier, *mine[1:]))


def test_every_path_that_is_not_a_checkpoint_is_one_error_naming_it(tmp_path: Path) -> None:
    loose = TinyCausalLM("tiny", seed=0).save_weights(tmp_path / "w.safetensors")
    (tmp_path / "empty").mkdir()
    (tmp_path / "badjson").mkdir()
    (tmp_path / "badjson" / "config.json").write_text("{not json")
    (tmp_path / "noweights").mkdir()
    (tmp_path / "noweights" / "config.json").write_text("{}")
    cases = {
        loose: "is a file",
        tmp_path / "absent": "no such directory",
        tmp_path / "empty": "has no config.json",
        tmp_path / "badjson": "cannot be read as JSON",
        tmp_path / "noweights": "has no model.safetensors",
    }
    for path, problem in cases.items():
        with pytest.raises(CheckpointError, match=problem) as info:
            checkpoint_config(path)
        assert str(path) in str(info.value)
    llama = TinyCausalLM("tiny", seed=0).save_pretrained(tmp_path / "llama")
    cfg = json.loads((llama / "config.json").read_text())
    (llama / "config.json").write_text(json.dumps({**cfg, "model_type": "llama"}))
    with pytest.raises(CheckpointError, match="model_type 'llama'"):
        TinyCausalLM("tiny", seed=0).load_pretrained(llama)


def test_the_errors_cross_process_boundaries_whole() -> None:
    """A Ray worker's load error reaches the driver with its message and fields (pickled)."""
    import pickle

    from engines.models.weights import WeightsFileError

    for exc in (
        WeightsFileError("/w/model.safetensors", "bad shape", tensor="tok_emb.weight"),
        CheckpointError("/w", "x"),
    ):
        back = pickle.loads(pickle.dumps(exc))
        assert type(back) is type(exc) and str(back) == str(exc)
        assert (back.path, back.problem, back.tensor) == (exc.path, exc.problem, exc.tensor)
