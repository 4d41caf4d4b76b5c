"""The core in a stream (--fully-async): the stream runs while the trainer takes groups and pushes weights in flight;
the staleness bound is a guard at the take; a failed in-flight update never resumes an engine."""

from __future__ import annotations

import pytest

from lifecycle.decide.core import ROLLOUT, Command, Outcome, instance_name

from .test_core import Drive, cfg, ok


def streaming(k: int = 1, **flags: object) -> Drive:
    d = Drive(cfg(fully_async=True, max_weight_staleness=k, **flags)).start()
    assert d.op("stream") is None
    return d


def done(d: Drive, age: int) -> None:
    """The stream completes a group whose oldest token is ``age`` versions behind the committed version."""
    assert d.do(Outcome("group_done", version=d.s.version - age)) is None


def test_the_stream_routes_every_engine_and_buffers_groups_by_their_staleness() -> None:
    d = streaming()
    assert d.s.rollout == "Streaming" and d.engines() == ["Serving", "Serving"]
    assert d.s.version == 0  # the initial weights: the first committed version
    done(d, 1)
    done(d, 0)
    assert d.s.buffer == (0, 1)
    assert d.do(Outcome("group_done", version=d.s.version + 1)) is None  # newer than the version: it went back
    assert d.s.buffer == (-1, 0, 1)


def test_train_is_refused_in_a_stream_the_trainer_takes() -> None:
    d = streaming()
    done(d, 1)
    refusal = d.op("train")
    assert refusal is not None and "take" in refusal.reason
    assert d.op("take") is None
    assert d.s.buffer == () and d.s.taken == ()
    assert d.triggers("trainer")[-2:] == ["train", "train_done"]


def test_a_group_beyond_the_bound_is_dropped_and_its_prompts_requeued() -> None:
    d = streaming(k=1)
    for age in (0, 1, 2, 6):  # the last two are beyond K = 1
        done(d, age)
    assert d.s.buffer == (0, 1, 2, 2)  # anything beyond the bound is alike
    d.commands.clear()
    assert d.op("take") is None
    assert [c.effect for c in d.commands if c.machine == "rollout"] == ["requeue_prompts", "requeue_prompts"]
    assert d.triggers("rollout").count("drop_stale") == 2
    assert d.s.buffer == () and d.triggers("trainer")[-1] == "train_done"


def test_an_in_flight_update_pauses_loads_commits_and_resumes_and_ages_the_buffer() -> None:
    d = streaming(k=1)
    done(d, 0)
    assert d.op("take") is None
    done(d, 0)
    moves_before = len(d.moves)
    assert d.op("update_weights") is None
    engine_triggers = [m.trigger for m in d.moves[moves_before:] if m.machine == "engine"]
    each = ("pause", "begin_update", "finish_update", "resume")
    assert engine_triggers == [trigger for trigger in each for _ in range(2)]
    assert d.s.rollout == "Streaming" and d.engines() == ["Serving", "Serving"]
    assert all(e.current for e in d.s.engines) and not d.s.lock
    assert d.s.version == 1 and d.s.buffer == (1,)  # one version staler
    assert d.op("update_weights") is None
    assert d.s.buffer == (2,)  # beyond K = 1: the next take drops it
    assert d.op("take") is None
    assert d.s.taken == () and d.triggers("rollout")[-1] == "drop_stale"


def test_a_failed_in_flight_update_never_resumes_an_engine() -> None:
    """engine-0's load raises: the update fails as a whole; engine-1 had loaded the unpublished weights, so it reverts
    to PendingWeights too (its requests handed back); neither is routed until a catch-up loads the committed ones."""
    d = streaming()

    def engine0_raises(cmd: Command) -> Outcome:
        if cmd.effect == "transfer_weights" and cmd.machine == "engine" and cmd.engine == 0:
            return Outcome("error", reason="refit failed")
        answer: Outcome = ok(cmd)
        return answer

    before = len(d.moves)
    assert d.op("update_weights", answer=engine0_raises) is None
    assert not [m for m in d.moves[before:] if m.machine == "engine" and m.dst == "Serving"]
    assert d.s.rollout == "Streaming" and d.engines() == ["PendingWeights", "PendingWeights"]
    assert d.s.dirty and d.s.version == 0 and not d.s.lock
    handed_back = [c.instance for c in d.commands if c.effect == "hand_back_requests"]
    assert sorted(handed_back) == [instance_name(ROLLOUT, 0), instance_name(ROLLOUT, 1)]
    assert d.op("catch_up") is None  # the committed weights, while the stream goes on
    assert d.s.rollout == "Streaming" and d.engines() == ["Serving", "Serving"]
    assert all(e.current for e in d.s.engines)


def test_stream_stop_drains_and_nothing_is_taken_outside_the_stream() -> None:
    d = streaming()
    done(d, 1)
    assert d.op("stream_stop") is None
    assert d.s.rollout == "Ready" and d.engines() == ["Quiesced", "Quiesced"]
    refusal = d.op("take")
    assert refusal is not None and "while the stream runs" in refusal.reason
    assert d.op("stream") is None and d.op("take") is None


def test_stream_is_blocked_without_fully_async() -> None:
    d = Drive(cfg()).start()
    refusal = d.op("stream")
    assert refusal is not None and refusal.kind == "blocked" and refusal.blocked_by == ("streaming",)
    assert d.do(Outcome("group_done", version=0)) is None
    assert d.s.buffer == ()


RESUMED = {"fully_async": True, "save": "ck", "save_interval": 1, "load": "ck"}


def resumed(version: int, oldest: tuple[int, ...]) -> Drive:
    d = Drive(cfg(**RESUMED))
    d.s = d.core.with_checkpoint(d.s, version, oldest)
    d.start()
    assert d.op("stream") is None
    return d


def test_a_resumed_stream_keeps_its_version_and_judges_its_groups_by_their_recorded_versions() -> None:
    """The checkpoint holds the version and each buffered group's oldest version: the resumed stream continues at 57
    (never 1: miles #2244) and drops the group that was already 3 versions stale (K = 1)."""
    d = resumed(57, (57, 54))
    assert d.s.version == 57 and d.s.buffer == (0, 2) and d.s.resuming == ()
    assert d.op("take") is None
    assert d.triggers("rollout").count("drop_stale") == 1 and d.triggers("trainer")[-1] == "train_done"


def test_areal_1388_a_checkpoint_of_the_version_alone_overshoots_the_bound() -> None:
    """The planted counterexample (AReaL #1388): a checkpoint that records the version but re-stamps its buffered
    groups at it (their accounting lost) lets the resumed stream train a group 3 versions stale with K = 1."""
    faithful, restamped = resumed(57, (57, 54)), resumed(57, (57, 57))
    assert faithful.op("take") is None and restamped.op("take") is None
    assert faithful.triggers("rollout").count("drop_stale") == 1
    assert restamped.triggers("rollout").count("drop_stale") == 0  # the 3-stale group was trained


def test_a_checkpoint_is_restored_into_a_stream_before_anything_runs() -> None:
    d = Drive(cfg(**RESUMED))
    with pytest.raises(ValueError, match="never newer"):
        d.core.with_checkpoint(d.s, 3, (4,))
    with pytest.raises(ValueError, match="does not stream"):
        Drive(cfg()).core.with_checkpoint(Drive(cfg()).s, 3)
    d.start()
    with pytest.raises(ValueError, match="before the first operation"):
        d.core.with_checkpoint(d.s, 3)
