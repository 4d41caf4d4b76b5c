"""A run's event log as a timeline: every machine instance a lane, every state it was in a span over wall time,
the facts that are not moves (faults, guard rejections, invariant violations, probes, weight transfers) markers on
the lane they concern. :mod:`lifecycle.observe.timeline_page` draws it as ``lifecycle trace timeline``'s page.

Why pure: it reads a finished log only, so it imports nothing of the runtime (no Ray, torch, HTTP).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any, Literal

from lifecycle.decide.events import (
    BLOCKED,
    COMMITTED,
    PROBE,
    RESUMED,
    STARTED,
    TRANSITION,
    VIOLATED,
    WEIGHTS,
    read_jsonl,
)
from lifecycle.decide.faults import FAULT_EVENTS, FAULT_INJECTED

Event = Mapping[str, Any]

LAUNCH = "launch_engine"  # the effect that starts a new process in an engine slot (a new epoch)
MarkerKind = Literal["fault", "blocked", "violation", "probe", "weights", "committed", "resumed", "event"]
Level = Literal["info", "warn", "error"]

# Lanes top to bottom: the drivers first (rollout manager, its monitor, the eval fleet, the weight
# group), then the trainer, then the many engines; machines not listed here come last, by name.
MACHINE_ORDER = ("rollout", "monitor", "eval_fleet", "weight_sync", "trainer", "engine")

DRIVER_DEAD = "no driver"  # from a driver's end (its death; a finished run continued) to the resume: no process


# -- the model -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Span:
    """One stay of one instance in one state, in seconds since the log's first event.

    ``index`` is the position (0-based, in the log) of the transition that entered the state; the
    initial state (``Init``), which nothing in the log enters, has ``None`` and starts at 0.
    """

    state: str
    start: float
    end: float
    index: int | None
    src: str | None = None
    trigger: str | None = None
    step: Any = None
    reason: str | None = None
    effects: tuple[str, ...] = ()
    process: int = 0  # the slot's process it belongs to: 0 none launched yet, n the nth launch in the lane

    @property
    def duration(self) -> float:
        return self.end - self.start

    @property
    def new_process(self) -> bool:
        """The span where a later process takes over a slot (a join after Retired, a restart): a new segment."""
        return self.process > 1 and LAUNCH in self.effects


@dataclass(frozen=True)
class Marker:
    """A fact at one instant that is not a move: drawn on ``lane`` (a lane key) or, for ``None``, the run lane."""

    kind: MarkerKind
    time: float
    index: int
    lane: str | None
    label: str
    detail: str
    level: Level = "info"


@dataclass(frozen=True)
class Lane:
    """One machine instance: its spans in time order (they tile the run without gaps) and its markers."""

    key: str
    machine: str
    instance: str
    spans: tuple[Span, ...]
    markers: tuple[Marker, ...] = ()


@dataclass(frozen=True)
class StepBand:
    """One value of the ``step`` context: from the first event carrying it to the next step's first event
    (the last step: to the last event carrying it). Events without ``step`` neither open nor close one."""

    step: Any
    start: float
    end: float
    index: int


@dataclass(frozen=True)
class Timeline:
    """Everything the page draws, in seconds since the log's first event (the lanes in display order)."""

    lanes: tuple[Lane, ...]
    markers: tuple[Marker, ...]  # the run lane's
    steps: tuple[StepBand, ...]
    duration: float
    origin: datetime | None  # the wall clock at time 0; None when the log has no timestamps (time = event number)
    events: int
    config: Mapping[str, Any] | None = None  # from lifecycle.started
    counts: Mapping[str, int] = field(default_factory=dict)

    @property
    def timed(self) -> bool:
        return self.origin is not None


# -- reading -------------------------------------------------------------------------------------


def load_events(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The events of one log with their timestamps; a torn last line is skipped (:func:`read_jsonl`).

    Raises ``ValueError`` naming the problem for what is not an event log: an empty file, JSON
    values that are not objects, objects none of which has an ``event`` field (a metrics log).
    """
    raw = read_jsonl(path)
    if not raw:
        raise ValueError(f"{path}: empty, no events (a run writes its events.jsonl as it goes)")
    for number, e in enumerate(raw, start=1):
        if not isinstance(e, dict):
            raise ValueError(f"{path}: event {number} is a JSON {type(e).__name__}, not an event object")
    if not any(isinstance(e.get("event"), str) for e in raw):
        raise ValueError(f"{path}: no line has an 'event' field, so it is not an event log (metrics.jsonl?)")
    return raw


def _parse_ts(value: object) -> datetime | None:
    if not isinstance(value, str):
        return None
    try:
        return datetime.fromisoformat(value)
    except ValueError:
        return None


def _times(events: Sequence[Event]) -> tuple[list[float], datetime | None]:
    """Seconds since the first timestamp, per event, never decreasing in log order.

    An event without a timestamp takes its predecessor's; the log order is the truth about who
    moved first, so a clock step backwards (two writers) is flattened rather than reordered. A log
    without any timestamp (``timestamps=False``) is laid out by event number instead.
    """
    stamps = [_parse_ts(e.get("ts")) for e in events]
    origin = next((s for s in stamps if s is not None), None)
    if origin is None:
        return [float(i) for i in range(len(events))], None
    out: list[float] = []
    last = 0.0
    for s in stamps:
        if s is not None:
            if (s.tzinfo is None) != (origin.tzinfo is None):  # mixed naive and aware stamps: keep the order
                s = None
            else:
                last = max(last, (s - origin).total_seconds())
        out.append(last)
    return out, origin


def _natural(text: str) -> tuple[Any, ...]:
    """``engine-2`` before ``engine-10``."""
    return tuple(int(p) if p.isdigit() else p for p in re.split(r"(\d+)", text))


def _lane_order(machine: str, instance: str) -> tuple[Any, ...]:
    rank = MACHINE_ORDER.index(machine) if machine in MACHINE_ORDER else len(MACHINE_ORDER)
    return (rank, machine if rank == len(MACHINE_ORDER) else "", _natural(instance))


def _who(e: Event) -> tuple[str, str] | None:
    machine = e.get("machine")
    if not isinstance(machine, str):
        return None
    instance = e.get("instance")
    return machine, instance if isinstance(instance, str) and instance else machine


def _text(value: object) -> str | None:
    return None if value is None else str(value)


def build_timeline(events: Sequence[Event]) -> Timeline:
    """Lanes, spans, markers and step bands of a log (as :func:`load_events` returns it)."""
    times, origin = _times(events)
    end = times[-1] if times else 0.0
    # lanes: every instance that moved or was refused a move, keyed by instance name
    keys: dict[tuple[str, str], str] = {}
    for e in events:
        if e.get("event") in (TRANSITION, BLOCKED) and (who := _who(e)) is not None and who not in keys:
            taken = set(keys.values())
            keys[who] = who[1] if who[1] not in taken else f"{who[0]}/{who[1]}"
    by_instance = {inst: key for (_, inst), key in keys.items()}
    opened: dict[str, list[Span]] = {key: [] for key in keys.values()}
    markers: dict[str | None, list[Marker]] = {key: [] for key in keys.values()}
    markers[None] = []
    steps: list[StepBand] = []
    last_step_at: float = 0.0
    config: Mapping[str, Any] | None = None
    counts = {"transitions": 0, "faults": 0, "blocked": 0, "violations": 0, "probes_failed": 0, "weights_bad": 0}

    def lane_of(*names: object) -> str | None:
        for name in names:
            if isinstance(name, str) and name in by_instance:
                return by_instance[name]
        return None

    for i, (e, t) in enumerate(zip(events, times, strict=True)):
        kind = e.get("event")
        step = e.get("step")
        if step is not None:
            if not steps or steps[-1].step != step:
                if steps:
                    steps[-1] = StepBand(steps[-1].step, steps[-1].start, t, steps[-1].index)
                steps.append(StepBand(step, t, t, i))
            last_step_at = t
        if kind == TRANSITION and (who := _who(e)) is not None:
            counts["transitions"] += 1
            spans = opened[keys[who]]
            src, dst = _text(e.get("src")), str(e.get("dst"))
            if not spans:
                spans.append(Span(src or "Init", 0.0, t, None))
            else:
                spans[-1] = replace(spans[-1], end=t)
            effects = e.get("effects")
            process = spans[-1].process + (isinstance(effects, list) and LAUNCH in effects)
            spans.append(
                Span(
                    dst,
                    t,
                    end,
                    i,
                    src=src,
                    trigger=_text(e.get("trigger")),
                    step=step,
                    reason=_text(e.get("reason")),
                    effects=tuple(str(x) for x in effects) if isinstance(effects, list) else (),
                    process=process,
                )
            )
        elif kind == BLOCKED and (who := _who(e)) is not None:
            counts["blocked"] += 1
            markers[keys[who]].append(_blocked(e, t, i, keys[who]))
        elif kind in FAULT_EVENTS:
            counts["faults"] += 1
            lane = lane_of(e.get("target"), e.get("instance"))
            markers[lane].append(_fault(e, t, i, lane))
        elif kind == VIOLATED:
            counts["violations"] += 1
            lane = lane_of(e.get("instance"))
            invariant = str(e.get("invariant", "invariant"))
            detail = _detail(f"invariant violated: {invariant}", e.get("problem"), _step_of(e), f"event #{i}")
            markers[lane].append(Marker("violation", t, i, lane, invariant, detail, "error"))
        elif kind == PROBE:
            lane = lane_of(e.get("instance"))
            ok = e.get("outcome") == "ok"
            counts["probes_failed"] += not ok
            label = f"probe {e.get('outcome')}"
            extra = f"{e.get('seconds')} s, by {e.get('by')}"
            detail = _detail(f"{e.get('instance')}: {label}", extra, _step_of(e), f"event #{i}")
            markers[lane].append(Marker("probe", t, i, lane, label, detail, "info" if ok else "warn"))
        elif kind == WEIGHTS:
            lane = lane_of(e.get("instance"))
            ok = e.get("outcome") == "loaded"
            counts["weights_bad"] += not ok
            label = f"weights v{e.get('weight_version')} {e.get('outcome')}"
            extra = f"transfer: {e.get('transfer')}"
            detail = _detail(f"{e.get('instance')}: {label}", extra, _step_of(e), f"event #{i}")
            markers[lane].append(Marker("weights", t, i, lane, label, detail, "info" if ok else "warn"))
        elif kind == COMMITTED:
            label = f"v{e.get('weight_version')}"
            detail = _detail(f"weights committed: {label}", None, _step_of(e), f"event #{i}")
            markers[None].append(Marker("committed", t, i, None, label, detail))
        elif kind == RESUMED:  # the driver ended after the event before this one; every process ended with it
            died = times[i - 1] if i else t
            for spans in opened.values():
                if spans:
                    spans[-1] = replace(spans[-1], end=died)
                    spans.append(Span(DRIVER_DEAD, died, t, i, trigger="the driver ended"))
                    spans.append(Span("Init", t, end, i, src=DRIVER_DEAD, trigger="resumed"))
            label = f"resumed at step {e.get('resume_at')} (v{e.get('weight_version')})"
            detail = _detail(label, f"from {e.get('checkpoint')}", f"steps run again: {e.get('discarded_steps')}")
            markers[None].append(Marker("resumed", t, i, None, label, f"{detail}\nevent #{i}"))
        elif kind == STARTED:
            cfg = e.get("config")
            config = cfg if isinstance(cfg, Mapping) else config
        elif isinstance(kind, str):  # any other fact (router.started, engine.memory, one added later)
            lane = lane_of(e.get("instance"), e.get("target"))
            markers[lane].append(
                Marker("event", t, i, lane, kind, _detail(kind, _fields(e), _step_of(e), f"event #{i}"))
            )
    if steps:
        steps[-1] = StepBand(steps[-1].step, steps[-1].start, last_step_at, steps[-1].index)
    lanes = [
        Lane(
            key,
            who[0],
            who[1],
            tuple(opened[key] or [Span(_first_state(events, who), 0.0, end, None)]),
            tuple(markers[key]),
        )
        for who, key in sorted(keys.items(), key=lambda item: _lane_order(*item[0]))
    ]
    return Timeline(tuple(lanes), tuple(markers[None]), tuple(steps), end, origin, len(events), config, counts)


def build_lanes(events: Sequence[Event]) -> list[Lane]:
    """One lane per machine instance, in display order: rollout, monitor, eval fleet, weight sync, trainer, engines."""
    return list(build_timeline(events).lanes)


def _first_state(events: Sequence[Event], who: tuple[str, str]) -> str:
    """An instance that never moved stayed where its first refusal found it."""
    for e in events:
        if e.get("event") == BLOCKED and _who(e) == who and isinstance(e.get("state"), str):
            return str(e["state"])
    return "Init"


def _step_of(e: Event) -> str | None:
    return None if e.get("step") is None else f"step {e.get('step')}"


def _detail(*lines: object) -> str:
    return "\n".join(str(x) for x in lines if x not in (None, ""))


def _fields(e: Event) -> str:
    shown = {k: v for k, v in e.items() if k not in ("event", "ts", "step", "rollout_id")}
    return ", ".join(f"{k}={_short(v)}" for k, v in shown.items())


def _short(value: object, limit: int = 80) -> str:
    text = value if isinstance(value, str) else json.dumps(value, default=str, sort_keys=True)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _blocked(e: Event, t: float, i: int, lane: str) -> Marker:
    blocked_by = e.get("blocked_by")
    by = ", ".join(map(str, blocked_by)) if isinstance(blocked_by, list) else _text(blocked_by)
    guards = e.get("guards")
    values = ", ".join(f"{k}={v}" for k, v in guards.items()) if isinstance(guards, Mapping) else None
    head = f"guard rejected: {e.get('trigger')} in {e.get('state')}"
    detail = _detail(head, f"blocked by {by}" if by else None, f"guards: {values}" if values else None, _step_of(e))
    return Marker("blocked", t, i, lane, f"{e.get('trigger')} blocked", _detail(detail, f"event #{i}"))


def _fault(e: Event, t: float, i: int, lane: str | None) -> Marker:
    what = "injected" if e.get("event") == FAULT_INJECTED else "fired"
    state = e.get("state_before", e.get("state"))
    detail = _detail(
        f"fault {what}: {e.get('fault')}",
        f"target: {e.get('target')}" + (f" (in {state})" if state else ""),
        _step_of(e),
        f"event #{i}",
    )
    return Marker("fault", t, i, lane, str(e.get("fault", "fault")), detail, "error")


__all__ = ["Lane", "Marker", "Span", "StepBand", "Timeline", "build_lanes", "build_timeline", "load_events"]
