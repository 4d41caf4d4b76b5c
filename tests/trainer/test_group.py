"""The trainer group on real Ray actors: healing under train FT, failing fast without it, and the
rollout recovery that ``update_weights`` performs only when its move says ``recover_engine``."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from lifecycle.decide.config import LifecycleConfig
from lifecycle.decide.events import TRANSITION, EventLog, MemorySink
from lifecycle.decide.runner import Runner

pytest.importorskip("ray")
torch = pytest.importorskip("torch")

from engines.engine import EngineFailed  # noqa: E402
from rollout.pattern import PatternTask  # noqa: E402
from trainer.group import TrainerFailed, TrainerGroup  # noqa: E402
from trainer.workers import WorkerCrashed  # noqa: E402

from .conftest import bind_rollout_stand_in, generated  # noqa: E402

pytestmark = pytest.mark.usefixtures("ray_cluster")

TRAIN_FT = {"use_fault_tolerance": True, "ft_components": ["train"], "rollout_num_gpus": 1}
NO_FT = {"rollout_num_gpus": 1}
ROLLOUT_FT = {"use_fault_tolerance": True, "ft_components": ["rollout"], "rollout_num_gpus": 1}


def _samples(n_groups: int = 2, group_size: int = 2) -> list[dict[str, Any]]:
    """A small GRPO batch in the executor's sample format (rewards differ inside each group)."""
    task = PatternTask(prompts_per_step=n_groups, group_size=group_size, response_len=4)
    from engines.models import CharTokenizer

    tok = CharTokenizer()
    out = []
    for g, prompt in enumerate(task.prompts(0)):
        for k in range(group_size):
            response = "abab" if k % 2 == 0 else "zzzz"
            out.append(
                {
                    "index": g * group_size + k,
                    "group": g,
                    "prompt": prompt,
                    "prompt_ids": tok.encode(prompt),
                    "output_ids": tok.encode(response),
                    "response": response,
                    "reward": task.reward(prompt, response),
                    "logprobs": [-1.0] * len(response),
                    "weight_version": "0",
                }
            )
    return out


@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    lp = asyncio.new_event_loop()
    yield lp
    lp.close()


def _group(tmp_path: Path, flags: dict[str, Any], workers: int, **kwargs: Any) -> tuple[TrainerGroup, MemorySink]:
    """A trainer group on real Ray actors; its rollout side is the stand-in (these tests are about the trainer)."""
    sink = MemorySink()
    config = LifecycleConfig.from_mapping(flags)
    runner = Runner(config, log=EventLog([sink]))
    bind_rollout_stand_in(runner)
    group = TrainerGroup(config, tmp_path, workers=workers, runner=runner, **kwargs)
    return group, sink


async def _start(group: TrainerGroup) -> None:
    """The trainer started and the (stand-in) rollout side through one generate: where a loop trains."""
    await group.start()
    await generated(group.runner)


def _trainer_moves(sink: MemorySink) -> list[str]:
    return [e["trigger"] for e in sink if e.get("event") == TRANSITION and e["machine"] == "trainer"]


async def _wait_dead(group: TrainerGroup, rank: int) -> None:
    for _ in range(200):  # bounded: a call to a dead actor fails at once
        try:
            await asyncio.wait_for(group.workers[rank].call("pid"), 5.0)
        except WorkerCrashed:
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"worker {rank} still alive")


def _same_params(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.slow  # starts a replacement worker actor (or waits for a dead one): tens of seconds on 2 cores
def test_train_ft_two_workers_replaces_the_crashed_worker_from_its_peer(
    tmp_path: Path, loop: asyncio.AbstractEventLoop
) -> None:
    group, sink = _group(tmp_path, TRAIN_FT, workers=2)

    async def scenario() -> None:
        try:
            await _start(group)
            await group.train(_samples())
            old_actor = group.workers[1].actor
            await group.crash_worker(1)
            await _wait_dead(group, 1)
            stats = await group.train(_samples())  # crashes, heals, retries the step
            assert "loss" in stats
            assert group.state == "Ready" and group.heals == 1
            assert group.workers[1].actor is not old_actor and group.workers[1].rank == 1
            peer = await group.workers[0].call("get_state")
            healed = await group.workers[1].call("get_state")
            assert _same_params(peer["model"], healed["model"])  # bitwise: healed from the peer, then one more step
        finally:
            await group.dispose()

    loop.run_until_complete(scenario())
    moves = _trainer_moves(sink)
    i = moves.index("worker_crashed")
    assert moves[i - 1 : i + 6] == ["train", "worker_crashed", "heal", "healed", "train", "train_done", "dispose"]


@pytest.mark.recovery
@pytest.mark.slow  # starts a replacement worker actor (or waits for a dead one): tens of seconds on 2 cores
def test_train_ft_one_worker_heals_from_the_saved_state(tmp_path: Path, loop: asyncio.AbstractEventLoop) -> None:
    """No peer: the replacement restores the group's last good state -- also before the first step."""
    group, sink = _group(tmp_path, TRAIN_FT, workers=1)

    async def scenario() -> None:
        try:
            await _start(group)
            saved = await group.workers[0].call("get_state")
            await group.crash_worker(0)
            await _wait_dead(group, 0)
            restored: dict[str, Any] = {}
            real_step = group.runner.handlers["trainer.train_step"]

            async def spy_step(cmd: Any) -> Any:
                if group.heals and not restored:  # the retried step: see what the replacement holds first
                    restored.update(await group.workers[0].call("get_state"))
                return await real_step(cmd)

            group.runner.handlers["trainer.train_step"] = spy_step  # the handler the core's command runs
            await group.train(_samples())
            assert group.state == "Ready" and group.heals == 1
            assert _same_params(saved["model"], restored["model"])
        finally:
            await group.dispose()

    loop.run_until_complete(scenario())
    assert "healed" in _trainer_moves(sink)


@pytest.mark.recovery
@pytest.mark.slow  # starts a replacement worker actor (or waits for a dead one): tens of seconds on 2 cores
def test_train_ft_one_worker_without_a_saved_state_cannot_heal(tmp_path: Path, loop: asyncio.AbstractEventLoop) -> None:
    """The check above can fail: drop the saved state and the same crash is not healed."""
    group, _ = _group(tmp_path, TRAIN_FT, workers=1)

    async def scenario() -> None:
        try:
            await _start(group)
            group._last_state = None
            await group.crash_worker(0)
            await _wait_dead(group, 0)
            with pytest.raises(TrainerFailed, match="no peer or saved state"):
                await group.train(_samples())
        finally:
            await group.dispose()

    loop.run_until_complete(scenario())


@pytest.mark.slow  # starts a replacement worker actor (or waits for a dead one): tens of seconds on 2 cores
def test_no_train_ft_fails_naming_worker_and_flag(tmp_path: Path, loop: asyncio.AbstractEventLoop) -> None:
    group, sink = _group(tmp_path, NO_FT, workers=1)

    async def scenario() -> None:
        try:
            await _start(group)
            await group.crash_worker(0)
            await _wait_dead(group, 0)
            with pytest.raises(TrainerFailed) as info:
                await group.train(_samples())
            message = str(info.value)
            assert "worker 0" in message, message
            assert "--use-fault-tolerance --ft-components train" in message, message
            assert group.state == "Failed"
        finally:
            await group.dispose()

    loop.run_until_complete(scenario())
    assert _trainer_moves(sink)[-3:] == ["train", "worker_crashed", "fail"]


@pytest.mark.parametrize(
    ("flags", "recovers"), [(ROLLOUT_FT, True), (TRAIN_FT, False), (NO_FT, False)], ids=["rollout", "train", "none"]
)
@pytest.mark.recovery
@pytest.mark.weight_update
def test_update_weights_recovers_rollout_engines_only_when_the_move_says_so(
    tmp_path: Path, loop: asyncio.AbstractEventLoop, flags: dict[str, Any], recovers: bool
) -> None:
    """With the real rollout manager (one CPU engine process): under rollout FT a dead engine is recovered
    by the trainer's update and then holds the new version (``/model_info``); without it the move carries no
    ``recover_engine`` and the engine's death stops the run, naming the flag."""
    from engines.launcher import launcher_factory
    from rollout.executor import RolloutManager

    sink = MemorySink()
    config = LifecycleConfig.from_mapping({**flags, "engine_restart_backoff": 0.05})
    runner = Runner(config, log=EventLog([sink]))
    group = TrainerGroup(config, tmp_path, workers=1, runner=runner)
    manager = RolloutManager(config, PatternTask(), runner=runner, launcher_factory=launcher_factory("local"))

    async def scenario() -> tuple[bool, str | None, str]:
        try:
            weights = await group.start()
            assert weights is not None
            await manager.init(weights)
            await manager.controller.kill_engine(0)
            try:
                pushed = await group.update_weights(1)
            except EngineFailed as exc:
                return False, None, str(exc)
            client = manager.controller.engines[0].client
            assert client is not None
            return pushed, (await client.model_info()).weight_version, ""
        finally:
            await manager.dispose()
            await group.dispose()

    pushed, version, error = loop.run_until_complete(scenario())
    assert runner.ledger.ever("recover_engine", "trainer") is recovers
    if recovers:
        assert pushed and version == "1"
        engine = [e["trigger"] for e in sink if e.get("event") == TRANSITION and e["instance"] == "engine-0"]
        i = engine.index("recover")
        assert engine[i : i + 5] == ["recover", "restart", "ready", "begin_update", "finish_update"], engine
    else:
        assert "--use-fault-tolerance --ft-components rollout" in error, error
    assert (tmp_path / "weights" / "step-1" / "config.json").is_file() is recovers


@pytest.mark.recovery
@pytest.mark.weight_update
@pytest.mark.slow  # starts a replacement worker actor
@pytest.mark.parametrize(("flags", "heals"), [(TRAIN_FT, True), (NO_FT, False)], ids=["train-ft", "no-ft"])
def test_a_crash_found_by_update_weights_heals_or_fails(
    tmp_path: Path, loop: asyncio.AbstractEventLoop, flags: dict[str, Any], heals: bool
) -> None:
    """The crash surfaces while writing the weights: healed and the move redone, or Failed naming the flag."""
    group, sink = _group(tmp_path, flags, workers=1)

    async def scenario() -> None:
        try:
            await _start(group)
            await group.crash_worker(0)
            await _wait_dead(group, 0)
            if heals:
                assert await group.update_weights(1)
                assert group.state == "Ready" and group.heals == 1
                assert (tmp_path / "weights" / "step-1" / "config.json").is_file()
            else:
                with pytest.raises(TrainerFailed, match="--ft-components train"):
                    await group.update_weights(1)
                assert group.state == "Failed"
        finally:
            await group.dispose()

    loop.run_until_complete(scenario())
    moves = _trainer_moves(sink)
    i = moves.index("worker_crashed")
    want = ["heal", "healed", "update_weights", "update_done"] if heals else ["fail"]
    assert moves[i - 1 : i + 1 + len(want)] == ["update_weights", "worker_crashed", *want], moves


@pytest.mark.slow  # waits out two short bounds and starts a replacement actor
@pytest.mark.parametrize("flags", [TRAIN_FT, NO_FT], ids=["train-ft", "no-ft"])
def test_a_hung_worker_is_a_bounded_wait_then_a_crash(
    flags: dict[str, Any], tmp_path: Path, loop: asyncio.AbstractEventLoop
) -> None:
    """No wait without a bound: a worker that stops answering is a worker crash after ``call_timeout``."""
    group, sink = _group(tmp_path, flags, workers=1, call_timeout=4.0)

    async def scenario() -> tuple[float, BaseException | None]:
        try:
            await _start(group)
            await group.train(_samples())
            hung = group.workers[0]
            hung.hang(600.0)
            t0 = asyncio.get_running_loop().time()
            try:
                await group.train(_samples())
            except TrainerFailed as exc:
                return asyncio.get_running_loop().time() - t0, exc
            assert group.workers[0] is not hung and group.heals == 1 and group.state == "Ready"
            return asyncio.get_running_loop().time() - t0, None
        finally:
            await group.dispose()

    _, error = loop.run_until_complete(scenario())  # returns at all: the 4 s call bound ended the wait
    assert "worker_crashed" in _trainer_moves(sink)
    if flags is NO_FT:
        assert error is not None and "trainer worker 0" in str(error) and "no answer to compute_grads" in str(error)
        assert "--ft-components train" in str(error)
    else:
        assert error is None


def test_the_trainer_starts_from_the_hf_checkpoint_and_keeps_the_last_k(
    tmp_path: Path, loop: asyncio.AbstractEventLoop
) -> None:
    """``initial_checkpoint`` (``--hf-checkpoint``): every worker loads it, so version 0 is that directory's
    weights; each update writes a checkpoint directory and only the newest ``keep_checkpoints`` stay."""
    from engines.models import TinyCausalLM
    from engines.models.checkpoint import checkpoint_steps

    given = TinyCausalLM("tiny", seed=11)
    path = given.save_pretrained(tmp_path / "given")
    group, _ = _group(tmp_path / "run", NO_FT, workers=1, keep_checkpoints=2, initial_checkpoint=path)

    async def scenario() -> dict[str, Any]:
        try:
            weights = await group.start()
            assert weights is not None and weights[1] == "0"
            version0 = TinyCausalLM("tiny", seed=0)
            version0.load_pretrained(weights[0])  # written at start from the workers' weights
            assert all(torch.equal(version0.state_dict()[k], v) for k, v in given.state_dict().items())
            await generated(group.runner)
            for step in (1, 2, 3):
                await group.train(_samples())
                assert await group.update_weights(step)
            return dict(await group.workers[0].call("get_state"))
        finally:
            await group.dispose()

    state = loop.run_until_complete(scenario())
    assert [n for n, _ in checkpoint_steps(tmp_path / "run" / "weights")] == [2, 3]  # step-0 and step-1 pruned
    latest = TinyCausalLM("tiny", seed=0)
    latest.load_pretrained(tmp_path / "run" / "weights" / "step-3")
    assert all(torch.equal(latest.state_dict()[k], v) for k, v in state["model"].items())


def test_a_checkpoint_the_workers_cannot_load_fails_naming_the_file(
    tmp_path: Path, loop: asyncio.AbstractEventLoop
) -> None:
    """Past the CLI's check (an API caller): the worker's own error travels, not Ray's header line."""
    from engines.models import TinyCausalLM

    small = TinyCausalLM("small", seed=0).save_pretrained(tmp_path / "small")
    group, _ = _group(tmp_path / "run", NO_FT, workers=1, initial_checkpoint=small)

    async def scenario() -> str:
        try:
            with pytest.raises(TrainerFailed) as info:
                await group.start()
            return str(info.value)
        finally:
            await group.dispose()

    message = loop.run_until_complete(scenario())
    assert str(small / "model.safetensors") in message and "unexpected tensors" in message, message


@pytest.mark.slow  # two trainer groups of two worker actors each
def test_a_job_checkpoint_keeps_each_workers_generators_and_a_resume_gives_each_its_own(
    tmp_path: Path, loop: asyncio.AbstractEventLoop
) -> None:
    from lifecycle.decide.errors import ConfigError
    from trainer.job_state import load_job_checkpoint

    flags = {**NO_FT, "save": str(tmp_path / "ckpt")}
    group, _ = _group(tmp_path / "a", flags, workers=2, seed=5)

    async def generators(g: TrainerGroup, *, checkpoint: bool) -> list[Any]:
        try:
            await _start(g)
            states = [await w.call("rng_state") for w in g.workers]
            if checkpoint:
                assert await g.checkpoint(1) is not None
            return states
        finally:
            await g.dispose()

    written = loop.run_until_complete(generators(group, checkpoint=True))
    assert not written[0]["torch"].equal(written[1]["torch"])  # each rank draws its own numbers
    resuming = {**flags, "load": str(tmp_path / "ckpt")}
    job = load_job_checkpoint(tmp_path / "ckpt", LifecycleConfig.from_mapping(resuming))
    assert job.ranks == 2
    resumed, _ = _group(tmp_path / "b", resuming, workers=2, seed=99, resume=job)
    restored = loop.run_until_complete(generators(resumed, checkpoint=False))
    for a, b in zip(written, restored, strict=True):  # rank for rank
        assert a["torch"].equal(b["torch"]) and a["python"] == b["python"]
    with pytest.raises(ConfigError, match=r"--trainer-workers: the job checkpoint .* was written by 2 workers"):
        _group(tmp_path / "c", resuming, workers=1, resume=job)
