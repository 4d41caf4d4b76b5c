"""The KV cache the engine decodes with, kept apart from the model so that its memory can be released alone."""

from __future__ import annotations

from typing import Protocol

import torch
from torch import Tensor


class KVLayout(Protocol):
    """What a KV pool's shape comes from (a :class:`~engines.models.config.ModelConfig` is one; so is the HF
    model's)."""

    @property
    def n_layers(self) -> int: ...
    @property
    def n_heads(self) -> int: ...  # key/value heads (fewer than query heads under grouped-query attention)
    @property
    def max_seq_len(self) -> int: ...
    @property
    def head_dim(self) -> int: ...


class KVCache:
    """A slot-based KV pool, allocated up front like SGLang's token pool: one slot per running request.

    ``release()`` drops the tensors (their memory is really freed), ``allocate()`` makes fresh zeroed
    ones; slots are handed out lowest-first so that a run is reproducible.
    """

    def __init__(self, config: KVLayout, num_slots: int, *, allocate: bool = True) -> None:
        if num_slots <= 0:
            raise ValueError(f"a KV cache needs at least one slot, got {num_slots}")
        self.config = config
        self.num_slots = num_slots
        self.shape = (config.n_layers, num_slots, config.n_heads, config.max_seq_len, config.head_dim)
        self.k: Tensor | None = None
        self.v: Tensor | None = None
        self._free = list(range(num_slots))
        if allocate:
            self.allocate()

    @property
    def resident(self) -> bool:
        return self.k is not None

    @property
    def nbytes(self) -> int:
        if self.k is None or self.v is None:
            return 0
        return self.k.numel() * self.k.element_size() + self.v.numel() * self.v.element_size()

    @property
    def slots_in_use(self) -> int:
        return self.num_slots - len(self._free)

    @property
    def free_slots(self) -> int:
        return len(self._free)

    def allocate(self) -> None:
        if self.k is None:
            self.k = torch.zeros(self.shape)
            self.v = torch.zeros(self.shape)

    def release(self) -> None:
        """Free the tensors; every slot must be free (a held slot would lose its request's state)."""
        if self.slots_in_use:
            raise RuntimeError(f"cannot release the KV cache: {self.slots_in_use} slots are in use")
        self.k = None
        self.v = None

    def clear(self) -> None:
        if self.slots_in_use:
            raise RuntimeError(f"cannot clear the KV cache: {self.slots_in_use} slots are in use")
        if self.k is not None and self.v is not None:
            self.k.zero_()
            self.v.zero_()

    def acquire(self) -> int:
        if not self._free:
            raise RuntimeError("no free KV cache slot")
        self._free.sort()
        return self._free.pop(0)

    def free(self, slot: int) -> None:
        if slot in self._free or not 0 <= slot < self.num_slots:
            raise RuntimeError(f"KV cache slot {slot} is not in use")
        self._free.append(slot)

    def _tensors(self) -> tuple[Tensor, Tensor]:
        if self.k is None or self.v is None:
            raise RuntimeError("the KV cache is released")
        return self.k, self.v
