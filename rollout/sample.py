"""One generated sample: what every rollout function returns, the trainer reads and replay files hold.

A ``TypedDict`` rather than a class because samples cross process boundaries (Ray) and files
(replay JSON) as plain dicts; :func:`sample` is the one place that builds one. (No ``from __future__
import annotations`` here: on Python 3.11 it hides ``NotRequired`` from the TypedDict machinery.)
"""

from collections.abc import Sequence
from typing import NotRequired, TypedDict


class Sample(TypedDict):
    index: int  # position in the rollout (requests are answered out of order)
    group: int  # GRPO group: the samples of one prompt share a baseline
    prompt: str
    prompt_ids: list[int]
    output_ids: list[int]
    response: str
    reward: float
    # the sampler's log-probabilities of output_ids (empty for greedy eval answers); the next two say which
    # weights (the engine's /model_info version) and who (an engine id, "policy" for the train-only producer).
    # Not required: replay files of older runs may lack them, and the trainer does not need them.
    logprobs: NotRequired[list[float]]
    weight_version: NotRequired[str | None]
    engine: NotRequired[str]


def sample(
    *,
    index: int,
    group: int,
    prompt: str,
    prompt_ids: Sequence[int],
    output_ids: Sequence[int],
    response: str,
    reward: float,
    weight_version: str | None,
    engine: str,
    logprobs: Sequence[float] = (),
) -> Sample:
    return {
        "index": index,
        "group": group,
        "prompt": prompt,
        "prompt_ids": list(prompt_ids),
        "output_ids": list(output_ids),
        "response": response,
        "reward": float(reward),
        "logprobs": [float(x) for x in logprobs],
        "weight_version": weight_version,
        "engine": engine,
    }
