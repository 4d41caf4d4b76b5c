"""What a trainer worker does, as a protocol: the project's GRPO trainer is one implementation.

A worker actor (``trainer.workers.TrainerWorker``) holds one backend and forwards the group's calls
to it: gradients on a shard, the averaged gradients applied, a checkpoint directory written or read,
its whole state given or taken (that is how a replacement heals from a peer, whatever the model), its
memory released and restored. The group never looks inside. A backend is named by a picklable
:class:`BackendSpec` (``module:attr`` of a factory and its keyword arguments), so every worker and
every replacement builds the same one in its own process. The project's own trainer is one
implementation (:class:`trainer.grpo.GRPOBackend`).
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from lifecycle.decide.errors import LifecycleError

RANKS = 65536  # the trainer seeds torch with seed * RANKS + rank, and torch takes a 64-bit seed


def worker_seed(seed: int, rank: int) -> int:
    """A trainer worker's torch/random seed: distinct per rank, and at most 64 bits under the run's seed bound."""
    return seed * RANKS + rank


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
        """Gradients of this shard's loss by parameter name, and a few float diagnostics (``loss`` at least; each
        becomes a column of the step's ``metrics.jsonl`` row, averaged over the workers).

        ``samples``: :class:`rollout.sample.Sample` dicts, whole GRPO groups (``group``) -- ``prompt_ids``,
        ``output_ids``, ``reward`` -- and what an off-policy correction needs: ``logprobs``, the engine's
        log-probability of each output token when it sampled it (at the task's temperature; absent or empty
        where a replay file or a rollout function gave none), and ``weight_version``, the engine weight
        version that generated it. Lock-step runs train on the version the trainer holds; streaming runs
        (``--fully-async``) on samples up to ``--max-weight-staleness`` versions older. A backend that corrects
        for that computes its own logprobs of ``output_ids`` before its update and weights each token by
        ``exp(own - engine)``, truncated, as the project's trainer does (``--use-tis``, :mod:`trainer.policy`)."""
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


@runtime_checkable
class NamedWeights(Protocol):
    """What ``--update-weight-transfer-mode broadcast`` needs of a backend besides :class:`TrainerBackend`: its
    tensors by the checkpoint's names (rank 0 broadcasts them; the engines load them under those names)."""

    def named_weights(self) -> Mapping[str, Any]: ...


class BackendError(LifecycleError, TypeError):
    """A backend factory gave something that is not a trainer backend (names the factory and the fix)."""


@dataclass(frozen=True)
class BackendSpec:
    """How every worker builds its backend: ``factory(rank=rank, **kwargs)``, the factory named ``module:attr``."""

    factory: str
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


def checked_grads(result: object, spec: BackendSpec) -> tuple[dict[str, Any], dict[str, float]]:
    """``compute_grads``' answer, checked in the worker so a wrong shape names the backend, not the averaging."""
    fix = "return (gradients by parameter name, {'loss': float, ...}) from compute_grads"
    if not (isinstance(result, tuple) and len(result) == 2 and isinstance(result[0], dict)):
        raise BackendError(
            f"trainer backend {spec.factory!r}: compute_grads returned {type(result).__name__}. Fix: {fix}"
        )
    grads, stats = result
    if not isinstance(stats, dict) or not all(isinstance(v, int | float) for v in stats.values()):
        raise BackendError(f"trainer backend {spec.factory!r}: compute_grads' diagnostics are not floats. Fix: {fix}")
    return grads, {k: float(v) for k, v in stats.items()}


def checked_save(backend: TrainerBackend, spec: BackendSpec, directory: str | Path) -> str:
    """``save_checkpoint`` into ``directory``, checked: engines load what it wrote, so it must be a Hugging Face
    checkpoint directory (``config.json`` at least) -- a bad one names the backend here, not in an engine."""
    path = backend.save_checkpoint(str(directory))
    if not isinstance(path, str | os.PathLike) or not (Path(path) / "config.json").is_file():
        raise BackendError(
            f"trainer backend {spec.factory!r}: save_checkpoint({str(directory)!r}) returned {path!r}, "
            "not a checkpoint directory with a config.json. Fix: write a Hugging Face checkpoint directory "
            "(model.save_pretrained(directory) and the tokenizer's files) and return its path"
        )
    return str(path)
