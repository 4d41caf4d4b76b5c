"""``lifecycle trace timeline``: a run's timeline (:mod:`lifecycle.observe.timeline`) as one self-contained HTML
page of swimlanes.

Why a picture: ``lifecycle trace show`` prints every move, but an operator asking "what happened
in this run" wants the shape first -- which engine was down, for how long, in which step, what
was injected, which guard said no -- and the lines second. So every machine instance gets a lane,
every state it was in a coloured span over wall time (a state has one colour in every lane), and
the facts that are not moves (faults, guard rejections, invariant violations, probes, weight
transfers) are markers on the lane they concern. Details are on hover.

Why one file, inline SVG, CSS and JS: the page is attached to an incident or opened from CI
artifacts, often offline, so it must not fetch anything (no CDN, no fonts, no ``http`` at all).
Why pure: it reads a finished log only, so it imports nothing of the runtime (no Ray, torch, HTTP).

Long waits in which nothing is logged (a trainer loading, a server booting) would squeeze the
steps into slivers on a linear axis, so gaps longer than a tenth of the run are drawn narrow and
hatched, labelled with their true length (``compress_gaps=False`` keeps the axis linear). Spans
keep their true times in their data attributes and tooltips either way.
"""

from __future__ import annotations

import html
import itertools
import json
import os
import zlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from importlib import resources
from pathlib import Path

from lifecycle.decide.machines import MACHINES
from lifecycle.observe.timeline import (
    DRIVER_DEAD,
    Event,
    Lane,
    Marker,
    Span,
    Timeline,
    _detail,
    _step_of,
    _times,
    build_timeline,
    load_events,
)

# One colour per state name, whatever the machine: "Serving" is green in every lane. Grouped by
# meaning -- starting blue, idle pale, busy saturated, weights violet, trouble red/orange, gone grey --
# so the picture reads before the legend does. A state not listed gets a stable colour from its name.
STATE_COLOURS: dict[str, str] = {
    DRIVER_DEAD: "#fca5a5",
    "Init": "#e5e7eb",
    "Constructed": "#d6dde8",
    "Allocated": "#c7d2fe",
    "Initialized": "#a5b4fc",
    "Replay": "#d9f99d",
    "StartingServers": "#7dd3fc",
    "Starting": "#7dd3fc",
    "Joining": "#67e8f9",  # a new member of an elastic fleet starting: starting blue, a shade of its own
    "Connecting": "#7dd3fc",
    "Restarting": "#7dd3fc",
    "WaitingAlive": "#bae6fd",
    "Ready": "#bfdbfe",
    "Idle": "#dbeafe",
    "Paused": "#e2e8f0",
    "Quiesced": "#a7b4c6",
    "Connected": "#93c5fd",
    "Serving": "#22c55e",
    "Running": "#86efac",
    "Probing": "#86efac",
    "Pinned": "#4ade80",
    "Generating": "#059669",
    "Streaming": "#10b981",
    "PausedForUpdate": "#8b5cf6",
    "StreamCatchingUp": "#a855f7",
    "UpdatingInFlight": "#7c3aed",
    "Evaluating": "#06b6d4",
    "Training": "#2563eb",
    "Saving": "#0891b2",
    "PendingWeights": "#fcd34d",
    "LoadingWeights": "#c4b5fd",
    "LoadingSnapshot": "#c4b5fd",
    "UpdatingWeights": "#7c3aed",
    "UpdatingWeightsKVReleased": "#6d28d9",
    "Broadcasting": "#7c3aed",
    "CatchingUp": "#a855f7",
    "Offloaded": "#fbbf24",
    "WeightsOnly": "#fde68a",
    "Stale": "#facc15",
    "Unhealthy": "#f87171",
    "Recovering": "#fb923c",
    "Healing": "#fb923c",
    "Errored": "#ef4444",
    "Disconnected": "#fca5a5",
    "SkippedUnhealthy": "#fecaca",
    "SkippedPinViolation": "#fda4af",
    "Failed": "#b91c1c",
    "Stopping": "#9ca3af",
    "Stopped": "#6b7280",
    "Disposed": "#4b5563",
    # a planned leave (an elastic fleet): warm greys, apart from the red of a failure and the cool grey of a stop
    "Draining": "#d6d3d1",
    "Retiring": "#a8a29e",
    "Retired": "#78716c",
}
_FALLBACK = ("#f472b6", "#2dd4bf", "#a3e635", "#e879f9", "#38bdf8", "#facc15", "#fb7185", "#818cf8")

WIDTH = 1200  # the page's drawing, in CSS pixels
LABEL_W = 132  # the lane labels on the left
PAD_R = 20
PLOT_X = LABEL_W
PLOT_W = WIDTH - LABEL_W - PAD_R
STEP_H = 24  # the step axis above the lanes
RUN_H = 50  # the run lane: facts that belong to no instance, and the labels of faults and violations
LANE_H = 24
LANE_GAP = 7
AXIS_H = 36  # the seconds axis below the lanes
BREAK_W = 64  # a compressed gap's width
GAP_SHARE = 0.1  # a gap is compressed when it is longer than this share of the run ...
GAP_MIN_S = 1.0  # ... and longer than this


# -- drawing -------------------------------------------------------------------------------------


def state_colour(state: str) -> str:
    """The state's colour, the same in every lane and every page."""
    known = STATE_COLOURS.get(state)
    return known or _FALLBACK[zlib.crc32(state.encode()) % len(_FALLBACK)]


def _ink(fill: str) -> str:
    """Dark text on light fills, white on dark ones."""
    r, g, b = (int(fill[k : k + 2], 16) for k in (1, 3, 5))
    return "#0f172a" if 0.299 * r + 0.587 * g + 0.114 * b > 150 else "#ffffff"


def _dur(seconds: float) -> str:
    if seconds < 1e-3:
        return f"{seconds * 1e6:.0f} µs"
    if seconds < 1:
        return f"{seconds * 1e3:.0f} ms"
    if seconds < 60:
        return f"{seconds:.2f} s"
    minutes, s = divmod(round(seconds), 60)
    return f"{minutes}m {s:02d}s" if minutes < 60 else f"{minutes // 60}h {minutes % 60:02d}m"


def _at(t: float, tl: Timeline) -> str:
    if tl.origin is None:
        return f"event {int(t)}"
    return f"+{t:.3f} s ({(tl.origin + timedelta(seconds=t)).strftime('%H:%M:%S.%f')[:-3]})"


@dataclass(frozen=True)
class _Segment:
    t0: float
    t1: float
    x0: float
    x1: float
    compressed: bool


class _Scale:
    """Time to x, piecewise linear: long quiet gaps get :data:`BREAK_W` pixels, the rest shares the width."""

    def __init__(self, times: Iterable[float], duration: float, *, compress: bool) -> None:
        span = duration if duration > 0 else 1.0
        marks = sorted({0.0, duration, *times})
        limit = max(GAP_MIN_S, GAP_SHARE * span) if compress else float("inf")
        gaps = [(a, b) for a, b in itertools.pairwise(marks) if b - a > limit]
        active = span - sum(b - a for a, b in gaps)
        if active <= 0 or len(gaps) * BREAK_W > PLOT_W / 2:
            gaps, active = [], span
        pps = (PLOT_W - len(gaps) * BREAK_W) / active
        segments: list[_Segment] = []
        t, x = 0.0, float(PLOT_X)
        for a, b in gaps:
            segments.append(_Segment(t, a, x, x + (a - t) * pps, False))
            x += (a - t) * pps
            segments.append(_Segment(a, b, x, x + BREAK_W, True))
            t, x = b, x + BREAK_W
        segments.append(_Segment(t, max(span, t), x, float(PLOT_X + PLOT_W), False))
        self.segments = segments
        self.pps = pps

    def x(self, t: float) -> float:
        for s in self.segments:
            if t <= s.t1:
                if s.t1 <= s.t0:
                    return s.x0
                return s.x0 + (max(t, s.t0) - s.t0) / (s.t1 - s.t0) * (s.x1 - s.x0)
        return self.segments[-1].x1

    @property
    def breaks(self) -> list[_Segment]:
        return [s for s in self.segments if s.compressed]


def _nice_step(pps: float, min_px: float = 78.0) -> float:
    for base in (1e-3, 1e-2, 1e-1, 1.0, 10.0, 100.0, 1000.0, 10000.0):
        for m in (1, 2, 5):
            if base * m * pps >= min_px:
                return base * m
    return 60000.0


def _tick_label(t: float, step: float, timed: bool) -> str:
    if not timed:
        return f"#{int(t)}"
    if step >= 60 and t >= 60:
        minutes, s = divmod(round(t), 60)
        return f"{minutes}m{s:02d}s"
    decimals = 0 if step >= 1 else 1 if step >= 0.1 else 2 if step >= 0.01 else 3
    return f"{t:.{decimals}f} s"


def _a(value: object) -> str:
    return html.escape(str(value), quote=True)


def _lane_y(n: int) -> float:
    return STEP_H + RUN_H + LANE_GAP + n * (LANE_H + LANE_GAP)


def _span_tip(lane: Lane, s: Span, tl: Timeline) -> str:
    move = "initial state" if s.index is None else f"{s.src} → {s.state}" + (f"  ({s.trigger})" if s.trigger else "")
    doc = ""
    spec = MACHINES.get(lane.machine)
    if spec is not None and s.state in spec.state_names:
        doc = spec.state(s.state).doc
    return _detail(
        f"{lane.key} · {s.state}",
        move,
        f"reason: {s.reason}" if s.reason else None,
        f"effects: {', '.join(s.effects)}" if s.effects else None,
        " · ".join(x for x in (_step_of({"step": s.step}), None if s.index is None else f"event #{s.index}") if x),
        f"from {_at(s.start, tl)}, for {_dur(s.duration) if tl.timed else f'{int(s.duration)} events'}",
        f"process #{s.process} of this slot" + (" (a new process: a new segment)" if s.new_process else "")
        if s.process > 1
        else None,
        doc,
    )


def _svg(tl: Timeline, scale: _Scale) -> str:
    n = len(tl.lanes)
    lanes_bottom = _lane_y(n)
    height = lanes_bottom + AXIS_H
    plot_top, plot_bottom = STEP_H, lanes_bottom - LANE_GAP / 2
    out: list[str] = [
        f'<svg id="timeline-svg" width="{WIDTH}" height="{height:.0f}" viewBox="0 0 {WIDTH} {height:.0f}" '
        'role="img" aria-label="run timeline">',
        '<defs><pattern id="hatch" width="6" height="6" patternUnits="userSpaceOnUse" patternTransform="rotate(45)">'
        '<rect width="6" height="6" fill="#ffffff" fill-opacity="0.2"/>'
        '<line x1="0" y1="0" x2="0" y2="6" stroke="#334155" stroke-opacity="0.28" stroke-width="1.5"/>'
        "</pattern></defs>",
    ]
    # step bands behind everything, alternately shaded, with a labelled tick at each step's start
    out.append('<g class="steps">')
    label_end = -1e9
    for k, band in enumerate(tl.steps):
        x0, x1 = scale.x(band.start), scale.x(band.end)
        if k % 2 == 0:
            out.append(
                f'<rect class="step-band" x="{x0:.1f}" y="{plot_top}" width="{max(x1 - x0, 0):.1f}" '
                f'height="{plot_bottom - plot_top:.1f}" fill="#eef2f7"/>'
            )
        out.append(
            f'<line class="step-tick" data-step="{_a(band.step)}" x1="{x0:.1f}" x2="{x0:.1f}" y1="{plot_top - 4}" '
            f'y2="{plot_bottom:.1f}" stroke="#94a3b8" stroke-width="1" stroke-dasharray="3 3"/>'
        )
        text = f"step {band.step}"
        if x0 >= label_end + 6:
            out.append(f'<text class="step-label" x="{x0 + 3:.1f}" y="{STEP_H - 8}">{_a(text)}</text>')
            label_end = x0 + 3 + 6.6 * len(text)
    out.append("</g>")
    # lane backgrounds and labels
    out.append(
        f'<g class="run-lane"><rect x="{PLOT_X}" y="{STEP_H + 2}" width="{PLOT_W}" height="{RUN_H - 4}" '
        f'fill="none" stroke="#e2e8f0"/>'
        f'<text class="lane-label" x="{LABEL_W - 12}" y="{STEP_H + RUN_H / 2 + 4:.1f}">run</text>'
    )
    out.extend(_gaps(scale, STEP_H + 2, RUN_H - 4))
    out.extend(_run_markers(tl, scale))
    out.append("</g>")
    machine_before = None
    for k, lane in enumerate(tl.lanes):
        y = _lane_y(k)
        if machine_before is not None and lane.machine != machine_before:
            out.append(
                f'<line x1="8" x2="{WIDTH - PAD_R}" y1="{y - LANE_GAP / 2:.1f}" y2="{y - LANE_GAP / 2:.1f}" '
                'stroke="#e2e8f0"/>'
            )
        machine_before = lane.machine
        out.append(
            f'<g class="lane" data-lane="{_a(lane.key)}" data-machine="{_a(lane.machine)}" '
            f'data-instance="{_a(lane.instance)}">'
        )
        out.append(
            f'<text class="lane-label" x="{LABEL_W - 12}" y="{y + LANE_H / 2 + 4:.1f}">{_a(lane.key)}'
            f"<title>{_a(f'{lane.machine} machine, instance {lane.instance}')}</title></text>"
        )
        out.extend(_spans(tl, lane, scale, y))
        for m in lane.markers:
            out.append(_lane_marker(m, scale.x(m.time), y))
        out.append("</g>")
    # violations across everything, drawn last, on top
    for m in [*tl.markers, *(m for lane in tl.lanes for m in lane.markers)]:
        if m.kind == "violation":
            x = scale.x(m.time)
            out.append(
                f'<line class="violation-line" x1="{x:.1f}" x2="{x:.1f}" y1="{STEP_H + RUN_H}" y2="{plot_bottom:.1f}" '
                'stroke="#dc2626" stroke-width="2" stroke-opacity="0.75"/>'
            )
    out.extend(_axis(tl, scale, lanes_bottom))
    out.append("</svg>")
    return "\n".join(out)


def _gaps(scale: _Scale, y: float, h: float) -> list[str]:
    """A compressed gap's slice of one lane: hatched lightly, so the state under it still shows."""
    return [
        f'<rect class="gap" data-seconds="{b.t1 - b.t0:.3f}" x="{b.x0 + 2:.1f}" y="{y}" width="{BREAK_W - 4}" '
        f'height="{h}" fill="url(#hatch)" pointer-events="none"/>'
        for b in scale.breaks
    ]


def _marked(machine: str, state: str) -> bool:
    spec = MACHINES.get(machine)
    return spec is not None and state in spec.state_names and spec.state(state).marked


def _spans(tl: Timeline, lane: Lane, scale: _Scale, y: float) -> list[str]:
    """A lane's spans in time order, then the gap hatching, then the state names that fit, over both.

    A stay in a state that invariants care about (``marked`` in the spec: Unhealthy, Recovering,
    Failed, ...) too short to see gets a 3 px sliver drawn over its neighbours: an engine that was
    Unhealthy for a millisecond must still show red beside the fault that killed it.
    """
    rects: list[str] = []
    slivers: list[str] = []
    labels: list[str] = []
    sliver_end = -1e9
    for s in lane.spans:
        x0, x1 = scale.x(s.start), scale.x(s.end)
        w = max(x1 - x0, 1.0)
        fill = state_colour(s.state)
        index = "" if s.index is None else s.index
        rects.append(
            f'<rect class="span" data-lane="{_a(lane.key)}" data-state="{_a(s.state)}" '
            f'data-start-index="{index}" data-start="{s.start:.6f}" data-end="{s.end:.6f}" data-process="{s.process}" '
            f'x="{x0:.2f}" y="{y}" width="{w:.2f}" height="{LANE_H}" fill="{fill}">'
            f"<title>{_a(_span_tip(lane, s, tl))}</title></rect>"
        )
        if s.new_process:  # the slot's earlier process ended: this is another one's bar, cut apart from it
            rects.append(
                f'<line class="process-cut" data-lane="{_a(lane.key)}" data-process="{s.process}" x1="{x0:.2f}" '
                f'x2="{x0:.2f}" y1="{y - 2}" y2="{y + LANE_H + 2}" stroke="#111827" stroke-width="2.5" '
                'pointer-events="none"/>'
            )
        if s.src == s.state:  # a self-loop (a probe, a news item): a thin cut shows it happened
            rects.append(
                f'<line class="self-loop" x1="{x0:.2f}" x2="{x0:.2f}" y1="{y + 3}" y2="{y + LANE_H - 3}" '
                'stroke="#ffffff" stroke-opacity="0.8" pointer-events="none"/>'
            )
        if w < 3 and _marked(lane.machine, s.state):  # side by side when several follow each other
            at = max(x0, sliver_end)
            sliver_end = at + 3
            slivers.append(
                f'<rect class="sliver" x="{at:.2f}" y="{y}" width="3" height="{LANE_H}" fill="{fill}">'
                f"<title>{_a(_span_tip(lane, s, tl))}</title></rect>"
            )
        if w >= 6.2 * len(s.state) + 8:
            labels.append(
                f'<text class="span-label" x="{x0 + w / 2:.1f}" y="{y + LANE_H / 2 + 4:.1f}" '
                f'fill="{_ink(fill)}">{_a(s.state)}</text>'
            )
    return [*rects, *slivers, *_gaps(scale, y, LANE_H), *labels]


def _lane_marker(m: Marker, x: float, y: float) -> str:
    attrs = f'class="marker {m.kind}" data-marker="{m.kind}" data-lane="{_a(m.lane)}" data-index="{m.index}"'
    tip = f"<title>{_a(m.detail)}</title>"
    if m.kind == "fault":
        return (
            f"<g {attrs}>{tip}<rect x='{x - 6:.1f}' y='{y - 3}' width='12' height='{LANE_H + 6}' fill='#c026d3' "
            f"fill-opacity='0.16'/><line x1='{x:.1f}' x2='{x:.1f}' y1='{y - 3}' y2='{y + LANE_H + 3}' stroke='#c026d3' "
            f"stroke-width='2'/><path d='M{x - 6:.1f},{y - 7} L{x + 6:.1f},{y - 7} L{x:.1f},{y + 3} Z' "
            "fill='#c026d3' stroke='#ffffff' stroke-width='1'/></g>"
        )
    if m.kind == "violation":
        cy = y + LANE_H / 2
        return (
            f"<g {attrs}>{tip}<circle cx='{x:.1f}' cy='{cy:.1f}' r='8' fill='#dc2626' stroke='#ffffff' "
            f"stroke-width='1.5'/><text class='violation-mark' x='{x:.1f}' y='{cy + 4:.1f}'>!</text></g>"
        )
    if m.kind == "blocked":
        yb = y + LANE_H
        return (
            f"<g {attrs}>{tip}<path d='M{x - 4:.1f},{yb + 1} L{x + 4:.1f},{yb + 1} L{x:.1f},{yb - 6} Z' "
            "fill='#f59e0b' stroke='#78350f' stroke-width='0.8'/></g>"
        )
    if m.kind == "probe":
        yb = y + LANE_H - 4
        if m.level == "info":
            return f"<g {attrs}>{tip}<circle cx='{x:.1f}' cy='{yb}' r='2' fill='#14532d' fill-opacity='0.7'/></g>"
        return (
            f"<g {attrs}>{tip}<path d='M{x - 3:.1f},{yb - 3} L{x + 3:.1f},{yb + 3} M{x - 3:.1f},{yb + 3} "
            f"L{x + 3:.1f},{yb - 3}' stroke='#b91c1c' stroke-width='2'/></g>"
        )
    if m.kind == "weights":
        colour = "#4c1d95" if m.level == "info" else "#ea580c"
        return (
            f"<g {attrs}>{tip}<path d='M{x:.1f},{y + 1} L{x + 3.5:.1f},{y + 4.5} L{x:.1f},{y + 8} "
            f"L{x - 3.5:.1f},{y + 4.5} Z' fill='{colour}' stroke='#ffffff' stroke-width='0.6'/></g>"
        )
    return (
        f"<g {attrs}>{tip}<line x1='{x:.1f}' x2='{x:.1f}' y1='{y}' y2='{y + 6}' stroke='#334155' "
        "stroke-width='1.5'/></g>"
    )


def _run_markers(tl: Timeline, scale: _Scale) -> list[str]:
    """The run lane: a label for every fault and violation (two rows of pills), facts of no lane as symbols."""
    out: list[str] = []
    rows_end = [-1e9, -1e9]
    labelled = [m for m in [*tl.markers, *(m for lane in tl.lanes for m in lane.markers)] if m.kind in _LABELLED]
    for m in sorted(labelled, key=lambda m: m.time):
        x = scale.x(m.time)
        colour = _PILL[m.kind][0]
        text = f"{_PILL[m.kind][1]} {m.label}"
        width = 6.4 * len(text) + 12
        left = x - 6 if x + width < PLOT_X + PLOT_W else x - width + 6
        row = next((r for r in (0, 1) if left >= rows_end[r] + 4), None)
        top = STEP_H + 4 + (row or 0) * 17
        if m.lane is not None:  # a dashed lead from the label down to the lane it concerns
            lane_y = _lane_y(next(k for k, lane in enumerate(tl.lanes) if lane.key == m.lane))
            out.append(
                f"<line class='lead' x1='{x:.1f}' x2='{x:.1f}' y1='{top + 15}' y2='{lane_y - 7:.1f}' "
                f"stroke='{colour}' stroke-width='1' stroke-dasharray='2 2'/>"
            )
        if row is None:  # no room for the words: the symbol (and its tooltip) still says it
            continue
        rows_end[row] = left + width
        out.append(
            f"<g class='marker-label {m.kind}' data-marker='{m.kind}-label' data-index='{m.index}'>"
            f"<title>{_a(m.detail)}</title><rect x='{left:.1f}' y='{top}' width='{width:.1f}' "
            f"height='15' rx='7.5' fill='{colour}'/><text class='pill' x='{left + 7:.1f}' y='{top + 11}'>"
            f"{_a(text)}</text></g>"
        )
    y = STEP_H + RUN_H - 10  # symbols along the bottom, under the pills
    for m in tl.markers:
        x = scale.x(m.time)
        attrs = f'class="marker {m.kind}" data-marker="{m.kind}" data-index="{m.index}"'
        tip = f"<title>{_a(m.detail)}</title>"
        if m.kind == "committed":
            shape = f"<path d='M{x:.1f},{y - 6} L{x + 5:.1f},{y} L{x:.1f},{y + 6} L{x - 5:.1f},{y} Z' fill='#7c3aed'/>"
        elif m.kind == "violation":
            shape = (
                f"<circle cx='{x:.1f}' cy='{y}' r='7' fill='#dc2626' stroke='#ffffff' stroke-width='1.5'/>"
                f"<text class='violation-mark' x='{x:.1f}' y='{y + 4}'>!</text>"
            )
        elif m.kind == "fault":
            shape = f"<path d='M{x - 6:.1f},{y - 6} L{x + 6:.1f},{y - 6} L{x:.1f},{y + 5} Z' fill='#c026d3'/>"
        else:
            shape = f"<circle cx='{x:.1f}' cy='{y}' r='3' fill='#94a3b8'/>"
        out.append(f"<g {attrs}>{tip}{shape}</g>")
    return out


_PILL = {"fault": ("#c026d3", "⚡"), "violation": ("#dc2626", "✖"), "resumed": ("#059669", "↻")}
_LABELLED = frozenset(_PILL)


def _axis(tl: Timeline, scale: _Scale, top: float) -> list[str]:
    y = top + 2
    out = [
        '<g class="axis">',
        f'<line x1="{PLOT_X}" x2="{PLOT_X + PLOT_W}" y1="{y}" y2="{y}" stroke="#64748b"/>',
        f'<text class="axis-name" x="{LABEL_W - 26}" y="{y + 16}">{"seconds" if tl.timed else "event"}</text>',
    ]
    step = _nice_step(scale.pps) if tl.timed else max(1.0, _nice_step(scale.pps))
    last = -1e9
    for seg in scale.segments:
        if seg.compressed:
            mid = (seg.x0 + seg.x1) / 2
            out.append(
                f'<path d="M{mid - 5:.1f},{y + 5} L{mid - 1:.1f},{y - 5} '
                f'M{mid + 1:.1f},{y + 5} L{mid + 5:.1f},{y - 5}" '
                f'stroke="#64748b" stroke-width="1.3"/><text class="gap-label" x="{mid:.1f}" y="{y + 28}">'
                f"+{_a(_dur(seg.t1 - seg.t0))}</text>"
            )
            last = seg.x1 - 20
            continue
        k = -(-seg.t0 // step)  # the first multiple of step at or after t0
        while k * step <= seg.t1 + 1e-9:
            t = k * step
            x = scale.x(t)
            if x - last >= 46 and x <= PLOT_X + PLOT_W + 0.5:
                out.append(
                    f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{y}" y2="{y + 5}" stroke="#64748b"/>'
                    f'<text class="tick" x="{x:.1f}" y="{y + 17}">{_a(_tick_label(t, step, tl.timed))}</text>'
                )
                last = x
            k += 1
    out.append("</g>")
    return out


def _legend(tl: Timeline) -> str:
    seen: dict[str, None] = {}
    for s in sorted((s for lane in tl.lanes for s in lane.spans), key=lambda s: (s.start, s.index or -1)):
        seen.setdefault(s.state, None)
    items = [
        f'<span class="key" data-state="{_a(st)}"><i style="background:{state_colour(st)}"></i>{_a(st)}</span>'
        for st in seen
    ]
    kinds = {m.kind for m in [*tl.markers, *(m for lane in tl.lanes for m in lane.markers)]}
    symbols = [
        ("fault", '<b class="sym" style="color:#c026d3">▼</b>fault injected'),
        ("violation", '<b class="sym dot" style="background:#dc2626">!</b>invariant violated'),
        ("blocked", '<b class="sym" style="color:#f59e0b">▲</b>guard rejection'),
        ("probe", '<b class="sym" style="color:#14532d">•</b>probe (✕ failed)'),
        ("weights", '<b class="sym" style="color:#4c1d95">◆</b>weights loaded (orange: not)'),
        ("committed", '<b class="sym" style="color:#7c3aed">◆</b>weights committed'),
        ("event", '<b class="sym" style="color:#94a3b8">●</b>other event'),
    ]
    marks = [f'<span class="key">{text}</span>' for kind, text in symbols if kind in kinds]
    if any(s.new_process for lane in tl.lanes for s in lane.spans):
        marks.append('<span class="key"><b class="sym" style="color:#111827">|</b>a new process in the slot</span>')
    marks.append('<span class="key"><i class="hatch"></i>quiet gap, drawn narrow</span>')
    return (
        f'<div class="legend"><div class="states">{"".join(items)}</div><div class="marks">{"".join(marks)}</div></div>'
    )


def _count(n: int, one: str, many: str | None = None) -> str | None:
    return None if not n else f"{n} {one if n == 1 else many or one + 's'}"


def _summary(tl: Timeline, source: str | None) -> str:
    c = tl.counts
    parts = [
        f"{tl.origin.strftime('%Y-%m-%d %H:%M:%S')} UTC" if tl.origin else "no timestamps (x: event number)",
        _dur(tl.duration) if tl.timed else None,
        f"{tl.events} events",
        f"{c.get('transitions', 0)} transitions",
        f"{len(tl.lanes)} lanes",
        f"{len(tl.steps)} steps" if tl.steps else None,
        _count(c.get("faults", 0), "fault"),
        _count(c.get("blocked", 0), "guard rejection"),
        _count(c.get("probes_failed", 0), "failed probe"),
        _count(c.get("weights_bad", 0), "weight transfer not loaded", "weight transfers not loaded"),
    ]
    text = " · ".join(_a(p) for p in parts if p)
    v = c.get("violations", 0)
    text += f' · <span class="{"bad" if v else "good"}">{v} invariant violation{"" if v == 1 else "s"}</span>'
    where = f'<div class="source">{_a(source)}</div>' if source else ""
    facts = [m for m in [*tl.markers, *(m for lane in tl.lanes for m in lane.markers)] if m.kind in _LABELLED]
    rows = "".join(
        f'<li class="{m.kind}">{_a(_at(m.time, tl))} · {_a(m.detail.replace(chr(10), " · "))}</li>'
        for m in sorted(facts, key=lambda m: m.time)[:20]
    )
    notable = f'<ul class="notable">{rows}</ul>' if rows else ""
    config = ""
    if tl.config:
        config = (
            "<details><summary>config (lifecycle.started)</summary>"
            f"<pre>{_a(json.dumps(tl.config, indent=2, sort_keys=True, default=str))}</pre></details>"
        )
    return f'{where}<div class="summary">{text}</div>{notable}{config}'


def _asset(name: str) -> str:
    """The page's CSS and script, kept as files (package data) so editors and linters treat them as such."""
    return (resources.files("lifecycle.observe") / "assets" / name).read_text(encoding="utf-8")


def render_html(
    events: Sequence[Event],
    title: str = "Run timeline",
    *,
    source: str | None = None,
    compress_gaps: bool = True,
) -> str:
    """The whole page: header (summary, faults and violations, config), legend, and the SVG swimlanes."""
    tl = build_timeline(events)
    times, _ = _times(events)
    scale = _Scale(times, tl.duration, compress=compress_gaps and tl.timed)
    return (
        "<!DOCTYPE html>\n"
        f'<html lang="en"><head><meta charset="utf-8"><title>{_a(title)}</title>'
        f"<style>\n{_asset('timeline.css')}</style></head>\n"
        f'<body><div id="timeline" data-lanes="{len(tl.lanes)}"><header><h1>{_a(title)}</h1>{_summary(tl, source)}'
        f"</header>{_legend(tl)}\n{_svg(tl, scale)}\n</div>"
        # the script shows each <title> at once, styled (the native tooltip waits a second); it moves the text
        # into data-tip, so the text stays in the page for readers without JS
        f'<div id="tip"></div><script>\n{_asset("timeline.js")}</script></body></html>\n'
    )


def output_path(events_path: str | os.PathLike[str], out_path: str | os.PathLike[str] | None = None) -> Path:
    """Where the page goes: ``timeline.html`` next to the log by default, or inside ``out_path`` if a directory."""
    if out_path is None:
        return Path(events_path).parent / "timeline.html"
    out = Path(out_path)
    return out / "timeline.html" if out.is_dir() else out


def write_timeline(
    events_path: str | os.PathLike[str],
    out_path: str | os.PathLike[str] | None = None,
    *,
    compress_gaps: bool = True,
) -> Path:
    """Read a log, write its timeline page, return the page's path."""
    events = load_events(events_path)
    return write_page(events, events_path, output_path(events_path, out_path), compress_gaps=compress_gaps)


def write_page(
    events: Sequence[Event],
    events_path: str | os.PathLike[str],
    out: Path,
    *,
    compress_gaps: bool = True,
) -> Path:
    """Write the page of events already read from ``events_path`` (named in its title) to ``out``."""
    page = render_html(
        events, title=f"Run timeline: {Path(events_path).name}", source=str(events_path), compress_gaps=compress_gaps
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(page, encoding="utf-8")
    return out


__all__ = ["STATE_COLOURS", "output_path", "render_html", "state_colour", "write_page", "write_timeline"]
