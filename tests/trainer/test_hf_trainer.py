"""The trainer group training a Hugging Face model (the tiny Llama) on a real Ray actor.

The workers are built as the initial checkpoint's architecture; what they write is a directory
``transformers`` loads; a replacement worker takes a peer's state; offload/onload restore exactly.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from lifecycle.decide.config import LifecycleConfig
from lifecycle.decide.events import EventLog, MemorySink
from lifecycle.decide.runner import Runner

pytest.importorskip("ray")
torch = pytest.importorskip("torch")
pytest.importorskip("transformers", reason="the hf extra is not installed: pip install 'rl-lifecycle[hf]'")

from engines.models import build_tiny_llama, load_causal_lm, load_tokenizer  # noqa: E402
from rollout.pattern import PatternTask  # noqa: E402
from trainer.group import TrainerGroup  # noqa: E402
from trainer.grpo import grpo_backend  # noqa: E402
from trainer.workers import WorkerHandle  # noqa: E402

from .conftest import bind_rollout_stand_in, generated  # noqa: E402

pytestmark = pytest.mark.usefixtures("ray_cluster")


@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    lp = asyncio.new_event_loop()
    yield lp
    lp.close()


def _samples(directory: Path) -> list[dict[str, Any]]:
    """A GRPO batch tokenized by the checkpoint's own tokenizer (BPE: prompts of unequal token length)."""
    tok = load_tokenizer(directory)
    task = PatternTask(prompts_per_step=2, group_size=2, response_len=4)
    out = []
    for g, prompt in enumerate(["qwer:", "abab:"]):
        for k, response in enumerate(("abab", "zzzz")):
            out.append(
                {
                    "index": g * 2 + k,
                    "group": g,
                    "prompt": prompt,
                    "prompt_ids": tok.encode(prompt),
                    "output_ids": tok.encode(response)[1:],  # no BOS inside a response
                    "response": response,
                    "reward": task.reward(prompt, response),
                    "weight_version": "0",
                }
            )
    assert len({len(s["prompt_ids"]) for s in out}) == 2  # the batch really pads
    return out


def _same(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_the_trainer_trains_a_hf_model_and_writes_directories_transformers_loads(
    tmp_path: Path, loop: asyncio.AbstractEventLoop
) -> None:
    from transformers import AutoModelForCausalLM

    given = build_tiny_llama(tmp_path / "model", seed=0)
    config = LifecycleConfig.from_mapping(
        {"use_fault_tolerance": True, "ft_components": ["train"], "rollout_num_gpus": 1}
    )
    runner = Runner(config, log=EventLog([MemorySink()]))
    bind_rollout_stand_in(runner)
    backend = grpo_backend(lr=1e-2, checkpoint=str(given))
    group = TrainerGroup(config, tmp_path / "run", workers=1, runner=runner, initial_checkpoint=given, backend=backend)

    async def scenario() -> dict[str, Any]:
        out: dict[str, Any] = {}
        try:
            out["weights"] = await group.start()
            await generated(runner)
            out["stats"] = [await group.train(_samples(given)) for _ in range(3)]
            assert await group.update_weights(1)
            worker = group.workers[0]
            out["state"] = await worker.call("get_state")
            await worker.call("offload")
            await worker.call("onload")
            out["onloaded"] = await worker.call("get_state")
            replacement = WorkerHandle(1, group.backend)  # as the group heals: same args, a peer's state
            try:
                await replacement.call("set_state", out["state"])
                out["healed"] = await replacement.call("get_state")
            finally:
                replacement.kill()
        finally:
            await group.dispose()
        return out

    out = loop.run_until_complete(scenario())
    path, version = out["weights"]
    assert version == "0"
    step0, step1 = Path(path), tmp_path / "run" / "weights" / "step-1"
    ids = torch.tensor([load_tokenizer(given).encode("qwer:abab")])
    with torch.no_grad():
        logits = [
            AutoModelForCausalLM.from_pretrained(d, local_files_only=True)(ids).logits for d in (given, step0, step1)
        ]
        assert torch.equal(logits[0], logits[1])  # version 0 is the given directory's weights
        assert not torch.equal(logits[1], logits[2])  # trained
        assert torch.allclose(load_causal_lm(step1).forward(ids), logits[2])
    losses = [s["loss"] for s in out["stats"]]
    assert len(set(losses)) == 3, losses
    from trainer.policy import batch_tensors

    samples = _samples(given)
    batch, mask = batch_tensors(samples, pad_id=load_tokenizer(given).pad_id)
    with torch.no_grad():
        before, after = ((load_causal_lm(d).token_logprobs(batch) * mask).sum(-1) for d in (given, step1))
    rewarded = torch.tensor([s["response"] == "abab" for s in samples])
    assert bool((after - before)[rewarded].min() > 0) and bool((after - before)[~rewarded].max() < 0)
    assert _same(out["onloaded"]["model"], out["state"]["model"])
    assert _same(out["healed"]["model"], out["state"]["model"])
    assert next(iter(out["state"]["model"])).startswith("net.model.")  # the HF architecture, not the char model


def test_the_train_only_producer_samples_a_hf_policy_with_prompts_of_unequal_length(tmp_path: Path) -> None:
    """Plain train-only's data source on the tiny Llama: its BPE gives prompts of different token lengths
    (sampled per length, no padding); the logprobs are the trainer's own on the same tokens."""
    from rollout.policy_source import PolicyRolloutFn
    from rollout.task import SourcedTask
    from trainer.policy import batch_tensors

    class Prompts:
        def prompts(self, rollout_id: int) -> list[str]:
            return ["qwer:", "abcd:", "wewe:"]  # "we" is one of the tokenizer's merges

    given = build_tiny_llama(tmp_path / "model", seed=0)
    pattern = PatternTask(seed=0, group_size=4)
    task = SourcedTask(pattern, Prompts())
    producer = PolicyRolloutFn(task)
    producer.load(str(given), "0")
    samples = asyncio.run(producer(1, None))  # type: ignore[arg-type]
    assert samples == asyncio.run(producer(1, None))  # type: ignore[arg-type]
    tok = load_tokenizer(given)
    assert [s["prompt_ids"] for s in samples] == [tok.encode(s["prompt"]) for s in samples]
    assert len({len(s["prompt_ids"]) for s in samples}) > 1  # the case that needs handling
    assert all(len(s["output_ids"]) == pattern.response_len for s in samples)
    assert all(s["response"] == tok.decode(s["output_ids"]) for s in samples)
    ids, mask = batch_tensors(samples, pad_id=tok.pad_id)
    model = load_causal_lm(given)
    with torch.no_grad():
        trainer_lps = model.token_logprobs(ids, temperature=task.temperature)[mask.bool()]
    assert torch.allclose(trainer_lps, torch.tensor([lp for s in samples for lp in s["logprobs"]]), atol=1e-4)
