"""The runtime machine layer: transitions-backed, typed errors, ledger, handlers, async queueing."""

from __future__ import annotations

import asyncio

import pytest
from transitions import Machine
from transitions.extensions.asyncio import AsyncMachine

from lifecycle import (
    ENGINE,
    MONITOR,
    AsyncLifecycleMachine,
    EffectLedger,
    IllegalTransition,
    LifecycleConfig,
    LifecycleMachine,
)
from lifecycle.runtime import build_transitions_machine

FT_ROLLOUT = LifecycleConfig(use_fault_tolerance=True, rollout_num_gpus=2)
FT_TRAIN = LifecycleConfig(use_fault_tolerance=True, ft_components=["train"], rollout_num_gpus=2)


def _serving(config=FT_ROLLOUT, ledger=None, handlers=None):
    m = LifecycleMachine(ENGINE, config, "engine-0", ledger=ledger, handlers=handlers)
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


def test_handlers_run_after_the_state_changed():
    seen = []
    m = _serving(handlers={"route_traffic": lambda r: seen.append((r.effects, r.dst))})
    assert seen == [(("continue_generation", "route_traffic"), "Serving")]
    assert m.state == "Serving"


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
    assert isinstance(monitor, AsyncMachine)
    assert monitor.has_queue


def test_transitions_guard_agrees_with_the_compiled_table():
    class Model:
        pass

    model = Model()
    build_transitions_machine(ENGINE, FT_TRAIN, model=model)
    for t in ("start", "ready", "begin_update", "finish_update", "resume", "mark_unhealthy"):
        getattr(model, t)()
    assert model.recover() is False  # rollout_ft is False: transitions' own guard blocks it too
    assert model.state == "Unhealthy"


def test_async_machine_queues_an_event_fired_from_a_handler():
    order: list[str] = []
    holder: dict[str, AsyncLifecycleMachine] = {}

    async def on_start(result):
        order.append(f"start_monitor in {holder['m'].state}")
        queued = await holder["m"].fire("resume")
        assert queued.queued
        await asyncio.sleep(0)
        order.append(f"after nested fire still {holder['m'].state}")

    async def on_resume(result):
        order.append(f"resume_monitor in {holder['m'].state}")

    async def run():
        m = AsyncLifecycleMachine(
            MONITOR, FT_ROLLOUT, "rollout-group", handlers={"start_monitor": on_start, "resume_monitor": on_resume}
        )
        holder["m"] = m
        result = await m.fire("create")
        assert result.ok and result.dst == "Paused"
        return m

    m = asyncio.run(run())
    assert m.state == "Running"
    # The nested 'resume' ran only after the 'create' callbacks finished: queued=True.
    assert order == ["start_monitor in Paused", "after nested fire still Paused", "resume_monitor in Running"]


def test_async_machine_blocked_and_illegal():
    async def run():
        m = AsyncLifecycleMachine(MONITOR, FT_TRAIN, "g")
        blocked = await m.fire("create")
        assert not blocked.ok and blocked.blocked_by == ("monitors_rollout",)
        with pytest.raises(IllegalTransition):
            await m.fire("probe")

    asyncio.run(run())


def test_async_fire_without_awaiting_handlers_does_not_yield_to_the_event_loop():
    """A transition is atomic for other coroutines (and cheap): no task per callback list.

    Plain ``AsyncMachine`` gathers every callback list; each non-empty one (the condition check,
    the ``after`` callback) suspends the caller, so a probe loop's ``fire`` interleaved with other
    coroutines.
    """

    async def run() -> list[str]:
        m = AsyncLifecycleMachine(MONITOR, FT_ROLLOUT, "g")
        seen: list[str] = []

        async def other() -> None:
            seen.append("other ran")

        task = asyncio.ensure_future(other())
        for trigger in ("create", "resume", "probe", "probe_failed", "pause"):
            await m.fire(trigger)
        seen.append(f"fires done in {m.state}")
        await task
        return seen

    assert asyncio.run(run()) == ["fires done in Paused", "other ran"]


def test_lean_async_machine_still_gathers_lists_of_several_callbacks():
    from lifecycle.runtime import LeanAsyncMachine

    order: list[str] = []

    async def slow(_event: object = None) -> None:
        order.append("slow start")
        await asyncio.sleep(0.01)
        order.append("slow end")

    async def fast(_event: object = None) -> None:
        order.append("fast")

    async def run() -> str:
        machine = LeanAsyncMachine(
            model=None,
            states=["A", "B"],
            initial="A",
            auto_transitions=False,
            queued=True,
            transitions=[{"trigger": "go", "source": "A", "dest": "B", "after": [slow, fast]}],
        )
        holder = type("Model", (), {"state": "A"})()
        machine.add_model(holder)
        await holder.go()  # type: ignore[attr-defined]
        return holder.state  # type: ignore[attr-defined,no-any-return]

    assert asyncio.run(run()) == "B"
    assert order == ["slow start", "fast", "slow end"]  # concurrent, as transitions documents
