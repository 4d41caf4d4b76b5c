"""Which model family a checkpoint directory holds, decided once from ``config.json``'s ``model_type``.

``rl-lifecycle-char`` is the built-in char model (its size from ``config.json``); anything else is a
Hugging Face causal LM built by transformers. The engine, the trainer and the rollout side all go
through here, so they agree on the architecture and the tokenizer of every directory.
"""

from __future__ import annotations

from pathlib import Path

from engines.models.checkpoint import CONFIG, CheckpointError, checkpoint_config
from engines.models.config import MODEL_SIZES
from engines.models.protocol import CausalLM, Tokenizer
from engines.models.tiny import MODEL_TYPE as CHAR_MODEL_TYPE
from engines.models.tiny import TinyCausalLM
from engines.models.tokenizer import CharTokenizer


def checkpoint_model_type(directory: str | Path) -> str:
    """``model_type`` of a checkpoint directory (one :class:`CheckpointError` naming the path otherwise)."""
    model_type = checkpoint_config(directory).get("model_type")
    if not isinstance(model_type, str) or not model_type:
        raise CheckpointError(
            Path(directory) / CONFIG,
            "has no model_type; write the directory with save_pretrained (transformers or TinyCausalLM)",
        )
    return model_type


def is_char_checkpoint(directory: str | Path) -> bool:
    return checkpoint_model_type(directory) == CHAR_MODEL_TYPE


def new_causal_lm(directory: str | Path, *, seed: int = 0) -> CausalLM:
    """The architecture ``directory`` was written for, with fresh weights from ``seed`` (its tensors are not read)."""
    if is_char_checkpoint(directory):
        size = checkpoint_config(directory).get("model_size")
        if size not in MODEL_SIZES:
            raise CheckpointError(
                Path(directory) / CONFIG,
                f"model_size {size!r} is not a char model size ({', '.join(MODEL_SIZES)}); "
                "write it with TinyCausalLM.save_pretrained",
            )
        return TinyCausalLM(str(size), seed=seed)
    from engines.models.hf import HFCausalLM

    return HFCausalLM.from_pretrained(directory, seed=seed)


def load_causal_lm(directory: str | Path) -> CausalLM:
    """The model a checkpoint directory holds: architecture, tokenizer and checked weights.

    Raises one :class:`CheckpointError` naming the path and the fix: not a checkpoint directory, a
    missing or unknown ``model_type``, transformers not installed (``pip install 'rl-lifecycle[hf]'``),
    tensors that do not match the architecture.
    """
    model = new_causal_lm(directory)
    model.load_pretrained(directory)
    return model


def load_tokenizer(directory: str | Path) -> Tokenizer:
    """The tokenizer of a checkpoint directory: ``load_tokenizer(d).encode(text)`` is exactly the prompt the
    CPU engine serving ``d`` computes for ``/generate`` with ``{"text": text}``."""
    if is_char_checkpoint(directory):
        return CharTokenizer()
    from engines.models.hf import HFTokenizer

    return HFTokenizer.from_pretrained(directory)
