"""The engine as an OS process: api-key protection, start-up errors, SIGKILL and SIGTERM; ServerProcess itself."""

from __future__ import annotations

import asyncio
import os
import socket
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from engines.client import EngineClient
from engines.errors import EngineStartError, EngineStartTimeout, EngineTimeout, EngineUnreachable
from engines.models import ModelConfig, TinyCausalLM
from engines.process import ServerProcess, torch_engine_command
from engines.protocol import SamplingParams, UnauthorizedBody

KEY = "s3cret-key"  # the keyed engine's (conftest.ENGINE_SPECS)
OPEN_PREFIXES = ("/health", "/ready", "/metrics")


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def _listening_port() -> tuple[socket.socket, int]:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(1)
    return sock, int(sock.getsockname()[1])


# -- api key ----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def keyed(keyed_engine) -> ServerProcess:
    return keyed_engine


@pytest.mark.recovery
@pytest.mark.monitor
def test_api_key_guards_every_lifecycle_path_but_health(support, keyed, contracts):
    """Every one of SGLang's 20 lifecycle paths, every method, without a key: 401 unless always open."""
    paths = contracts.endpoints["endpoints"]
    calls = [(m, p) for p, e in sorted(paths.items()) for m in e["methods"]]

    async def main() -> dict[str, Any]:
        out: dict[str, Any] = {"anon": [], "wrong": []}
        for method, path in calls:
            body: dict[str, Any] | None = None if method == "GET" else {}
            out["anon"].append((method, path, *await support.raw(keyed.url, method, path, body=body)))
        for method, path in (("POST", "/generate"), ("GET", "/model_info"), ("POST", "/flush_cache")):
            headers = {"Authorization": "Bearer wrong"}
            out["wrong"].append(await support.raw(keyed.url, method, path, body={}, headers=headers))
        async with EngineClient(keyed.url, engine_id="keyed", api_key=KEY) as client:
            out["info"] = await client.model_info()
            out["gen"] = await client.generate("Hi", sampling_params=SamplingParams(max_new_tokens=3))
            await client.pause_generation("in_place")
            await client.continue_generation()
            out["flush"] = await client.flush_cache()
            out["state"] = await support.internal_state(client)
        return out

    out = run(main())
    assert len(paths) == 20
    for method, path, status, text in out["anon"]:
        if path.startswith(OPEN_PREFIXES):
            assert status == 200, f"{method} {path} must stay open"
        else:
            assert status == 401, f"{method} {path} answered {status} without the key"
            UnauthorizedBody.model_validate_json(text)
    assert {path for _, path, status, _ in out["anon"] if status == 200} == {"/health", "/health_generate", "/ready"}
    assert [status for status, _ in out["wrong"]] == [401, 401, 401]
    assert out["info"].weight_version == "default" and out["gen"].meta_info.completion_tokens == 3
    assert out["flush"].startswith("Cache flushed.")
    assert out["state"]["weights_resident"] and not out["state"]["paused"]  # no anonymous call took effect


# -- start-up errors ------------------------------------------------------------------------------------


def test_a_taken_port_is_one_line_and_exit_2():
    sock, port = _listening_port()
    try:
        proc = ServerProcess(torch_engine_command(port=port), engine_id="taken")
        with pytest.raises(EngineStartError) as info:
            proc.start(timeout=30)
    finally:
        sock.close()
    err = info.value
    assert err.returncode == 2 and not proc.alive
    assert err.output.strip().splitlines() == [
        f"lifecycle-torch-engine: error: --port {port}: 127.0.0.1:{port} is already in use; "
        "Fix: use --port 0 for a free one"
    ]
    assert "exited with code 2 before it was ready" in str(err)


def test_a_missing_weights_file_is_one_line_and_exit_2(tmp_path):
    proc = ServerProcess(torch_engine_command(weights=tmp_path / "nope.safetensors"), engine_id="nofile")
    with pytest.raises(EngineStartError) as info:
        proc.start(timeout=30)
    assert info.value.returncode == 2
    assert info.value.output.strip().splitlines() == [
        f"lifecycle-torch-engine: error: --weights: {tmp_path / 'nope.safetensors'}: no such file or directory; "
        "Fix: give a checkpoint directory (config.json + model.safetensors)"
    ]


def test_wrong_shape_weights_at_start_are_one_line_and_exit_2(tmp_path, capsys):
    """The engine's start path, run in this process (the same code the CLI runs after binding)."""
    from engines.cpu.app import run as serve
    from engines.cpu.cli import bind, build_parser

    wide = ModelConfig("wide", d_model=64, n_layers=2, n_heads=2, max_seq_len=256)
    path = TinyCausalLM(wide, seed=0).save_pretrained(tmp_path / "wide")
    args = build_parser().parse_args(["--port", "0", "--weights", str(path)])
    sock = bind("127.0.0.1", 0)
    try:
        assert serve(sock, args) == 2
    finally:
        sock.close()
    assert capsys.readouterr().err.strip().splitlines() == [
        f"lifecycle-torch-engine: error: --weights: weights file {path / 'model.safetensors'}: "
        "tensor 'tok_emb.weight': "
        "shape (100, 64) does not match the model's (100, 32)"
    ]


def test_bad_flags_exit_2():
    for flags in (["--port", "70000"], ["--model-size", "huge"], ["--step-delay-s", "-1"]):
        proc = ServerProcess([sys.executable, "-m", "engines.cpu", *flags], engine_id="flags")
        with pytest.raises(EngineStartError) as info:
            proc.start(timeout=30)
        assert info.value.returncode == 2 and "error:" in info.value.output


# -- process death ---------------------------------------------------------------------------------------------


def test_sigkill_is_a_real_death_and_sigterm_aborts_in_flight_requests(support, doomed_engines):
    victim, graceful = doomed_engines
    try:

        async def main() -> dict[str, Any]:
            out: dict[str, Any] = {}
            async with EngineClient(victim.url, engine_id="victim", timeout=5.0) as client:
                await client.health()  # a pooled keep-alive connection exists when the process dies
                victim.kill()
                out["rc"] = victim.wait_dead(5.0)
                out["alive"] = victim.alive
                for name, call in (("health", client.health), ("generate", lambda: client.generate("x"))):
                    try:
                        await call()
                    except Exception as exc:
                        out[name] = exc
            async with EngineClient(graceful.url, engine_id="graceful", timeout=10.0) as client:
                long = SamplingParams(max_new_tokens=200, temperature=0.0, ignore_eos=True)
                task = asyncio.create_task(client.generate("Hi", sampling_params=long))

                async def in_flight() -> bool:
                    return bool((await support.internal_state(client))["num_running_reqs"] == 1)

                await support.wait_for(in_flight, what="an in-flight request")
                graceful.terminate()
                out["aborted"] = await task
                out["term_rc"] = await asyncio.to_thread(graceful.wait_dead, 10.0)
            return out

        out = run(main())
    finally:
        for proc in (victim, graceful):
            proc.kill()
    assert out["rc"] == -9 and out["alive"] is False
    for name in ("health", "generate"):
        exc = out[name]
        assert isinstance(exc, EngineUnreachable), f"{name}: {exc!r}"
        assert exc.engine_id == "victim" and exc.endpoint == f"/{name}"
    reason = out["aborted"].meta_info.finish_reason
    assert reason.type == "abort" and "shutting down" in reason.message
    assert out["term_rc"] == 0


# -- ServerProcess on plain commands -----------------------------------------------------------------------


def test_start_timeout_kills_the_process_and_says_what_it_printed():
    cmd = [sys.executable, "-c", "import time; print('booting slowly', flush=True); time.sleep(60)"]
    proc = ServerProcess(cmd, engine_id="slow")
    with pytest.raises(EngineStartTimeout) as info:
        proc.start(timeout=1.0)
    assert isinstance(info.value, EngineTimeout) and isinstance(info.value, EngineStartError)
    assert "not ready within 1s" in str(info.value) and "booting slowly" in info.value.output
    assert not proc.alive


def test_exit_before_ready_reports_code_and_output():
    cmd = [sys.executable, "-c", "import sys; print('no GPU found', file=sys.stderr); sys.exit(3)"]
    proc = ServerProcess(cmd, engine_id="crash")
    with pytest.raises(EngineStartError) as info:
        proc.start(timeout=10)
    assert info.value.returncode == 3 and "no GPU found" in info.value.output
    assert str(info.value).startswith("engine crash start: process exited with code 3 before it was ready")


@pytest.mark.recovery
@pytest.mark.monitor
def test_ready_by_health_when_the_url_is_known(tmp_path):
    """The SGLang path: no READY line, the URL is known, readiness is GET <health_path> == 200."""
    sock, port = _listening_port()
    sock.close()
    url = f"http://127.0.0.1:{port}"
    cmd = [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1", "--directory", str(tmp_path)]
    log = tmp_path / "server.log"
    proc = ServerProcess(cmd, engine_id="http", url=url, health_path="/", log_path=log)
    try:
        assert proc.start(timeout=20) == url and proc.url == url and proc.alive and proc.pid > 0
        proc.terminate()
        assert proc.wait_dead(5) == -15 and not proc.alive
    finally:
        proc.kill()
    assert log.exists()


def test_kill_takes_the_whole_process_group_and_wait_dead_is_bounded():
    script = "sleep 60 & echo child $!; echo READY http://127.0.0.1:9; wait"
    proc = ServerProcess(["sh", "-c", script], engine_id="group")
    assert proc.start(timeout=10) == "http://127.0.0.1:9"
    child = int(next(line.split()[1] for line in proc.output_tail().splitlines() if line.startswith("child")))
    with pytest.raises(EngineTimeout, match="still alive"):
        proc.wait_dead(0.1)
    proc.kill()
    assert proc.wait_dead(5) == -9
    deadline = time.monotonic() + 5
    while _running(child) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not _running(child), "the server's own child survived kill()"


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    status = Path(f"/proc/{pid}/status")
    return not (status.exists() and "\nState:\tZ" in status.read_text())


def test_torch_engine_command_line():
    cmd = torch_engine_command(
        8123, 4, api_key="k", weights="/w.safetensors", weight_version="v1", model_size="small", step_delay_s=0.5
    )
    assert cmd[:3] == [sys.executable, "-m", "engines.cpu"]
    assert cmd[3:] == [
        "--host", "127.0.0.1", "--port", "8123", "--seed", "4", "--model-size", "small", "--api-key", "k",
        "--weights", "/w.safetensors", "--weight-version", "v1", "--step-delay-s", "0.5",
    ]  # fmt: skip


def test_a_crashing_actor_does_not_report_its_server_exit_first(monkeypatch: pytest.MonkeyPatch) -> None:
    """``crash()`` (the kill-engine fault: the actor dies, its server with it) SIGKILLs the server, then exits. The
    watch thread, blocked in waitpid, must not answer "exit code -9" in between: the driver would read a lost actor
    as a dead server (a fault matrix cell failed on it under load). The actor class runs here, outside Ray, with
    ``os._exit`` held back so that the test process stays."""
    import threading

    from engines.actor import EngineActor

    actor = EngineActor.__ray_actor_class__("engine-crash")
    actor.process = ServerProcess([sys.executable, "-c", "import time; time.sleep(60)"], engine_id="engine-crash")
    actor.process.spawn()
    answers: list[str] = []
    watcher = threading.Thread(target=lambda: answers.append(actor.watch()), daemon=True)
    watcher.start()
    exits: list[int] = []
    monkeypatch.setattr(os, "_exit", exits.append)
    actor.crash()
    assert exits == [1]  # the actor would have exited here; its server was SIGKILLed first
    watcher.join(2.0)  # long enough for a wrong answer: waitpid returns within milliseconds of the kill
    assert answers == [], f"the watch answered {answers} while the actor was going down"


def test_a_closed_local_engine_leaves_no_task_on_its_loop() -> None:
    """The death watch (a thread's waitpid) ends with the close: an embedding loop that closes its event loop next
    gets no "Task was destroyed but it is pending" for it."""
    from engines.engine import Engine
    from engines.launcher import launcher_factory

    loop = asyncio.new_event_loop()
    try:
        engine = Engine("engine-0", launcher_factory("local")("engine-0"))
        assert loop.run_until_complete(engine.launch()).name == "ready", engine.reason
        loop.run_until_complete(engine.close())
        assert not asyncio.all_tasks(loop)
    finally:
        loop.close()


_SOCKET_SERVER = (
    "import os, socket, time\n"
    "s = socket.socket(socket.AF_UNIX)\n"
    "s.bind(os.path.join(os.environ['RPC_DIR'], 'rpc.sock'))\n"
    "print('READY http://127.0.0.1:9', flush=True)\n"
    "time.sleep(120)\n"
)


def test_a_servers_own_directory_goes_with_the_killed_server() -> None:
    """vLLM binds its ZeroMQ sockets in ``$VLLM_RPC_BASE_PATH`` (/tmp by default): a SIGKILLed server left them there
    at every start. A server given ``PRIVATE_DIR_ENV`` gets a directory of its own, removed once it is dead."""
    from engines.process import PRIVATE_DIR_ENV

    env = {**os.environ, PRIVATE_DIR_ENV: "RPC_DIR"}
    proc = ServerProcess([sys.executable, "-c", _SOCKET_SERVER], engine_id="eval/engine-0", env=env)
    proc.start(30.0)
    try:
        own = Path(proc._private or "")
        assert own.is_dir() and (own / "rpc.sock").exists() and own.name.startswith("eval_engine-0-")
    finally:
        proc.kill()
    assert not own.exists()  # at the kill: a caller may never wait for the death
    proc.wait_dead(10.0)
    graceful = ServerProcess([sys.executable, "-c", _SOCKET_SERVER], engine_id="engine-1", env=env)
    graceful.start(30.0)
    kept = Path(graceful._private or "")
    graceful.terminate()  # SIGTERM: the server may use its sockets while it stops; the directory goes at its death
    graceful.wait_dead(10.0)
    assert not kept.exists()
    early = ServerProcess([sys.executable, "-c", "raise SystemExit(3)"], engine_id="engine-2", env=env)
    with pytest.raises(EngineStartError, match="code 3"):
        early.start(30.0)  # exits before it is ready: its directory goes too
    assert early._private is None
    plain = ServerProcess([sys.executable, "-c", "print('READY http://127.0.0.1:9', flush=True)"], engine_id="x")
    plain.start(30.0)
    plain.wait_dead(10.0)
    assert plain._private is None
