"""What the engine, the trainer and the rollout side need of a model family, as typed protocols.

Two families satisfy them: the built-in char model (:class:`~engines.models.tiny.TinyCausalLM`) and any local
Hugging Face causal LM (:class:`~engines.models.hf.HFCausalLM`). Code above ``engines.models`` is typed against these,
so a third family is one class, not edits across the engine and the trainer. No torch import at run
time: the names below are only annotations.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from torch import Tensor
    from torch.nn import Parameter

    from engines.models.kv import KVCache
    from engines.models.weights import WeightsFile


class Tokenizer(Protocol):
    """Text <-> token ids, exactly as the engine tokenizes ``/generate``'s ``text`` (BOS included)."""

    @property
    def vocab_size(self) -> int: ...
    @property
    def bos_id(self) -> int | None: ...
    @property
    def eos_id(self) -> int | None: ...
    @property
    def pad_id(self) -> int: ...

    def encode(self, text: str) -> list[int]:
        """The prompt ids the engine computes for ``{"text": text}``."""
        ...

    def decode(self, ids: Sequence[int], *, skip_special_tokens: bool = True) -> str: ...

    def token_text(self, token_id: int) -> str:
        """One token's text (``output_token_logprobs``' third field); special tokens by name."""
        ...


class CausalLM(Protocol):
    """A causal LM as the CPU engine serves it and the trainer trains it."""

    @property
    def model_type(self) -> str:
        """``config.json``'s ``model_type``: a directory of another type is refused."""
        ...

    @property
    def tokenizer(self) -> Tokenizer: ...
    @property
    def context_length(self) -> int:
        """Prompt + generated tokens the model can attend over."""
        ...

    def hf_config(self) -> dict[str, Any]:
        """``config.json`` of the checkpoints this model writes (``architectures``, ``model_type``, sizes)."""
        ...

    # training
    def forward(self, input_ids: Tensor) -> Tensor:
        """``[batch, seq]`` ids -> ``[batch, seq, vocab]`` logits (causal, differentiable)."""
        ...

    def token_logprobs(self, input_ids: Tensor, *, temperature: float = 1.0) -> Tensor:
        """``[batch, seq - 1]`` log-probabilities of each next token under ``softmax(logits / T)``."""
        ...

    def parameters(self) -> Iterator[Parameter]: ...
    def named_parameters(self) -> Iterator[tuple[str, Parameter]]: ...
    def state_dict(self) -> dict[str, Any]: ...
    def load_state_dict(self, state_dict: Mapping[str, Any]) -> Any: ...

    # inference over a slot-based KV pool
    def new_kv_cache(self, num_slots: int, *, allocate: bool = True) -> KVCache: ...
    def prefill(self, cache: KVCache, slot: int, token_ids: Sequence[int]) -> Tensor:
        """Run the prompt into ``slot``; the last position's logits."""
        ...

    def decode_step(self, cache: KVCache, slot: int, token_id: int, position: int) -> Tensor:
        """One token at ``position`` over the slot's earlier keys/values; its logits."""
        ...

    # memory
    @property
    def weights_resident(self) -> bool: ...
    @property
    def weight_bytes(self) -> int: ...
    def release_weights(self) -> None: ...
    def reallocate_weights(self) -> None:
        """Give released parameters storage again (uninitialised: assign or load next)."""
        ...

    def expected_tensors(self) -> dict[str, tuple[int, ...]]:
        """Name -> shape of every tensor a checkpoint must hold (known while released too)."""
        ...

    def checkpoint_tensors(self) -> dict[str, Parameter]:
        """The parameters by their checkpoint names (``expected_tensors``' keys): what a broadcast carries."""
        ...

    def assign_weights(self, state: Mapping[str, Tensor]) -> None: ...
    def init_weights(self, seed: int) -> None: ...

    # checkpoint directories
    def save_pretrained(self, directory: str | Path) -> Path: ...
    def load_pretrained(self, directory: str | Path) -> WeightsFile: ...
