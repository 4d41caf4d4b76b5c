"""The torch policy (the CPU engine's own model family) and the RL loss.

GRPO-style group baseline: each sample's advantage is its reward minus the mean reward of its
group (the samples drawn from the same prompt), divided by the group's standard deviation. The
loss is REINFORCE on the tokens the engines sampled, with log-probabilities recomputed by the
trainer (``CausalLM.token_logprobs``, same temperature as sampling). Either model family: the
padding id is the model's tokenizer's.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import Tensor

from engines.models import PAD_ID, CausalLM


def advantages(samples: Sequence[Mapping[str, Any]], *, eps: float = 1e-6) -> list[float]:
    """Group-normalised advantages (GRPO): (r - mean_group) / (std_group + eps)."""
    groups: dict[Any, list[float]] = defaultdict(list)
    for s in samples:
        groups[s["group"]].append(float(s["reward"]))
    stats = {}
    for g, rewards in groups.items():
        mean = sum(rewards) / len(rewards)
        var = sum((r - mean) ** 2 for r in rewards) / len(rewards)
        stats[g] = (mean, var**0.5)
    return [(float(s["reward"]) - stats[s["group"]][0]) / (stats[s["group"]][1] + eps) for s in samples]


def batch_tensors(samples: Sequence[Mapping[str, Any]], *, pad_id: int = PAD_ID) -> tuple[Tensor, Tensor]:
    """Right-padded ``[batch, seq]`` ids and a ``[batch, seq - 1]`` mask of the response tokens (causal: the
    padding after a sequence changes none of its logprobs)."""
    seqs = [list(s["prompt_ids"]) + list(s["output_ids"]) for s in samples]
    width = max(len(x) for x in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), width - 1))
    for i, (s, seq) in enumerate(zip(samples, seqs, strict=True)):
        ids[i, : len(seq)] = torch.tensor(seq)
        start = len(s["prompt_ids"]) - 1  # logprob index t predicts token t + 1
        mask[i, start : start + len(s["output_ids"])] = 1.0
    return ids, mask


def grpo_loss(
    model: CausalLM, samples: Sequence[Mapping[str, Any]], *, temperature: float = 1.0
) -> tuple[Tensor, dict[str, float]]:
    """The policy-gradient loss of one batch and a few diagnostics."""
    ids, mask = batch_tensors(samples, pad_id=model.tokenizer.pad_id)
    adv = torch.tensor(advantages(samples))
    logprobs = model.token_logprobs(ids, temperature=temperature)
    per_sample = (logprobs * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)
    loss = -(adv * per_sample).mean()
    stats = {"loss": float(loss.detach()), "logprob": float(per_sample.detach().mean())}
    engine_lps = [lp for s in samples for lp in s.get("logprobs", ())]
    if engine_lps:  # trainer/engine mismatch: the same tokens, the same weights, should agree closely
        trainer_lps = logprobs.detach()[mask.bool()]
        if trainer_lps.numel() == len(engine_lps):
            stats["logprob_diff"] = float((trainer_lps - torch.tensor(engine_lps)).abs().mean())
    return loss, stats
