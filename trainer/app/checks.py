"""Checks of ``lifecycle run``'s own options that need no runtime, shared by the CLI and ``run_loop``.

Light on purpose (no torch, Ray or HTTP imports): the CLI runs them before the loop is imported, so
a bad combination fails at once instead of after seconds of imports and a Ray start.
"""

from __future__ import annotations

import errno
import glob
import importlib.util
import math
import os
import socket
from collections.abc import Mapping, Sequence
from pathlib import Path

from engines.apikey import given_api_key
from lifecycle.decide.backends import capabilities
from lifecycle.decide.config import MAX_SECONDS, Bounded, LifecycleConfig
from lifecycle.decide.errors import ConfigError
from lifecycle.decide.faults import NOTICE_FAULTS
from lifecycle.decide.jsonio import JSONFileError, read_json
from lifecycle.decide.predicates import elastic, offloads_rollout, replay
from trainer.app.faults import Fault
from trainer.app.fleet import Scale
from trainer.app.options import (
    API_NAMES,
    BOUNDS,
    BY_NAME,
    FLAGS,
    LAUNCHERS,
    METRICS_HOST,
    MODELS,
    TIMEOUT_FLAGS,
    RunOptions,
    check_lease,
    notice_problem,
    parse_ray_address,
)
from trainer.app.run_manifest import check_new_run
from trainer.grpo import TIS_CLIP, TIS_CLIP_LOW, tis_problem


def check_async(config: LifecycleConfig, async_mode: bool) -> None:
    """--async overlaps generate(k+1) with train(k): the engines are never idle, so nothing can offload them."""
    if async_mode and config.fully_async:
        raise ConfigError(
            "--async",
            True,
            "--fully-async streams already: generation never stops, so there is no next step to overlap",
            "drop --async",
        )
    if async_mode and offloads_rollout(config):
        raise ConfigError(
            "--async",
            True,
            "the async loop generates step k+1 while training step k, so the rollout engines are never idle "
            "and cannot be offloaded (offload is allowed only from Ready)",
            "drop --offload-rollout/--offload/--colocate, or run without --async",
        )
    if async_mode and config.save is not None:
        raise ConfigError(
            "--save",
            config.save,
            "a job checkpoint of the async loop would have to hold the next step's generation, which is in "
            "flight while the step ends; job checkpoints are written by the sync loop only",
            "run without --async to checkpoint, or drop --save",
        )


def check_steps(faults: Sequence[Fault], steps: int) -> None:
    """A fault scheduled after the last step would never be injected: say so instead of running without it."""
    for fault in faults:
        if fault.step >= steps:
            raise ConfigError(
                "--inject",
                str(fault),
                f"step {fault.step} is past the run (--steps {steps} runs steps 0 to {steps - 1})",
                f"inject at a step below {steps}, or raise --steps above {fault.step}",
            )


def fleet_bounds(config: LifecycleConfig) -> tuple[int, int] | None:
    """An elastic fleet's bounds in engines (fewest, most), or None where the fleet has a fixed size."""
    if not elastic(config):
        return None
    return config.min_rollout_engines, config.max_rollout_engines


_BOUNDS_FIX = (
    "give the fleet bounds: --rollout-min-num-gpus and --rollout-max-num-gpus (e.g. 1 and 4 with --rollout-num-gpus 2)"
)


def require_elastic(config: LifecycleConfig, name: str, value: object) -> tuple[int, int]:
    """The elastic fleet's bounds in engines; a fleet of fixed size is one ConfigError naming ``name`` (what asked to
    scale it) and the two flags that make it elastic."""
    bounds = fleet_bounds(config)
    if bounds is None:
        raise ConfigError(
            name,
            value,
            f"the rollout fleet has a fixed size ({config.num_rollout_engines} engines, --rollout-num-gpus): no "
            "bounds were given, so no engine joins or leaves",
            _BOUNDS_FIX,
        )
    return bounds


def check_target(config: LifecycleConfig, engines: object, name: str, value: object = None) -> int:
    """``engines``, a fleet size a caller asks for, within the elastic fleet's bounds: one ConfigError naming ``name``
    (``--scale-rollout``, ``Job.scale_rollout(n=)``) and the bound; ``value``: what the caller wrote, if not that."""
    shown = engines if value is None else value
    bounds = require_elastic(config, name, shown)
    if isinstance(engines, bool) or not isinstance(engines, int):
        why = f"must be a number of engines (an int), not {type(engines).__name__}"
        raise ConfigError(name, shown, why, "pass e.g. 2")
    lo, hi = bounds
    if not lo <= engines <= hi:
        per = config.rollout_num_gpus_per_engine
        raise ConfigError(
            name,
            shown,
            f"{engines} engines is outside the fleet's bounds, {lo}..{hi} engines (--rollout-min-num-gpus "
            f"{lo * per} .. --rollout-max-num-gpus {hi * per}, {per} GPU(s) per engine)",
            f"ask for {lo}..{hi} engines, or widen --rollout-min-num-gpus / --rollout-max-num-gpus",
        )
    return engines


def check_fleet(config: LifecycleConfig, options: RunOptions, names: Mapping[str, str] = FLAGS) -> None:
    """The run's fleet options: each --scale-rollout within the bounds, at a step the run has, one per step; a
    preemption with notice only where an elastic fleet acts on it; --preempt-notice only with such a fault."""
    scale, steps, notice = options.scale, options.steps, options.preempt_notice
    if not isinstance(scale, tuple) or not all(isinstance(s, Scale) for s in scale):
        raise ConfigError(
            FLAGS["scale"], scale, "must be a tuple of trainer.app.fleet.Scale", "pass e.g. (Scale(engines=4, step=3),)"
        )
    problem = notice_problem(notice)
    if problem is not None:
        raise ConfigError(FLAGS["preempt_notice"], notice, problem, f"pass e.g. {FLAGS['preempt_notice']} 30")
    at: dict[int, Scale] = {}
    for s in scale:
        check_target(config, s.engines, names["scale"], str(s))
        if s.step >= steps:
            raise ConfigError(
                names["scale"],
                str(s),
                f"step {s.step} is past the run ({names['steps']} {steps} runs steps 0 to {steps - 1})",
                f"scale at a step below {steps}, or raise {names['steps']} above {s.step}",
            )
        if s.step in at:
            raise ConfigError(
                names["scale"],
                str(s),
                f"step {s.step} is scaled twice ({at[s.step]} and {s}): a step starts with one target",
                "give one N@STEP per step",
            )
        at[s.step] = s
    notices = [f for f in options.faults if isinstance(f, Fault) and f.kind in NOTICE_FAULTS]
    if notices and fleet_bounds(config) is None:
        raise ConfigError(
            "--inject",
            str(notices[0]),
            "a preemption with notice is acted on only by an elastic fleet (it drains the engine and replaces it); "
            "this fleet has a fixed size",
            _BOUNDS_FIX,
        )
    if notice != BY_NAME["preempt_notice"].default and not notices:
        raise ConfigError(
            names["preempt_notice"],
            notice,
            f"has no effect: no preemption is injected ({', '.join(NOTICE_FAULTS)})",
            f"drop {names['preempt_notice']}, or --inject preempt-engine:INDEX@STEP",
        )


def check_hf_checkpoint(path: str | Path, model_size: str = "tiny") -> None:
    """``--hf-checkpoint``: read the directory whole now (config, tokenizer, every tensor's name and shape), so a
    wrong one is a flag error before Ray starts, not a worker that fails to load it. Either family: a char
    checkpoint must be of ``model_size``; any other ``model_type`` is built by transformers. Imports torch, lazily."""
    from engines.models import is_char_checkpoint, load_causal_lm
    from engines.models.checkpoint import read_checkpoint
    from engines.models.tiny import MODEL_TYPE, TinyCausalLM
    from engines.models.weights import WeightsFileError

    try:
        if is_char_checkpoint(path):
            read_checkpoint(path, TinyCausalLM(model_size).expected_tensors(), model_type=MODEL_TYPE)
        else:
            load_causal_lm(path)
    except WeightsFileError as exc:
        raise ConfigError(
            "--hf-checkpoint",
            str(path),
            str(exc),
            f"pass a checkpoint directory: RUN_DIR/weights/step-N of an earlier run, a char model's of size "
            f"{model_size!r} (TinyCausalLM.save_pretrained), or a local Hugging Face causal LM (config.json, "
            "model.safetensors, tokenizer files; e.g. models.build_tiny_llama)",
        ) from None


def check_backend_model(config: LifecycleConfig, model: str, hf_checkpoint: str | Path | None) -> None:
    """vLLM serves Hugging Face checkpoints: the project's char model is refused before anything starts; and
    external vLLM servers serve their own, which the trainer must start from (--hf-checkpoint)."""
    from engines.backends import engine_backend  # the HTTP clients: not imported by `lifecycle --help`

    hf_only = engine_backend(config.rollout_backend).hf_only
    if hf_only and config.rollout_external_engine_addrs and hf_checkpoint is None:
        label = capabilities(config.rollout_backend, config.rollout_device).label
        raise ConfigError(
            "--hf-checkpoint",
            None,
            f"the external {label} servers serve the checkpoint they were started on; the trainer must start from it",
            "pass --hf-checkpoint DIR (the directory the servers serve)",
        )
    if hf_only and model == "char" and hf_checkpoint is None and not config.debug_train_only:
        raise ConfigError(
            "--model",
            model,
            f"--rollout-backend {config.rollout_backend} serves Hugging Face checkpoints, not the project's char model",
            f"use --model tiny-llama (the default with --rollout-backend {config.rollout_backend}), or "
            "--hf-checkpoint DIR",
        )
    check_rollout_model(config, hf_checkpoint)


def check_rollout_model(config: LifecycleConfig, hf_checkpoint: str | Path | None) -> None:
    """A checkpoint the rollout backend cannot run is refused before any launch: its servers would start, pass
    /health and die at the first generation (vLLM's CPU attention and ``head_dim`` < 32). Read from config.json
    (``head_dim``, else ``hidden_size / num_attention_heads``); one that cannot be read is check_hf_checkpoint's."""
    least = capabilities(config.rollout_backend, config.rollout_device).min_head_dim
    if hf_checkpoint is None or not least or config.debug_train_only:
        return
    try:  # the bounded reader (a FIFO or a device is refused, not waited on); what it refuses is check_hf_checkpoint's
        model_config = read_json(Path(hf_checkpoint) / "config.json", max_bytes=1 << 20)
        head_dim = model_config.get("head_dim") or model_config["hidden_size"] // model_config["num_attention_heads"]
        head_dim = int(head_dim)
    except (JSONFileError, ValueError, TypeError, KeyError, AttributeError, ZeroDivisionError):
        return
    if head_dim < least:
        raise ConfigError(
            "--hf-checkpoint",
            str(hf_checkpoint),
            f"its attention heads have head_dim {head_dim} (config.json), and --rollout-backend "
            f"{config.rollout_backend} on --rollout-device {config.rollout_device} runs head_dim {least} or more "
            "(its engine would start, then die at the first generation)",
            f"use a checkpoint with head_dim >= {least} (e.g. hidden_size / num_attention_heads = 64), or "
            "--rollout-backend sglang",
        )


def check_model(model: str, hf_checkpoint: str | Path | None) -> None:
    """``--model``: the built-in char model, or ``tiny-llama`` (built into RUN_DIR/model); ``--hf-checkpoint``
    already says which model, so the two together are refused rather than one silently winning."""
    if model not in MODELS:
        raise ConfigError("--model", model, f"unknown model (known: {', '.join(MODELS)})", "use --model char")
    if model != "char" and hf_checkpoint is not None:
        raise ConfigError(
            "--model",
            model,
            "--hf-checkpoint gives the model already (its config.json's model_type)",
            f"drop --model {model}, or drop --hf-checkpoint",
        )


def check_detach(
    config: LifecycleConfig,
    launcher: str,
    ray_address: str | None,
    lease: float | None,
    names: Mapping[str, str] = FLAGS,
) -> None:
    """Kept engines (--detach-engines) are detached Ray actors on a cluster that outlives the driver; their lease
    (seconds) bounds how long they wait for the next driver -- and means nothing without them."""
    check_lease(lease, names["engine_lease"])
    if lease is not None and not config.detach_engines:
        raise ConfigError(
            names["engine_lease"],
            lease,
            "has no effect without --detach-engines (only kept engines outlive their driver on a lease)",
            f"add --detach-engines, or drop {names['engine_lease']}",
        )
    if not config.detach_engines:
        return
    why, fix = "", ""
    if launcher != "ray":
        why, fix = "kept engines are Ray's detached actors", f"use {names['launcher']} ray (the default)"
    elif not ray_address:
        why = "this driver's own Ray instance, and every engine in it, dies with the driver"
        fix = f"start a cluster that outlives it (ray start --head) and pass {names['ray_address']} HOST:PORT"
    if why:
        raise ConfigError("--detach-engines", True, why, fix)


def launches_engines(config: LifecycleConfig) -> bool:
    """Whether the job starts rollout engine processes itself (not external ones, not none under train-only)."""
    return bool(config.num_rollout_engines) and not config.rollout_external_engine_addrs


def check_effects(
    config: LifecycleConfig,
    *,
    vllm_python: str | None = None,
    router: bool | None = None,
    rollout_fn: str | None = None,
    data_source: str | None = None,
    ray_nodes: int = 1,
    launcher: str = "ray",
    names: Mapping[str, str] = FLAGS,
) -> None:
    """Options that would do nothing in this combination are refused, naming why (as ``--metrics-host`` without
    ``--metrics-port``): a user who gives one expects its effect. ``router``: False where the gateway was turned
    off (``--no-router``), None where it is used if installed."""
    if replay(config):  # the construction gate never builds a rollout function or reads prompts under replay
        for name, value in (("rollout_fn", rollout_fn), ("data_source", data_source)):
            if value is not None:
                raise ConfigError(
                    names[name],
                    value,
                    "has no effect: replay (--load-debug-rollout-data) trains on saved rollouts and never generates",
                    f"drop {names[name]}, or drop --load-debug-rollout-data",
                )
    if ray_nodes > 1 and (launcher != "ray" or not launches_engines(config)):
        why = (
            f"{names['launcher']} {launcher} runs the engines as this process's children"
            if launcher != "ray"
            else "the job starts no engine (external ones, or --debug-train-only)"
        )
        raise ConfigError(
            names["ray_nodes"],
            ray_nodes,
            f"has no effect: its worker nodes host only engine actors, and {why}",
            f"drop {names['ray_nodes']}",
        )
    if vllm_python is not None:
        why = ""
        from engines.backends import engine_backend  # the HTTP clients: not imported by `lifecycle --help`

        if engine_backend(config.rollout_backend).environment is None:
            why = f"--rollout-backend {config.rollout_backend} starts no vLLM server"
        elif config.rollout_external_engine_addrs:
            why = "the external vLLM servers (--rollout-external-engine-addrs) run in their owner's environment"
        elif not config.num_rollout_engines:
            why = "--debug-train-only (or replay) starts no rollout server"
        if why:
            raise ConfigError(
                names["vllm_python"],
                vllm_python,
                f"has no effect: {why}",
                f"drop {names['vllm_python']}, or use --rollout-backend vllm with engines the job starts",
            )
    if config.gateway_health_check:  # train-only: refused by the config's own validation
        if router is False:
            raise ConfigError(
                "--gateway-health-check",
                True,
                f"has no effect with {names['router']}: requests are routed in-process, there is no SMG gateway "
                "whose health checks could report",
                f"drop --gateway-health-check, or drop {names['router']}",
            )
        if router is None and importlib.util.find_spec("smg") is None:
            raise ConfigError(
                "--gateway-health-check",
                True,
                "has no effect: the SMG gateway is not installed, so requests are routed in-process",
                "pip install 'rl-lifecycle[router]', or drop --gateway-health-check",
            )


def check_engine_options(config: LifecycleConfig, engines: int | None, startup_timeout: float | None) -> None:
    """``lifecycle run``'s engine options where the run starts no engine (--debug-train-only, replay)."""
    if config.num_rollout_engines:
        return
    for flag, value in (("--engines", engines), ("--engine-startup-timeout", startup_timeout)):
        if value is not None:
            raise ConfigError(
                flag, value, "has no effect: --debug-train-only (or replay) starts no rollout engine", f"drop {flag}"
            )


def visible_gpus() -> int:
    """GPUs this machine shows its processes (NVIDIA's device files, or ROCm's render nodes), without torch:
    ``CUDA_VISIBLE_DEVICES`` set empty (or -1) hides them all."""
    hidden = os.environ.get("CUDA_VISIBLE_DEVICES")
    if hidden is not None and hidden.strip() in ("", "-1"):
        return 0
    nvidia = [d for d in glob.glob("/dev/nvidia[0-9]*") if d[len("/dev/nvidia") :].isdigit()]
    rocm = glob.glob("/dev/dri/renderD*") if os.path.exists("/dev/kfd") else []
    return len(nvidia) or len(rocm)


def check_rollout_device(config: LifecycleConfig, ray_address: str | None) -> None:
    """``--rollout-device cuda`` needs a GPU where the engines start: on a cluster this driver starts, this
    machine (a cluster at --ray-address places them on its own nodes, which this machine cannot see)."""
    if config.rollout_device != "cuda" or ray_address or not launches_engines(config):
        return
    if not visible_gpus():
        raise ConfigError(
            "--rollout-device",
            "cuda",
            "this machine has no GPU its processes can use (no /dev/nvidia* device, or CUDA_VISIBLE_DEVICES hides "
            "them), and the engines start on it",
            "use --rollout-device cpu (the default), run on a machine with a GPU, or join a cluster that has one "
            "(--ray-address)",
        )


def check_engine_key(config: LifecycleConfig) -> None:
    """External engines' key (``$LIFECYCLE_ENGINE_API_KEY``) is read before Ray starts, so a malformed one is
    refused naming the variable instead of failing the first request."""
    if config.rollout_external_engine_addrs:
        given_api_key()


def check_metrics(port: int | None, host: str) -> None:
    """The exporter's extra and its address, before Ray starts: each problem names its own flag (a host that is
    not this machine's was blamed on --metrics-port), and a --metrics-host without a port is not ignored."""
    if port is None:
        if host != METRICS_HOST:
            raise ConfigError(
                "--metrics-host", host, "has no effect without --metrics-port", "add --metrics-port PORT (0: any free)"
            )
        return
    if importlib.util.find_spec("prometheus_client") is None:
        raise ConfigError(
            "--metrics-port", port, "needs prometheus_client, not installed", "pip install 'rl-lifecycle[metrics]'"
        )
    if not 0 <= port <= 65535:
        raise ConfigError("--metrics-port", port, "is not a TCP port", "use a port in 1..65535, or 0 for any free one")
    host_fix = "use an address of this machine: 127.0.0.1 (default), or 0.0.0.0 for every interface"
    try:
        socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError) as exc:  # gaierror: not a name or address this machine resolves
        raise ConfigError("--metrics-host", host, f"cannot be resolved ({exc})", host_fix) from None
    try:
        with socket.create_server((host, port)):
            pass
    except OSError as exc:
        reason = f"cannot listen on {host}:{port} ({exc.strerror or exc})"
        if exc.errno == errno.EADDRNOTAVAIL:  # the address is not one of this machine's
            raise ConfigError("--metrics-host", host, reason, host_fix) from None
        raise ConfigError("--metrics-port", port, reason, "pick a free port, or 0") from None


# -- one check of a run's settings, whoever starts the run ------------------------------------------------------------
# The CLI's flags, run_loop's RunOptions and a Job's options all come here, so none of them accepts what another
# refuses. Errors name the flag; a Job renames them to its arguments (trainer.app.job.job_error).
def _integer(flag: str, value: object, bounds: Bounded, fix: str) -> int:
    """An int (not a bool, not a float) in the CLI's bounds of ``flag``."""
    lo, hi = int(bounds.lo), int(bounds.hi)
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        why = f" ({bounds.why})" if bounds.why else ""
        raise ConfigError(flag, value, f"must be an integer in {lo}..{hi}{why}", fix)
    return value


def _path(flag: str, value: object, *, optional: bool = False) -> Path | None:
    """A path given as ``str`` or ``os.PathLike`` (an int, bytes or a blank string is refused, not read as one)."""
    if value is None and optional:
        return None
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    if not isinstance(value, str) or not value.strip():
        kind = "a non-empty path (str or pathlib.Path)" + (", or None" if optional else "")
        raise ConfigError(flag, value, f"must be {kind}", "pass the directory's path")
    return Path(value)


def _seconds(flag: str, value: object) -> None:
    """A bound on a wait: a finite number of seconds in (0, MAX_SECONDS] (an unbounded or zero wait is never meant)."""
    ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or not 0 < value <= MAX_SECONDS:  # type: ignore[operator]
        raise ConfigError(
            flag,
            value,
            f"must be a finite number of seconds greater than 0 (at most {MAX_SECONDS})",
            f"use e.g. {flag} 30",
        )


def _factory_path(flag: str, value: object) -> None:
    if value is None:
        return
    if not isinstance(value, str) or not value.partition(":")[0] or not value.partition(":")[2]:
        raise ConfigError(
            flag, value, "must be MODULE:ATTR (a string) or None", "name a factory, e.g. mypkg.module:factory"
        )


def check_run(
    config: object,
    options: RunOptions,
    *,
    engines_given: bool = False,
    names: Mapping[str, str] = FLAGS,
) -> None:
    """Every check of a run's settings that needs no runtime, before anything starts or is written: what
    ``lifecycle run`` refuses, a :class:`~trainer.app.job.Job` refuses the same way. Types and bounds first (the
    CLI's own), then the combinations, then what is on disk (another run's directory, the initial checkpoint).
    ``options.hf_checkpoint`` is the initial checkpoint; ``engines_given``: the caller brings its own engine
    launcher (the backend's launch checks do not apply); ``names``: how the caller spells the options in the
    combinations' fixes (the command line's flags by default)."""
    if not isinstance(config, LifecycleConfig):
        raise ConfigError(
            "config",
            config,
            f"must be a LifecycleConfig, not {type(config).__name__}",
            "build it with LifecycleConfig.from_mapping({...}) (or lifecycle.LifecycleConfig(...))",
        )
    o = options
    path = _path(FLAGS["run_dir"], o.run_dir)
    assert path is not None
    checkpoint = _path(FLAGS["hf_checkpoint"], o.hf_checkpoint, optional=True)
    for name, bounds in BOUNDS.items():  # every numbered option: an int in its flag's bounds
        value = getattr(o, name)
        if value is not None or not BY_NAME[name].optional:
            _integer(FLAGS[name], value, bounds, BY_NAME[name].fix)
    if not isinstance(o.launcher, str) or o.launcher not in LAUNCHERS:
        raise ConfigError(FLAGS["launcher"], o.launcher, f"unknown launcher (known: {', '.join(LAUNCHERS)})", "use ray")
    if o.ray_address is not None and not isinstance(o.ray_address, str):
        raise ConfigError(FLAGS["ray_address"], o.ray_address, "must be a string or None", "pass HOST:PORT or auto")
    if o.ray_address is not None:
        parse_ray_address(o.ray_address)
        if o.ray_nodes != 1:
            raise ConfigError(
                FLAGS["ray_nodes"], o.ray_nodes, "starts a local cluster, --ray-address joins one", "use one"
            )
    lease = o.engine_lease
    if lease is not None and (isinstance(lease, bool) or not isinstance(lease, int | float)):
        raise ConfigError(FLAGS["engine_lease"], lease, "must be a number of seconds or None", "pass e.g. 120")
    _check_timeouts(o.timeouts)
    _factory_path(FLAGS["rollout_fn"], o.rollout_fn)
    if config.fully_async and o.rollout_fn is not None:
        raise ConfigError(
            names["rollout_fn"],
            o.rollout_fn,
            "runs a whole rollout at a time, and --fully-async never stops generating: its stream sends the task's "
            "prompts group by group itself (a --data-source still feeds it)",
            "drop the rollout function, or run without --fully-async",
        )
    _factory_path(FLAGS["data_source"], o.data_source)
    if not isinstance(o.metrics_host, str) or not o.metrics_host.strip():
        raise ConfigError(
            FLAGS["metrics_host"], o.metrics_host, "must be a non-empty address", "pass 127.0.0.1 (default), or 0.0.0.0"
        )
    if o.use_tis is not None and not isinstance(o.use_tis, bool):
        raise ConfigError(
            FLAGS["use_tis"], o.use_tis, "must be True, False or None (on with --fully-async)", "pass a bool"
        )
    tis = tis_problem(o.tis_clip, o.tis_clip_low, (FLAGS["tis_clip"], FLAGS["tis_clip_low"]))
    if tis is not None:
        fix = f"pass e.g. {FLAGS['tis_clip']} {TIS_CLIP:g} {FLAGS['tis_clip_low']} {TIS_CLIP_LOW:g} (slime's defaults)"
        raise ConfigError(*tis, fix)
    # the combinations
    check_model(o.model, checkpoint)
    check_fleet(config, o, names)
    if not engines_given:
        check_detach(config, o.launcher, o.ray_address, lease, names)
        check_backend_model(config, o.model, checkpoint)
        check_effects(
            config,
            vllm_python=o.vllm_python,
            router=o.router,
            rollout_fn=o.rollout_fn,
            data_source=o.data_source,
            ray_nodes=o.ray_nodes,
            launcher=o.launcher,
            names=names,
        )
        check_rollout_device(config, o.ray_address)
    check_engine_key(config)
    check_metrics(o.metrics_port, o.metrics_host)
    # what is on disk: the initial checkpoint read whole, then what the run would write over
    if checkpoint is not None:
        check_hf_checkpoint(checkpoint, o.model_size)
    check_new_run(path, save=config.save, load=config.load, hf_checkpoint=checkpoint)


def _check_timeouts(timeouts: object) -> None:
    """The engines' bounds: an ``engines.engine.Timeouts`` (or None: the backend's) of finite seconds."""
    from engines.engine import Timeouts  # the HTTP client: imported where a run is checked, not for --help

    if timeouts is None:
        return
    if not isinstance(timeouts, Timeouts):
        raise ConfigError(
            API_NAMES["timeouts"],
            timeouts,
            f"must be an engines.engine.Timeouts or None, not {type(timeouts).__name__}",
            "pass Timeouts(startup=..., request=..., death=...) (seconds), or None for the backend's",
        )
    for key, value in vars(timeouts).items():
        _seconds(TIMEOUT_FLAGS.get(key, f"timeouts.{key}"), value)
