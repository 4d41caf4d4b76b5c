"""Your own RL loop, task and trainer, with rl-lifecycle running only the engines' lifecycle.

``lifecycle run`` is the project's loop with its own task and GRPO trainer. A team that already has a
reward and a torch trainer wants only the part that is easy to get wrong: engines that start, serve,
take each weight update, die and come back, in an order the lifecycle core decides and checks. This
script brings a task (reverse "abc:" -> "cba"), a trainer (a Hugging Face Llama, AdamW, REINFORCE with a
group-mean baseline) and the loop; the project contributes the run's assembly, :class:`trainer.app.Job` (the
rollout manager, the trainer group, their lifecycle core) and the verbs the loop calls on it.

Run it from the repository root (Ray puts the driver's working directory on its workers' ``sys.path``,
which is how a trainer worker imports ``examples.embed_reverse:ReverseBackend``)::

    python -m examples.embed_reverse --steps 30 --run-dir runs/reverse
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import shutil
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import transformers
from safetensors.torch import load_file

from engines.models import build_tiny_llama
from lifecycle import LifecycleConfig
from lifecycle.decide.events import bind_context
from trainer import BackendSpec
from trainer.app import Job, RunOptions


@dataclass(frozen=True)
class ReverseTask:
    """``rollout.task.Task``: answer ``"abc:"`` with ``"cba"``; prompts depend only on (seed, rollout id)."""

    alphabet: str = "abcd"
    length: int = 3
    prompts_per_step: int = 8
    group_size: int = 8
    temperature: float = 1.0
    seed: int = 0
    name: str = "reverse"

    def prompts(self, rollout_id: int) -> list[str]:
        rng = random.Random(self.seed * 1_000_003 + rollout_id)
        return ["".join(rng.sample(self.alphabet, self.length)) + ":" for _ in range(self.prompts_per_step)]

    def reward(self, prompt: str, response: str) -> float:
        """Half for the prompt's letters (each used once, in any order), half for the reversal, position by position."""
        target = prompt.removesuffix(":")[::-1]
        text = response[: len(target)]
        own = sum((Counter(text) & Counter(target)).values()) / len(target)
        matched = sum(a == b for a, b in zip(text, target, strict=False)) / len(target)
        return 0.5 * own + 0.5 * matched

    def sampling_params(self, rollout_id: int, index: int) -> dict[str, Any]:
        seed = (self.seed * 1_000_003 + rollout_id) * 4096 + index  # every sample reproducible
        return dict(max_new_tokens=self.length, temperature=self.temperature, ignore_eos=True, sampling_seed=seed)

    def eval_params(self) -> dict[str, Any]:
        return {"max_new_tokens": self.length, "temperature": 0.0, "ignore_eos": True}


class ReverseBackend:
    """``trainer.backend.TrainerBackend``: what each trainer worker (a Ray actor) runs, built there by
    ``ReverseBackend(rank=rank, **BackendSpec.kwargs)``."""

    def __init__(self, *, rank: int = 0, checkpoint: str, lr: float = 1e-2, temperature: float = 1.0) -> None:
        self.rank, self.checkpoint, self.temperature = rank, Path(checkpoint), temperature
        self.model = transformers.AutoModelForCausalLM.from_pretrained(checkpoint, local_files_only=True)
        self.optim = torch.optim.AdamW(self.model.parameters(), lr=lr)
        self.pad_id = int(self.model.config.pad_token_id or 0)
        self._offloaded: dict[str, Any] | None = None

    def loss(self, samples: Sequence[Mapping[str, Any]]) -> tuple[torch.Tensor, dict[str, float]]:
        """REINFORCE on the response tokens; the baseline is the mean reward of the sample's group."""
        seqs = [list(s["prompt_ids"]) + list(s["output_ids"]) for s in samples]
        ids = torch.full((len(seqs), max(map(len, seqs))), self.pad_id)
        mask = torch.zeros(ids.shape[0], ids.shape[1] - 1)  # position t predicts token t + 1
        for i, (s, seq) in enumerate(zip(samples, seqs, strict=True)):
            ids[i, : len(seq)] = torch.tensor(seq)
            mask[i, len(s["prompt_ids"]) - 1 : len(seq) - 1] = 1.0
        logits = self.model(input_ids=ids).logits[:, :-1].float() / self.temperature
        logprobs = torch.log_softmax(logits, -1).gather(-1, ids[:, 1:, None]).squeeze(-1)
        groups: dict[int, list[float]] = {}
        for s in samples:
            groups.setdefault(s["group"], []).append(float(s["reward"]))
        adv = torch.tensor([s["reward"] - sum(groups[s["group"]]) / len(groups[s["group"]]) for s in samples])
        loss = -(adv[:, None] * logprobs * mask).sum() / mask.sum()
        engine = torch.tensor([lp for s in samples for lp in s.get("logprobs", ())])
        gap = (logprobs.detach()[mask.bool()] - engine).abs().mean() if engine.numel() == mask.sum() else 0.0
        return loss, {"loss": float(loss.detach()), "logprob_gap": float(gap)}  # gap: trainer vs engine

    def compute_grads(self, samples: Sequence[Mapping[str, Any]]) -> tuple[dict[str, Any], dict[str, float]]:
        self.optim.zero_grad(set_to_none=True)
        loss, stats = self.loss(samples)
        loss.backward()  # type: ignore[no-untyped-call]
        return {n: p.grad.clone() for n, p in self.model.named_parameters() if p.grad is not None}, stats

    def apply_grads(self, grads: Mapping[str, Any]) -> None:
        for name, param in self.model.named_parameters():
            param.grad = grads.get(name)
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.optim.step()

    def save_checkpoint(self, directory: str) -> str:
        """A directory the engines load (``/update_weights_from_disk``): written aside, then renamed into place."""
        final = Path(directory)
        staged = final.with_name(f".{final.name}.tmp-{os.getpid()}")  # a leftover the group's pruning removes
        shutil.rmtree(staged, ignore_errors=True)
        self.model.save_pretrained(staged)
        for tokenizer_file in self.checkpoint.glob("*token*"):  # engines tokenize with the checkpoint's tokenizer
            shutil.copy2(tokenizer_file, staged / tokenizer_file.name)
        shutil.rmtree(final, ignore_errors=True)  # a step written again (a healed trainer retried it)
        staged.rename(final)
        return str(final)

    def load_checkpoint(self, directory: str) -> None:
        self.model.load_state_dict(load_file(str(Path(directory) / "model.safetensors")))

    def get_state(self) -> dict[str, Any]:
        return {"model": self.model.state_dict(), "optim": self.optim.state_dict()}

    def set_state(self, state: Mapping[str, Any]) -> None:
        self.model.load_state_dict(state["model"])
        self.optim.load_state_dict(state["optim"])

    def offload(self) -> None:  # --offload-train: a GPU trainer moves its weights to host memory
        self._offloaded = self.model.state_dict()  # the tensors themselves, kept aside
        for param in self.model.parameters():
            param.data = torch.empty(0)

    def onload(self) -> None:
        for name, param in self.model.named_parameters():
            param.data = (self._offloaded or {}).get(name, param.data)
        self._offloaded = None


async def main(
    steps: int = 30,
    run_dir: str | Path = "runs/reverse",
    *,
    seed: int = 0,
    lr: float = 1e-2,
    task: ReverseTask | None = None,
    kill_engine_at: int | None = None,
) -> list[float]:
    """Train for ``steps``; the mean reward of each step. ``kill_engine_at``: SIGKILL engine 1 before that step."""
    run_dir = Path(run_dir)
    task = task or ReverseTask(seed=seed)
    checkpoint = build_tiny_llama(run_dir / "model", seed=seed)  # version 0: a random-init Llama, no hub
    config = LifecycleConfig.from_mapping(
        {"use_fault_tolerance": True, "ft_components": ["rollout"], "rollout_num_gpus": 2}
    )
    backend = BackendSpec(
        "examples.embed_reverse:ReverseBackend",
        {"checkpoint": str(checkpoint), "lr": lr, "temperature": task.temperature},
    )
    rewards: list[float] = []
    # the project's part: Ray, the lifecycle core, the trainer group running ReverseBackend, the rollout manager
    # (CPU engines started from the checkpoint), the live invariant monitor, run_dir/events.jsonl -- and their
    # disposal (engines, then trainer), however this block ends
    options = RunOptions(seed=seed)
    async with Job(
        config, task, run_dir=run_dir, backend=backend, initial_checkpoint=checkpoint, options=options
    ) as job:
        for step in range(steps):
            with bind_context(step=step):  # the step's events carry it
                if step == kill_engine_at:
                    await job.manager.controller.kill_engine(1)  # a real death; recovered by the next generate
                samples = await job.generate(step)
                stats = await job.train(samples)  # offload (a no-op this config does not allow), then train
                await job.update_weights(step + 1)  # onload, push to every engine, onload KV
            rewards.append(sum(s["reward"] for s in samples) / len(samples))
            states = " ".join(job.manager.controller.states().values())
            print(
                f"step {step:>3}  reward {rewards[-1]:.3f}  loss {stats.get('loss', 0.0):+.4f}  "
                f"logprob gap {stats.get('logprob_gap', 0.0):.1e}  "
                f"e.g. {samples[0]['prompt']}{samples[0]['response']!r}  engines [{states}]",
                flush=True,
            )
    return rewards


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        prog="python -m examples.embed_reverse",
        description="Train a tiny Llama to reverse strings with your own task, trainer and loop, the engines' "
        "lifecycle run by rl-lifecycle (2 CPU engines behind the SMG gateway where installed, rollout FT on). "
        "Run from the repository root.",
    )
    parser.add_argument("--steps", type=int, default=30, help="training steps (default: %(default)s)")
    parser.add_argument(
        "--run-dir",
        type=Path,
        default=Path("runs/reverse"),
        help="model, weights/step-N, events.jsonl go here (default: %(default)s)",
    )
    parser.add_argument("--seed", type=int, default=0, help="model, prompts and sampling seed (default: %(default)s)")
    parser.add_argument("--kill-engine-at", type=int, metavar="STEP", help="SIGKILL engine 1 before STEP")
    args = parser.parse_args()
    if not Path("examples/embed_reverse.py").is_file():  # Ray's workers import the trainer from the working dir
        parser.error("run it from the repository root (the trainer workers import examples.embed_reverse from there)")
    rewards = asyncio.run(main(args.steps, args.run_dir, seed=args.seed, kill_engine_at=args.kill_engine_at))
    if rewards:
        print(f"reward {rewards[0]:.3f} -> {rewards[-1]:.3f}; events in {args.run_dir / 'events.jsonl'}")
