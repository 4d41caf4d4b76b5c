"""A run's options, each declared once: one :func:`option` field of :class:`RunOptions` per option.

The field carries everything about the option -- its type and default (the field's own), its command-line
flag and how argparse reads it, its bounds, its help, whether ``run.json`` keeps it (and how it is checked when
read back), whether it changes the trained state (a job checkpoint belongs to it), whether a
:class:`~trainer.app.job.Job` reads it -- and everything else is derived from the fields: ``lifecycle run``'s
flags (:func:`add_run_arguments`), ``run.json`` (:meth:`RunOptions.manifest`, :meth:`RunOptions.from_manifest`,
:data:`MANIFEST`), the bounds (:data:`BOUNDS`), the names errors give each option (:data:`FLAGS`,
:data:`API_NAMES`). ``tests/trainer/app/test_options_declared_once.py`` fails when an option is declared
anywhere else.

Light on purpose (no torch, Ray or HTTP imports): the CLI parses and checks its flags with it before the loop
is imported.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, get_args

from engines.launcher import LauncherFactory, LauncherKind
from engines.ledger import MIN_LEASE
from lifecycle.decide.config import MAX_COUNT, MAX_SECONDS, Bounded, arg_type, nonblank, parse_number
from lifecycle.decide.errors import ConfigError
from lifecycle.decide.faults import FAULTS
from trainer.app.faults import Fault, fault_arg, parse_fault
from trainer.app.fleet import Scale, parse_scale, scale_arg
from trainer.backend import RANKS, BackendSpec
from trainer.grpo import TIS_CLIP, TIS_CLIP_LOW

if TYPE_CHECKING:  # engines.engine imports the HTTP client; trainer.job_state imports torch
    from engines.engine import Timeouts
    from rollout.task import Task
    from trainer.job_state import JobCheckpoint

LAUNCHERS: tuple[LauncherKind, ...] = get_args(LauncherKind)
Model = Literal["char", "tiny-llama"]
MODELS: tuple[Model, ...] = get_args(Model)
METRICS_HOST = "127.0.0.1"
PORT = Bounded(0, 65535, why="a TCP port; 0 picks a free one")
SECONDS = Bounded(0, MAX_SECONDS, kind=float)
# a preemption's grace between its notice and its SIGTERM: GCE Spot gives 30 s, AWS Spot 120 s, none over an hour
NOTICE = Bounded(1, 3600, kind=float, why="a preemption's notice: clouds give 30-120 s")
_RAY_ADDRESS = re.compile(r"(?:ray://)?(?P<host>[A-Za-z0-9._-]+|\[[0-9A-Fa-f:.]+\]):(?P<port>[0-9]+)")

Check = Callable[[Any], "str | None"]  # a run.json value's problem, or None


@dataclass(frozen=True)
class Option:
    """One run option, as its :func:`option` field declares it (``name`` is the field's)."""

    name: str
    default: Any  # the field's (dataclasses.MISSING where a factory makes it: run_dir)
    optional: bool  # None is a value of it (the field's default is None)
    help: str
    flag: str | None  # the command line's spelling; None: the API's only
    cli: Callable[[], dict[str, Any]] | None  # argparse's extras (type, metavar, action, dest, a default of its own)
    bounds: Bounded | None  # an integer's range: the flag, the run's check and run.json's read-back share it
    fix: str  # the fix of a value out of its bounds
    manifest: Check | None  # run.json keeps it, checked with this when read back; None: not written
    since: bool  # runs written before it was added lack it in run.json (absent: the default)
    trains: bool  # it changes the trained state: each job checkpoint records it
    job: bool  # a Job reads it from its options
    argument: str | None  # the Job's own argument that stands for it (a Job takes it there, not from its options)
    with_resume: bool  # a flag of this machine, not of the run: given with --resume
    custom: bool  # a Python object run.json cannot hold (a resume through the CLI is refused)
    to_json: Callable[[Any], Any] | None
    from_json: Callable[[Any], Any] | None
    from_flag: Callable[[Any], Any] | None  # the option's value from its flag's, where they differ

    @property
    def dest(self) -> str:
        """Where argparse stores the flag."""
        extra = self.cli() if self.cli else {}
        return str(extra.get("dest", (self.flag or "").lstrip("-").replace("-", "_")))


def option(
    default: Any,
    help: str,
    *,
    flag: str | None = None,
    cli: Callable[[], dict[str, Any]] | None = None,
    bounds: Bounded | None = None,
    fix: str = "",
    manifest: Check | None = None,
    since: bool = False,
    trains: bool = False,
    job: bool = False,
    argument: str | None = None,
    with_resume: bool = False,
    custom: bool = False,
    to_json: Callable[[Any], Any] | None = None,
    from_json: Callable[[Any], Any] | None = None,
    from_flag: Callable[[Any], Any] | None = None,
    factory: Callable[[], Any] | None = None,
) -> Any:
    """Declare one :class:`RunOptions` field *and* everything about the option: the one place it is written.

    ``cli``: argparse's keyword arguments besides the flag, help and default (called when the parser is built, so
    a bounded option's ``type`` is its :data:`BOUNDS` entry then); a ``default`` there is the flag's, where the
    command line must tell "not given" from the field's default; ``from_flag`` converts the flag's value where it
    is not the option's. ``manifest``: run.json's check of the value read back (``to_json``/``from_json`` convert
    where JSON cannot hold the value as it is)."""
    spec = {
        "help": help,
        "flag": flag,
        "cli": cli,
        "bounds": bounds,
        "fix": fix,
        "manifest": manifest,
        "since": since,
        "trains": trains,
        "job": job,
        "argument": argument,
        "with_resume": with_resume,
        "custom": custom,
        "to_json": to_json,
        "from_json": from_json,
        "from_flag": from_flag,
    }
    if factory is not None:
        return field(default_factory=factory, metadata={"option": spec})
    return field(default=default, metadata={"option": spec})


# -- what the declarations below check and parse with ---------------------------------------------------------------
def default_run_dir(root: Path = Path("runs")) -> Path:
    """``runs/<timestamp>``, or ``runs/<timestamp>-2``, ... : a run started without --run-dir never lands in
    another's directory (two in one second, a clock set back)."""
    base = root / time.strftime("%Y%m%d-%H%M%S")
    path, n = base, 1
    while path.exists():
        n += 1
        path = base.with_name(f"{base.name}-{n}")
    return path


def parse_ray_address(text: str) -> str:
    """``--ray-address``: ``auto``, ``HOST:PORT`` or ``ray://HOST:PORT``, the port in 1..65535. A blank one is
    refused: ``if ns.ray_address`` would read it as "no address" and start a local cluster instead."""
    fix = "pass HOST:PORT of a running Ray head (e.g. 127.0.0.1:6379), ray://HOST:10001, or auto; omit it to start one"
    address = text.strip()
    if not address:
        raise ConfigError("--ray-address", text, "the address is empty", fix)
    if address == "auto":
        return address
    m = _RAY_ADDRESS.fullmatch(address)
    if m is None:
        raise ConfigError("--ray-address", text, "not a Ray address", fix)
    try:
        parse_number(m["port"], int, 1, 65535)
    except ValueError as exc:
        raise ConfigError("--ray-address", text, f"the port is {exc}", fix) from None
    return address


def parse_host(text: str) -> str:
    """``--metrics-host``: a blank one would listen on every interface (``''`` is 0.0.0.0), not what was meant."""
    if not text.strip():
        raise ConfigError(
            "--metrics-host", text, "the address is empty", "pass 127.0.0.1 (default), or 0.0.0.0 for every interface"
        )
    return text.strip()


def check_lease(lease: float | None, name: str = "--engine-lease") -> None:
    """A kept engine's lease: finite (``inf`` was written into run.json as ``Infinity``, which the job's own
    ``--resume`` then refused), long enough that a live driver renews it in time, at most the project's bound
    on any wait (``1e10`` s outlives every driver: an engine that never exits)."""
    if lease is None:
        return
    if isinstance(lease, bool) or not isinstance(lease, int | float) or not MIN_LEASE <= lease <= MAX_SECONDS:
        raise ConfigError(
            name,
            lease,
            f"must be a number of seconds in {MIN_LEASE:g}..{MAX_SECONDS} (a driver renews the lease every third of "
            f"it, each renewal taking up to {MIN_LEASE / 2:g} s: a shorter lease lapses while the driver lives; a "
            "kept engine whose driver never comes back must exit within days, not hold its GPU for ever)",
            f"pass e.g. {name} 120 (the default)",
        )


# run.json's checks of a value read back: each returns the problem, or None
def _bounded(name: str) -> Check:
    def check(v: Any) -> str | None:
        low, high = BOUNDS[name].lo, BOUNDS[name].hi
        ok = isinstance(v, int) and not isinstance(v, bool) and low <= v <= high
        return None if ok else f"must be an integer in {int(low)}..{int(high)}"

    return check


def _positive_number(v: Any, high: float = 1e9) -> str | None:
    ok = isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) and 0 < v <= high
    return None if ok else f"must be a finite number greater than 0 (at most {high:g})"


def _non_negative(v: Any) -> str | None:
    ok = isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) and v >= 0
    return None if ok else "must be a finite number of at least 0"


def notice_problem(v: Any) -> str | None:
    """``--preempt-notice``'s problem (run.json's read-back, and a RunOptions given by an API caller), or None."""
    ok = isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) and NOTICE.lo <= v <= NOTICE.hi
    return None if ok else f"must be a number of seconds in {NOTICE.lo:g}..{NOTICE.hi:g}"


def _lease(v: Any) -> str | None:
    """A kept engine's lease, by the rule its flag was checked with (:func:`check_lease`)."""
    try:
        check_lease(v)
    except ConfigError as exc:
        return exc.problem
    return None


def _text(*, optional: bool = False, factory: bool = False) -> Check:
    def check(v: Any) -> str | None:
        if v is None and optional:
            return None
        if not isinstance(v, str) or not v or len(v) > 4096:
            return "must be a non-empty string" + (" or null" if optional else "")
        if factory and (not v.partition(":")[0] or not v.partition(":")[2]):
            return "must be MODULE:ATTR"
        return None

    return check


def _one_of(*allowed: object) -> Check:
    return lambda v: (
        None if any(v is a or (type(v) is type(a) and v == a) for a in allowed) else f"must be one of {allowed}"
    )


def strings(v: Any) -> str | None:
    """A list of strings (run.json's ``faults``, ``custom``)."""
    ok = isinstance(v, list) and len(v) <= 1000 and all(isinstance(s, str) and len(s) <= 4096 for s in v)
    return None if ok else "must be a list of strings"


def _timeouts(v: Any) -> str | None:
    if not isinstance(v, dict) or set(v) != {"startup", "request", "death"}:
        return "must be an object of startup, request and death"
    return next((f"{k} {p}" for k, x in v.items() if (p := _positive_number(x, MAX_SECONDS))), None)


def _timeouts_json(timeouts: Timeouts | None) -> dict[str, float]:
    from engines.engine import Timeouts

    return dataclasses.asdict(timeouts or Timeouts())


def _timeouts_read(value: Mapping[str, float]) -> Timeouts:
    from engines.engine import Timeouts

    return Timeouts(**value)


def _faults_read(value: list[str]) -> tuple[Fault, ...]:
    faults = (parse_fault(f) for f in value)
    return tuple(f for f in faults if f.kind != "kill-driver")  # it has done its part


def _optional_path(value: str | None) -> Path | None:
    return Path(value) if value else None


def _bound(name: str, **extra: Any) -> Callable[[], dict[str, Any]]:
    """argparse's extras of a bounded option: its type is its :data:`BOUNDS` entry when the parser is built."""
    return lambda: {"type": BOUNDS[name], **extra}


# -- the options ------------------------------------------------------------------------------------------------------
@dataclass
class RunOptions:
    """The options of a run: ``run_loop(config, RunOptions(...))``, ``Job(..., options=RunOptions(...))``, and
    ``lifecycle run``'s flags. Each field is one option, declared once (see :func:`option`)."""

    steps: int = option(
        30,
        "RL steps (default 30)",
        flag="--steps",
        cli=_bound("steps", default=None, metavar="N"),
        bounds=Bounded(1, MAX_COUNT),
        fix="pass the run's number of steps, e.g. 30",
        manifest=_bounded("steps"),
        job=True,
        with_resume=True,
    )
    seed: int = option(
        0,
        "seed of data, sampling and initial weights (default 0)",
        flag="--seed",
        cli=_bound("seed"),
        bounds=Bounded(0, 2**64 // RANKS - 1, why="a worker's torch seed is seed * 65536 + its rank, a 64-bit number"),
        fix="pass a non-negative seed, e.g. 0",
        manifest=_bounded("seed"),
        trains=True,
        job=True,
    )
    run_dir: Path = option(
        None,
        "output folder (default runs/<timestamp>)",
        flag="--run-dir",
        cli=lambda: {"type": nonblank, "default": None, "metavar": "DIR"},
        argument="run_dir",
        factory=default_run_dir,
    )
    ray_address: str | None = option(
        None,
        "connect to this Ray cluster: HOST:PORT, ray://HOST:PORT or auto",
        flag="--ray-address",
        cli=lambda: {"type": arg_type(parse_ray_address, "address"), "metavar": "ADDR"},
        job=True,
        with_resume=True,
    )
    faults: tuple[Fault, ...] = option(
        (),
        "inject a fault at a step's start, e.g. kill-engine:1@3; FAULT is one of "
        f"{', '.join(FAULTS)} (see docs/reliability.md); "
        "with --async, step k's generation is already running, so an engine fault at step k hits generate(k+1)",
        flag="--inject",
        cli=lambda: {"action": "append", "type": fault_arg, "default": [], "metavar": "FAULT:INDEX@STEP"},
        manifest=strings,
        to_json=lambda faults: [str(f) for f in faults],
        from_json=_faults_read,
        from_flag=tuple,
    )
    ray_nodes: int = option(
        1,
        "start a local multi-node Ray cluster: a head plus N-1 worker nodes hosting the engines (lose-node)",
        flag="--ray-nodes",
        cli=_bound("ray_nodes", metavar="N"),
        bounds=Bounded(1, 64, why="each is a Ray node process on this machine"),
        fix="pass 1 (a local Ray node), or more for lose-node tests",
        manifest=_bounded("ray_nodes"),
        job=True,
    )
    scale: tuple[Scale, ...] = option(
        (),
        "scale the rollout fleet as a step starts: N@STEP makes it N engines from step STEP on (the loop calls "
        "job.scale_rollout(N)); repeatable, e.g. 2 -> 4 -> 1 -> 3 engines is --scale-rollout 4@3 --scale-rollout 1@6 "
        "--scale-rollout 3@9; N within the fleet's bounds (--rollout-min-num-gpus, --rollout-max-num-gpus, in "
        "engines of --rollout-num-gpus-per-engine)",
        flag="--scale-rollout",
        cli=lambda: {"action": "append", "type": scale_arg, "default": [], "metavar": "N@STEP"},
        manifest=strings,
        to_json=lambda scale: [str(s) for s in scale],
        from_json=lambda value: tuple(parse_scale(s) for s in value),
        from_flag=tuple,
        since=True,
    )
    preempt_notice: float = option(
        30.0,
        "preempt-engine and preempt-node faults: the seconds between the notice and the engine's SIGTERM (its "
        "server's process group; SIGKILL 5 s later) or the node's removal (default 30, like a GCE Spot VM; 1..3600)",
        flag="--preempt-notice",
        cli=lambda: {"type": NOTICE, "metavar": "SECONDS"},
        manifest=notice_problem,
        since=True,
    )
    # engine startup/request/death bounds; given on the command line by --engine-startup-timeout and
    # --engine-request-timeout (ENGINE_FLAGS below: two flags of one option); None: the backend's
    timeouts: Timeouts | None = option(
        None,
        "engine startup/request/death bounds (seconds); None: the backend's",
        manifest=_timeouts,
        to_json=_timeouts_json,
        from_json=_timeouts_read,
        job=True,
    )
    launcher: LauncherKind = option(
        "ray",
        "engine processes in Ray actors",
        flag="--launcher",
        cli=lambda: {"choices": LAUNCHERS},
        manifest=_one_of(*LAUNCHERS),
        job=True,
    )
    workers: int = option(
        1,
        "trainer workers (default 1)",
        flag="--trainer-workers",
        cli=_bound("workers", metavar="N"),
        bounds=Bounded(1, RANKS, why="a worker's torch seed is seed * 65536 + its rank"),
        fix="pass a number of trainer workers, e.g. 1",
        manifest=_bounded("workers"),
        trains=True,
        job=True,
    )
    lr: float = option(
        1e-2,
        "learning rate (default 1e-2)",
        flag="--lr",
        cli=lambda: {"type": float},
        manifest=_positive_number,
        trains=True,
    )
    model_size: str = option(
        "tiny", "the char model's size (the project's GRPO trainer)", manifest=_text(), trains=True
    )
    rollout_fn: str | None = option(
        None,
        "your rollout fn factory: factory(task) -> async rollout_fn(rollout_id, controller) -> samples",
        flag="--rollout-function",
        cli=lambda: {"type": nonblank, "metavar": "MODULE:ATTR"},
        manifest=_text(optional=True, factory=True),
        trains=True,
        job=True,
    )
    data_source: str | None = option(
        None,
        "your prompts: factory(task) -> object with prompts(rollout_id) -> list[str] (miles' data source)",
        flag="--data-source",
        cli=lambda: {"type": nonblank, "metavar": "MODULE:ATTR"},
        manifest=_text(optional=True, factory=True),
        trains=True,
        job=True,
    )
    task: Task | None = option(
        None, "the task; None: the project's PatternTask of the seed", custom=True, argument="task"
    )
    backend: BackendSpec | None = option(
        None, "the trainer; None: the project's GRPO trainer of model_size, seed, lr", custom=True, argument="backend"
    )
    quiet: bool = option(
        False, "no progress output", flag="--quiet", cli=lambda: {"action": "store_true"}, with_resume=True
    )
    async_mode: bool = option(
        False,
        "overlap the next step's generation with training (one step off-policy, miles' train_async; no offload)",
        flag="--async",
        cli=lambda: {"action": "store_true", "dest": "async_mode"},
        manifest=_one_of(True, False),
        trains=True,
    )
    use_tis: bool | None = option(
        None,
        "off-policy correction of the project's trainer (slime's --use-tis, truncated importance sampling): each "
        "token's policy gradient weighted by exp(trainer logprob - engine logprob), truncated to "
        "[--tis-clip-low, --tis-clip]; every sample must carry its engine logprobs. Default: on with "
        "--fully-async (samples of older weights), off otherwise; --no-use-tis turns it off",
        flag="--use-tis",
        cli=lambda: {"action": argparse.BooleanOptionalAction, "default": None},
        manifest=_one_of(True, False, None),
        since=True,
        trains=True,
    )
    tis_clip: float = option(
        TIS_CLIP,
        f"with --use-tis: the ratio's upper truncation C (slime's --tis-clip, default {TIS_CLIP:g})",
        flag="--tis-clip",
        cli=lambda: {"type": float, "metavar": "C"},
        manifest=_positive_number,
        since=True,
        trains=True,
    )
    tis_clip_low: float = option(
        TIS_CLIP_LOW,
        f"with --use-tis: the ratio's lower truncation (slime's --tis-clip-low, default {TIS_CLIP_LOW:g}: none)",
        flag="--tis-clip-low",
        cli=lambda: {"type": float, "metavar": "C"},
        manifest=_non_negative,
        since=True,
        trains=True,
    )
    keep_checkpoints: int = option(
        3,
        "weight versions kept as checkpoint directories under RUN_DIR/weights (default 3; the served one "
        "is never removed)",
        flag="--keep-checkpoints",
        cli=_bound("keep_checkpoints", metavar="K"),
        bounds=Bounded(1, MAX_COUNT),
        fix="keep at least 1, e.g. 3",
        manifest=_bounded("keep_checkpoints"),
        job=True,
    )
    hf_checkpoint: Path | None = option(
        None,
        "initial weights: a Hugging Face checkpoint directory (config.json + model.safetensors): the char "
        "model's (RUN_DIR/weights/step-N of an earlier run) or any local transformers causal LM with its "
        "tokenizer files (its model_type picks the family); default: the seed's weights, written as "
        "RUN_DIR/weights/step-0",
        flag="--hf-checkpoint",
        cli=lambda: {"type": nonblank, "metavar": "DIR"},
        manifest=_text(optional=True),
        to_json=lambda path: None if path is None else str(path),
        from_json=_optional_path,
        from_flag=_optional_path,
        trains=True,
        argument="initial_checkpoint",
    )
    model: Model = option(
        "char",
        "the policy: char (default, the built-in char-level model, fastest) or tiny-llama (a tiny random-init "
        "Hugging Face LlamaForCausalLM and a BPE tokenizer trained locally, built into RUN_DIR/model and served "
        "and trained through transformers; needs pip install 'rl-lifecycle[hf]'; slower, see the README; the "
        "default with --rollout-backend vllm). --hf-checkpoint gives the model instead",
        flag="--model",
        cli=lambda: {"choices": MODELS, "default": None},
        manifest=_text(),
        trains=True,
        argument="initial_checkpoint",  # a Job is given its model as its initial checkpoint
    )
    router: bool | None = option(
        None,
        "route requests in-process instead of through the SMG gateway (the default where "
        "'rl-lifecycle[router]' is installed; engines are registered only while Serving, and routable only once SMG "
        "says ready)",
        flag="--no-router",
        cli=lambda: {"action": "store_true", "dest": "no_router"},
        from_flag=lambda off: False if off else None,  # off, or the gateway where it is installed
        manifest=_one_of(True, False, None),
        job=True,
    )
    engine_launcher: LauncherFactory | None = option(
        None, "engine_id -> Launcher (scripts/gpu_check.py: SGLang servers)", custom=True, argument="engines"
    )
    metrics_port: int | None = option(
        None,
        "serve Prometheus metrics of every machine at http://HOST:PORT/metrics while the run lasts (0: any free "
        "port, printed); needs pip install 'rl-lifecycle[metrics]'",
        flag="--metrics-port",
        cli=_bound("metrics_port", metavar="PORT"),
        bounds=PORT,
        fix="use 1..65535, or 0",
        job=True,
        with_resume=True,
    )
    metrics_host: str = option(
        METRICS_HOST,
        "address the metrics endpoint listens on (default 127.0.0.1; 0.0.0.0 exposes it to the network)",
        flag="--metrics-host",
        cli=lambda: {"type": arg_type(parse_host, "host"), "metavar": "HOST"},
        job=True,
        with_resume=True,
    )
    timeline: bool = option(True, "write RUN_DIR/timeline.html (lifecycle trace timeline) when the run ends")
    resume: JobCheckpoint | None = option(
        None, "the job checkpoint of config.load, read and checked already (None: run_loop reads it)", job=True
    )
    engine_lease: float | None = option(
        None,
        "with --detach-engines: how long a kept engine outlives its driver without a renewal before it exits "
        "(default 120; 20 s to 30 days: the driver renews it every third); a resume must come within it to adopt "
        "the engines",
        flag="--engine-lease",
        cli=lambda: {"type": float, "metavar": "SECONDS"},
        manifest=lambda v: None if v is None else _lease(v),
        since=True,
        job=True,
    )
    vllm_python: str | None = option(
        None,
        "--rollout-backend vllm: the python of the vLLM engine environment (default: $LIFECYCLE_VLLM_PYTHON, "
        "else .venv-vllm/bin/python, which `make engine-env` builds)",
        flag="--vllm-python",
        cli=lambda: {"metavar": "PATH"},
        job=True,
        with_resume=True,
    )
    events: str | Path | None = option(
        "events.jsonl",
        "the event log's file (relative to the run directory; an absolute path as it is); None: none",
        job=True,
    )
    job_id: str | None = option(
        None,
        "the job's identity (run.json's job_id): with it, each job checkpoint records it and the options that "
        "change the trained state; None: a checkpoint is matched on the config alone",
        job=True,
    )

    def manifest(self) -> dict[str, Any]:
        """The options RUN_DIR/run.json keeps, so that ``lifecycle run --resume RUN_DIR`` starts the same job
        (a Python task, backend or launcher object cannot be written down: an API caller passes it again)."""
        body: dict[str, Any] = {}
        for opt in OPTIONS:
            if opt.manifest is not None:
                value = getattr(self, opt.name)
                body[opt.name] = opt.to_json(value) if opt.to_json else value
        body[CUSTOM] = [opt.name for opt in OPTIONS if opt.custom and getattr(self, opt.name) is not None]
        return body

    def job_settings(self) -> dict[str, Any]:
        """What, besides the config, a job checkpoint belongs to: every option that changes the trained state
        (a Python backend object by its factory and arguments)."""
        backend = None if self.backend is None else {"factory": self.backend.factory, "kwargs": self.backend.kwargs}
        return {**job_options(self.manifest()), "backend": backend}

    @classmethod
    def from_manifest(cls, options: Mapping[str, Any], where: Path, **given: Any) -> RunOptions:
        """The options of :meth:`manifest` again (``where``: the run.json they came from, for the error);
        ``given``: what this driver sets itself (run_dir, steps, quiet, the checkpoint, ...)."""
        values: dict[str, Any] = {}
        try:
            for opt in OPTIONS:
                if opt.manifest is None or opt.name in given or (opt.since and opt.name not in options):
                    continue
                value = options[opt.name]
                values[opt.name] = opt.from_json(value) if opt.from_json else value
            return cls(**values, **given)
        except (KeyError, TypeError, ValueError, ConfigError) as exc:
            problem = f"lacks the option {exc}" if isinstance(exc, KeyError) else f"is malformed ({exc})"
            raise ConfigError("--resume", str(where), problem, _RESTORE) from None

    @classmethod
    def from_args(cls, ns: argparse.Namespace, **given: Any) -> RunOptions:
        """The options of ``lifecycle run``'s command line; ``given``: what the command resolved itself (a
        default that depends on the config, the run directory, the engines' timeouts)."""
        values = dict(given)
        for opt in OPTIONS:
            if opt.flag is not None and opt.name not in given:
                value = getattr(ns, opt.dest)
                if value is not None or opt.optional:  # a flag not given: the option's default
                    values[opt.name] = opt.from_flag(value) if opt.from_flag else value
        return cls(**values)


CUSTOM = "custom"  # run.json's list of the options given as Python objects
_RESTORE = "restore the run.json lifecycle run wrote into the run directory"


def derive(cls: type = RunOptions) -> tuple[Option, ...]:
    """Every option, from the fields that declare them (in field order); ``cls``: RunOptions, or a subclass."""
    found = []
    for f in fields(cls):
        spec = f.metadata.get("option")
        if spec is None:
            raise TypeError(f"RunOptions.{f.name} is not declared with option()")
        found.append(Option(name=f.name, default=f.default, optional=f.default is None, **spec))
    return tuple(found)


OPTIONS: tuple[Option, ...] = derive()
BY_NAME: dict[str, Option] = {opt.name: opt for opt in OPTIONS}
# the bounds of the numbered options: their flags parse with these, the run's check and run.json's read-back
# check against the same ones -- a run.json holds nothing a command line could not give
BOUNDS: dict[str, Bounded] = {opt.name: opt.bounds for opt in OPTIONS if opt.bounds is not None}
# run.json's options and the check of each (the custom list too); SINCE: absent in runs written before them
MANIFEST: dict[str, Check] = {
    **{opt.name: opt.manifest for opt in OPTIONS if opt.manifest is not None},
    CUSTOM: strings,
}
SINCE = frozenset(opt.name for opt in OPTIONS if opt.since)
# the options that change the trained state: a job checkpoint belongs to these (and the config's settings)
JOB_OPTIONS = tuple(opt.name for opt in OPTIONS if opt.trains)
# those added since checkpoints were first written, by their defaults as run.json holds them: recorded only when set
_LATER = {
    opt.name: opt.to_json(opt.default) if opt.to_json else opt.default for opt in OPTIONS if opt.trains and opt.since
}
# how the command line spells each option, and an API caller (run_loop's RunOptions, a Job's options)
FLAGS: dict[str, str] = {opt.name: opt.flag for opt in OPTIONS if opt.flag is not None}
API_NAMES: dict[str, str] = {opt.name: f"RunOptions.{opt.name}" for opt in OPTIONS}
API_NAMES["router"] = "RunOptions.router=False"  # the flag that turns it off is --no-router
# a Job's: its own arguments by name, the rest as its options' fields (a check names the flag: a Job renames it)
JOB_NAMES: dict[str, str] = {
    **{opt.flag: f"Job({opt.argument}=)" if opt.argument else API_NAMES[opt.name] for opt in OPTIONS if opt.flag},
}


def loop_only(options: RunOptions) -> list[Option]:
    """The options given (not at their default) that a Job does not read: the run loop's own."""
    given = [o for o in OPTIONS if not o.job and o.default is not dataclasses.MISSING]
    return [o for o in given if getattr(options, o.name) != o.default]


def job_options(options: Mapping[str, Any]) -> dict[str, Any]:
    """The options of a run (``RunOptions.manifest()``) that its job checkpoints belong to. One added later
    (``since``) is left out at its default: a job checkpoint written before it existed, and the same job resumed
    now, have one fingerprint."""
    return {k: options.get(k) for k in JOB_OPTIONS if k not in _LATER or options.get(k, _LATER[k]) != _LATER[k]}


# -- lifecycle run's flags ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Flag:
    """A flag of ``lifecycle run`` that is not one run option as it is: the command's own (``--resume``,
    ``--engines``), or one part of an option (the engines' timeouts)."""

    flag: str
    help: str
    cli: Callable[[], dict[str, Any]]
    with_resume: bool = False
    part: str | None = None  # the option it gives one part of (``timeouts``)


COMMAND_FLAGS = (
    Flag(
        "--resume",
        "continue the run in RUN_DIR (its driver died) from its latest job checkpoint, with its own settings "
        "(RUN_DIR/run.json); the run must have been started with --save DIR. Only --steps, --quiet, --ray-address "
        "and --metrics-port/--metrics-host may be given with it",
        lambda: {"type": nonblank, "default": None, "metavar": "RUN_DIR"},
        with_resume=True,
    ),
    Flag(
        "--engines",
        "rollout engines (sets --rollout-num-gpus)",
        lambda: {"type": Bounded(1, MAX_COUNT), "default": None, "metavar": "N"},
    ),
)
ENGINE_FLAGS = (
    Flag(
        "--engine-request-timeout",
        "bound on every engine HTTP request; one that runs out marks the engine Unhealthy (default 30)",
        lambda: {"type": SECONDS, "default": 30.0, "metavar": "S"},
        part="timeouts.request",
    ),
    Flag(
        "--engine-startup-timeout",
        "bound on an engine's start until it generates; then start_failed (default 60; 300 with "
        "--rollout-backend vllm, whose servers take 25-60 s to start on 2 cores)",
        lambda: {"type": SECONDS, "default": None, "metavar": "S"},
        part="timeouts.startup",
    ),
)
# the engines' bounds, by part: how the command line spells each
TIMEOUT_FLAGS = {
    **{f.part.partition(".")[2]: f.flag for f in ENGINE_FLAGS if f.part},
    "death": "timeouts.death",
}
JOB_NAMES.update({flag: API_NAMES["timeouts"] for flag in TIMEOUT_FLAGS.values()})
# what may be given with --resume: everything else is the run's own (RUN_DIR/run.json)
WITH_RESUME = frozenset(
    [opt.dest for opt in OPTIONS if opt.with_resume and opt.flag]
    + [f.flag.lstrip("-").replace("-", "_") for f in COMMAND_FLAGS if f.with_resume]
)


def add_run_arguments(parser: argparse.ArgumentParser) -> None:
    """``lifecycle run``'s flags, derived from the options' declarations: the command's own first, then each
    option's (the engines' timeouts where the ``timeouts`` option is)."""
    for extra in COMMAND_FLAGS:
        parser.add_argument(extra.flag, help=extra.help, **extra.cli())
    for opt in OPTIONS:
        if opt.flag is not None and opt.cli is not None:
            kwargs = opt.cli()
            if "default" not in kwargs and kwargs.get("action") not in ("store_true", "append"):
                kwargs["default"] = getattr(RunOptions, opt.name, None)
            parser.add_argument(opt.flag, help=opt.help, **kwargs)
        if opt.name == "timeouts":
            for part in ENGINE_FLAGS:
                parser.add_argument(part.flag, help=part.help, **part.cli())
