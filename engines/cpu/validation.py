"""What the engine refuses, and how: SGLang's error bodies and its sampling-parameter checks.

Two gates, as in SGLang: the contract gate (unknown keys, wrong JSON types) answers
``{"error": text}``; the range checks made while validating a request answer
``{"error": {"message": text}}``. A client can tell them apart as it can against SGLang.
"""

from __future__ import annotations

import math
from typing import Any, Literal

from pydantic import ValidationError

from engines.protocol import SGLANG_ONLY_SAMPLING_KEYS, SamplingParams

ErrorKind = Literal["validation", "gate", "message"]


class EngineRequestError(Exception):
    """A request the engine refuses; ``kind`` selects SGLang's error body for it.

    * ``validation``: the body failed schema parsing -> ``{"object": "error", "message", ...}``
    * ``gate``: /generate's contract gate (unknown sampling key, wrong JSON type) -> ``{"error": text}``
    * ``message``: the handler refused or failed -> ``{"error": {"message": text}}``
    """

    def __init__(self, status: int, message: str, kind: ErrorKind = "message") -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.kind = kind

    def body(self) -> object:
        if self.kind == "validation":
            return {"object": "error", "message": self.message, "type": "Bad Request", "param": None, "code": 400}
        if self.kind == "gate":
            return {"error": self.message}
        return {"error": {"message": self.message}}


def gate_sampling_params(raw: dict[str, Any] | None) -> SamplingParams:
    """SGLang's contract gate: unknown keys and wrong JSON types are refused (400 ``{"error": text}``).

    ``null`` values mean "the default". Keys SGLang knows but this engine does not implement get a
    message saying so, rather than "unknown".
    """
    values = {k: v for k, v in (raw or {}).items() if v is not None}
    for key in values:
        if key in SGLANG_ONLY_SAMPLING_KEYS:
            raise EngineRequestError(
                400,
                f"sampling_params.{key} is an SGLang sampling parameter the CPU torch engine does not implement",
                "gate",
            )
        if key not in SamplingParams.model_fields:
            raise EngineRequestError(400, f"unknown field {shown(key)} in sampling_params", "gate")
    try:
        return SamplingParams.model_validate(values)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise EngineRequestError(
            400, f"sampling_params.{where}: {first['msg']} (got {shown(first.get('input'))})", "gate"
        ) from None


# Bounds on what one request may ask of the scheduler every client shares (one event loop, one token per
# step for each running request): a stop list is scanned at every token, so its size is bounded too.
MAX_STOP_STRINGS = 64
MAX_STOP_CHARS = 1024  # per stop string
MAX_STOP_TOKEN_IDS = 1024
INT64 = 1 << 63
SEED_RANGE = (-INT64, (1 << 64) - 1)  # what torch.Generator.manual_seed accepts
SHOWN_CHARS = 60


def shown(value: object) -> str:
    """``repr(value)``, cut short: an error echoes what it refuses, never megabytes of it."""
    text = repr(value)
    return text if len(text) <= SHOWN_CHARS else f"{text[: SHOWN_CHARS - 3]}... ({len(text)} characters)"


def check_sampling_values(
    p: SamplingParams, vocab_size: int, *, prompt_tokens: int = 0, context_length: int | None = None
) -> None:
    """Every range check of one request's sampling parameters, made before it is queued (400
    ``{"error": {"message"}}``): what passes here the scheduler can compute, so a request cannot fail at
    sampling time -- where a failure would cost its batch-mates and other clients their requests."""
    problems = []
    t = p.temperature
    if not math.isfinite(t) or t < 0:
        problems.append(f"temperature must be a finite number >= 0, got {shown(t)}")
    if not 0 < p.top_p <= 1:  # NaN fails every comparison
        problems.append(f"top_p must be in (0, 1], got {shown(p.top_p)}")
    if not (p.top_k == -1 or 1 <= p.top_k < INT64):
        problems.append(f"top_k must be -1 (disabled) or in [1, 2**63), got {shown(p.top_k)}")
    if p.max_new_tokens < 0:
        problems.append(f"max_new_tokens must be >= 0, got {shown(p.max_new_tokens)}")
    elif context_length is not None and prompt_tokens + p.max_new_tokens > context_length:
        problems.append(
            f"Requested token count exceeds the model's maximum context length of {context_length} tokens: "
            f"{prompt_tokens} prompt tokens + max_new_tokens {shown(p.max_new_tokens)}"
        )
    if not 0 <= p.min_new_tokens <= max(p.max_new_tokens, 0):
        problems.append(f"min_new_tokens must be in [0, max_new_tokens], got {shown(p.min_new_tokens)}")
    if p.n != 1:
        problems.append(f"n must be 1 on the CPU torch engine (send a batch instead), got {shown(p.n)}")
    for name, neutral in (("frequency_penalty", 0.0), ("presence_penalty", 0.0), ("repetition_penalty", 1.0)):
        if getattr(p, name) != neutral:  # NaN is refused too: it equals nothing
            problems.append(f"{name} is not implemented by the CPU torch engine (only {neutral} is accepted)")
    if p.min_p != 0.0:
        problems.append("min_p is not implemented by the CPU torch engine (only 0.0 is accepted)")
    if p.sampling_seed is not None and not SEED_RANGE[0] <= p.sampling_seed <= SEED_RANGE[1]:
        problems.append(f"sampling_seed must fit in 64 bits ([-2**63, 2**64)), got {shown(p.sampling_seed)}")
    stops = [p.stop] if isinstance(p.stop, str) else list(p.stop or ())
    if len(stops) > MAX_STOP_STRINGS:
        problems.append(f"stop holds {len(stops)} strings; at most {MAX_STOP_STRINGS} are accepted")
    longest = max((len(s) for s in stops), default=0)
    if longest > MAX_STOP_CHARS:
        problems.append(f"a stop string of {longest} characters; at most {MAX_STOP_CHARS} are accepted")
    stop_ids = p.stop_token_ids or []
    if len(stop_ids) > MAX_STOP_TOKEN_IDS:
        problems.append(f"stop_token_ids holds {len(stop_ids)} ids; at most {MAX_STOP_TOKEN_IDS} are accepted")
    else:
        bad_ids = [t for t in stop_ids if not 0 <= t < vocab_size]
        if bad_ids:
            problems.append(f"stop_token_ids {shown(bad_ids[:5])} are outside the vocabulary [0, {vocab_size})")
    if problems:
        raise EngineRequestError(400, "; ".join(problems))
