"""The project's trainer: the GRPO loss of :mod:`trainer.policy` with Adam, on the char model or on the
architecture of a Hugging Face checkpoint directory. One :class:`trainer.backend.TrainerBackend`,
named to a trainer group by :func:`grpo_backend` like any user's backend.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from trainer.backend import BackendSpec


def grpo_backend(
    *,
    model_size: str = "tiny",
    seed: int = 0,
    lr: float = 1e-2,
    temperature: float = 1.0,
    checkpoint: str | None = None,
) -> BackendSpec:
    """The spec of :class:`GRPOBackend` with these settings (what ``lifecycle run`` passes its trainer group)."""
    kwargs = {"model_size": model_size, "seed": seed, "lr": lr, "temperature": temperature, "checkpoint": checkpoint}
    return BackendSpec("trainer.grpo:GRPOBackend", kwargs)


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

        from engines.models import CausalLM, TinyCausalLM, is_char_checkpoint, new_causal_lm

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

    def named_weights(self) -> dict[str, Any]:
        """The tensors a checkpoint holds, by its names (what a broadcast update sends)."""
        return {name: p.detach() for name, p in self.model.checkpoint_tensors().items()}

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
