"""The RL training loop that embeds the lifecycle (``lifecycle run``): the miles order per step.

Per step: generate -> offload rollout -> train -> onload rollout weights -> update weights ->
onload KV. The async variant (``--async``, miles' train_async) overlaps generate(k+1) with
train(k) -- one step off-policy -- and waits for that generation to end before the weight update
(the rollout machine allows ``begin_update`` only from ``Ready``); it never offloads. Every
decision about what to construct, start, monitor, offload or recover is taken by the machines
(each call below is a machine move that its predicates may block). The run's parts and their
disposal are a :class:`trainer.app.job.Job`'s, as for any embedding loop; what is this loop's own
is below: the files, the progress line, fault injection, resuming. Writes, into the run
directory: ``events.jsonl`` (the event log of every machine), ``metrics.jsonl`` (one line per
step), ``run.json`` (the settings ``--resume`` starts the job again with) and ``reward.png`` when
matplotlib is installed; with ``--save``, job checkpoints after every ``--save-interval`` steps.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import sys
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from engines.backends import engine_backend
from engines.backends import engine_command as job_engine_command
from engines.rayconnect import check_gcs
from engines.vllm.launcher import TINY_LLAMA
from lifecycle.decide.config import LifecycleConfig
from lifecycle.decide.errors import ConfigError
from lifecycle.decide.events import RESUMED, bind_context, cut_torn_tail
from lifecycle.observe.timeline_page import write_timeline
from rollout.executor import EvalResult, RolloutManager
from rollout.pattern import PatternTask
from rollout.sample import Sample
from rollout.task import checked_task
from trainer.app.checks import check_async, check_run
from trainer.app.dirlock import hold_run
from trainer.app.faults import FaultInjector
from trainer.app.job import Job, default_timeouts
from trainer.app.job import initial_weights as initial_weights  # re-exported: tests/model_based start from it
from trainer.app.options import API_NAMES
from trainer.app.options import RunOptions as RunOptions  # re-exported: run_loop's argument
from trainer.app.run_manifest import write_run_manifest
from trainer.grpo import default_use_tis, grpo_backend
from trainer.job_state import check_run_files, continue_metrics, load_job_checkpoint

if TYPE_CHECKING:  # the group imports Ray; the loop imports it only when it runs (tests use Progress without Ray)
    from trainer.group import TrainerGroup

Recorder = Callable[[int, list[Sample], dict[str, Any], float], None]  # one step's row: step, samples, stats, start

SHORT = {
    "Serving": "S",
    "Quiesced": "Q",
    "Paused": "p",
    "UpdatingInFlight": "u",
    "PendingWeights": "P",
    "Unhealthy": "U",
    "Recovering": "R",
    "Failed": "F",
    "Offloaded": "O",
    "WeightsOnly": "W",
    "Disposed": "D",
    "Stopped": "X",
    "Joining": "J",
    "Draining": "d",
    "Retiring": "r",
    "Retired": ".",  # a vacant slot of an elastic fleet, as one never started
    "Init": ".",
}


@dataclass
class RunResult:
    run_dir: Path
    rewards: list[float]
    seconds: float
    metrics: list[dict[str, Any]]

    @property
    def first5(self) -> float:
        head = self.rewards[:5]
        return sum(head) / max(len(head), 1)

    @property
    def last5(self) -> float:
        tail = self.rewards[-5:]
        return sum(tail) / max(len(tail), 1)


def _states(manager: RolloutManager) -> str:
    states = manager.controller.states()
    if not states:
        return manager.state
    return " ".join(SHORT.get(s, s) for s in states.values())


def _plot(path: Path, rewards: list[float]) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot(range(len(rewards)), rewards, marker="o", ms=3)
    ax.set_xlabel("step")
    ax.set_ylabel("mean reward")
    ax.set_ylim(0, 1)
    ax.set_title("lifecycle run: reward")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return True


class Progress:
    """Step i/N, a bar, reward, engine states, elapsed/ETA: one line redrawn with ``\\r`` on a TTY,
    one line per step otherwise (logs and pipes keep every step)."""

    WIDTH = 20

    def __init__(self, total: int, out: TextIO, *, quiet: bool = False, tty: bool | None = None, done: int = 0) -> None:
        self.total = total
        self.first = done  # a resumed run's ETA counts only the steps this driver ran
        self.out = out
        self.quiet = quiet
        self.tty = out.isatty() if tty is None else tty
        self.t0 = time.monotonic()
        self._drawn = 0  # length of the line on screen (TTY mode)

    def step(self, step: int, reward: float, loss: float, engines: str, seconds: float, example: str) -> None:
        if self.quiet:
            return
        done = step + 1
        if not self.tty:
            line = (
                f"  step {done:>3}/{self.total}  reward {reward:.3f}  loss {loss:+.3f}  "
                f"engines [{engines}]  {seconds:.1f}s  e.g. {example!r}"
            )
            print(line, file=self.out, flush=True)
            return
        elapsed = time.monotonic() - self.t0
        eta = elapsed / max(done - self.first, 1) * (self.total - done)
        filled = round(self.WIDTH * done / self.total)
        bar = "#" * filled + "-" * (self.WIDTH - filled)
        line = (
            f"  step {done:>3}/{self.total} [{bar}] reward {reward:.3f}  engines [{engines}]  "
            f"{elapsed:.0f}s elapsed, ETA {eta:.0f}s"
        )
        pad = " " * max(self._drawn - len(line), 0)  # erase what a longer previous line left behind
        self._drawn = len(line)
        self.out.write("\r" + line + pad)
        self.out.flush()

    def close(self) -> None:
        """End the redrawn line so the next output starts on its own line."""
        if self.tty and self._drawn and not self.quiet:
            self.out.write("\n")
            self.out.flush()
        self._drawn = 0


async def run_loop(config: LifecycleConfig, opts: RunOptions, out: TextIO = sys.stdout) -> RunResult:
    """The loop (sync, or async with ``opts.async_mode``). Starts Ray (or connects to ``ray_address``).

    The run's parts are a :class:`~trainer.app.job.Job`'s; what is this app's own are its files (run.json,
    metrics.jsonl, the timeline), the progress line, fault injection and resuming.
    """
    check_options(config, opts)
    # one driver at a time writes the run and its --save directory (lifecycle run holds them already: reentrant)
    with hold_run(opts.run_dir, config.save, run_flag="RunOptions.run_dir", save_flag="config.save"):
        return await _run_held(config, opts, out)


async def _run_held(config: LifecycleConfig, opts: RunOptions, out: TextIO) -> RunResult:
    def say(line: str) -> None:
        if not opts.quiet:
            print(line, file=out, flush=True)

    run_dir = opts.run_dir
    run_dir.mkdir(parents=True, exist_ok=True)
    resume = opts.resume
    if resume is None and config.load is not None:  # API callers: read and check it before anything starts
        resume = load_job_checkpoint(config.load, config, opts.job_settings())
    if resume is not None:  # what the run directory holds besides the checkpoint, before anything is written
        check_run_files(run_dir, resume, config, flag="RunOptions.resume" if opts.resume is not None else "--load")
    start = resume.step if resume is not None else 0
    # a resumed (or --load) job keeps its identity, which each of its checkpoints records
    job_id = resume.job_id if resume is not None and resume.job_id else uuid.uuid4().hex
    # the job's own settings (a resume's --load is where it came from, not part of the job), its steps the latest
    if opts.timeouts is None:  # the backend's bounds, written down so a resume starts its engines as patiently
        opts = dataclasses.replace(opts, timeouts=default_timeouts(config))
    manifest = opts.manifest()  # written once the Job has checked the run directory (below)
    events_path = run_dir / "events.jsonl"
    # what the job's checkpoints belong to: the options as given (a --model tiny-llama run builds its initial
    # checkpoint below, in the run directory: a path of this run, not a setting -- a resume builds it again)
    job_opts = dataclasses.replace(opts, resume=resume, job_id=job_id, events=events_path.name)
    if opts.model == "tiny-llama":  # a real Hugging Face model, built here (no hub): the run's initial checkpoint
        from engines.models import build_tiny_llama

        # the backend's own sizes (vLLM's CPU attention needs a head_dim of at least 32: its tiny Llama has 2 of 64)
        sizes = engine_backend(config.rollout_backend).tiny_llama
        built = await asyncio.to_thread(build_tiny_llama, run_dir / "model", seed=opts.seed, **sizes)
        opts = dataclasses.replace(opts, hf_checkpoint=built.resolve())
    task = checked_task(opts.task or PatternTask(seed=opts.seed), "RunOptions.task")
    checkpoint = None if opts.hf_checkpoint is None else str(opts.hf_checkpoint)
    backend = opts.backend or grpo_backend(
        model_size=opts.model_size,
        seed=opts.seed,
        lr=opts.lr,
        temperature=task.temperature,
        checkpoint=checkpoint,
        use_tis=default_use_tis(config) if opts.use_tis is None else opts.use_tis,
        tis_clip=opts.tis_clip,
        tis_clip_low=opts.tis_clip_low,
    )
    torn = cut_torn_tail(events_path) if resume is not None else b""  # the dead driver's unended last line
    job = Job(
        config,
        task,
        run_dir=run_dir,
        backend=backend,
        initial_checkpoint=opts.hf_checkpoint,
        engines=opts.engine_launcher,  # None: the Job launches the config's --rollout-backend
        options=job_opts,
    )
    write_run_manifest(run_dir, dataclasses.replace(config, load=None), manifest, job_id=job_id)
    metrics_path = run_dir / "metrics.jsonl"
    metrics: list[dict[str, Any]] = []
    if resume is None:
        metrics_path.write_text("")
    else:  # the log continues in the same file: the checkpoint's step, and what the dead driver did after it
        metrics, discarded = continue_metrics(metrics_path, start)
        job.log.emit(
            RESUMED,
            resume_at=start,
            weight_version=resume.weight_version,
            checkpoint=str(resume.path),
            discarded_steps=discarded,
            torn_bytes=len(torn),
        )
    rewards: list[float] = [float(row["reward"]) for row in metrics]
    t0 = time.monotonic()
    progress = Progress(opts.steps, out, quiet=opts.quiet, done=start)
    # one per run: a preemption's deadline outlives the step it was injected at
    injector = FaultInjector(opts.faults, notice=opts.preempt_notice)

    def record(step: int, samples: list[Sample], stats: dict[str, Any], ts: float) -> None:
        """One step's metrics row (metrics.jsonl) and its progress line."""
        reward = sum(float(s["reward"]) for s in samples) / len(samples)
        rewards.append(reward)
        seconds = round(time.monotonic() - ts, 3)
        row = {
            "step": step,
            "reward": round(reward, 6),
            "samples": len(samples),
            **{k: round(v, 6) if isinstance(v, float) else v for k, v in stats.items()},
            "engines": job.manager.controller.states(),
            "seconds": seconds,
        }
        metrics.append(row)
        with metrics_path.open("a") as f:
            f.write(json.dumps(row) + "\n")
        example = samples[0]["response"] if samples else ""
        progress.step(step, reward, stats.get("loss", 0.0), _states(job.manager), seconds, example)
        if config.ci_test:  # --ci-test: a broken invariant ends the run at the step that showed it
            job.monitor.raise_if_violated()

    mode = f"{config.mode}, async" if opts.async_mode else config.mode
    say(f"lifecycle run: {opts.steps} steps, mode {mode}, run dir {run_dir}")
    if resume is not None:
        say(f"  resumed at step {start} from {resume.path} (weights v{resume.weight_version})")
    try:
        async with job:  # built, started; disposed of on the way out, whatever happens
            try:
                if job.exporter is not None:
                    say(f"  prometheus: {job.exporter.url}")
                ready = f"rollout {job.manager.state}, engines [{_states(job.manager)}]"
                say(f"  ready in {time.monotonic() - t0:.1f}s: {ready}")
                progress.t0 = time.monotonic()
                if opts.async_mode:
                    await _async_steps(opts, job, record, injector)
                elif job.streams:
                    await _stream_steps(opts, job, start, record, injector)
                else:
                    await _sync_steps(opts, job, start, record, injector)
            finally:
                progress.close()
                await injector.aclose()  # a preemption's deadline still ahead: the job's disposal stops its engine
    finally:
        # also (best effort) when the run failed: the timeline is where a person looks first then
        timeline = _timeline(events_path, run_dir, opts, failing=sys.exc_info()[0] is not None)
    seconds = time.monotonic() - t0
    result = RunResult(run_dir, rewards, seconds, metrics)
    png = run_dir / "reward.png"
    plotted = _plot(png, rewards)
    say(
        f"done in {seconds:.1f}s: reward first-5 mean {result.first5:.3f} -> last-5 mean {result.last5:.3f}"
        f" ({result.last5 / max(result.first5, 1e-9):.1f}x)"
    )
    say(f"  events:  {run_dir / 'events.jsonl'}")
    say(f"  metrics: {metrics_path}")
    say(f"  plot:    {png}" if plotted else "  plot:    (pip install matplotlib for reward.png)")
    if timeline is not None:
        say(f"  timeline: {timeline}")
    return result


async def _sync_steps(opts: RunOptions, job: Job, start: int, record: Recorder, injector: FaultInjector) -> None:
    """miles' train: per step generate -> offload -> train -> onload weights -> update -> onload KV; a job
    checkpoint after the step's row is written (a driver dying between the two redoes the step, never skips it)."""
    interval = job.config.eval_interval
    for step in range(start, opts.steps):
        ts = time.monotonic()
        with bind_context(step=step, rollout_id=step):
            await _scale_due(opts, step, job)
            await _inject_due(injector, step, job.manager, job.trainer)
            evals: dict[str, Any] = {}  # this step's eval reward, or why it was skipped
            if interval is not None and step == 0:  # miles: eval before the first rollout
                _add_eval(evals, await job.eval(step))
            samples = await job.generate(step)
            stats = await job.train(samples)
            await job.update_weights(step + 1)
            if interval is not None and (step + 1) % interval == 0:
                _add_eval(evals, await job.eval(step))  # on the weights just pushed
        record(step, samples, {**stats, **evals}, ts)
        with bind_context(step=step, rollout_id=step):
            await job.checkpoint(step + 1)


async def _stream_steps(opts: RunOptions, job: Job, start: int, record: Recorder, injector: FaultInjector) -> None:
    """--fully-async: the stream generates throughout; per step the trainer takes a batch within the staleness
    bound (older groups are dropped and their prompts sent again) and pushes its weights while requests are in
    flight; a job checkpoint after the step's row, as in the sync loop (it records the stream's queue)."""
    interval = job.config.eval_interval
    evals: dict[str, Any] = {}
    if interval is not None and start == 0:
        with bind_context(step=0, rollout_id=0):
            _add_eval(evals, await job.eval(0))  # miles: eval before the first rollout
    async with job.streaming():
        for step in range(start, opts.steps):
            ts = time.monotonic()
            with bind_context(step=step, rollout_id=step):
                await _scale_due(opts, step, job)
                await _inject_due(injector, step, job.manager, job.trainer)
                taken = await job.take()
                await job.update_weights(step + 1, onload=False)
                if interval is not None and (step + 1) % interval == 0:
                    _add_eval(evals, await job.eval(step))  # the stream stops for it, and goes on
            lag = taken.staleness
            stats = {
                **taken.stats,
                **evals,
                "version": taken.version,
                "staleness": lag,
                "staleness_max": max(lag),
                "dropped": len(taken.dropped),
            }
            record(step, taken.samples, stats, ts)
            evals = {}
            with bind_context(step=step, rollout_id=step):
                await job.checkpoint(step + 1)


def _timeline(events: Path, run_dir: Path, opts: RunOptions, *, failing: bool) -> Path | None:
    """RUN_DIR/timeline.html; while a failure propagates, a timeline that cannot be drawn must not hide it."""
    if not opts.timeline:
        return None
    try:
        return write_timeline(events, run_dir / "timeline.html")
    except (OSError, ValueError):
        if failing:
            return None
        raise


def check_options(config: LifecycleConfig, opts: RunOptions) -> None:
    """Refuse combinations the machines cannot honour, before anything starts (API callers too)."""
    check_async(config, opts.async_mode)
    if opts.resume is not None and config.load is None:
        raise ConfigError(
            "RunOptions.resume",
            str(opts.resume.path),
            "is a job checkpoint, but config.load is unset: the lifecycle would start the job afresh",
            "set config.load to the directory it came from (or pass no resume: the loop reads config.load)",
        )
    check_run_options(config, opts, names=API_NAMES)
    if opts.ray_address:
        check_gcs(opts.ray_address, "RunOptions.ray_address")


def check_run_options(
    config: LifecycleConfig,
    opts: RunOptions,
    *,
    names: Mapping[str, str] | None = None,
    initial_checkpoint: Path | None = None,
) -> None:
    """:func:`~trainer.app.checks.check_run` over a run's options (the API's, or a resume's from its run.json);
    ``names``: how the caller spells the options (default the command line's flags); ``initial_checkpoint``: the
    options' own, unless given (a resume's, relative to where the run started)."""
    checked = opts if initial_checkpoint is None else dataclasses.replace(opts, hf_checkpoint=initial_checkpoint)
    engines_given = opts.engine_launcher is not None
    check_run(config, checked, engines_given=engines_given, **({} if names is None else {"names": names}))


def engine_command(opts: RunOptions) -> Callable[[], list[str]]:
    """The engines' command line: the project's CPU torch engine on the run's seed and initial checkpoint."""
    return job_engine_command(opts.seed, opts.hf_checkpoint)


# the tiny Llama vLLM can serve (its CPU attention refuses head_dim 16, today's default)
VLLM_TINY_LLAMA = TINY_LLAMA  # the scripts and tests build vLLM's model with it


def _start_generate(manager: RolloutManager, step: int) -> asyncio.Task[list[Sample]]:
    """generate(step) as a task; its events carry step/rollout_id (the task copies the context)."""
    with bind_context(step=step, rollout_id=step):
        return asyncio.create_task(manager.generate(step), name=f"generate-{step}")


async def _await_generation(pending: asyncio.Task[list[Sample]] | None) -> None:
    """The weight update must not start while generate runs: wait for it (its errors surface later)."""
    if pending is not None:
        await asyncio.wait([pending])


async def _async_steps(opts: RunOptions, job: Job, record: Recorder, injector: FaultInjector) -> None:
    """miles' train_async: generate(k+1) runs while train(k) does; both end before update_weights.

    Evals (``--eval-interval``) run as in the sync loop -- before the first rollout and after every
    K-th weight update -- at moments when no generation is in flight (the rollout manager is Ready).
    The engines never idle, so nothing is offloaded or onloaded.
    """
    manager = job.manager
    interval = job.config.eval_interval
    evals: dict[str, Any] = {}
    if interval is not None:
        with bind_context(step=0, rollout_id=0):
            _add_eval(evals, await job.eval(0))  # miles: eval before the first rollout
    pending: asyncio.Task[list[Sample]] | None = _start_generate(manager, 0)
    try:
        for step in range(opts.steps):
            ts = time.monotonic()
            with bind_context(step=step, rollout_id=step):
                assert pending is not None
                samples = await pending  # generated during the previous step's training (weights k-1)
                pending = None
                await _scale_due(opts, step, job)
                await _inject_due(injector, step, manager, job.trainer)
                if step + 1 < opts.steps:
                    pending = _start_generate(manager, step + 1)
                    await asyncio.sleep(0)  # let generate(k+1) enter Generating before training starts
                stats = await job.train(samples, offload=False)
                await _await_generation(pending)  # the core refuses a weight update while generate runs
                await job.update_weights(step + 1, onload=False)
                if interval is not None and (step + 1) % interval == 0:
                    _add_eval(evals, await job.eval(step))  # generate(k+1) has ended: the manager is Ready
            record(step, samples, {**stats, **evals}, ts)
            evals = {}
    finally:
        if pending is not None and not pending.done():
            pending.cancel()
            await asyncio.gather(pending, return_exceptions=True)


def _add_eval(evals: dict[str, Any], result: EvalResult) -> None:
    """One eval into this step's metrics row: ``eval_reward``, or ``eval_skipped`` with the reason.

    A step with two evals (step 0 with ``--eval-interval 1``: before the first rollout and after
    the first update) keeps the first one's field as ``eval_reward_initial`` / ``eval_skipped_initial``;
    the unsuffixed fields always describe the step's last eval, never a mix of the two.
    """
    for key in ("eval_reward", "eval_skipped"):
        if key in evals:
            evals[f"{key}_initial"] = evals.pop(key)
    if result.reward is None:
        evals["eval_skipped"] = result.skipped or "no_reward"
    else:
        evals["eval_reward"] = result.reward


async def _scale_due(opts: RunOptions, step: int, job: Job) -> None:
    """The fleet's size from this step on (``--scale-rollout N@STEP``), before the step's faults: the job's
    ``scale_rollout``, which returns once joiners hold the committed weights and leavers are out of the gateway."""
    for scale in opts.scale:
        if scale.step == step:
            await job.scale_rollout(scale.engines)


async def _inject_due(injector: FaultInjector, step: int, manager: RolloutManager, trainer: TrainerGroup) -> None:
    """The faults scheduled for this step's start (``--inject``); each logs a ``fault.injected`` event."""
    for fault in injector.faults:
        if fault.step == step:
            await injector.inject(fault, manager.controller, trainer)


def run(config: LifecycleConfig, opts: RunOptions, out: TextIO = sys.stdout) -> RunResult:
    return asyncio.run(run_loop(config, opts, out))
