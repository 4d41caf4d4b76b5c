"""The lifecycle event log: one structlog event per transition, to JSONL, memory or structlog.

Events are plain dicts built by a small structlog processor chain (context vars such as
``rollout_id`` and ``weight_version``, then a timestamp). Sinks receive the finished dict. With
no sink attached, emitting costs one attribute check, so 10,000 quiet engine machines stay cheap.
The canonical form drops timestamps, which makes two runs' logs comparable line by line.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import structlog
from structlog.contextvars import bound_contextvars, merge_contextvars

TRANSITION = "lifecycle.transition"
BLOCKED = "lifecycle.blocked"
VOLATILE_KEYS = frozenset({"ts", "timestamp"})

Sink = Callable[[dict[str, Any]], None]


class JsonlSink:
    """Append one JSON object per line, each with a single ``write(2)`` on an ``O_APPEND`` fd.

    One syscall per line means a process killed with SIGKILL leaves only whole lines behind
    (at worst a torn last line, which :func:`read_jsonl` skips), never an interleaving.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fd: int | None = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def __call__(self, event: dict[str, Any]) -> None:
        if self._fd is None:
            raise ValueError(f"event log {self.path} is closed")
        os.write(self._fd, (json.dumps(event, default=str, separators=(",", ":")) + "\n").encode())

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


class MemorySink(list[dict[str, Any]]):
    """Keep events in a list (what :func:`capture` yields)."""

    def __call__(self, event: dict[str, Any]) -> None:
        self.append(event)


class StructlogSink:
    """Forward events into the application's own structlog pipeline (and ``capture_logs``)."""

    def __init__(self, name: str = "lifecycle") -> None:
        self._logger = structlog.get_logger(name)

    def __call__(self, event: dict[str, Any]) -> None:
        fields = dict(event)
        self._logger.info(fields.pop("event"), **fields)


class _Dispatch:
    """The wrapped 'logger' at the end of the processor chain: hands the dict to every sink."""

    def __init__(self, sinks: list[Sink]) -> None:
        self.sinks = sinks

    def msg(self, **event: Any) -> None:
        for sink in self.sinks:
            sink(event)

    info = msg


def _finish(_logger: Any, _name: str, event_dict: dict[str, Any]) -> dict[str, Any]:
    return event_dict


class EventLog:
    """A processor chain plus sinks. Machines emit into one of these (the default one unless given)."""

    def __init__(self, sinks: list[Sink] | None = None, *, timestamps: bool = True) -> None:
        self._sinks: list[Sink] = list(sinks or [])
        processors: list[Any] = [merge_contextvars]
        if timestamps:
            processors.append(structlog.processors.TimeStamper(fmt="iso", key="ts", utc=True))
        processors.append(_finish)
        self._logger = structlog.wrap_logger(
            _Dispatch(self._sinks), processors=processors, cache_logger_on_first_use=True
        )

    @property
    def enabled(self) -> bool:
        return bool(self._sinks)

    def add_sink(self, sink: Sink) -> Sink:
        self._sinks.append(sink)
        return sink

    def remove_sink(self, sink: Sink) -> None:
        self._sinks.remove(sink)
        close = getattr(sink, "close", None)
        if callable(close):
            close()

    def emit(self, event: str, **fields: Any) -> None:
        if self._sinks:
            self._logger.info(event, **fields)

    @contextmanager
    def capture(self) -> Iterator[MemorySink]:
        """Collect the events emitted inside the block (the test helper)."""
        sink = MemorySink()
        self._sinks.append(sink)
        try:
            yield sink
        finally:
            self._sinks.remove(sink)

    @contextmanager
    def to_jsonl(self, path: str | os.PathLike[str]) -> Iterator[JsonlSink]:
        sink = JsonlSink(path)
        self._sinks.append(sink)
        try:
            yield sink
        finally:
            self.remove_sink(sink)


DEFAULT_LOG = EventLog()


def capture(log: EventLog | None = None) -> Any:
    """``with capture() as events:`` -- events emitted to ``log`` (default log) inside the block."""
    return (log or DEFAULT_LOG).capture()


def bind_context(**values: Any) -> Any:
    """``with bind_context(rollout_id=3, weight_version="v3"):`` -- added to every event inside."""
    return bound_contextvars(**values)


def canonical(event: Mapping[str, Any]) -> dict[str, Any]:
    """The event without volatile keys (timestamps): equal for equal runs."""
    return {k: v for k, v in event.items() if k not in VOLATILE_KEYS}


def read_jsonl(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Read an event log; a torn *last* line (a killed writer) is skipped, any other bad line raises."""
    p = Path(path)
    lines = p.read_bytes().split(b"\n")
    events: list[dict[str, Any]] = []
    for number, raw in enumerate(lines, start=1):
        if not raw.strip():
            continue
        try:
            events.append(json.loads(raw))
        except json.JSONDecodeError as exc:
            if number == len(lines):  # no trailing newline: the writer died mid-line
                break
            raise ValueError(f"{p}:{number}: not a JSON event line ({exc})") from None
    return events
