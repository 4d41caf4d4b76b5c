"""One run's assembly: everything a job needs, built in one order and disposed of in the reverse, on every exit.

A user keeps their own loop; :class:`Job` owns only what every loop would otherwise wire by hand and in the
same order (Ray, the job's one lifecycle core, the trainer group, the rollout manager, the weight-broadcast
shell, the live invariant monitor, the Prometheus exporter), and gives the loop the step verbs in miles'
order::

    async with Job(config, task, run_dir=run_dir, backend=backend, options=RunOptions(seed=1)) as job:
        for step in range(steps):
            samples = await job.generate(step)
            await job.train(samples)
            await job.update_weights(step + 1)

``lifecycle run`` (:mod:`trainer.app.loop`) is built from it too, so the project's loop and a user's cannot
assemble a run differently. Ray and the trainer group are imported only when the job starts: importing this
module must not pay for them.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import weakref
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, TypeVar

from engines.apikey import run_api_key
from engines.backends import engine_backend
from engines.engine import Timeouts
from engines.launcher import EngineSetup, LauncherFactory
from engines.ledger import KEEP_NAMESPACE, LEDGER, EngineLedger
from engines.router import router_available
from lifecycle.decide.config import LifecycleConfig
from lifecycle.decide.core import ROLLOUT, Outcome, instance_name
from lifecycle.decide.errors import ConfigError, LifecycleError
from lifecycle.decide.events import FLEET, EventLog, JsonlSink, log_facts
from lifecycle.decide.ledger import EffectLedger
from lifecycle.decide.runner import Runner
from lifecycle.observe.monitor import MonitorSink
from rollout.executor import EvalResult, RolloutManager
from rollout.failures import slot_of
from rollout.policy_source import PolicyRolloutFn
from rollout.sample import Sample
from rollout.stream import Group, StreamState, Taken
from rollout.task import Task, checked_task
from trainer.app import heap
from trainer.app.checks import check_run, check_target, require_elastic
from trainer.app.dirlock import hold_run
from trainer.app.fleet import Fleet
from trainer.app.options import API_NAMES, JOB_NAMES, OPTIONS, RunOptions, loop_only
from trainer.backend import BackendSpec, build_backend, checked_save
from trainer.job_state import JobCheckpoint

if TYPE_CHECKING:  # Ray: imported when the job starts
    from engines.actor import Keep
    from trainer.app.metrics import MetricsServer
    from trainer.group import TrainerGroup


async def initial_weights(run_dir: Path, backend: BackendSpec, hf_checkpoint: Path | None = None) -> tuple[str, str]:
    """The weights a trainer would start from (version ``0``) when no trainer runs (--debug-rollout-only):
    ``--hf-checkpoint``, else a checkpoint the backend writes as ``run_dir/weights/step-0``."""
    if hf_checkpoint is not None:
        return str(Path(hf_checkpoint).resolve()), "0"
    path = await asyncio.to_thread(checked_save, build_backend(backend, 0), backend, run_dir / "weights" / "step-0")
    return str(Path(path).resolve()), "0"


def default_timeouts(config: LifecycleConfig) -> Timeouts:
    """Engine bounds where none were given: the backend's start-up bound (vLLM's servers take 40-130 s on 2 cores)."""
    return Timeouts(startup=engine_backend(config.rollout_backend).startup)


class Job:
    """A run's parts, built by ``async with`` and disposed of when it ends, however it ends.

    The user's parts: ``task`` (a :class:`rollout.task.Task`), ``backend`` (the trainer each worker runs;
    default the project's GRPO trainer), ``initial_checkpoint`` (version 0's weights), ``engines`` (an engine
    launcher factory; default the config's --rollout-backend on Ray with the run's API key: the project's CPU
    engine, or real vLLM servers on ``initial_checkpoint`` run by ``options.vllm_python``) -- engines started
    elsewhere come from the config (``rollout_external_engine_addrs``). ``options``: the run's options
    (:class:`~trainer.app.options.RunOptions`); a Job reads those declared ``job=True`` (the steps, seed, trainer
    workers, engines' launcher and timeouts, ``resume``, ``metrics_port``, ``events``, ...); the run loop's own
    (``lr``, ``faults``, ``async_mode``, ...) are the loop's. ``job.log`` exists from construction, so a caller
    can log before the job starts (a resume's event).
    """

    def __init__(
        self,
        config: LifecycleConfig,
        task: Task,
        *,
        run_dir: str | Path,
        backend: BackendSpec | None = None,
        initial_checkpoint: str | Path | None = None,
        engines: LauncherFactory | None = None,
        options: RunOptions | None = None,
    ) -> None:
        _check_arguments(config, task, run_dir, backend, initial_checkpoint, engines, options)
        opts = options if options is not None else RunOptions()
        self.config = config
        self.options = opts
        self.task = task
        self.run_dir = Path(run_dir)
        self.backend = backend
        self.initial_checkpoint = None if initial_checkpoint is None else Path(initial_checkpoint)
        self.engines = engines
        # the run's end, where a checkpoint is due: the options', else the config's number of rollouts
        self.steps = opts.steps if options is not None else config.num_rollout
        self.resume = opts.resume
        # what each job checkpoint records besides the config: the options that change the trained state, and
        # the job's identity (a run loop's job has one; a bare Job's checkpoints are matched on the config)
        self.settings = None if opts.job_id is None else {**opts.job_settings(), "id": opts.job_id}
        self.timeouts = opts.timeouts or default_timeouts(config)
        self.log = EventLog()
        # a relative name is the run directory's file; an absolute path is taken as it is
        self.events: Path | None = None if opts.events is None else self.run_dir / opts.events
        # before the first write (the sink below): one driver at a time writes the run and its checkpoints
        self._dirs = hold_run(self.run_dir, config.save, run_flag="run_dir=", save_flag="config.save")
        weakref.finalize(self, self._dirs.release)  # a job never closed frees them when it is collected
        self._sink = None if self.events is None else JsonlSink(self.events)
        if self._sink is not None:
            self.log.add_sink(self._sink)
        self.monitor = MonitorSink(self.log, config)  # the live invariant monitor: a violation is logged
        self.log.add_sink(self.monitor)
        self.ledger = EffectLedger()
        self.exporter: MetricsServer | None = None  # the Prometheus exporter (options.metrics_port)
        self.weights: tuple[str, str] | None = None  # the initial weights the engines were started with
        self._runner: Runner | None = None
        self._trainer: TrainerGroup | None = None
        self._manager: RolloutManager | None = None
        self.engine_ledger: EngineLedger | None = None  # --detach-engines: RUN_DIR/engines.json
        self._entered = False  # a job is entered once: its parts, once disposed of, are not built again
        self._closed = False
        self._version: int | None = None  # the last weight version pushed (or started from): each push is above it
        self._froze = False  # this job moved the start-up heap out of the collector's reach (trainer.app.heap)

    # -- the parts, for advanced users (they exist once the job has started; still readable after it ends) --

    @property
    def runner(self) -> Runner:
        """The job's one lifecycle core: both sides bind their handlers to it."""
        return _built(self._runner, "runner")

    @property
    def trainer(self) -> TrainerGroup:
        return _built(self._trainer, "trainer")

    @property
    def manager(self) -> RolloutManager:
        return _built(self._manager, "manager")

    # -- assembly and disposal --------------------------------------------------------------------------

    async def __aenter__(self) -> Job:
        if self._entered:
            raise JobReused(
                "this Job was entered already (`async with` builds its parts once, and closing disposes of them for "
                "good); entering it again would start a second set of engines and trainer workers. Fix: construct "
                "a new Job for each run (`async with Job(...) as job:`)"
            )
        self._entered = True
        try:
            self._build()
            await self._start()
            self._freeze()
        except BaseException as exc:
            await self._close_under(exc)  # a half-built job: its cleanup must not hide why it failed
            raise
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if exc is None:
            await self.close()
        else:
            await self._close_under(exc)

    async def _close_under(self, cause: BaseException) -> None:
        """Close while ``cause`` propagates: every part is still disposed of, and a failure of the cleanup itself
        (a half-built job's core has handlers missing: ``UnboundEffect``) becomes a note on ``cause`` instead of
        replacing it."""
        try:
            await self.close()
        except Exception as exc:  # the cause is what the caller must see
            cause.add_note(f"while the job was being closed after this failure: {type(exc).__name__}: {exc}"[:500])

    def _build(self) -> None:
        """The parts, in the order ``lifecycle run`` has always built them (its golden event log pins it)."""
        from engines.actor import init_local_cluster
        from trainer.app.broadcast import WeightBroadcast
        from trainer.group import TrainerGroup

        self.run_dir.mkdir(parents=True, exist_ok=True)
        init_local_cluster(num_cpus=2, address=self.options.ray_address, nodes=self.options.ray_nodes)
        self._runner = Runner(self.config, log=self.log, ledger=self.ledger)
        self._trainer = TrainerGroup(
            self.config,
            self.run_dir,
            runner=self._runner,
            workers=self.options.workers,
            backend=self.backend,
            keep_checkpoints=self.options.keep_checkpoints,
            initial_checkpoint=self.initial_checkpoint,
            resume=self.resume,
            seed=self.options.seed,
            job=self.settings,
        )
        self.backend = self._trainer.backend  # the project's default, when none was given
        if self.config.keeps_engines:
            self.engine_ledger = _engine_ledger(self.run_dir, resumed=self.resume is not None)
        engines = self.engines or self._engines()
        self._manager = RolloutManager(
            self.config,
            self.task,
            runner=self._runner,
            launcher_factory=engines,
            seed=self.options.seed,
            rollout_fn_path=self.options.rollout_fn,
            data_source_path=self.options.data_source,
            timeouts=self.timeouts,
            router=router_available() if self.options.router is None else self.options.router,  # SMG, if installed
            log_dir=str(self.run_dir),
            engine_ledger=self.engine_ledger,
        )
        stream = self._manager.stream
        if self.resume is not None and self.resume.stream is not None:
            stream.restore(StreamState.of(self.resume.stream))
        self._trainer.stream_record = lambda: stream.snapshot().record() if stream.started else None
        # the weight_sync machine's shell binds its handlers to the runner; the core issues its commands only
        # under --update-weight-transfer-mode broadcast (the runtime asks no predicate itself)
        WeightBroadcast(self._runner, self._manager.controller, self._trainer)
        if self._runner.core.elastic:  # Ray's draining nodes are preemption notices an elastic fleet acts on
            self._manager.controller.watch_draining_nodes(self._noticed)
        port, host = self.options.metrics_port, self.options.metrics_host
        if port is not None:
            from trainer.app.metrics import serve_metrics

            self.exporter = serve_metrics(self.log, port, host=host, config=self.config)

    def _engines(self) -> LauncherFactory:
        """The config's engine backend, launched per slot (its row's launchers: the project's CPU engine, or a real
        vLLM server from its own environment on the initial checkpoint, a Hugging Face directory)."""
        setup = EngineSetup(
            self.options.launcher,
            seed=self.options.seed,
            checkpoint=self.initial_checkpoint,
            api_key=run_api_key(self.run_dir),
            device=self.config.rollout_device,
            startup=self.timeouts.startup,
            keep=self._keep(),
            python=self.options.vllm_python,
        )
        return engine_backend(self.config.rollout_backend).launchers(setup)

    def _keep(self) -> Keep | None:
        """--detach-engines: how the engines outlive this driver (named after the job, with a lease); else None."""
        if self.engine_ledger is None:
            return None
        from engines.actor import Keep  # imports Ray: only where engines are Ray actors

        job_id = self.options.job_id or self.run_dir.resolve().name
        return Keep(job_id, self.engine_ledger.namespace, self.options.engine_lease or Keep.DEFAULT_LEASE)

    async def _start(self) -> None:
        """The trainer's initial weights (under --debug-rollout-only no trainer exists: the backend's seed
        weights), then the rollout side's init on them."""
        trainer, manager = self.trainer, self.manager
        assert self.backend is not None  # set by _build
        weights = await trainer.start() or await initial_weights(self.run_dir, self.backend, self.initial_checkpoint)
        self.weights = weights
        self._version = _as_version(weights[1])
        if self.resume is not None and self.engine_ledger is not None:  # adopt what the dead driver's ledger names
            ids = [instance_name(ROLLOUT, i) for i in range(len(self.runner.state.engines))]
            logged = {} if self.events is None else (await asyncio.to_thread(log_facts, self.events)).epochs
            self.runner.keep(*self.engine_ledger.generations(ids, logged))
        await manager.init(weights)
        _feed_policy_source(manager, weights)

    async def _noticed(self, group: str, index: int, epoch: int | None, deadline_s: float) -> None:
        """A preemption notice from Ray (a draining node) about one engine process: news for the core."""
        why = f"preemption notice: taken in {deadline_s:g} s (Ray drains its node)"
        await self.runner.report(Outcome("preempt_notice", group, index, why, epoch=epoch))

    def _freeze(self) -> None:
        """The start-up heap out of the collector's reach while the job runs (:mod:`trainer.app.heap`)."""
        heap.freeze()
        self._froze = True

    async def close(self) -> None:
        """Engines first (they load the trainer's checkpoints), then the trainer, the exporter, the sinks: each
        step runs even when the one before it raised. Called again, it does nothing."""
        if self._closed:
            return
        self._closed = True
        # a job whose build failed before every shell was bound: its core has run nothing (it refuses to while a
        # handler is missing), so its parts' processes are stopped without asking it
        built = self._runner is None or not self._runner.unbound()
        try:
            if self._manager is not None:
                await (self._manager.dispose() if built else self._manager.controller.close())
        finally:
            try:
                if self._trainer is not None and built:
                    await self._trainer.dispose()
                elif self._trainer is not None:
                    for worker in self._trainer.workers:
                        worker.kill()
            finally:
                self._unfreeze()
                if self.exporter is not None:
                    self.exporter.close()
                self.log.remove_sink(self.monitor)
                if self._sink is not None:
                    self.log.remove_sink(self._sink)  # and closes it
                self._dirs.release()

    def _unfreeze(self) -> None:
        if self._froze:
            self._froze = False
            heap.release()

    # -- the step verbs, in miles' order: generate, train, update_weights (eval, checkpoint) ------------

    async def generate(self, step: int) -> list[Sample]:
        """One rollout's samples; dead engines are recovered and caught up first (rollout FT)."""
        return await self.manager.generate(step)

    async def train(self, samples: list[Sample], *, offload: bool = True) -> dict[str, Any]:
        """Offload the rollout engines (a no-op unless the config offloads them), then one optimisation step;
        its stats (empty without a trainer). ``offload=False``: the async loop, whose engines never idle."""
        if offload:
            await self.manager.offload()
        return await self.trainer.train(samples) or {}

    async def update_weights(self, version: int, *, onload: bool = True) -> None:
        """Onload the engines' weights, push ``version`` to them (one snapshot, under the engine lock), hand
        it to an engine-less policy source, onload their KV cache. ``onload=False``: nothing was offloaded.

        Versions only increase: ``version`` must be above the last one pushed (at first, the version the job
        started from: 0, or a resumed job's checkpoint's); anything else is refused before anything is sent."""
        last = self._version
        if isinstance(version, bool) or not isinstance(version, int) or (last is not None and version <= last):
            raise ConfigError(
                "Job.update_weights(version=)",
                version,
                f"must be an integer above the last weight version, {last} (versions a loop pushes only increase: "
                "an engine holding a lower or equal one cannot be told apart from one that missed the update)",
                f"push {'the next step' if last is None else last + 1} (e.g. update_weights(step + 1) after "
                "training step `step`)",
            )
        if self.config.fully_async and last is not None and version != last + 1:
            raise ConfigError(
                "Job.update_weights(version=)",
                version,
                f"skips versions after {last}: a stream counts a sample's staleness in versions, one per update "
                "(--max-weight-staleness), so its versions are consecutive",
                f"push {last + 1}",
            )
        if onload:
            await self.manager.onload_weights()
        await self.trainer.update_weights(version)
        self._version = version
        await _checkpoint_for_policy_source(self.manager, self.trainer, version)
        if onload:
            await self.manager.onload_kv()

    # -- streaming (--fully-async): generation never stops; the trainer takes what is fresh enough -------------

    @contextlib.asynccontextmanager
    async def streaming(self) -> AsyncIterator[Job]:
        """Run the rollout stream for the block: every routable engine generates on, completed groups queue up;
        :meth:`take` trains on them and :meth:`update_weights` pushes new weights while requests are in flight.
        On the way out the stream stops (its requests in flight are kept as prompts to send again)::

            async with job.streaming():
                for step in range(steps):
                    batch = await job.take()  # groups within --max-weight-staleness; stale ones re-queued
                    await job.update_weights(step + 1)
        """
        stream = self.manager.stream
        await stream.start()
        try:
            yield self
        finally:
            await stream.stop()

    async def take(self, *, timeout: float | None = None) -> Taken:
        """The next batch of completed groups, offered to the core's ``take``: every group more than
        ``--max-weight-staleness`` versions behind the committed weights is dropped (``stream.group_dropped``) and
        its prompt sent again; one optimisation step on the rest. A batch dropped whole is followed by the next
        one; ``timeout`` (default: the stream's bound per group, times the batches the queue holds) bounds each
        wait, and so many whole drops in a row that the bound can never be met end in an error naming the flag."""
        stream = self.manager.stream
        wait = timeout if timeout is not None else stream.group_timeout * stream.max_batches
        dropped: list[Group] = []
        for _ in range(WHOLE_DROPS):
            await stream.offer(await stream.next_batch(wait))
            stats = await self.trainer.take(stream.samples)
            taken = stream.taken()
            dropped.extend(taken.dropped)
            if taken.samples:
                return Taken(taken.samples, taken.groups, dropped, taken.version, stats or {})
        raise ConfigError(
            "--max-weight-staleness",
            self.config.max_weight_staleness,
            f"{WHOLE_DROPS} batches in a row were all older than the bound when the trainer took them: the stream "
            "cannot keep up with the updates",
            "raise --max-weight-staleness, or lower --async-data-buffer-max-batches so groups wait less",
        )

    # -- an elastic fleet (--rollout-min-num-gpus / --rollout-max-num-gpus): engines join and leave mid-run -------

    @property
    def fleet(self) -> Fleet:
        """The rollout fleet now, read off the lifecycle core's state: the target, the members, who serves, who
        drains, which slots are vacant (:class:`~trainer.app.fleet.Fleet`, in slot ids ``engine-N``)."""
        return self._fleet()

    async def scale_rollout(self, n: int) -> Fleet:
        """Make the rollout fleet ``n`` engines, within its bounds (``--rollout-min-num-gpus`` ..
        ``--rollout-max-num-gpus``, in engines). Joiners launch into vacant slots and load the committed weights
        under the engine lock before anything is routed to them (at the next ``generate``; in a stream, once
        loaded); leavers -- vacant-soon slots first, then the highest -- leave the gateway at once, their requests
        in flight finish within ``--rollout-drain-timeout`` beside the loop, then they are stopped. Callable between
        steps, during a ``generate`` or in a stream; returns the fleet once every joiner is loaded (a failed start
        leaves its slot vacant, joined again at the next step) and every leaver is out of the gateway::

            # rollout_num_gpus 2, rollout_min_num_gpus 1, rollout_max_num_gpus 4: 2 -> 4 -> 1 engines
            async with Job(config, task, run_dir=run_dir) as job:
                fleet = await job.scale_rollout(4)  # fleet.members: engine-0 .. engine-3
                await job.generate(0)                # routed to all four
                await job.scale_rollout(1)           # engine-3, -2, -1 drain beside the loop
        """
        target = check_target(self.config, n, "Job.scale_rollout(n=)")
        return await self._scale(target)

    async def add_engines(self, n: int) -> list[str]:
        """``n`` engines more than the target (:meth:`scale_rollout` of target + n): the slots that joined (each
        loaded the committed weights, or will before it is routed where a ``generate`` runs; one that failed to start
        is not among them)."""
        name = "Job.add_engines(n=)"
        require_elastic(self.config, name, n)
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ConfigError(name, n, "must be a positive number of engines (an int)", "pass e.g. 2")
        before = self.fleet
        target = check_target(self.config, before.target + n, name, n)
        after = await self._scale(target)
        return [e for e in after.members if e not in before.members]

    async def retire_engines(self, ids: Sequence[str | int], *, wait: bool = False) -> list[str]:
        """Retire these engines (slot ids ``engine-N`` or indices N): each leaves the gateway at once, its requests in
        flight finish within ``--rollout-drain-timeout``, then it is stopped; the target drops by one each, never
        below ``--rollout-min-num-gpus``. Returns the ids once out of the gateway; ``wait=True``: once stopped.

            await job.retire_engines(["engine-3", "engine-2"])  # 4 -> 2 engines
        """
        name = "Job.retire_engines(ids=)"
        require_elastic(self.config, name, ids)
        slots = _slot_ids(ids, name)
        fleet = self.fleet
        check_target(self.config, fleet.target - len(slots), name, list(ids))
        strangers = [e for e in slots if e not in fleet.members]
        if strangers:
            raise ConfigError(
                name,
                list(ids),
                f"{', '.join(strangers)} {'is' if len(strangers) == 1 else 'are'} not a member of the fleet (members: "
                f"{', '.join(fleet.members) or 'none'}; leaving already: {', '.join(fleet.draining) or 'none'})",
                "retire members only (job.fleet.members)",
            )
        if not isinstance(wait, bool):
            raise ConfigError("Job.retire_engines(wait=)", wait, "must be True or False", "pass wait=True or omit it")
        return await self._retire(slots, wait=wait)

    def _fleet(self) -> Fleet:
        core, state = self.runner.core, self.runner.state
        slots = state.engines
        name = [instance_name(ROLLOUT, i) for i in range(len(slots))]
        members = core.members(state)
        return Fleet(
            target=state.target if core.elastic else len(members),
            members=tuple(name[i] for i in members),
            serving=tuple(name[i] for i in core.routable(state)),
            draining=tuple(name[i] for i, e in enumerate(slots) if core.leaving(e) and e.state not in core.gone),
            vacant=tuple(name[i] for i, e in enumerate(slots) if e.state in core.gone and not core.leaving(e)),
        )

    async def _scale(self, target: int) -> Fleet:
        await self.runner.operate("scale_rollout", target=target)
        self.manager.controller.check()
        return self._scaled()

    async def _retire(self, slots: list[str], *, wait: bool) -> list[str]:
        for slot in slots:
            await self.runner.operate("retire_engine", slot_of(slot)[1])
            self.manager.controller.check()
        self._scaled()
        if wait:
            await self._retired(slots)
        return slots

    def _scaled(self) -> Fleet:
        """The fleet after a scale operation, on the record (``fleet.scaled``: what the target is now, who is in)."""
        fleet = self.fleet
        self.log.emit(
            FLEET,
            target=fleet.target,
            members=list(fleet.members),
            serving=list(fleet.serving),
            min_engines=self.config.min_rollout_engines,
            max_engines=self.config.max_rollout_engines,
        )
        return fleet

    async def _retired(self, slots: list[str]) -> None:
        """Until each of ``slots`` is stopped and its death confirmed: bounded by its drain, its death's bound and a
        margin for the kill itself."""
        bound = (self.config.rollout_drain_timeout or 0.0) + self.timeouts.death + RETIRE_MARGIN_S
        deadline = asyncio.get_running_loop().time() + bound
        while left := [s for s in slots if s in self.fleet.draining]:
            if asyncio.get_running_loop().time() > deadline:
                raise LifecycleError(
                    f"{', '.join(left)} still leaving {bound:g} s after their retirement (--rollout-drain-timeout "
                    f"{self.config.rollout_drain_timeout:g} s, the death bound {self.timeouts.death:g} s)"
                )
            self.manager.controller.check()
            await asyncio.sleep(0.05)

    @property
    def streams(self) -> bool:
        """Whether the job streams (``--fully-async``): its loop uses :meth:`streaming` and :meth:`take`."""
        return self.runner.core.streaming

    async def eval(self, step: int) -> EvalResult:
        """miles' eval on the committed weights (restarted engines catch up first). In a stream the stream
        stops for it (the rollout manager evaluates from Ready) and starts again after."""
        stream = self.manager.stream
        if not stream.running:
            return await self.manager.eval(step)
        await stream.stop()
        try:
            return await self.manager.eval(step)
        finally:
            await stream.start()

    async def checkpoint(self, done: int) -> Path | None:
        """A job checkpoint once ``done`` steps are, when ``config.checkpoint_due`` says so (every
        --save-interval, and at the run's end: ``steps``); call it after the step's weight update. Its path."""
        if not self.config.checkpoint_due(done, self.steps if self.steps is not None else -1):
            return None
        return await self.trainer.checkpoint(done)


_T = TypeVar("_T")
WHOLE_DROPS = 8  # batches dropped whole in a row before a take gives up: the bound cannot be met
RETIRE_MARGIN_S = 10.0  # retire_engines(wait=True): the kill and its confirmation, beyond the drain and death bounds


class JobReused(LifecycleError, RuntimeError):
    """A :class:`Job` entered a second time: its parts are built once and disposed of for good."""


def _as_version(text: str) -> int | None:
    """The weight version the job started from, as the number pushes must exceed (None: not a number)."""
    try:
        return int(text)
    except ValueError:
        return None


def job_error(exc: ConfigError) -> ConfigError:
    """``exc`` naming the Job's argument (or its options' field) instead of the CLI's flag; a setting of the config
    says it came from it."""
    argument = JOB_NAMES.get(exc.flag)
    if exc.flag in API_NAMES.values():
        return exc  # named as the options' field already
    if argument is None:
        return exc if exc.source else exc.with_source("Job(config=)")
    return ConfigError(argument, exc.value, exc.problem, exc.fix, source=exc.source)


def _argument(name: str, value: object, ok: bool, expected: str, fix: str) -> None:
    if not ok:
        raise ConfigError(name, value, f"must be {expected}, not {type(value).__name__}", fix)


def _check_arguments(
    config: object,
    task: object,
    run_dir: Any,
    backend: object,
    initial_checkpoint: Any,
    engines: object,
    options: object,
) -> None:
    """A Job's arguments, checked when it is constructed -- before Ray starts or anything is written: the one check
    of a run's settings that ``lifecycle run`` runs too, plus the types only a Python caller can get wrong."""
    _argument(
        "Job(options=)",
        options,
        options is None or isinstance(options, RunOptions),
        "a trainer.app.RunOptions or None",
        "pass RunOptions(seed=..., metrics_port=..., ...), or None for the defaults",
    )
    opts = options if isinstance(options, RunOptions) else RunOptions()
    # the options a Job reads; the ones it takes as its own arguments (run_dir, initial_checkpoint, ...) from those
    given = {o.name: getattr(opts, o.name) for o in OPTIONS if o.job}
    checked = RunOptions(**given, run_dir=run_dir, hf_checkpoint=initial_checkpoint, model_size=_model_size(backend))
    try:
        check_run(config, checked, engines_given=engines is not None, names=API_NAMES)
    except ConfigError as exc:
        raise job_error(exc) from None
    assert isinstance(config, LifecycleConfig)  # check_run's first check
    checked_task(task, "Job(task=)")
    _argument(
        "Job(backend=)",
        backend,
        backend is None or isinstance(backend, BackendSpec),
        "a trainer.BackendSpec or None",
        "pass BackendSpec('mypkg.train:MyBackend', {...}), or None for the project's GRPO trainer",
    )
    _argument(
        "Job(engines=)",
        engines,
        engines is None or callable(engines),
        "callable",
        "pass a launcher factory (engine_id -> Launcher), or None",
    )
    _check_options(config, opts)


def _check_options(config: LifecycleConfig, opts: RunOptions) -> None:
    """The options only a Python caller can give of the wrong type, and a resume that does not fit the config."""
    resume, events = opts.resume, opts.events
    ignored = loop_only(opts) if opts.job_id is None else []  # the loop's own job records them in its checkpoints
    if ignored:
        name, argument = ignored[0].name, ignored[0].argument
        raise ConfigError(
            API_NAMES[name],
            getattr(opts, name),
            "is an option of the run loop (run_loop, lifecycle run), which a Job does not read",
            f"pass it as Job({argument}=)" if argument else "drop it, or give it to your own loop or backend",
        )
    _argument(
        API_NAMES["resume"],
        resume,
        resume is None or isinstance(resume, JobCheckpoint),
        "a JobCheckpoint or None",
        "read it with trainer.load_job_checkpoint(config.load, config)",
    )
    _argument(
        API_NAMES["router"],
        opts.router,
        opts.router is None or isinstance(opts.router, bool),
        "True, False or None",
        "pass router=False to route in-process, None where SMG is installed",
    )
    _argument(
        API_NAMES["vllm_python"],
        opts.vllm_python,
        opts.vllm_python is None or isinstance(opts.vllm_python, str),
        "a path (str) or None",
        "pass the vLLM environment's python, or None to find it",
    )
    _argument(
        API_NAMES["events"],
        events,
        events is None or (isinstance(events, str | os.PathLike) and bool(str(events).strip())),
        "a file name (relative to run_dir), a path, or None",
        "pass 'events.jsonl' (the default), or None for no event log",
    )
    _argument(
        API_NAMES["job_id"],
        opts.job_id,
        opts.job_id is None or (isinstance(opts.job_id, str) and 0 < len(opts.job_id) <= 128),
        "a short string or None",
        "pass None (a bare Job's checkpoints are matched on the config alone)",
    )
    if resume is not None and config.load is None:
        raise ConfigError(
            API_NAMES["resume"],
            str(resume.path),
            "is a job checkpoint, but config.load is unset: the lifecycle would start the job afresh",
            "set config.load to the directory it was read from",
        )
    if resume is not None and resume.ranks != opts.workers:
        raise ConfigError(
            API_NAMES["workers"],
            opts.workers,
            f"the job checkpoint {resume.path} was written by {resume.ranks} workers (one RNG state each)",
            f"resume with workers={resume.ranks}",
        )
    if resume is None and config.load is not None:
        raise ConfigError(
            API_NAMES["resume"],
            None,
            f"config.load is {config.load!r}: the job continues the checkpoint there, which its trainer needs",
            "read it with trainer.load_job_checkpoint(config.load, config) and pass it as RunOptions(resume=)",
        )


def _slot_ids(ids: object, name: str) -> list[str]:
    """Engine slot ids from ``engine-N`` names or indices N: distinct, at least one."""
    fix = "pass slot ids, e.g. ['engine-3'] or [3] (job.fleet.members)"
    if isinstance(ids, str | bytes) or not isinstance(ids, Sequence) or not ids:
        raise ConfigError(name, ids, "must be a non-empty list of engine slot ids", fix)
    slots: list[str] = []
    for i in ids:
        if isinstance(i, int) and not isinstance(i, bool) and i >= 0:
            slots.append(instance_name(ROLLOUT, i))
        elif isinstance(i, str) and i.strip():
            slots.append(i.strip())
        else:
            raise ConfigError(name, list(ids), f"{i!r} is not an engine slot id", fix)
    if len(set(slots)) != len(slots):
        raise ConfigError(name, list(ids), "names an engine twice", "name each engine once")
    return slots


def _engine_ledger(run_dir: Path, *, resumed: bool) -> EngineLedger:
    """--detach-engines: RUN_DIR/engines.json. A resume reads what the dead driver left; a new job starts a new
    ledger (a previous job's engines in this directory are not this job's: they run out their lease)."""
    path = run_dir / LEDGER
    if not resumed:
        path.unlink(missing_ok=True)
    return EngineLedger.read(path, namespace=KEEP_NAMESPACE)


def _model_size(backend: object) -> str:
    """The char model size a backend trains (the project's GRPO trainer says so): the initial checkpoint's check."""
    size = backend.kwargs.get("model_size") if isinstance(backend, BackendSpec) else None
    return size if isinstance(size, str) else "tiny"


def _built(part: _T | None, name: str) -> _T:
    if part is None:
        raise RuntimeError(f"job.{name} exists once the job has started (`async with Job(...) as job:`)")
    return part


def _feed_policy_source(manager: RolloutManager, weights: tuple[str, str]) -> None:
    """Plain train-only: hand the trainer's weights to the engine-less data producer."""
    fn = manager.executor.rollout_fn
    if isinstance(fn, PolicyRolloutFn):
        fn.load(*weights)


async def _checkpoint_for_policy_source(manager: RolloutManager, trainer: TrainerGroup, version: int) -> None:
    """With no engines to update, the trainer's ``save`` move is the weight hand-off to the producer."""
    if isinstance(manager.executor.rollout_fn, PolicyRolloutFn):
        path = await trainer.save(version)
        if path is not None:
            _feed_policy_source(manager, (path, str(version)))
