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
from lifecycle.decide.config import MAX_COUNT, MAX_SECONDS, Bounded, LifecycleConfig, arg_type, nonblank
from lifecycle.decide.errors import ConfigError
from lifecycle.decide.faults import FAULTS
from trainer.app.checks import (
    LAUNCHERS,
    METRICS_HOST,
    MODELS,
    check_async,
    check_engine_options,
    check_run,
    check_steps,
    parse_ray_address,
)
from trainer.app.dirlock import DirLocks
from trainer.app.faults import check_faults, fault_arg
from trainer.app.run_manifest import BOUNDS

# Each number is bounded where the command line is parsed (issue 27: a 64-bit-plus --seed crashed the trainer).
SECONDS = Bounded(0, MAX_SECONDS, kind=float)


def _parse_host(text: str) -> str:
    """``--metrics-host``: a blank one would listen on every interface (``''`` is 0.0.0.0), not what was meant."""
    if not text.strip():
        raise ConfigError(
            "--metrics-host", text, "the address is empty", "pass 127.0.0.1 (default), or 0.0.0.0 for every interface"
        )
    return text.strip()


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
    p.add_argument("--steps", type=BOUNDS["steps"], default=None, metavar="N", help="RL steps (default 30)")
    p.add_argument(
        "--resume",
        type=nonblank,
        default=None,
        metavar="RUN_DIR",
        help="continue the run in RUN_DIR (its driver died) from its latest job checkpoint, with its own settings "
        "(RUN_DIR/run.json); the run must have been started with --save DIR. Only --steps, --quiet, --ray-address "
        "and --metrics-port/--metrics-host may be given with it",
    )
    p.add_argument(
        "--engines",
        type=Bounded(1, MAX_COUNT),
        default=None,
        metavar="N",
        help="rollout engines (sets --rollout-num-gpus)",
    )
    p.add_argument(
        "--seed", type=BOUNDS["seed"], default=0, help="seed of data, sampling and initial weights (default 0)"
    )
    p.add_argument(
        "--ray-address",
        type=arg_type(parse_ray_address, "address"),
        default=None,
        metavar="ADDR",
        help="connect to this Ray cluster: HOST:PORT, ray://HOST:PORT or auto",
    )
    p.add_argument(
        "--inject",
        action="append",
        type=fault_arg,
        default=[],
        metavar="FAULT:INDEX@STEP",
        help="inject a fault at a step's start, e.g. kill-engine:1@3; FAULT is one of "
        f"{', '.join(FAULTS)} (see docs/reliability.md); "
        "with --async, step k's generation is already running, so an engine fault at step k hits generate(k+1)",
    )
    p.add_argument(
        "--ray-nodes",
        type=BOUNDS["ray_nodes"],
        default=1,
        metavar="N",
        help="start a local multi-node Ray cluster: a head plus N-1 worker nodes hosting the engines (lose-node)",
    )
    p.add_argument(
        "--run-dir", type=nonblank, default=None, metavar="DIR", help="output folder (default runs/<timestamp>)"
    )
    p.add_argument("--launcher", choices=LAUNCHERS, default="ray", help="engine processes in Ray actors")
    p.add_argument(
        "--engine-lease",
        type=float,
        default=None,
        metavar="SECONDS",
        help="with --detach-engines: how long a kept engine outlives its driver without a renewal before it exits "
        "(default 120; 20 s to 30 days: the driver renews it every third); a resume must come within it to adopt "
        "the engines",
    )
    p.add_argument(
        "--trainer-workers",
        type=BOUNDS["workers"],
        default=1,
        metavar="N",
        help="trainer workers (default 1)",
    )
    p.add_argument("--lr", type=float, default=1e-2, help="learning rate (default 1e-2)")
    p.add_argument(
        "--engine-request-timeout",
        type=SECONDS,
        default=30.0,
        metavar="S",
        help="bound on every engine HTTP request; one that runs out marks the engine Unhealthy (default 30)",
    )
    p.add_argument(
        "--engine-startup-timeout",
        type=SECONDS,
        default=None,
        metavar="S",
        help="bound on an engine's start until it generates; then start_failed (default 60; 300 with "
        "--rollout-backend vllm, whose servers take 25-60 s to start on 2 cores)",
    )
    p.add_argument(
        "--rollout-function",
        type=nonblank,
        default=None,
        metavar="MODULE:ATTR",
        help="your rollout fn factory: factory(task) -> async rollout_fn(rollout_id, controller) -> samples",
    )
    p.add_argument(
        "--data-source",
        type=nonblank,
        default=None,
        metavar="MODULE:ATTR",
        help="your prompts: factory(task) -> object with prompts(rollout_id) -> list[str] (miles' data source)",
    )
    p.add_argument(
        "--async",
        dest="async_mode",
        action="store_true",
        help="overlap the next step's generation with training (one step off-policy, miles' train_async; no offload)",
    )
    p.add_argument(
        "--keep-checkpoints",
        type=BOUNDS["keep_checkpoints"],
        default=3,
        metavar="K",
        help="weight versions kept as checkpoint directories under RUN_DIR/weights (default 3; the served one "
        "is never removed)",
    )
    p.add_argument(
        "--hf-checkpoint",
        type=nonblank,
        default=None,
        metavar="DIR",
        help="initial weights: a Hugging Face checkpoint directory (config.json + model.safetensors): the char "
        "model's (RUN_DIR/weights/step-N of an earlier run) or any local transformers causal LM with its "
        "tokenizer files (its model_type picks the family); default: the seed's weights, written as "
        "RUN_DIR/weights/step-0",
    )
    p.add_argument(
        "--model",
        choices=MODELS,
        default=None,
        help="the policy: char (default, the built-in char-level model, fastest) or tiny-llama (a tiny random-init "
        "Hugging Face LlamaForCausalLM and a BPE tokenizer trained locally, built into RUN_DIR/model and served "
        "and trained through transformers; needs pip install 'rl-lifecycle[hf]'; slower, see the README; the "
        "default with --rollout-backend vllm). --hf-checkpoint gives the model instead",
    )
    p.add_argument(
        "--vllm-python",
        metavar="PATH",
        help="--rollout-backend vllm: the python of the vLLM engine environment (default: $LIFECYCLE_VLLM_PYTHON, "
        "else .venv-vllm/bin/python, which `make engine-env` builds)",
    )
    p.add_argument(
        "--no-router",
        action="store_true",
        help="route requests in-process instead of through the SMG gateway (the default where "
        "'rl-lifecycle[router]' is installed; engines are registered only while Serving, and routable only once SMG "
        "says ready)",
    )
    p.add_argument(
        "--metrics-port",
        type=Bounded(0, 65535, why="a TCP port; 0 picks a free one"),
        default=None,
        metavar="PORT",
        help="serve Prometheus metrics of every machine at http://HOST:PORT/metrics while the run lasts (0: any free "
        "port, printed); needs pip install 'rl-lifecycle[metrics]'",
    )
    p.add_argument(
        "--metrics-host",
        type=arg_type(_parse_host, "host"),
        default=METRICS_HOST,
        metavar="HOST",
        help="address the metrics endpoint listens on (default 127.0.0.1; 0.0.0.0 exposes it to the network)",
    )
    p.add_argument("--quiet", action="store_true", help="no progress output")
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


# what may be given with --resume: everything else is the run's own (RUN_DIR/run.json)
# (and the vLLM environment's python: a path of this machine, not of the job)
_WITH_RESUME = frozenset(
    {"steps", "quiet", "ray_address", "metrics_port", "metrics_host", "resume", "debug", "vllm_python"}
)


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
    options = manifest.options
    if options.get("custom"):
        raise ConfigError(
            "--resume",
            str(run_dir),
            f"that run was given Python objects ({', '.join(options['custom'])}) that run.json cannot hold",
            "resume it through the API: run_loop(config, RunOptions(..., run_dir=RUN_DIR)) with load=the save dir",
        )
    try:
        config = LifecycleConfig.from_mapping({**manifest.config, "load": manifest.config["save"]})
        steps = ns.steps if ns.steps is not None else int(options["steps"])
    except ConfigError as exc:
        raise exc.with_source(str(manifest.path)) from None
    except (KeyError, TypeError, ValueError) as exc:
        raise ConfigError(
            "--resume", str(manifest.path), f"lacks the option steps, or it is malformed ({exc})", "pass --steps N"
        ) from None
    _positive("--steps", steps)
    if options.get("router") and importlib.util.find_spec("smg") is None:
        raise ConfigError(
            "--resume",
            str(run_dir),
            "the run routed through the SMG gateway, which is not installed here",
            "pip install 'rl-lifecycle[router]'",
        )
    from trainer.app.loop import RunOptions, check_run_options, run
    from trainer.job_state import LATEST, check_run_files, load_job_checkpoint

    assert config.load is not None
    opts = RunOptions.from_manifest(
        options,
        manifest.path,
        steps=steps,
        run_dir=run_dir,
        ray_address=ns.ray_address,
        quiet=ns.quiet,
        metrics_port=ns.metrics_port,
        metrics_host=ns.metrics_host,
        vllm_python=_vllm_python(config, ns.vllm_python),
    )
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
        _check_environment(str(options["model"]), options["rollout_fn"], options["data_source"])
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
    if ns.steps is None:
        ns.steps = 30
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
    from trainer.app.run_manifest import default_run_dir

    run_dir = Path(ns.run_dir) if ns.run_dir else default_run_dir()
    # the one check of a run's settings a Job runs too (a run never writes over another run, another job's
    # checkpoints or its own input; the model, the engines' backend, --detach-engines, the metrics address)
    check_run(
        config,
        run_dir=run_dir,
        initial_checkpoint=ns.hf_checkpoint,
        model=ns.model,
        launcher=ns.launcher,
        ray_address=ns.ray_address,
        ray_nodes=ns.ray_nodes,
        engine_lease=ns.engine_lease,
        workers=ns.trainer_workers,
        keep_checkpoints=ns.keep_checkpoints,
        steps=ns.steps,
        seed=ns.seed,
        metrics_port=ns.metrics_port,
        metrics_host=ns.metrics_host,
        rollout_fn=ns.rollout_function,
        data_source=ns.data_source,
        timeouts={"startup": ns.engine_startup_timeout, "request": ns.engine_request_timeout},
        vllm_python=ns.vllm_python,
        router=False if ns.no_router else None,
    )
    ns.vllm_python = _vllm_python(config, ns.vllm_python)
    _check_environment(ns.model, ns.rollout_function, ns.data_source)  # runs the user's modules: after the flags
    if ns.ray_address:
        _check_ray_address(ns.ray_address)
    faults = tuple(ns.inject)  # parsed by --inject's type
    router = not ns.no_router and importlib.util.find_spec("smg") is not None  # engines.router's test
    check_faults(
        faults,
        config,
        ray_nodes=ns.ray_nodes,
        workers=ns.trainer_workers,
        launcher=ns.launcher,
        router=router,
        steps=ns.steps,
    )
    check_steps(faults, ns.steps)
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    _join_ray(ns.ray_address)  # the last check: it imports Ray
    # last: they create the folders, and a refused run must leave nothing behind (a refused lock removes them)
    locks.take(run_dir, "--run-dir")
    locks.take(config.save, "--save")
    _check_run_dir(run_dir)
    # the loop's imports (torch, Ray) only once every check has passed
    from engines.engine import Timeouts
    from trainer.app.loop import RunOptions, run

    opts = RunOptions(
        steps=ns.steps,
        seed=ns.seed,
        run_dir=run_dir,
        ray_address=ns.ray_address,
        faults=faults,
        ray_nodes=ns.ray_nodes,
        launcher=ns.launcher,
        workers=ns.trainer_workers,
        lr=ns.lr,
        rollout_fn=ns.rollout_function,
        data_source=ns.data_source,
        quiet=ns.quiet,
        async_mode=ns.async_mode,
        keep_checkpoints=ns.keep_checkpoints,
        model=ns.model,
        router=router,
        hf_checkpoint=Path(ns.hf_checkpoint).resolve() if ns.hf_checkpoint else None,
        timeouts=Timeouts(startup=ns.engine_startup_timeout, request=ns.engine_request_timeout),
        metrics_port=ns.metrics_port,
        metrics_host=ns.metrics_host,
        vllm_python=ns.vllm_python,
        engine_lease=ns.engine_lease,
    )
    run(config, opts)
    return 0
