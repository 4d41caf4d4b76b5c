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
from typing import TYPE_CHECKING, Any

import ray
from ray.exceptions import RayActorError, RayTaskError

from trainer.backend import BackendError, BackendSpec, NamedWeights, checked_grads, checked_save, worker_seed

if TYPE_CHECKING:
    from engines.models.weight_group import WeightGroup


class WorkerCrashed(Exception):
    """A trainer worker actor died (or its task crashed the process), or did not answer in time."""


@ray.remote(num_cpus=0, max_restarts=0)
class TrainerWorker:
    """One replica: a trainer backend (``trainer.backend``) in its own process; every call goes to it."""

    def __init__(self, rank: int, spec: BackendSpec, seed: int = 0) -> None:
        import torch

        torch.set_num_threads(1)
        # the global generators start from the run's seed and the rank, not from the process's entropy: a backend
        # that draws from them (dropout) repeats itself across runs, and a job checkpoint's RNG state is the job's
        import random

        from trainer.backend import build_backend

        torch.manual_seed(worker_seed(seed, rank))
        random.seed(worker_seed(seed, rank))

        self.rank = rank
        self.spec = spec
        self.backend = build_backend(spec, rank)
        self._group: WeightGroup | None = None  # the weight-update group, once joined (rank 0 broadcasts)

    def pid(self) -> int:
        return os.getpid()

    def compute_grads(self, samples: Sequence[Mapping[str, Any]]) -> tuple[dict[str, Any], dict[str, float]]:
        return checked_grads(self.backend.compute_grads(samples), self.spec)

    def apply_grads(self, grads: Mapping[str, Any]) -> None:
        self.backend.apply_grads(grads)

    def save_checkpoint(self, directory: str) -> str:
        """A Hugging Face checkpoint directory of the current weights (written atomically). Writing one never
        moves the random generators (checking it builds a model): a resumed run writes one more, at its start."""
        import torch

        with torch.random.fork_rng(devices=[]):
            return checked_save(self.backend, self.spec, directory)

    def load_checkpoint(self, directory: str) -> None:
        """Start from a checkpoint directory (``--hf-checkpoint``) instead of the seed's weights."""
        self.backend.load_checkpoint(directory)

    def get_state(self) -> dict[str, Any]:
        return self.backend.get_state()

    def set_state(self, state: Mapping[str, Any]) -> None:
        self.backend.set_state(state)

    def rng_state(self) -> dict[str, Any]:
        """The process's random generators (a job checkpoint keeps them: a resumed trainer draws the same)."""
        import random

        import torch

        return {"torch": torch.get_rng_state(), "python": random.getstate()}

    def set_rng_state(self, state: Mapping[str, Any]) -> None:
        import random

        import torch

        if "torch" in state:
            torch.set_rng_state(state["torch"])
        if "python" in state:
            version, internal, gauss = state["python"]
            random.setstate((version, tuple(internal), gauss))

    def offload(self) -> None:
        self.backend.offload()

    def onload(self) -> None:
        self.backend.onload()

    # -- the weight-update group: this worker is rank 0 and broadcasts --------------------------------
    def weight_metas(self) -> list[tuple[str, str, list[int]]]:
        """(name, dtype, shape) of every tensor the engines hold, in checkpoint naming."""
        from engines.models.weight_group import dtype_name

        return [(n, dtype_name(t.dtype), list(t.shape)) for n, t in self._named_weights().items()]

    def _named_weights(self) -> dict[str, Any]:
        if not isinstance(self.backend, NamedWeights):
            raise BackendError(
                f"trainer backend {self.spec.factory}: --update-weight-transfer-mode broadcast needs a "
                "named_weights() method (name -> tensor, the checkpoint's names); add it, or use disk"
            )
        return dict(self.backend.named_weights())

    def join_weight_group(self, address: str, port: int, world_size: int, name: str, timeout: float) -> None:
        from engines.models.weight_group import WeightGroup

        self.leave_weight_group()
        self._group = WeightGroup(address, port, 0, world_size, timeout=timeout, name=name)

    def broadcast_bucket(self, names: list[str]) -> str:
        """Broadcast these tensors; "" or why it failed (a failed collective is not a crashed worker)."""
        from engines.models.weight_group import WeightGroupError

        group = self._group
        if group is None:
            return "no weight-update group: join_weight_group first"
        weights = self._named_weights()
        try:
            group.broadcast([weights[n].detach().contiguous() for n in names])
        except WeightGroupError as exc:
            # leave at once: members blocked in this bucket's collective then fail now ("connection closed by
            # peer") instead of at their own deadline, so the whole update ends as soon as rank 0 knows
            self.leave_weight_group()
            return str(exc)
        return ""

    def leave_weight_group(self) -> None:
        group = self._group
        if group is not None:
            group.close()
            self._group = None

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
        spec: BackendSpec,
        *,
        call_timeout: float = 300.0,
        startup_timeout: float = 120.0,
        seed: int = 0,
    ) -> None:
        self.rank = rank
        self.call_timeout = call_timeout
        self.startup_timeout = startup_timeout  # the first call also waits for the actor's torch import
        self._answered = False
        self.answered_last = True  # False once a call crashed or ran out of its bound (the failure names it)
        from engines.actor import driver_node_placement  # on a multi-node cluster: beside the driver

        options = driver_node_placement()
        self.actor = TrainerWorker.options(**options).remote(rank, spec, seed)  # type: ignore[attr-defined]

    @staticmethod
    async def _await(ref: Any) -> Any:
        try:
            return await ref
        except (RayActorError, RayTaskError) as exc:
            cause = getattr(exc, "cause", None) if isinstance(exc, RayTaskError) else None
            if isinstance(cause, BackendError):  # the backend returned the wrong thing: its error, not a crash
                raise cause from None
            if getattr(exc, "actor_init_failed", False):  # the backend could not be built: Ray's last line says why
                lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
                last = lines[-1] if lines else ""
                if "BackendError: " in last:
                    raise BackendError(last.split("BackendError: ", 1)[1]) from None
                raise WorkerCrashed(f"{type(exc).__name__}: the worker could not be built: {last}") from None
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
