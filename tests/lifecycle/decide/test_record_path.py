"""The record's fast path (issue 32, P3) writes what the reference path writes, and loses nothing more.

Compiled moves (one ``transitions`` move per (machine, state, trigger), read from its ``Transition``)
leave the same states, events and ledger as ``Event.trigger`` on every move; a callback anywhere on
the way sends the move back through ``transitions``. The JSONL sink's held bursts are written with one
``write(2)`` when the burst ends, however it ends, byte for byte the lines a write per event gives; the
runner ends every burst before a command's handler runs, so the log on disk precedes the work.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import structlog
from transitions import Machine

from lifecycle import EffectLedger, EventLog, LifecycleConfig
from lifecycle.check.explore import lattice
from lifecycle.decide import events as events_module
from lifecycle.decide.core import Command, Outcome
from lifecycle.decide.errors import LifecycleError
from lifecycle.decide.events import (
    TRANSITION,
    JsonlSink,
    MemorySink,
    bind_context,
    canonical,
    merge_context,
    read_jsonl,
)
from lifecycle.decide.machines import ENGINE, MACHINES
from lifecycle.decide.runner import Runner
from lifecycle.decide.runtime import LifecycleMachine, _compile_move, _Const, transitions_kwargs
from lifecycle.decide.spec import Step

CONFIGS = [group[0] for group in lattice().groups.values()]
FT = LifecycleConfig(use_fault_tolerance=True, rollout_num_gpus=2)
REPO = Path(__file__).resolve().parents[3]


def _walk(spec: Any, config: LifecycleConfig, seed: int, compiled: bool, path: Path) -> tuple[list, list, list]:
    """A random walk of one machine (moves, blocked and illegal events): its states, events and ledger."""
    LifecycleMachine.compiled = compiled
    try:
        log, ledger = EventLog([JsonlSink(path)], timestamps=False), EffectLedger()
        m = LifecycleMachine(spec, config, "x-0", log=log, ledger=ledger)
        rng, states = random.Random(seed), []
        with log.capture() as seen:
            for _ in range(60):
                trigger = rng.choice(sorted(spec.triggers))
                with contextlib.suppress(LifecycleError):  # illegal here: no move, no event
                    m.fire(trigger)
                states.append(m.state)
        log.remove_sink(log._sinks[0])  # closes the JSONL sink
        return states, [canonical(e) for e in seen], list(ledger)
    finally:
        LifecycleMachine.compiled = True


@pytest.mark.parametrize("name", sorted(MACHINES))
def test_compiled_moves_leave_the_states_events_ledger_and_lines_of_transitions_own_moves(
    name: str, tmp_path: Path
) -> None:
    spec = MACHINES[name]
    for k, config in enumerate(CONFIGS[::7]):
        fast = _walk(spec, config, k, True, tmp_path / f"fast-{k}.jsonl")
        reference = _walk(spec, config, k, False, tmp_path / f"ref-{k}.jsonl")
        assert fast == reference, (name, config.to_flags())
        assert (tmp_path / f"fast-{k}.jsonl").read_bytes() == (tmp_path / f"ref-{k}.jsonl").read_bytes()


def test_a_compiled_move_is_transitions_own_and_a_callback_sends_it_back_to_transitions() -> None:
    compiled = ENGINE.compile(FT)
    step = compiled.table[("Init", "start")]
    assert isinstance(step, Step)
    machine = Machine(model=None, **transitions_kwargs(compiled))
    move = _compile_move(machine, "Init", "start", step)
    assert move is not None and move[1] == "Starting"
    assert '"src":"Init","dst":"Starting","trigger":"start"' in move[2]
    machine.get_state("Starting").add_callback("enter", lambda: None)
    assert _compile_move(machine, "Init", "start", step) is None  # on_enter would not run: ask transitions
    other = Machine(model=None, **transitions_kwargs(compiled))
    other.before_state_change.append(lambda: None)
    assert _compile_move(other, "Init", "start", step) is None


def test_compiling_a_move_transitions_refuses_is_an_error_not_a_silent_move() -> None:
    """The compiled table allows recover (rollout FT); a transitions machine whose guard says no must not agree."""
    compiled = ENGINE.compile(FT)
    step = compiled.table[("Unhealthy", "recover")]
    assert isinstance(step, Step)
    kwargs = transitions_kwargs(compiled)
    for row in kwargs["transitions"]:
        row["conditions"] = [_Const(c.__name__, not c.value) for c in row["conditions"]]
    with pytest.raises(LifecycleError, match="does not move Unhealthy on recover"):
        _compile_move(Machine(model=None, **kwargs), "Unhealthy", "recover", step)


def test_a_move_whose_machine_has_a_callback_runs_through_event_trigger(monkeypatch: pytest.MonkeyPatch) -> None:
    """Not compilable (None cached): every such move calls transitions' Event.trigger, and moves alike."""
    m = LifecycleMachine(ENGINE, FT, "e-0")
    monkeypatch.setitem(m._moves, ("Init", "start"), None)
    calls = []
    trigger = type(m._events["start"]).trigger
    monkeypatch.setattr(
        type(m._events["start"]), "trigger", lambda self, model: calls.append(1) or trigger(self, model)
    )
    assert m.fire("start").dst == "Starting" and m.state == "Starting" and calls == [1]


def test_the_log_line_of_a_compiled_move_is_byte_for_byte_the_generic_one(tmp_path: Path) -> None:
    awkward = {"reason": 'a "quoted" \u00e9\n\\', "weight_version": None, "ratio": 0.5, "flag": True, "big": 10**20}
    lines = []
    for compiled in (True, False):
        LifecycleMachine.compiled = compiled
        try:
            path = tmp_path / f"{compiled}.jsonl"
            log = EventLog([JsonlSink(path)], timestamps=False)
            m = LifecycleMachine(ENGINE, FT, 'e"1\u00e9', log=log)
            with bind_context(rollout_id=7, **awkward):
                for i, t in enumerate(("start", "ready", "begin_update", "finish_update", "resume", "mark_unhealthy")):
                    if i % 2:
                        with log.batch():
                            m.fire(t)
                    else:
                        m.fire(t)
            log.flush()
            lines.append(path.read_bytes())
        finally:
            LifecycleMachine.compiled = True
    assert lines[0] == lines[1]
    assert len(lines[0].splitlines()) == 6


def test_a_batch_is_one_write_when_the_outermost_ends(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "events.jsonl"
    log = EventLog([JsonlSink(path)])
    writes: list[int] = []
    write = os.write
    monkeypatch.setattr(events_module.os, "write", lambda fd, data: writes.append(len(data)) or write(fd, data))
    with log.batch():
        log.emit("a", n=1)
        with log.batch():
            log.emit("b", n=2)
        assert writes == [] and path.read_bytes() == b""  # the inner batch's end writes nothing yet
        log.emit("c", n=3)
    assert len(writes) == 1 and [e["event"] for e in read_jsonl(path)] == ["a", "b", "c"]
    log.emit("d")  # outside a batch: written at once
    assert len(writes) == 2 and read_jsonl(path)[-1]["event"] == "d"


def test_a_batch_ended_by_an_exception_still_writes_its_lines(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    log = EventLog([JsonlSink(path)])
    with pytest.raises(RuntimeError, match="boom"), log.batch():
        log.emit("before", n=1)
        raise RuntimeError("boom")
    assert [e["event"] for e in read_jsonl(path)] == ["before"]


def test_removing_or_closing_a_held_sink_writes_what_it_holds(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    sink = JsonlSink(path)
    log = EventLog([sink])
    with log.batch():
        log.emit("held")
        log.remove_sink(sink)  # the job's close: the sink goes, its lines are written first
        log.emit("after")  # no sink any more
    assert [e["event"] for e in read_jsonl(path)] == ["held"]


def test_the_batching_switch_writes_each_line_as_it_comes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """EventLog.batching = False (the benchmark's baseline): a batch holds nothing."""
    monkeypatch.setattr(EventLog, "batching", False)
    path = tmp_path / "events.jsonl"
    log = EventLog([JsonlSink(path)])
    with log.batch():
        log.emit("now")
        assert [e["event"] for e in read_jsonl(path)] == ["now"]


def _script(path: Path, body: str) -> subprocess.CompletedProcess[str]:
    code = (
        "import os, signal\n"
        "from lifecycle.decide.events import EventLog, JsonlSink\n"
        f"log = EventLog([JsonlSink({str(path)!r})])\n" + body
    )
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=60)


def test_a_process_that_dies_of_an_exception_inside_a_batch_leaves_its_lines(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    proc = _script(path, "with log.batch():\n    log.emit('last', n=1)\n    raise SystemError('crash')\n")
    assert proc.returncode == 1 and "crash" in proc.stderr
    assert [e["event"] for e in read_jsonl(path)] == ["last"]


def test_sigkill_takes_at_most_the_lines_of_the_batch_it_interrupts(tmp_path: Path) -> None:
    """Every ended batch is on disk at a SIGKILL; a kill inside one loses that burst only, and the file reads."""
    path = tmp_path / "events.jsonl"
    body = (
        "for i in range(50):\n"
        "    with log.batch():\n"
        "        log.emit('move', i=i)\n"
        "        log.emit('fact', i=i)\n"
        "with log.batch():\n"
        "    log.emit('unwritten')\n"
        "    os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    proc = _script(path, body)
    assert proc.returncode == -9
    events = read_jsonl(path)
    assert len(events) == 100 and events[-1] == {**events[-1], "event": "fact", "i": 49}


def test_the_runner_writes_each_step_before_its_commands_run(tmp_path: Path) -> None:
    """Write-ahead: when a handler starts, the move that issued its command is on disk (the burst has ended)."""
    path = tmp_path / "events.jsonl"
    memory = MemorySink()
    log = EventLog([JsonlSink(path), memory])
    runner = Runner(
        LifecycleConfig.from_mapping({"debug_rollout_only": True, "rollout_num_gpus": 2}, check_paths=False),
        log=log,
        ledger=EffectLedger(),
    )
    answers = {"launch_engine": "ready", "kill_engine": "dead", "transfer_weights": "loaded"}
    missing: list[str] = []

    def handler(effect: str) -> Any:
        async def run(cmd: Command) -> Outcome:
            on_disk = read_jsonl(path)
            if not any(
                e.get("event") == TRANSITION and e.get("instance") == cmd.instance and effect in e.get("effects", ())
                for e in on_disk
            ):
                missing.append(f"{cmd.instance}.{effect}")
            if len(on_disk) != len(memory):
                missing.append(f"{len(memory) - len(on_disk)} events not on disk when {cmd.instance}.{effect} ran")
            await asyncio.sleep(0)
            return Outcome(answers.get(effect, "done"))

        return run

    runner.provide({f"{m}.{e}": handler(e) for m, e in runner.core.commands()})
    asyncio.run(runner.operate("init"))
    assert not missing
    assert [canonical(e) for e in read_jsonl(path)] == [canonical(e) for e in memory]


def test_the_context_merge_is_structlogs_merge_contextvars() -> None:
    """Same keys and values as structlog's processor: ours, structlog's own binds, unbound and cleared keys."""

    def both() -> tuple[dict[str, Any], dict[str, Any]]:
        ours: dict[str, Any] = {"rollout_id": 99}
        merge_context(ours)
        theirs = structlog.contextvars.merge_contextvars(None, "info", {"rollout_id": 99})
        return ours, dict(theirs)

    with bind_context(step=1, rollout_id=1), structlog.contextvars.bound_contextvars(user="x", fresh_key_p3=2):
        a, b = both()
        assert a == b and a["user"] == "x" and a["rollout_id"] == 99 and a["fresh_key_p3"] == 2
        structlog.contextvars.unbind_contextvars("user")
        a, b = both()
        assert a == b and "user" not in a
    a, b = both()
    assert a == b == {"rollout_id": 99}


def test_the_ledger_appends_in_bulk_in_order() -> None:
    ledger = EffectLedger()
    runner_entries = [("engine", "e-0", 1, "start", "Init", "Starting", "launch_engine", "done")]
    from lifecycle.decide.ledger import LedgerEntry

    ledger.extend(LedgerEntry(*row) for row in runner_entries * 2)
    assert len(ledger) == 2 and ledger.count("launch_engine") == 2
