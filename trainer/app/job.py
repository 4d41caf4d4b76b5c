"""One run's assembly: everything a job needs, built in one order and disposed of in the reverse, on every exit.

A user keeps their own loop; :class:`Job` owns only what every loop would otherwise wire by hand and in the
same order (Ray, the job's one lifecycle core, the trainer group, the rollout manager, the weight-broadcast
shell, the live invariant monitor, the Prometheus exporter), and gives the loop the step verbs in miles'
order::

    async with Job(config, task, backend=backend, run_dir=run_dir, initial_checkpoint=ckpt) as job:
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
import gc
import os
import weakref
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, TypeVar

from engines.apikey import run_api_key
from engines.backends import engine_backend
from engines.engine import Timeouts
from engines.launcher import EngineSetup, LauncherFactory, LauncherKind
from engines.ledger import KEEP_NAMESPACE, LEDGER, EngineLedger
from engines.router import router_available
from lifecycle.decide.config import LifecycleConfig
from lifecycle.decide.core import ROLLOUT, instance_name
from lifecycle.decide.errors import ConfigError, LifecycleError
from lifecycle.decide.events import EventLog, JsonlSink, log_facts
from lifecycle.decide.ledger import EffectLedger
from lifecycle.decide.runner import Runner
from lifecycle.observe.monitor import MonitorSink
from rollout.executor import EvalResult, RolloutManager
from rollout.policy_source import PolicyRolloutFn
from rollout.sample import Sample
from rollout.task import Task, checked_task
from trainer.app.checks import check_run
from trainer.app.dirlock import hold_run
from trainer.backend import BackendSpec, build_backend, checked_save
from trainer.job_state import JobCheckpoint

if TYPE_CHECKING:  # Ray: imported when the job starts
    from trainer.app.metrics import MetricsServer
    from trainer.group import TrainerGroup


_FROZEN_JOBS = 0  # jobs of this process that froze the heap and have not closed (Job._freeze)
_EMBEDDER_FROZE = False  # the process had frozen its own heap before the first of them: never unfreeze it


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
    engine, or real vLLM servers on ``initial_checkpoint`` run by ``vllm_python``) -- engines started elsewhere
    come from the config (``rollout_external_engine_addrs``). ``metrics_port`` serves Prometheus
    metrics; ``events`` (relative to ``run_dir``; None: none) is where the event log is appended.
    ``job.log`` exists from construction, so a caller can log before the job starts (a resume's event).
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
        launcher: LauncherKind = "ray",
        steps: int | None = None,
        seed: int = 0,
        workers: int = 1,
        keep_checkpoints: int = 3,
        resume: JobCheckpoint | None = None,
        settings: Mapping[str, Any] | None = None,
        timeouts: Timeouts | None = None,
        rollout_fn: str | None = None,
        data_source: str | None = None,
        router: bool | None = None,
        metrics_port: int | None = None,
        metrics_host: str = "127.0.0.1",
        ray_address: str | None = None,
        ray_nodes: int = 1,
        vllm_python: str | None = None,
        log: EventLog | None = None,
        events: str | Path | None = "events.jsonl",
        engine_lease: float | None = None,
    ) -> None:
        _check_arguments(
            config,
            task,
            run_dir=run_dir,
            backend=backend,
            initial_checkpoint=initial_checkpoint,
            engines=engines,
            launcher=launcher,
            steps=steps,
            seed=seed,
            workers=workers,
            keep_checkpoints=keep_checkpoints,
            resume=resume,
            settings=settings,
            timeouts=timeouts,
            rollout_fn=rollout_fn,
            data_source=data_source,
            router=router,
            metrics_port=metrics_port,
            metrics_host=metrics_host,
            ray_address=ray_address,
            ray_nodes=ray_nodes,
            vllm_python=vllm_python,
            log=log,
            events=events,
            engine_lease=engine_lease,
        )
        self.config = config
        # --detach-engines: each kept engine exits unless this driver renews its lease (seconds) in time
        self.engine_lease = engine_lease
        self.task = task
        self.run_dir = Path(run_dir)
        self.backend = backend
        self.initial_checkpoint = None if initial_checkpoint is None else Path(initial_checkpoint)
        self.engines = engines
        self.launcher: LauncherKind = launcher
        self.steps = steps if steps is not None else config.num_rollout  # the run's end: a checkpoint is due
        self.seed = seed
        self.workers = workers
        self.keep_checkpoints = keep_checkpoints
        self.resume = resume
        self.settings = settings
        self.timeouts = timeouts or default_timeouts(config)
        self.rollout_fn = rollout_fn
        self.data_source = data_source
        self.router = router
        self.metrics_port = metrics_port
        self.metrics_host = metrics_host
        self.ray_address = ray_address
        self.ray_nodes = ray_nodes
        self.vllm_python = vllm_python  # --rollout-backend vllm: the engine environment's python (else found)
        self.log = log if log is not None else EventLog()
        # a relative name is the run directory's file; an absolute path is taken as it is
        self.events: Path | None = None if events is None else self.run_dir / events
        # before the first write (the sink below): one driver at a time writes the run and its checkpoints
        self._dirs = hold_run(self.run_dir, config.save, run_flag="run_dir=", save_flag="config.save")
        weakref.finalize(self, self._dirs.release)  # a job never closed frees them when it is collected
        self._sink = None if self.events is None else JsonlSink(self.events)
        if self._sink is not None:
            self.log.add_sink(self._sink)
        self.monitor = MonitorSink(self.log, config)  # the live invariant monitor: a violation is logged
        self.log.add_sink(self.monitor)
        self.ledger = EffectLedger()
        self.exporter: MetricsServer | None = None  # the Prometheus exporter (metrics_port)
        self.weights: tuple[str, str] | None = None  # the initial weights the engines were started with
        self._runner: Runner | None = None
        self._trainer: TrainerGroup | None = None
        self._manager: RolloutManager | None = None
        self.engine_ledger: EngineLedger | None = None  # --detach-engines: RUN_DIR/engines.json
        self._entered = False  # a job is entered once: its parts, once disposed of, are not built again
        self._closed = False
        self._version: int | None = None  # the last weight version pushed (or started from): each push is above it
        self._froze = False  # this job moved the start-up heap out of the collector's reach (see _freeze)

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
        init_local_cluster(num_cpus=2, address=self.ray_address, nodes=self.ray_nodes)
        self._runner = Runner(self.config, log=self.log, ledger=self.ledger)
        self._trainer = TrainerGroup(
            self.config,
            self.run_dir,
            runner=self._runner,
            workers=self.workers,
            backend=self.backend,
            keep_checkpoints=self.keep_checkpoints,
            initial_checkpoint=self.initial_checkpoint,
            resume=self.resume,
            seed=self.seed,
            job=self.settings,
        )
        self.backend = self._trainer.backend  # the project's default, when none was given
        if self.config.detach_engines:
            # a resume reads what the dead driver left; a new job starts a new ledger (a previous job's engines in
            # this directory are not this job's: they run out their lease)
            path = self.run_dir / LEDGER
            if self.resume is None:
                path.unlink(missing_ok=True)
            self.engine_ledger = EngineLedger.read(path, namespace=KEEP_NAMESPACE)
        engines = self.engines or self._engines()
        self._manager = RolloutManager(
            self.config,
            self.task,
            runner=self._runner,
            launcher_factory=engines,
            seed=self.seed,
            rollout_fn_path=self.rollout_fn,
            data_source_path=self.data_source,
            timeouts=self.timeouts,
            router=self._router(),
            log_dir=str(self.run_dir),
            engine_ledger=self.engine_ledger,
        )
        # the weight_sync machine's shell binds its handlers to the runner; the core issues its commands only
        # under --update-weight-transfer-mode broadcast (the runtime asks no predicate itself)
        WeightBroadcast(self._runner, self._manager.controller, self._trainer)
        if self.metrics_port is not None:
            from trainer.app.metrics import serve_metrics

            self.exporter = serve_metrics(self.log, self.metrics_port, host=self.metrics_host, config=self.config)

    def _engines(self) -> LauncherFactory:
        """The config's engine backend, launched per slot (its row's launchers: the project's CPU engine, or a real
        vLLM server from its own environment on the initial checkpoint, a Hugging Face directory)."""
        setup = EngineSetup(
            self.launcher,
            seed=self.seed,
            checkpoint=self.initial_checkpoint,
            api_key=run_api_key(self.run_dir),
            device=self.config.rollout_device,
            startup=self.timeouts.startup,
            keep=self._keep(),
            python=self.vllm_python,
        )
        return engine_backend(self.config.rollout_backend).launchers(setup)

    def _keep(self) -> Any:
        """--detach-engines: how the engines outlive this driver (named after the job, with a lease); else None."""
        if self.engine_ledger is None:
            return None
        from engines.actor import Keep  # imports Ray: only where engines are Ray actors

        job_id = str((self.settings or {}).get("id") or self.run_dir.resolve().name)
        return Keep(job_id, self.engine_ledger.namespace, self.engine_lease or Keep.DEFAULT_LEASE)

    def _router(self) -> bool:
        """The SMG gateway in front of the engines (either backend) where it is installed."""
        return router_available() if self.router is None else self.router

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

    def _freeze(self) -> None:
        """Move the start-up heap out of the cyclic garbage collector's reach, once everything long-lived exists.

        The driver holds ~420k objects after start-up at 1,024 engines (the imports, Ray, the engines' clients, the
        machines, the trainer), all alive until the job ends. A fleet operation's requests allocate enough for the
        collector to run full collections, each walking that whole heap: 190-445 ms of a fleet operation's CPU at
        N = 1,024 (issue 32, P7). ``gc.freeze()`` puts it in the permanent generation that no collection walks;
        the collect before it keeps start-up's garbage out of it. Undone when the last frozen job closes, so what
        the job held is collectable again (a process that runs many jobs -- the tests -- does not keep it), unless
        the process froze its own heap first: an embedder's freeze is its own policy, and unfreezing is all or none."""
        global _FROZEN_JOBS, _EMBEDDER_FROZE
        if not _FROZEN_JOBS:
            _EMBEDDER_FROZE = gc.get_freeze_count() > 0
        gc.collect()
        gc.freeze()
        self._froze = True
        _FROZEN_JOBS += 1

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
        global _FROZEN_JOBS
        if self._froze:
            self._froze = False
            _FROZEN_JOBS -= 1
            if not _FROZEN_JOBS and not _EMBEDDER_FROZE:  # another job still runs, or the embedder froze: stays
                gc.unfreeze()

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
        if onload:
            await self.manager.onload_weights()
        await self.trainer.update_weights(version)
        self._version = version
        await _checkpoint_for_policy_source(self.manager, self.trainer, version)
        if onload:
            await self.manager.onload_kv()

    async def eval(self, step: int) -> EvalResult:
        """miles' eval on the committed weights (restarted engines catch up first)."""
        return await self.manager.eval(step)

    async def checkpoint(self, done: int) -> Path | None:
        """A job checkpoint once ``done`` steps are, when ``config.checkpoint_due`` says so (every
        --save-interval, and at the run's end: ``steps``); call it after the step's weight update. Its path."""
        if not self.config.checkpoint_due(done, self.steps if self.steps is not None else -1):
            return None
        return await self.trainer.checkpoint(done)


_T = TypeVar("_T")


class JobReused(LifecycleError, RuntimeError):
    """A :class:`Job` entered a second time: its parts are built once and disposed of for good."""


def _as_version(text: str) -> int | None:
    """The weight version the job started from, as the number pushes must exceed (None: not a number)."""
    try:
        return int(text)
    except ValueError:
        return None


# the CLI's flags, as a Job's caller knows them: the one check of a run's settings (trainer.app.checks.check_run)
# names the flag; a Job names its argument
JOB_ARGUMENTS = {
    "config": "config",
    "--run-dir": "run_dir",
    "--hf-checkpoint": "initial_checkpoint",
    "--model": "initial_checkpoint",
    "--trainer-workers": "workers",
    "--keep-checkpoints": "keep_checkpoints",
    "--steps": "steps",
    "--seed": "seed",
    "--ray-nodes": "ray_nodes",
    "--ray-address": "ray_address",
    "--engine-lease": "engine_lease",
    "--metrics-port": "metrics_port",
    "--metrics-host": "metrics_host",
    "--launcher": "launcher",
    "--rollout-function": "rollout_fn",
    "--data-source": "data_source",
    "--engine-startup-timeout": "timeouts",
    "--engine-request-timeout": "timeouts",
    "timeouts.death": "timeouts",
}


def _job_error(exc: ConfigError) -> ConfigError:
    """``exc`` naming the Job's argument instead of the CLI's flag; a setting of the config says it came from it."""
    argument = JOB_ARGUMENTS.get(exc.flag)
    if argument is None:
        return exc if exc.source else exc.with_source("Job(config=)")
    return ConfigError(f"Job({argument}=)", exc.value, exc.problem, exc.fix, source=exc.source)


def _argument(name: str, value: object, ok: bool, expected: str, fix: str) -> None:
    if not ok:
        raise ConfigError(f"Job({name}=)", value, f"must be {expected}, not {type(value).__name__}", fix)


def _check_arguments(config: object, task: object, **given: Any) -> None:
    """A Job's arguments, checked when it is constructed -- before Ray starts or anything is written: the one check
    of a run's settings that ``lifecycle run`` runs too, plus the types only a Python caller can get wrong."""
    try:
        check_run(
            config,
            run_dir=given["run_dir"],
            initial_checkpoint=given["initial_checkpoint"],
            model_size=_model_size(given["backend"]),
            engines_given=given["engines"] is not None,
            launcher=given["launcher"],
            ray_address=given["ray_address"],
            ray_nodes=given["ray_nodes"],
            engine_lease=given["engine_lease"],
            workers=given["workers"],
            keep_checkpoints=given["keep_checkpoints"],
            steps=given["steps"],
            seed=given["seed"],
            metrics_port=given["metrics_port"],
            metrics_host=given["metrics_host"],
            rollout_fn=given["rollout_fn"],
            data_source=given["data_source"],
            timeouts=vars(given["timeouts"]) if isinstance(given["timeouts"], Timeouts) else None,
        )
    except ConfigError as exc:
        raise _job_error(exc) from None
    assert isinstance(config, LifecycleConfig)  # check_run's first check
    checked_task(task, "Job(task=)")
    _argument(
        "backend",
        given["backend"],
        given["backend"] is None or isinstance(given["backend"], BackendSpec),
        "a trainer.BackendSpec or None",
        "pass BackendSpec('mypkg.train:MyBackend', {...}), or None for the project's GRPO trainer",
    )
    _argument(
        "timeouts",
        given["timeouts"],
        given["timeouts"] is None or isinstance(given["timeouts"], Timeouts),
        "an engines.engine.Timeouts or None",
        "pass Timeouts(startup=..., request=..., death=...) (seconds), or None for the backend's",
    )
    _argument(
        "engines",
        given["engines"],
        given["engines"] is None or callable(given["engines"]),
        "callable",
        "pass a launcher factory (engine_id -> Launcher), or None",
    )
    _argument(
        "resume",
        given["resume"],
        given["resume"] is None or isinstance(given["resume"], JobCheckpoint),
        "a JobCheckpoint or None",
        "read it with trainer.load_job_checkpoint(config.load, config)",
    )
    _argument(
        "settings",
        given["settings"],
        given["settings"] is None or isinstance(given["settings"], Mapping),
        "a mapping or None",
        "pass a dict of the job's settings",
    )
    _argument(
        "router",
        given["router"],
        given["router"] is None or isinstance(given["router"], bool),
        "True, False or None",
        "pass router=False to route in-process, None where SMG is installed",
    )
    _argument(
        "vllm_python",
        given["vllm_python"],
        given["vllm_python"] is None or isinstance(given["vllm_python"], str),
        "a path (str) or None",
        "pass the vLLM environment's python, or None to find it",
    )
    _argument(
        "log",
        given["log"],
        given["log"] is None or isinstance(given["log"], EventLog),
        "an EventLog or None",
        "pass None: the job makes its own",
    )
    events = given["events"]
    _argument(
        "events",
        events,
        events is None or (isinstance(events, str | os.PathLike) and bool(str(events).strip())),
        "a file name (relative to run_dir), a path, or None",
        "pass 'events.jsonl' (the default), or None for no event log",
    )
    resume = given["resume"]
    if resume is not None and config.load is None:
        raise ConfigError(
            "Job(resume=)",
            str(resume.path),
            "is a job checkpoint, but config.load is unset: the lifecycle would start the job afresh",
            "set config.load to the directory it was read from",
        )
    if resume is not None and resume.ranks != given["workers"]:
        raise ConfigError(
            "Job(workers=)",
            given["workers"],
            f"the job checkpoint {resume.path} was written by {resume.ranks} workers (one RNG state each)",
            f"resume with workers={resume.ranks}",
        )
    if resume is None and config.load is not None:
        raise ConfigError(
            "Job(resume=)",
            None,
            f"config.load is {config.load!r}: the job continues the checkpoint there, which its trainer needs",
            "read it with trainer.load_job_checkpoint(config.load, config) and pass it as resume=",
        )


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
