"""The engine backends, one row each, keyed by ``--rollout-backend``: everything the runtime does differently per
backend is a column here, so no module outside this table asks which backend it runs.

A row is the runtime half of a backend: the API an engine slot speaks to its servers, the launchers a job
starts them with, the client a group's requests go through at the SMG gateway, the start-up bound, and what
``lifecycle run`` must know before anything starts (the checkpoints it serves, its own environment). The other
half, what the backend *can do* (memory release, broadcast, probes, pause modes), is data the pure core reads:
:mod:`lifecycle.decide.backends`. :func:`register` adds both halves, so a new backend is one row (and the
package its columns point at) -- ``tests/engines/third_backend`` is one, registered from a test.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from engines.api import APIFactory, sglang_api
from engines.client import EngineClient, SamplingArg
from engines.launcher import EngineSetup, LauncherFactory, launcher_factory
from engines.process import torch_engine_command
from engines.protocol import GenerateResponse
from engines.vllm.api import vllm_api
from engines.vllm.client import VLLMClient
from engines.vllm.launcher import STARTUP_TIMEOUT, TINY_LLAMA, find_python, vllm_launchers
from lifecycle.decide import backends as capabilities
from lifecycle.decide.backends import Capabilities
from lifecycle.decide.errors import ConfigError


class GatewayClient(Protocol):
    """What a group's requests go through at the SMG gateway: one prompt a call, answered in SGLang's shape."""

    async def generate(
        self, text: str | None = None, *, sampling_params: SamplingArg | None = None, return_logprob: bool | None = None
    ) -> GenerateResponse: ...

    async def close(self) -> None: ...


class GatewayFactory(Protocol):
    def __call__(self, url: str, *, name: str, timeout: float) -> GatewayClient: ...


@dataclass(frozen=True)
class Backend:
    """One engine backend's runtime half (its abilities: ``lifecycle.decide.backends.capabilities(name, device)``)."""

    name: str  # the --rollout-backend value
    api: APIFactory  # what an engine slot speaks to one of its servers (also an external one's)
    launchers: Callable[[EngineSetup], LauncherFactory]  # the servers a job starts, one launcher per slot
    gateway: GatewayFactory  # the client a group's requests go through at the SMG gateway (which forwards its API)
    startup: float = 60.0  # seconds a server may take to start, where the run gives no bound
    hf_only: bool = False  # serves Hugging Face checkpoints only (the project's char model is refused)
    tiny_llama: Mapping[str, int] = field(default_factory=dict)  # sizes of the tiny Llama --model tiny-llama builds
    # its own environment's python, found and probed before anything starts (the flag's value or None: found);
    # None: its servers run from this environment
    environment: Callable[[str | None], str] | None = None


def engine_command(seed: int, checkpoint: str | os.PathLike[str] | None) -> Callable[[], list[str]]:
    """The CPU torch engine's command line for a job: a Hugging Face initial checkpoint is also what the engines
    start from (the family is the directory's); the char model starts from the seed and gets version 0 by an
    update."""
    from engines.models.family import is_char_checkpoint  # imports torch: only where CPU engines start

    weights = None if checkpoint is None or is_char_checkpoint(Path(checkpoint)) else Path(checkpoint)
    return functools.partial(torch_engine_command, seed=seed, weights=weights)


def cpu_engine_launchers(setup: EngineSetup) -> LauncherFactory:
    """The project's CPU engine per slot (it speaks SGLang's API), on the job's initial checkpoint."""
    command = engine_command(setup.seed, setup.checkpoint)
    return launcher_factory(setup.kind, command, api_key=setup.api_key, keep=setup.keep)


def _sglang_gateway(url: str, *, name: str, timeout: float) -> GatewayClient:
    return EngineClient(url, engine_id=name, timeout=timeout)


def _vllm_gateway(url: str, *, name: str, timeout: float) -> GatewayClient:
    """vLLM's ``/v1/completions`` through SMG: its answers carry no weight version (see VLLMClient)."""
    return VLLMClient(url, engine_id=name, timeout=timeout, versioned=False)


BACKENDS: dict[str, Backend] = {
    row.name: row
    for row in (
        # the project's CPU engine (it speaks SGLang's API), or real SGLang servers
        Backend("sglang", sglang_api, cpu_engine_launchers, _sglang_gateway),
        # real vLLM servers, from their own environment (vLLM pins its own transformers)
        Backend(
            "vllm",
            vllm_api,
            vllm_launchers,
            _vllm_gateway,
            startup=STARTUP_TIMEOUT,
            hf_only=True,
            tiny_llama=TINY_LLAMA,
            environment=find_python,
        ),
    )
}


def register(row: Backend, *abilities: Capabilities) -> None:
    """Add a backend (or replace one of that name): its runtime row here, and its abilities -- one row per device
    -- where the pure core reads them. ``--rollout-backend NAME`` is then a valid choice."""
    if {can.backend for can in abilities} != {row.name}:
        raise ValueError(f"backend {row.name!r}: give its abilities, one Capabilities row per device, of that name")
    capabilities.register(*abilities)
    BACKENDS[row.name] = row


def engine_backend(name: str) -> Backend:
    """The row of ``--rollout-backend NAME`` (the config has validated the name against the registered ones)."""
    try:
        return BACKENDS[name]
    except KeyError:
        choices = ", ".join(BACKENDS)
        raise ConfigError(
            "--rollout-backend", name, "no engine backend of that name is registered", f"use one of {choices}"
        ) from None
