"""The torch policy (the CPU engine's own model family) and the RL loss.

GRPO-style group baseline: each sample's advantage is its reward minus the mean reward of its
group (the samples drawn from the same prompt), divided by the group's standard deviation. The
loss is REINFORCE on the tokens the engines sampled, with log-probabilities recomputed by the
trainer (``CausalLM.token_logprobs``, same temperature as sampling). Either model family: the
padding id is the model's tokenizer's.

Off-policy correction (:class:`TIS`, ``--use-tis``): a sample may come from engines holding older weights
than the trainer's (streaming RL), or from the same weights computed differently (the engine's kernels). Per
response token ``t`` of sample ``i``, with ``l`` the trainer's logprob of the sampled token (differentiable),
``l_old`` the same value detached (the trainer's weights before this step's update: one gradient step per
batch) and ``l_eng`` the engine's logprob (the sample's ``logprobs``)::

    w_t  = clamp(exp(clamp(l_old - l_eng, -20, 20)), tis_clip_low, tis_clip)      # detached: a constant
    loss = -mean_i( A_i * mean_t(w_t * l_t) )

-- slime's ``--use-tis`` (truncated importance sampling), with its ``--tis-clip`` / ``--tis-clip-low``. ``w`` is
detached: it reweights each token's policy gradient and is not itself optimised. Without TIS ``w_t = 1``; with
TIS on on-policy samples (the engine's logprobs equal the trainer's) ``w_t = 1`` exactly and the loss is the
same. There is no PPO ratio to clip: the trainer takes one gradient step per batch, so ``pi/pi_old`` is 1 where
the gradient is taken. The inner clamp keeps ``exp`` finite. The step's stats (columns of ``metrics.jsonl``)
say how far off-policy the batch was: ``tis_mean_ratio``, the mean of ``exp(clamp(l_old - l_eng))`` before
truncation, and ``tis_clipped_fraction``, the share of response tokens whose weight the truncation changed.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from engines.models import PAD_ID, CausalLM
from trainer.backend import BackendError

LOG_RATIO_BOUND = 20.0  # exp(20) ~ 5e8: a ratio that large is truncated anyway, and its mean stays finite
TIS_FIX = (
    "generate with the engines' logprobs (the project's rollout asks for them; a rollout function builds each "
    "sample with rollout.sample.sample(..., logprobs=[one float per output token, from the engine's "
    "output_token_logprobs])), or turn the correction off (--no-use-tis; RunOptions.use_tis=False; "
    "grpo_backend(use_tis=False))"
)


@dataclass(frozen=True)
class TIS:
    """Truncated importance sampling: each token's policy gradient weighted by the trainer/engine probability
    ratio, truncated to ``[clip_low, clip]`` (slime's ``--tis-clip-low`` / ``--tis-clip``)."""

    clip: float  # the defaults are the run options' (trainer.grpo.TIS_CLIP, TIS_CLIP_LOW)
    clip_low: float


class LogprobsError(BackendError):
    """``--use-tis`` on a sample whose engine logprobs are missing or do not match its tokens (names the sample,
    the option and the fix). A :class:`~trainer.backend.BackendError`: a worker passes it to the driver as it is,
    never as a crashed worker to heal."""


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


def engine_logprobs(samples: Sequence[Mapping[str, Any]], mask: Tensor) -> Tensor:
    """The engines' logprobs laid out as :func:`batch_tensors`' ``mask`` (0 outside the response), each sample's
    checked: one finite float per output token, or one :class:`LogprobsError` naming the sample and the fix."""
    out = torch.zeros_like(mask)
    for i, s in enumerate(samples):
        lps, n = s.get("logprobs"), len(s["output_ids"])
        where = f"sample {s.get('index', i)} (group {s.get('group')!r}, weight version {s.get('weight_version')!r})"
        if not lps:
            raise LogprobsError(
                f"--use-tis: {where} carries no engine logprobs, and the truncated importance ratio needs them "
                f"(exp(trainer logprob - engine logprob) per token). Fix: {TIS_FIX}"
            )
        if not isinstance(lps, list | tuple) or len(lps) != n:
            count = len(lps) if isinstance(lps, list | tuple) else type(lps).__name__
            raise LogprobsError(
                f"--use-tis: {where} has {count} engine logprobs for {n} output tokens; the ratio is per token. "
                f"Fix: {TIS_FIX}"
            )
        bad = [x for x in lps if isinstance(x, bool) or not isinstance(x, int | float) or not math.isfinite(x)]
        if bad:
            raise LogprobsError(
                f"--use-tis: {where} has an engine logprob that is not a finite number ({bad[0]!r}). Fix: {TIS_FIX}"
            )
        start = len(s["prompt_ids"]) - 1
        out[i, start : start + n] = torch.tensor([float(x) for x in lps])
    return out


def truncated(ratio: Tensor, tis: TIS) -> Tensor:
    """The importance ratio truncated to ``[tis.clip_low, tis.clip]``: the weight of each token's gradient."""
    return ratio.clamp(min=tis.clip_low, max=tis.clip)


def grpo_loss(
    model: CausalLM, samples: Sequence[Mapping[str, Any]], *, temperature: float = 1.0, tis: TIS | None = None
) -> tuple[Tensor, dict[str, float]]:
    """The policy-gradient loss of one batch and a few diagnostics; ``tis``: the off-policy correction of the
    module docstring, and its two stats."""
    ids, mask = batch_tensors(samples, pad_id=model.tokenizer.pad_id)
    adv = torch.tensor(advantages(samples))
    engine = None if tis is None else engine_logprobs(samples, mask)  # checked before the forward pass
    logprobs = model.token_logprobs(ids, temperature=temperature)
    stats: dict[str, float] = {}
    terms = logprobs
    if tis is not None and engine is not None:
        log_ratio = ((logprobs.detach() - engine) * mask).clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND)
        ratio = torch.exp(log_ratio)
        weights = truncated(ratio, tis)
        terms = weights * logprobs
        tokens = mask.bool()
        stats["tis_mean_ratio"] = float(ratio[tokens].mean())
        stats["tis_clipped_fraction"] = float((weights != ratio)[tokens].float().mean())
    per_sample = (terms * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)
    loss = -(adv * per_sample).mean()
    mean_logprob = (logprobs.detach() * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)
    stats = {"loss": float(loss.detach()), "logprob": float(mean_logprob.mean()), **stats}
    # trainer/engine mismatch: the same tokens, the same weights, should agree closely
    engine_lps = [lp for s in samples for lp in s.get("logprobs") or ()]
    if engine_lps and all(isinstance(x, int | float) for x in engine_lps):
        trainer_lps = logprobs.detach()[mask.bool()]
        if trainer_lps.numel() == len(engine_lps):
            stats["logprob_diff"] = float((trainer_lps - torch.tensor(engine_lps)).abs().mean())
    return loss, stats
