"""Small helpers many suites need, kept in one place (``from tests.helpers import ...``).

Fixtures live in the ``conftest.py`` files; these are plain functions and paths, importable from a test
module, a harness such as ``tests/reliability/badinput.py`` or a fixture alike.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import socket
import tempfile
from collections.abc import Coroutine, Iterator
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
# Real runs' event logs, checked in once and read by the lifecycle, trainer and browser suites.
EVENT_LOGS = REPO / "tests" / "lifecycle" / "data"
GOLDEN_RUN = REPO / "tests" / "trainer" / "app" / "golden" / "short-run.events.jsonl"


@contextlib.contextmanager
def short_tmp(prefix: str = "rh-") -> Iterator[str]:
    """A fresh directory directly under /tmp, removed after: a Ray head's temp dir (its socket paths must fit in 107
    bytes; pytest's tmp paths under pytest-xdist, ``.../popen-gw0/...``, do not)."""
    path = tempfile.mkdtemp(prefix=prefix, dir="/tmp")
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def free_port() -> int:
    """A local TCP port nothing listens on now (the OS picks it; a caller binds it soon after)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def alive(pid: int) -> bool:
    """A process that exists and is not a zombie (dead, its parent has not reaped it yet): ``os.kill(pid, 0)``
    alone calls a zombie alive, and a test that waits for a death would wait for the reaping instead."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:  # gone, or going while read
        return False
    return fields[0] not in ("Z", "X")


class OwnLoop:
    """A test's engine slot with its own event loop: the slot's HTTP session belongs to the loop it was made on, so
    every call of a module's tests runs on that one."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()

    def run(self, coro: Coroutine[Any, Any, Any]) -> Any:
        return self.loop.run_until_complete(coro)
