"""What a trainer worker does, as a protocol: the project's GRPO trainer is one implementation.

A worker actor (``trainer.workers.TrainerWorker``) holds one backend and forwards the group's calls
to it: gradients on a shard, the averaged gradients applied, a checkpoint directory written or read,
its whole state given or taken (that is how a replacement heals from a peer, whatever the model), its
memory released and restored. The group never looks inside. A backend is named by a picklable
:class:`BackendSpec` (``module:attr`` of a factory and its keyword arguments), so every worker and
every replacement builds the same one in its own process.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from lifecycle.errors import LifecycleError

METHODS = (
    "compute_grads",
    "apply_grads",
    "save_checkpoint",
    "load_checkpoint",
    "get_state",
    "set_state",
    "offload",
    "onload",
)


@runtime_checkable
class TrainerBackend(Protocol):
    def compute_grads(self, samples: Sequence[Mapping[str, Any]]) -> tuple[dict[str, Any], dict[str, float]]:
        """Gradients of this shard's loss by parameter name, and a few float diagnostics (``loss`` at least)."""
        ...

    def apply_grads(self, grads: Mapping[str, Any]) -> None:
        """One optimiser step with the group's averaged gradients (every replica takes the same step)."""
        ...

    def save_checkpoint(self, directory: str) -> str:
        """Write a Hugging Face checkpoint directory (``config.json`` + weights + tokenizer files); its path."""
        ...

    def load_checkpoint(self, directory: str) -> None: ...

    def get_state(self) -> dict[str, Any]:
        """Everything a replacement needs to continue exactly (model and optimiser)."""
        ...

    def set_state(self, state: Mapping[str, Any]) -> None: ...

    def offload(self) -> None: ...

    def onload(self) -> None: ...


class BackendError(LifecycleError, TypeError):
    """A backend factory gave something that is not a trainer backend (names the factory and the fix)."""


@dataclass(frozen=True)
class BackendSpec:
    """How every worker builds its backend: ``factory(rank=rank, **kwargs)``, the factory named ``module:attr``."""

    factory: str = "trainer.backend:GRPOBackend"
    kwargs: Mapping[str, Any] = field(default_factory=dict)


def build_backend(spec: BackendSpec, rank: int) -> TrainerBackend:
    module, _, attr = spec.factory.partition(":")
    if not module or not attr:
        raise BackendError(f"trainer backend {spec.factory!r}: name it module:attr (e.g. mypkg.train:MyBackend)")
    try:
        factory = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as exc:
        raise BackendError(f"trainer backend {spec.factory!r} cannot be imported: {exc}") from None
    backend = factory(rank=rank, **dict(spec.kwargs))
    missing = [m for m in METHODS if not callable(getattr(backend, m, None))]
    if missing:
        raise BackendError(
            f"trainer backend {spec.factory!r} built a {type(backend).__name__} without {', '.join(missing)}. "
            "Fix: implement trainer.backend.TrainerBackend"
        )
    assert isinstance(backend, TrainerBackend)
    return backend


class GRPOBackend:
    """The project's trainer: the char model of ``model_size`` from ``seed`` (or the architecture of the run's
    initial Hugging Face ``checkpoint``), Adam, the GRPO loss of :mod:`trainer.policy`."""

    def __init__(
        self,
        *,
        rank: int = 0,
        model_size: str = "tiny",
        seed: int = 0,
        lr: float = 1e-2,
        temperature: float = 1.0,
        checkpoint: str | None = None,
    ) -> None:
        import torch

        from models import CausalLM, TinyCausalLM, is_char_checkpoint, new_causal_lm

        self.rank = rank
        self.temperature = temperature
        self.model: CausalLM = TinyCausalLM(model_size, seed=seed)
        if checkpoint is not None and not is_char_checkpoint(checkpoint):
            self.model = new_causal_lm(checkpoint, seed=seed)
        self.optim = torch.optim.Adam(self.model.parameters(), lr=lr)
        self._offloaded: dict[str, Any] | None = None

    def compute_grads(self, samples: Sequence[Mapping[str, Any]]) -> tuple[dict[str, Any], dict[str, float]]:
        from trainer.policy import grpo_loss

        self.optim.zero_grad(set_to_none=True)
        loss, stats = grpo_loss(self.model, samples, temperature=self.temperature)
        loss.backward()  # type: ignore[no-untyped-call]
        grads = {n: p.grad.detach().clone() for n, p in self.model.named_parameters() if p.grad is not None}
        return grads, stats

    def apply_grads(self, grads: Mapping[str, Any]) -> None:
        import torch

        for name, param in self.model.named_parameters():
            param.grad = grads.get(name)
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.optim.step()

    def save_checkpoint(self, directory: str) -> str:
        return str(self.model.save_pretrained(directory))

    def load_checkpoint(self, directory: str) -> None:
        self.model.load_pretrained(directory)

    def get_state(self) -> dict[str, Any]:
        return {"model": self.model.state_dict(), "optim": self.optim.state_dict()}

    def set_state(self, state: Mapping[str, Any]) -> None:
        self.model.load_state_dict(state["model"])
        self.optim.load_state_dict(state["optim"])

    def offload(self) -> None:
        self._offloaded = self.get_state()
        self.model.release_weights()

    def onload(self) -> None:
        if self._offloaded is not None:
            self.model.reallocate_weights()
            self.set_state(self._offloaded)
            self._offloaded = None
