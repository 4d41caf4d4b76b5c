"""Definition-time validation of machine specs, and compilation to a lookup table."""

from __future__ import annotations

from dataclasses import replace

import pytest

from lifecycle import LifecycleConfig
from lifecycle.decide.errors import SpecError
from lifecycle.decide.machines import ENGINE, MACHINES, ROLLOUT
from lifecycle.decide.spec import Blocked, MachineSpec, StateSpec, Step, T

S = StateSpec


def _spec(states, transitions, **kw):
    return MachineSpec(name="toy", states=tuple(states), transitions=tuple(transitions), **kw)


GOOD_STATES = [S("Init"), S("A"), S("Done", terminal=True)]
GOOD_TRANSITIONS = [T("go", "Init", "A"), T("finish", "A", "Done")]


def test_a_good_toy_spec_builds():
    spec = _spec(GOOD_STATES, GOOD_TRANSITIONS)
    assert spec.state_names == ("Init", "A", "Done")


@pytest.mark.parametrize(
    ("states", "transitions", "message"),
    [
        (GOOD_STATES, [T("go", "Init", "A", when="no_such_predicate"), T("finish", "A", "Done")], "unknown guard"),
        (GOOD_STATES, [T("go", "Init", "A", effects=["launch_rocket"]), T("finish", "A", "Done")], "unknown effect"),
        (
            GOOD_STATES,
            [T("go", "Init", "A", effects=["launch_engine if nope"]), T("finish", "A", "Done")],
            "unknown predicate 'nope'",
        ),
        ([*GOOD_STATES, S("Orphan")], [*GOOD_TRANSITIONS, T("x", "Orphan", "Done")], "'Orphan' is unreachable"),
        ([*GOOD_STATES, S("Trap")], [*GOOD_TRANSITIONS, T("trap", "A", "Trap")], "'Trap' is a trap"),
        (GOOD_STATES, [*GOOD_TRANSITIONS, T("again", "Done", "A")], "terminal state 'Done' has outgoing"),
        (
            [*GOOD_STATES, S("Loop1"), S("Loop2")],
            [*GOOD_TRANSITIONS, T("l", "A", "Loop1"), T("l2", "Loop1", "Loop2"), T("l1", "Loop2", "Loop1")],
            "'Loop1' can never reach a terminal state",
        ),
        (GOOD_STATES, [*GOOD_TRANSITIONS, T("go", "Init", "Done")], "ambiguous"),
        (GOOD_STATES, [T("go", "Init", "Nowhere"), *GOOD_TRANSITIONS], "unknown state 'Nowhere'"),
        ([S("Init"), S("A")], [T("go", "Init", "A"), T("back", "A", "Init")], "no terminal state"),
        ([*GOOD_STATES, S("A")], GOOD_TRANSITIONS, "'A' is defined more than once"),
    ],
)
def test_broken_specs_fail_validation_naming_the_problem(states, transitions, message):
    with pytest.raises(SpecError) as info:
        _spec(states, transitions)
    assert message in str(info.value)
    assert info.value.machine == "toy"


def test_initial_state_must_be_init():
    with pytest.raises(SpecError, match="every machine starts in 'Init'"):
        _spec(
            [S("Init"), S("Start"), S("Done", terminal=True)],
            [T("a", "Init", "Done"), T("b", "Start", "Done")],
            initial="Start",
        )


def test_exclusive_guards_are_not_ambiguous():
    spec = _spec(
        GOOD_STATES,
        [T("go", "Init", "A", when="replay"), T("go", "Init", "Done", when="!replay"), T("finish", "A", "Done")],
    )
    replay_cfg = LifecycleConfig(load_debug_rollout_data="x/{rollout_id}.json")
    normal_cfg = LifecycleConfig(rollout_num_gpus=1)
    assert spec.compile(replay_cfg).step("Init", "go").dest == "A"
    assert spec.compile(normal_cfg).step("Init", "go").dest == "Done"


def test_every_shipped_machine_needs_each_of_its_exits():
    """Validation of the shipped machines is not vacuous: remove the exits of any non-terminal state and
    building the spec fails, calling that state a trap (the import-time check refuses such an edit)."""
    for spec in MACHINES.values():
        for state in spec.states:
            if state.terminal:
                continue
            kept = tuple(t for t in spec.transitions if state.name not in t.source)
            with pytest.raises(SpecError) as info:
                replace(spec, transitions=kept)
            assert any(f"state {state.name!r} is a trap" in p for p in info.value.problems), (spec.name, state.name)


def test_compile_reports_blocking_guard_and_gated_effects():
    ft_train = LifecycleConfig(use_fault_tolerance=True, ft_components=["train"], rollout_num_gpus=2)
    blocked = ENGINE.compile(ft_train).step("Unhealthy", "recover")
    assert isinstance(blocked, Blocked)
    assert blocked.blocked_by == ("rollout_ft",)
    ft_rollout = LifecycleConfig(use_fault_tolerance=True, rollout_num_gpus=2)
    step = ENGINE.compile(ft_rollout).step("Unhealthy", "recover")
    assert isinstance(step, Step) and step.dest == "Recovering"
    ready = ROLLOUT.compile(ft_train).step("StartingServers", "servers_ready")
    assert "start_monitor" not in ready.effects
    assert "start_monitor" in ROLLOUT.compile(ft_rollout).step("StartingServers", "servers_ready").effects
    assert ENGINE.compile(ft_rollout).step("Serving", "no_such_event") is None


def test_compile_is_cached_per_predicate_vector():
    a = LifecycleConfig(use_fault_tolerance=True, rollout_num_gpus=2)
    b = LifecycleConfig(
        use_fault_tolerance=True, rollout_num_gpus=8, rollout_health_check_interval=60, rollout_health_check_timeout=5
    )
    assert ENGINE.compile(a) is ENGINE.compile(b)


def test_compile_from_a_plain_mapping_matches_the_config():
    cfg = LifecycleConfig(use_fault_tolerance=True, rollout_num_gpus=2)
    from lifecycle.decide.predicates import evaluate

    by_map = ENGINE.compile(evaluate(cfg))
    by_cfg = ENGINE.compile(cfg)
    assert {k: (type(v), getattr(v, "dest", None)) for k, v in by_map.table.items()} == {
        k: (type(v), getattr(v, "dest", None)) for k, v in by_cfg.table.items()
    }
