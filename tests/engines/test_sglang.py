"""The SGLang backend: the command line it builds, the missing-extra error, and its start-up sequence.

No GPU and no ``sglang`` here, so the start-up sequence runs against servers that speak the same
HTTP API: the CPU torch engine (a real model behind SGLang's endpoints), and a tiny stdlib HTTP
server whose answers are scripted (503s before healthy, a busy ``/flush_cache``, a required admin
key), started through the backend's ``command_override`` seam.
"""

from __future__ import annotations

import asyncio
import importlib.machinery
import importlib.util
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from engines.client import EngineClient
from engines.engine import Engine, Timeouts
from engines.errors import EngineStartError, EngineStartTimeout
from engines.process import torch_engine_command
from engines.sglang import (
    SGLANG_EXTRA,
    SGLangBackend,
    SGLangNotInstalled,
    SGLangServerArgs,
    SGLangStartTimeout,
    require_sglang,
    sglang_available,
)
from lifecycle.decide.config import LifecycleConfig
from lifecycle.decide.errors import ConfigError, LifecycleError
from tests.helpers import free_port

MODEL = "Qwen/Qwen3-0.6B"
HEALTH, FLUSH = "/health_generate", "/flush_cache"


def rollout_config(**flags: Any) -> LifecycleConfig:
    return LifecycleConfig.from_mapping({"rollout_num_gpus": 8} | flags)


# -- the command line ------------------------------------------------------------------------------
def test_minimal_command_is_exactly_the_launch_server_line() -> None:
    args = SGLangServerArgs.from_config(rollout_config(rollout_num_gpus_per_engine=2), MODEL, 30001)
    assert args.command() == [
        sys.executable,
        "-m",
        "sglang.launch_server",
        "--model-path",
        MODEL,
        "--host",
        "127.0.0.1",
        "--port",
        "30001",
        "--tp-size",
        "2",
        "--enable-metrics",
    ]
    assert args.command(python="/opt/py/bin/python")[0] == "/opt/py/bin/python"


@pytest.mark.parametrize(
    ("flags", "saver"),
    [
        ({}, False),
        ({"offload_rollout": True}, True),
        ({"offload": True}, True),
        ({"colocate": True}, True),
        ({"offload_train": True}, False),
    ],
)
@pytest.mark.memory
def test_memory_saver_follows_rollout_offload(flags: dict[str, Any], saver: bool) -> None:
    args = SGLangServerArgs.from_config(rollout_config(**flags), MODEL, 30001)
    assert args.enable_memory_saver is saver
    assert ("--enable-memory-saver" in args.command()) is saver


@pytest.mark.parametrize("per_engine", [1, 2, 4, 8])
def test_tp_size_is_rollout_num_gpus_per_engine(per_engine: int) -> None:
    config = LifecycleConfig.from_args(["--rollout-num-gpus", "8", "--rollout-num-gpus-per-engine", str(per_engine)])
    cmd = SGLangServerArgs.from_config(config, MODEL, 30001).command()
    assert cmd[cmd.index("--tp-size") + 1] == str(per_engine)
    assert cmd.count("--tp-size") == 1


def test_every_optional_flag_in_order_and_keys_hidden_from_repr() -> None:
    args = SGLangServerArgs.from_config(
        rollout_config(offload_rollout=True),
        MODEL,
        30002,
        host="0.0.0.0",
        mem_fraction_static=0.7,
        api_key="sk-api",
        admin_api_key="sk-admin",
        base_gpu_id=4,
        dtype="bfloat16",
        random_seed=42,
        weight_version="v3",
        skip_server_warmup=True,
        extra_args=["--log-level", "warning", "--trust-remote-code"],
    )
    assert args.command()[12:] == [
        "--mem-fraction-static",
        "0.7",
        "--enable-memory-saver",
        "--api-key",
        "sk-api",
        "--admin-api-key",
        "sk-admin",
        "--base-gpu-id",
        "4",
        "--dtype",
        "bfloat16",
        "--random-seed",
        "42",
        "--weight-version",
        "v3",
        "--skip-server-warmup",
        "--log-level",
        "warning",
        "--trust-remote-code",
    ]
    assert "sk-api" not in repr(args) and "sk-admin" not in repr(args)
    assert args.url == "http://127.0.0.1:30002"  # a wildcard bind is reached through loopback


def test_unset_optionals_leave_sglang_defaults_alone() -> None:
    cmd = SGLangServerArgs(MODEL, 30001).command()
    for flag in ("--api-key", "--admin-api-key", "--mem-fraction-static", "--base-gpu-id", "--dtype"):
        assert flag not in cmd
    for flag in ("--random-seed", "--weight-version", "--skip-server-warmup", "--enable-memory-saver"):
        assert flag not in cmd


@pytest.mark.parametrize(
    ("host", "url"),
    [("10.0.0.5", "http://10.0.0.5:31000"), ("::", "http://[::1]:31000"), ("fe80::1", "http://[fe80::1]:31000")],
)
def test_url_from_host(host: str, url: str) -> None:
    assert SGLangServerArgs(MODEL, 31000, host=host).url == url


@pytest.mark.parametrize(
    ("kwargs", "flag"),
    [
        ({"port": 0}, "--port"),
        ({"port": 70000}, "--port"),
        ({"port": "8000"}, "--port"),
        ({"port": True}, "--port"),
        ({"tp_size": 0}, "--tp-size"),
        ({"tp_size": -2}, "--tp-size"),
        ({"tp_size": 1.5}, "--tp-size"),
        ({"model_path": ""}, "--model-path"),
        ({"model_path": "   "}, "--model-path"),
        ({"host": ""}, "--host"),
        ({"mem_fraction_static": 0.0}, "--mem-fraction-static"),
        ({"mem_fraction_static": 1.5}, "--mem-fraction-static"),
        ({"base_gpu_id": -1}, "--base-gpu-id"),
        ({"random_seed": "7"}, "--random-seed"),
        ({"dtype": "fp8"}, "--dtype"),
        ({"api_key": ""}, "--api-key"),
        ({"admin_api_key": ""}, "--admin-api-key"),
        ({"weight_version": ""}, "--weight-version"),
        ({"extra_args": "--log-level info"}, "extra_args"),
        ({"extra_args": ["--port", "1"]}, "extra_args"),
        ({"extra_args": ["--port=1"]}, "extra_args"),
        ({"extra_args": ["--tp", "2"]}, "extra_args"),
        ({"extra_args": ["--enable-memory-saver"]}, "extra_args"),
    ],
)
def test_invalid_arguments_raise_a_config_error_naming_the_flag(kwargs: dict[str, Any], flag: str) -> None:
    fields: dict[str, Any] = {"model_path": MODEL, "port": 30001} | kwargs
    with pytest.raises(ConfigError) as info:
        SGLangServerArgs(**fields)
    assert info.value.flag == flag
    assert str(info.value).startswith(flag)


# -- the optional extra -------------------------------------------------------------------------------
def _pretend_sglang(present: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec

    def find_spec(name: str, package: str | None = None) -> Any:
        if name == "sglang":
            return importlib.machinery.ModuleSpec("sglang", None) if present else None
        return real(name, package)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)


def test_availability_is_looked_up_without_importing() -> None:
    assert sglang_available() is (importlib.util.find_spec("sglang") is not None)
    assert "sglang" not in sys.modules


def test_missing_sglang_error_names_the_extra_and_the_gpu_host(monkeypatch: pytest.MonkeyPatch) -> None:
    _pretend_sglang(False, monkeypatch)
    assert sglang_available() is False
    with pytest.raises(SGLangNotInstalled) as info:
        require_sglang()
    message = str(info.value)
    assert "pip install 'rl-lifecycle[sglang]'" in message and SGLANG_EXTRA in message
    assert "GPU host" in message and "engines.cpu" in message
    assert isinstance(info.value, LifecycleError) and isinstance(info.value, ImportError)


def test_present_sglang_passes_the_check(monkeypatch: pytest.MonkeyPatch) -> None:
    _pretend_sglang(True, monkeypatch)
    assert sglang_available() is True
    require_sglang()
    assert "sglang" not in sys.modules


def test_launch_without_sglang_fails_before_spawning_anything(monkeypatch: pytest.MonkeyPatch) -> None:
    _pretend_sglang(False, monkeypatch)
    backend = SGLangBackend("sg-none", SGLangServerArgs(MODEL, free_port()))
    with pytest.raises(SGLangNotInstalled):
        asyncio.run(backend.launch())
    assert backend.process is None and not backend.alive()


def test_launch_runs_the_real_launch_server_command(monkeypatch: pytest.MonkeyPatch) -> None:
    """With the check passed, the real ``python -m sglang.launch_server`` line is what runs (and here it dies)."""
    _pretend_sglang(True, monkeypatch)
    backend = SGLangBackend("sg-real", SGLangServerArgs(MODEL, free_port()), startup_timeout=20, poll_interval=0.05)
    with pytest.raises(EngineStartError) as info:
        asyncio.run(backend.launch())
    assert not isinstance(info.value, EngineStartTimeout)
    assert info.value.returncode == 1
    assert "sglang.launch_server" in info.value.output and "No module named 'sglang'" in info.value.output
    assert backend.process is not None and backend.process.command[:5] == [
        sys.executable,
        "-m",
        "sglang.launch_server",
        "--model-path",
        MODEL,
    ]


# -- the start-up sequence against a scripted server --------------------------------------------------------
STUB_SERVER = r"""
import http.server, sys

port, health_503, flush_400, key = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
seen = {"/health_generate": 0, "/flush_cache": 0}


class Handler(http.server.BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def answer(self):
        path = self.path.split("?")[0]
        print(self.command, path, flush=True)
        if path == "/health_generate":
            seen[path] += 1
            code = 503 if seen[path] <= health_503 else 200
        elif path == "/flush_cache":
            if key and self.headers.get("Authorization") != "Bearer " + key:
                code = 401
            else:
                seen[path] += 1
                code = 400 if flush_400 < 0 or seen[path] <= flush_400 else 200
        else:
            code = 404
        self.send_response(code)
        self.send_header("Content-Length", "0")
        self.end_headers()

    do_GET = do_POST = answer


http.server.HTTPServer(("127.0.0.1", port), Handler).serve_forever()
"""


@pytest.fixture(scope="module")
def stub_script(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("stub") / "stub_server.py"
    path.write_text(STUB_SERVER)
    return path


def stub_backend(
    script: Path,
    engine_id: str,
    *,
    health_503: int = 0,
    flush_400: int = 0,
    server_key: str = "",
    startup_timeout: float = 10.0,
    **args: Any,
) -> SGLangBackend:
    port = free_port()
    command = [sys.executable, str(script), str(port), str(health_503), str(flush_400), server_key]
    return SGLangBackend(
        engine_id,
        SGLangServerArgs(MODEL, port, **args),
        startup_timeout=startup_timeout,
        probe_timeout=2.0,
        poll_interval=0.02,
        command_override=lambda: command,
    )


def outcomes(backend: SGLangBackend) -> list[tuple[str, str]]:
    """The start-up log without the connection refusals before the server listens (their count is timing)."""
    steps = [(s.endpoint, s.outcome) for s in backend.startup_log]
    while steps and steps[0] == (HEALTH, "unreachable"):
        steps.pop(0)
    return steps


def served(backend: SGLangBackend, count: int) -> list[str]:
    """The requests the stub printed (its output is read by a thread, so wait briefly for ``count`` lines)."""
    assert backend.process is not None
    deadline = time.monotonic() + 5.0
    while True:
        lines = [line for line in backend.process.output_tail().splitlines() if line.startswith(("GET", "POST"))]
        if len(lines) >= count or time.monotonic() > deadline:
            return lines
        time.sleep(0.01)


@pytest.mark.recovery
@pytest.mark.monitor
def test_health_generate_until_200_then_flush_cache_until_200(stub_script: Path) -> None:
    backend = stub_backend(stub_script, "sg-stub", health_503=2, flush_400=2)
    try:
        assert asyncio.run(backend.launch()) == backend.url
        assert outcomes(backend) == [
            (HEALTH, "HTTP 503"),
            (HEALTH, "HTTP 503"),
            (HEALTH, "200"),
            (FLUSH, "HTTP 400"),
            (FLUSH, "HTTP 400"),
            (FLUSH, "200"),
        ]
        times = [s.elapsed for s in backend.startup_log]
        assert times == sorted(times)
        # The server's own request log agrees: every flush came after the last health probe.
        assert served(backend, 6) == ["GET /health_generate"] * 3 + ["POST /flush_cache"] * 3
        assert backend.alive()
    finally:
        asyncio.run(backend.kill())


def test_flush_cache_uses_the_admin_key(stub_script: Path) -> None:
    backend = stub_backend(stub_script, "sg-admin", server_key="sk-admin", api_key="sk-api", admin_api_key="sk-admin")
    try:
        asyncio.run(backend.launch())
        assert outcomes(backend) == [(HEALTH, "200"), (FLUSH, "200")]
    finally:
        asyncio.run(backend.kill())


def test_a_refused_key_fails_at_once_and_kills_the_server(stub_script: Path) -> None:
    backend = stub_backend(stub_script, "sg-nokey", server_key="sk-admin", api_key="sk-api", startup_timeout=30)
    with pytest.raises(EngineStartError, match=r"engine sg-nokey start: /flush_cache answered HTTP 401") as info:
        asyncio.run(backend.launch())
    # no retry within the 30 s budget: waiting cannot fix a key
    assert outcomes(backend) == [(HEALTH, "200"), (FLUSH, "HTTP 401")]
    assert not isinstance(info.value, EngineStartTimeout)
    assert not backend.alive()


@pytest.mark.recovery
@pytest.mark.monitor
def test_a_server_that_never_becomes_healthy_times_out_naming_the_engine() -> None:
    backend = SGLangBackend(
        "sg-hang",
        SGLangServerArgs(MODEL, free_port()),
        startup_timeout=0.5,
        poll_interval=0.05,
        command_override=lambda: [sys.executable, "-c", "import time; print('loading', flush=True); time.sleep(60)"],
    )
    with pytest.raises(SGLangStartTimeout) as info:
        asyncio.run(backend.launch())
    error = info.value
    assert isinstance(error, EngineStartTimeout) and isinstance(error, TimeoutError)
    # a server that never listens: the last attempt is refused, or (a loaded machine) runs out of the budget left
    assert error.engine_id == "sg-hang" and error.waiting_for == HEALTH and error.last in ("unreachable", "timeout")
    assert str(error).startswith("engine sg-hang start: /health_generate did not answer 200 within 0.5s")
    assert "loading" in error.output
    assert not backend.alive() and backend.process is not None and backend.process.returncode == -9
    assert {s.endpoint for s in backend.startup_log} == {HEALTH}


def test_a_busy_flush_cache_times_out_naming_the_step(stub_script: Path) -> None:
    backend = stub_backend(stub_script, "sg-busy", flush_400=-1, startup_timeout=0.5)
    with pytest.raises(SGLangStartTimeout, match=r"engine sg-busy start: /flush_cache did not answer 200") as info:
        asyncio.run(backend.launch())
    assert info.value.last == "HTTP 400"
    assert not backend.alive()


def test_a_server_that_exits_is_reported_at_once_with_its_output() -> None:
    crash = [sys.executable, "-c", "import sys; print('CUDA error: no device'); sys.exit(3)"]
    backend = SGLangBackend(
        "sg-crash",
        SGLangServerArgs(MODEL, free_port()),
        startup_timeout=30,
        poll_interval=0.05,
        command_override=lambda: crash,
    )
    with pytest.raises(EngineStartError, match="before /health_generate answered 200") as info:
        asyncio.run(backend.launch())
    assert info.value.returncode == 3 and "CUDA error: no device" in info.value.output


def test_a_cancelled_launch_leaves_no_server_behind() -> None:
    backend = SGLangBackend(
        "sg-cancel",
        SGLangServerArgs(MODEL, free_port()),
        startup_timeout=60,
        poll_interval=0.05,
        command_override=lambda: [sys.executable, "-c", "import time; time.sleep(60)"],
    )

    async def main() -> None:
        await asyncio.wait_for(backend.launch(), 0.5)

    with pytest.raises(TimeoutError):
        asyncio.run(main())
    assert backend.process is not None and not backend.alive()


def test_engine_slot_runs_on_the_backend(stub_script: Path) -> None:
    """SGLangBackend is an engines.launcher.Launcher: an engine slot starts and stops through it."""
    backend = stub_backend(stub_script, "sg-slot", health_503=1)
    engine = Engine("sg-slot", backend, timeouts=Timeouts(startup=10, request=2, death=5))

    async def main() -> tuple[str, str]:
        started = (await engine.launch()).name
        stopped = (await engine.kill()).name
        return started, stopped

    try:
        assert asyncio.run(main()) == ("ready", "dead")
        assert outcomes(backend)[-2:] == [(HEALTH, "200"), (FLUSH, "200")]
        assert not backend.alive()
    finally:
        asyncio.run(backend.kill())


def test_launcher_kwargs_fit_the_ray_launcher() -> None:
    """``RayLauncher(engine_id, **backend.launcher_kwargs())`` (not built here: importing ray costs seconds)."""
    backend = SGLangBackend("sg-ray", SGLangServerArgs(MODEL, 30005, tp_size=2))
    kwargs = backend.launcher_kwargs()
    assert kwargs["command"]() == SGLangServerArgs(MODEL, 30005, tp_size=2).command()
    assert kwargs["url"] == "http://127.0.0.1:30005" and kwargs["health_path"] == HEALTH
    assert kwargs["startup_timeout"] == backend.startup_timeout


# -- the start-up sequence against the CPU torch engine ---------------------------------------------------
def test_startup_sequence_against_the_cpu_engine() -> None:
    """The same launch path, with the CPU torch engine standing in for ``sglang.launch_server``."""
    port = free_port()
    backend = SGLangBackend(
        "sg-cpu",
        SGLangServerArgs(MODEL, port, api_key="sk-test"),
        startup_timeout=90,
        probe_timeout=10,
        poll_interval=0.1,
        command_override=lambda: torch_engine_command(port=port, api_key="sk-test", startup_delay_s=0.5),
    )

    async def main() -> tuple[str, int, str]:
        url = await backend.launch()
        async with EngineClient(url, engine_id="sg-cpu", api_key="sk-test", timeout=30) as client:
            await client.health_generate()
            answer = await client.generate("hello", sampling_params={"max_new_tokens": 4, "temperature": 0.0})
        await backend.kill()
        dead = await backend.wait_dead(10)
        assert dead
        return url, answer.meta_info.completion_tokens, await backend.watch()

    try:
        url, tokens, reason = asyncio.run(main())
    finally:
        asyncio.run(backend.kill())
    assert url == f"http://127.0.0.1:{port}"
    assert tokens == 4
    assert reason == "exit code -9" and not backend.alive()
    log = backend.startup_log
    first_ok = next(i for i, s in enumerate(log) if s.ok)
    assert [s.endpoint for s in log if s.ok] == [HEALTH, FLUSH]
    assert log[first_ok].endpoint == HEALTH and log[-1] == log[first_ok + 1]  # flush right after health
    assert first_ok > 0 and all(s.endpoint == HEALTH and not s.ok for s in log[:first_ok])
    assert "HTTP 503" in {s.outcome for s in log[:first_ok]}  # seen while the engine was listening but starting
