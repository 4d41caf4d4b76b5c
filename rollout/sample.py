"""One generated sample: what every rollout function returns, the trainer reads and replay files hold.

A ``TypedDict`` rather than a class because samples cross process boundaries (Ray) and files
(replay JSON) as plain dicts; :func:`sample` is the one place that builds one. (No ``from __future__
import annotations`` here: on Python 3.11 it hides ``NotRequired`` from the TypedDict machinery.)
"""

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NotRequired, TypedDict, cast

from lifecycle.decide.errors import LifecycleError


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
    # --fully-async: the oldest committed version any token may come from, and every version it spans
    first_version: NotRequired[int]
    versions: NotRequired[list[int]]


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


class SampleError(LifecycleError, TypeError):
    """A rollout function returned samples the trainer cannot use: names the plug-in, the flag and the fix."""


_FIELDS: dict[str, Any] = {
    "index": int,
    "group": int,
    "prompt": str,
    "prompt_ids": list,
    "output_ids": list,
    "response": str,
    "reward": (int, float),
}


@dataclass(frozen=True)
class SampleProblem:
    """What makes a rollout's samples unusable for the trainer: which sample (None: the list itself), which
    field (None: the sample as a whole) and what. Each reader of samples words it for its own input: a rollout
    function (:func:`checked_samples`), a replay file (``rollout.replay``) -- one check, two messages."""

    sample: int | None
    field: str | None
    detail: str
    missing: tuple[str, ...] = ()  # every required field the sample lacks (``field`` is the first)

    def __str__(self) -> str:
        if self.sample is None:
            return self.detail
        if self.missing:
            return f"sample {self.sample} lacks {', '.join(self.missing)}"
        if self.field is None:
            return f"sample {self.sample} {self.detail}"
        return f"sample {self.sample}: {self.field} {self.detail}"


def sample_problem(samples: object) -> SampleProblem | None:
    """The first reason the trainer cannot use ``samples`` (None: it can): a field missing or of the wrong type,
    ids that are not ints, an empty ``output_ids``, a reward outside [0, 1] (NaN included)."""
    if not isinstance(samples, list) or not samples:
        return SampleProblem(
            None, None, f"returned {type(samples).__name__} {str(samples)[:60]!r}, not a non-empty list of samples"
        )
    for n, s in enumerate(samples):
        if not isinstance(s, dict):
            return SampleProblem(n, None, f"is a {type(s).__name__}, not a dict")
        missing = [k for k in _FIELDS if k not in s]
        if missing:
            return SampleProblem(n, missing[0], "is missing", tuple(missing))
        for key, kind in _FIELDS.items():
            value = s[key]
            if isinstance(value, bool) or not isinstance(value, kind):
                return SampleProblem(n, key, f"is {type(value).__name__} {str(value)[:40]!r}")
        for key in ("prompt_ids", "output_ids"):
            if not all(isinstance(t, int) and not isinstance(t, bool) for t in s[key]):
                return SampleProblem(n, key, "must hold token ids (ints)")
        if not s["output_ids"]:
            return SampleProblem(n, "output_ids", "is empty (nothing to train on)")
        if not 0 <= s["reward"] <= 1:  # no float(): a 400-digit int would overflow; NaN compares False
            return SampleProblem(
                n,
                "reward",
                f"{s['reward']!r} is outside [0, 1] (the loss's baseline and the report need it)",
            )
    return None


def checked_samples(samples: object, rollout_id: int, plugin: str) -> list[Sample]:
    """What a rollout function returned, checked once at the boundary (``plugin`` names it and its flag), so a
    missing field is one error here instead of a ``KeyError`` in a trainer worker."""
    problem = sample_problem(samples)
    if problem is not None:
        fix = "build each sample with rollout.sample.sample(...) (fields: " + ", ".join(_FIELDS) + ")"
        raise SampleError(f"{plugin}: rollout {rollout_id}: {problem}. Fix: {fix}")
    return cast(list[Sample], samples)  # checked field by field above
