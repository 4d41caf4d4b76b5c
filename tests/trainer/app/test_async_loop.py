"""The async loop (``lifecycle run --async``): generate(k+1) overlaps train(k), one step off-policy.

Real Ray trainer, real CPU engine processes (local launcher: fewer Ray actors), a short run. The
event log must show the rollout manager ``Generating`` while the trainer is ``Training``, and the
weight update must wait for that generation: the engines' ``weight_version`` on each rollout's
samples proves which weights generated it.
"""

from __future__ import annotations

import asyncio
import io
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from lifecycle.cli import main
from lifecycle.decide.config import LifecycleConfig
from lifecycle.decide.errors import ConfigError, IllegalTransition
from lifecycle.decide.events import read_jsonl
from lifecycle.decide.machines import ROLLOUT
from lifecycle.decide.runtime import LifecycleMachine

pytest.importorskip("ray")
pytest.importorskip("torch")

import trainer.app.loop as loop_mod
from lifecycle.decide.runner import OperationRefused
from rollout.executor import EngineRolloutFn
from trainer.app.loop import RunOptions, RunResult, check_options, run_loop

CPU = {
    "use_fault_tolerance": True,
    "ft_components": ["rollout"],
    "rollout_num_gpus": 2,
    "rollout_health_check_interval": 2.0,
    "rollout_health_check_timeout": 2.0,
    "rollout_health_check_first_wait": 0.0,
}


def _run(run_dir: Path, steps: int, *, eval_interval: int | None = None, **kwargs: Any) -> RunResult:
    opts = RunOptions(steps=steps, seed=0, run_dir=run_dir, launcher="local", async_mode=True, **kwargs)
    config = LifecycleConfig.from_mapping({**CPU, "eval_interval": eval_interval})
    return asyncio.run(run_loop(config, opts, io.StringIO()))


@pytest.fixture
def versions(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[int, set[str]]]:
    """Record the weight versions the engines report for each rollout (the real rollout fn still runs)."""
    seen: dict[int, set[str]] = {}
    original = EngineRolloutFn.__call__

    async def recording(self: EngineRolloutFn, rollout_id: int, controller: Any) -> list[dict[str, Any]]:
        samples = await original(self, rollout_id, controller)
        seen[rollout_id] = {str(s["weight_version"]) for s in samples}
        return samples

    monkeypatch.setattr(EngineRolloutFn, "__call__", recording)
    yield seen


def _overlaps(events: list[dict[str, Any]]) -> int:
    """How many logged transitions leave the rollout manager Generating while the trainer is Training."""
    state: dict[str, str] = {}
    count = 0
    for e in events:
        if e.get("event") == "lifecycle.transition" and e.get("machine") in ("rollout", "trainer"):
            state[str(e["machine"])] = str(e["dst"])
            count += state.get("rollout") == "Generating" and state.get("trainer") == "Training"
    return count


@pytest.mark.usefixtures("ray_cluster")
def test_async_loop_overlaps_generate_with_train(tmp_path: Path, versions: dict[int, set[str]]) -> None:
    steps = 5
    result = _run(tmp_path / "run", steps, eval_interval=2)
    assert len(result.rewards) == steps
    events = read_jsonl(tmp_path / "run" / "events.jsonl")
    assert _overlaps(events) >= steps - 2  # generate(k+1) runs while train(k) does
    # one step off-policy: rollout k+1 was generated with the weights of update k (version k), and never
    # with a version the update of step k+1 wrote -- the update waited for the generation to end
    assert versions == {k: {str(max(k - 1, 0))} for k in range(steps)}
    rollout = [e for e in events if e.get("machine") == "rollout" and e.get("event") == "lifecycle.transition"]
    begins = [e for e in rollout if e["trigger"] == "begin_update"]
    assert len(begins) == steps and all(e["src"] == "Ready" for e in begins)
    assert not [e for e in events if e.get("trigger") == "offload" and e.get("machine") == "rollout"]
    assert result.metrics[-1]["engines"] == {"engine-0": "Quiesced", "engine-1": "Quiesced"}
    # evals as in the sync loop (before the first rollout, after every 2nd update), never during a generation
    assert [m["step"] for m in result.metrics if "eval_reward" in m] == [0, 1, 3]
    assert [e["src"] for e in rollout if e["trigger"] == "eval"] == ["Ready"] * 3


@pytest.mark.slow
@pytest.mark.usefixtures("ray_cluster")
def test_async_loop_learns_one_step_off_policy(tmp_path: Path, versions: dict[int, set[str]]) -> None:
    steps = 14
    result = _run(tmp_path / "run", steps)
    head, tail = result.rewards[:4], result.rewards[-4:]
    assert sum(tail) / 4 >= 1.5 * sum(head) / 4, result.rewards
    assert versions == {k: {str(max(k - 1, 0))} for k in range(steps)}


@pytest.mark.usefixtures("ray_cluster")
def test_update_without_waiting_for_generate_is_caught(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Re-introduce the bug (update weights without waiting for generate(k+1)): the loop refuses loudly.

    Generation is slowed down so that it is still running when training ends; without the loop's
    check the core refuses the update (the rollout manager is not Ready), and the refusal is raised.
    """
    original = EngineRolloutFn.__call__

    async def slow(self: EngineRolloutFn, rollout_id: int, controller: Any) -> list[dict[str, Any]]:
        await asyncio.sleep(4.0 if rollout_id > 0 else 0.0)  # outlasts a training step, even on a busy machine
        return await original(self, rollout_id, controller)

    monkeypatch.setattr(EngineRolloutFn, "__call__", slow)

    async def no_wait(pending: object) -> None:
        del pending

    monkeypatch.setattr(loop_mod, "_await_generation", no_wait)
    with pytest.raises(OperationRefused, match="update_weights: the rollout manager is Generating"):
        _run(tmp_path / "bug", 2)


def test_the_rollout_machine_refuses_begin_update_while_generating() -> None:
    config = LifecycleConfig.from_mapping(CPU)
    rollout = LifecycleMachine(ROLLOUT, config, "rollout")
    for trigger in ("init", "start_servers", "servers_ready", "generate"):
        rollout.fire(trigger)
    assert rollout.state == "Generating" and not rollout.can("begin_update")
    with pytest.raises(IllegalTransition):
        rollout.fire("begin_update")


@pytest.mark.memory
@pytest.mark.parametrize("flag", ["offload_rollout", "offload", "colocate"])
def test_async_with_offload_is_a_config_error(tmp_path: Path, flag: str) -> None:
    config = LifecycleConfig.from_mapping({**CPU, flag: True})
    with pytest.raises(ConfigError, match="--async"):
        check_options(config, RunOptions(run_dir=tmp_path, async_mode=True))
    check_options(config, RunOptions(run_dir=tmp_path))  # the sync loop offloads fine


@pytest.mark.memory
def test_cli_async_with_offload_names_the_flag(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "--async", "--offload-rollout", "--run-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--async" in err[0] and "offload" in err[0]


@pytest.mark.recovery
@pytest.mark.slow
@pytest.mark.usefixtures("ray_cluster")
def test_async_loop_recovers_a_killed_engine(tmp_path: Path) -> None:
    """Rollout FT under --async: an engine killed between steps is recovered by the next weight update
    (after the overlapping generation ended on the surviving engine) and training continues."""
    from trainer.app.faults import parse_fault

    result = _run(tmp_path / "kill", 5, faults=(parse_fault("kill-engine:1@2"),))
    assert len(result.rewards) == 5
    events = read_jsonl(tmp_path / "kill" / "events.jsonl")
    path = [(e["src"], e["dst"]) for e in events if e.get("instance") == "engine-1" and e.get("src")]
    assert ("Unhealthy", "Recovering") in path and ("PendingWeights", "LoadingWeights") in path
    assert result.metrics[-1]["engines"] == {"engine-0": "Quiesced", "engine-1": "Quiesced"}
