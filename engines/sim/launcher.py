"""The simulated fleet as launchers: one ``python -m engines.sim`` process, each engine slot a launcher over it."""

from __future__ import annotations

import json
import sys
import urllib.request
from collections.abc import Mapping
from typing import Any

import aiohttp

from engines.api import APIFactory, sglang_api
from engines.errors import EngineError
from engines.launcher import Launcher
from engines.process import ServerProcess


class SimFleet:
    """The fleet process; :meth:`launcher` gives engine ``engine_id`` a slot of its own (first come, first served)."""

    def __init__(self, size: int, latency: Mapping[str, float] | None = None) -> None:
        cmd = [sys.executable, "-m", "engines.sim", "--engines", str(size)]
        for path, seconds in (latency or {}).items():
            cmd += ["--latency", f"{path}={seconds}"]
        self.size = size
        self.process = ServerProcess(cmd, engine_id="sim-fleet")
        self.control = self.process.start(30.0)
        self.slots: dict[str, int] = {}

    def launcher(self, engine_id: str) -> Launcher:
        if engine_id not in self.slots:
            if len(self.slots) >= self.size:
                raise EngineError(engine_id, None, f"the simulated fleet has {self.size} slots, all taken")
            self.slots[engine_id] = len(self.slots)
        return SimLauncher(engine_id, self.control, self.slots[engine_id])

    def calls(self) -> dict[str, dict[str, int]]:
        """Per slot, how often each path was called (what a benchmark or a test reads)."""
        with urllib.request.urlopen(f"{self.control}/calls", timeout=10) as resp:
            data: dict[str, dict[str, int]] = json.loads(resp.read())
        return data

    def memory_requests(self) -> dict[str, list[tuple[str, list[str] | None]]]:
        """Per slot, every memory request its server was asked, in order: (path, the body's ``tags``)."""
        with urllib.request.urlopen(f"{self.control}/memory", timeout=10) as resp:
            data: dict[str, list[list[Any]]] = json.loads(resp.read())
        return {slot: [(path, tags) for path, tags in asked] for slot, asked in data.items()}

    def peak(self, *, reset: bool = False) -> dict[str, int]:
        """Per slow path, the most requests the fleet answered at once (since the last reset)."""
        with urllib.request.urlopen(f"{self.control}/peak", timeout=10) as resp:
            data: dict[str, int] = json.loads(resp.read())
        if reset:
            request = urllib.request.Request(f"{self.control}/peak/reset", method="POST")
            with urllib.request.urlopen(request, timeout=10):
                pass
        return data

    def close(self) -> None:
        if self.process.alive:
            self.process.kill()


class SimLauncher:
    """:class:`engines.launcher.Launcher` over one slot of the fleet (its death is the fleet's to report)."""

    def __init__(self, engine_id: str, control: str, slot: int) -> None:
        self.engine_id, self.control, self.slot = engine_id, control, slot
        self.api: APIFactory = sglang_api  # the fleet's slots answer SGLang's API
        self.api_key: str | None = None
        self.up = False

    async def _post(self, action: str) -> Any:
        async with (
            aiohttp.ClientSession() as session,
            session.post(f"{self.control}/slots/{self.slot}/{action}", timeout=aiohttp.ClientTimeout(30)) as r,
        ):
            return await r.json()

    async def launch(self) -> str:
        answer = await self._post("start")
        self.up = True
        return str(answer["url"])

    async def kill(self) -> None:
        await self._post("kill")
        self.up = False

    async def wait_dead(self, timeout: float) -> bool:
        return not self.up

    def alive(self) -> bool:
        return self.up

    async def watch(self) -> str:
        url = f"{self.control}/slots/{self.slot}/watch"  # a long poll: the fleet answers when the slot dies
        async with aiohttp.ClientSession() as session, session.get(url, timeout=aiohttp.ClientTimeout(None)) as r:
            answer = await r.json()
        self.up = False
        return str(answer["reason"])

    def shutdown(self) -> None:
        """The fleet process is the owner's (:meth:`SimFleet.close`)."""

    async def info(self) -> dict[str, Any]:
        return {"engine_id": self.engine_id, "server_pid": None, "alive": self.up, "slot": self.slot}

    async def server_pid(self) -> int | None:
        return None

    async def pause_server(self) -> int:
        await self._post("hang")
        return -1

    def crash(self) -> None:
        request = urllib.request.Request(f"{self.control}/slots/{self.slot}/kill", method="POST")
        with urllib.request.urlopen(request, timeout=10):
            pass
        self.up = False
