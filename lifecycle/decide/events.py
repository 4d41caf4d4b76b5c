"""The lifecycle event log: one structlog-style event dict per transition, to JSONL, memory or structlog.

Events are plain dicts built by two small processors, structlog's ``merge_contextvars`` (context
such as ``rollout_id`` and ``weight_version``, bound with :func:`bind_context` or structlog's own
``bind_contextvars``) and a UTC timestamp. They are called directly rather than through a
structlog ``BoundLogger``: the log is on the hot path of every transition, and the proxy cost
more than the processors themselves (benchmark P3). Sinks receive the finished dict. With no sink
attached, emitting costs one attribute check, so 10,000 quiet engine machines stay cheap. The
canonical form drops timestamps, which makes two runs' logs comparable line by line.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import structlog
from structlog.contextvars import bound_contextvars, merge_contextvars

from lifecycle.decide import jsonio

TRANSITION = "lifecycle.transition"
BLOCKED = "lifecycle.blocked"
FENCED = "lifecycle.fenced"  # news about an older generation of an engine (its epoch), not acted on
# The facts the shells report next to the machines' moves: what the I/O did (the live invariant monitor, the
# metrics and the timeline read them; lifecycle.observe.monitor names which invariant each one feeds).
STARTED = "lifecycle.started"  # the log's first line: the validated config, so a finished log can be judged
VIOLATED = "lifecycle.invariant_violated"
COMMITTED = "weights.committed"  # the version every engine of the job must serve from now on
PROBE = "engine.probe"  # one liveness probe sent to a server: outcome, seconds
WEIGHTS = "engine.weights"  # a weight transfer verified (or not) against the server's /model_info
MEMORY = "engine.memory"  # a release/resume of one memory tag, as sent to the server
GATEWAY = "gateway.worker"  # what the gateway (SMG) reports for one engine's worker: status, weight_version label
ADOPTED = "engine.adopted"  # a kept engine read back by a new driver: epoch, server pid, version, the verdict
ROUTED = "engine.routed"  # an engine published to its router (a withdrawal is the stop_routing effect itself)
CHECKPOINTED = "job.checkpointed"  # a job checkpoint is complete on disk (step, weight_version, path)
RESUMED = "job.resumed"  # a new driver continues the job of this log from a checkpoint (--resume / --load)
ROLLOUT_SOURCE = "rollout.source"  # where a rollout's samples come from: "replay" or "rollout_fn"
VOLATILE_KEYS = frozenset({"ts", "timestamp", "done_at"})  # done_at: when a fact's I/O was done (the runner's stamp)

Sink = Callable[[dict[str, Any]], None]

# one encoder, built once: json.dumps with non-default arguments builds a new one per call
_ENCODER = json.JSONEncoder(separators=(",", ":"), default=str)


class _UtcClock:
    """ISO-8601 UTC timestamps in the shape of structlog's ``TimeStamper(fmt="iso", utc=True)``.

    One difference: the fraction always has six digits (``isoformat`` drops it when the
    microseconds are 0), so the strings have a fixed width and sort in time order.

    The date-and-second prefix is formatted once per second; within it only the microseconds
    change, so a timestamp costs a ``time.time()`` and an f-string instead of a ``datetime``.
    The (second, prefix) pair is swapped as one tuple, so threads never mix two seconds' parts.
    """

    __slots__ = ("_cached",)

    def __init__(self) -> None:
        self._cached: tuple[int, str] = (-1, "")

    def __call__(self) -> str:
        now = time.time()
        second = int(now)
        cached = self._cached
        if cached[0] != second:
            cached = (second, datetime.fromtimestamp(second, tz=UTC).strftime("%Y-%m-%dT%H:%M:%S"))
            self._cached = cached
        return f"{cached[1]}.{int((now - second) * 1e6):06d}Z"


utc_now = _UtcClock()


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
        os.write(self._fd, (_ENCODER.encode(event) + "\n").encode())

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


class EventLog:
    """Two processors plus sinks. Machines emit into one of these (the default one unless given)."""

    def __init__(self, sinks: list[Sink] | None = None, *, timestamps: bool = True) -> None:
        self._sinks: list[Sink] = list(sinks or [])
        self._timestamps = timestamps

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
        """Build the event dict in structlog's key order (fields, ``event``, context, ``ts``), hand it to every sink."""
        if not self._sinks:
            return
        event_dict: dict[str, Any] = {**fields, "event": event}
        merge_contextvars(None, "info", event_dict)  # adds the bound context in place
        if self._timestamps:
            event_dict["ts"] = utc_now()
        for sink in self._sinks:
            sink(event_dict)

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
    """Read an event log; a torn *last* line (a killed writer) is skipped, any other bad line raises one
    :class:`~lifecycle.decide.jsonio.JSONFileError` (a ``ValueError``) naming the file and line. Read line by line
    through :mod:`lifecycle.decide.jsonio`, so a line nested 100,000 deep, a 5,000-digit number or ``/dev/zero`` is
    that error too, never a traceback or a read without end. NaN is allowed: a run may log one."""
    events: list[dict[str, Any]] = []
    for line in jsonio.iter_lines(path):
        if not line.raw.strip():
            continue
        try:
            events.append(jsonio.loads(line.raw, source=path, line=line.number, allow_nan=True))
        except jsonio.JSONFileError as exc:
            if not line.ended and is_torn_line(line.raw):  # no trailing newline: the writer died mid-line
                break
            what = "not an event log" if not events else "not a JSON event line"
            raise jsonio.JSONFileError(path, f"{what} (it {exc.problem})", line.number) from None
    return events


def cut_torn_tail(path: str | os.PathLike[str]) -> bytes:
    """Before a new writer continues a log a killed one left (a resumed run): remove a torn last line, so the
    next event starts on a line of its own; returns what was cut (never a whole line: only an unended one)."""
    p = Path(path)
    if not p.exists():
        return b""
    data = p.read_bytes()
    if not data or data.endswith(b"\n"):
        return b""
    cut = data[data.rfind(b"\n") + 1 :]
    with p.open("r+b") as f:
        f.truncate(len(data) - len(cut))
        os.fsync(f.fileno())
    return cut


def is_torn_line(raw: bytes) -> bool:
    """A last line cut short by a killed writer: the start of a JSON object, in UTF-8 (a cut may split
    one multi-byte character). Anything else -- binary garbage, plain text -- is not an event log."""
    text = raw.lstrip()
    if not text.startswith(b"{"):
        return False
    for cut in range(4):  # an incomplete UTF-8 sequence at the very end is at most 3 bytes
        try:
            text[: len(text) - cut].decode("utf-8")
        except UnicodeDecodeError:
            continue
        return True
    return False
