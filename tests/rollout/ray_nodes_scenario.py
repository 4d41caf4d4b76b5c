"""A Ray preemption on a real local two-node cluster (``--ray-nodes 2``: the head, and one worker node carrying the
``rollout_engine`` slots), run in a process of its own (``test_draining_nodes.py`` starts it: a test session's Ray is
one node). Prints one JSON line: what the controller's watcher noticed when the worker node was drained, and where
an engine launched into a new slot landed while it drained and after it was removed."""

from __future__ import annotations

import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any


async def scenario(tmp: Path) -> dict[str, Any]:
    import ray

    from engines.actor import drain_node, draining_nodes, engine_placement, remove_node
    from engines.launcher import launcher_factory
    from engines.models import TinyCausalLM
    from lifecycle.decide.config import LifecycleConfig
    from lifecycle.decide.events import PREEMPT_NOTICE, EventLog, MemorySink
    from lifecycle.decide.runner import Runner
    from rollout.executor import RolloutManager
    from rollout.pattern import PatternTask
    from tests.rollout.conftest import bind_trainer_stand_in

    out: dict[str, Any] = {"head": ray.get_runtime_context().get_node_id()}
    config = LifecycleConfig.from_mapping({"rollout_num_gpus": 2})
    sink = MemorySink()
    runner = Runner(config, log=EventLog([sink]))
    launchers = launcher_factory("ray")
    manager = RolloutManager(
        config, PatternTask(prompts_per_step=1, group_size=1, response_len=4), runner=runner, launcher_factory=launchers
    )
    TinyCausalLM("tiny", seed=100).save_pretrained(tmp / "step-0")
    bind_trainer_stand_in(runner)
    await runner.operate("trainer.start")
    await manager.init((str(tmp / "step-0"), "0"))
    c = manager.controller
    out["engine_nodes"] = [await e.launcher.node_id() for e in c.engines]  # type: ignore[attr-defined]
    worker = out["engine_nodes"][0]
    news: list[list[Any]] = []

    async def on_notice(group: str, index: int, epoch: int | None, deadline_s: float) -> None:
        news.append([group, index, epoch, deadline_s])

    watcher = c.watch_draining_nodes(on_notice, interval=0.2)
    drained_at = time.monotonic()
    drain_node(worker, 20.0, "test: spot preemption")
    out["draining"] = {k: v for k, v in draining_nodes().items()}
    while len(news) < 2 and time.monotonic() < drained_at + 20:
        await asyncio.sleep(0.05)
    out["noticed_after_s"] = round(time.monotonic() - drained_at, 3)
    await asyncio.sleep(1.0)  # five more polls: no engine is noticed twice
    out["news"] = news
    out["events"] = [
        {k: e[k] for k in ("instance", "epoch", "deadline_s", "by")} for e in sink if e["event"] == PREEMPT_NOTICE
    ]
    out["epochs"] = [e.epoch for e in c.engines]
    out["bounds"] = [c.drain_bound(c.notices[e.id][1] - time.monotonic()) for e in c.engines]
    await watcher.stop()

    async def join(slot: str) -> str | None:
        launcher = launchers(slot)
        try:
            await asyncio.wait_for(launcher.launch(), 120)
            return await launcher.node_id()  # type: ignore[attr-defined, no-any-return]
        except Exception as exc:  # a join that cannot be placed: reported, never a hang
            return f"failed: {type(exc).__name__}: {exc}"
        finally:
            launcher.shutdown()

    out["placement_while_draining"] = "resources" in engine_placement("engine-2")  # an engine node asked for
    out["join_while_draining"] = await join("engine-2")
    remove_node(worker)
    out["join_after_removal"] = await join("engine-3")
    try:
        await asyncio.wait_for(manager.dispose(), 60)
    except Exception as exc:
        out["dispose"] = repr(exc)
    return out


def main() -> None:
    from engines.actor import init_local_cluster

    init_local_cluster(num_cpus=2, nodes=2)
    with tempfile.TemporaryDirectory() as tmp:
        out = asyncio.run(asyncio.wait_for(scenario(Path(tmp)), 400))
    sys.stdout.write("RESULT " + json.dumps(out) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
