"""Launchers: how an engine slot gets its server process.

:class:`LocalLauncher` runs the server as a child process of this one (tests, a laptop);
:class:`engines.actor.RayLauncher` runs it inside a Ray actor (placement across nodes, Ray's own
death detection); :class:`engines.sglang.SGLangBackend` runs a real SGLang server; :class:`ExternalLauncher`
attaches to one that something else started. All implement :class:`Launcher`, so the engine slot and the
fault injector call the same methods on each, for the CPU torch engine and real SGLang servers alike.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Protocol, runtime_checkable

from engines.apikey import given_api_key, key_env
from engines.errors import EngineError, EngineTimeout
from engines.process import ServerProcess, torch_engine_command

if TYPE_CHECKING:  # engines.api imports the HTTP client: `lifecycle --help` (which imports this) must not
    from engines.actor import Keep
    from engines.api import APIFactory

CommandFactory = Callable[[], Sequence[str]]
LauncherKind = Literal["ray", "local"]


class Launcher(Protocol):
    """Starts, watches and kills one engine server process; every method any caller uses is here.

    ``api`` is the API the server it starts speaks (what the engine slot talks to it with: its backend's,
    ``engines.backends``); ``api_key`` the key the server requires (None: none), which the slot sends."""

    api: APIFactory
    api_key: str | None

    async def launch(self) -> str:
        """Start the process; return its base URL once it listens."""
        ...

    async def kill(self) -> None:
        """SIGKILL the server process (idempotent); a Ray actor that hosts it stays."""
        ...

    async def wait_dead(self, timeout: float) -> bool:
        """True once the process is confirmed gone (bounded)."""
        ...

    def alive(self) -> bool:
        """Whether the process runs now (the launcher's own view, not an HTTP probe)."""
        ...

    async def watch(self) -> str:
        """Resolve, with a reason, as soon as the process exits: death is seen at once, not at a probe."""
        ...

    def shutdown(self) -> None:
        """Release what the launcher holds besides the process (a Ray actor); idempotent."""
        ...

    # -- fault hooks (the reliability matrix injects real faults through these) ---------------------
    async def info(self) -> dict[str, Any]:
        """Where the engine runs: ``server_pid``, ``alive`` and, for Ray, ``node_id`` / ``actor_pid``."""
        ...

    async def server_pid(self) -> int | None:
        """The server's pid on this machine, for a synchronous kill at an exact transition."""
        ...

    async def pause_server(self) -> int:
        """SIGSTOP the server's process group: it hangs without dying; the pid (-1: no process)."""
        ...

    def crash(self) -> None:
        """The whole engine dies at once (a Ray actor with its server; locally, the server process)."""
        ...


@runtime_checkable
class Watched(Protocol):
    """A launcher whose death watch runs in this process (a thread blocked in ``waitpid``): closing the engine ends
    it, so no watch is left pending when the caller closes its event loop."""

    async def unwatch(self, timeout: float) -> None:
        """Wait (bounded) for the death watch of a killed process to see the death; cancel it after the bound."""
        ...


@runtime_checkable
class Placed(Protocol):
    """A launcher whose process runs on a cluster node it can name (Ray's actors): a draining node's notice is
    mapped to the engines on it."""

    async def node_id(self) -> str | None:
        """The node its process runs on now (None: no process), bounded."""
        ...


@runtime_checkable
class Keepable(Protocol):
    """A launcher whose processes may outlive the driver (--detach-engines: Ray's detached actors): it launches
    the generation ``epoch`` names, and adopts the one a previous driver left running."""

    epoch: int | None

    async def adopt(self, epoch: int, server_pid: int | None) -> str:
        """Reach the kept process (bounded) and check it is the one the ledger names; its URL."""
        ...

    def kept_name(self) -> str:
        """The name the kept process is found by again (the ledger records it)."""
        ...


LauncherFactory = Callable[[str], Launcher]


@dataclass(frozen=True)
class EngineSetup:
    """What a job hands its backend's launchers (``engines.backends``): how the servers run, what they start
    from and require. A backend reads what it needs and ignores the rest."""

    kind: LauncherKind = "ray"
    seed: int = 0
    checkpoint: str | os.PathLike[str] | None = None  # the initial weights (a Hugging Face or a char model dir)
    api_key: str | None = None  # every server requires it (the run's key)
    device: str = "cpu"  # --rollout-device
    startup: float = 60.0  # seconds one server may take to start
    keep: Keep | None = None  # the servers outlive the driver (--detach-engines, Ray only)
    python: str | None = None  # the backend's own environment's python, where it has one (None: found)


def launcher_factory(
    kind: LauncherKind = "ray",
    command: CommandFactory | None = None,
    *,
    api_key: str | None = None,
    keep: Keep | None = None,
    api: APIFactory | None = None,
) -> LauncherFactory:
    """``engine_id -> Launcher`` for a rollout manager: the CPU torch engine (or ``command``) per slot.

    ``kind="ray"`` runs each server inside a Ray actor (Ray must be initialised), ``"local"`` as a
    child process of this one; ``api``: what the servers speak (SGLang's, as the CPU engine does).
    ``api_key``: every server requires it (handed over by environment, see :mod:`engines.apikey`), and the
    engine slot sends it. ``keep`` (an :class:`engines.actor.Keep`, Ray only):
    the engines outlive the driver (--detach-engines).
    """
    cmd: CommandFactory = command if command is not None else torch_engine_command
    if kind == "local":
        if keep is not None:
            raise ValueError("kept engines (--detach-engines) are Ray's detached actors: use the 'ray' launcher")
        return lambda engine_id: LocalLauncher(engine_id, cmd, api_key=api_key, api=api)
    if kind != "ray":
        raise ValueError(f"unknown launcher kind {kind!r}: use 'ray' or 'local'")
    from engines.actor import RayLauncher  # imports Ray: only for Ray launchers

    return lambda engine_id: RayLauncher(engine_id, cmd, api_key=api_key, keep=keep, api=api)


def _sglang_api() -> APIFactory:
    """SGLang's API, the default (imported at construction: this module is imported by ``lifecycle --help``)."""
    from engines.api import sglang_api

    return sglang_api


class ProcessControl:
    """The :class:`Launcher` methods over a local :class:`ServerProcess` (local and SGLang launchers)."""

    engine_id: str
    process: ServerProcess | None
    api_key: str | None = None
    _death: tuple[ServerProcess, asyncio.Future[int]] | None = None  # the one waitpid of the process

    async def kill(self) -> None:
        if self.process is not None and self.process.alive:
            self.process.kill()

    async def wait_dead(self, timeout: float) -> bool:
        if self.process is None:
            return True
        try:
            await asyncio.to_thread(self.process.wait_dead, timeout)
        except EngineTimeout:
            return False
        return True

    def alive(self) -> bool:
        return self.process is not None and self.process.alive

    async def watch(self) -> str:
        proc = self.process
        if proc is None:
            return "never started"
        # no timeout: a blocking waitpid wakes the moment the child dies (a timeout would poll); one thread per
        # process, shared by every watcher (a start-up's and the slot's), so cancelled watches hold no thread
        if self._death is None or self._death[0] is not proc:
            self._death = (proc, asyncio.ensure_future(asyncio.to_thread(proc.wait_dead, None)))
        code = await asyncio.shield(self._death[1])
        return proc.death(code)

    async def unwatch(self, timeout: float) -> None:
        death = self._death
        if death is None or death[1].done():
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(death[1]), timeout)
        if not death[1].done():  # a process that outlived its SIGKILL's bound: the thread is left to its waitpid
            death[1].cancel()
            await asyncio.sleep(0)  # the task takes its cancellation in this turn of the loop

    def shutdown(self) -> None:
        """Nothing beyond the process to release."""

    async def info(self) -> dict[str, Any]:
        pid = await self.server_pid()
        return {"engine_id": self.engine_id, "server_pid": pid, "alive": pid is not None}

    async def server_pid(self) -> int | None:
        return self.process.pid if self.process is not None and self.process.alive else None

    def crash(self) -> None:
        """Locally the server process is the whole engine."""
        if self.process is not None and self.process.alive:
            self.process.kill()

    async def pause_server(self) -> int:
        pid = await self.server_pid()
        if pid is None:
            return -1
        try:
            os.killpg(pid, signal.SIGSTOP)
        except PermissionError:
            os.kill(pid, signal.SIGSTOP)
        return pid


class LocalLauncher(ProcessControl):
    """A server process started from this process; blocking calls run in a worker thread."""

    def __init__(
        self,
        engine_id: str,
        command: CommandFactory,
        *,
        startup_timeout: float = 60.0,
        url: str | None = None,
        health_path: str = "/health",
        api_key: str | None = None,
        env: Mapping[str, str] | None = None,
        api: APIFactory | None = None,
    ) -> None:
        self.engine_id = engine_id
        self.api = api or _sglang_api()  # what the server speaks (the CPU engine: SGLang's)
        self.command = command
        self.startup_timeout = startup_timeout
        self.url = url
        self.health_path = health_path
        self.api_key = api_key  # the server requires it; the engine slot sends it
        self.env = dict(env or {})  # added to the server's environment (e.g. vLLM's VLLM_SERVER_DEV_MODE)
        self.process: ServerProcess | None = None

    async def launch(self) -> str:
        extra = {**self.env, **key_env(self.api_key)}
        env = {**os.environ, **extra} if extra else None
        self.process = ServerProcess(
            self.command(),
            engine_id=self.engine_id,
            url=self.url,
            health_path=self.health_path,
            die_with_parent=True,
            env=env,
        )
        self.process.spawn()  # from the event loop's thread: the server dies with the driver, never orphaned
        return await asyncio.to_thread(self.process.wait_ready, self.startup_timeout)


class ExternalLauncher:
    """An engine started outside the job (slime's ``--rollout-external-engine-addrs``): attached, never owned.

    ``launch`` hands the engine slot the address (the slot then waits, bounded, for ``/health_generate``);
    ``kill`` lets go of it -- the server keeps running, it is its owner's. Its death is seen by the health
    monitor's probes or a failed request, never by a process watcher, since there is no process here.
    """

    def __init__(self, engine_id: str, url: str, api_key: str | None = None, *, api: APIFactory | None = None) -> None:
        self.engine_id = engine_id
        self.api = api or _sglang_api()  # its --rollout-backend's: an external server is read, never told what it is
        self.url = url.rstrip("/")
        self.api_key = api_key if api_key is not None else given_api_key()  # its owner's key, if it has one
        self.attached = False

    async def launch(self) -> str:
        self.attached = True
        return self.url

    async def kill(self) -> None:
        self.attached = False  # let go: the process is not ours to kill

    async def wait_dead(self, timeout: float) -> bool:
        return not self.attached

    def alive(self) -> bool:
        return self.attached

    async def watch(self) -> str:
        await asyncio.Event().wait()  # no process to watch: probes and requests see a death
        return "unreachable"

    def shutdown(self) -> None:
        self.attached = False

    async def info(self) -> dict[str, Any]:
        return {"engine_id": self.engine_id, "server_pid": None, "alive": self.attached, "external": self.url}

    async def server_pid(self) -> int | None:
        return None

    async def pause_server(self) -> int:
        raise EngineError(self.engine_id, None, f"{self.url} was started outside the job: it is not paused from here")

    def crash(self) -> None:
        raise EngineError(self.engine_id, None, f"{self.url} was started outside the job: it is not crashed from here")
