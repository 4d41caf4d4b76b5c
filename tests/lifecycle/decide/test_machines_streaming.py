"""The streaming states of the rollout manager and the engines: written in the specs like every other move, reached
only under ``streaming``; a failed in-flight refit has no way back to Serving but a load of the committed weights."""

from __future__ import annotations

from collections import deque

import pytest

from lifecycle.decide.config import LifecycleConfig
from lifecycle.decide.machines import ENGINE, ROLLOUT
from lifecycle.decide.presets import PRESETS, preset
from lifecycle.decide.spec import CompiledSpec, Step

STREAM_ROLLOUT = frozenset({"Streaming", "PausedForUpdate", "StreamCatchingUp"})
STREAM_ENGINE = frozenset({"Paused", "UpdatingInFlight"})
STREAMING = LifecycleConfig.from_mapping(
    {"rollout_num_gpus": 2, "fully_async": True, "use_fault_tolerance": True}, check_paths=False
)


@pytest.mark.parametrize("name", [name for name in PRESETS if not preset(name).fully_async])
def test_no_preset_without_streaming_reaches_a_streaming_state(name: str) -> None:
    c = preset(name)
    assert not (ROLLOUT.compile(c).reachable()[0] & STREAM_ROLLOUT)
    assert not (ENGINE.compile(c).reachable()[0] & STREAM_ENGINE)


def test_streaming_reaches_every_streaming_state() -> None:
    assert preset("streaming").fully_async
    assert ROLLOUT.compile(STREAMING).reachable()[0] >= STREAM_ROLLOUT
    assert ENGINE.compile(STREAMING).reachable()[0] >= STREAM_ENGINE


def test_the_stream_is_entered_only_through_the_streaming_guard() -> None:
    for spec, states in ((ROLLOUT, STREAM_ROLLOUT), (ENGINE, STREAM_ENGINE)):
        entries = [t for t in spec.transitions if t.dest in states and not set(t.source) & states]
        assert entries and all(str(g) == "streaming" for t in entries for g in t.guards), entries


def _reaches(compiled: CompiledSpec, start: str, goal: str, without: frozenset[tuple[str, str]]) -> bool:
    seen, queue = {start}, deque([start])
    while queue:
        state = queue.popleft()
        if state == goal:
            return True
        for trigger in compiled.enabled[state]:
            out = compiled.table[state, trigger]
            assert isinstance(out, Step)
            if (state, trigger) not in without and out.dest not in seen:
                seen.add(out.dest)
                queue.append(out.dest)
    return False


def test_a_failed_in_flight_refit_never_resumes_by_construction() -> None:
    """Out of UpdatingInFlight a failed update leads to PendingWeights, which has no resume: without a finished load of
    the committed weights (LoadingWeights' finish_update) no path returns to Serving. The SMG paused() helper --
    continue_generation on every exit -- has no edge to be written on."""
    engine = ENGINE.compile(STREAMING)
    failed = engine.table["UpdatingInFlight", "abort_update"]
    assert isinstance(failed, Step) and failed.dest == "PendingWeights"
    assert "resume" not in engine.enabled["PendingWeights"]
    assert not _reaches(engine, "PendingWeights", "Serving", frozenset({("LoadingWeights", "finish_update")}))
    reverted = engine.table["Paused", "revert"]  # a whole update that failed after this engine loaded
    assert isinstance(reverted, Step) and reverted.dest == "PendingWeights"
    assert "hand_back_requests" in failed.effects and "hand_back_requests" in reverted.effects


def test_an_in_flight_update_pauses_keeping_requests_and_resumes_what_it_paused() -> None:
    engine = ENGINE.compile(STREAMING)
    pause = engine.table["Serving", "pause"]
    assert isinstance(pause, Step) and pause.effects == ("hold_routing", "pause_generation")
    resume = engine.table["Paused", "resume"]
    assert isinstance(resume, Step) and resume.effects == ("continue_generation", "route_traffic")
    begin, finish = engine.table["Paused", "begin_update"], engine.table["UpdatingInFlight", "finish_update"]
    assert isinstance(begin, Step) and isinstance(finish, Step)
    assert (begin.dest, finish.dest) == ("UpdatingInFlight", "Paused")


def test_the_rollout_manager_updates_in_flight_and_stops_the_stream_only_from_streaming() -> None:
    rollout = ROLLOUT.compile(STREAMING)
    begin = rollout.table["Streaming", "begin_update"]
    assert isinstance(begin, Step) and begin.dest == "PausedForUpdate" and "acquire_engine_lock" in begin.effects
    for trigger in ("update_done", "update_failed"):
        out = rollout.table["PausedForUpdate", trigger]
        assert isinstance(out, Step) and out.dest == "Streaming" and "release_engine_lock" in out.effects
    assert set(rollout.enabled["PausedForUpdate"]) == {"update_done", "update_failed"}
    for trigger in ("eval", "offload", "generate", "dispose"):
        assert ("Streaming", trigger) not in rollout.table
