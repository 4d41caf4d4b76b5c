"""A trainer worker's weight-update side, without Ray: the actor's own class in this process.

A broadcast update asks the backend for its tensors by name (:class:`trainer.backend.NamedWeights`); a
backend without them is one error naming it and the fix. A worker that has not joined the group says so.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pytest

pytest.importorskip("ray")  # trainer.workers imports it; no cluster is started here
pytest.importorskip("torch")

import torch

from trainer.backend import BackendError, BackendSpec, NamedWeights
from trainer.workers import TrainerWorker

WORKER = TrainerWorker.__ray_metadata__.modified_class  # the actor's class: its methods, without Ray


class Plain:
    """A trainer backend with every method :class:`trainer.backend.TrainerBackend` asks for, and no more."""

    def __init__(self, *, rank: int) -> None:
        self.rank = rank

    def compute_grads(self, samples: Sequence[Mapping[str, Any]]) -> tuple[dict[str, Any], dict[str, float]]:
        return {}, {"loss": 0.0}

    def apply_grads(self, grads: Mapping[str, Any]) -> None: ...

    def save_checkpoint(self, directory: str) -> str:
        return directory

    def load_checkpoint(self, directory: str) -> None: ...

    def get_state(self) -> dict[str, Any]:
        return {}

    def set_state(self, state: Mapping[str, Any]) -> None: ...

    def offload(self) -> None: ...

    def onload(self) -> None: ...


class Named(Plain):
    def named_weights(self) -> dict[str, Any]:
        return {"w": torch.zeros(2, 3)}


def _worker(factory: str) -> Any:
    return WORKER(0, BackendSpec(f"tests.trainer.test_workers:{factory}"))


def test_broadcast_reads_the_backends_named_weights() -> None:
    worker = _worker("Named")
    assert isinstance(worker.backend, NamedWeights)
    assert worker.weight_metas() == [("w", "float32", [2, 3])]


def test_a_backend_without_named_weights_is_refused_naming_it_and_the_fix() -> None:
    worker = _worker("Plain")
    assert not isinstance(worker.backend, NamedWeights)
    with pytest.raises(BackendError, match=r"test_workers:Plain: .*broadcast needs a named_weights\(\) method"):
        worker.weight_metas()


def test_a_worker_outside_the_group_says_so_and_leaves_it_any_number_of_times() -> None:
    worker = _worker("Named")
    assert worker.broadcast_bucket(["w"]) == "no weight-update group: join_weight_group first"
    worker.leave_weight_group()
    worker.leave_weight_group()
