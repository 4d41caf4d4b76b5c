"""The gateway: SMG (``smg`` 1.13, the successor of sglang-router) as a process the rollout manager owns.

Gateway membership is the lifecycle's publication boundary: an engine is registered (``POST /workers``) by the
``route_traffic`` effect of its move into ``Serving`` and removed (``DELETE /workers/{id}``) by ``stop_routing``
before it leaves. SMG has its own worker state machine (``pending -> ready <-> not_ready -> failed``, and
``draining``), so "registered" is not "routable": registration waits, bounded, until SMG reports the worker
``ready``; removal waits until it is gone (it is ``draining`` -- routed nothing -- from the DELETE on). SMG must
make no membership or traffic decision of its own, so it is started with every one of them off:

* ``--disable-health-check``: the lifecycle's monitor probes engines; SMG's checks would move a worker the
  engine machine holds ``Serving`` to ``not_ready``/``failed`` on their own (a second, disagreeing machine);
* ``--disable-circuit-breaker``: an opened breaker silently stops traffic to a Serving engine;
* ``--disable-retries``: a failed request comes back to the rollout, which reports the engine SMG names (its
  error says ``URL: http://host:port/...``) so the lifecycle marks it; retries also make SMG parse and re-encode
  request bodies, which refuses token-id prompts on ``/v1/completions``;
* ``--disable-worker-overload-protection`` and ``--disable-load-monitoring``: on by default, they keep a busy
  worker (8 queued requests, 0.8 KV use) out of routing and poll every worker's ``/loads`` and ``/metrics``;
* ``--worker-startup-check-interval 1``: a worker not yet answering at registration is re-probed every second
  (the default, 30 s, would hold a recovered engine out of traffic for half a minute);
* each worker is registered with its ``runtime_type`` (no detection probes) and ``drain_settle_secs`` 0: SMG's
  drain is a fixed sleep for outside load balancers, and SMG's only client is this process (requests in flight
  complete either way); its ``weight_version`` label is the version the engine serves, read back as a fact.

SMG's stall/wedge/stale detectors veto nothing under ``round_robin`` (measured), and its RL control plane
(``--enable-rl``) is not used: weight updates and pauses go to the engines directly (README, "The gateway").
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import re
import socket
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engines.client import EngineClient
from engines.errors import EngineError, EngineHTTPError, EngineStartError
from engines.process import ServerProcess

ROUTER_ID = "router"
_KNOWN_ID = re.compile(r"with ID ([0-9a-fA-F-]{36})")  # SMG's 409 names the id of the worker it already has
# The gateway names the upstream it could not reach: "... URL: http://127.0.0.1:31002/generate"
_UPSTREAM = re.compile(r"(https?://[^\s/\"]+)/")


def router_available() -> bool:
    """Whether the ``smg`` wheel is installed (``pip install 'rl-lifecycle[router]'``)."""
    return importlib.util.find_spec("smg") is not None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


PORT_TRIES = 3  # a router that exits before it answers is started again on another port, this often


# SMG's own health checks, where a user keeps them on as a second detector (``health_checks=True``): /health every
# second, 2 failures to not_ready. Its verdict is news for the lifecycle, which decides (rollout.routing).
GATEWAY_MARGIN = 2.0  # seconds a gateway client waits beyond SMG's request bound (see Router.client_timeout)
HEALTH_CHECKS = ["--health-check-interval-secs", "1", "--health-check-timeout-secs", "1"]
HEALTH_CHECKS += ["--health-failure-threshold", "2", "--health-success-threshold", "1", "--health-check-endpoint"]
HEALTH_CHECKS += ["/health"]


def router_command(
    port: int,
    *,
    host: str = "127.0.0.1",
    request_timeout_s: float = 30.0,
    metrics_port: int | None = None,
    health_checks: bool = False,
    rl: bool = False,
) -> list[str]:
    """``python -m smg launch`` with the lifecycle's settings (see the module docstring)."""
    return [
        sys.executable,
        "-m",
        "smg",
        "launch",
        "--host",
        host,
        "--port",
        str(port),
        "--policy",
        "round_robin",
        *(HEALTH_CHECKS if health_checks else ["--disable-health-check"]),
        "--disable-circuit-breaker",
        "--disable-retries",
        "--disable-worker-overload-protection",
        "--disable-load-monitoring",
        "--worker-startup-check-interval",
        "1",
        "--request-timeout-secs",
        str(max(1, int(request_timeout_s))),
        "--log-level",
        "warn",
        # its Prometheus exporter binds 29000 by default: two routers (or two jobs) would collide
        "--prometheus-host",
        host,
        "--prometheus-port",
        str(free_port() if metrics_port is None else metrics_port),
        *(["--enable-rl"] if rl else []),  # SMG's RL control plane: only benchmarks/bench_fleet.py measures it
    ]


def upstream_of(error: EngineError) -> str | None:
    """The worker URL a router error names (the engine that failed), if it names one."""
    if isinstance(error, EngineHTTPError):
        match = _UPSTREAM.search(error.body)
        if match:
            return match.group(1)
    return None


@dataclass(frozen=True)
class GatewayWorker:
    """One worker as SMG sees it: routable only when ``status`` is ``ready``."""

    id: str
    url: str
    status: str  # pending | ready | not_ready | failed | draining
    weight_version: str | None  # its label (the version the engine served when it was registered)

    @property
    def routable(self) -> bool:
        return self.status == "ready"


def _worker(row: dict[str, Any]) -> GatewayWorker:
    version = (row.get("labels") or {}).get("weight_version")
    url = str(row["url"]).rstrip("/")
    return GatewayWorker(str(row["id"]), url, str(row["status"]), None if version is None else str(version))


class RouterClient(EngineClient):
    """The gateway speaks SGLang's ``/generate`` (and OpenAI's routes); on top of it, its worker-management API."""

    async def workers(self, *, timeout: float | None = None) -> dict[str, GatewayWorker]:
        """Every worker SMG lists (pending ones it does not): URL -> its view."""
        data = self._json("/workers", await self._call("GET", "/workers", timeout=timeout))
        try:
            return {str(w["url"]).rstrip("/"): _worker(w) for w in data["workers"]}
        except (KeyError, TypeError, AttributeError) as exc:
            raise EngineError(self.engine_id, "/workers", f"unexpected answer {str(data)[:200]!r} ({exc})") from None

    async def worker_status(self, worker_id: str, *, timeout: float | None = None) -> str | None:
        """One worker's status (``pending`` included); None once SMG no longer knows it (removed, or failed to
        register)."""
        try:
            data = self._json("/workers", await self._call("GET", f"/workers/{worker_id}", timeout=timeout))
        except EngineHTTPError as exc:
            if exc.status == 404:
                return None
            raise
        return str(data.get("status")) if isinstance(data, dict) else None

    async def add_worker(
        self,
        url: str,
        *,
        runtime: str,
        weight_version: str | None = None,
        api_key: str | None = None,
        timeout: float | None = None,
    ) -> str:
        """Queue the worker's registration; its id. ``api_key``: the worker's, sent on every request forwarded to
        it. A URL SMG already knows (409) answers the id it has."""
        body: dict[str, Any] = {"url": url, "runtime_type": runtime, "health": {"drain_settle_secs": 0}}
        if api_key:
            body["api_key"] = api_key
        if weight_version is not None:
            body["labels"] = {"weight_version": weight_version}
        try:
            data = self._json(
                "/workers", await self._call("POST", "/workers", body=body, send_body=True, timeout=timeout)
            )
        except EngineHTTPError as exc:
            known = _KNOWN_ID.search(exc.body) if exc.status == 409 else None
            if known is None:
                raise
            return known.group(1)
        return str(data["worker_id"])

    async def remove_worker(self, worker_id: str, *, timeout: float | None = None) -> None:
        await self._call("DELETE", f"/workers/{worker_id}", timeout=timeout)


class Router:
    """One SMG process on 127.0.0.1: start (bounded), add/remove workers (bounded, until SMG's state says so), kill."""

    def __init__(
        self,
        name: str = ROUTER_ID,
        *,
        startup_timeout: float = 30.0,
        request_timeout: float = 30.0,
        membership_timeout: float = 10.0,
        log_path: str | Path | None = None,
        health_checks: bool = False,
        rl: bool = False,
    ) -> None:
        self.name = name
        self.rl = rl
        self.health_checks = health_checks  # SMG's own checks on (a second detector): see HEALTH_CHECKS
        self.startup_timeout = startup_timeout
        self.request_timeout = request_timeout
        # what a client of the gateway waits: past SMG's own bound (whole seconds, --request-timeout-secs), so SMG's
        # answer -- a 504 naming the worker that did not answer -- arrives first; a client timing out at the same
        # instant learns no engine, and the hung one got the next round of requests too
        self.client_timeout = request_timeout + GATEWAY_MARGIN
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
                self.name, "smg (the gateway) is not installed: pip install 'rl-lifecycle[router]' (or use --no-router)"
            )
        if self.client is not None:  # not alive until the new process answers
            await self.client.close()
            self.client = None
        for attempt in range(PORT_TRIES):
            port = free_port()  # free when asked; another process may bind it before the router does
            url = f"http://127.0.0.1:{port}"
            command = router_command(
                port, request_timeout_s=self.request_timeout, health_checks=self.health_checks, rl=self.rl
            )
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

    async def workers(self) -> dict[str, GatewayWorker]:
        return await self._client().workers(timeout=min(5.0, self.request_timeout))

    async def add(
        self, url: str, *, runtime: str = "sglang", weight_version: str | None = None, api_key: str | None = None
    ) -> None:
        """Register ``url`` (with the key it requires, sent in the body: not on the gateway's command line) and
        wait (bounded) until SMG reports it ``ready``: registered is not routable, and the engine is ``Serving``
        only once it is."""
        url = url.rstrip("/")
        client = self._client()
        known = (await self.workers()).get(url)
        if known is not None and known.routable and known.weight_version == weight_version:
            return
        if known is not None:  # listed, but not ready or labelled with another version: register it afresh
            await self._remove(known.id, url)
        timeout = min(5.0, self.request_timeout)
        worker = await client.add_worker(
            url, runtime=runtime, weight_version=weight_version, api_key=api_key, timeout=timeout
        )
        try:
            await self._until(worker, lambda status: status == "ready", f"{url} was not ready within")
        except EngineError:  # SMG would go on probing it for half an hour, and route to it once it answers
            with contextlib.suppress(EngineError):
                await client.remove_worker(worker, timeout=timeout)
            raise

    async def remove(self, url: str) -> None:
        """Remove ``url`` and wait (bounded) until SMG no longer knows it (a no-op if it does not). From the
        DELETE on it is ``draining``: routed nothing, its requests in flight still answered."""
        url = url.rstrip("/")
        known = (await self.workers()).get(url)
        if known is not None:
            await self._remove(known.id, url)

    async def _remove(self, worker: str, url: str) -> None:
        await self._client().remove_worker(worker, timeout=min(5.0, self.request_timeout))
        await self._until(worker, lambda status: status is None, f"{url} was still known after")

    async def _until(self, worker: str, done: Any, what: str) -> None:
        client = self._client()
        deadline = time.monotonic() + self.membership_timeout
        delay = 0.005
        status: str | None = None
        while True:
            status = await client.worker_status(worker, timeout=min(5.0, self.request_timeout))
            if done(status):
                return
            if time.monotonic() > deadline:
                raise EngineError(self.name, "/workers", f"{what} {self.membership_timeout:g}s (status {status})")
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
