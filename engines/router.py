"""The real ``sglang-router`` (sgl-model-gateway) as a process the rollout manager owns, and its client.

Router membership is the lifecycle's publication boundary: an engine is added (``POST /workers``) by
the ``route_traffic`` effect of its move into ``Serving`` and removed (``DELETE /workers/{id}``) by
``stop_routing`` before it leaves. So the router must not make membership decisions of its own, and
it is started with all three of them off:

* ``--disable-health-check``: the lifecycle's health monitor probes engines; a router that dropped
  an engine on its own would disagree with the machine that says it is Serving;
* ``--disable-circuit-breaker``: an opened breaker silently stops traffic to a Serving engine;
* ``--disable-retries``: a failed request comes back to the rollout function, which reports the engine
  the router names (its error says ``URL: http://host:port/generate``) so the lifecycle marks it.

Both membership calls are asynchronous in the router (it queues a job), so each one waits, bounded,
until ``GET /workers`` shows the change; running out is a failed effect, which the core turns into
the engine being marked.
"""

from __future__ import annotations

import asyncio
import importlib.util
import re
import socket
import sys
import time
from pathlib import Path
from typing import Any

from engines.client import EngineClient
from engines.errors import EngineError, EngineHTTPError, EngineStartError
from engines.process import ServerProcess

ROUTER_ID = "router"
# The gateway names the upstream it could not reach: "... URL: http://127.0.0.1:31002/generate"
_UPSTREAM = re.compile(r"(https?://[^\s/\"]+)/")


def router_available() -> bool:
    """Whether the ``sglang-router`` wheel is installed (``pip install 'rl-lifecycle[router]'``)."""
    return importlib.util.find_spec("sglang_router") is not None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


PORT_TRIES = 3  # a router that exits before it answers is started again on another port, this often


def router_command(
    port: int, *, host: str = "127.0.0.1", request_timeout_s: float = 30.0, metrics_port: int | None = None
) -> list[str]:
    """``python -m sglang_router.launch_router`` with the lifecycle's settings (see the module docstring)."""
    return [
        sys.executable,
        "-m",
        "sglang_router.launch_router",
        "--host",
        host,
        "--port",
        str(port),
        "--policy",
        "round_robin",
        "--disable-health-check",
        "--disable-circuit-breaker",
        "--disable-retries",
        "--request-timeout-secs",
        str(max(1, int(request_timeout_s))),
        "--log-level",
        "warn",
        # its Prometheus exporter binds 29000 by default: two routers (or two jobs) would collide
        "--prometheus-host",
        host,
        "--prometheus-port",
        str(free_port() if metrics_port is None else metrics_port),
    ]


def upstream_of(error: EngineError) -> str | None:
    """The worker URL a router error names (the engine that failed), if it names one."""
    if isinstance(error, EngineHTTPError):
        match = _UPSTREAM.search(error.body)
        if match:
            return match.group(1)
    return None


class RouterClient(EngineClient):
    """The router speaks SGLang's ``/generate``; on top of it, its worker-management API."""

    async def workers(self, *, timeout: float | None = None) -> dict[str, str]:
        """Registered workers: URL -> the router's worker id."""
        data = self._json("/workers", await self._call("GET", "/workers", timeout=timeout))
        try:
            return {str(w["url"]).rstrip("/"): str(w["id"]) for w in data["workers"]}
        except (KeyError, TypeError) as exc:
            raise EngineError(self.engine_id, "/workers", f"unexpected answer {str(data)[:200]!r} ({exc})") from None

    async def add_worker(self, url: str, *, api_key: str | None = None, timeout: float | None = None) -> None:
        """``api_key``: the worker's; the router sends it on every request it forwards there."""
        body: dict[str, str] = {"url": url, **({"api_key": api_key} if api_key else {})}
        await self._call("POST", "/workers", body=body, send_body=True, timeout=timeout)

    async def remove_worker(self, worker_id: str, *, timeout: float | None = None) -> None:
        await self._call("DELETE", f"/workers/{worker_id}", timeout=timeout)


class Router:
    """One ``sglang-router`` process on 127.0.0.1: start (bounded), add/remove workers (bounded), kill."""

    def __init__(
        self,
        name: str = ROUTER_ID,
        *,
        startup_timeout: float = 30.0,
        request_timeout: float = 30.0,
        membership_timeout: float = 10.0,
        log_path: str | Path | None = None,
    ) -> None:
        self.name = name
        self.startup_timeout = startup_timeout
        self.request_timeout = request_timeout
        self.membership_timeout = membership_timeout
        self.log_path = log_path
        self.process: ServerProcess | None = None
        self.client: RouterClient | None = None
        self.url: str | None = None
        self.restarts = 0

    @property
    def alive(self) -> bool:
        """Started (its client ready) and its process running."""
        return self.client is not None and self.process is not None and self.process.alive

    async def start(self) -> str:
        """Spawn the router and wait until ``GET /workers`` answers; its URL. Raises :class:`EngineStartError`."""
        if not router_available():
            raise EngineStartError(
                self.name, "sglang-router is not installed: pip install 'rl-lifecycle[router]' (or use --no-router)"
            )
        if self.client is not None:  # not alive until the new process answers
            await self.client.close()
            self.client = None
        for attempt in range(PORT_TRIES):
            port = free_port()  # free when asked; another process may bind it before the router does
            url = f"http://127.0.0.1:{port}"
            command = router_command(port, request_timeout_s=self.request_timeout)
            self.process = ServerProcess(
                command,
                engine_id=self.name,
                url=url,
                health_path="/workers",
                log_path=self.log_path,
                die_with_parent=True,
            )
            self.process.spawn()  # from the event loop's thread: the router dies with the driver, never orphaned
            try:
                await asyncio.to_thread(self.process.wait_ready, self.startup_timeout)
                break
            except EngineStartError as exc:  # it exited before it answered: most likely the port was taken
                if exc.returncode is None or attempt == PORT_TRIES - 1:
                    raise
        self.url = url
        self.client = RouterClient(url, engine_id=self.name, timeout=self.request_timeout)
        return url

    async def restart(self) -> str:
        """A dead router comes back empty: the caller re-registers the engines that are Serving."""
        await self.kill()
        self.process = None
        self.restarts += 1
        return await self.start()

    def _client(self) -> RouterClient:
        if self.client is None or not self.alive:
            raise EngineError(self.name, None, "the router is not running")
        return self.client

    async def workers(self) -> dict[str, str]:
        return await self._client().workers(timeout=min(5.0, self.request_timeout))

    async def add(self, url: str, *, api_key: str | None = None) -> None:
        """Register ``url`` (with the key it requires, sent in the body: not on the router's command line)
        and wait (bounded) until the router lists it."""
        url = url.rstrip("/")
        client = self._client()
        if url not in await self.workers():
            await client.add_worker(url, api_key=api_key, timeout=min(5.0, self.request_timeout))
        await self._until(lambda listed: url in listed, f"{url} was not listed within")

    async def remove(self, url: str) -> None:
        """Unregister ``url`` and wait (bounded) until the router no longer lists it (a no-op if it does not)."""
        url = url.rstrip("/")
        client = self._client()
        listed = await self.workers()
        if url in listed:
            await client.remove_worker(listed[url], timeout=min(5.0, self.request_timeout))
        await self._until(lambda listed: url not in listed, f"{url} was still listed after")

    async def _until(self, done: Any, what: str) -> None:
        deadline = time.monotonic() + self.membership_timeout
        delay = 0.005
        while True:
            if done(await self.workers()):
                return
            if time.monotonic() > deadline:
                raise EngineError(self.name, "/workers", f"{what} {self.membership_timeout:g}s")
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.1)

    async def watch(self) -> str:
        """Wait until the router process exits; why (for the fault's report)."""
        process = self.process
        if process is None:
            return "never started"
        code = await asyncio.to_thread(process.wait_dead, None)
        return f"router exited with code {code}"

    async def kill(self) -> None:
        if self.process is not None and self.process.alive:
            self.process.kill()
            await asyncio.to_thread(self.process.wait_dead, 10.0)

    async def close(self) -> None:
        """Best effort, whatever the state."""
        try:
            await self.kill()
        finally:
            if self.client is not None:
                await self.client.close()
                self.client = None
