"""``lifecycle trace timeline``: lanes, spans and markers from a log, bad input, a self-contained page."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from lifecycle.cli import main
from lifecycle.observe.timeline import build_lanes, build_timeline, load_events
from lifecycle.observe.timeline_page import STATE_COLOURS, render_html, state_colour, write_timeline
from tests.helpers import EVENT_LOGS

FAULT_RUN = EVENT_LOGS / "fault_run_events.jsonl"


def _tr(machine: str, instance: str, src: str, dst: str, trigger: str, **kw: object) -> dict[str, object]:
    base = {"event": "lifecycle.transition", "machine": machine, "instance": instance, "src": src, "dst": dst}
    return {**base, "trigger": trigger, **kw}


def _write(path: Path, timed: list[tuple[float, dict[str, object]]]) -> Path:
    """A log whose events happen at the given seconds after midnight."""
    lines = [json.dumps({**e, "ts": f"2026-01-01T00:00:{t:09.6f}Z"}) for t, e in timed]
    path.write_text("".join(line + "\n" for line in lines))
    return path


SMALL: list[tuple[float, dict[str, object]]] = [
    (0.0, {"event": "lifecycle.started", "config": {"use_fault_tolerance": True}}),
    (0.5, _tr("engine", "engine-10", "Init", "Starting", "start")),
    (0.6, _tr("engine", "engine-2", "Init", "Starting", "start")),
    (1.0, _tr("trainer", "trainer", "Init", "Allocated", "allocate")),
    (1.5, _tr("rollout", "rollout", "Init", "Ready", "init", step=0)),
    (2.0, _tr("engine", "engine-2", "Starting", "Serving", "ready", step=0)),
    (
        2.5,
        {
            "event": "lifecycle.blocked",
            "machine": "rollout",
            "instance": "rollout",
            "state": "Ready",
            "trigger": "offload",
            "blocked_by": ["offloads_rollout"],
            "guards": {"offloads_rollout": False},
            "step": 1,
        },
    ),
    (3.0, {"event": "fault.injected", "fault": "kill-engine:2@1", "target": "engine-2", "step": 1}),
    (3.1, _tr("engine", "engine-2", "Serving", "Unhealthy", "mark_unhealthy", step=1, reason="process died")),
    (3.2, {"event": "engine.probe", "instance": "engine-2", "outcome": "failed", "seconds": 0.5, "by": "monitor"}),
    (3.3, {"event": "weights.committed", "weight_version": "3", "step": 2}),
    (
        3.4,
        {
            "event": "engine.weights",
            "instance": "engine-10",
            "weight_version": "3",
            "transfer": "disk",
            "outcome": "refused",
        },
    ),
    (
        3.5,
        {
            "event": "lifecycle.invariant_violated",
            "invariant": "serving_engines_hold_committed_version",
            "problem": "engine-2 entered Serving holding weight version 0, committed 3",
            "instance": "engine-2",
        },
    ),
    (3.6, {"event": "lifecycle.invariant_violated", "invariant": "some_global_rule", "problem": "no instance"}),
    (3.7, {"event": "something.new", "instance": "engine-10", "x": 1}),
    (3.8, {"event": "something.else"}),
    (4.0, _tr("engine", "engine-2", "Unhealthy", "Unhealthy", "probe_failed", step=2)),
]


def test_lanes_follow_the_transitions_one_span_per_stay(tmp_path: Path) -> None:
    events = load_events(_write(tmp_path / "events.jsonl", SMALL))
    lanes = build_lanes(events)
    # drivers first, then the trainer, then engines in natural order (2 before 10)
    assert [lane.key for lane in lanes] == ["rollout", "trainer", "engine-2", "engine-10"]
    by = {lane.key: lane for lane in lanes}
    e2 = by["engine-2"].spans
    assert [s.state for s in e2] == ["Init", "Starting", "Serving", "Unhealthy", "Unhealthy"]  # a self-loop splits
    assert [s.index for s in e2] == [None, 2, 5, 8, 16]
    assert [(s.start, s.end) for s in e2] == [(0.0, 0.6), (0.6, 2.0), (2.0, 3.1), (3.1, 4.0), (4.0, 4.0)]
    assert e2[3].reason == "process died" and e2[3].src == "Serving" and e2[3].trigger == "mark_unhealthy"
    assert e2[3].step == 1 and e2[3].duration == pytest.approx(0.9)
    # the last stay lasts until the end of the log, whoever wrote the last line
    assert [(s.state, s.start, s.end) for s in by["trainer"].spans] == [("Init", 0.0, 1.0), ("Allocated", 1.0, 4.0)]
    # spans tile each lane: every span ends where the next begins
    for lane in lanes:
        assert all(a.end == b.start for a, b in zip(lane.spans, lane.spans[1:], strict=False))
        assert lane.spans[0].start == 0.0 and lane.spans[-1].end == 4.0


def test_markers_sit_on_the_lane_they_concern(tmp_path: Path) -> None:
    tl = build_timeline(load_events(_write(tmp_path / "events.jsonl", SMALL)))
    by = {lane.key: lane for lane in tl.lanes}
    e2 = {m.kind: m for m in by["engine-2"].markers}
    assert e2["fault"].label == "kill-engine:2@1" and e2["fault"].time == 3.0 and e2["fault"].index == 7
    assert e2["violation"].level == "error" and "version 0, committed 3" in e2["violation"].detail
    assert e2["probe"].level == "warn"
    blocked = by["rollout"].markers
    assert [m.kind for m in blocked] == ["blocked"] and "offloads_rollout" in blocked[0].detail
    assert {m.kind: m.level for m in by["engine-10"].markers} == {"weights": "warn", "event": "info"}
    # facts of no lane go to the run lane at the top
    assert [(m.kind, m.label) for m in tl.markers] == [
        ("committed", "v3"),
        ("violation", "some_global_rule"),
        ("event", "something.else"),
    ]
    assert tl.config == {"use_fault_tolerance": True}
    assert [(b.step, b.start, b.end) for b in tl.steps] == [(0, 1.5, 2.5), (1, 2.5, 3.3), (2, 3.3, 4.0)]
    assert tl.counts["violations"] == 2 and tl.counts["faults"] == 1 and tl.counts["blocked"] == 1


def test_the_page_is_one_offline_file_with_a_lane_and_span_per_stay(tmp_path: Path) -> None:
    events = load_events(_write(tmp_path / "events.jsonl", SMALL))
    page = render_html(events, title="t")
    assert "http://" not in page and "https://" not in page and "<link" not in page
    assert not re.search(r"\bsrc=", page)  # no external script or image
    lanes = build_lanes(events)
    assert page.count('<g class="lane"') == len(lanes)
    assert page.count('<rect class="span"') == sum(len(lane.spans) for lane in lanes)
    assert 'data-lane="engine-2" data-state="Unhealthy" data-start-index="8"' in page
    assert page.count('data-marker="violation"') == 2 and 'class="violation-line"' in page
    assert "2 invariant violations" in page
    assert page.count('data-state="Init" data-start-index="" data-start="0.000000"') == len(lanes)  # initial stays
    # a state has one colour in every lane
    fills: dict[str, set[str]] = {}
    for state, fill in re.findall(r'<rect class="span"[^>]*data-state="(\w+)"[^>]*fill="(#\w+)"', page):
        fills.setdefault(state, set()).add(fill)
    assert len(fills) >= 5 and all(len(f) == 1 for f in fills.values())
    assert state_colour("Serving") != state_colour("Unhealthy") and state_colour("Whatever") == state_colour("Whatever")


def test_the_real_fault_run_and_the_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = tmp_path / "run" / "events.jsonl"
    log.parent.mkdir()
    log.write_bytes(FAULT_RUN.read_bytes())
    assert main(["trace", "timeline", str(log)]) == 0
    out = log.parent / "timeline.html"  # default: next to the log
    assert capsys.readouterr().out.strip() == str(out)
    page = out.read_text()
    assert "http://" not in page and "https://" not in page
    lanes = build_lanes(load_events(log))
    assert [lane.key for lane in lanes] == ["rollout", "monitor", "eval_fleet", "trainer", "engine-0", "engine-1"]
    assert [m.kind for m in next(lane for lane in lanes if lane.key == "engine-1").markers] == ["fault"]
    assert 'class="gap"' in page  # the server boot and the restart are long quiet gaps, drawn narrow
    assert main(["trace", "timeline", str(log), "-o", str(tmp_path / "x" / "t.html"), "--linear"]) == 0
    assert 'class="gap"' not in (tmp_path / "x" / "t.html").read_text()
    assert write_timeline(log, tmp_path) == tmp_path / "timeline.html"  # a directory: the page goes inside


def test_a_torn_last_line_is_skipped_with_a_note(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = _write(tmp_path / "events.jsonl", SMALL[:6])
    with log.open("a") as f:
        f.write('{"event": "lifecycle.transition", "machine": "engi')
    assert len(load_events(log)) == 6
    assert main(["trace", "timeline", str(log), "-o", str(tmp_path / "t.html")]) == 0
    assert "the last line is incomplete" in capsys.readouterr().err


def test_a_log_without_timestamps_is_laid_out_by_event_number(tmp_path: Path) -> None:
    log = tmp_path / "events.jsonl"
    log.write_text("".join(json.dumps(e) + "\n" for _, e in SMALL))
    tl = build_timeline(load_events(log))
    assert tl.origin is None and tl.duration == len(SMALL) - 1
    assert ">event</text>" in render_html(load_events(log))


@pytest.mark.parametrize(
    ("content", "says"),
    [
        (None, "does not exist"),
        ("", "empty, no events"),
        ("this is not json\n", "not an event log"),
        ("[1, 2]\n", "not an event object"),
        ('{"step": 1, "reward": 0.5}\n{"step": 2, "reward": 0.7}\n', "no line has an 'event' field"),
        ("dir", "a directory"),
    ],
)
def test_bad_input_is_one_clear_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str | None, says: str
) -> None:
    path = tmp_path / "events.jsonl"
    if content == "dir":
        path.mkdir()
    elif content is not None:
        path.write_text(content)
    assert main(["trace", "timeline", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and says in err and str(path) in err and "Fix:" in err
    assert not (tmp_path / "timeline.html").exists()


def test_a_resumed_run_shows_the_driver_gone_then_every_lane_from_init() -> None:
    """A log a killed driver left and a resumed one continued (tests/lifecycle/data): between the last event of
    the dead driver and the resume no lane stays in the state it died in, and the resume is labelled."""
    events = load_events(EVENT_LOGS / "resumed_run_events.jsonl")
    tl = build_timeline(events)
    resumed = next(i for i, e in enumerate(events) if e["event"] == "job.resumed")
    (marker,) = [m for m in tl.markers if m.kind == "resumed"]
    assert marker.index == resumed and marker.label == "resumed at step 2 (v2)"
    moved = {e["instance"] for e in events[:resumed] if e["event"] == "lifecycle.transition"}
    assert {"rollout", "trainer", "engine-0", "engine-1"} <= moved
    for lane in tl.lanes:
        gone = [s for s in lane.spans if s.state == "no driver"]
        if lane.instance not in moved:  # the eval fleet had not moved yet: it was never anything but Init
            assert not gone
            continue
        assert len(gone) == 1 and gone[0].index == resumed, lane.key
        after = lane.spans[lane.spans.index(gone[0]) + 1]
        assert after.state == "Init" and after.start == gone[0].end
        before = lane.spans[lane.spans.index(gone[0]) - 1]
        assert before.end == gone[0].start  # the state the driver died in ends where it died
    assert "↻ resumed at step 2 (v2)" in render_html(events)


def test_an_elastic_fleet_s_leaves_and_a_reused_slot() -> None:
    """The elastic log: a join, a retire, a notice's drain; engine-1's slot gets a second process at step 3,
    which the lane shows as a new segment (cut, numbered), not as one bar with the first."""
    events = load_events(EVENT_LOGS / "elastic_events.jsonl")
    by = {lane.key: lane for lane in build_lanes(events)}
    e1 = by["engine-1"].spans
    states = [s.state for s in e1]
    assert states[states.index("Retiring") :][:4] == ["Retiring", "Retired", "Joining", "PendingWeights"]
    joined = e1[states.index("Joining")]
    assert joined.new_process and joined.process == 2 and joined.src == "Retired"
    assert [s.process for s in e1[: states.index("Joining")]] == [0, *[1] * (states.index("Joining") - 1)]
    assert all(s.process == 2 for s in e1[states.index("Joining") :])
    e2 = by["engine-2"].spans
    assert [s.state for s in e2][:3] == ["Init", "Joining", "PendingWeights"] and not any(s.new_process for s in e2)
    leaving = ("Draining", "Retiring", "Retired")
    assert [s.state for s in e2 if s.state in leaving] == list(leaving)
    page = render_html(events, title="elastic")
    assert page.count('class="process-cut"') == 1 and 'data-lane="engine-1" data-process="2"' in page
    assert "a new process in the slot" in page and "process #2 of this slot (a new process" in page
    # the new states have their own colours (not the fallback a state without one gets), distinct from a failure's
    colours = {name: state_colour(name) for name in ("Joining", "Draining", "Retiring", "Retired")}
    assert len(set(colours.values())) == 4 and set(colours) <= set(STATE_COLOURS)
    assert not set(colours.values()) & {state_colour(x) for x in ("Failed", "Unhealthy", "Stopped", "Serving")}
    assert all(f'data-state="{name}"' in page for name in colours)
