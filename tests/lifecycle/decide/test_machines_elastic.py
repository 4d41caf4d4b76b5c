"""An elastic fleet's states and moves, checked on the specs themselves: every way out of Serving withdraws the
engine first; a joiner reaches Serving only through a load (LoadingWeights); a leaving engine is never marked
Unhealthy, recovered or failed; and every entry into the new states is guarded by ``elastic``, so a config without
bounds keeps exactly its machines. Each check is shown to fail on a spec with the bug planted."""

from __future__ import annotations

import dataclasses
from collections import deque
from collections.abc import Callable

import pytest

from lifecycle.decide.config import LifecycleConfig
from lifecycle.decide.machines import ENGINE, ROLLOUT, TRAINER, WEIGHT_SYNC
from lifecycle.decide.predicates import elastic
from lifecycle.decide.presets import PRESETS, preset
from lifecycle.decide.spec import MachineSpec, Step, T, TransitionSpec

NEW_STATES = frozenset({"Joining", "Draining", "Retiring", "Retired"})
WITHDRAWALS = frozenset({"stop_routing", "hold_routing"})
ELASTIC = LifecycleConfig.from_mapping(
    {"rollout_num_gpus": 2, "rollout_min_num_gpus": 1, "rollout_max_num_gpus": 3}, check_paths=False
)


def withdrawn_before_it_leaves(spec: MachineSpec) -> list[str]:
    """Every move from Serving to another state carries stop_routing or hold_routing (NeMo-RL #3613)."""
    return [
        f"{t.trigger}: Serving -> {t.dest} without a withdrawal"
        for t in spec.transitions
        if "Serving" in t.source and t.dest != "Serving" and not {e.name for e in t.effects} & WITHDRAWALS
    ]


def joiner_routed_only_after_a_load(spec: MachineSpec) -> list[str]:
    """With LoadingWeights taken out, no path of any guard leads from Joining to Serving."""
    edges: dict[str, set[str]] = {}
    for t in spec.transitions:
        for s in t.source:
            edges.setdefault(s, set()).add(t.dest)
    seen, queue = {"Joining"}, deque(["Joining"])
    while queue:
        for nxt in edges.get(queue.popleft(), ()):
            if nxt not in seen and nxt != "LoadingWeights":
                seen.add(nxt)
                queue.append(nxt)
    return ["Joining reaches Serving without LoadingWeights"] if "Serving" in seen else []


def leaving_never_fails(spec: MachineSpec) -> list[str]:
    """No move from a leaving state (tag ``leaving``) to a marked state (Unhealthy, Recovering, Failed)."""
    leaving = spec.tagged("leaving")
    marked = {s.name for s in spec.states if s.marked}
    return [
        f"{t.trigger}: {s} -> {t.dest}" for t in spec.transitions for s in t.source if s in leaving and t.dest in marked
    ]


CHECKS: dict[str, Callable[[MachineSpec], list[str]]] = {
    "withdrawn": withdrawn_before_it_leaves,
    "joiner": joiner_routed_only_after_a_load,
    "leaving": leaving_never_fails,
}


def planted(drop: Callable[[TransitionSpec], bool], *add: TransitionSpec) -> MachineSpec:
    """The engine spec with the transitions ``drop`` picks replaced by ``add`` (validated like the real one)."""
    return dataclasses.replace(ENGINE, transitions=(*(t for t in ENGINE.transitions if not drop(t)), *add))


def is_(trigger: str, source: str) -> Callable[[TransitionSpec], bool]:
    return lambda t: t.trigger == trigger and source in t.source


# each check's planted bug: a retire that keeps the engine routed, a joiner that skips its load, a notice read as death
PLANTED = {
    "withdrawn": planted(
        is_("retire", "Serving"), T("retire", "Serving", "Draining", when="elastic", effects=["drain_requests"])
    ),
    "joiner": planted(is_("ready", "Joining"), T("ready", "Joining", "Quiesced")),
    "leaving": planted(lambda t: False, T("mark_unhealthy", "Draining", "Unhealthy", when="elastic")),
}


@pytest.mark.parametrize("name", sorted(CHECKS))
def test_the_engine_spec_passes_each_static_check(name: str) -> None:
    assert CHECKS[name](ENGINE) == []


@pytest.mark.parametrize("name", sorted(CHECKS))
def test_each_static_check_fails_on_its_planted_bug(name: str) -> None:
    assert CHECKS[name](PLANTED[name]) != []
    # and only its own: the plants are single bugs
    assert all(check(PLANTED[name]) == [] for other, check in CHECKS.items() if other != name)


def test_every_entry_into_the_new_states_is_guarded_by_elastic() -> None:
    entries = [t for t in ENGINE.transitions if t.dest in NEW_STATES and set(t.source) - NEW_STATES]
    assert {t.trigger for t in entries} == {"join", "retire", "lost", "give_up", "retired"}
    assert all("elastic" in map(str, t.guards) for t in entries), entries


@pytest.mark.parametrize("name", sorted(p for p in PRESETS if not elastic(preset(p))))
def test_no_preset_without_bounds_reaches_a_new_state_or_move(name: str) -> None:
    c = preset(name)
    assert not (ENGINE.compile(c).reachable()[0] & NEW_STATES)
    for spec, trigger in ((ROLLOUT, "scale"), (WEIGHT_SYNC, "member_left")):
        compiled = spec.compile(c)
        assert all(trigger not in compiled.enabled[s] for s in compiled.reachable()[0])
    update = TRAINER.compile(c).table.get(("Ready", "update_weights"))
    assert not isinstance(update, Step) or "reconcile_fleet" not in update.effects


def test_an_elastic_fleet_reaches_every_new_state_and_move() -> None:
    engine = ENGINE.compile(ELASTIC)
    assert engine.reachable()[0] >= NEW_STATES
    rollout = ROLLOUT.compile(ELASTIC)
    for state in ("Ready", "Generating", "Streaming"):
        out = rollout.table[state, "scale"]
        assert isinstance(out, Step) and out.dest == state and out.effects == ("reconcile_fleet",)
    update = TRAINER.compile(ELASTIC).table["Ready", "update_weights"]
    assert isinstance(update, Step) and update.effects.index("reconcile_fleet") < update.effects.index(
        "transfer_weights"
    )  # reconciled before the snapshot is taken
    left = WEIGHT_SYNC.compile(ELASTIC).table["Connected", "member_left"]
    assert isinstance(left, Step) and left.dest == "Stale"


def test_a_spent_budget_retires_the_slot_only_in_an_elastic_fleet() -> None:
    """Decision 8: give_up splits on elastic -- Retired (the run goes on while the minimum serves) or Failed."""
    elastic = ENGINE.compile(ELASTIC).table["Recovering", "give_up"]
    assert isinstance(elastic, Step) and elastic.dest == "Retired" and "report_failure" not in elastic.effects
    plain = ENGINE.compile(preset("ft-rollout")).table["Recovering", "give_up"]
    assert isinstance(plain, Step) and plain.dest == "Failed" and plain.effects == ("report_failure",)


def test_a_leaver_is_stopped_never_marked_and_a_drain_hands_back_only_in_a_stream() -> None:
    engine = ENGINE.compile(ELASTIC)
    assert ENGINE.tagged("leaving") == {"Draining", "Retiring"}
    assert "mark_unhealthy" not in engine.enabled["Draining"]
    drained = engine.table["Draining", "drained"]
    assert isinstance(drained, Step) and drained.effects == ("kill_engine",)
    streaming = LifecycleConfig.from_mapping(
        {"rollout_num_gpus": 2, "rollout_max_num_gpus": 3, "fully_async": True}, check_paths=False
    )
    streamed = ENGINE.compile(streaming).table["Draining", "drained"]
    assert isinstance(streamed, Step) and streamed.effects == ("hand_back_requests", "kill_engine")
    failed_join = engine.table["Joining", "start_failed"]
    assert isinstance(failed_join, Step) and failed_join.dest == "Retiring"  # never Unhealthy: the run goes on
