"""A leaving engine's drain: withdrawn from its router already, it is watched until the requests it holds reach 0.

The count is the server's own (its backend row's :class:`~lifecycle.decide.backends.RunningCount`: the CPU
engine's ``/server_info``, SGLang's and vLLM's Prometheus gauges), running and waiting, polled, never inferred
from the callers: a request the gateway forwarded before the withdrawal is still the engine's to answer, running or
queued. The wait is bounded (``bound``: the smaller of ``--rollout-drain-timeout`` and a notice's deadline less a
margin); running out of it is an answer (``timed_out``, with the count left), never a hang.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from engines.errors import EngineError, EngineProtocolError
from engines.http import HTTPTransport
from lifecycle.decide.backends import RunningCount

POLL_S = 0.1  # between two reads of the count: a request's tail is a few decode steps
READ_TIMEOUT_S = 5.0  # one read of the count (never past the bound)
ZERO_READS = 2  # a drain ends on this many reads of 0 in a row, POLL_S apart (see drain())


@dataclass(frozen=True)
class Drain:
    """How a drain ended: ``running`` left (0 unless it timed out; -1: never read), after ``seconds``."""

    running: int
    timed_out: bool
    seconds: float
    error: str = ""  # the last read's failure, when the count could not be read


def parse_running(source: RunningCount, text: str, where: str = "") -> int:
    """The requests the server holds in one answer of ``source.path``: running, plus waiting where the row names it."""
    names = (source.name,) if source.waiting is None else (source.name, source.waiting)
    return sum(_count(source, name, text, where) for name in names)


def _count(source: RunningCount, name: str, text: str, where: str) -> int:
    if source.format == "prometheus":
        total, seen = 0.0, False
        for line in text.splitlines():
            if line.startswith("#") or line.split("{", 1)[0].split(" ", 1)[0] != name:
                continue
            try:
                total += float(line.rsplit(" ", 1)[1])
            except (IndexError, ValueError):
                continue
            seen = True
        if not seen:
            raise EngineProtocolError(where, source.path, f"no series {name!r} in the answer")
        return int(total)
    try:
        data: Any = json.loads(text)
    except ValueError:
        raise EngineProtocolError(where, source.path, f"expected a JSON body, got {text[:200]!r}") from None
    rows = (data.get("internal_states") or [data]) if isinstance(data, dict) else []
    counts = [row[name] for row in rows if isinstance(row, dict) and isinstance(row.get(name), int)]
    if not counts:
        raise EngineProtocolError(where, source.path, f"no integer {name!r} in the answer")
    return sum(counts)


async def read_running(client: HTTPTransport, source: RunningCount, timeout: float) -> int:
    """One bounded read of the server's running count (raises :class:`EngineError`)."""
    return parse_running(source, await client._call("GET", source.path, timeout=timeout), client.engine_id)


async def drain(read: Callable[[float], Awaitable[int]] | None, bound: float, *, poll: float = POLL_S) -> Drain:
    """Poll ``read(timeout)`` until it says 0 twice in a row or ``bound`` seconds passed (``read`` None: the
    server tells nothing, so the whole bound is waited). Twice: a real vLLM server's gauges read 0 once, 0.1 s into
    a drain, while its one request ran on to its 6,000th token (CI, 2026-12-07); leaving then would have stopped
    the engine under it. A failed read is retried until the bound: a dead server's death is its watcher's news,
    not the drain's."""
    start = time.monotonic()
    end = start + max(0.0, bound)
    running, error, zeros = -1, "", 0
    while True:
        left = end - time.monotonic()
        if read is not None:
            try:
                running = await read(max(0.05, min(READ_TIMEOUT_S, left)))
                error, zeros = "", zeros + 1 if running == 0 else 0
            except EngineError as exc:
                error, zeros = str(exc), 0
            if zeros == ZERO_READS:
                return Drain(0, False, round(time.monotonic() - start, 3))
        left = end - time.monotonic()
        if left <= 0:
            return Drain(running, True, round(time.monotonic() - start, 3), error)
        await asyncio.sleep(min(poll, left))
