"""The real SGLang backend: ``python -m sglang.launch_server`` as an engine slot's server process.

``SGLangServerArgs`` builds the command line from the lifecycle config (tensor parallel size from
``--rollout-num-gpus-per-engine``, ``--enable-memory-saver`` when rollout memory is offloaded, so
``/release_memory_occupation`` works). ``SGLangBackend`` is a :class:`engines.engine.Launcher`: it
runs that command with :class:`~engines.process.ServerProcess` and performs the start-up sequence
production RL systems (slime, miles) use: poll ``/health_generate`` until it answers 200 (a real
1-token generation, so the model is loaded and serving), then ``/flush_cache`` until it answers 200
(the queue is empty, so an offload or a weight update may follow). Every wait is bounded.

``sglang`` is an optional extra that needs a GPU host; it is looked up with
``importlib.util.find_spec`` and never imported here (the server runs in its own process).
``command_override=`` swaps the command for another server that speaks the same HTTP API (the CPU
torch engine in the tests), so the start-up sequence itself is exercised without a GPU.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import os
import sys
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from engines.api import APIFactory, sglang_api
from engines.client import EngineClient
from engines.errors import EngineError, EngineHTTPError, EngineStartError, EngineStartTimeout, EngineTimeout
from engines.launcher import ProcessControl
from engines.process import ServerProcess
from lifecycle.decide.config import LifecycleConfig
from lifecycle.decide.errors import ConfigError, LifecycleError

SGLANG_EXTRA = "pip install 'rl-lifecycle[sglang]'"
HEALTH_PATH = "/health_generate"
FLUSH_PATH = "/flush_cache"
# SGLang's own choices for --dtype.
DTYPES = ("auto", "half", "float16", "bfloat16", "float", "float32")
# HTTP answers that no amount of waiting fixes: a wrong key, or not an SGLang server.
_FATAL_STATUSES = frozenset({401, 403, 404})
# Flags SGLangServerArgs sets itself, aliases included, so extra_args cannot repeat one under another spelling.
_OWNED_FLAGS = frozenset(
    {
        "--model-path",
        "--model",
        "--host",
        "--port",
        "--tp-size",
        "--tp",
        "--tensor-parallel-size",
        "--mem-fraction-static",
        "--enable-memory-saver",
        "--api-key",
        "--admin-api-key",
        "--base-gpu-id",
        "--dtype",
        "--random-seed",
        "--enable-metrics",
        "--weight-version",
        "--skip-server-warmup",
    }
)


# -- availability ------------------------------------------------------------------------------------
class SGLangNotInstalled(LifecycleError, ImportError):
    """The SGLang backend was asked to start a server, but ``sglang`` is not installed here."""

    def __init__(self) -> None:
        super().__init__(
            "the SGLang backend needs the 'sglang' package, which is not installed in this Python "
            f"({sys.executable}). Install the extra on a GPU host: {SGLANG_EXTRA} "
            "(SGLang needs a CUDA GPU host; on a CPU-only machine use the CPU torch engine, python -m engines.cpu)."
        )


def sglang_available() -> bool:
    """True if ``sglang`` can be imported here; looks it up without importing it (importing is slow)."""
    try:
        return importlib.util.find_spec("sglang") is not None
    except (ImportError, ValueError):  # a broken or spec-less module already in sys.modules
        return "sglang" in sys.modules


def require_sglang() -> None:
    """Raise :class:`SGLangNotInstalled` (naming the extra) unless ``sglang`` is installed."""
    if not sglang_available():
        raise SGLangNotInstalled()


# -- the command line -----------------------------------------------------------------------------
def _flag_name(arg: str) -> str:
    return arg.split("=", 1)[0]


@dataclass(frozen=True)
class SGLangServerArgs:
    """The ``sglang.launch_server`` arguments this project sets; anything else goes in ``extra_args``.

    Validated at construction (a bad port or TP size is a :class:`ConfigError` naming the flag, not
    a server that dies later). The port must be fixed: the URL is needed before the server is up.
    """

    model_path: str
    port: int
    host: str = "127.0.0.1"
    tp_size: int = 1
    mem_fraction_static: float | None = None
    enable_memory_saver: bool = False
    api_key: str | None = field(default=None, repr=False)
    admin_api_key: str | None = field(default=None, repr=False)
    base_gpu_id: int | None = None
    dtype: str | None = None
    random_seed: int | None = None
    weight_version: str | None = None
    skip_server_warmup: bool = False
    extra_args: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.model_path, str) or not self.model_path.strip():
            raise ConfigError(
                "--model-path", self.model_path, "must be a non-empty path or model name", "pass model_path"
            )
        if not isinstance(self.host, str) or not self.host.strip():
            raise ConfigError("--host", self.host, "must be a non-empty address", "use e.g. 127.0.0.1 or 0.0.0.0")
        if not _is_int(self.port) or not 1 <= self.port <= 65535:
            raise ConfigError(
                "--port",
                self.port,
                "must be an integer in 1..65535",
                "pick a free port (0 is not allowed: the URL must be known before the server is up)",
            )
        if not _is_int(self.tp_size) or self.tp_size < 1:
            raise ConfigError(
                "--tp-size", self.tp_size, "must be an integer >= 1", "set --rollout-num-gpus-per-engine to 1 or more"
            )
        if self.mem_fraction_static is not None and (
            isinstance(self.mem_fraction_static, bool)
            or not isinstance(self.mem_fraction_static, int | float)
            or not 0 < self.mem_fraction_static < 1
        ):
            raise ConfigError(
                "--mem-fraction-static", self.mem_fraction_static, "must be a fraction in (0, 1)", "use e.g. 0.7"
            )
        if self.base_gpu_id is not None and (not _is_int(self.base_gpu_id) or self.base_gpu_id < 0):
            raise ConfigError("--base-gpu-id", self.base_gpu_id, "must be an integer >= 0", "use e.g. 0")
        if self.random_seed is not None and not _is_int(self.random_seed):
            raise ConfigError("--random-seed", self.random_seed, "must be an integer", "use e.g. 42")
        if self.dtype is not None and self.dtype not in DTYPES:
            raise ConfigError("--dtype", self.dtype, f"must be one of {', '.join(DTYPES)}", "use e.g. bfloat16")
        for name in ("api_key", "admin_api_key", "weight_version"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value):
                flag = "--" + name.replace("_", "-")
                raise ConfigError(flag, value, "must be a non-empty string", f"drop {flag} or give it a value")
        if isinstance(self.extra_args, str) or not all(isinstance(a, str) for a in self.extra_args):
            raise ConfigError(
                "extra_args", self.extra_args, "must be a sequence of strings", "split it: ['--log-level', 'info']"
            )
        object.__setattr__(self, "extra_args", tuple(self.extra_args))
        for arg in self.extra_args:
            if _flag_name(arg) in _OWNED_FLAGS:
                raise ConfigError(
                    "extra_args",
                    arg,
                    f"{_flag_name(arg)} is set by SGLangServerArgs itself",
                    "set the matching SGLangServerArgs field instead of repeating the flag",
                )

    @classmethod
    def from_config(
        cls,
        config: LifecycleConfig,
        model_path: str,
        port: int,
        *,
        host: str = "127.0.0.1",
        mem_fraction_static: float | None = None,
        api_key: str | None = None,
        admin_api_key: str | None = None,
        base_gpu_id: int | None = None,
        dtype: str | None = None,
        random_seed: int | None = None,
        weight_version: str | None = None,
        skip_server_warmup: bool = False,
        extra_args: Sequence[str] = (),
    ) -> SGLangServerArgs:
        """Arguments of one rollout engine: TP size and memory saver come from the lifecycle config."""
        return cls(
            model_path=model_path,
            port=port,
            host=host,
            tp_size=config.rollout_num_gpus_per_engine,
            mem_fraction_static=mem_fraction_static,
            enable_memory_saver=config.offload_rollout,
            api_key=api_key,
            admin_api_key=admin_api_key,
            base_gpu_id=base_gpu_id,
            dtype=dtype,
            random_seed=random_seed,
            weight_version=weight_version,
            skip_server_warmup=skip_server_warmup,
            extra_args=tuple(extra_args),
        )

    def command(self, python: str | None = None) -> list[str]:
        """``[python, "-m", "sglang.launch_server", "--model-path", ..., ...]`` with SGLang's flag spellings."""
        cmd = [python or sys.executable, "-m", "sglang.launch_server", "--model-path", self.model_path]
        cmd += ["--host", self.host, "--port", str(self.port), "--tp-size", str(self.tp_size)]
        cmd.append("--enable-metrics")  # /metrics sglang:num_running_reqs + num_queue_reqs: what a drain polls
        if self.mem_fraction_static is not None:
            cmd += ["--mem-fraction-static", repr(float(self.mem_fraction_static))]
        if self.enable_memory_saver:
            cmd.append("--enable-memory-saver")
        if self.api_key is not None:
            cmd += ["--api-key", self.api_key]
        if self.admin_api_key is not None:
            cmd += ["--admin-api-key", self.admin_api_key]
        if self.base_gpu_id is not None:
            cmd += ["--base-gpu-id", str(self.base_gpu_id)]
        if self.dtype is not None:
            cmd += ["--dtype", self.dtype]
        if self.random_seed is not None:
            cmd += ["--random-seed", str(self.random_seed)]
        if self.weight_version is not None:
            cmd += ["--weight-version", self.weight_version]
        if self.skip_server_warmup:
            cmd.append("--skip-server-warmup")
        return cmd + list(self.extra_args)

    @property
    def url(self) -> str:
        """Where a client on this host reaches the server (a wildcard bind is reached via loopback)."""
        host = {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(self.host, self.host)
        if ":" in host and not host.startswith("["):
            host = f"[{host}]"
        return f"http://{host}:{self.port}"


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


# -- the launcher -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class StartupStep:
    """One start-up call and its outcome (``"200"``, ``"HTTP 503"``, ``"unreachable"``, ``"timeout"``)."""

    endpoint: str
    outcome: str
    elapsed: float

    @property
    def ok(self) -> bool:
        return self.outcome == "200"


class SGLangStartTimeout(EngineStartTimeout):
    """The server did not pass the start-up sequence in time; says which step and its last answer."""

    def __init__(self, engine_id: str, timeout: float, endpoint: str, last: str, *, output: str = "") -> None:
        self.timeout = timeout
        self.waiting_for = endpoint
        self.last = last
        self.returncode = None
        self.output = output
        tail = f"\n--- last output ---\n{output}" if output else ""
        # EngineError directly: the EngineStartError/EngineTimeout __init__ chain does not compose.
        EngineError.__init__(
            self,
            engine_id,
            "start",
            f"{endpoint} did not answer 200 within {timeout:g}s (last: {last}); process killed{tail}",
        )


class SGLangBackend(ProcessControl):
    """An engine slot's launcher for one SGLang server (``engines.engine.Launcher``).

    ``launch()`` spawns the server, then polls ``/health_generate`` and ``/flush_cache`` (each
    attempt is appended to ``startup_log``) within ``startup_timeout`` seconds in total. Any
    failure, or cancellation, kills the process: a half-started server never outlives its launch.
    """

    def __init__(
        self,
        engine_id: str,
        args: SGLangServerArgs,
        *,
        startup_timeout: float = 600.0,
        probe_timeout: float = 30.0,
        poll_interval: float = 1.0,
        python: str | None = None,
        env: Mapping[str, str] | None = None,
        log_path: str | os.PathLike[str] | None = None,
        command_override: Callable[[], Sequence[str]] | None = None,
    ) -> None:
        for name, value in (
            ("startup_timeout", startup_timeout),
            ("probe_timeout", probe_timeout),
            ("poll_interval", poll_interval),
        ):
            if not value > 0:
                raise ValueError(f"engine {engine_id}: {name} must be > 0 seconds, got {value!r}")
        self.engine_id = engine_id
        self.api: APIFactory = sglang_api
        self.args = args
        self.startup_timeout = startup_timeout
        self.probe_timeout = probe_timeout
        self.poll_interval = poll_interval
        self.python = python
        self.env = env
        self.log_path = log_path
        self.command_override = command_override
        self.process: ServerProcess | None = None
        self.startup_log: list[StartupStep] = []

    @property
    def url(self) -> str:
        return self.args.url

    @property
    def admin_key(self) -> str | None:
        """The key admin endpoints (``/flush_cache``) accept: the admin key if set, else the API key."""
        return self.args.admin_api_key or self.args.api_key

    def command_factory(self) -> list[str]:
        """The command to run (the override's, if any); also what a RayLauncher runs in its actor."""
        if self.command_override is not None:
            return list(self.command_override())
        return self.args.command(self.python)

    def launcher_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for ``engines.actor.RayLauncher(engine_id, **...)`` (it waits on /health_generate)."""
        return {
            "command": self.command_factory,
            "startup_timeout": self.startup_timeout,
            "url": self.url,
            "health_path": HEALTH_PATH,
        }

    # -- Launcher --------------------------------------------------------------------------------
    async def launch(self) -> str:
        """Spawn the server and run the start-up sequence; the base URL once it serves with an empty queue."""
        if self.command_override is None:
            require_sglang()
        if self.process is not None and self.process.alive:  # a relaunch must not leave the old one behind
            self.process.kill()
            await asyncio.to_thread(self._reap, self.process)
        self.startup_log = []
        self.process = ServerProcess(
            self.command_factory(),
            engine_id=self.engine_id,
            url=self.url,
            env=self.env,
            log_path=self.log_path,
            health_path=HEALTH_PATH,
        )
        self.process.spawn()
        try:
            await self._startup(self.process)
        except BaseException:  # failure or cancellation (an outer wait_for): no half-started server stays
            self.process.kill()
            await asyncio.to_thread(self._reap, self.process)
            raise
        return self.url

    async def watch(self) -> str:
        """Return (with a reason) once the process exits; polls, so cancelling it leaves no thread behind."""
        proc = self.process
        if proc is None:
            return "never started"
        while proc.alive:
            await asyncio.sleep(0.1)
        return proc.death(proc.wait_dead(1.0))

    # -- start-up sequence ---------------------------------------------------------------------------
    @staticmethod
    def _reap(proc: ServerProcess) -> None:
        with contextlib.suppress(EngineError):
            proc.wait_dead(10.0)

    async def _startup(self, proc: ServerProcess) -> None:
        start = time.monotonic()
        deadline = start + self.startup_timeout
        async with EngineClient(
            self.url, engine_id=self.engine_id, api_key=self.admin_key, timeout=self.probe_timeout
        ) as client:
            for endpoint in (HEALTH_PATH, FLUSH_PATH):
                call: Callable[..., Awaitable[object]] = (
                    client.health_generate if endpoint == HEALTH_PATH else client.flush_cache
                )
                while True:
                    if not proc.alive:
                        raise EngineStartError(
                            self.engine_id,
                            f"process exited with code {proc.returncode} before {endpoint} answered 200",
                            returncode=proc.returncode,
                            output=proc.output_tail(),
                        )
                    remaining = deadline - time.monotonic()
                    outcome = await self._attempt(call, max(0.01, min(self.probe_timeout, remaining)))
                    self.startup_log.append(StartupStep(endpoint, outcome, time.monotonic() - start))
                    if outcome == "200":
                        break
                    if outcome in {f"HTTP {s}" for s in _FATAL_STATUSES}:
                        raise EngineStartError(
                            self.engine_id,
                            f"{endpoint} answered {outcome}: not an SGLang server, or the wrong "
                            "api_key/admin_api_key (admin endpoints take the admin key when one is set)",
                            output=proc.output_tail(),
                        )
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        raise SGLangStartTimeout(
                            self.engine_id, self.startup_timeout, endpoint, outcome, output=proc.output_tail()
                        )
                    await asyncio.sleep(min(self.poll_interval, remaining))

    @staticmethod
    async def _attempt(call: Callable[..., Awaitable[object]], timeout: float) -> str:
        try:
            await call(timeout=timeout)
        except EngineHTTPError as exc:
            return f"HTTP {exc.status}"
        except EngineTimeout:
            return "timeout"
        except EngineError:
            return "unreachable"
        return "200"

    def __repr__(self) -> str:
        return f"SGLangBackend({self.engine_id!r}, {self.url}, process={self.process!r})"
