"""End to end: an elastic fleet in the real loop (CPU engines through SMG, the session's Ray cluster).

A run scales 2 -> 4 -> 1 -> 3 engines as steps 3, 6 and 9 start (``--scale-rollout 4@3 --scale-rollout 1@6
--scale-rollout 3@9``) and learns like a fixed fleet; a preempted engine (``preempt-engine``, with and without
rollout FT) is drained and replaced, never failed. Each run's log is judged whole (``trace check``), every engine
entering Serving holds the weights it loaded since its launch, and no request failed.
"""

from __future__ import annotations

import asyncio
import io
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from lifecycle.decide.config import LifecycleConfig
from lifecycle.decide.errors import ConfigError
from lifecycle.decide.events import (
    DRAINED,
    FLEET,
    GATEWAY_MEMBERS,
    PREEMPT_NOTICE,
    RESUMED,
    TRANSITION,
    VIOLATED,
    read_jsonl,
)
from lifecycle.observe.monitor import EventMonitor

pytest.importorskip("ray")
pytest.importorskip("torch")

from rollout.pattern import PatternTask
from trainer.app import Fleet, Job
from trainer.app.faults import Fault
from trainer.app.fleet import Scale
from trainer.app.loop import RunOptions, RunResult, run_loop
from trainer.job_state import load_job_checkpoint

pytestmark = pytest.mark.usefixtures("ray_cluster")

FLEET_2_OF_1_TO_4 = {
    "rollout_num_gpus": 2,
    "rollout_min_num_gpus": 1,
    "rollout_max_num_gpus": 4,
    "rollout_health_check_interval": 2.0,
    "rollout_health_check_timeout": 2.0,
    "rollout_health_check_first_wait": 0.0,
    "engine_restart_backoff": 0.1,
}
ROLLOUT_FT = {"use_fault_tolerance": True, "ft_components": ["rollout"]}
SCALES = (Scale(4, 3), Scale(1, 6), Scale(3, 9))


def _run(values: dict[str, Any], run_dir: Path, steps: int, **options: Any) -> RunResult:
    opts = RunOptions(steps=steps, seed=0, run_dir=run_dir, quiet=True, **options)
    return asyncio.run(run_loop(LifecycleConfig.from_mapping(values), opts, io.StringIO()))


def _moves(events: list[dict[str, Any]], instance: str) -> list[dict[str, Any]]:
    return [e for e in events if e.get("event") == TRANSITION and e.get("instance") == instance]


def check_clean(events: list[dict[str, Any]]) -> None:
    """``trace check``: the live monitor logged no violation, and judging the whole log again finds none."""
    assert not [e for e in events if e.get("event") == VIOLATED]
    found = EventMonitor().feed_all(events)
    assert not found, [v.describe() for v in found]


def check_loaded_before_routed(events: list[dict[str, Any]]) -> list[str]:
    """Every engine process enters Serving only after it loaded weights since its launch; the engines that did."""
    routed = []
    for instance in sorted({str(e["instance"]) for e in events if e.get("machine") == "engine"}):
        loaded = False
        for t in _moves(events, instance):
            if t["trigger"] in ("launch", "join", "start") or t["dst"] == "PendingWeights":
                loaded = False
            elif t["trigger"] == "finish_update" and t["src"] == "LoadingWeights":
                loaded = True
            elif t["dst"] == "Serving":
                assert loaded, f"{instance} routed before it loaded the weights: {t}"
                routed.append(instance)
    return routed


def check_no_failed_request(events: list[dict[str, Any]]) -> None:
    """No engine was marked Unhealthy or failed, and no request failed (a planned leave is not a failure)."""
    marked = [e for e in events if e.get("event") == TRANSITION and e.get("dst") in ("Unhealthy", "Failed")]
    assert not marked, marked
    assert not [e for e in events if "request_failed" in str(e.get("reason", ""))]


def test_a_fleet_scaled_2_4_1_3_learns_and_its_trace_is_clean(tmp_path: Path) -> None:
    result = _run(FLEET_2_OF_1_TO_4, tmp_path / "run", 12, scale=SCALES)
    assert len(result.rewards) == 12
    assert result.last5 >= 2 * result.first5, result.rewards
    events = read_jsonl(tmp_path / "run" / "events.jsonl")
    check_clean(events)
    check_no_failed_request(events)
    # the engines that held the step's weights at its end: the target from its step on
    serving = [Counter(row["engines"].values())["Quiesced"] for row in result.metrics]
    assert serving == [2] * 3 + [4] * 3 + [1] * 3 + [3] * 3, serving
    targets = [e["target"] for e in events if e.get("event") == FLEET]
    assert [t for i, t in enumerate(targets) if i == 0 or t != targets[i - 1]][-3:] == [4, 1, 3], targets
    assert len(set(check_loaded_before_routed(events))) == 4  # each slot served, each on loaded weights
    # SMG's worker list read back at every step's generate (and after every scale), each judged by the trace check
    # above against the engines Serving then: at every step, exactly the target's engines were ready at SMG
    reads = [e for e in events if e.get("event") == GATEWAY_MEMBERS and e.get("router") == "router-rollout"]
    ready = [len([w for w in e["workers"] if w.get("status") == "ready"]) for e in reads]
    assert len({e.get("step") for e in reads}) == 12, reads
    assert [max(n for e, n in zip(reads, ready, strict=True) if e.get("step") == s) for s in range(12)] == serving


@pytest.mark.parametrize(("ft", "stream"), [("none", False), ("rollout", True)], ids=["no-ft", "ft-rollout-stream"])
def test_a_preempted_engine_is_drained_and_replaced_never_failed(tmp_path: Path, ft: str, stream: bool) -> None:
    """Lock-step without FT: the notice finds the engine between steps (nothing routed: stopped at once). Mid-stream
    with rollout FT: the engine is Serving with requests in flight -- withdrawn, drained, then stopped."""
    values = {**FLEET_2_OF_1_TO_4, "rollout_max_num_gpus": 3, **(ROLLOUT_FT if ft == "rollout" else {})}
    if stream:
        values["fully_async"] = True
    fault = Fault("preempt-engine", 1, 2)
    result = _run(values, tmp_path / "run", 5, faults=(fault,), preempt_notice=10.0)
    assert len(result.rewards) == 5
    events = read_jsonl(tmp_path / "run" / "events.jsonl")
    check_clean(events)
    check_no_failed_request(events)
    notices = [e for e in events if e.get("event") == PREEMPT_NOTICE]
    assert [(e["instance"], e["by"], e["deadline_s"]) for e in notices] == [("engine-1", "injector", 10.0)]
    path = [t["dst"] for t in _moves(events, "engine-1")]
    assert "Retired" in path, path  # confirmed gone
    if stream:  # it was routed: withdrawn first, its requests drained within the bound
        assert path[path.index("Retired") - 2 : path.index("Retired")] == ["Draining", "Retiring"], path
        drained = [e for e in events if e.get("event") == DRAINED]
        assert [(e["instance"], e["timed_out"]) for e in drained] == [("engine-1", False)], drained
    joined = [t for t in events if t.get("event") == TRANSITION and t.get("trigger") == "join"]
    assert joined, "no replacement joined"
    # the target kept: as many members at the end as at the start, each on loaded weights when routed
    last = result.metrics[-1]["engines"]
    assert sum(state not in ("Init", "Retired", "Retiring", "Draining") for state in last.values()) == 2, last
    check_loaded_before_routed(events)


def test_a_resumed_elastic_job_restarts_its_target(tmp_path: Path) -> None:
    """The job checkpoint records the fleet's target; a resume starts the configured fleet and its first boundary
    brings it to that target (here 3 engines, scaled before the checkpoint, not the 2 of --rollout-num-gpus)."""
    save = tmp_path / "ckpt"
    values = {**FLEET_2_OF_1_TO_4, "save": str(save), "save_interval": 1}
    _run(values, tmp_path / "run", 2, scale=(Scale(3, 1),))
    checkpoint = load_job_checkpoint(save, LifecycleConfig.from_mapping(values), RunOptions().job_settings())
    assert checkpoint.step == 2 and checkpoint.target == 3
    resumed = _run({**values, "load": str(save)}, tmp_path / "run", 4, scale=(Scale(3, 1),))
    assert [row["step"] for row in resumed.metrics] == [0, 1, 2, 3]
    serving = [Counter(row["engines"].values())["Quiesced"] for row in resumed.metrics]
    assert serving == [2, 3, 3, 3], serving  # the resumed steps 2 and 3: the checkpoint's target, no scale op
    events = read_jsonl(tmp_path / "run" / "events.jsonl")
    check_clean(events[next(i for i, e in enumerate(events) if e.get("event") == RESUMED) :])


def test_the_job_api_adds_and_retires_engines_and_reads_the_fleet(tmp_path: Path) -> None:
    """``Job.add_engines`` / ``retire_engines`` / ``fleet`` on a running job: joiners are members at once and serve
    the next generate; a retired engine is out of the fleet on return (``wait=True``: stopped); the bounds hold."""
    config = LifecycleConfig.from_mapping({**FLEET_2_OF_1_TO_4, "rollout_max_num_gpus": 3})

    async def main() -> tuple[Fleet, list[str], Fleet, list[str], Fleet]:
        async with Job(config, PatternTask(seed=0), run_dir=tmp_path / "run") as job:
            start = job.fleet
            await job.generate(0)
            joined = await job.add_engines(1)
            grown = job.fleet
            with pytest.raises(ConfigError, match=r"1\.\.3 engines"):
                await job.add_engines(1)  # 4 > --rollout-max-num-gpus
            with pytest.raises(ConfigError, match="not a member"):
                await job.retire_engines(["engine-7"])
            await job.generate(1)
            left = await job.retire_engines([0], wait=True)
            await job.generate(2)
            return start, joined, grown, left, job.fleet

    start, joined, grown, left, end = asyncio.run(main())
    assert start == Fleet(2, ("engine-0", "engine-1"), (), (), ("engine-2",))
    assert joined == ["engine-2"] and grown.target == 3 and grown.members == ("engine-0", "engine-1", "engine-2")
    assert left == ["engine-0"]
    assert end.target == 2 and end.members == ("engine-1", "engine-2") and not end.draining
    assert end.vacant == ("engine-0",)
    events = read_jsonl(tmp_path / "run" / "events.jsonl")
    check_clean(events)
    check_no_failed_request(events)
    assert {"engine-1", "engine-2"} <= set(check_loaded_before_routed(events))
