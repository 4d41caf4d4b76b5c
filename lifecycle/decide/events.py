"""The lifecycle event log: one structlog-style event dict per transition, to JSONL, memory or structlog.

Events are plain dicts built by two small processors, structlog's context merge (context such as
``rollout_id`` and ``weight_version``, bound with :func:`bind_context` or structlog's own
``bind_contextvars``) and a UTC timestamp. They are called directly rather than through a
structlog ``BoundLogger``: the log is on the hot path of every transition, and the proxy cost
more than the processors themselves (benchmark P3). Sinks receive the finished dict. With no sink
attached, emitting costs one attribute check, so 10,000 quiet engine machines stay cheap. The
canonical form drops timestamps, which makes two runs' logs comparable line by line.

:meth:`EventLog.batch` holds the JSONL sink's lines for one synchronous burst of events (the runner's
step of the core: its moves, its ledger, the facts of the work that came back) and writes them with
one ``write(2)`` when the burst ends -- before the runner hands out a command or yields to the event
loop, so what is on disk still precedes any I/O it records (benchmark P3: ~37 writes per RL step
become ~15). Sinks read the event dict and never change it: a held line is encoded when its burst ends.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from itertools import islice
from json.encoder import encode_basestring_ascii
from pathlib import Path
from typing import Any, Protocol, TypedDict, runtime_checkable

import structlog
import structlog.contextvars
from structlog.contextvars import bound_contextvars, merge_contextvars

from lifecycle.decide import jsonio
from lifecycle.decide.faults import FAULT_FIRED, FAULT_INJECTED
from lifecycle.decide.schema import Mismatch, SchemaError, checker

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

DETACHED = "engine.detached"  # an external engine let go (its owner must restart it): url, reason, fix
ROUTER_STARTED = "router.started"  # a router (the gateway) process started, or was restarted
WEIGHT_BUCKET = "weight_sync.bucket"  # one bucket of a broadcast weight update sent
# --fully-async: a group of samples completed by the stream, taken by the trainer, or dropped as too stale
GROUP_BUFFERED = "stream.group_buffered"  # group, oldest (its oldest token's weight version), versions, engines
GROUP_TAKEN = "stream.group_taken"  # group, oldest, version (the committed one it is trained against), bound
GROUP_DROPPED = "stream.group_dropped"  # group, oldest, version, bound, prompts (re-queued)
HANDED_BACK = "stream.handed_back"  # the requests an engine kept through a failed update, re-sent elsewhere
# an elastic fleet (--rollout-min-num-gpus / --rollout-max-num-gpus): who is a member, who leaves, who is routed
FLEET = "fleet.scaled"  # the desired member count changed (a scale op) or a reconcile ended: target, members, bounds
PREEMPT_NOTICE = "engine.preempt_notice"  # an engine will be taken away: its deadline, and who said so
DRAINED = "engine.drained"  # a leaving engine's requests in flight finished, or the drain bound passed first
GATEWAY_MEMBERS = "gateway.members"  # one router's whole worker list, as it reported it (GET /workers)
SYNC_CONNECTED = "weight_sync.connected"  # a broadcast group formed: its generation, world size and members
SYNC_DESTROYED = "weight_sync.destroyed"  # a broadcast group torn down (membership changed, a failure, the end)


# -- what each kind of event holds: the one definition its writer is typed with and every reader checks --------
# Each field an event holds is typed; one it lacks is left to the readers, which take every field with .get()
# (a log of an older writer, a test's hand-written lines). A field no schema names is left alone.
class EventFields(TypedDict, total=False):
    """Every event: its kind, its time, and the context bound around it (:func:`bind_context`)."""

    event: str
    ts: str
    step: int
    rollout_id: int
    reason: str  # the news that moved an engine (the runner binds it)
    done_at: str  # when a fact's I/O was done


class TransitionEvent(EventFields, total=False):
    machine: str
    instance: str
    seq: int
    src: str
    dst: str
    trigger: str
    guards: dict[str, bool]
    effects: list[str]


class BlockedEvent(EventFields, total=False):
    machine: str
    instance: str
    state: str
    trigger: str
    guards: dict[str, bool]
    blocked_by: list[str]


class FencedEvent(EventFields, total=False):
    machine: str
    instance: str
    state: str
    trigger: str
    news: str
    epoch: int
    current_epoch: int


class StartedEvent(EventFields, total=False):
    config: dict[str, Any]  # LifecycleConfig.to_dict(): `trace check` builds the config from it
    engines: int
    evals: int


class ViolatedEvent(EventFields, total=False):
    invariant: str
    problem: str
    at: int
    events: list[str]
    instance: str


class CommittedEvent(EventFields, total=False):
    weight_version: str | None


Version = str | int | None  # as a server reported it (a foreign server may say a number, or nothing)


class ProbeEvent(EventFields, total=False):
    instance: str
    by: str
    outcome: str
    seconds: float
    stale: bool
    epoch: int


class WeightsEvent(EventFields, total=False):
    instance: str
    epoch: int
    weight_version: Version
    transfer: str
    outcome: str


class MemoryEvent(EventFields, total=False):
    instance: str
    epoch: int
    op: str
    tag: str
    outcome: str


class GatewayEvent(EventFields, total=False):
    instance: str
    router: str
    status: str | None
    weight_version: Version
    epoch: int


class AdoptedEvent(EventFields, total=False):
    instance: str
    epoch: int
    server_pid: int | None
    weight_version: Version
    updating: bool
    outcome: str


class RoutedEvent(EventFields, total=False):
    instance: str
    router: str


class CheckpointedEvent(EventFields, total=False):
    resume_at: int
    weight_version: str
    path: str


class ResumedEvent(EventFields, total=False):
    resume_at: int
    weight_version: str
    checkpoint: str
    discarded_steps: list[int]
    torn_bytes: int


class SourceEvent(EventFields, total=False):
    source: str  # and its rollout_id (typed with the context)


class DetachedEvent(EventFields, total=False):
    instance: str
    url: str
    fix: str  # and the reason (typed with the context)


class RouterStartedEvent(EventFields, total=False):
    router: str
    restarts: int
    pid: int


class WeightBucketEvent(EventFields, total=False):
    index: int
    of: int
    tensors: int


class GroupEvent(EventFields, total=False):
    """One group of the stream. Versions are the committed weight versions (integers as text, like
    ``weights.committed``); ``oldest`` is the version its oldest token was generated under, ``versions`` every
    version its samples' tokens may have come from (their spans)."""

    group: str
    oldest: str
    versions: list[str]
    version: str
    bound: int
    engines: list[str]
    prompts: int
    restored: bool  # buffered: a group a resumed run restored from its job checkpoint, with its recorded versions


class HandedBackEvent(EventFields, total=False):
    instance: str
    requests: int


class FleetEvent(EventFields, total=False):
    """Desired vs allocated vs routable, in engines (Dynamo's engine-group states): ``target`` the members wanted,
    ``members`` the slots that hold or will hold a member, ``serving`` the routable ones."""

    target: int
    members: list[str]
    serving: list[str]
    min_engines: int
    max_engines: int


class NoticeEvent(EventFields, total=False):
    instance: str
    epoch: int
    deadline_s: float  # seconds from this event to the moment the engine is taken (SIGTERM, node removed)
    by: str  # "injector", "ray" (a draining node), "user"


class DrainedEvent(EventFields, total=False):
    instance: str
    epoch: int
    running: int  # requests still running when the drain ended (0 unless it timed out)
    handed_back: int  # of them, handed back to the stream
    timed_out: bool
    seconds: float


class Worker(TypedDict, total=False):
    instance: str | None  # the engine the worker's URL belongs to (None: a URL the job does not know)
    url: str
    epoch: int | None
    status: str | None
    weight_version: Version


class GatewayMembersEvent(EventFields, total=False):
    router: str
    workers: list[Worker]


class SyncGroupEvent(EventFields, total=False):
    generation: int
    world_size: int
    members: list[str]
    why: str  # destroyed: "membership", "failed", "shutdown"


class FaultEvent(EventFields, total=False):
    """The injector's record: which fault, where, and details of its own (a pid, the actor's info, ...)."""

    fault: str
    target: str
    state: str | None
    state_before: str | None
    pid: int | None


EVENT_SCHEMAS: dict[str, type] = {
    TRANSITION: TransitionEvent,
    BLOCKED: BlockedEvent,
    FENCED: FencedEvent,
    STARTED: StartedEvent,
    VIOLATED: ViolatedEvent,
    COMMITTED: CommittedEvent,
    PROBE: ProbeEvent,
    WEIGHTS: WeightsEvent,
    MEMORY: MemoryEvent,
    GATEWAY: GatewayEvent,
    ADOPTED: AdoptedEvent,
    ROUTED: RoutedEvent,
    CHECKPOINTED: CheckpointedEvent,
    RESUMED: ResumedEvent,
    ROLLOUT_SOURCE: SourceEvent,
    DETACHED: DetachedEvent,
    ROUTER_STARTED: RouterStartedEvent,
    WEIGHT_BUCKET: WeightBucketEvent,
    GROUP_BUFFERED: GroupEvent,
    GROUP_TAKEN: GroupEvent,
    GROUP_DROPPED: GroupEvent,
    HANDED_BACK: HandedBackEvent,
    FAULT_INJECTED: FaultEvent,
    FAULT_FIRED: FaultEvent,
    FLEET: FleetEvent,
    PREEMPT_NOTICE: NoticeEvent,
    DRAINED: DrainedEvent,
    GATEWAY_MEMBERS: GatewayMembersEvent,
    SYNC_CONNECTED: SyncGroupEvent,
    SYNC_DESTROYED: SyncGroupEvent,
}
_CHECKS = {kind: checker(cls) for kind, cls in EVENT_SCHEMAS.items()}
_ANY_EVENT = checker(EventFields)  # a kind this version does not know (written later, or by an older version)
EVENT_FIX = (
    "this line is not what lifecycle run writes (the log was edited, or written by another tool): use the run's "
    "own events.jsonl, or remove the line"
)


def event_mismatch(event: Mapping[str, Any]) -> Mismatch | None:
    """The first field of one event that its writer would not have written, or None. A line without an
    ``event`` field is left alone (it is no event: :func:`lifecycle.observe.timeline.load_events` judges it)."""
    kind = event.get("event")
    if kind is None:
        return None
    check = _CHECKS.get(kind) if isinstance(kind, str) else None
    return (check or _ANY_EVENT)(event)


def event_kind(event: Mapping[str, Any]) -> str:
    """How an error names the line: ``a lifecycle.transition event``."""
    kind = event.get("event")
    if not isinstance(kind, str):
        return "the line"
    return f"{'an' if kind[:1] in ('a', 'e', 'i', 'o', 'u') else 'a'} {kind} event"


Sink = Callable[[dict[str, Any]], None]  # reads the event; must not change it (a held line is encoded later)


@runtime_checkable
class HoldingSink(Protocol):
    """A sink that can keep a burst's lines and write them at once (:meth:`EventLog.batch`): ``JsonlSink``."""

    def __call__(self, event: dict[str, Any]) -> None: ...

    def hold(self) -> None: ...

    def flush(self) -> None: ...


@runtime_checkable
class ClosingSink(Protocol):
    """A sink that holds something to release when it leaves the log (a file descriptor, an exporter)."""

    def __call__(self, event: dict[str, Any]) -> None: ...

    def close(self) -> None: ...


# one encoder, built once: json.dumps with non-default arguments builds a new one per call
_ENCODER = json.JSONEncoder(separators=(",", ":"), default=str)
_escape: Callable[[str], str] = encode_basestring_ascii  # what _ENCODER does to a str (ensure_ascii)


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


def encode_json(value: Any) -> str:
    """``value`` as the event log writes it (compact, ASCII, ``str`` for what JSON cannot say)."""
    return _ENCODER.encode(value)


def _tail(event: dict[str, Any], head: str, n: int) -> str:
    """The line of ``event`` whose first ``n`` fields ``head`` already is (``{"machine":..."event":...``,
    without its ``}``): only the fields added after them -- the context and the timestamp -- are encoded."""
    parts = [head]
    for key, value in islice(event.items(), n, None):
        kind = type(value)
        if kind is str:
            text = _escape(value)
        elif kind is int:
            text = int.__repr__(value)
        else:
            text = _ENCODER.encode(value)
        parts.append(f",{_escape(key)}:{text}")
    parts.append("}")
    return "".join(parts)


class JsonlSink:
    """Append one JSON object per line on an ``O_APPEND`` fd: one ``write(2)`` per line, or per burst
    while the log holds it (:meth:`hold`, :meth:`flush`: :meth:`EventLog.batch`).

    Whole lines per syscall mean a process killed with SIGKILL leaves only whole lines behind (at
    worst a torn last one, which :func:`read_jsonl` skips), never an interleaving. A held burst is
    written when it ends, whatever way it ends (its ``finally``); it never spans an ``await``, so a
    kill can only take the lines of the burst it interrupts -- moves whose commands were not yet out.
    A machine's move comes with the start of its line already encoded (:meth:`line`: per (machine,
    state, trigger), like the move itself), so only its context and timestamp are encoded per event.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fd: int | None = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        # the burst's events, encoded when it ends: a dict, or (dict, head, n) for :meth:`line`
        self._held: list[Any] | None = None
        self._lock = threading.Lock()  # another thread may emit while the loop's thread flushes

    def __call__(self, event: dict[str, Any]) -> None:
        if self._held is not None:
            with self._lock:
                if self._held is not None:
                    self._held.append(event)
                    return
        self._write((_ENCODER.encode(event) + "\n").encode())

    def line(self, event: dict[str, Any], head: str | None, n: int) -> None:
        """``event``, whose first ``n`` fields are ``head`` encoded (None: none are)."""
        if head is None:
            self(event)
            return
        if self._held is not None:
            with self._lock:
                if self._held is not None:
                    self._held.append((event, head, n))
                    return
        self._write((_tail(event, head, n) + "\n").encode())

    def hold(self) -> None:
        """Keep the next lines until :meth:`flush`."""
        with self._lock:
            if self._held is None:
                self._held = []

    def flush(self) -> None:
        """Write the held lines with one ``write(2)``; from now on each line is written as it comes."""
        with self._lock:
            held, self._held = self._held, None
        if held:
            encode = _ENCODER.encode
            lines = [_tail(*e) if type(e) is tuple else encode(e) for e in held]
            lines.append("")
            self._write("\n".join(lines).encode())

    def _write(self, data: bytes) -> None:
        if self._fd is None:
            raise ValueError(f"event log {self.path} is closed")
        view = memoryview(data)
        while view:  # a regular file takes it all at once; a signal may cut a large write short
            view = view[os.write(self._fd, view) :]

    def close(self) -> None:
        if self._fd is not None:
            try:
                self.flush()
            finally:
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


def _context_reader() -> Callable[[dict[str, Any]], None]:
    """structlog's ``merge_contextvars``, without its walk over every context variable of the context.

    ``merge_contextvars`` copies the context and tests each of its variables (asyncio's, aiohttp's, Ray's
    ...) for structlog's prefix. structlog keeps its own variables in one registry that only grows, so
    reading those few directly gives the same keys and values (set in this context, not unbound); the
    registry is private, so without it the processor itself is used."""
    registry: dict[str, Any] | None = getattr(structlog.contextvars, "_CONTEXT_VARS", None)
    prefix = getattr(structlog.contextvars, "STRUCTLOG_KEY_PREFIX", None)
    if not isinstance(registry, dict) or not isinstance(prefix, str):

        def merge(event_dict: dict[str, Any]) -> None:  # pragma: no cover -- another structlog
            merge_contextvars(None, "info", event_dict)

        return merge
    cut = len(prefix)
    known: list[tuple[str, Any]] = []

    def read(event_dict: dict[str, Any]) -> None:
        if len(known) != len(registry):  # a new key was bound somewhere: take the registry's snapshot again
            known[:] = [(name[cut:], var) for name, var in tuple(registry.items())]
        for key, var in known:
            value = var.get(Ellipsis)
            if value is not Ellipsis and key not in event_dict:
                event_dict[key] = value

    return read


merge_context = _context_reader()


class LogBatch:
    """:meth:`EventLog.batch`'s context manager (a class: it is entered on every step of the runner)."""

    __slots__ = ("_log",)

    def __init__(self, log: EventLog) -> None:
        self._log = log

    def __enter__(self) -> None:
        log = self._log
        log._depth += 1
        if log._depth == 1 and EventLog.batching:
            for sink in log._holding:
                sink.hold()

    def __exit__(self, *_: object) -> None:
        log = self._log
        log._depth -= 1
        if log._depth == 0:
            log.flush()


class EventLog:
    """Two processors plus sinks. Machines emit into one of these (the default one unless given)."""

    batching = True  # False: every line written as it is emitted, batch or not (benchmark P3's baseline)

    def __init__(self, sinks: list[Sink] | None = None, *, timestamps: bool = True) -> None:
        self._sinks: list[Sink] = list(sinks or [])
        self._timestamps = timestamps
        self._depth = 0
        self._batch = LogBatch(self)
        self._retarget()

    def _retarget(self) -> None:
        """What :meth:`send` calls: each sink, or its ``line`` (it takes a pre-encoded head: JsonlSink), and
        the sinks that can hold a burst's lines (hold/flush); a new list, so a sink may leave mid-event."""
        self._targets: list[tuple[Sink, Any]] = [(s, s.line if isinstance(s, JsonlSink) else None) for s in self._sinks]
        self._holding: list[HoldingSink] = [s for s in self._sinks if isinstance(s, HoldingSink)]

    @property
    def enabled(self) -> bool:
        return bool(self._sinks)

    def add_sink(self, sink: Sink) -> Sink:
        self._sinks.append(sink)
        self._retarget()  # held from the next batch on (one open now is written through)
        return sink

    def remove_sink(self, sink: Sink) -> None:
        self._sinks.remove(sink)
        self._retarget()
        if isinstance(sink, ClosingSink):
            sink.close()  # a held sink writes what it holds first

    def batch(self) -> LogBatch:
        """``with log.batch():`` -- the events inside are written to the JSONL sinks with one ``write(2)`` when
        the outermost batch ends (normally or by an exception). Synchronous code only: never across an
        ``await``, so the log on disk is never behind while the process waits."""
        return self._batch

    def flush(self) -> None:
        """Write what the sinks hold now."""
        for sink in self._holding:
            sink.flush()

    def emit(self, event: str, **fields: Any) -> None:
        """Build the event dict in structlog's key order (fields, ``event``, context, ``ts``), hand it to every sink."""
        if not self._sinks:
            return
        fields["event"] = event  # ``fields`` is this call's own dict
        self.send(fields)

    def send(self, event_dict: dict[str, Any], head: str | None = None) -> None:
        """:meth:`emit` for a dict the caller built (its fields, then ``event``) and hands over; ``head``: those
        fields as the start of its JSON line (``{"k":v,...``, no ``}``), when the caller has it encoded."""
        if not self._sinks:
            return
        n = len(event_dict)
        merge_context(event_dict)  # adds the bound context in place
        if self._timestamps:
            event_dict["ts"] = utc_now()
        for sink, line in self._targets:
            if line is None:
                sink(event_dict)
            else:
                line(event_dict, head, n)

    @contextmanager
    def capture(self) -> Iterator[MemorySink]:
        """Collect the events emitted inside the block (the test helper)."""
        sink = MemorySink()
        self.add_sink(sink)
        try:
            yield sink
        finally:
            self._sinks.remove(sink)
            self._retarget()

    @contextmanager
    def to_jsonl(self, path: str | os.PathLike[str]) -> Iterator[JsonlSink]:
        sink = JsonlSink(path)
        self.add_sink(sink)
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
    :class:`~lifecycle.decide.jsonio.JSONFileError` (a ``ValueError``) naming the file and line -- a line whose
    fields are not typed as its kind's writer types them (:data:`EVENT_SCHEMAS`) a
    :class:`~lifecycle.decide.schema.SchemaError` naming the field too. Read line by line
    through :mod:`lifecycle.decide.jsonio`, so a line nested 100,000 deep, a 5,000-digit number or ``/dev/zero`` is
    that error too, never a traceback or a read without end. NaN is allowed: a run may log one."""
    events: list[dict[str, Any]] = []
    for line in jsonio.iter_lines(path):
        if not line.raw.strip():
            continue
        try:
            event = jsonio.loads(line.raw, source=path, line=line.number, allow_nan=True)
        except jsonio.JSONFileError as exc:
            if not line.ended and is_torn_line(line.raw):  # no trailing newline: the writer died mid-line
                break
            what = "not an event log" if not events else "not a JSON event line"
            raise jsonio.JSONFileError(path, f"{what} (it {exc.problem})", line.number) from None
        if not isinstance(event, dict):  # valid JSON, but not an event (a list, a string, a number)
            raise jsonio.JSONFileError(path, f"is a JSON {type(event).__name__}, not an event object", line.number)
        wrong = event_mismatch(event)
        if wrong is not None:
            raise SchemaError(path, wrong, what=event_kind(event), fix=EVENT_FIX, line=line.number)
        events.append(event)
    return events


def cut_torn_tail(path: str | os.PathLike[str], *, max_line_bytes: int = jsonio.MAX_LINE_BYTES) -> bytes:
    """Before a new writer continues a log a killed one left (a resumed run): remove a torn last line, so the
    next event starts on a line of its own; returns what was cut (never a whole line: only an unended one).

    Only the tail is read (at most one line's bound), and only from a regular file: a log of any length costs the
    same, and a FIFO, a device or a line longer than any event is one
    :class:`~lifecycle.decide.jsonio.JSONFileError` naming the file."""
    p = Path(path)
    if not p.exists() and not p.is_symlink():
        return b""
    with jsonio.open_regular(p, "r+b") as f:
        size = f.seek(0, os.SEEK_END)
        if size == 0:
            return b""
        start = max(0, size - max_line_bytes - 1)
        f.seek(start)
        tail = f.read(size - start)
        if tail.endswith(b"\n"):
            return b""
        newline = tail.rfind(b"\n")
        if newline < 0 and start > 0:
            problem = f"ends in a line longer than {max_line_bytes:,} bytes: not an event log"
            raise jsonio.JSONFileError(p, problem)
        cut = tail[newline + 1 :]
        f.truncate(size - len(cut))
        os.fsync(f.fileno())
    return cut


@dataclass(frozen=True)
class LogFacts:
    """What a resume checks against the log of the job it continues: the highest generation (epoch) it records
    per engine instance, and the last job checkpoint it records (``(resume_at, weight_version)``)."""

    epochs: dict[str, int]
    checkpointed: tuple[int, str] | None


def log_facts(path: str | os.PathLike[str], *, max_line_bytes: int = jsonio.MAX_LINE_BYTES) -> LogFacts:
    """The :class:`LogFacts` of the event log at ``path`` (none where there is no log), read line by line from a
    regular file, each line bounded. Only lines that can hold such a fact are parsed; one that does not parse
    (the torn last line of a killed writer) tells nothing and is passed over -- validating the log is
    ``trace check``'s, this only gathers what it records."""
    epochs: dict[str, int] = {}
    checkpointed: tuple[int, str] | None = None
    p = Path(path)
    if not p.exists() and not p.is_symlink():
        return LogFacts(epochs, checkpointed)
    marker = CHECKPOINTED.encode()
    with jsonio.open_regular(p) as f:
        number = 0
        while raw := f.readline(max_line_bytes + 1):
            number += 1
            if len(raw) > max_line_bytes and not raw.endswith(b"\n"):
                problem = f"has a line longer than {max_line_bytes:,} bytes: not an event log"
                raise jsonio.JSONFileError(p, problem, number)
            if b'"epoch' not in raw and marker not in raw:
                continue
            try:
                e = jsonio.loads(raw, source=p, line=number, allow_nan=True)
            except jsonio.JSONFileError:
                continue
            if not isinstance(e, dict):
                continue
            instance = e.get("instance")
            for key in ("epoch", "current_epoch"):  # a fenced event names the generation the core counted too
                value = e.get(key)
                if isinstance(instance, str) and isinstance(value, int) and not isinstance(value, bool):
                    epochs[instance] = max(epochs.get(instance, value), value)
            if e.get("event") == CHECKPOINTED:
                at, version = e.get("resume_at"), e.get("weight_version")
                if isinstance(at, int) and not isinstance(at, bool) and isinstance(version, str):
                    checkpointed = (at, version)
    return LogFacts(epochs, checkpointed)


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
