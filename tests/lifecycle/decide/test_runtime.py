"""The runtime machine layer: transitions-backed, typed errors, ledger."""

from __future__ import annotations

import pytest
from transitions import Machine

from lifecycle import EffectLedger, LifecycleConfig
from lifecycle.decide.errors import IllegalTransition
from lifecycle.decide.machines import ENGINE, MONITOR
from lifecycle.decide.runtime import LifecycleMachine, build_transitions_machine

FT_ROLLOUT = LifecycleConfig(use_fault_tolerance=True, rollout_num_gpus=2)
FT_TRAIN = LifecycleConfig(use_fault_tolerance=True, ft_components=["train"], rollout_num_gpus=2)


def _serving(config=FT_ROLLOUT, ledger=None):
    m = LifecycleMachine(ENGINE, config, "engine-0", ledger=ledger)
    for t in ("start", "ready", "begin_update", "finish_update", "resume"):
        assert m.fire(t).ok
    assert m.state == "Serving"
    return m


def test_illegal_event_raises_typed_error_naming_machine_instance_state_event():
    m = LifecycleMachine(ENGINE, FT_ROLLOUT, "engine-3")
    with pytest.raises(IllegalTransition) as info:
        m.fire("resume")
    err = info.value
    assert (err.machine, err.instance, err.state, err.trigger) == ("engine", "engine-3", "Init", "resume")
    assert "start" in err.allowed and "engine[engine-3]" in str(err)
    assert m.state == "Init" and m.seq == 0


def test_blocked_guard_returns_which_predicate_blocked():
    m = _serving(FT_TRAIN)
    assert m.fire("mark_unhealthy").dst == "Unhealthy"
    result = m.fire("recover")
    assert not result.ok
    assert result.blocked_by == ("rollout_ft",)
    assert result.guards == {"rollout_ft": False, "external_engines": False}
    assert m.state == "Unhealthy"


def test_ledger_records_effects_in_order_with_seq():
    ledger = EffectLedger()
    m = _serving(ledger=ledger)
    m.fire("mark_unhealthy")
    m.fire("recover")
    assert ledger.effects(instance="engine-0") == [
        "launch_engine",
        "transfer_weights",
        "continue_generation",
        "route_traffic",
        "stop_routing",
        "recover_engine",
        "kill_engine",
    ]
    seqs = [e.seq for e in ledger.entries()]
    assert seqs == sorted(seqs)
    assert ledger.ever("recover_engine", machine="engine")
    assert ledger.count("launch_engine") == 1


def test_instances_share_one_transitions_machine_but_not_state():
    a = LifecycleMachine(ENGINE, FT_ROLLOUT, "a")
    b = LifecycleMachine(ENGINE, FT_ROLLOUT, "b")
    a.fire("start")
    assert (a.state, b.state) == ("Starting", "Init")
    assert a.enabled() == ("ready", "start_failed")  # in the order the spec lists the transitions
    assert b.enabled() == ("start", "dispose")


def test_built_transitions_machine_is_plain_transitions_without_auto_transitions():
    class Model:
        pass

    model = Model()
    machine = build_transitions_machine(ENGINE, FT_ROLLOUT, model=model)
    assert isinstance(machine, Machine)
    assert not any(name.startswith("to_") for name in machine.events)
    assert model.state == "Init"
    model.start()
    assert model.state == "Starting"
    monitor = build_transitions_machine(MONITOR, FT_ROLLOUT, model=Model())
    assert type(monitor) is Machine and not monitor.has_queue  # every spec, the monitor's too: one sync machine


def test_transitions_guard_agrees_with_the_compiled_table():
    class Model:
        pass

    model = Model()
    build_transitions_machine(ENGINE, FT_TRAIN, model=model)
    for t in ("start", "ready", "begin_update", "finish_update", "resume", "mark_unhealthy"):
        getattr(model, t)()
    assert model.recover() is False  # rollout_ft is False: transitions' own guard blocks it too
    assert model.state == "Unhealthy"
