"""``LifecycleConfig``: the one validated value every guard in every machine reads.

It speaks miles' flag names, so a miles/slime ``Namespace`` can be passed as it is, and it
resolves the flags the way miles does (FT components default, replay forces train-only, ...).
Every bad input raises one :class:`ConfigError` here, at construction, naming the flag and the
fix -- the replay crash in miles was a ``None`` that travelled until a multiplication.
"""

from __future__ import annotations

import argparse
import difflib
import math
import os
import re
import string
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Literal, NoReturn, TypeVar, get_args, get_type_hints

from lifecycle.decide.backends import BACKENDS, DEVICES, capabilities
from lifecycle.decide.errors import ConfigError, UsageError, bounded_repr
from lifecycle.decide.predicates import (
    broadcasts_weights,
    elastic,
    keeps_engines,
    offloads_rollout,
    releases_rollout_memory,
    rollout_backend_broadcasts,
    starts_servers,
)

FT_COMPONENTS = ("train", "rollout")
HEALTH_ENDPOINTS = ("progress", "health_generate", "health")
TRANSFER_MODES = ("disk", "broadcast")
# --pause-generation-mode: every mode some backend answers; a streaming update keeps requests, so the modes that end
# them (abort; vLLM's wait, which drains) are refused where the config is resolved
PAUSE_MODES = ("keep", "retract", "in_place", "abort", "wait")
KEEPING_PAUSE_MODES = ("keep", "retract", "in_place")
DEFAULT_STALENESS = 1
MAX_STALENESS = 64  # the checker explores staleness up to K+1 per buffered group: a bound, not a tuning range
DEFAULT_BUFFER_BATCHES = 2
MAX_BUFFER_BATCHES = 1000  # miles caps its output queue at 1000 groups
DEFAULT_DRAIN_TIMEOUT = 30.0  # a leaving engine's requests in flight: Kubernetes' and GCE Spot's grace period
Mode = Literal["normal", "train-only", "rollout-only", "replay"]
T = TypeVar("T")


class ConfigWarning(UserWarning):
    """A flag that has no effect under the rest of the configuration."""


@dataclass(frozen=True)
class _Flag:
    """How one setting is spelled on the command line, typed, defaulted and explained (derived from
    the field that declares it, see :func:`setting`)."""

    name: str
    kind: str  # bool | int | float | path | components | choice | addresses
    default: Any
    help: str
    optional: bool = False  # None allowed
    choices: Sequence[str] = ()  # kind "choice": the allowed spellings (read at each use: backends register)
    most: float | None = None  # kinds int/float: the largest value accepted (default MAX_COUNT / MAX_SECONDS)

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")


def setting(
    default: Any, help: str, *, kind: str | None = None, choices: Sequence[str] = (), most: float | None = None
) -> Any:
    """Declare one :class:`LifecycleConfig` field *and* its flag: the one place a setting is written.

    ``kind`` is inferred from the field's type (bool, int, float; ``| None`` makes it optional)
    unless given (``path``, ``components``, ``choice``). ``most`` bounds a number above (default
    :data:`MAX_COUNT` for an int, :data:`MAX_SECONDS` for a float).
    """
    return field(default=default, metadata={"help": help, "kind": kind, "choices": choices, "most": most})


# Every number is bounded where it is parsed, so none overflows later in Ray, asyncio, torch or a socket
# (a 23-digit port or a 64-bit-plus seed would otherwise be a traceback deep in a run).
MAX_COUNT = 2**31 - 1  # a C int: what Ray, multiprocessing and torch take for a count
MAX_SECONDS = 30 * 24 * 3600  # no wait, window or timeout of a run is longer than 30 days
_MAX_DIGITS = 40  # a longer numeral is refused before int()/float() (Python refuses ints over 4,300 digits)


def _show(x: float) -> str:
    """A bound as a user writes it: ``2592000``, not ``2.592e+06``; ``0.5``."""
    return str(int(x)) if float(x).is_integer() else f"{x:g}"


def parse_number(text: str, kind: type[int] | type[float], lo: float, hi: float) -> int | float:
    """``text`` as an int or a finite float in ``[lo, hi]``, or ``ValueError`` saying what is wrong in words."""
    what = "a whole number" if kind is int else "a number"
    stripped = text.strip()
    if len(stripped) > _MAX_DIGITS:
        raise ValueError(f"too long to be {what} in {_show(lo)}..{_show(hi)}")
    try:
        value: int | float = int(stripped) if kind is int else float(stripped)
    except ValueError:
        raise ValueError(f"not {what}") from None
    if not math.isfinite(value):
        raise ValueError("must be a finite number")
    if not lo <= value <= hi:
        raise ValueError(f"out of range {_show(lo)}..{_show(hi)}")
    return value


class Bounded:
    """An argparse ``type``: an int (or float) in ``[lo, hi]``, refused at parse time as one paragraph naming
    the flag and the fix -- the one bounded-number type of every ``lifecycle`` command's own flags.
    ``why`` says where the bound comes from (``"torch seeds are 64-bit"``)."""

    def __init__(self, lo: float, hi: float, *, kind: type[int] | type[float] = int, why: str = "") -> None:
        self.lo, self.hi, self.kind, self.why = lo, hi, kind, why
        self.__name__ = kind.__name__  # argparse names a type by it

    def __call__(self, text: str) -> int | float:
        try:
            return parse_number(text, self.kind, self.lo, self.hi)
        except ValueError as exc:
            why = f" ({self.why})" if self.why else ""
            raise argparse.ArgumentTypeError(
                f"{exc}{why} (got {bounded_repr(text)}). Fix: give a value in {_show(self.lo)}..{_show(self.hi)}"
            ) from None

    def __repr__(self) -> str:
        return f"Bounded({self.lo}, {self.hi}, kind={self.kind.__name__})"


def nonblank(text: str) -> str:
    """An argparse ``type`` for a path or name: an empty one was read as "not given" (``--run-dir ''`` picked the
    default folder, ``graph --write ''`` wrote into the current one), so it is refused."""
    if not text.strip():
        raise argparse.ArgumentTypeError("the value is empty. Fix: give it a value, or omit the flag")
    return text


def arg_type(parse: Callable[[str], T], name: str) -> Callable[[str], T]:
    """An argparse ``type`` from a parser that raises :class:`ConfigError` (a fault spec, an address): refused
    at parse time, before any command runs, as argparse's ``argument --flag: ...`` with the error's fix."""

    def convert(text: str) -> T:
        try:
            return parse(text)
        except ConfigError as exc:
            raise argparse.ArgumentTypeError(f"{exc.problem} (got {bounded_repr(exc.value)}). Fix: {exc.fix}") from None

    convert.__name__ = name
    return convert


def _flag(name: str) -> str:
    return FLAG_BY_NAME[name].flag


def _as_bool(name: str, value: object) -> bool:
    if isinstance(value, bool):
        return value
    if value is None:  # an unset store_true flag in someone else's Namespace
        return False
    if isinstance(value, str) and value.strip().lower() in ("true", "false", "1", "0", "yes", "no"):
        return value.strip().lower() in ("true", "1", "yes")
    raise ConfigError(_flag(name), value, "expected true or false", f"pass {_flag(name)} as a boolean, or omit it")


def _as_number(name: str, value: object, kind: str, optional: bool) -> int | float | None:
    flag = _flag(name)
    if value is None:
        if optional:
            return None
        raise ConfigError(flag, value, "a number is required here, not None", f"set {flag} to a number")
    if isinstance(value, bool):
        raise ConfigError(flag, value, "expected a number, got a boolean", f"set {flag} to a number")
    most = FLAG_BY_NAME[name].most
    if most is None:
        most = MAX_SECONDS if kind == "float" else MAX_COUNT
    if isinstance(value, str):
        if len(value.strip()) > _MAX_DIGITS:
            raise ConfigError(flag, value, f"too long for a number (at most {_show(most)})", f"set {flag} to a number")
        try:
            value = float(value) if kind == "float" or "." in value or "e" in value.lower() else int(value)
        except ValueError:
            raise ConfigError(flag, value, "not a number", f"set {flag} to a number such as 1") from None
    if not isinstance(value, int | float):
        raise ConfigError(flag, value, f"expected a number, got {type(value).__name__}", f"set {flag} to a number")
    if kind == "float" and isinstance(value, int):
        try:
            value = float(value)
        except OverflowError:  # an int beyond float range: report it, never an OverflowError later
            raise ConfigError(flag, value, "too large", f"set {flag} to a finite number") from None
    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(flag, value, "must be a finite number", f"set {flag} to a finite number")
    if value > most:  # below, the checks of each setting (positive, fractions) apply
        unit = " seconds" if kind == "float" else ""
        raise ConfigError(
            flag, value, f"too large (at most {_show(most)}{unit})", f"set {flag} to at most {_show(most)}"
        )
    if kind == "int":
        if isinstance(value, float):
            if not value.is_integer():
                raise ConfigError(flag, value, "must be a whole number", f"set {flag} to an integer")
            value = int(value)
        return int(value)
    return float(value)


def _as_path(name: str, value: object) -> str | None:
    if value is None:
        return None
    flag = _flag(name)
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    if not isinstance(value, str):
        raise ConfigError(flag, value, f"expected a path, got {type(value).__name__}", f"pass {flag} a file path")
    if not value.strip():
        raise ConfigError(flag, value, "the path is empty", f"pass {flag} a file path, or omit it")
    return str(value)


def _as_choice(name: str, value: object) -> str:
    flag, allowed = _flag(name), FLAG_BY_NAME[name].choices
    if isinstance(value, str) and value.strip().lstrip("/") in allowed:
        return value.strip().lstrip("/")
    hint = ""
    if isinstance(value, str):
        close = difflib.get_close_matches(value.strip().lstrip("/"), allowed, n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
    choices = ", ".join(allowed)
    raise ConfigError(flag, value, f"not one of {choices}", f"{hint}set {flag} to one of {choices}")


_ADDRESS = re.compile(r"(?:(?P<scheme>https?)://)?(?P<host>[A-Za-z0-9.-]+|\[[0-9A-Fa-f:]+\]):(?P<port>[0-9]{1,5})/?")


def _as_addresses(name: str, value: object) -> tuple[str, ...]:
    """``host:port`` or ``http(s)://host:port`` each, as ``http://host:port``; a bad one names itself."""
    flag = _flag(name)
    if value is None:
        return ()
    items = _split_components(
        value, flag, "a list of addresses", "pass HOST:PORT of each engine, e.g. 127.0.0.1:30000 127.0.0.1:30001"
    )
    out: list[str] = []
    for item in items:
        if not isinstance(item, str):
            problem = f"contains a {type(item).__name__}, not an address"
            raise ConfigError(flag, value, problem, "list HOST:PORT strings")
        m = _ADDRESS.fullmatch(item.strip())
        if m is None or not 0 < int(m["port"]) < 65536:
            raise ConfigError(
                flag, item, "not an engine address", "write HOST:PORT (or http://HOST:PORT), e.g. 127.0.0.1:30000"
            )
        normal = f"{m['scheme'] or 'http'}://{m['host']}:{int(m['port'])}"
        if normal in out:
            raise ConfigError(flag, item, "the address is listed twice", "list each engine once")
        out.append(normal)
    return tuple(out)


def _split_components(
    value: object,
    flag: str = "--ft-components",
    what: str = "a list of components",
    fix: str = "pass --ft-components train, rollout or both (space separated)",
) -> list[object]:
    if isinstance(value, str):
        return [p for p in re.split(r"[,\s]+", value.strip()) if p != ""]
    if isinstance(value, Iterable) and not isinstance(value, bytes | Mapping):
        return list(value)
    raise ConfigError(flag, value, f"expected {what}", fix)


def _as_components(value: object) -> tuple[str, ...] | None:
    """Parse FT components strictly: the miles bug list includes `"rollout" in None`.

    None and the field's default (an empty frozenset) mean "not given"; an explicitly empty list
    or string is ``()``, which FT refuses (miles requires at least one component).
    """
    if value is None or value == frozenset():
        return None
    items = _split_components(value)
    seen: list[str] = []
    for item in items:
        if item is None:
            raise ConfigError(
                "--ft-components",
                value,
                "contains None",
                "list component names only: train, rollout",
            )
        if not isinstance(item, str):
            raise ConfigError(
                "--ft-components",
                value,
                f"contains a {type(item).__name__}, not a component name",
                "list component names only: train, rollout",
            )
        if item not in FT_COMPONENTS:
            close = difflib.get_close_matches(item, FT_COMPONENTS, n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            raise ConfigError(
                "--ft-components",
                value,
                f"unknown component {item!r}",
                f"{hint}valid components are: {', '.join(FT_COMPONENTS)}",
            )
        if item in seen:
            raise ConfigError(
                "--ft-components",
                value,
                f"component {item!r} is listed twice",
                "list each component once",
            )
        seen.append(item)
    return tuple(seen)


def _has_rollout_id(path: str) -> bool:
    """Whether the template has a ``{rollout_id}`` field (with or without a format spec, not ``{{...}}``)."""
    try:
        return any(name == "rollout_id" for _, name, _, _ in string.Formatter().parse(path))
    except ValueError:
        return False


def _check_template(name: str, path: str, num_rollout: int | None) -> None:
    flag = _flag(name)
    try:
        path.format(rollout_id=0)
    except Exception as exc:  # KeyError, IndexError, ValueError, and {rollout_id.x} / {rollout_id[0]}
        raise ConfigError(
            flag,
            path,
            f"the path template is malformed ({type(exc).__name__}: {exc})",
            "use {rollout_id} as the only placeholder, e.g. runs/data/{rollout_id}.json",
        ) from None
    if not _has_rollout_id(path) and num_rollout is not None and num_rollout > 1:
        raise ConfigError(
            flag,
            path,
            f"{num_rollout} rollouts would share one file",
            "put {rollout_id} in the path, e.g. runs/data/{rollout_id}.json",
        )


@dataclass(frozen=True)
class LifecycleConfig:
    """The validated lifecycle configuration (miles flag names, resolved as miles does).

    Construct it directly with keyword arguments, or with :meth:`from_namespace`,
    :meth:`from_mapping` or :meth:`from_file`. All inputs are checked in ``__post_init__``;
    after that every field has its final type, so predicates never meet a ``None``.
    """

    use_fault_tolerance: bool = setting(False, "Enable fault tolerance (the FT master switch).")
    # Input: a list/tuple/set of names or "train,rollout" (None or empty: not given); always a frozenset after.
    ft_components: frozenset[str] = setting(
        frozenset(),
        "FT components among {train,rollout}; defaults to rollout when FT is on, ignored when off.",
        kind="components",
    )
    debug_train_only: bool = setting(False, "Train without rollout servers (the rollout function produces data).")
    debug_rollout_only: bool = setting(False, "Generate rollouts without training.")
    load_debug_rollout_data: str | None = setting(
        None,
        "Replay saved rollouts from this path (template with {rollout_id}); forces --debug-train-only.",
        kind="path",
    )
    save_debug_rollout_data: str | None = setting(
        None, "Save each rollout's samples to this path template (with {rollout_id}).", kind="path"
    )
    save: str | None = setting(
        None, "Write job checkpoints (trainer, RNG, rollout id, weight version) under this directory.", kind="path"
    )
    save_interval: int | None = setting(
        None, "Write a job checkpoint every N rollouts, and at the run's end (default with --save: at the end only)."
    )
    load: str | None = setting(
        None, "Resume the job from the latest checkpoint under this directory (an earlier run's --save).", kind="path"
    )
    ci_test: bool = setting(False, "CI mode: arms rollout fault injection when rollout FT is on.")
    rollout_num_gpus: int | None = setting(None, "GPUs (engine slots) for rollout servers.")
    rollout_num_gpus_per_engine: int = setting(1, "GPUs per rollout engine.")
    # -- an elastic fleet: engines join and leave mid-run between these bounds (the job starts --rollout-num-gpus)
    rollout_min_num_gpus: int | None = setting(
        None,
        "The fewest rollout GPUs an elastic fleet may shrink to: a generate or stream with fewer engines serving "
        "stops the run (default with --rollout-max-num-gpus: one engine's worth).",
    )
    rollout_max_num_gpus: int | None = setting(
        None,
        "The most rollout GPUs of an elastic fleet: its engine slots (default with --rollout-min-num-gpus: "
        "--rollout-num-gpus, no growth).",
    )
    rollout_drain_timeout: float | None = setting(
        None,
        "An elastic fleet: seconds a leaving engine's requests in flight may take before they are handed back or "
        f"re-sent and it is stopped anyway (never past a preemption's deadline; default {DEFAULT_DRAIN_TIMEOUT:g}).",
    )
    # Input: a list of addresses or "host:port,host:port"; always a tuple of http://host:port after.
    rollout_external_engine_addrs: tuple[str, ...] = setting(
        (),
        "Engines started outside the job (slime's flag): host:port of each; probed, routed and sent weights, "
        "never restarted. Replaces --rollout-num-gpus.",
        kind="addresses",
    )
    rollout_backend: str = setting(
        "sglang",
        "The inference engine behind every rollout and eval slot: sglang (real SGLang, or the project's CPU "
        "engine, which speaks its API) or vllm. External engines (--rollout-external-engine-addrs) are this "
        "backend too.",
        kind="choice",
        choices=BACKENDS,
    )
    rollout_device: str = setting(
        "cpu",
        "Where the engines run (cpu or cuda): a backend's abilities depend on it (vLLM releases memory only "
        "in sleep mode, which its CPU platform refuses).",
        kind="choice",
        choices=DEVICES,
    )
    eval_num_gpus: int = setting(0, "GPUs for the dedicated eval fleet (0: no fleet).")
    eval_num_gpus_per_engine: int = setting(1, "GPUs per eval engine.")
    eval_interval: int | None = setting(
        None, "Evaluate before the first rollout and every N rollouts after the weight update (default: never)."
    )
    colocate: bool = setting(False, "Trainer and rollout share GPUs; implies --offload.")
    offload_rollout: bool = setting(False, "Release rollout engine memory while training.")
    offload_train: bool = setting(False, "Release trainer memory while generating.")
    rollout_health_check_interval: float = setting(30.0, "Seconds between health probe rounds.")
    rollout_health_check_timeout: float | None = setting(
        None, "Seconds before one health probe counts as failed (default 30, or the interval if shorter)."
    )
    rollout_health_check_first_wait: float = setting(0.0, "Startup grace (seconds) before the first probe.")
    rollout_health_check_failure_threshold: int = setting(
        3, "Consecutive failed probes before an engine is marked unhealthy."
    )
    rollout_health_check_jitter: float = setting(0.1, "Probe period jitter, as a fraction of the interval.")
    rollout_health_check_endpoint: str | None = setting(
        None,
        "What a health probe asks: progress (vLLM: a 1-token generation answered or the engine's token counters "
        "moving -- a busy healthy engine passes, a wedged engine core fails), health_generate (a real 1-token "
        "generation; queues behind a busy engine's requests) or health (liveness of the API server only). "
        "Default: the backend's own (vLLM: progress; SGLang: health_generate).",
        kind="choice",
        choices=HEALTH_ENDPOINTS,
    )
    gateway_health_check: bool = setting(
        False,
        "Keep the SMG gateway's own health checks on (/health every second) as a second detector: a worker it "
        "stops routing to is news, and the lifecycle marks the engine. Off: the lifecycle's monitor alone decides.",
    )
    detach_engines: bool = setting(
        False,
        "Rollout engines outlive the driver (detached Ray actors on a cluster that outlives it, recorded in the run "
        "directory's engine ledger, each with a lease the driver renews): --resume re-adopts the ones still alive "
        "instead of relaunching them. Needs --save (the checkpoint a resume reconciles them with).",
    )
    engine_max_restarts: int = setting(3, "Restarts allowed per engine within --engine-restart-window.")
    engine_restart_window: float = setting(600.0, "Window (seconds) over which restarts are counted.")
    engine_restart_backoff: float = setting(1.0, "First restart delay (seconds); doubles each restart.")
    engine_restart_backoff_max: float = setting(30.0, "Cap (seconds) of the restart delay.")
    num_rollout: int | None = setting(None, "Number of rollouts (steps) of the run, when known.")
    update_weight_transfer_mode: str = setting(
        "disk",
        "How the trainer's update reaches the engines: disk (each loads the step's checkpoint) or broadcast "
        "(a process group with every engine; catch-ups and recoveries still load the committed checkpoint).",
        kind="choice",
        choices=TRANSFER_MODES,
    )
    update_weight_buffer_size: int = setting(
        512 * 1024**2, "Bytes per broadcast bucket (one /update_weights_from_distributed call each).", most=2**40
    )
    update_weight_timeout: float = setting(
        60.0, "Seconds every weight-group call and every broadcast bucket may take before it counts as failed."
    )
    # -- streaming RL (miles' fully-async flags) ------------------------------------------------------------------
    fully_async: bool = setting(
        False,
        "Streaming RL (miles' flag): engines generate continuously, completed groups enter a bounded buffer, the "
        "trainer takes batches from it and weights are pushed while requests are in flight.",
    )
    max_weight_staleness: int | None = setting(
        None,
        "With --fully-async: the most weight versions a trained group's oldest token may be behind the trainer "
        "(miles' flag); a staler group is dropped when the trainer would take it, and its prompts re-queued "
        f"(default {DEFAULT_STALENESS}).",
        most=MAX_STALENESS,
    )
    pause_generation_mode: str | None = setting(
        None,
        "With --fully-async: how an engine is paused for an in-flight weight update, its requests kept (miles' "
        "flag): keep (vLLM), retract or in_place (SGLang). Default: the backend's first that keeps requests.",
        kind="choice",
        choices=PAUSE_MODES,
    )
    async_data_buffer_max_batches: int | None = setting(
        None,
        "With --fully-async: the buffer of completed groups holds at most this many batches; a full buffer "
        f"blocks the producer (miles' flag; default {DEFAULT_BUFFER_BATCHES}).",
        most=MAX_BUFFER_BATCHES,
    )
    warnings: tuple[str, ...] = field(default=(), compare=False, repr=False)

    # -- resolution and validation -------------------------------------------------------
    def __post_init__(self) -> None:
        set_ = object.__setattr__
        notes: list[str] = list(self.warnings)
        for f in FLAGS:
            if f.name in _INPUT_ONLY:
                continue
            raw = getattr(self, f.name)
            if f.kind == "bool":
                set_(self, f.name, _as_bool(f.name, raw))
            elif f.kind in ("int", "float"):
                set_(self, f.name, _as_number(f.name, raw, f.kind, f.optional))
            elif f.kind == "path":
                set_(self, f.name, _as_path(f.name, raw))
            elif f.kind == "choice":
                set_(self, f.name, None if raw is None and f.optional else _as_choice(f.name, raw))
            elif f.kind == "addresses":
                set_(self, f.name, _as_addresses(f.name, raw))

        if self.rollout_health_check_endpoint is None:
            set_(self, "rollout_health_check_endpoint", self._default_probe())
        if self.rollout_health_check_timeout is None:  # miles' 30 s, but never longer than the interval
            interval = self.rollout_health_check_interval
            set_(self, "rollout_health_check_timeout", min(30.0, interval) if interval > 0 else 30.0)
        components = _as_components(self.ft_components)
        if self.use_fault_tolerance:
            if components == ():
                raise ConfigError(
                    "--ft-components",
                    self.ft_components,
                    "fault tolerance is on but no component is listed (miles requires at least one)",
                    "list train, rollout or both, or omit --ft-components for the default (rollout)",
                )
            resolved = frozenset(components) if components else frozenset({"rollout"})
        else:
            if components:
                notes.append(f"--ft-components {' '.join(components)} has no effect without --use-fault-tolerance")
            resolved = frozenset()
        set_(self, "ft_components", resolved)

        if self.colocate:
            set_(self, "offload_rollout", True)
            set_(self, "offload_train", True)

        if self.load_debug_rollout_data is not None:
            if self.debug_rollout_only:
                raise ConfigError(
                    "--load-debug-rollout-data",
                    self.load_debug_rollout_data,
                    "replay trains on saved rollouts, but --debug-rollout-only disables training",
                    "drop --debug-rollout-only, or drop --load-debug-rollout-data",
                )
            if self.save_debug_rollout_data is not None:
                raise ConfigError(
                    "--save-debug-rollout-data",
                    self.save_debug_rollout_data,
                    "replay generates no new rollouts, so there is nothing to save",
                    "drop --save-debug-rollout-data when replaying with --load-debug-rollout-data",
                )
            set_(self, "debug_train_only", True)  # miles: replay forces train-only
        if self.debug_train_only and self.debug_rollout_only:
            raise ConfigError(
                "--debug-rollout-only",
                True,
                "--debug-train-only and --debug-rollout-only exclude each other",
                "choose one of them",
            )
        if self.rollout_external_engine_addrs:
            if self.debug_train_only:
                raise ConfigError(
                    "--rollout-external-engine-addrs",
                    " ".join(self.rollout_external_engine_addrs),
                    "--debug-train-only (or replay) starts no rollout server, so there is nothing to attach",
                    "drop --rollout-external-engine-addrs, or drop --debug-train-only / --load-debug-rollout-data",
                )
            gpus = self.rollout_num_gpus
            if gpus is not None and gpus != len(self.rollout_external_engine_addrs) * self.rollout_num_gpus_per_engine:
                notes.append(
                    f"--rollout-num-gpus {gpus} is ignored: the {len(self.rollout_external_engine_addrs)} "
                    "--rollout-external-engine-addrs are the rollout engines"
                )
        self._validate_numbers()
        self._validate_checkpoints()
        self._validate_detach()
        self._validate_backend()
        self._validate_streaming()
        self._validate_elastic()
        for name in ("load_debug_rollout_data", "save_debug_rollout_data"):
            path = getattr(self, name)
            if path is not None:
                _check_template(name, path, self.num_rollout)
        if self.gateway_health_check and self.debug_train_only:
            raise ConfigError(
                "--gateway-health-check",
                True,
                "has no effect: --debug-train-only (or replay) starts no rollout engine, so there is no gateway "
                "routing to one",
                "drop --gateway-health-check, or drop --debug-train-only / --load-debug-rollout-data",
            )
        if self.eval_num_gpus > 0 and self.debug_train_only:
            notes.append("--eval-num-gpus has no effect with --debug-train-only: no eval fleet is started")
        set_(self, "warnings", tuple(dict.fromkeys(notes)))

    def _default_pause(self) -> str:
        """The pause an in-flight update uses by default: the backend's first that keeps the requests."""
        modes = capabilities(self.rollout_backend, self.rollout_device).pause_modes
        return next(m for m in modes if m in KEEPING_PAUSE_MODES)

    def _default_probe(self) -> str:
        """The probe a busy healthy engine of the rollout backend passes (the first it answers)."""
        return capabilities(self.rollout_backend, self.rollout_device).probes[0]

    def _validate_backend(self) -> None:
        """What the run needs of its engines, asked of the backend's declared abilities (one place: the
        capability predicates), before anything starts."""
        can = capabilities(self.rollout_backend, self.rollout_device)
        where = f"--rollout-backend {self.rollout_backend} on --rollout-device {self.rollout_device}"
        if offloads_rollout(self) and not releases_rollout_memory(self):
            flag = "--colocate" if self.colocate else "--offload-rollout"
            raise ConfigError(
                flag,
                True,
                f"{where} cannot release engine memory: {can.reason('release memory')}",
                f"drop {flag}, or use --rollout-backend sglang"
                + "".join(
                    f", or run {can.label} on --rollout-device {device}"
                    for device in DEVICES
                    if device != self.rollout_device and capabilities(self.rollout_backend, device).releases
                ),
            )
        if self.rollout_health_check_endpoint not in can.probes:
            raise ConfigError(
                "--rollout-health-check-endpoint",
                self.rollout_health_check_endpoint,
                f"{where} answers no such probe",
                f"use one of {', '.join(can.probes)} (or leave the flag out: {can.probes[0]})",
            )
        if broadcasts_weights(self) and not rollout_backend_broadcasts(self):
            raise ConfigError(
                "--update-weight-transfer-mode",
                self.update_weight_transfer_mode,
                f"{where} cannot join a weight-update group: {can.reason('broadcast')}",
                "use --update-weight-transfer-mode disk",
            )

    def _validate_streaming(self) -> None:
        """--fully-async and its settings: where they mean something, and resolved (a bound always exists: the
        checker proves the stream against one, and a stream without one trains on anything)."""
        set_ = object.__setattr__
        if not self.fully_async:
            for name in ("max_weight_staleness", "pause_generation_mode", "async_data_buffer_max_batches"):
                if getattr(self, name) is not None:
                    raise ConfigError(
                        _flag(name),
                        getattr(self, name),
                        "has no effect without --fully-async: the lock-step loop drains the engines before every "
                        "weight update, so nothing is in flight or buffered across one",
                        f"add --fully-async, or drop {_flag(name)}",
                    )
            return
        why = ""
        if self.debug_rollout_only:
            why = "--debug-rollout-only trains nothing, so no weight version moves and staleness means nothing"
            fix = "drop --debug-rollout-only, or drop --fully-async"
        elif self.debug_train_only:
            why = "--debug-train-only (or replay) starts no rollout engine, so nothing streams"
            fix = "drop --fully-async, or drop --debug-train-only / --load-debug-rollout-data"
        elif offloads_rollout(self):
            why = (
                "a stream keeps every engine generating, so the rollout engines are never idle and cannot be "
                "offloaded (offload is allowed only between steps)"
            )
            fix = "drop --offload-rollout/--offload/--colocate, or drop --fully-async"
        if why:
            raise ConfigError("--fully-async", True, why, fix)
        if self.max_weight_staleness is None:
            set_(self, "max_weight_staleness", DEFAULT_STALENESS)
        elif self.max_weight_staleness < 0:
            raise ConfigError(
                "--max-weight-staleness",
                self.max_weight_staleness,
                "must not be negative (0: every trained group was generated under the trainer's current weights)",
                "set --max-weight-staleness to 0 or more, e.g. 1",
            )
        if self.async_data_buffer_max_batches is None:
            set_(self, "async_data_buffer_max_batches", DEFAULT_BUFFER_BATCHES)
        elif self.async_data_buffer_max_batches <= 0:
            raise ConfigError(
                "--async-data-buffer-max-batches",
                self.async_data_buffer_max_batches,
                "must be greater than 0 (a stream with no room for a completed group never trains)",
                "set --async-data-buffer-max-batches to 1 or more, e.g. 2",
            )
        can = capabilities(self.rollout_backend, self.rollout_device)
        keeping = [m for m in can.pause_modes if m in KEEPING_PAUSE_MODES]
        mode = self.pause_generation_mode
        if mode is None:
            set_(self, "pause_generation_mode", self._default_pause())
        elif mode not in keeping:
            where = f"--rollout-backend {self.rollout_backend}"
            problem = (
                f"{mode!r} ends the requests in flight (an in-flight update keeps them)"
                if mode not in KEEPING_PAUSE_MODES
                else f"{where} has no pause mode {mode!r}"
            )
            raise ConfigError(
                "--pause-generation-mode",
                mode,
                problem,
                f"use {' or '.join(keeping)} with {where} (or leave the flag out: {keeping[0]})",
            )

    def _validate_elastic(self) -> None:
        """The fleet's bounds: whole engines, around the initial fleet, on engines the job starts and owns alone
        (a colocated fleet shares the trainer's GPUs; a kept one's ledger records no target yet)."""
        lo, hi = self.rollout_min_num_gpus, self.rollout_max_num_gpus
        if lo is None and hi is None:
            if self.rollout_drain_timeout is not None:
                raise ConfigError(
                    "--rollout-drain-timeout",
                    self.rollout_drain_timeout,
                    "only an elastic fleet drains a leaving engine, and no bounds were given",
                    "add --rollout-min-num-gpus and/or --rollout-max-num-gpus, or drop --rollout-drain-timeout",
                )
            return
        flag = "--rollout-min-num-gpus" if lo is not None else "--rollout-max-num-gpus"
        value = lo if lo is not None else hi
        why, fix = "", ""
        if self.debug_train_only:
            why = "--debug-train-only (or replay) starts no rollout engine, so there is no fleet to scale"
            fix = f"drop {flag}, or drop --debug-train-only / --load-debug-rollout-data"
        elif self.rollout_external_engine_addrs:
            why = "the job does not start external engines (--rollout-external-engine-addrs): it cannot add any"
            fix = f"drop {flag}, or let the job start its engines (--rollout-num-gpus N)"
        elif offloads_rollout(self):
            why = (
                "a colocated fleet shares the trainer's GPUs: scaling it moves the trainer's memory (refused in "
                "this version)"
            )
            fix = f"drop --offload-rollout/--offload/--colocate, or drop {flag}"
        elif self.detach_engines:
            why = "a kept fleet's engine ledger records no target size yet, so a resume could not rebuild it"
            fix = f"drop --detach-engines, or drop {flag}"
        if why:
            raise ConfigError(flag, value, why, fix)
        per, start = self.rollout_num_gpus_per_engine, self.rollout_num_gpus or 0
        for name in ("rollout_min_num_gpus", "rollout_max_num_gpus"):
            v = getattr(self, name)
            if v is not None and v % per:
                raise ConfigError(
                    _flag(name),
                    v,
                    f"not divisible by --rollout-num-gpus-per-engine {per}: the fleet grows and shrinks by engines",
                    f"make {_flag(name)} a multiple of --rollout-num-gpus-per-engine",
                )
        if lo is not None and lo < per:
            raise ConfigError(
                "--rollout-min-num-gpus",
                lo,
                f"below one engine (--rollout-num-gpus-per-engine {per}): a fleet of no engine generates nothing",
                f"set --rollout-min-num-gpus to {per} or more",
            )
        if lo is not None and lo > start:
            raise ConfigError(
                "--rollout-min-num-gpus",
                lo,
                f"above --rollout-num-gpus {start}: the initial fleet must be within its bounds",
                f"set --rollout-min-num-gpus to at most {start}, or raise --rollout-num-gpus",
            )
        if hi is not None and hi < start:
            raise ConfigError(
                "--rollout-max-num-gpus",
                hi,
                f"below --rollout-num-gpus {start}: the initial fleet must be within its bounds",
                f"set --rollout-max-num-gpus to {start} or more, or lower --rollout-num-gpus",
            )
        if self.rollout_drain_timeout is None:
            object.__setattr__(self, "rollout_drain_timeout", DEFAULT_DRAIN_TIMEOUT)
        elif self.rollout_drain_timeout < 0:
            raise ConfigError(
                "--rollout-drain-timeout",
                self.rollout_drain_timeout,
                "must not be negative (0: a leaving engine's requests are handed back or re-sent at once)",
                f"set --rollout-drain-timeout to 0 or more, e.g. {DEFAULT_DRAIN_TIMEOUT:g}",
            )

    def _validate_detach(self) -> None:
        if not self.detach_engines:
            return
        why, fix = "", ""
        if self.debug_train_only:
            why, fix = "--debug-train-only (or replay) starts no rollout engine to keep", "drop --detach-engines"
        elif self.rollout_external_engine_addrs:
            why = "external engines are kept by their owner already: the job never starts or stops them"
            fix = "drop --detach-engines (a resumed job attaches to the same addresses again)"
        elif self.save is None or self.debug_rollout_only:
            why = "a kept engine is re-adopted by a resume, which reconciles it with the job checkpoint in --save"
            fix = "add --save DIR (and --load DIR to resume), or drop --detach-engines"
        if why:
            raise ConfigError("--detach-engines", True, why, fix)

    def _validate_checkpoints(self) -> None:
        if self.save_interval is not None and self.save is None:
            raise ConfigError(
                "--save-interval",
                self.save_interval,
                "there is no --save directory to write checkpoints into",
                "add --save DIR, or drop --save-interval",
            )
        if self.debug_rollout_only:
            for name in ("save", "load"):
                if getattr(self, name) is not None:
                    raise ConfigError(
                        _flag(name),
                        getattr(self, name),
                        "--debug-rollout-only trains nothing, so there is no trainer state to checkpoint",
                        f"drop {_flag(name)}, or drop --debug-rollout-only",
                    )

    def _validate_numbers(self) -> None:
        def positive(name: str) -> None:
            v = getattr(self, name)
            if v is not None and v <= 0:
                raise ConfigError(_flag(name), v, "must be greater than 0", f"set {_flag(name)} to a positive value")

        def non_negative(name: str) -> None:
            v = getattr(self, name)
            if v < 0:
                raise ConfigError(_flag(name), v, "must not be negative", f"set {_flag(name)} to 0 or more")

        for name in (
            "rollout_num_gpus",
            "rollout_num_gpus_per_engine",
            "eval_num_gpus_per_engine",
            "eval_interval",
            "rollout_health_check_interval",
            "rollout_health_check_timeout",
            "rollout_health_check_failure_threshold",
            "engine_restart_window",
            "engine_restart_backoff",
            "engine_restart_backoff_max",
            "num_rollout",
            "update_weight_buffer_size",
            "update_weight_timeout",
            "save_interval",
        ):
            positive(name)
        for name in ("eval_num_gpus", "rollout_health_check_first_wait", "engine_max_restarts"):
            non_negative(name)

        if starts_servers(self) and self.rollout_num_gpus is None and not self.rollout_external_engine_addrs:
            raise ConfigError(
                "--rollout-num-gpus",
                None,
                "rollout servers must start (no --debug-train-only), but no GPU count was given",
                "set --rollout-num-gpus N (or --rollout-external-engine-addrs HOST:PORT ...), or pass "
                "--debug-train-only / --load-debug-rollout-data",
            )
        if self.rollout_num_gpus is not None and self.rollout_num_gpus % self.rollout_num_gpus_per_engine:
            raise ConfigError(
                "--rollout-num-gpus",
                self.rollout_num_gpus,
                f"not divisible by --rollout-num-gpus-per-engine {self.rollout_num_gpus_per_engine}",
                "make --rollout-num-gpus a multiple of --rollout-num-gpus-per-engine",
            )
        if self.eval_num_gpus % self.eval_num_gpus_per_engine:
            raise ConfigError(
                "--eval-num-gpus",
                self.eval_num_gpus,
                f"not divisible by --eval-num-gpus-per-engine {self.eval_num_gpus_per_engine}",
                "make --eval-num-gpus a multiple of --eval-num-gpus-per-engine",
            )
        timeout = float(self.rollout_health_check_timeout or 0.0)
        if timeout > self.rollout_health_check_interval:
            raise ConfigError(
                "--rollout-health-check-timeout",
                self.rollout_health_check_timeout,
                f"longer than --rollout-health-check-interval {self.rollout_health_check_interval}, "
                "so probe rounds would overlap",
                "use a timeout no longer than the interval",
            )
        jitter = self.rollout_health_check_jitter
        if not 0 <= jitter < 1:
            raise ConfigError(
                "--rollout-health-check-jitter",
                jitter,
                "must be a fraction in [0, 1)",
                "use e.g. 0.1 for +-10% of the interval",
            )
        if self.engine_restart_backoff > self.engine_restart_backoff_max:
            raise ConfigError(
                "--engine-restart-backoff",
                self.engine_restart_backoff,
                f"greater than --engine-restart-backoff-max {self.engine_restart_backoff_max}",
                "use a first delay no greater than the cap",
            )

    # -- derived views -------------------------------------------------------------------
    @property
    def mode(self) -> Mode:
        """The run mode: replay, train-only, rollout-only or normal."""
        if self.load_debug_rollout_data is not None:
            return "replay"
        if self.debug_train_only:
            return "train-only"
        if self.debug_rollout_only:
            return "rollout-only"
        return "normal"

    @property
    def num_rollout_engines(self) -> int:
        """Engines of the rollout fleet (0 when no servers start): the external ones, when given."""
        if starts_servers(self) and self.rollout_external_engine_addrs:
            return len(self.rollout_external_engine_addrs)
        if not starts_servers(self) or self.rollout_num_gpus is None:
            return 0
        return self.rollout_num_gpus // self.rollout_num_gpus_per_engine

    @property
    def min_rollout_engines(self) -> int:
        """The fewest engines an elastic fleet may serve with (one, by default); without bounds: the fleet itself."""
        if not elastic(self):
            return self.num_rollout_engines
        lo = self.rollout_min_num_gpus
        return 1 if lo is None else lo // self.rollout_num_gpus_per_engine

    @property
    def max_rollout_engines(self) -> int:
        """The engine slots: an elastic fleet's most engines (the initial fleet, by default); without bounds: the
        fleet itself."""
        if not elastic(self):
            return self.num_rollout_engines
        hi = self.rollout_max_num_gpus
        return self.num_rollout_engines if hi is None else hi // self.rollout_num_gpus_per_engine

    @property
    def keeps_engines(self) -> bool:
        """Rollout engines outlive the driver (--detach-engines) and a resumed job adopts them: the predicate's."""
        return keeps_engines(self)

    @property
    def num_eval_engines(self) -> int:
        return self.eval_num_gpus // self.eval_num_gpus_per_engine

    def checkpoint_due(self, done: int, total: int) -> bool:
        """Whether a job checkpoint is written once ``done`` of ``total`` rollouts are: every --save-interval,
        and at the run's end (miles writes one at the end too)."""
        if self.save is None:
            return False
        return done == total or (self.save_interval is not None and done % self.save_interval == 0)

    def replay_path(self, rollout_id: int) -> Path:
        """The replay file of one rollout (raises ConfigError when not replaying)."""
        if self.load_debug_rollout_data is None:
            raise ConfigError("--load-debug-rollout-data", None, "not replaying", "pass a replay path")
        return Path(self.load_debug_rollout_data.format(rollout_id=rollout_id))

    def to_dict(self) -> dict[str, Any]:
        """A plain, JSON-ready dict (components sorted) that round-trips through from_mapping."""
        out: dict[str, Any] = {}
        for f in fields(self):
            if f.name == "warnings":
                continue
            v = getattr(self, f.name)
            out[f.name] = (sorted(v) or None) if isinstance(v, frozenset) else list(v) if isinstance(v, tuple) else v
        return out

    def to_flags(self) -> list[str]:
        """The shortest command line that reproduces this config (flags that differ from miles' defaults)."""
        argv: list[str] = []
        for f in FLAGS:
            if f.name in _INPUT_ONLY:
                continue
            v = getattr(self, f.name)
            if f.name == "ft_components":
                if self.use_fault_tolerance and v != {"rollout"}:
                    argv += [f.flag, *sorted(v)]
                continue
            implied = (
                (f.name == "debug_train_only" and self.load_debug_rollout_data is not None)
                or (f.name in ("offload_rollout", "offload_train") and self.colocate)
                or (f.name == "rollout_health_check_timeout" and v == min(30.0, self.rollout_health_check_interval))
                or (f.name == "rollout_health_check_endpoint" and v == self._default_probe())
                or (f.name == "max_weight_staleness" and v == DEFAULT_STALENESS)
                or (f.name == "async_data_buffer_max_batches" and v == DEFAULT_BUFFER_BATCHES)
                or (f.name == "rollout_drain_timeout" and v == DEFAULT_DRAIN_TIMEOUT)
                or (f.name == "pause_generation_mode" and v is not None and v == self._default_pause())
            )
            if implied or v == f.default:
                continue
            if f.kind == "bool":
                argv.append(f.flag)
            elif f.kind == "addresses":
                argv += [f.flag, *v]
            elif str(v).startswith("-"):  # argparse would read a separate "-x/..." value as a flag
                argv.append(f"{f.flag}={v}")
            else:
                argv += [f.flag, str(v)]
        return argv

    # -- builders ------------------------------------------------------------------------
    @classmethod
    def from_mapping(
        cls, values: Mapping[str, Any], *, check_paths: bool = True, source: str | None = None
    ) -> LifecycleConfig:
        """Build from a mapping with miles names (``use_fault_tolerance`` or ``use-fault-tolerance``).

        Unknown keys are errors (with a did-you-mean), since a typo would otherwise silently
        leave a default in place.
        """
        if not isinstance(values, Mapping):
            raise ConfigError(
                "--config",
                values,
                "expected a table of flag names to values",
                "see lifecycle/defaults/cpu.toml",
                source=source,
            )
        kwargs: dict[str, Any] = {}
        for raw_key, value in values.items():
            key = str(raw_key).lstrip("-").replace("-", "_")
            if key not in FLAG_BY_NAME:
                close = difflib.get_close_matches(key, list(FLAG_BY_NAME), n=1)
                hint = f"did you mean {FLAG_BY_NAME[close[0]].flag}? " if close else ""
                raise ConfigError(
                    "--" + key.replace("_", "-"),
                    value,
                    "unknown setting",
                    f"{hint}run `lifecycle explain --help` for the list of settings",
                    source=source,
                )
            kwargs[key] = value
        try:
            config = cls._from_kwargs(kwargs)
            if check_paths:
                config.check_paths()
        except ConfigError as exc:
            raise (exc.with_source(source) if source else exc) from None
        return config

    @classmethod
    def _from_kwargs(cls, kwargs: dict[str, Any]) -> LifecycleConfig:
        offload = kwargs.pop("offload", False)
        if offload is not None and _as_bool("offload", offload):
            kwargs["offload_rollout"] = True
            kwargs["offload_train"] = True
        return cls(**kwargs)

    @classmethod
    def from_namespace(cls, ns: argparse.Namespace | object, *, check_paths: bool = True) -> LifecycleConfig:
        """Build from an argparse Namespace -- ours or a miles/slime one with hundreds of other args."""
        values = {f.name: getattr(ns, f.name) for f in FLAGS if hasattr(ns, f.name)}
        return cls.from_mapping(values, check_paths=check_paths)

    @classmethod
    def from_file(cls, path: str | os.PathLike[str], *, check_paths: bool = True) -> LifecycleConfig:
        """Build from a TOML, YAML or JSON file (top level, or a ``[lifecycle]`` table)."""
        return cls.from_mapping(load_config_file(path), check_paths=check_paths, source=str(path))

    @classmethod
    def from_args(cls, argv: list[str] | None = None, *, check_paths: bool = True) -> LifecycleConfig:
        """Parse miles-style flags with a parser made by :func:`add_lifecycle_arguments`.

        A command line argparse rejects (unknown flag, missing value) raises :class:`UsageError`
        instead of argparse's ``SystemExit(2)``; a value the config rejects raises
        :class:`ConfigError`. ``-h``/``--help`` still prints the help and exits, as argparse does.
        """
        parser = RaisingParser(prog="lifecycle")
        add_lifecycle_arguments(parser)
        return cls.from_namespace(parser.parse_args(argv), check_paths=check_paths)

    def check_paths(self) -> None:
        """Check the files the config points at exist (separate, so specs can be explored offline)."""
        path = self.load_debug_rollout_data
        if path is None:
            return
        first = Path(path.format(rollout_id=0))
        if _has_rollout_id(path):
            if not first.parent.is_dir():
                raise ConfigError(
                    "--load-debug-rollout-data",
                    path,
                    f"the replay directory {str(first.parent)!r} does not exist",
                    "point it at the directory written by --save-debug-rollout-data",
                )
        elif not first.is_file():
            raise ConfigError(
                "--load-debug-rollout-data",
                path,
                "the replay file does not exist",
                "point it at a file written by --save-debug-rollout-data",
            )

    def emit_warnings(self) -> None:
        """Report resolution notes through Python's warnings (builders for users call this)."""
        for note in self.warnings:
            warnings.warn(note, ConfigWarning, stacklevel=2)


# `offload` is an input shorthand for two stored fields, so it is a flag without a field of its own.
OFFLOAD = _Flag("offload", "bool", False, "Shorthand for --offload-rollout --offload-train.")
_INPUT_ONLY = frozenset({OFFLOAD.name})
_KINDS: dict[object, str] = {bool: "bool", int: "int", float: "float"}


def _derive_flags() -> tuple[_Flag, ...]:
    """Every flag, from the fields that declare them (in field order; ``--offload`` after ``--colocate``)."""
    hints = get_type_hints(LifecycleConfig)
    flags: list[_Flag] = []
    for f in fields(LifecycleConfig):
        if "help" not in f.metadata:
            continue  # bookkeeping (warnings), not a setting
        args = get_args(hints[f.name])
        optional = type(None) in args
        base = next(a for a in args if a is not type(None)) if optional else hints[f.name]
        kind = f.metadata["kind"] or _KINDS[base]
        meta = f.metadata
        flags.append(_Flag(f.name, kind, f.default, meta["help"], optional, meta["choices"], meta["most"]))
        if f.name == "colocate":
            flags.append(OFFLOAD)
    return tuple(flags)


FLAGS: tuple[_Flag, ...] = _derive_flags()
FLAG_BY_NAME: dict[str, _Flag] = {f.name: f for f in FLAGS}


MAX_CONFIG_BYTES = 1024 * 1024  # a config of every setting is a few kB; a bigger file is not one


def _strict_yaml_loader(path: str) -> Any:
    """A PyYAML ``SafeLoader`` that refuses aliases and duplicate keys. An alias is how a 225-byte file
    ("billion laughs") stands for millions of items; a settings file has no use for one. Refused while
    composing, so the expansion is never built."""
    import yaml

    class Loader(yaml.SafeLoader):  # type: ignore[misc]  # PyYAML ships no type hints
        def compose_node(self, parent: Any, index: Any) -> Any:
            if self.check_event(yaml.AliasEvent):
                event = self.peek_event()
                mark = event.start_mark
                raise ConfigError(
                    "--config",
                    path,
                    f"line {mark.line + 1}: the YAML alias *{event.anchor} is not supported in a config file",
                    "write each value out instead of an &anchor and *alias",
                )
            return super().compose_node(parent, index)

        def construct_mapping(self, node: Any, deep: bool = False) -> Any:
            seen: set[object] = set()
            for key_node, _ in node.value:
                key = key_node.value if isinstance(key_node, yaml.ScalarNode) else id(key_node)
                if key in seen:
                    raise ConfigError(
                        "--config",
                        path,
                        f"line {key_node.start_mark.line + 1}: the key {bounded_repr(key)} is given twice "
                        "(YAML would keep only the last)",
                        "say each setting once",
                    )
                seen.add(key)
            return super().construct_mapping(node, deep=deep)

    return Loader


def _yaml_load(text: str, path: str) -> Any:
    """YAML text to Python values, aliases and duplicate keys refused (see :func:`_strict_yaml_loader`)."""
    try:
        loader = _strict_yaml_loader(path)(text)
    except ImportError:
        fix = "pip install 'rl-lifecycle[yaml]', or use TOML"
        raise ConfigError("--config", path, "YAML needs PyYAML", fix) from None
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()


def _settings_table(data: dict[str, Any], path: str) -> dict[str, Any]:
    """The settings of a parsed file: its top level, or its ``[lifecycle]`` table. Beside that table, other
    tools' tables (``[model]``) are left alone, but a plain top-level key -- a setting written above the
    ``[lifecycle]`` header, which TOML keeps outside the table -- or a table named nearly ``lifecycle`` was
    silently ignored: both are refused, with a did-you-mean."""
    table = data.get("lifecycle")
    nested = isinstance(table, dict)
    for raw, value in data.items():
        name = str(raw)
        if name == "lifecycle":
            continue
        if isinstance(value, dict):
            key = name.lstrip("-").replace("-", "_")
            if key not in FLAG_BY_NAME and difflib.get_close_matches(name.lower(), ["lifecycle"], n=1, cutoff=0.75):
                raise ConfigError(
                    "--config",
                    path,
                    f"the table [{bounded_repr(name)[1:-1]}] is not [lifecycle], so its settings would be ignored",
                    "did you mean [lifecycle]? rename the table",
                )
        elif nested:
            key = name.lstrip("-").replace("-", "_")
            close = difflib.get_close_matches(key, list(FLAG_BY_NAME), n=1)
            hint = f"did you mean {close[0]}? " if close and close[0] != key else ""
            raise ConfigError(
                "--config",
                path,
                f"the top-level key {bounded_repr(name)} is outside the [lifecycle] table, which holds the "
                "settings, so it would be ignored",
                f"{hint}move it into the [lifecycle] table (below its header), or delete it",
            )
    if isinstance(table, dict):
        return table
    return data


def load_config_file(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read a config file into a mapping; any problem is a ConfigError naming the file.

    Bounded (:data:`MAX_CONFIG_BYTES`, read through :mod:`lifecycle.decide.jsonio`) and strict: a key given twice
    (JSON, YAML; TOML refuses it itself), a YAML alias, a top-level key outside ``[lifecycle]`` are refused,
    never silently resolved."""
    from lifecycle.decide import jsonio

    if not str(path).strip():  # Path("") is ".", a directory: say what is wrong
        raise ConfigError("--config", str(path), "the path is empty", "pass a .toml, .yaml or .json file")
    p = Path(path)
    if p.is_dir():
        raise ConfigError("--config", str(p), "a directory, not a config file", "pass a .toml, .yaml or .json file")
    if not p.exists():
        raise ConfigError("--config", str(p), "the config file does not exist", "check the path")
    if not p.is_file():  # a device or a FIFO: reading it would never end, or block
        raise ConfigError("--config", str(p), "not a regular file", "pass a .toml, .yaml or .json file")
    suffix = p.suffix.lower()
    if suffix not in (".toml", ".yaml", ".yml", ".json"):
        raise ConfigError("--config", str(p), f"unknown file type {suffix!r}", "use .toml, .yaml or .json")
    try:
        text = jsonio.read_text(p, max_bytes=MAX_CONFIG_BYTES)
    except jsonio.JSONFileError as exc:  # too large, not UTF-8, permissions, I/O errors: never a traceback
        fix = (
            "save the file as UTF-8 text"
            if "UTF-8" in exc.problem
            else "a config holds a few settings: pass the right file"
            if "larger" in exc.problem
            else "check the file and its permissions"
        )
        raise ConfigError("--config", str(p), exc.problem, fix) from None
    text = text.removeprefix("\ufeff")  # a byte-order mark some editors write: not part of the settings
    try:
        if suffix == ".toml":
            import tomllib

            data: Any = tomllib.loads(text)
        elif suffix == ".json":
            data = jsonio.loads(text, source=p)  # duplicate keys, NaN and deep nesting refused
        else:
            data = _yaml_load(text, str(p))
    except ConfigError:
        raise
    except RecursionError:  # TOML and YAML parse nesting recursively
        raise ConfigError("--config", str(p), "nested too deeply", "write each setting as `key = value`") from None
    except jsonio.JSONFileError as exc:
        problem = f"cannot parse the file: it {exc.problem}"
        raise ConfigError("--config", str(p), problem, "fix the JSON there (each key once, finite numbers)") from None
    except Exception as exc:  # parser errors carry line numbers; keep them, drop the traceback
        raise ConfigError("--config", str(p), f"cannot parse the file: {exc}", "fix the syntax at that line") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(
            "--config", str(p), "the file does not hold a table of settings", "write settings as `key = value` lines"
        )
    return _settings_table(data, str(p))


class RaisingParser(argparse.ArgumentParser):
    """argparse, but a rejected command line raises :class:`UsageError` instead of printing the
    usage block and exiting, so the CLI reports it like any other bad input (one paragraph, exit 2)
    and a library caller gets an exception. Subparsers inherit the class (``add_subparsers`` uses
    ``type(self)``)."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(self.prog, message)


def add_lifecycle_arguments(parser: argparse.ArgumentParser, *, suppress_defaults: bool = False) -> None:
    """Add the lifecycle flags, with miles' names and defaults, to a user's own parser.

    Flags the parser already has (a miles parser defines most of them) are left alone, so this
    can be called on top of an existing training script's arguments.
    """
    existing = set(parser._option_string_actions)
    group = parser.add_argument_group("rl-lifecycle", "lifecycle flags (miles names)")
    for f in FLAGS:
        if f.flag in existing:
            continue
        default = argparse.SUPPRESS if suppress_defaults else f.default
        if f.kind == "bool":
            group.add_argument(f.flag, action="store_true", default=default, help=f.help)
        elif f.kind == "components":
            group.add_argument(f.flag, nargs="+", default=default, metavar="COMPONENT", help=f.help)
        elif f.kind == "addresses":
            group.add_argument(f.flag, nargs="+", default=default, metavar="HOST:PORT", help=f.help)
        elif f.kind == "path":
            group.add_argument(f.flag, default=default, metavar="PATH", help=f.help)
        elif f.kind == "choice":
            metavar = "{" + ",".join(f.choices) + "}"
            group.add_argument(f.flag, default=default, metavar=metavar, help=f"{f.help} (default {f.default})")
        else:
            shown = "" if f.default is None else f" (default {f.default})"
            group.add_argument(f.flag, default=default, metavar="N", help=f.help + shown)
