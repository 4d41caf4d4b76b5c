"""The weight-update group's shell (``--update-weight-transfer-mode broadcast``): trainer worker 0 is rank 0,
every engine of the snapshot a receiver.

It carries out the ``weight_sync`` machine's three commands -- connect (``init_weight_group``), broadcast
(``broadcast_weights``) and destroy (``destroy_weight_group``) -- and the receiving side of each member's
``transfer_weights`` while the group broadcasts (the core's command says so: ``engine.transfer_weights.broadcast``,
with the weights to receive). Whom to connect is the core's (the engines it marked
as joining); when to connect, mark stale, reconnect or give up is the core's too. Every call here is
bounded by ``--update-weight-timeout``: the collectives themselves (gloo's deadline) and, a little
longer, the calls that wait for them, so a dead or hung peer is a failed broadcast, never a hang.

Each connect forms a new **generation** of the group (``weight_update_group.g{N}``, a fresh rendezvous port): a
group is never grown or reused across memberships (NCCL cannot add ranks; AReaL #1086), and every call names its
generation, so an engine still in an older group refuses the bucket. ``weight_sync.connected`` and
``weight_sync.destroyed`` record each generation's life.
"""

from __future__ import annotations

import asyncio
import socket

from engines.api import group_name
from engines.engine import Bucket, Engine
from engines.models.weight_group import TensorMeta, buckets
from lifecycle.decide.core import BROADCAST, Command, Move, Outcome
from lifecycle.decide.events import SYNC_CONNECTED, SYNC_DESTROYED
from lifecycle.decide.runner import Runner
from rollout.controller import InferenceController
from trainer.group import TrainerGroup
from trainer.workers import WorkerCrashed, WorkerHandle

MARGIN = 10.0  # seconds a caller waits beyond the collective's own deadline (the callee reports first)


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


class WeightBroadcast:
    def __init__(self, runner: Runner, controller: InferenceController, trainer: TrainerGroup) -> None:
        self.runner = runner
        self.controller = controller
        self.trainer = trainer
        config = runner.config
        self.timeout = float(config.update_weight_timeout)
        self.bucket_bytes = int(config.update_weight_buffer_size)
        self.address = "127.0.0.1"
        self.members: list[Engine] = []
        self.generation = 0  # the group's generation: 0 before the first connect, +1 at each
        self.connected = False  # a generation is formed (or forming) and not yet destroyed
        self.failed = ""  # why the current generation failed
        self.trigger = ""  # the weight_sync machine's last move: why a destroy was asked
        runner.watch(self._on_move)
        self._buckets: list[Bucket] | None = None
        self.broadcasts = 0  # completed broadcasts (tests and the benchmark read it)
        runner.provide(
            {
                "weight_sync.init_weight_group": self._connect,
                "weight_sync.broadcast_weights": self._broadcast,
                "weight_sync.destroy_weight_group": self._destroy,
                f"engine.transfer_weights.{BROADCAST}": self._receive,
            }
        )

    def _on_move(self, move: Move) -> None:
        if move.machine == "weight_sync":
            self.trigger = move.trigger

    @property
    def sender(self) -> WorkerHandle:
        return self.trainer.workers[0]  # read each time: a healed worker replaces its entry

    async def buckets(self) -> list[Bucket]:
        """The tensors in buckets of at most ``--update-weight-buffer-size`` bytes (the same every update)."""
        if self._buckets is None:
            metas = await self.sender.call("weight_metas", timeout=self.timeout + MARGIN)
            plan = buckets([TensorMeta(name, dtype, tuple(shape)) for name, dtype, shape in metas], self.bucket_bytes)
            self._buckets = [[(m.name, m.dtype, m.shape) for m in bucket] for bucket in plan]
        return self._buckets

    # -- the three commands ---------------------------------------------------------------------------
    async def _connect(self, cmd: Command) -> Outcome:
        """Trainer worker 0 (rank 0, hosting the rendezvous) and every member (rank 1..n) join at once."""
        await self.buckets()  # a backend without named_weights() raises here (BackendError): the run stops
        members = [self.controller.engines[i] for i in self.runner.core.group_members(self.runner.state)]
        self.members = members
        # the core's count where it keeps one (an elastic fleet's commands carry it), else this shell's own
        self.generation = getattr(cmd, "generation", 0) or self.generation + 1
        self.connected, self.failed = True, ""
        port, world, name = free_port(self.address), 1 + len(members), group_name(self.generation)
        bound = self.timeout + MARGIN
        calls = [self.sender.call("join_weight_group", self.address, port, world, name, self.timeout, timeout=bound)]
        calls += [e.join_group(self.address, port, 1 + k, world, bound, name) for k, e in enumerate(members)]
        results = await asyncio.gather(*calls, return_exceptions=True)
        names = ["trainer", *(e.id for e in members)]
        problems = [f"{who}: {r}" for who, r in zip(names, results, strict=True) if isinstance(r, Exception)]
        if problems:
            self.failed = "the weight-update group did not form: " + "; ".join(problems)
            return Outcome("failed", reason=self.failed)
        if self.runner.log.enabled:
            members_ids = [e.id for e in members]
            self.runner.log.emit(SYNC_CONNECTED, generation=self.generation, world_size=world, members=members_ids)
        return Outcome("done")

    async def _broadcast(self, cmd: Command) -> Outcome:
        """Rank 0's side: every bucket, each a bounded collective (the engines receive it meanwhile)."""
        try:
            buckets = await self.buckets()
            for k, bucket in enumerate(buckets):
                problem = await self.sender.call(
                    "broadcast_bucket", [n for n, _, _ in bucket], timeout=self.timeout + MARGIN
                )
                if problem:
                    self.failed = f"broadcast failed: {problem}"
                    return Outcome("failed", reason=self.failed)
                self.runner.log.emit("weight_sync.bucket", index=k, of=len(buckets), tensors=len(bucket))
        except WorkerCrashed as exc:
            self.trainer.crashed_in_broadcast(exc)
            self.failed = f"trainer worker 0 crashed mid-broadcast: {exc}"
            return Outcome("worker_crashed", reason=self.failed)
        self.broadcasts += 1
        return Outcome("done")

    async def _destroy(self, cmd: Command) -> Outcome:
        """Everyone still alive leaves the group (best effort: a dead member is out already). ``why`` is the
        weight_sync move that asked: ``destroy`` (its membership changed: a join, a leave, a death), ``dispose``
        (the run ends), or a failed connect or broadcast."""
        members, self.members = self.members, []
        name = group_name(self.generation)
        calls = [e.leave_group(self.timeout, name) for e in members]
        leave = self.sender.call("leave_weight_group", timeout=self.timeout)
        await asyncio.gather(leave, *calls, return_exceptions=True)  # who cannot answer has left by dying
        if self.connected and self.runner.log.enabled:
            why = {"destroy": "membership", "dispose": "shutdown"}.get(self.trigger, "failed")
            self.runner.log.emit(SYNC_DESTROYED, generation=self.generation, world_size=1 + len(members), why=why)
        self.connected = False
        return Outcome("done")

    async def _receive(self, cmd: Command) -> Outcome:
        """A member's ``transfer_weights`` while the group broadcasts: it receives every bucket of the weights
        the core's command names (the trainer's new ones)."""
        weights = self.runner.weights(cmd)
        if weights is None:
            return Outcome("refused", reason="no weights pending: the trainer wrote none for this update")
        engine = self.controller.slot(cmd)
        self.controller.transferring(engine, True)  # a kept engine torn by a driver's death is never trusted
        generation = getattr(cmd, "generation", 0) or self.generation  # the group this bucket is for
        outcome = await engine.receive(await self.buckets(), weights[1], self.timeout + MARGIN, group_name(generation))
        self.controller.transferring(engine, outcome.name != "loaded")
        return outcome
