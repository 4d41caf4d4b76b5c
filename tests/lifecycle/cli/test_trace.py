"""``lifecycle trace``: canonical form, first divergence, and what is (not) an event log."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lifecycle.cli import main
from lifecycle.decide.events import is_torn_line, read_jsonl
from lifecycle.observe.trace import diff, line, load


def _log(path: Path, events: list[dict[str, object]], second: int = 0) -> Path:
    """A log whose every line has its own timestamp (``second`` shifts them all, as another run would)."""
    lines = (json.dumps({**e, "ts": f"2026-01-01T00:00:{second + n:02d}Z"}) + "\n" for n, e in enumerate(events))
    path.write_text("".join(lines))
    return path


def test_trace_diff_canonical_and_first_divergence(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ev = {"event": "lifecycle.transition", "machine": "rollout", "instance": "rollout", "src": "Init", "dst": "Ready"}
    other = {**ev, "machine": "trainer", "instance": "trainer"}
    a = _log(tmp_path / "a.jsonl", [ev, other])
    b = _log(tmp_path / "b.jsonl", [ev, {**other, "dst": "Failed"}], second=30)
    assert a.read_text().splitlines()[0] != b.read_text().splitlines()[0]  # the raw lines differ in "ts" ...
    assert diff(load(a, ["rollout"]), load(b, ["rollout"])) is None  # ... and canonical form ignores it
    found = diff(load(a), load(b))
    assert found is not None and found.index == 1
    assert main(["trace", "diff", str(a), str(b), "--only", "rollout"]) == 0
    assert main(["trace", "diff", str(a), str(b)]) == 1
    assert "first difference at event 1" in capsys.readouterr().out
    assert main(["trace", "show", str(a)]) == 0
    assert line(ev) == "rollout[rollout] Init --> Ready"  # the event names no trigger: no "--None-->"
    assert line({**ev, "trigger": "init"}) == "rollout[rollout] Init --init--> Ready"
    blocked = {"event": "lifecycle.blocked", "machine": "engine", "state": "Unhealthy", "blocked_by": ["rollout_ft"]}
    assert line(blocked) == "engine[?] Unhealthy --x blocked by ['rollout_ft']"
    assert "None" not in line({"event": "lifecycle.transition", "src": None})


def test_a_torn_last_line_is_skipped_but_garbage_is_not_an_event_log(tmp_path: Path) -> None:
    good = json.dumps({"event": "lifecycle.transition", "machine": "rollout"})
    torn = tmp_path / "torn.jsonl"
    torn.write_text(good + "\n" + good[:17])  # the writer died mid-line
    assert read_jsonl(torn) == [json.loads(good)]
    garbage = tmp_path / "garbage.jsonl"
    garbage.write_bytes(b"\x00\xffnot json")  # one line, no newline: it is not a torn event
    with pytest.raises(ValueError, match="not an event log"):
        read_jsonl(garbage)
    assert is_torn_line(b'{"event": "x", "na')
    assert is_torn_line('{"text": "caf\u00e9"'.encode()[:-1])  # cut inside a multi-byte character
    assert not is_torn_line(b"plain text")
