"""Sampling one next token, with the logprob a trainer can recompute."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor

GREEDY_BELOW = 1e-6  # SGLang's sampling epsilon: below it a request is sampled greedily


def sample_token(
    logits: Tensor,
    *,
    temperature: float,
    top_p: float = 1.0,
    top_k: int = -1,
    generator: torch.Generator | None = None,
    banned: Sequence[int] = (),
) -> tuple[int, float]:
    """Pick the next token; returns ``(token_id, logprob)``.

    A ``temperature`` below ``GREEDY_BELOW`` (0 included) is greedy, as in SGLang: ``logits / 1e-300`` would
    overflow to NaN. The logprob is of the chosen token under ``softmax(logits / T)``
    (``softmax(logits)`` when greedy), before top-k/top-p/banning -- SGLang's default reporting, so
    a trainer can recompute it with :meth:`TinyCausalLM.token_logprobs`.
    """
    logits = logits.float()
    greedy = temperature < GREEDY_BELOW
    scaled = logits if greedy else logits / temperature
    logprobs = torch.log_softmax(scaled, dim=-1)
    work = scaled.clone()
    if banned:
        work[list(banned)] = -math.inf
    if greedy:
        token = int(torch.argmax(work))
        return token, float(logprobs[token])
    if 0 < top_k < work.numel():
        kth = torch.topk(work, top_k).values[-1]
        work[work < kth] = -math.inf
    probs = torch.softmax(work, dim=-1)
    if top_p < 1.0:
        sorted_probs, order = torch.sort(probs, descending=True)
        before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs
        sorted_probs[before >= top_p] = 0.0  # keep the smallest prefix whose mass reaches top_p
        probs = torch.zeros_like(probs).scatter(0, order, sorted_probs)
    token = int(torch.multinomial(probs, 1, generator=generator))
    return token, float(logprobs[token])
