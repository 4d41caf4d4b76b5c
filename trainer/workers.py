"""Every Ray call of the trainer package, in one place (as engines/actor.py is for engines).

A :class:`TrainerWorker` actor holds one replica of the policy and its optimizer. The group
computes gradients on every worker's shard, averages them, and applies the average on every
worker, so replicas stay bitwise identical -- which is what lets a replacement worker heal from
any peer's state.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Mapping, Sequence
from typing import Any

import ray
from ray.exceptions import RayActorError, RayTaskError


class WorkerCrashed(Exception):
    """A trainer worker actor died (or its task crashed the process), or did not answer in time."""


@ray.remote(num_cpus=0, max_restarts=0)
class TrainerWorker:
    def __init__(
        self, rank: int, model_size: str, seed: int, lr: float, temperature: float, checkpoint: str | None = None
    ) -> None:
        """The policy is the char model of ``model_size`` from ``seed``, or the architecture of ``checkpoint`` (the
        run's initial directory) when that is a Hugging Face model (a char one must be of ``model_size``)."""
        import torch

        torch.set_num_threads(1)
        from models import CausalLM, TinyCausalLM, is_char_checkpoint, new_causal_lm

        self.rank = rank
        self.temperature = temperature
        self.model: CausalLM = TinyCausalLM(model_size, seed=seed)
        if checkpoint is not None and not is_char_checkpoint(checkpoint):
            self.model = new_causal_lm(checkpoint, seed=seed)
        self.optim = torch.optim.Adam(self.model.parameters(), lr=lr)
        self._offloaded: dict[str, Any] | None = None

    def pid(self) -> int:
        return os.getpid()

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
        """A Hugging Face checkpoint directory of the current weights (written atomically)."""
        return str(self.model.save_pretrained(directory))

    def load_checkpoint(self, directory: str) -> None:
        """Start from a checkpoint directory (``--hf-checkpoint``) instead of the seed's weights."""
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

    def crash(self) -> None:
        os._exit(1)

    def hang(self, seconds: float) -> None:
        """Fault hook: the worker stops answering (one task at a time: every later call waits)."""
        time.sleep(seconds)


class WorkerHandle:
    """The group's handle on one worker actor; Ray errors become :class:`WorkerCrashed`."""

    def __init__(
        self,
        rank: int,
        model_size: str,
        seed: int,
        lr: float,
        temperature: float,
        checkpoint: str | None = None,
        *,
        call_timeout: float = 300.0,
        startup_timeout: float = 120.0,
    ) -> None:
        self.rank = rank
        self.call_timeout = call_timeout
        self.startup_timeout = startup_timeout  # the first call also waits for the actor's torch import
        self._answered = False
        self.answered_last = True  # False once a call crashed or ran out of its bound (the failure names it)
        from engines.actor import driver_node_placement  # on a multi-node cluster: beside the driver

        options = driver_node_placement()
        self.actor = TrainerWorker.options(**options).remote(rank, model_size, seed, lr, temperature, checkpoint)  # type: ignore[attr-defined]

    @staticmethod
    async def _await(ref: Any) -> Any:
        try:
            return await ref
        except (RayActorError, RayTaskError) as exc:
            cause = getattr(exc, "cause", None) if isinstance(exc, RayTaskError) else None
            if isinstance(cause, Exception):  # the task raised: its own message, not Ray's header line
                raise WorkerCrashed(f"{type(exc).__name__}: {type(cause).__name__}: {cause}") from None
            raise WorkerCrashed(f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}") from None

    async def call(self, method: str, *args: Any, timeout: float | None = None) -> Any:
        """One bounded call: a worker that does not answer in time counts as crashed (no wait without a bound)."""
        bound = self.call_timeout if timeout is None else timeout
        if not self._answered:
            bound = max(bound, self.startup_timeout)
        try:
            result = await asyncio.wait_for(self._await(getattr(self.actor, method).remote(*args)), bound)
        except TimeoutError:
            self.answered_last = False
            raise WorkerCrashed(f"trainer worker {self.rank}: no answer to {method} within {bound:g}s") from None
        except WorkerCrashed:
            self.answered_last = False
            raise
        self._answered = True
        self.answered_last = True
        return result

    def hang(self, seconds: float) -> None:
        """Fault injection: the worker stops answering for ``seconds`` (fire and forget)."""
        self.actor.hang.remote(seconds)

    def crash(self) -> None:
        self.actor.crash.remote()

    def kill(self) -> None:
        with contextlib.suppress(Exception):  # already gone
            ray.kill(self.actor, no_restart=True)
