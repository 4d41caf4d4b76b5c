"""``lifecycle run``: the RL training loop on Ray with the lifecycle embedded.

It plugs into the ``lifecycle`` console script through the ``rl_lifecycle.commands`` entry point.
Every check of the command line runs before the loop (torch, Ray: seconds to import) is imported,
so bad input -- an unknown fault spec, an unreachable ``--ray-address``, an unwritable ``--run-dir``
-- is one line naming the flag, exit 2, at once.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import importlib.util
import math
import os
from pathlib import Path
from typing import Any

from lifecycle.cli.args import add_config_arguments, add_debug_argument, config_from_args
from lifecycle.decide.config import LifecycleConfig
from lifecycle.decide.errors import ConfigError
from trainer.app.checks import check_async, check_engine_options, check_run, check_steps
from trainer.app.dirlock import DirLocks
from trainer.app.faults import check_faults
from trainer.app.options import CUSTOM, FLAGS, WITH_RESUME, RunOptions, add_run_arguments, default_run_dir


def register(sub: Any) -> None:
    p = sub.add_parser(
        "run",
        help="run a small RL post-training loop on Ray with the lifecycle embedded",
        description=(
            "Train a tiny policy to answer with a pattern, generating on CPU torch engines (SGLang API) and "
            "training on Ray trainer workers; every lifecycle decision is a machine move. Writes events.jsonl, "
            "metrics.jsonl, reward.png (with matplotlib) and timeline.html into the run directory."
        ),
    )
    add_run_arguments(p)  # every run option's flag, from its one declaration (trainer.app.options)
    add_debug_argument(p)
    add_config_arguments(p)
    # every option's default and spelling, so --resume can name each one that was given with it
    options = {a.dest: (a.option_strings[-1], a.default) for a in p._actions if a.option_strings}
    p.set_defaults(func=cmd_run, run_options=options)


def _check_ray_address(address: str) -> None:
    """A Ray head must answer there (bounded: a server that is not Ray hung ``ray.init`` for minutes)."""
    from engines.rayconnect import check_gcs

    check_gcs(address)


def _join_ray(address: str | None) -> None:
    """Join the cluster at ``--ray-address`` now, the last check before anything is written: a refused connection
    (no Ray there, a token the head requires) is one error naming the flag, and leaves no run directory."""
    if address:
        from engines.actor import init_local_cluster

        init_local_cluster(address=address)


def _check_run_dir(path: Path) -> None:
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / ".write-test"
        probe.write_text("")
        probe.unlink()
    except OSError as exc:
        raise ConfigError(
            "--run-dir", str(path), f"cannot write there ({exc.strerror or exc})", "pick a writable folder"
        ) from None


def _positive(flag: str, value: int) -> None:
    if value < 1:
        raise ConfigError(flag, value, "must be at least 1", f"set {flag} to a positive number")


def _check_lr(value: float) -> None:
    if not math.isfinite(value) or value <= 0:  # nan/inf/<=0 would only surface as a dead trainer actor
        raise ConfigError("--lr", value, "must be a finite number greater than 0", "use e.g. --lr 1e-2")


def _check_factory(flag: str, path: str, example: str) -> None:
    """Import ``MODULE:ATTR`` now, so a typo is a flag error before Ray starts, not a traceback mid-run."""
    module, _, attr = path.partition(":")
    fix = f"pass MODULE:ATTR of an importable factory, e.g. {example}"
    if not module or not attr:
        raise ConfigError(flag, path, "not in MODULE:ATTR form", fix)
    try:
        factory = getattr(importlib.import_module(module), attr)
    except ImportError as exc:
        raise ConfigError(flag, path, f"cannot import {module!r} ({exc})", fix) from None
    except AttributeError:
        raise ConfigError(flag, path, f"module {module!r} has no {attr!r}", fix) from None
    if not callable(factory):
        raise ConfigError(flag, path, f"{attr!r} is not callable", fix)


def _check_environment(model: str, rollout_fn: str | None, data_source: str | None) -> None:
    """What this machine must have for the run (a new run's flags, or a resumed run's run.json): checked
    before Ray starts."""
    if model != "char":
        _check_hf_installed(model)
    if rollout_fn:
        _check_factory("--rollout-function", rollout_fn, "mypkg.rollout:make_rollout_fn")
    if data_source:
        _check_factory("--data-source", data_source, "mypkg.data:make_source")


def _check_hf_installed(model: str) -> None:
    """A model that transformers builds needs the hf extra: say so before Ray starts."""
    missing = [name for name in ("transformers", "tokenizers") if importlib.util.find_spec(name) is None]
    if missing:
        raise ConfigError(
            "--model", model, f"needs {' and '.join(missing)}, not installed", "pip install 'rl-lifecycle[hf]'"
        )


def _vllm_python(config: LifecycleConfig, given: str | None) -> str | None:
    """The vLLM engine environment's python, found before anything starts, where the run launches vLLM servers
    (engines started elsewhere, or none under --debug-train-only, need none)."""
    from engines.backends import engine_backend

    find = engine_backend(config.rollout_backend).environment
    if find is None or config.debug_train_only or config.rollout_external_engine_addrs:
        return given
    return find(given)


# what may be given with --resume: everything else is the run's own (RUN_DIR/run.json); and --debug
_WITH_RESUME = WITH_RESUME | {"debug"}


def _resume(ns: argparse.Namespace, locks: DirLocks) -> int:
    """``lifecycle run --resume RUN_DIR``: the same job, from its latest checkpoint, in the same run directory."""
    spelled: dict[str, tuple[str, object]] = ns.run_options
    given = [
        flag
        for dest, (flag, default) in spelled.items()
        if dest not in _WITH_RESUME and getattr(ns, dest, default) != default
    ]
    if given:
        allowed = ", ".join(spelled[d][0] for d in sorted(_WITH_RESUME - {"resume"}) if d in spelled)
        raise ConfigError(
            "--resume",
            ns.resume,
            f"continues a run with the settings it started with, but {', '.join(given)} was given too",
            f"drop those flags (only {allowed} apply)",
        )
    from trainer.app.run_manifest import read_run_manifest

    run_dir = Path(ns.resume).resolve()
    manifest = read_run_manifest(run_dir)  # checked whole: nothing is imported, entered or written before
    custom = manifest.options.get(CUSTOM)
    if custom:
        raise ConfigError(
            "--resume",
            str(run_dir),
            f"that run was given Python objects ({', '.join(custom)}) that run.json cannot hold",
            "resume it through the API: run_loop(config, RunOptions(..., run_dir=RUN_DIR)) with load=the save dir",
        )
    try:
        config = LifecycleConfig.from_mapping({**manifest.config, "load": manifest.config["save"]})
    except ConfigError as exc:
        raise exc.with_source(str(manifest.path)) from None
    # the run's options, but for what this command line gives (the flags of this machine: WITH_RESUME)
    here = {"steps": ns.steps} if ns.steps is not None else {}
    here.update(run_dir=run_dir, ray_address=ns.ray_address, quiet=ns.quiet, metrics_port=ns.metrics_port)
    opts = RunOptions.from_manifest(manifest.options, manifest.path, metrics_host=ns.metrics_host, **here)
    _positive(FLAGS["steps"], opts.steps)
    if opts.router and importlib.util.find_spec("smg") is None:
        raise ConfigError(
            "--resume",
            str(run_dir),
            "the run routed through the SMG gateway, which is not installed here",
            "pip install 'rl-lifecycle[router]'",
        )
    from trainer.app.loop import check_run_options, run
    from trainer.job_state import LATEST, check_run_files, load_job_checkpoint

    assert config.load is not None
    opts = dataclasses.replace(opts, vllm_python=_vllm_python(config, ns.vllm_python))
    steps = opts.steps
    # the run's relative paths (--save runs/x/ckpt) mean what they meant where it started (not entered yet)
    save = manifest.cwd / config.load
    hf = None if opts.hf_checkpoint is None else manifest.cwd / opts.hf_checkpoint
    locks.take(run_dir, "--resume")  # before what a running driver writes is read: its checkpoints, its log
    locks.take(save, "--save")
    resumed = dataclasses.replace(config, save=str(save), load=str(save))
    job = {**opts.job_settings(), **({"id": manifest.job_id} if manifest.job_id else {})}
    try:
        checkpoint = load_job_checkpoint(save, config, job)  # checked whole before Ray starts
    except ConfigError as exc:
        if not (save / LATEST).is_file():
            raise ConfigError(
                "--resume",
                str(run_dir),
                f"the run stopped before it wrote its first job checkpoint into {config.load}",
                "start it again without --resume: there is nothing to continue from",
            ) from None
        raise ConfigError("--resume", exc.value, exc.problem, exc.fix) from None
    if checkpoint.step >= steps:
        if not ns.quiet:
            print(f"lifecycle run: {run_dir} is complete ({checkpoint.step} of {steps} steps); nothing to resume")
        return 0
    check_run_files(run_dir, checkpoint, config)  # the log, the metrics, the engine ledger: as they were written
    try:  # the one check of a run's settings a Job runs too; in its own run directory only
        check_run_options(resumed, opts, initial_checkpoint=hf)
    except ConfigError as exc:
        ours = exc.flag.startswith("--") and exc.flag[2:].replace("-", "_") in _WITH_RESUME
        if exc.flag == "--run-dir" or ours or exc.flag.startswith("$"):
            raise  # a flag of this command line (the run directory is --resume's), or this environment's variable
        raise exc.with_source(str(manifest.path)) from None  # the run's own setting, from its run.json
    _check_run_dir(run_dir)
    os.chdir(manifest.cwd)
    try:  # last: importing the run's rollout function runs its module's code, only once all else is checked
        _check_environment(opts.model, opts.rollout_fn, opts.data_source)
    except ConfigError as exc:
        raise exc.with_source(str(manifest.path)) from None
    opts = dataclasses.replace(opts, resume=checkpoint)
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    _join_ray(ns.ray_address)
    run(config, opts)
    return 0


def cmd_run(ns: argparse.Namespace) -> int:
    with DirLocks() as locks:  # the run's directories are this driver's until it returns, however it returns
        return _resume(ns, locks) if ns.resume is not None else _start(ns, locks)


def _start(ns: argparse.Namespace, locks: DirLocks) -> int:
    """``lifecycle run``: a new job."""
    config = config_from_args(ns)
    check_async(config, ns.async_mode)  # before the loop's imports: fails at once
    from engines.backends import engine_backend

    row = engine_backend(config.rollout_backend)
    if ns.model is None:  # vLLM serves Hugging Face checkpoints only (external ones: their own, --hf-checkpoint)
        built = row.hf_only and ns.hf_checkpoint is None and not config.rollout_external_engine_addrs
        ns.model = "tiny-llama" if built else "char"
    check_engine_options(config, ns.engines, ns.engine_startup_timeout)  # before the defaults fill them in
    if ns.engine_startup_timeout is None:
        ns.engine_startup_timeout = row.startup
    _check_lr(ns.lr)
    if config.load_debug_rollout_data is not None:
        # fail fast: the first replay file is read before Ray and the trainer start (minutes on a
        # small machine); later files are checked as each step reads them (ReplayDataError, exit 2).
        from rollout.replay import load_rollout

        load_rollout(config.load_debug_rollout_data, 0, trainable=True)
    if ns.engines is not None:
        _positive("--engines", ns.engines)
        if config.num_rollout_engines:  # servers start (0 under replay and plain train-only)
            values = {**config.to_dict(), "rollout_num_gpus": ns.engines * config.rollout_num_gpus_per_engine}
            config = LifecycleConfig.from_mapping(values)
    # before the loop's imports (torch and Ray: seconds), so a bad folder or address fails at once
    from engines.engine import Timeouts

    run_dir = Path(ns.run_dir) if ns.run_dir else default_run_dir()
    timeouts = Timeouts(startup=ns.engine_startup_timeout, request=ns.engine_request_timeout)
    opts = RunOptions.from_args(ns, run_dir=run_dir, timeouts=timeouts)
    # the one check of a run's settings a Job runs too (a run never writes over another run, another job's
    # checkpoints or its own input; the model, the engines' backend, --detach-engines, the metrics address)
    check_run(config, opts)
    opts = dataclasses.replace(opts, vllm_python=_vllm_python(config, opts.vllm_python))
    _check_environment(opts.model, opts.rollout_fn, opts.data_source)  # runs the user's modules: after the flags
    if opts.ray_address:
        _check_ray_address(opts.ray_address)
    router = opts.router is None and importlib.util.find_spec("smg") is not None  # engines.router's test
    opts = dataclasses.replace(opts, router=router)
    check_faults(
        opts.faults,
        config,
        ray_nodes=opts.ray_nodes,
        workers=opts.workers,
        launcher=opts.launcher,
        router=router,
        steps=opts.steps,
    )
    check_steps(opts.faults, opts.steps)
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    _join_ray(opts.ray_address)  # the last check: it imports Ray
    # last: they create the folders, and a refused run must leave nothing behind (a refused lock removes them)
    locks.take(run_dir, "--run-dir")
    locks.take(config.save, "--save")
    _check_run_dir(run_dir)
    if opts.hf_checkpoint is not None:
        opts = dataclasses.replace(opts, hf_checkpoint=opts.hf_checkpoint.resolve())
    # the loop's imports (torch, Ray) only once every check has passed
    from trainer.app.loop import run

    run(config, opts)
    return 0
