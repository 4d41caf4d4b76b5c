"""The event log: one structlog event per transition, JSONL that survives, canonical form."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from datetime import UTC, datetime, timedelta

import structlog

from lifecycle import EventLog, LifecycleConfig
from lifecycle.decide.events import TRANSITION, StructlogSink, bind_context, canonical, capture, read_jsonl, utc_now
from lifecycle.decide.machines import ENGINE
from lifecycle.decide.runtime import LifecycleMachine

CFG = LifecycleConfig(use_fault_tolerance=True, rollout_num_gpus=2)
FIELDS = {"event", "machine", "instance", "seq", "src", "dst", "trigger", "guards", "effects", "ts"}


def test_each_transition_emits_one_event_with_the_documented_fields(tmp_path):
    log = EventLog()
    path = tmp_path / "events.jsonl"
    with log.to_jsonl(path), bind_context(rollout_id=7, weight_version="v7"):
        m = LifecycleMachine(ENGINE, CFG, "engine-1", log=log)
        for t in ("start", "ready", "begin_update", "finish_update", "resume", "mark_unhealthy", "recover"):
            m.fire(t)
    lines = path.read_text().splitlines()
    assert len(lines) == 7
    events = [json.loads(line) for line in lines]
    for i, e in enumerate(events, start=1):
        assert set(e) == FIELDS | {"rollout_id", "weight_version"}
        assert e["event"] == TRANSITION
        assert e["seq"] == i and e["instance"] == "engine-1" and e["machine"] == "engine"
        assert (e["rollout_id"], e["weight_version"]) == (7, "v7")
    assert events[-1]["guards"] == {"rollout_ft": True, "external_engines": False}
    assert events[-1]["effects"] == ["recover_engine", "kill_engine"]
    assert (events[-1]["src"], events[-1]["dst"], events[-1]["trigger"]) == ("Unhealthy", "Recovering", "recover")


def test_blocked_events_are_logged_too():
    cfg = LifecycleConfig(use_fault_tolerance=True, ft_components=["train"], rollout_num_gpus=2)
    log = EventLog()
    with log.capture() as events:
        m = LifecycleMachine(ENGINE, cfg, "e", log=log)
        m.fire("start")
        m.fire("start_failed")
        m.fire("recover")
    assert events[-1]["event"] == "lifecycle.blocked"
    assert events[-1]["blocked_by"] == ["rollout_ft"]


def test_capture_uses_the_default_log_and_no_sink_means_no_work():
    m = LifecycleMachine(ENGINE, CFG, "quiet")
    m.fire("start")  # no sink attached: nothing to collect, nothing fails
    with capture() as events:
        m.fire("ready")
    assert [e["dst"] for e in events] == ["PendingWeights"]


def test_canonical_form_drops_timestamps_so_equal_runs_compare_equal():
    def run():
        log = EventLog()
        with log.capture() as events:
            m = LifecycleMachine(ENGINE, CFG, "e", log=log)
            for t in ("start", "ready", "begin_update"):
                m.fire(t)
        return list(events)

    a, b = run(), run()
    assert all("ts" in e for e in a)
    assert [canonical(e) for e in a] == [canonical(e) for e in b]
    assert all("ts" not in canonical(e) for e in a)


def test_structlog_sink_reaches_structlog_capture_logs():
    log = EventLog([StructlogSink()])
    with structlog.testing.capture_logs() as logs:
        LifecycleMachine(ENGINE, CFG, "e", log=log).fire("start")
    assert logs and logs[0]["event"] == TRANSITION and logs[0]["dst"] == "Starting"


def test_read_jsonl_skips_only_a_torn_last_line(tmp_path):
    path = tmp_path / "events.jsonl"
    path.write_text('{"a": 1}\n{"b": 2}\n{"c": ')
    assert read_jsonl(path) == [{"a": 1}, {"b": 2}]
    path.write_text('{"a": 1}\nnot json\n{"b": 2}\n')
    try:
        read_jsonl(path)
    except ValueError as exc:
        assert ":2:" in str(exc)
    else:
        raise AssertionError("a corrupt middle line must raise")


def test_jsonl_lines_survive_sigkill(tmp_path):
    """A writer killed mid-run leaves only complete lines (each is one write(2))."""
    path = tmp_path / "events.jsonl"
    code = f"""
import os, signal
from lifecycle import EventLog, LifecycleConfig
from lifecycle.decide.machines import ENGINE
from lifecycle.decide.runtime import LifecycleMachine
log = EventLog()
log.add_sink(__import__("lifecycle.decide.events", fromlist=["JsonlSink"]).JsonlSink({str(path)!r}))
cfg = LifecycleConfig(use_fault_tolerance=True, rollout_num_gpus=2)
for i in range(200):
    m = LifecycleMachine(ENGINE, cfg, f"e{{i}}", log=log)
    m.fire("start"); m.fire("ready")
os.kill(os.getpid(), signal.SIGKILL)
"""
    proc = subprocess.run([sys.executable, "-c", code], env={**os.environ}, check=False)
    assert proc.returncode == -9
    events = read_jsonl(path)
    assert len(events) == 400
    assert all(e["event"] == TRANSITION for e in events)


def test_timestamps_are_structlog_iso_utc_and_follow_the_clock():
    """The hand-rolled clock writes structlog's ``TimeStamper(fmt="iso", utc=True)`` shape, fixed width."""
    stamper = structlog.processors.TimeStamper(fmt="iso", key="ts", utc=True)
    log = EventLog()
    with log.capture() as events:
        before = datetime.now(UTC)
        for i in range(50):
            log.emit("tick", i=i)
        reference = stamper(None, "info", {})["ts"]
        after = datetime.now(UTC)
    stamps = [e["ts"] for e in events]
    shape = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z$")
    assert all(shape.match(s) for s in stamps)
    assert re.match(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d{6})?Z$", reference)  # isoformat drops .000000
    parsed = [datetime.fromisoformat(s.replace("Z", "+00:00")) for s in stamps]
    assert before - timedelta(microseconds=1) <= parsed[0] and parsed[-1] <= after
    assert parsed == sorted(parsed)
    assert utc_now() >= stamps[-1]  # same fixed-width format: string order is time order


def test_events_keep_structlog_key_order_and_merge_structlog_bound_context():
    log = EventLog()
    with log.capture() as events, bind_context(rollout_id=3), structlog.contextvars.bound_contextvars(user="x"):
        log.emit("e", machine="m", rollout_id=99)  # an explicit field wins over the context
    (e,) = events
    assert list(e) == ["machine", "rollout_id", "event", "user", "ts"]  # as structlog's BoundLogger built it
    assert (e["rollout_id"], e["user"]) == (99, "x")


def test_jsonl_sink_writes_non_json_values_as_strings(tmp_path):
    path = tmp_path / "events.jsonl"
    log = EventLog()
    with log.to_jsonl(path):
        log.emit("e", path=tmp_path, ratio=0.5)
    (e,) = read_jsonl(path)
    assert e["path"] == str(tmp_path) and e["ratio"] == 0.5
