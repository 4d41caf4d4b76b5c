"""The run timeline page (``lifecycle trace timeline``) in a real browser: lanes and spans match the log.

The log is a real run checked in as ``tests/lifecycle/data/fault_run_events.jsonl`` (5 steps,
``--inject kill-engine:1@3``), unedited. What the page should show is computed here from the log's
transition events alone, not through :mod:`lifecycle.observe.timeline`, and compared with what the browser
finds: one ``g.lane[data-lane]`` per machine instance, its ``rect.span`` elements (``data-state``,
``data-start-index``) one per stay, the fault marker inside engine-1's lane and drawn over it.
Invariant violations (which a healthy run has none of) are checked on a tiny synthetic log.
The screenshot of the real run is ``docs/timeline.png``, the picture ``docs/observability.md`` shows.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

from lifecycle.cli import main
from tests.helpers import EVENT_LOGS

pytestmark = pytest.mark.browser

REPO = Path(__file__).resolve().parents[2]
FAULT_RUN = EVENT_LOGS / "fault_run_events.jsonl"
SCREENSHOT = REPO / "docs" / "timeline.png"
DRIVERS = ["rollout", "monitor", "eval_fleet", "weight_sync", "trainer"]  # the lane order the page promises

READ_LANES = """() => [...document.querySelectorAll('g.lane[data-lane]')].map(g => ({
    lane: g.dataset.lane,
    states: [...g.querySelectorAll('rect.span')].map(r => r.dataset.state),
    starts: [...g.querySelectorAll('rect.span')].map(r => r.dataset.startIndex),
    spanLanes: [...g.querySelectorAll('rect.span')].map(r => r.dataset.lane),
}))"""


def _expected_lanes(path: Path) -> dict[str, tuple[list[str], list[str]]]:
    """Per instance: the states it was in (the first transition's source, then every destination) and,
    per stay, the index of the transition that began it ('' for the initial state)."""
    lanes: dict[str, tuple[list[str], list[str]]] = {}
    events = [json.loads(raw) for raw in path.read_text().splitlines() if raw.strip()]
    for i, e in enumerate(events):
        if e.get("event") == "lifecycle.transition":
            states, starts = lanes.setdefault(e["instance"], ([e["src"]], [""]))
            states.append(e["dst"])
            starts.append(str(i))
        elif e.get("event") == "lifecycle.blocked":
            lanes.setdefault(e["instance"], ([e["state"]], [""]))
    return lanes


def _order(instance: str) -> tuple[int, str, int]:
    if instance in DRIVERS:
        return (DRIVERS.index(instance), "", 0)
    prefix, _, number = instance.rpartition("-")
    return (len(DRIVERS), prefix, int(number))


def _timeline(tmp_path: Path, log: Path) -> Path:
    out = tmp_path / "timeline.html"
    assert main(["trace", "timeline", str(log), "-o", str(out)]) == 0
    return out


def _open(page, html: Path) -> None:
    page.goto(html.as_uri())
    page.wait_for_selector("body[data-ready=true]")


def test_every_lane_and_span_matches_the_log_and_the_fault_is_on_engine_1(page, tmp_path, monkeypatch):
    expected = _expected_lanes(FAULT_RUN)
    monkeypatch.chdir(REPO)  # the page names the log as given: a relative path reads better in the docs
    _open(page, _timeline(tmp_path, FAULT_RUN.relative_to(REPO)))
    found = page.evaluate(READ_LANES)

    assert [lane["lane"] for lane in found] == sorted(expected, key=_order)
    for lane in found:
        states, starts = expected[lane["lane"]]
        assert lane["states"] == states, lane["lane"]
        assert lane["starts"] == starts, lane["lane"]
        assert set(lane["spanLanes"]) == {lane["lane"]}
    assert int(page.get_attribute("#timeline", "data-lanes")) == len(expected)

    # the fault: one marker, inside engine-1's lane group, drawn over that lane's row
    faults = page.locator('g.lane [data-marker="fault"]')
    assert faults.count() == 1
    assert faults.first.evaluate("m => m.closest('g.lane').dataset.lane") == "engine-1"
    marker, row = (
        faults.first.bounding_box(),
        page.locator('g.lane[data-lane="engine-1"] rect.span').first.bounding_box(),
    )
    assert row["y"] <= marker["y"] + marker["height"] / 2 <= row["y"] + row["height"]
    assert page.locator('[data-marker="fault-label"]').text_content().strip() == "⚡ kill-engine:1@3"
    # guard rejections on the rollout lane; no violation in this healthy run
    assert page.locator('g.lane[data-lane="rollout"] [data-marker="blocked"]').count() == 5
    assert page.locator('[data-marker="violation"]').count() == 0
    # the step axis: a labelled tick per step
    assert page.locator("text.step-label").all_text_contents() == [f"step {n}" for n in range(5)]

    # hovering a span shows its details at once
    span = page.locator('g.lane[data-lane="engine-1"] rect.span[data-state="Starting"]').last
    span.hover()
    tip = page.locator("#tip")
    assert (
        tip.is_visible() and "engine-1 · Starting" in tip.inner_text() and "Recovering → Starting" in tip.inner_text()
    )

    SCREENSHOT.parent.mkdir(exist_ok=True)
    page.mouse.move(0, 0)
    page.locator("#timeline").screenshot(path=str(SCREENSHOT))
    png = SCREENSHOT.read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 30_000
    width, height = struct.unpack(">II", png[16:24])  # the IHDR chunk
    assert width >= 1200 and height >= 300
    assert page.errors == []
    assert page.context.outside_requests == []


def test_invariant_violations_are_red_on_their_lane_or_the_run_lane(page, tmp_path):
    """A synthetic log: the real runs have no violation to show."""
    log = tmp_path / "events.jsonl"
    lines = [
        {
            "event": "lifecycle.transition",
            "machine": "engine",
            "instance": "engine-0",
            "src": "Init",
            "dst": "Serving",
            "trigger": "resume",
            "step": 0,
        },
        {
            "event": "lifecycle.invariant_violated",
            "invariant": "serving_engines_hold_committed_version",
            "problem": "engine-0 entered Serving holding weight version 0, committed 3",
            "instance": "engine-0",
        },
        {"event": "lifecycle.invariant_violated", "invariant": "one_rule", "problem": "no instance named"},
        {
            "event": "lifecycle.transition",
            "machine": "engine",
            "instance": "engine-0",
            "src": "Serving",
            "dst": "Quiesced",
            "trigger": "drain",
            "step": 1,
        },
    ]
    log.write_text("".join(json.dumps({**e, "ts": f"2026-01-01T00:00:0{n}Z"}) + "\n" for n, e in enumerate(lines)))
    _open(page, _timeline(tmp_path, log))
    on_lane = page.locator('g.lane[data-lane="engine-0"] [data-marker="violation"]')
    assert on_lane.count() == 1
    assert on_lane.locator("circle").get_attribute("fill") == "#dc2626"
    assert page.locator('g.run-lane [data-marker="violation"]').count() == 1
    assert page.locator("line.violation-line").count() == 2
    labels = page.locator('[data-marker="violation-label"]').all_text_contents()
    assert [t.strip() for t in labels] == ["✖ serving_engines_hold_committed_version", "✖ one_rule"]
    assert "2 invariant violations" in page.inner_text("header")
    assert page.errors == []
