"""Issue 41, causes 6, 7 and 9: the environment and addresses, bounds, and flags with no effect.

- **Environment and addresses**: ``$LIFECYCLE_ENGINE_API_KEY`` is checked where it is read (a newline in it was
  aiohttp's header-injection traceback); ``--ray-address`` at a server that is not Ray is refused within seconds
  (``ray.init`` waited there for minutes); a head that requires Ray 2.60's token gets this machine's token, and
  one this driver has no token for is one paragraph naming ``--ray-address`` and the fix.
- **Bounds**: ``--engine-lease`` is finite, long enough to be renewed in time, at most 30 days (``inf`` went into
  run.json as ``Infinity``; ``0.01`` ended as "engine actor died"); ``lifecycle check --faults`` is bounded and an
  exploration past the checker's state limit names flags ``check`` has.
- **No effect**: a flag that would do nothing in its combination is refused naming why (``--vllm-python`` with
  SGLang, ``--engine-lease`` without ``--detach-engines``, ``--gateway-health-check`` without a gateway, ...);
  ``--rollout-device cuda`` on a machine without a GPU and a ``--vllm-python`` that cannot import vLLM are
  refused before Ray starts, naming where the value came from.

Each cause has a ``test_catches_*`` that puts the old code back and shows the check fail.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from badinput import (
    REPLAY,
    REPO,
    Case,
    _paragraph_problems,
    _replay,
    check_in_process,
    check_subprocess,
)

import lifecycle.cli as cli
from engines.ledger import MIN_LEASE, RENEWAL_TIMEOUT, RENEWALS_PER_LEASE
from lifecycle.decide.config import LifecycleConfig
from lifecycle.decide.errors import ConfigError
from tests.helpers import free_port

pytestmark = pytest.mark.bad_input

RUN = ("run", "--quiet", "--run-dir", "{tmp}/run")
KEEP = (*RUN, "--detach-engines", "--save", "{tmp}/ckpt", "--ray-address", "127.0.0.1:1")

CASES = [
    # cause 7: bounds
    Case("lease-inf", (*KEEP, "--engine-lease", "inf"), ("--engine-lease",)),
    Case("lease-nan", (*KEEP, "--engine-lease", "nan"), ("--engine-lease",)),
    Case("lease-1e10", (*KEEP, "--engine-lease", "1e10"), ("--engine-lease",)),
    Case("lease-0.01", (*KEEP, "--engine-lease", "0.01"), ("--engine-lease", "20")),
    Case("lease-negative", (*KEEP, "--engine-lease=-5"), ("--engine-lease",)),
    Case("check-faults-c-int", ("check", "--faults", str(2**31 - 1)), ("--faults",), proc=True),
    Case("check-faults-9", ("check", "--faults", "9"), ("--faults",)),
    # cause 9: flags with no effect
    Case("vllm-python-with-sglang", (*RUN, "--vllm-python", sys.executable), ("--vllm-python", "sglang"), proc=True),
    Case(
        "vllm-python-with-external-engines",
        (
            *RUN,
            "--rollout-backend",
            "vllm",
            "--rollout-external-engine-addrs",
            "127.0.0.1:1",
            "--hf-checkpoint",
            "{tmp}/nohf",
            "--vllm-python",
            sys.executable,
        ),
        ("--vllm-python", "external"),
    ),
    Case(
        "vllm-python-train-only",
        (*RUN, "--rollout-backend", "vllm", "--debug-train-only", "--vllm-python", sys.executable),
        ("--vllm-python", "--debug-train-only"),
    ),
    Case("lease-without-detach", (*RUN, "--engine-lease", "60"), ("--engine-lease", "--detach-engines"), proc=True),
    Case(
        "gateway-check-no-router",
        (*RUN, "--gateway-health-check", "--no-router"),
        ("--gateway-health-check", "--no-router"),
        proc=True,
    ),
    Case(
        "gateway-check-train-only",
        (*RUN, "--gateway-health-check", "--debug-train-only"),
        ("--gateway-health-check", "--debug-train-only"),
    ),
    Case("engines-train-only", (*RUN, "--engines", "3", "--debug-train-only"), ("--engines", "--debug-train-only")),
    Case(
        "startup-timeout-train-only",
        (*RUN, "--engine-startup-timeout", "30", "--debug-train-only"),
        ("--engine-startup-timeout", "--debug-train-only"),
    ),
    Case(
        "rollout-function-under-replay",
        (*REPLAY, "--rollout-function", "tests.nowhere:make"),
        ("--rollout-function", "--load-debug-rollout-data"),
        setup=(_replay(),),
    ),
    Case(
        "data-source-under-replay",
        (*REPLAY, "--data-source", "tests.nowhere:make"),
        ("--data-source", "--load-debug-rollout-data"),
        setup=(_replay(),),
    ),
    Case("ray-nodes-local-launcher", (*RUN, "--ray-nodes", "3", "--launcher", "local"), ("--ray-nodes", "--launcher")),
    Case(
        "ray-nodes-train-only", (*RUN, "--ray-nodes", "3", "--debug-train-only"), ("--ray-nodes", "--debug-train-only")
    ),
    # issue 44: the elastic fleet's flags, refused before Ray starts
    Case("scale-spec", (*RUN, "--scale-rollout", "3"), ("--scale-rollout", "N@STEP")),
    Case(
        "scale-without-bounds",
        (*RUN, "--scale-rollout", "3@1"),
        ("--scale-rollout", "--rollout-min-num-gpus", "--rollout-max-num-gpus"),
    ),
    Case("preempt-without-bounds", (*RUN, "--inject", "preempt-engine:0@1"), ("--inject", "--rollout-max-num-gpus")),
    Case("preempt-notice-alone", (*RUN, "--preempt-notice", "10"), ("--preempt-notice", "preempt-engine")),
    Case("preempt-notice-0", (*RUN, "--preempt-notice", "0"), ("--preempt-notice", "3600")),
    # cause 9: checked before Ray starts
    Case(
        "vllm-python-bin-true",
        (*RUN, "--rollout-backend", "vllm", "--vllm-python", "/bin/true"),
        ("--vllm-python", "/bin/true", "vllm"),
        proc=True,
    ),
    Case(
        "vllm-python-without-vllm",
        (*RUN, "--rollout-backend", "vllm", "--vllm-python", sys.executable),
        ("--vllm-python", sys.executable, "vllm"),
    ),
]
BY_ID = {c.id: c for c in CASES}


def _vllm_installed_here() -> bool:
    import importlib.util

    return importlib.util.find_spec("vllm") is not None


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_refused(case: Case, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    if case.id == "vllm-python-without-vllm" and _vllm_installed_here():
        pytest.skip("this python has vLLM")
    check_in_process(case, tmp_path, capsys)


@pytest.mark.parametrize("case", [c for c in CASES if c.proc], ids=lambda c: c.id)
def test_refused_as_a_process(case: Case, tmp_path: Path) -> None:
    check_subprocess(case, tmp_path)


# -- the environment: named as such ----------------------------------------------------------------------------
def test_a_key_with_a_newline_is_refused_naming_the_variable(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LIFECYCLE_ENGINE_API_KEY", "k3yvalue\nX-Injected: 1")
    case = Case("key-newline", (*RUN, "--rollout-external-engine-addrs", "127.0.0.1:1"), ("$LIFECYCLE_ENGINE_API_KEY",))
    check_in_process(case, tmp_path, capsys)
    monkeypatch.setenv("LIFECYCLE_ENGINE_API_KEY", "k3yvalue\nX-Injected: 1")
    assert cli.main([a.format(tmp=tmp_path) for a in case.argv]) == 2
    assert "k3yvalue" not in capsys.readouterr().err, "the error echoed the key"


def test_the_key_is_checked_where_it_is_read(monkeypatch: pytest.MonkeyPatch) -> None:
    from engines.apikey import given_api_key
    from engines.launcher import ExternalLauncher

    monkeypatch.setenv("LIFECYCLE_ENGINE_API_KEY", "a b")
    with pytest.raises(ConfigError, match=r"\$LIFECYCLE_ENGINE_API_KEY"):
        given_api_key()
    with pytest.raises(ConfigError):
        ExternalLauncher("engine-0", "http://127.0.0.1:1")
    monkeypatch.setenv("LIFECYCLE_ENGINE_API_KEY", "fine-key")
    assert given_api_key() == "fine-key"


def test_the_vllm_python_of_the_variable_is_named_as_the_variable(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LIFECYCLE_VLLM_PYTHON", "/bin/true")
    check_in_process(
        Case("env-vllm-python", (*RUN, "--rollout-backend", "vllm"), ("$LIFECYCLE_VLLM_PYTHON",)), tmp_path, capsys
    )


def test_cuda_without_a_gpu_is_refused_before_ray(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("trainer.app.checks.visible_gpus", lambda: 0)
    check_in_process(
        Case("cuda-no-gpu", (*RUN, "--rollout-device", "cuda"), ("--rollout-device", "cuda")), tmp_path, capsys
    )


def test_visible_gpus_follows_cuda_visible_devices(monkeypatch: pytest.MonkeyPatch) -> None:
    from trainer.app.checks import visible_gpus

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert visible_gpus() == 0
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert visible_gpus() == len([d for d in os.listdir("/dev") if d.startswith("nvidia") and d[6:].isdigit()]) or (
        os.path.exists("/dev/kfd")
    )


# -- the API path runs the same checks, naming its own arguments --------------------------------------------------
def _config(**values: object) -> LifecycleConfig:
    from lifecycle.cli.args import _embedded

    return LifecycleConfig.from_mapping({**_embedded("cpu"), **values})


@pytest.mark.parametrize(
    ("values", "options", "name"),
    [
        (
            {"detach_engines": True, "save": "ckpt"},
            {"engine_lease": math.inf, "ray_address": "127.0.0.1:1"},
            "RunOptions.engine_lease",
        ),
        ({}, {"engine_lease": 60.0}, "RunOptions.engine_lease"),
        ({}, {"vllm_python": sys.executable}, "RunOptions.vllm_python"),
        ({"gateway_health_check": True}, {"router": False}, "--gateway-health-check"),
        ({"rollout_device": "cuda"}, {}, "--rollout-device"),
    ],
)
def test_the_api_refuses_the_same(
    values: dict[str, object], options: dict[str, object], name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from trainer.app.loop import RunOptions, check_options

    monkeypatch.setattr("trainer.app.checks.visible_gpus", lambda: 0)
    with pytest.raises(ConfigError) as caught:
        check_options(_config(**values), RunOptions(run_dir=tmp_path / "run", **options))  # type: ignore[arg-type]
    assert caught.value.flag == name, caught.value


def test_the_config_refuses_a_gateway_check_without_engines() -> None:
    with pytest.raises(ConfigError, match="--gateway-health-check"):
        LifecycleConfig.from_mapping({"gateway_health_check": True, "debug_train_only": True})


def test_a_resumed_runs_lease_is_read_back_by_the_same_rule() -> None:
    from trainer.app.options import MANIFEST as OPTIONS

    assert OPTIONS["engine_lease"](120.0) is None
    for bad in (math.inf, 1e10, 0.01, -1.0):
        assert OPTIONS["engine_lease"](bad), bad


def test_the_shortest_lease_outlasts_a_renewal() -> None:
    """A renewal is due every lease/N and may take RENEWAL_TIMEOUT: the shortest lease must still cover both."""
    assert MIN_LEASE / RENEWALS_PER_LEASE + RENEWAL_TIMEOUT < MIN_LEASE


# -- lifecycle check: the state limit -----------------------------------------------------------------------------
@pytest.mark.parametrize("jobs", ["1", "2"])
def test_the_state_limit_names_flags_check_has(
    jobs: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from lifecycle.check import explore

    monkeypatch.setitem(explore.explore.__kwdefaults__, "max_states", 50)  # type: ignore[arg-type]
    argv = ["check", "--engines", "1", "--jobs", jobs, "--use-fault-tolerance", "--rollout-num-gpus", "1"]
    if jobs == "2":
        argv = ["check", "--engines", "1", "--jobs", jobs]  # the lattice: several explorations in a pool
    t0 = time.monotonic()
    code = cli.main(argv)
    err = capsys.readouterr().err
    assert code == 2, err
    assert not _paragraph_problems(err, ["--faults", "--engines"]), err
    assert "--max-states" not in err
    assert time.monotonic() - t0 < 60


# -- --ray-address: not Ray, Ray with a token ----------------------------------------------------------------------
@contextlib.contextmanager
def _silent_server() -> Iterator[int]:
    """A TCP server that accepts and never answers (what ``ray.init`` waited on for minutes)."""
    server = socket.create_server(("127.0.0.1", 0))
    port = int(server.getsockname()[1])
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            with contextlib.suppress(TimeoutError, OSError):
                held.append(server.accept()[0])

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield port
    finally:
        stop.set()
        thread.join(5)
        for c in held:
            c.close()
        server.close()


def test_a_server_that_is_not_ray_is_refused_within_seconds(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with _silent_server() as port:
        case = Case("not-ray", (*RUN, "--ray-address", f"127.0.0.1:{port}"), ("--ray-address", f"127.0.0.1:{port}"))
        t0 = time.monotonic()
        check_in_process(case, tmp_path, capsys)
        assert time.monotonic() - t0 < 20  # two runs (plain and --debug), each bounded by the 3 s handshake


def test_the_api_refuses_a_server_that_is_not_ray(tmp_path: Path) -> None:
    from engines.rayconnect import check_gcs

    with _silent_server() as port:
        t0 = time.monotonic()
        with pytest.raises(ConfigError, match="not a Ray cluster"):
            check_gcs(f"127.0.0.1:{port}", timeout=1.0)
        assert time.monotonic() - t0 < 5


AUTH_VARIABLES = ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH")


def test_a_driver_sends_the_token_it_has(tmp_path: Path) -> None:
    from engines import rayconnect

    before = {name: os.environ.get(name) for name in AUTH_VARIABLES}
    with pytest.MonkeyPatch.context() as monkeypatch:
        monkeypatch.setitem(sys.modules, "ray._raylet", None)  # this process's Ray settings stay as they are
        monkeypatch.setenv("HOME", str(tmp_path))
        for name in AUTH_VARIABLES:  # set, then deleted: both recorded, so what use_cluster_token writes is undone
            monkeypatch.setenv(name, "")
            monkeypatch.delenv(name)
        assert not rayconnect.use_cluster_token("127.0.0.1:6379") and "RAY_AUTH_MODE" not in os.environ
        (tmp_path / ".ray").mkdir()
        (tmp_path / ".ray" / "auth_token").write_text("t" * 32)
        assert rayconnect.use_cluster_token("127.0.0.1:6379")
        assert os.environ["RAY_AUTH_MODE"] == "token"
        monkeypatch.setenv("RAY_AUTH_MODE", "disabled")  # the user's setting wins
        assert not rayconnect.use_cluster_token("127.0.0.1:6379")
        assert os.environ["RAY_AUTH_MODE"] == "disabled"
    # a delenv of an unset variable records nothing: this process kept RAY_AUTH_MODE=token, and its next local
    # cluster (under xdist, another file's test) started a GCS that refused its driver
    assert {name: os.environ.get(name) for name in AUTH_VARIABLES} == before


_LATE_AUTH_MODE = """
import os, sys
os.environ.pop("RAY_AUTH_MODE", None)
import ray, ray._raylet  # Ray caches its settings here
os.environ["RAY_AUTH_MODE"] = "token"  # then the variable changes (the user's script; an earlier join)
from engines.actor import init_local_cluster
try:
    init_local_cluster(num_cpus=1)
    ray.get(ray.put(1))
    print("started")
finally:
    ray.shutdown()
"""


@pytest.mark.slow
def test_a_local_cluster_follows_an_auth_mode_set_after_ray_was_imported(tmp_path: Path) -> None:
    """``RAY_AUTH_MODE=token`` set after ``import ray``: the GCS the driver starts reads the variable, the driver its
    settings cached at import; without ``settings_follow_environment`` the GCS refused its own driver ("Failed to
    start GCS ... InvalidAuthToken", seen under pytest-xdist after another test's join set the variable)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH") and k != "RAY_ADDRESS"}
    env.update(HOME=str(tmp_path), PYTHONPATH=str(REPO), RAY_USAGE_STATS_ENABLED="0")
    done = subprocess.run(
        [sys.executable, "-c", _LATE_AUTH_MODE], env=env, capture_output=True, text=True, timeout=240, cwd=tmp_path
    )
    assert done.returncode == 0 and "started" in done.stdout, done.stderr[-3000:]


_OWN_CLUSTER = """
import os
from engines.actor import init_local_cluster
import ray
try:
    init_local_cluster(num_cpus=1)
    ray.get(ray.put(1))
    print("started", os.environ.get("RAY_AUTH_MODE"))
finally:
    ray.shutdown()
"""


@pytest.mark.slow
@pytest.mark.parametrize("token", [False, True], ids=["first-run", "token-in-home"])
def test_the_drivers_own_cluster_starts_with_rays_default_auth_and_no_warning(tmp_path: Path, token: bool) -> None:
    """A cluster the driver starts (no --ray-address) has Ray's default -- token authentication, the token written
    to ~/.ray where missing -- without Ray's warning that it chose it on the first lines of every run."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH") and k != "RAY_ADDRESS"}
    env.update(HOME=str(tmp_path), PYTHONPATH=str(REPO), RAY_USAGE_STATS_ENABLED="0")
    if token:
        (tmp_path / ".ray").mkdir()
        (tmp_path / ".ray" / "auth_token").write_text("t" * 32)
    done = subprocess.run(
        [sys.executable, "-c", _OWN_CLUSTER], env=env, capture_output=True, text=True, timeout=240, cwd=tmp_path
    )
    assert done.returncode == 0 and "started token" in done.stdout, done.stderr[-3000:]
    assert "Token authentication is" not in done.stderr, done.stderr[-3000:]
    assert (tmp_path / ".ray" / "auth_token").is_file()


def test_an_auth_refusal_is_one_paragraph() -> None:
    from engines.rayconnect import connection_error

    inner = RuntimeError("Failed to connect to GCS: AuthenticationError: RPC error: InvalidAuthToken: missing")
    outer = ConnectionError("Failed to connect to Ray cluster at 10.0.0.1:6379")
    outer.__cause__ = inner
    text = str(connection_error("127.0.0.1:6379", outer))
    assert "--ray-address" in text and "auth_token" in text and "\n" not in text


@contextlib.contextmanager
def _token_head(home: Path) -> Iterator[str]:
    """``docs/running.md``'s ``ray start --head --port PORT`` as written (Ray's default: token authentication), with its
    own HOME (its token file) and temp dir; stopped by its process group, never ``ray stop``."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH") and k != "RAY_ADDRESS"}
    env.update(HOME=str(home), RAY_USAGE_STATS_ENABLED="0", RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S="0")
    ray = Path(sys.executable).parent / "ray"
    # the token a first local ray.init() (any lifecycle run) leaves in ~/.ray: with it, ray start turns auth on
    subprocess.run([str(ray), "get-auth-token", "--generate"], env=env, capture_output=True, timeout=120, check=True)
    cmd = [str(ray), "start", "--head", "--port", str(port), "--block", "--num-cpus=4", "--include-dashboard=false"]
    temp = tempfile.mkdtemp(prefix="rh-", dir="/tmp")  # short: Ray's socket paths must fit in 107 bytes
    cmd.append(f"--temp-dir={temp}")
    head = subprocess.Popen(cmd, env=env, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 120
        while not _listening(port):
            assert head.poll() is None, head.stderr.read().decode(errors="replace")[-2000:] if head.stderr else ""
            assert time.monotonic() < deadline, "ray start --head did not come up in 120 s"
            time.sleep(0.5)
        yield f"127.0.0.1:{port}"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(head.pid, signal.SIGTERM)
        try:
            head.wait(15)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(head.pid, signal.SIGKILL)
            head.wait(15)
        shutil.rmtree(temp, ignore_errors=True)


def _listening(port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1.0):
        return True
    return False


@pytest.mark.slow
def test_the_docs_recipe_against_a_head_with_token_auth(tmp_path: Path) -> None:
    """``docs/running.md``: ``ray start --head --port 6379``, then
    ``lifecycle run --ray-address 127.0.0.1:6379 --detach-engines`` -- Ray 2.60's head requires its token; the
    driver of the same user sends it. A driver without the token is refused in one paragraph naming
    --ray-address, within seconds, leaving nothing behind."""
    home = tmp_path / "home"
    home.mkdir()
    with _token_head(home) as address:
        env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH") and k != "RAY_ADDRESS"}
        env.update(HOME=str(home), PYTHONPATH=str(REPO), RAY_USAGE_STATS_ENABLED="0")
        run = tmp_path / "job"

        def lifecycle_run(run: Path) -> list[str]:
            argv = [sys.executable, "-m", "lifecycle.cli", "run", "--steps", "1", "--run-dir", str(run), "--quiet"]
            argv += ["--save", str(run / "ckpt"), "--save-interval", "1", "--ray-address", address]
            return [*argv, "--detach-engines", "--engine-lease", "30"]  # the kept engines go with the head anyway

        argv = lifecycle_run(run)
        done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=420, cwd=REPO)
        assert done.returncode == 0, done.stderr[-3000:]
        assert (run / "metrics.jsonl").read_text().strip(), "no step ran"
        assert json.loads((run / "engines.json").read_text())  # the kept engines' ledger
        stranger = tmp_path / "stranger"  # the same driver on a machine without the head's token
        stranger.mkdir()
        argv = lifecycle_run(tmp_path / "job2")
        t0 = time.monotonic()
        refused = subprocess.run(argv, env={**env, "HOME": str(stranger)}, capture_output=True, text=True, timeout=120)
        assert refused.returncode == 2, refused.stderr[-3000:]
        assert not _paragraph_problems(refused.stderr, ["--ray-address", "auth_token"]), refused.stderr
        assert not (tmp_path / "job2").exists()
        assert time.monotonic() - t0 < 60


# -- each cause, its old code put back: the check fails ----------------------------------------------------------
def test_catches_the_unbounded_connect(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The old check: a TCP connect only (a server that is not Ray passed, then ray.init waited minutes)."""
    from engines import rayconnect

    def old(address: str, flag: str = "--ray-address", timeout: float = 3.0) -> None:
        with socket.create_connection(rayconnect.host_port(address), timeout=timeout):
            return

    monkeypatch.setattr(rayconnect, "check_gcs", old)
    with pytest.raises(pytest.fail.Exception, match="DID NOT RAISE"):
        test_the_api_refuses_a_server_that_is_not_ray(tmp_path)


def test_catches_the_unchecked_key(monkeypatch: pytest.MonkeyPatch) -> None:
    from engines import apikey

    monkeypatch.setattr(apikey, "given_api_key", lambda: os.environ.get(apikey.API_KEY_ENV) or None)
    monkeypatch.setattr("trainer.app.checks.given_api_key", apikey.given_api_key)
    with pytest.raises(pytest.fail.Exception, match="DID NOT RAISE"):
        test_the_key_is_checked_where_it_is_read(monkeypatch)


def test_catches_the_unbounded_lease(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The old rule: any positive number (inf and 1e10 included)."""

    def old(lease: float | None, name: str = "--engine-lease") -> None:
        if lease is not None and not lease > 0:
            raise ConfigError(name, lease, "must be a positive number of seconds", "pass e.g. --engine-lease 120")

    monkeypatch.setattr("trainer.app.options.check_lease", old)
    monkeypatch.setattr("trainer.app.checks.check_lease", old)
    monkeypatch.setattr("trainer.app.cli._check_ray_address", lambda a: (_ for _ in ()).throw(RuntimeError("got past")))
    with pytest.raises(RuntimeError, match="got past"):
        check_in_process(BY_ID["lease-inf"], tmp_path, capsys)


def test_catches_the_no_effect_flags_accepted(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("trainer.app.checks.check_effects", lambda *a, **k: None)
    monkeypatch.setattr("trainer.app.cli._check_run_dir", lambda path: (_ for _ in ()).throw(RuntimeError("got past")))
    with pytest.raises(RuntimeError, match="got past"):
        check_in_process(BY_ID["vllm-python-with-sglang"], tmp_path, capsys)


def test_catches_the_unprobed_vllm_python(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The old check: an executable file is enough (/bin/true passed until a launch, after Ray and the trainer)."""
    monkeypatch.setattr("engines.vllm.launcher.probe_python", lambda python, timeout=60.0: "")
    monkeypatch.setattr("trainer.app.cli._check_run_dir", lambda path: (_ for _ in ()).throw(RuntimeError("got past")))
    with pytest.raises(RuntimeError, match="got past"):
        check_in_process(BY_ID["vllm-python-bin-true"], tmp_path, capsys)


def test_catches_the_state_limit_naming_a_flag_check_lacks(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from lifecycle.check import explore

    def old(limit: int, flags: str) -> RuntimeError:
        return RuntimeError(f"more than {limit} job states: raise --max-states or use fewer engines")

    monkeypatch.setattr(explore, "StateLimitError", old)
    with pytest.raises(RuntimeError, match="--max-states"):
        test_the_state_limit_names_flags_check_has("1", tmp_path, capsys, monkeypatch)


def test_catches_a_driver_that_sends_no_token(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The old join: ray.init(address=...) alone, which sends Ray 2.60's token only under RAY_AUTH_MODE=token."""
    from engines import rayconnect

    monkeypatch.setattr(rayconnect, "use_cluster_token", lambda address: False)
    with pytest.raises(AssertionError):
        test_a_driver_sends_the_token_it_has(tmp_path)
