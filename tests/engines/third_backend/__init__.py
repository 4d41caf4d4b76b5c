"""A third engine backend, ``tertius``, added the way a project outside rl-lifecycle would add one: this package
and one row. ``register()`` puts the row in the backend table (``engines.backends``) and its abilities, one row
per device, where the pure core reads them; ``--rollout-backend tertius`` is then a valid choice everywhere.
Nothing in ``lifecycle/``, ``engines/``, ``rollout/`` or ``trainer/`` names it (``test_third_backend.py`` reads
their source to hold that).

Its server is the project's CPU engine started as another program (``server.py``), so it speaks SGLang's API;
its API is SGLang's with a record of the commands carried out through it, which shows the slot spoke to the
server through this row's API and not a default.
"""

from __future__ import annotations

import os
import sys
from dataclasses import replace
from pathlib import Path

from engines.api import ServerAPI, SGLangAPI
from engines.backends import Backend, GatewayClient, engine_command, register
from engines.client import EngineClient
from engines.launcher import EngineSetup, LauncherFactory, launcher_factory
from lifecycle.decide.backends import DEVICES, Capabilities, capabilities

NAME = "tertius"
SERVER = Path(__file__).with_name("server.py")
STARTUP = 45.0  # its own start-up bound (the built-in CPU engine's is 60 s): read from the row by the job
CALLS: list[str] = []  # the commands carried out through this row's API, in order


class TertiusAPI(SGLangAPI):
    """SGLang's API (the server is the CPU engine), recording what the slot asked of it."""

    async def ready(self, timeout: float) -> None:
        CALLS.append("ready")
        await super().ready(timeout)

    async def probe(self, endpoint: str, timeout: float) -> None:
        CALLS.append("probe")
        await super().probe(endpoint, timeout)

    async def load(self, path: str, version: str, timeout: float | None) -> str | None:
        CALLS.append("load")
        return await super().load(path, version, timeout)


def tertius_api(url: str, *, engine_id: str, api_key: str | None, timeout: float) -> ServerAPI:
    return TertiusAPI(url, engine_id=engine_id, api_key=api_key, timeout=timeout)


def command(seed: int, checkpoint: str | os.PathLike[str] | None) -> list[str]:
    """The CPU engine's command line, run as this backend's own program (``server.py``) instead of ``-m
    engines.cpu``."""
    python, dash_m, module, *args = engine_command(seed, checkpoint)()
    assert (dash_m, module) == ("-m", "engines.cpu")
    return [python, str(SERVER), *args]


def launchers(setup: EngineSetup) -> LauncherFactory:
    return launcher_factory(
        setup.kind,
        lambda: command(setup.seed, setup.checkpoint),
        api_key=setup.api_key,
        keep=setup.keep,
        api=tertius_api,
    )


def gateway(url: str, *, name: str, timeout: float) -> GatewayClient:
    return EngineClient(url, engine_id=name, timeout=timeout)  # SMG forwards SGLang's /generate to it


ROW = Backend(NAME, tertius_api, launchers, gateway, startup=STARTUP)
ABILITIES: tuple[Capabilities, ...] = tuple(
    replace(capabilities("sglang", device), backend=NAME, label="Tertius", server=f"{sys.executable} {SERVER}")
    for device in DEVICES
)


def register_tertius() -> None:
    register(ROW, *ABILITIES)
