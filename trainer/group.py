"""The trainer group: N trainer workers (Ray actors) -- the shell of the ``trainer`` machine.

``train`` shards the batch by GRPO group across workers, averages their gradients and applies the
average everywhere (replicas stay identical, so any one can heal another). ``update_weights`` writes
the new weights into the run directory and lets the job's core push them to the rollout engines, under
the engine lock, recovering dead engines first when the trainer's move says ``recover_engine``
(``trainer_recovers_rollout``). A crashed worker is healed (replaced, restored from a peer's state or
the group's last kept one) when the core's ``heal`` move is allowed (``heals_trainer``), and the
operation runs again; otherwise the group fails. Every worker call is bounded (``call_timeout``): a hung
worker is a crashed one.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from engines.models.checkpoint import prune_checkpoints
from lifecycle.decide.config import LifecycleConfig
from lifecycle.decide.core import Command, Fact, Failure, Outcome
from lifecycle.decide.errors import ConfigError, LifecycleError
from lifecycle.decide.events import CHECKPOINTED, EventLog
from lifecycle.decide.ledger import EffectLedger
from lifecycle.decide.names import TrainerStateName
from lifecycle.decide.runner import Runner
from trainer.backend import BackendSpec
from trainer.job_state import JobCheckpoint, save_job_checkpoint
from trainer.workers import WorkerCrashed, WorkerHandle

_NOT_NOW = frozenset({"blocked", "not_applicable"})


class TrainerFailed(LifecycleError):
    """A trainer worker crashed and the group may not heal (no train FT), or healing failed."""


class TrainerGroup:
    def __init__(
        self,
        config: LifecycleConfig,
        run_dir: str | Path,
        *,
        runner: Runner | None = None,
        workers: int = 1,
        backend: BackendSpec | None = None,
        log: EventLog | None = None,
        ledger: EffectLedger | None = None,
        call_timeout: float = 300.0,
        keep_checkpoints: int = 3,
        initial_checkpoint: str | Path | None = None,
        resume: JobCheckpoint | None = None,
        seed: int = 0,
        job: Mapping[str, Any] | None = None,
    ) -> None:
        """``backend`` names the trainer each worker runs (default: the project's, ``trainer.grpo.grpo_backend()``
        on the initial checkpoint's architecture, its off-policy correction on with ``--fully-async``); every worker
        loads ``initial_checkpoint`` when one is given, and a resumed job's workers then restore ``resume``
        (``--load``: the core's ``restore`` move). ``seed``
        seeds each worker's global generators (with its rank): what a backend draws from them (dropout) repeats.
        ``job``: the loop's settings and the job's id, which each job checkpoint records
        (``RunOptions.job_settings``)."""
        if workers < 1:
            raise ValueError("a trainer group needs at least one worker")
        if keep_checkpoints < 1:
            raise ValueError(f"--keep-checkpoints must be at least 1, got {keep_checkpoints}")
        self.config = config
        self.job = dict(job or {})
        self.runner = runner if runner is not None else Runner(config, log=log, ledger=ledger)
        self.run_dir = Path(run_dir)
        self.size = workers
        self.initial_checkpoint = None if initial_checkpoint is None else Path(initial_checkpoint)
        if backend is None:  # the project's trainer, built as the initial checkpoint's architecture
            from trainer.grpo import default_use_tis, grpo_backend

            checkpoint = None if self.initial_checkpoint is None else str(self.initial_checkpoint)
            backend = grpo_backend(checkpoint=checkpoint, use_tis=default_use_tis(config))
        self.backend = backend
        self.call_timeout = call_timeout  # every worker call is bounded; running out is a worker crash
        self.keep_checkpoints = keep_checkpoints
        self._written: list[Path] = []  # the checkpoint directories this group wrote (pruned among themselves)
        self.workers: list[WorkerHandle] = []
        self._last_state: Any = None
        self._samples: Sequence[Mapping[str, Any]] = ()
        self._stats: dict[str, float] = {}
        self._step = 0
        self._saved = ""
        self._crash: tuple[str, str] = ("", "")  # (trainer state, reason) of the last crash
        self.seed = seed
        self.resume = resume
        if resume is not None:
            if resume.ranks != workers:
                raise ConfigError(
                    "--trainer-workers",
                    workers,
                    f"the job checkpoint {resume.path} was written by {resume.ranks} workers (one RNG state each)",
                    f"resume with --trainer-workers {resume.ranks}",
                )
            self.runner.restore_restart_ages(resume.restart_ages)  # before the first operation
            if resume.target is not None:  # an elastic fleet: the size it had, not the one it started with
                self.runner.restore_target(resume.target)
            if resume.stream is not None:  # a stream's version: the first commit of the resumed run is above it
                self.runner.restore_stream(int(resume.weight_version))
        self._job = 0  # the step of the checkpoint asked for
        self._batch: Callable[[], Sequence[Mapping[str, Any]]] | None = None  # a stream's take: read when it trains
        self.stream_record: Callable[[], dict[str, Any] | None] = lambda: None  # what a job checkpoint keeps of it
        self.checkpointed: Path | None = None  # the last job checkpoint written
        self.heals = 0
        self.runner.explain(self._explain)
        self.runner.provide(
            {
                "trainer.allocate_workers": self._allocate,
                "trainer.init_model": self._init_model,
                "trainer.keep_heal_state": self._keep_heal_state,
                "trainer.train_step": self._train_step,
                "trainer.transfer_weights": self._write_update,
                "trainer.save_checkpoint": self._save_checkpoint,
                "trainer.save_job_state": self._save_job,
                "trainer.restore_job_state": self._restore_job,
                "trainer.replace_worker": self._replace_worker,
                "trainer.offload_train": lambda c: self._all("offload"),
                "trainer.onload_train": lambda c: self._all("onload"),
            }
        )

    @property
    def state(self) -> TrainerStateName:
        return self.runner.state.trainer

    # -- the loop's calls ---------------------------------------------------------------------------------
    async def start(self) -> tuple[str, str] | None:
        """allocate -> initialize -> ready; the initial weights (path, version ``0``), or None under
        --debug-rollout-only (no trainer: blocked by ``trains``)."""
        if await self.runner.operate("trainer.start", allow=_NOT_NOW) is not None:
            return None
        self.check()
        # a resumed job's engines are relaunched with the checkpoint's weights: the trainer writes them again
        return await self._write_weights(self.resume.weight_version if self.resume is not None else "0")

    async def train(self, samples: Sequence[Mapping[str, Any]]) -> dict[str, float] | None:
        """One optimisation step (run again once after a heal with train FT); None when no trainer exists."""
        self._samples, self._stats = samples, {}
        if await self.runner.operate("train", allow=_NOT_NOW) is not None:
            return None
        self.check()
        return self._stats

    async def take(self, batch: Callable[[], Sequence[Mapping[str, Any]]]) -> dict[str, float] | None:
        """``--fully-async``: the core's ``take`` -- the groups beyond the staleness bound dropped, one step on
        the rest, read from ``batch`` when the step starts (after the drops); None when nothing was trained."""
        self._batch, self._stats = batch, {}
        try:
            if await self.runner.operate("take", allow=_NOT_NOW) is not None:
                return None
        finally:
            self._batch = None
        self.check()
        return self._stats or None

    async def update_weights(self, step: int) -> bool:
        """Write the weights of ``step`` and push them to the rollout engines (the core's update program).
        False when the config has nothing to push to (train-only, rollout-only)."""
        self._step = step
        if await self.runner.operate("update_weights", allow=_NOT_NOW) is not None:
            return False
        self.check()
        return True

    async def save(self, step: int) -> str | None:
        """Write a checkpoint (the train-only producer's hand-off); its path."""
        self._step = step
        if await self.runner.operate("save", allow=_NOT_NOW) is not None:
            return None
        self.check()
        return self._saved

    async def checkpoint(self, step: int) -> Path | None:
        """A job checkpoint after ``step`` rollouts (``--save``), on the committed weights, with what the rest of
        the job needs to continue (its engines' restart budgets); None when the config saves none."""
        self._job = step
        if await self.runner.operate("checkpoint", allow=_NOT_NOW) is not None:
            return None
        self.check()
        return self.checkpointed

    async def offload(self) -> None:
        await self.runner.operate("offload_train", allow=_NOT_NOW)
        self.check()

    async def onload(self) -> None:
        await self.runner.operate("onload_train", allow=_NOT_NOW)
        self.check()

    async def worker_pid(self, rank: int) -> int:
        """The worker's process id (fault injection kills it at an exact moment)."""
        return int(await self.workers[rank].call("pid"))

    async def crash_worker(self, rank: int) -> None:
        """Fault injection: the worker's process dies."""
        self.workers[rank].crash()

    async def dispose(self) -> None:
        """The core's dispose, then every worker killed -- also when the dispose could not run (a half-built job's
        core lacks handlers): no worker outlives the group."""
        try:
            await self.runner.operate("trainer.dispose", allow=_NOT_NOW | {"failed"})
        finally:
            for w in self.workers:
                w.kill()

    def check(self) -> None:
        """Raise the failure the run must stop for, if it has stopped (any part's: see ``Runner.check_failed``)."""
        self.runner.check_failed()

    def _explain(self, failed: Failure) -> None:
        """The trainer stopped the run: name the worker, the state it was in and the fix."""
        if failed.machine != "trainer":
            return
        where, reason = self._crash
        dead = ", ".join(str(w.rank) for w in self.workers if not w.answered_last) or "?"
        if self.runner.state.trainer == "Failed" and where == "Restoring":
            raise TrainerFailed(
                f"trainer worker {dead} crashed while restoring the job checkpoint ({reason}); the checkpoint is "
                "untouched: run lifecycle run --resume RUN_DIR again"
            )
        if self.runner.state.trainer == "Failed":  # the spec's fail: heals_trainer is false
            raise TrainerFailed(
                f"trainer worker {dead} crashed in state {where} ({reason}); not healed: train fault tolerance "
                "is off (use --use-fault-tolerance --ft-components train)"
            )
        raise TrainerFailed(f"{failed}")

    # -- the handlers of the trainer's effects -----------------------------------------------------------------
    def _worker(self, rank: int) -> WorkerHandle:
        return WorkerHandle(rank, self.backend, call_timeout=self.call_timeout, seed=self.seed)

    def crashed_in_broadcast(self, exc: WorkerCrashed) -> None:
        """The group's broadcast lost worker 0: the failure names it and the state (as for any crash)."""
        self._crashed(exc)

    def _crashed(self, exc: WorkerCrashed) -> Outcome:
        self._crash = (self.runner.state.trainer, str(exc))
        return Outcome("worker_crashed", reason=str(exc))

    async def _allocate(self, cmd: Command) -> None:
        self.workers = [self._worker(rank) for rank in range(self.size)]

    async def _init_model(self, cmd: Command) -> Outcome | None:
        try:
            for w in self.workers:
                await w.call("pid")  # the actor has built its policy and optimizer
                if self.initial_checkpoint is not None:
                    await w.call("load_checkpoint", str(self.initial_checkpoint))
        except WorkerCrashed as exc:
            return self._crashed(exc)
        return None

    async def _keep_heal_state(self, cmd: Command) -> Outcome | None:
        """Under train FT, a group without a peer keeps its last good state to heal from."""
        if self.size == 1:
            try:
                self._last_state = await self.workers[0].call("get_state")
            except WorkerCrashed as exc:
                return self._crashed(exc)
        return None

    async def _train_step(self, cmd: Command) -> Outcome:
        samples = self._batch() if self._batch is not None else self._samples
        try:
            groups = sorted({s["group"] for s in samples})
            shards = [[s for s in samples if groups.index(s["group"]) % self.size == r] for r in range(self.size)]
            results = [await w.call("compute_grads", shard) for w, shard in zip(self.workers, shards, strict=True)]
            grads = [g for g, _ in results]
            avg = (
                grads[0] if len(grads) == 1 else {k: sum(g[k] for g in grads if k in g) / len(grads) for k in grads[0]}
            )
            for w in self.workers:
                await w.call("apply_grads", avg)
        except WorkerCrashed as exc:
            return self._crashed(exc)
        stats: dict[str, float] = {}
        for _, s in results:
            for k, v in s.items():
                stats[k] = stats.get(k, 0.0) + v / len(results)
        self._stats = stats
        return Outcome("trained")

    async def _write_weights(self, version: str) -> tuple[str, str]:
        """Weight version ``version``'s checkpoint directory; the oldest beyond ``keep_checkpoints`` go, never a
        served one."""
        root = self.run_dir / "weights"
        path = root / f"step-{version}"
        await self.workers[0].call("save_checkpoint", str(path))
        self._written = [*(p for p in self._written if p != path), path]
        served = [p for p in (self.runner.committed, self.runner.pending) if p is not None]
        prune_checkpoints(root, self.keep_checkpoints, protect=[path, *(p for p, _ in served)], among=self._written)
        self._written = [p for p in self._written if p.exists()]
        return str(path.resolve()), version

    async def _write_update(self, cmd: Command) -> Outcome | None:
        """The trainer's ``transfer_weights``: the new weights on disk, for the engines of the snapshot."""
        try:
            self.runner.pending = await self._write_weights(str(self._step))
        except WorkerCrashed as exc:
            return self._crashed(exc)
        return None

    async def _save_checkpoint(self, cmd: Command) -> Outcome:
        try:
            self._saved, _ = await self._write_weights(str(self._step))
        except WorkerCrashed as exc:
            return self._crashed(exc)
        return Outcome("saved")

    async def _save_job(self, cmd: Command) -> Outcome:
        """The trainer's ``save_job_state``: worker 0's state (the replicas' weights and optimizer are identical),
        every worker's random generators, and the job's facts."""
        step = self._job
        save = self.config.save
        assert save is not None  # the effect is gated on saves_job
        committed = self.runner.committed
        version = committed[1] if committed is not None else str(step)
        try:
            state = await self.workers[0].call("get_state")
            rng = {"ranks": [await w.call("rng_state") for w in self.workers]}
        except WorkerCrashed as exc:
            return self._crashed(exc)
        stream = self.stream_record()  # taken as the write starts: a group completed during it is not in it
        target = self.runner.target()  # an elastic fleet's: a resume restarts that many engines
        facts: dict[str, Any] = {"restarts": self.runner.restart_ages()}
        facts |= {"stream": stream} if stream is not None else {}
        facts |= {"target": target} if target is not None else {}
        checkpoint = JobCheckpoint(step, version, state, facts, rng)
        self.checkpointed = await asyncio.to_thread(save_job_checkpoint, save, checkpoint, self.config, self.job)
        fact = Fact.of(CHECKPOINTED, resume_at=step, weight_version=version, path=str(self.checkpointed))
        return Outcome("checkpointed", facts=(fact,))

    async def _restore_job(self, cmd: Command) -> Outcome:
        """The trainer's ``restore_job_state``: every worker continues from the checkpoint (read and checked
        before anything started, so what is left to fail here is a worker)."""
        assert self.resume is not None  # the effect is gated on resumes
        try:
            for w in self.workers:
                await w.call("set_state", self.resume.trainer)
                await w.call("set_rng_state", self.resume.rng["ranks"][w.rank])
        except WorkerCrashed as exc:
            return self._crashed(exc)
        return Outcome("restored")

    async def _alive(self, worker: WorkerHandle) -> bool:
        """A short ping: a dead actor fails at once, a hung one runs out of the (short) bound."""
        try:
            await worker.call("pid", timeout=min(10.0, self.call_timeout))
        except WorkerCrashed:
            return False
        return True

    async def _replace_worker(self, cmd: Command) -> Outcome:
        """Replace every dead or hung worker and restore it from a live peer's state, else the last kept one."""
        alive: list[WorkerHandle] = []
        dead: list[WorkerHandle] = []
        for w in self.workers:
            (alive if await self._alive(w) else dead).append(w)
        try:
            state = await alive[0].call("get_state") if alive else self._last_state
        except WorkerCrashed as exc:
            return Outcome("heal_failed", reason=str(exc))
        if state is None:
            return Outcome("heal_failed", reason=f"{self._crash[1]}; no peer or saved state to heal from")
        for w in dead:
            w.kill()  # dead, or hung: either way it must not come back
            replacement = self._worker(w.rank)
            try:
                await replacement.call("set_state", state)
            except WorkerCrashed as exc:
                return Outcome("heal_failed", reason=str(exc))
            self.workers[self.workers.index(w)] = replacement
        self.heals += 1
        return Outcome("healed")

    async def _all(self, method: str) -> Outcome | None:
        try:
            for w in self.workers:
                await w.call(method)
        except WorkerCrashed as exc:
            return self._crashed(exc)
        return None
