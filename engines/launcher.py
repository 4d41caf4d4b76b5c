"""Launchers: how an engine slot gets its server process.

:class:`LocalLauncher` runs the server as a child process of this one (tests, a laptop);
:class:`engines.actor.RayLauncher` runs it inside a Ray actor (placement across nodes, Ray's own
death detection). Both implement :class:`engines.engine.Launcher`, so the engine machine code is
the same for both, and for the CPU torch engine and real SGLang servers alike.
"""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Callable, Sequence

from engines.errors import EngineTimeout
from engines.process import ServerProcess

CommandFactory = Callable[[], Sequence[str]]


class ProcessControl:
    """kill / wait_dead / alive over a local :class:`ServerProcess` (shared by local launchers)."""

    process: ServerProcess | None

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

    async def server_pid(self) -> int | None:
        """Fault hook: the server pid (for a synchronous kill at an exact machine transition)."""
        return self.process.pid if self.process is not None and self.process.alive else None

    async def pause_server(self) -> int:
        """Fault hook: SIGSTOP the server's process group -- it hangs without dying."""
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
    ) -> None:
        self.engine_id = engine_id
        self.command = command
        self.startup_timeout = startup_timeout
        self.url = url
        self.health_path = health_path
        self.process: ServerProcess | None = None

    async def launch(self) -> str:
        self.process = ServerProcess(
            self.command(), engine_id=self.engine_id, url=self.url, health_path=self.health_path
        )
        return await asyncio.to_thread(self.process.start, self.startup_timeout)

    async def watch(self) -> str:
        """Return (with a reason) as soon as the process exits: death is seen at once, not at a probe."""
        proc = self.process
        if proc is None:
            return "never started"
        # no timeout: a blocking waitpid wakes the moment the child dies (a timeout would poll)
        code = await asyncio.to_thread(proc.wait_dead, None)
        return f"exit code {code}"
