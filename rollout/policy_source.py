"""The train-only data producer: samples drawn from the trainer's own policy, on CPU, no engines.

Under plain ``--debug-train-only`` (no ``--load-debug-rollout-data``) the rollout function *is*
constructed -- it is the data source -- but no server starts, so the default
:class:`~rollout.executor.EngineRolloutFn` has nothing to route to. This producer fills that
role without engines: it holds a local copy of the policy (the CPU engine's model family), loads
the trainer's latest checkpoint (the loop hands it over after each step: ``load(path, version)``)
and samples the task's prompts in-process, so training stays on-policy and the reward can rise.

Why the policy and not fixed "SFT" samples of the target pattern: the trainer's loss is GRPO
(group baseline), which learns nothing from groups of identical rewards, and a fixed data set
would make the reported reward a property of the data rather than of the policy.
"""

from __future__ import annotations

import asyncio

import torch

from engines.models import CausalLM, new_causal_lm
from engines.models.checkpoint import checkpoint_config
from rollout.controller import ControllerError, InferenceController
from rollout.sample import Sample, sample
from rollout.task import Task, checked_reward


class PolicyRolloutFn:
    """``rollout_fn(rollout_id, controller)`` that samples a local policy copy; ``controller`` is unused."""

    def __init__(self, task: Task) -> None:
        self.task = task
        self.model: CausalLM | None = None
        self.version: str | None = None
        self._arch: tuple[object, object] | None = None  # (model_type, model_size) of the model held

    def load(self, path: str, version: str) -> None:
        """Adopt the trainer's checkpoint directory, any family (a checked load: a wrong directory names itself).
        The architecture comes from the directory once; later versions of it are weights only."""
        config = checkpoint_config(path)
        arch = (config.get("model_type"), config.get("model_size"))
        model = self.model
        if model is None or arch != self._arch:
            model = new_causal_lm(path)
        model.load_pretrained(path)
        self.model, self._arch = model, arch
        self.version = version

    async def __call__(self, rollout_id: int, controller: InferenceController) -> list[Sample]:
        del controller  # no engines: that is the point of this producer
        if self.model is None:
            raise ControllerError(f"rollout {rollout_id}: the train-only producer has no policy weights yet")
        return await asyncio.to_thread(self._sample, rollout_id)

    @torch.no_grad()
    def _sample(self, rollout_id: int) -> list[Sample]:
        """Ancestral sampling at the task's temperature, batched per prompt length (a BPE tokenizer gives prompts
        of unequal length; batching equal ones needs no padding); seeded per rollout (deterministic runs)."""
        model = self.model
        assert model is not None
        task = self.task
        tokenizer = model.tokenizer
        prompts = [p for p in task.prompts(rollout_id) for _ in range(task.group_size)]
        prompt_ids = [tokenizer.encode(p) for p in prompts]
        first = task.sampling_params(rollout_id, 0)
        generator = torch.Generator().manual_seed(int(first.get("sampling_seed", rollout_id)))
        steps = int(first["max_new_tokens"])
        out: list[list[int]] = [[] for _ in prompts]
        lps: list[list[float]] = [[] for _ in prompts]
        for width in sorted({len(p) for p in prompt_ids}):
            rows = [i for i, p in enumerate(prompt_ids) if len(p) == width]
            ids = torch.tensor([prompt_ids[i] for i in rows], dtype=torch.long)
            logprobs: list[torch.Tensor] = []
            for _ in range(steps):
                logits = model.forward(ids)[:, -1].float()
                if task.temperature > 0:
                    logits = logits / task.temperature
                lp = torch.log_softmax(logits, dim=-1)
                token = torch.multinomial(lp.exp(), 1, generator=generator)
                logprobs.append(lp.gather(-1, token).squeeze(-1))
                ids = torch.cat([ids, token], dim=1)
            for row, oids, slp in zip(
                rows, ids[:, width:].tolist(), torch.stack(logprobs, dim=1).tolist(), strict=True
            ):
                out[row], lps[row] = oids, slp
        samples = []
        for index, (prompt, pids, oids, slp) in enumerate(zip(prompts, prompt_ids, out, lps, strict=True)):
            response = tokenizer.decode(oids)
            samples.append(
                sample(
                    index=index,
                    group=index // task.group_size,
                    prompt=prompt,
                    prompt_ids=pids,
                    output_ids=oids,
                    response=response,
                    reward=checked_reward(task, prompt, response),
                    logprobs=slp,
                    weight_version=self.version,
                    engine="policy",
                )
            )
        return samples
