"""Every Ray call of the engines package, in one place (as Ray Serve's ActorReplicaWrapper).

An :class:`EngineActor` owns one engine server process; :class:`RayLauncher` is the engine
slot's handle on it. Fault hooks (``kill_server``: the HTTP server dies while the actor lives;
``crash``: the actor process itself dies) serve fault injection. ``watch()`` resolves the moment
the server process exits -- or raises when the actor dies -- so death is detected from Ray
itself, not at the next health probe.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import ray
from ray.exceptions import GetTimeoutError, RayActorError

from engines.errors import EngineStartError
from engines.process import ServerProcess


@ray.remote(num_cpus=0, max_restarts=0, max_concurrency=8)
class EngineActor:
    """Runs in its own Ray worker process; the server is a child process of the actor."""

    def __init__(self, engine_id: str) -> None:
        self.engine_id = engine_id
        self.process: ServerProcess | None = None

    def start(self, command: Sequence[str], timeout: float, url: str | None, health_path: str) -> str:
        if self.process is not None and self.process.alive:
            self.process.kill()
            self.process.wait_dead(10.0)
        self.process = ServerProcess(command, engine_id=self.engine_id, url=url, health_path=health_path)
        return self.process.start(timeout)

    def info(self) -> dict[str, Any]:
        ctx = ray.get_runtime_context()
        return {
            "engine_id": self.engine_id,
            "node_id": ctx.get_node_id(),
            "actor_pid": os.getpid(),
            "server_pid": self.process.pid if self.process else None,
            "alive": bool(self.process and self.process.alive),
        }

    def alive(self) -> bool:
        return bool(self.process and self.process.alive)

    def kill_server(self) -> None:
        """SIGKILL the server process; the actor stays (fault: HTTP server death with a live actor)."""
        if self.process is not None:
            self.process.kill()

    def wait_dead(self, timeout: float) -> bool:
        if self.process is None:
            return True
        try:
            self.process.wait_dead(timeout)
        except Exception:
            return False
        return True

    def watch(self) -> str:
        """Block until the server process exits; the reason."""
        if self.process is None:
            return "never started"
        return f"exit code {self.process.wait_dead(None)}"  # blocking waitpid: no polling

    def crash(self) -> None:
        """The actor process dies (fault: actor/node loss); its server goes with it."""
        if self.process is not None:
            self.process.kill()
        os._exit(1)


class RayLauncher:
    """An engine slot's handle on its actor. All Ray calls go through here."""

    def __init__(
        self,
        engine_id: str,
        command: Any,
        *,
        startup_timeout: float = 60.0,
        url: str | None = None,
        health_path: str = "/health",
        options: dict[str, Any] | None = None,
    ) -> None:
        self.engine_id = engine_id
        self.command = command
        self.startup_timeout = startup_timeout
        self.url = url
        self.health_path = health_path
        self.options = dict(options or {})
        self.actor: Any = None
        self._alive = False

    def _ensure_actor(self) -> Any:
        if self.actor is None:
            self.actor = EngineActor.options(name=None, **self.options).remote(self.engine_id)
        return self.actor

    async def launch(self) -> str:
        actor = self._ensure_actor()
        try:
            url = await actor.start.remote(list(self.command()), self.startup_timeout, self.url, self.health_path)
        except RayActorError as exc:
            self.actor = None
            raise EngineStartError(self.engine_id, f"engine actor died while starting: {exc}") from None
        except ray.exceptions.RayTaskError as exc:
            cause = exc.cause if isinstance(getattr(exc, "cause", None), Exception) else exc
            raise EngineStartError(self.engine_id, str(cause)) from None
        self._alive = True
        return str(url)

    async def kill(self) -> None:
        if self.actor is None:
            return
        try:
            await self.actor.kill_server.remote()
        except RayActorError:
            self.actor = None

    async def wait_dead(self, timeout: float) -> bool:
        if self.actor is None:
            return True
        try:
            return bool(await self.actor.wait_dead.remote(timeout))
        except RayActorError:
            self.actor = None
            return True

    def alive(self) -> bool:
        if self.actor is None:
            return False
        try:
            return bool(ray.get(self.actor.alive.remote(), timeout=5.0))
        except (RayActorError, GetTimeoutError):
            return False

    async def watch(self) -> str:
        """Resolves when the server process exits, or when Ray reports the actor dead."""
        if self.actor is None:
            return "no actor"
        try:
            return str(await self.actor.watch.remote())
        except RayActorError as exc:
            self.actor = None
            return f"actor died: {type(exc).__name__}"

    async def info(self) -> dict[str, Any]:
        return dict(await self._ensure_actor().info.remote())

    async def kill_server(self) -> None:
        """Fault hook: the server dies, the actor lives."""
        await self.kill()

    def crash_actor(self) -> None:
        """Fault hook: the actor process dies (fire and forget)."""
        if self.actor is not None:
            self.actor.crash.remote()

    def shutdown(self) -> None:
        if self.actor is not None:
            try:
                ray.kill(self.actor, no_restart=True)
            finally:
                self.actor = None


def init_local_cluster(num_cpus: int = 2, address: str | None = None) -> None:
    """Start (or connect to) Ray once; a small local cluster by default."""
    if ray.is_initialized():
        return
    if address:
        ray.init(address=address, include_dashboard=False, log_to_driver=False)
    else:
        ray.init(num_cpus=num_cpus, include_dashboard=False, log_to_driver=False)
