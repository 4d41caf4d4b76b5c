"""The weight-update group's shell (``--update-weight-transfer-mode broadcast``): trainer worker 0 is rank 0,
every engine of the snapshot a receiver.

It carries out the ``weight_sync`` machine's three commands -- connect (``init_weight_group``), broadcast
(``broadcast_weights``) and destroy (``destroy_weight_group``) -- and the receiving side of each member's
``transfer_weights`` while the group broadcasts (the core's command says so: ``engine.transfer_weights.broadcast``,
with the weights to receive). Whom to connect is the core's (the engines it marked
as joining); when to connect, mark stale, reconnect or give up is the core's too. Every call here is
bounded by ``--update-weight-timeout``: the collectives themselves (gloo's deadline) and, a little
longer, the calls that wait for them, so a dead or hung peer is a failed broadcast, never a hang.
"""

from __future__ import annotations

import asyncio
import socket

from engines.engine import Bucket, Engine
from engines.models.weight_group import TensorMeta, buckets
from lifecycle.decide.core import BROADCAST, Command, Outcome
from lifecycle.decide.runner import Runner
from rollout.controller import InferenceController
from trainer.group import TrainerGroup
from trainer.workers import WorkerCrashed, WorkerHandle

GROUP_NAME = "weight_update_group"  # SGLang's default group name
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
        port, world = free_port(self.address), 1 + len(members)
        bound = self.timeout + MARGIN
        calls = [
            self.sender.call("join_weight_group", self.address, port, world, GROUP_NAME, self.timeout, timeout=bound)
        ]
        calls += [e.join_group(self.address, port, 1 + k, world, bound) for k, e in enumerate(members)]
        results = await asyncio.gather(*calls, return_exceptions=True)
        names = ["trainer", *(e.id for e in members)]
        problems = [f"{who}: {r}" for who, r in zip(names, results, strict=True) if isinstance(r, Exception)]
        if problems:
            return Outcome("failed", reason="the weight-update group did not form: " + "; ".join(problems))
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
                    return Outcome("failed", reason=f"broadcast failed: {problem}")
                self.runner.log.emit("weight_sync.bucket", index=k, of=len(buckets), tensors=len(bucket))
        except WorkerCrashed as exc:
            self.trainer.crashed_in_broadcast(exc)
            return Outcome("worker_crashed", reason=f"trainer worker 0 crashed mid-broadcast: {exc}")
        self.broadcasts += 1
        return Outcome("done")

    async def _destroy(self, cmd: Command) -> Outcome:
        """Everyone still alive leaves the group (best effort: a dead member is out already)."""
        members, self.members = self.members, []
        calls = [e.leave_group(self.timeout) for e in members]
        leave = self.sender.call("leave_weight_group", timeout=self.timeout)
        await asyncio.gather(leave, *calls, return_exceptions=True)  # who cannot answer has left by dying
        return Outcome("done")

    async def _receive(self, cmd: Command) -> Outcome:
        """A member's ``transfer_weights`` while the group broadcasts: it receives every bucket of the weights
        the core's command names (the trainer's new ones)."""
        weights = self.runner.weights(cmd)
        if weights is None:
            return Outcome("refused", reason="no weights pending: the trainer wrote none for this update")
        engine = self.controller.slot(cmd)
        self.controller.transferring(engine, True)  # a kept engine torn by a driver's death is never trusted
        outcome = await engine.receive(await self.buckets(), weights[1], self.timeout + MARGIN)
        self.controller.transferring(engine, outcome.name != "loaded")
        return outcome
