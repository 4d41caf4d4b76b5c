"""The checker's world around an elastic fleet: the loop's scale and retire, notices and drains, the weight group
that a departed member makes stale, the normal form of its states -- and the invariants of its joins and leaves."""

from __future__ import annotations

import functools

import pytest

from lifecycle.check.explore import ELASTIC_CONFIGS
from lifecycle.check.invariants import INVARIANTS, check_state, check_step
from lifecycle.check.world import DEAD_NOTIFIED, UP, Action, Checker, Node, Transition, World, _group_answers, _normal
from lifecycle.cli import main
from lifecycle.decide.config import LifecycleConfig
from lifecycle.decide.core import ROLLOUT, Command, EngineState, JobState, Move
from lifecycle.decide.core.model import Failure
from lifecycle.decide.presets import preset

FIXED = LifecycleConfig.from_mapping({"rollout_num_gpus": 2, "engine_max_restarts": 1}, check_paths=False)
ELASTIC = ELASTIC_CONFIGS[0]  # lock-step, no FT, disk updates
MEMBERSHIP = {"op.scale_rollout", "op.retire_engine", "news.preempt_notice", "news.drained"}


def explored(job: Checker) -> tuple[frozenset[str], frozenset[str], frozenset[int]]:
    """Every action taken, engine state and target seen in the whole exploration."""
    start = job.initial().key()
    seen, queue = {start}, [start]
    actions: set[str] = set()
    states: set[str] = set()
    targets: set[int] = set()
    while queue:
        n = queue.pop()
        targets.add(n.job.target)
        states |= {e.state for e in n.job.engines}
        for t in job.successors(n):
            actions.add(t.action.name)
            k = job.key(t.node)
            if k not in seen:
                seen.add(k)
                queue.append(k)
    return frozenset(actions), frozenset(states), frozenset(targets)


@functools.cache
def reach(config: LifecycleConfig, engines: int) -> tuple[frozenset[str], frozenset[str], frozenset[int]]:
    return explored(Checker(config, engines=engines))


def test_a_fixed_fleet_is_offered_no_membership_change() -> None:
    actions, states, targets = reach(FIXED, 2)
    assert not actions & MEMBERSHIP
    assert not states & {"Joining", "Draining", "Retiring", "Retired"} and targets == {0}


@pytest.mark.parametrize("slots", [2, 3])
def test_an_elastic_fleet_joins_and_leaves_up_to_its_slots(slots: int) -> None:
    actions, states, targets = reach(ELASTIC, slots)
    assert actions >= MEMBERSHIP
    assert states >= {"Joining", "Draining", "Retiring", "Retired"}
    assert targets == set(range(1, slots + 1))  # from the minimum (one engine) up to every slot


def test_the_slots_are_the_engines_asked_for_up_to_the_fleets_maximum() -> None:
    assert [Checker(ELASTIC, engines=n).core.engines for n in (1, 2, 3, 4)] == [1, 2, 3, 3]  # --rollout-max-num-gpus 3
    assert Checker(FIXED, engines=4).core.engines == 4


def test_scale_and_retire_are_bounded_like_faults() -> None:
    actions, _, _ = explored(Checker(ELASTIC, engines=2, max_faults=0))
    assert not actions & MEMBERSHIP  # no budget: no scale, retire or notice (a drain needs a leaver first)


def test_an_operation_names_its_target_and_a_notice_its_engine() -> None:
    assert Action("op.scale_rollout", fault=True, target=3).label() == "loop calls scale_rollout (target 3)"
    assert Action("news.preempt_notice", 1).label() == "engine-1's process is given a preemption notice"
    assert Action("news.drained", 0).label().startswith("engine-0's requests in flight are done")


# -- the weight-update group: a member that left fails the collective ------------------------------------------------
def broadcast(receivers: tuple[int, ...]) -> tuple[Command, JobState]:
    cmd = Command("broadcast_weights", "weight_sync", "weight-sync", lane="trainer")
    loads = tuple(
        Command("transfer_weights", "engine", f"engine-{i}", ROLLOUT, i, lane="trainer", via="broadcast")
        for i in receivers
    )
    return cmd, JobState(engines=(EngineState("UpdatingWeights"),) * 2, awaiting=(cmd, *loads))


def test_a_broadcast_succeeds_only_over_exactly_its_receivers_all_up() -> None:
    grouped = World((UP, UP), (), 0, (True, True), (False, False))
    cmd, job = broadcast((0, 1))
    assert "done" in [o.name for o, _, _ in _group_answers(cmd, grouped, job)]
    cmd, job = broadcast((0,))  # engine-1 retired since the group formed: the collective waits for it
    assert [o.name for o, _, _ in _group_answers(cmd, grouped, job)] == ["failed"]
    dead = World((UP, DEAD_NOTIFIED), (), 0, (True, True), (False, False))
    cmd, job = broadcast((0, 1))
    assert [o.name for o, _, _ in _group_answers(cmd, dead, job)] == ["failed"]


# -- the normal form --------------------------------------------------------------------------------------------------
def test_a_vacant_slot_and_the_groups_generation_are_normalised() -> None:
    sync = (
        Command("broadcast_weights", "weight_sync", "weight-sync", generation=3),
        Command("init_weight_group", "weight_sync", "weight-sync", generation=2),
    )
    retired = EngineState("Retired", current=True, fresh=True, restarts=(1.0,), leaving=True, epoch=3)
    job = JobState(engines=(retired, EngineState("Serving", current=True)), awaiting=sync, target=2, sync_generation=3)
    normal, _ = _normal(job, World((DEAD_NOTIFIED, UP), (), 0))
    assert normal.engines[0] == EngineState("Retired", restarts=(1.0,), epoch=1)  # the budget window is kept
    assert normal.sync_generation == 0 and [c.generation for c in normal.awaiting] == [0, -1]  # older: still older
    assert normal.target == 2


# -- the invariants of joins and leaves ------------------------------------------------------------------------------
CHECKER = Checker(ELASTIC, engines=2)


def step_problems(before: JobState, moves: tuple[Move, ...], after: JobState | None = None) -> list[str]:
    world = World((UP, UP), (), 0)
    t = Transition(Action("news.preempt_notice", 0), moves, Node(after or before, world))
    return [name for name, _ in check_step(CHECKER, t, Node(before, world), with_state=False)]


SERVING = JobState(engines=(EngineState("Serving", current=True),) * 2, rollout="Generating", target=2)


def test_withdrawn_before_it_leaves_judges_every_way_out_of_serving() -> None:
    assert INVARIANTS["withdrawn_before_it_leaves"].kind == "step"
    silent = Move("engine", "engine-0", "retire", "Serving", "Draining", ("drain_requests",))
    assert "withdrawn_before_it_leaves" in step_problems(SERVING, (silent,))
    withdrawn = silent._replace(effects=("stop_routing", "drain_requests"))
    assert "withdrawn_before_it_leaves" not in step_problems(SERVING, (withdrawn,))
    held = Move("engine", "engine-1", "pause", "Serving", "Paused", ("hold_routing", "pause_generation"))
    assert "withdrawn_before_it_leaves" not in step_problems(SERVING, (held,))


def test_planned_leave_never_fails_the_run_judges_moves_and_failures() -> None:
    rule = "planned_leave_never_fails_the_run"
    as_death = Move("engine", "engine-0", "retire", "Serving", "Unhealthy", ("stop_routing",))
    assert rule in step_problems(SERVING, (as_death,))
    leaving = SERVING._replace(engines=(EngineState("Quiesced", current=True, leaving=True), SERVING.engines[1]))
    marked = Move("engine", "engine-0", "mark_unhealthy", "Quiesced", "Unhealthy", ())
    assert rule in step_problems(leaving, (marked,))
    assert rule not in step_problems(SERVING, (marked._replace(src="Serving", effects=("stop_routing",)),))
    failed = SERVING._replace(failed=Failure("engine", "engine-0", "Quiesced"))
    assert rule in step_problems(leaving, (), failed)
    assert rule not in step_problems(SERVING, (), failed)  # a member's failure is a failure


def test_a_stopping_engine_has_its_kill_out() -> None:
    retiring = JobState(engines=(EngineState("Retiring", leaving=True), EngineState("Serving", current=True)))
    world = World((UP, UP), (), 0)
    problems = [name for name, _ in check_state(CHECKER, Node(retiring, world))]
    assert "a_stopping_engine_has_its_kill_out" in problems
    kill = Command("kill_engine", "engine", "engine-0", ROLLOUT, 0)
    killing = retiring._replace(awaiting=(kill,))
    assert "a_stopping_engine_has_its_kill_out" not in [n for n, _ in check_state(CHECKER, Node(killing, world))]


def test_the_elastic_rules_have_one_entry_each_that_the_explorer_and_trace_check_share() -> None:
    for name in ("withdrawn_before_it_leaves", "planned_leave_never_fails_the_run", "no_broadcast_on_stale_group"):
        inv = INVARIANTS[name]
        assert inv.fn is not None and "event logs" in inv.doc, name  # the model's rule, and what a log is held to


# -- the preset ---------------------------------------------------------------------------------------------------
def test_the_elastic_preset_is_checked_and_drawn(capsys: pytest.CaptureFixture[str]) -> None:
    config = preset("elastic")
    assert config.max_rollout_engines == 3 and not config.offload_rollout
    assert main(["check", "--preset", "elastic", "--engines", "1", "--faults", "1", "--jobs", "1"]) == 0
    assert "OK: every invariant holds" in capsys.readouterr().out
    assert main(["graph", "--preset", "elastic", "--machine", "engine", "--format", "mermaid"]) == 0
    assert "Draining" in capsys.readouterr().out


def test_a_preset_with_config_flags_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", "--preset", "elastic", "--rollout-num-gpus", "2"]) != 0
    assert "--preset" in capsys.readouterr().err
