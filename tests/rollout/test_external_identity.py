"""External engines are what they are read to be, not what they are said to be (issue 41, causes 8 and 13).

Cause 8: a server that is not what ``--rollout-external-engine-addrs`` / ``--rollout-backend`` claim (a server
answering 200 ``{}`` to everything, one server listed twice, an SGLang-API server named ``vllm``, a key it
refuses) fails the start with ONE error naming the engine, the address, what was expected, what was found and
the fix -- not "the rollout servers did not start: rollout failed" with the cause only in the event log.

Case 13: an external server restarted by its owner at the same address comes back with its base weights. Its
process identity (SGLang's ``/server_info`` ``startup_time``; vLLM's ``process_start_time_seconds``) and served
version are read at attach and again at every boundary the lifecycle relies on them; a new process is news for
the core, which lets the old one go and attaches the new one as a new generation that catches up before it is
routed. The trainer never gets a sample of the base weights. The ``test_catches_*`` tests put the old
behaviour back and show the checks then fail.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")

from engines.api import SGLangAPI
from engines.engine import Engine, Timeouts
from engines.process import ServerProcess, torch_engine_command
from lifecycle.decide.core import Outcome
from lifecycle.observe.monitor import EventMonitor
from rollout.controller import ControllerError, InferenceController

from .test_external import FT, Job, _get, _start

FAST = Timeouts(startup=10.0, request=5.0)


class _Anything(BaseHTTPRequestHandler):
    """200 ``{}`` to every request, whatever the path or method."""

    def _answer(self) -> None:
        self.rfile.read(int(self.headers.get("content-length") or 0))
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", "2")
        self.end_headers()
        self.wfile.write(b"{}")

    def do_GET(self) -> None:
        self._answer()

    def do_POST(self) -> None:
        self._answer()

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def anything() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Anything)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.fixture
def server() -> Iterator[ServerProcess]:
    proc = _start()
    yield proc
    if proc.alive:
        proc.kill()


def _start_error(flags: dict[str, Any], urls: list[str], tmp: Path) -> str:
    job = Job(flags, urls, tmp, FAST)
    try:
        with pytest.raises(ControllerError) as info:
            job.run(job.manager.init(job.weights()))
    finally:
        job.close()
    return str(info.value)


# -- cause 8: not what it claims -------------------------------------------------------------------------------
def test_a_server_answering_200_to_everything_is_named_with_what_was_expected_and_found(
    anything: str, tmp_path: Path
) -> None:
    message = _start_error({}, [anything], tmp_path)
    assert message.startswith(f"the rollout servers did not start: engine-0 (external engine at {anything})")
    assert "expected an SGLang-API server" in message and "found an answer at /model_info" in message
    assert "Fix: point --rollout-external-engine-addrs at servers of --rollout-backend" in message
    assert "rollout failed" not in message


def test_one_server_listed_twice_under_two_addresses_is_refused(server: ServerProcess, tmp_path: Path) -> None:
    port = server.url.rsplit(":", 1)[1]
    urls = [f"http://127.0.0.1:{port}", f"http://localhost:{port}"]
    message = _start_error({}, urls, tmp_path)
    a, b = (urls[0], urls[1]) if "engine-0 (external" in message else (urls[1], urls[0])  # whichever came second
    assert f"(external engine at {a}): did not start: expected a server of its own" in message
    assert f"is attached to at {b}" in message
    assert "Fix: list each server once in --rollout-external-engine-addrs" in message
    assert server.alive, "an external server is never killed"


def test_an_sglang_server_named_vllm_is_named_as_one(server: ServerProcess, tmp_path: Path) -> None:
    message = _start_error({"rollout_backend": "vllm"}, [server.url], tmp_path)
    assert f"engine-0 (external engine at {server.url})" in message
    assert "expected a vLLM server started with VLLM_SERVER_DEV_MODE=1" in message
    assert "found HTTP 404 at /weight_info: it is an SGLang-API server" in message
    assert "Fix: use --rollout-backend sglang for it" in message


def test_a_server_that_refuses_the_key_is_named_with_the_variable_to_set(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("LIFECYCLE_ENGINE_API_KEY", raising=False)
    proc = ServerProcess(torch_engine_command(api_key="its-own-key"), engine_id="keyed")
    proc.start(60.0)
    try:
        message = _start_error({}, [proc.url], tmp_path)
    finally:
        proc.kill()
    assert f"engine-0 (external engine at {proc.url})" in message
    assert "found HTTP 401 (no key was given)" in message
    assert "Fix: set LIFECYCLE_ENGINE_API_KEY to the key the server was started with" in message


def test_an_engine_failing_after_it_answered_is_named_with_its_own_reason(
    server: ServerProcess, tmp_path: Path
) -> None:
    """Not only an engine that failed in ``Starting``: one whose first weights were refused is named too."""
    job = Job({}, [server.url], tmp_path, FAST)
    try:
        with pytest.raises(ControllerError) as info:
            job.run(job.manager.init((str(tmp_path / "missing"), "0")))
    finally:
        job.close()
    message = str(info.value)
    assert message.startswith(f"the rollout servers did not start: engine-0 (external engine at {server.url}, while")
    assert "missing" in message and "Fix: the server at" in message and "rollout failed" not in message


# -- case 13: a server replaced behind its address ---------------------------------------------------------------------
def _restart(servers: list[ServerProcess], i: int) -> None:
    """Its owner restarts the server at the same address: a new process, with its base weights."""
    port = int(servers[i].url.rsplit(":", 1)[1])
    servers[i].kill()
    servers[i].wait_dead(10.0)
    servers[i] = _start(port)


def _replaced_between_steps(servers: list[ServerProcess], tmp: Path, flags: dict[str, Any]) -> tuple[Job, list[Any]]:
    job = Job(flags, [p.url for p in servers], tmp)
    job.run(job.manager.init(job.weights()))
    job.run(job.manager.generate(0))
    job.run(job.runner.operate("update_weights"))  # version 1 committed, served by both
    _restart(servers, 1)
    assert _get(servers[1].url + "/model_info")["weight_version"] == "default"
    samples = job.run(job.manager.generate(1))
    return job, samples


@pytest.mark.parametrize("flags", [FT, {}], ids=["rollout-ft", "no-ft"])
def test_a_server_replaced_between_steps_is_caught_up_before_it_is_routed(
    servers: list[ServerProcess], tmp_path: Path, flags: dict[str, Any]
) -> None:
    job, samples = _replaced_between_steps(servers, tmp_path, flags)
    try:
        assert {s["weight_version"] for s in samples} == {"1"}, "a sample of the base weights"
        assert _get(servers[1].url + "/model_info")["weight_version"] == "1", "caught up before it was routed"
        moves = job.moves("engine-1")
        since = moves[len(moves) - 1 - moves[::-1].index("stop") :]
        assert since == ["stop", "confirm_dead", "start", "ready", "begin_update", "finish_update", "resume", "drain"]
        assert job.runner.state.engines[1].epoch == 2 and job.state(1) == "Quiesced"
        stop = next(e for e in job.events if e.get("instance") == "engine-1" and e.get("trigger") == "stop")
        assert "was replaced: another process answers there" in stop["reason"]
        assert job.manager.controller.replacements == {"engine-1": 1}
        monitor = EventMonitor(job.config)  # the log judges itself: the invariants hold through the replacement
        assert monitor.feed_all(list(job.events)) + monitor.finish() == []
    finally:
        job.close()
    assert all(p.alive for p in servers), "the job never kills an external server"


@pytest.mark.parametrize("flags", [FT, {}], ids=["monitor-sees-it", "no-monitor"])
def test_a_server_replaced_during_a_rollout_is_never_trained_on(
    servers: list[ServerProcess], tmp_path: Path, flags: dict[str, Any]
) -> None:
    """Restarted after it answered this rollout's requests: the rollout is generated again, on caught-up engines.
    Under rollout FT the health monitor's probe reads the new process while the rollout still runs; without a
    monitor the read after the rollout sees it."""
    job = Job(flags, [p.url for p in servers], tmp_path)
    try:
        job.run(job.manager.init(job.weights()))
        job.run(job.runner.operate("update_weights"))  # version 1
        executor = job.manager.executor
        real, calls = executor.rollout_fn, []
        assert real is not None

        async def restarted_after_answering(rollout_id: int, controller: InferenceController) -> Any:
            got = await real(rollout_id, controller)
            calls.append({s["weight_version"] for s in got})
            if len(calls) == 1:
                _restart(servers, 1)
                if flags:  # the monitor (probing every 1 s) sees the new process before the rollout returns
                    for _ in range(100):
                        if controller.replacements:
                            break
                        await asyncio.sleep(0.1)
                    assert controller.replacements == {"engine-1": 1}
            return got

        executor.rollout_fn = restarted_after_answering
        samples = job.run(job.manager.generate(0))
        assert len(calls) == 2 and {s["weight_version"] for s in samples} == {"1"}
        assert _get(servers[1].url + "/model_info")["weight_version"] == "1"
    finally:
        job.close()


def test_a_stale_replacement_report_moves_nothing(servers: list[ServerProcess], tmp_path: Path) -> None:
    """News about a generation the slot no longer has (reported twice, or late) is fenced like any news."""
    job, _ = _replaced_between_steps(servers, tmp_path, {})
    try:
        before = job.runner.state
        job.run(job.runner.report(Outcome("replaced", "rollout", 1, "late", epoch=1)))
        assert job.runner.state.engines == before.engines
        assert any(e.get("event") == "lifecycle.fenced" and e.get("news") == "replaced" for e in job.events)
    finally:
        job.close()


# -- the checks are needed: the old behaviour put back fails ---------------------------------------------------
def test_catches_an_external_engine_whose_identity_is_assumed(
    servers: list[ServerProcess], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without the re-read, the new process serves the step with its base weights, published as version 1."""

    async def assumed(self: Engine) -> str | None:
        return None

    monkeypatch.setattr(Engine, "replaced", assumed)
    job, samples = _replaced_between_steps(servers, tmp_path, {})
    job.close()
    assert "default" in {s["weight_version"] for s in samples}


def test_catches_an_attach_that_does_not_ask_what_answers(
    anything: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without the identity read at attach, a 200-to-everything server is attached and the start fails later,
    with nothing that says what was expected or found."""
    from engines.api import ServerFacts

    async def unasked(self: SGLangAPI, timeout: float) -> ServerFacts:
        return ServerFacts(None, None, None)

    monkeypatch.setattr(SGLangAPI, "identify", unasked)
    message = _start_error({}, [anything], tmp_path)
    assert "expected an SGLang-API server" not in message


def test_catches_a_start_failure_that_names_only_engines_failed_in_starting(
    server: ServerProcess, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The old rule (only engines marked while ``Starting`` named) loses an engine refused its first weights."""
    real = InferenceController.start_failure

    def starting_only(self: InferenceController, failed: Any) -> ControllerError:
        self.marked = {k: v for k, v in self.marked.items() if v == "Starting"}
        return real(self, failed)

    monkeypatch.setattr(InferenceController, "start_failure", starting_only)
    job = Job({}, [server.url], tmp_path, FAST)
    try:
        with pytest.raises(ControllerError) as info:
            job.run(job.manager.init((str(tmp_path / "missing"), "0")))
    finally:
        job.close()
    assert str(info.value) == "the rollout servers did not start: rollout failed"


def test_vllms_process_identity_is_read_from_its_prometheus_text() -> None:
    from engines.vllm.client import process_start_time

    text = "# HELP process_start_time_seconds Start time\nprocess_start_time_seconds 1.7965e+09\nvllm:x 1\n"
    assert process_start_time(text) == 1.7965e09
    assert process_start_time("vllm:num_requests_running 0\n") is None
    assert process_start_time("process_start_time_seconds NaNish\n") is None
