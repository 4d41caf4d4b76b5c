"""The runtime's driver of the core: handler binding, concurrent commands committed in order, the ledger.

Handlers here are small coroutines standing in for the shells (the real ones are tested with real
processes in tests/rollout and tests/trainer); what is under test is the runner's own contract.
"""

from __future__ import annotations

import asyncio
import random

import pytest

from lifecycle import EffectLedger, EventLog, LifecycleConfig
from lifecycle.decide.core import Command, Outcome
from lifecycle.decide.events import TRANSITION, MemorySink
from lifecycle.decide.runner import OperationRefused, Runner, UnboundEffect

ROLLOUT_ONLY = {"debug_rollout_only": True, "rollout_num_gpus": 3}


def _runner(flags: dict[str, object], delays: dict[str, float] | None = None) -> tuple[Runner, MemorySink]:
    sink = MemorySink()
    runner = Runner(LifecycleConfig.from_mapping(flags, check_paths=False), log=EventLog([sink]), ledger=EffectLedger())
    answers = {
        "launch_engine": "ready",
        "kill_engine": "dead",
        "transfer_weights": "loaded",
        "probe_engine": "probe_ok",
    }

    def handler(effect: str):
        async def run(cmd: Command) -> Outcome:
            await asyncio.sleep((delays or {}).get(cmd.instance, 0.0))
            return Outcome(answers.get(effect, "done"))

        return run

    runner.provide({f"{m}.{e}": handler(e) for m, e in runner.core.commands()})
    return runner, sink


def test_a_job_with_an_unbound_effect_fails_at_its_first_operation_naming_it():
    runner, _ = _runner(ROLLOUT_ONLY)
    del runner.handlers["engine.launch_engine"]
    with pytest.raises(UnboundEffect, match=r"no handler for engine\.launch_engine"):
        asyncio.run(runner.operate("init"))


def test_concurrent_commands_are_committed_in_slot_order_whatever_their_timing():
    """Engine 0 answers last, engine 2 first: the event log still reads engine-0, engine-1, engine-2."""
    logs = []
    for delays in ({"engine-0": 0.06, "engine-1": 0.03, "engine-2": 0.0}, {"engine-0": 0.0, "engine-2": 0.05}):
        runner, sink = _runner(ROLLOUT_ONLY, delays)
        asyncio.run(runner.operate("init"))
        logs.append([(e["instance"], e["trigger"]) for e in sink if e.get("event") == TRANSITION])
    assert logs[0] == logs[1]
    readies = [who for who, trigger in logs[0] if trigger == "ready"]
    assert readies == ["engine-0", "engine-1", "engine-2"]


def test_the_launches_run_at_once_not_one_after_another():
    in_flight, most = 0, 0
    runner, _ = _runner(ROLLOUT_ONLY)

    async def launch(cmd: Command) -> Outcome:
        nonlocal in_flight, most
        in_flight += 1
        most = max(most, in_flight)
        await asyncio.sleep(0.02 * random.random())
        in_flight -= 1
        return Outcome("ready")

    runner.provide({"engine.launch_engine": launch})
    asyncio.run(runner.operate("init"))
    assert most == 3


def test_the_ledger_records_work_when_it_has_run_and_a_failure_as_failed():
    runner, _ = _runner(ROLLOUT_ONLY)

    async def refuse(cmd: Command) -> Outcome:
        return Outcome("refused" if cmd.engine == 1 else "loaded", reason="wrong shape")

    runner.provide({"engine.transfer_weights": refuse})
    asyncio.run(runner.operate("init"))
    loads = [(e.instance, e.status) for e in runner.ledger if e.effect == "transfer_weights"]
    assert loads == [("engine-0", "done"), ("engine-1", "failed"), ("engine-2", "done")]
    assert runner.reasons["engine-1"] == "wrong shape"
    assert runner.ledger.ever("construct_rollout_fn") and runner.ledger.ever("start_servers")


def test_a_handler_that_raises_is_an_error_result_and_the_exception_is_kept():
    runner, _ = _runner(ROLLOUT_ONLY)

    async def broken(cmd: Command) -> Outcome:
        raise RuntimeError("the user's factory blew up")

    runner.provide({"rollout.construct_rollout_fn": broken})
    asyncio.run(runner.operate("init"))
    failed = runner.state.failed
    assert failed is not None and (failed.machine, failed.instance) == ("rollout", "rollout")
    assert "RuntimeError" in failed.reason and str(failed).startswith("rollout: construct_rollout_fn raised")
    assert runner.ledger.failed("construct_rollout_fn") and not runner.ledger.ever("construct_rollout_fn")
    with pytest.raises(RuntimeError, match="blew up"):
        runner.raise_failure()


def test_an_operation_the_core_refuses_raises_unless_allowed():
    runner, _ = _runner(ROLLOUT_ONLY)
    asyncio.run(runner.operate("init"))
    with pytest.raises(OperationRefused, match="not allowed in state 'Ready'"):
        asyncio.run(runner.operate("generate_done"))
    refusal = asyncio.run(runner.operate("train", allow=frozenset({"blocked"})))
    assert refusal is not None and refusal.blocked_by == ("trains",)


def test_the_reason_an_engine_is_named_for_is_the_news_that_moved_it_not_the_latest():
    """An engine's failure quotes what marked it: news that moves nothing (a probe verdict after its death, a late
    report about a replaced process) must not overwrite it, or the error blames the wrong thing."""
    from lifecycle.decide.core import ROLLOUT

    runner, _ = _runner(ROLLOUT_ONLY)

    async def scenario() -> None:
        await runner.operate("init")
        await runner.report(Outcome("died", ROLLOUT, 1, "exit code -9"))
        marked = runner.state.engines[1].state
        assert marked not in ("Serving", "Quiesced"), marked  # the death moved it
        await runner.report(Outcome("threshold_reached", ROLLOUT, 1, "3 failed probes"))  # moves nothing now
        assert runner.state.engines[1].state == marked
        epoch = runner.epoch(ROLLOUT, 1)
        await runner.report(Outcome("request_failed", ROLLOUT, 1, "late news", epoch=epoch - 1))  # fenced

    asyncio.run(scenario())
    assert runner.reasons["engine-1"] == "exit code -9"
