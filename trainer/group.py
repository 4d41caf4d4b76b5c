"""The trainer group: N trainer workers (Ray actors) driven by the ``trainer`` machine.

``train`` shards the batch by GRPO group across workers, averages their gradients and applies the
average everywhere (replicas stay identical). ``update_weights`` writes the new weights
(safetensors) into the run directory and pushes them through the rollout controller, under its
engine lock; it recovers rollout engines first **only** when the move's effects include
``recover_engine`` (``trainer_recovers_rollout``). With train FT (``heals_trainer``) a crashed worker
is replaced, restored from a peer's state (or the group's last good state when it has no peer), and
the step is retried; without it the group fails.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from lifecycle.config import LifecycleConfig
from lifecycle.errors import LifecycleError
from lifecycle.events import EventLog
from lifecycle.ledger import EffectLedger
from lifecycle.machines import TRAINER
from lifecycle.predicates import heals_trainer
from lifecycle.runtime import FireResult, LifecycleMachine
from trainer.workers import WorkerCrashed, WorkerHandle


class TrainerFailed(LifecycleError):
    """A trainer worker crashed and the group may not heal (no train FT), or healing failed."""


class WeightSink(Protocol):
    async def recover_unhealthy(self) -> list[str]: ...

    async def update_weights(self, path: str, version: str) -> list[str]: ...


class TrainerGroup:
    def __init__(
        self,
        config: LifecycleConfig,
        run_dir: str | Path,
        *,
        workers: int = 1,
        model_size: str = "tiny",
        seed: int = 0,
        lr: float = 3e-3,
        temperature: float = 1.0,
        log: EventLog | None = None,
        ledger: EffectLedger | None = None,
        call_timeout: float = 300.0,
    ) -> None:
        if workers < 1:
            raise ValueError("a trainer group needs at least one worker")
        self.config = config
        self.run_dir = Path(run_dir)
        self.size = workers
        self.model_args = (model_size, seed, lr, temperature)
        self.call_timeout = call_timeout  # every worker call is bounded; running out is a worker crash
        self.machine = LifecycleMachine(TRAINER, config, "trainer", log=log, ledger=ledger)
        self.workers: list[WorkerHandle] = []
        self._last_state: Any = None
        self.heals = 0

    @property
    def state(self) -> str:
        return self.machine.state

    def _fire(self, trigger: str) -> FireResult:
        return self.machine.fire(trigger)

    async def start(self) -> tuple[str, str]:
        """allocate -> initialize -> ready; returns the initial weights (path, version '0')."""
        self._fire("allocate")
        self.workers = [self._worker(rank) for rank in range(self.size)]
        self._fire("initialize")
        for w in self.workers:
            await w.call("pid")  # the actor has built its policy and optimizer
        self._fire("ready")
        if self.size == 1 and heals_trainer(self.config):  # a crash before the first step heals from here
            self._last_state = await self.workers[0].call("get_state")
        return await self._write_weights(0)

    async def _write_weights(self, step: int) -> tuple[str, str]:
        path = self.run_dir / "weights" / f"step-{step}.safetensors"
        path.parent.mkdir(parents=True, exist_ok=True)
        await self.workers[0].call("save_weights", str(path))
        return str(path.resolve()), str(step)

    # -- training -----------------------------------------------------------------------------------
    async def train(self, samples: Sequence[Mapping[str, Any]]) -> dict[str, float]:
        """One optimisation step (retried once after a heal with train FT)."""
        self._fire("train")
        try:
            stats = await self._step(samples)
        except WorkerCrashed as exc:
            await self._crashed(str(exc))
            self._fire("train")
            stats = await self._step(samples)
        self._fire("train_done")
        return stats

    async def _step(self, samples: Sequence[Mapping[str, Any]]) -> dict[str, float]:
        groups = sorted({s["group"] for s in samples})
        shards = [[s for s in samples if groups.index(s["group"]) % self.size == r] for r in range(self.size)]
        results = [await w.call("compute_grads", shard) for w, shard in zip(self.workers, shards, strict=True)]
        grads = [g for g, _ in results]
        avg = grads[0] if len(grads) == 1 else {k: sum(g[k] for g in grads if k in g) / len(grads) for k in grads[0]}
        for w in self.workers:
            await w.call("apply_grads", avg)
        if self.size == 1 and heals_trainer(self.config):
            self._last_state = await self.workers[0].call("get_state")  # no peer to heal from: keep one
        stats: dict[str, float] = {}
        for _, s in results:
            for k, v in s.items():
                stats[k] = stats.get(k, 0.0) + v / len(results)
        return stats

    def _worker(self, rank: int) -> WorkerHandle:
        return WorkerHandle(rank, *self.model_args, call_timeout=self.call_timeout)

    async def _alive(self, worker: WorkerHandle) -> bool:
        """A short ping: a dead actor fails at once, a hung one runs out of the (short) bound."""
        try:
            await worker.call("pid", timeout=min(10.0, self.call_timeout))
        except WorkerCrashed:
            return False
        return True

    async def _crashed(self, reason: str) -> None:
        state = self.state  # where the crash hit: named in the error
        self._fire("worker_crashed")
        if not self._fire("heal").ok:
            self._fire("fail")
            dead_ranks = [str(w.rank) for w in self.workers if not await self._alive(w)]
            raise TrainerFailed(
                f"trainer worker {', '.join(dead_ranks) or '?'} crashed in state {state} ({reason}); not healed: "
                "train fault tolerance is off (use --use-fault-tolerance --ft-components train)"
            )
        alive: list[WorkerHandle] = []
        dead: list[WorkerHandle] = []
        for w in self.workers:
            (alive if await self._alive(w) else dead).append(w)
        state = await alive[0].call("get_state") if alive else self._last_state
        if state is None:
            raise TrainerFailed(f"trainer worker crashed ({reason}); no peer or saved state to heal from")
        for w in dead:
            w.kill()  # dead, or hung: either way it must not come back
            replacement = self._worker(w.rank)
            await replacement.call("set_state", state)
            self.workers[self.workers.index(w)] = replacement
        self.heals += 1
        self._fire("healed")

    # -- weights to the rollout engines -------------------------------------------------------------------
    async def update_weights(self, sink: WeightSink | None, step: int) -> FireResult:
        """Write the weights; push them to the engines (recovering them first only if the move says so)."""
        result = self._fire("update_weights")
        if not result.ok:
            return result
        if "recover_engine" in result.effects and sink is not None:
            await sink.recover_unhealthy()
        try:
            path, version = await self._write_weights(step)
        except WorkerCrashed as exc:  # a crash found while writing: heal (or fail) as in train, then redo the move
            await self._crashed(str(exc))
            result = await self.update_weights(sink, step)
            return result
        if sink is not None:
            await sink.update_weights(path, version)
        self._fire("update_done")
        return result

    # -- memory and checkpoints ----------------------------------------------------------------------------
    async def offload(self) -> None:
        if self._fire("offload").ok:
            for w in self.workers:
                await w.call("offload")

    async def onload(self) -> None:
        if self.machine.state == "Offloaded":
            self._fire("onload")
            for w in self.workers:
                await w.call("onload")

    async def save(self, step: int) -> str:
        self._fire("save")
        path, _ = await self._write_weights(step)
        self._fire("save_done")
        return path

    async def crash_worker(self, rank: int) -> None:
        """Fault injection: the worker's process dies."""
        self.workers[rank].crash()

    async def dispose(self) -> None:
        if self.machine.can("dispose"):
            self._fire("dispose")
        for w in self.workers:
            w.kill()
