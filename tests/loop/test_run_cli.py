"""``lifecycle run`` / ``lifecycle trace`` on bad input and on small logs (no Ray started here)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lifecycle.cli import main
from lifecycle.trace import diff, line, load

pytest.importorskip("torch")


def test_unknown_fault_spec_names_the_flag(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "--run-dir", str(tmp_path), "--inject", "explode:1@2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--inject" in err[0]


def test_unreachable_ray_address_names_the_flag(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "--run-dir", str(tmp_path), "--ray-address", "127.0.0.1:1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--ray-address" in err[0]


def test_unwritable_run_dir_names_the_flag(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert main(["run", "--run-dir", str(blocker / "sub")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--run-dir" in err[0]


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
    assert "rollout[rollout] Init --None--> Ready" in line(ev)
