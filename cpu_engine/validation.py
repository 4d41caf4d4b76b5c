"""What the engine refuses, and how: SGLang's error bodies and its sampling-parameter checks.

Two gates, as in SGLang: the contract gate (unknown keys, wrong JSON types) answers
``{"error": text}``; the range checks made while validating a request answer
``{"error": {"message": text}}``. A client can tell them apart as it can against SGLang.
"""

from __future__ import annotations

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
            raise EngineRequestError(400, f"unknown field {key!r} in sampling_params", "gate")
    try:
        return SamplingParams.model_validate(values)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise EngineRequestError(
            400, f"sampling_params.{where}: {first['msg']} (got {first.get('input')!r})", "gate"
        ) from None


def check_sampling_values(p: SamplingParams, vocab_size: int) -> None:
    """Range checks SGLang makes while validating a request (400 ``{"error": {"message"}}``)."""
    problems = []
    if p.temperature < 0:
        problems.append(f"temperature must be >= 0, got {p.temperature}")
    if not 0 < p.top_p <= 1:
        problems.append(f"top_p must be in (0, 1], got {p.top_p}")
    if p.top_k != -1 and p.top_k < 1:
        problems.append(f"top_k must be -1 (disabled) or >= 1, got {p.top_k}")
    if p.max_new_tokens < 0:
        problems.append(f"max_new_tokens must be >= 0, got {p.max_new_tokens}")
    if not 0 <= p.min_new_tokens <= max(p.max_new_tokens, 0):
        problems.append(f"min_new_tokens must be in [0, max_new_tokens], got {p.min_new_tokens}")
    if p.n != 1:
        problems.append(f"n must be 1 on the CPU torch engine (send a batch instead), got {p.n}")
    for name, neutral in (("frequency_penalty", 0.0), ("presence_penalty", 0.0), ("repetition_penalty", 1.0)):
        if getattr(p, name) != neutral:
            problems.append(f"{name} is not implemented by the CPU torch engine (only {neutral} is accepted)")
    if p.min_p != 0.0:
        problems.append("min_p is not implemented by the CPU torch engine (only 0.0 is accepted)")
    bad_ids = [t for t in p.stop_token_ids or [] if not 0 <= t < vocab_size]
    if bad_ids:
        problems.append(f"stop_token_ids {bad_ids} are outside the vocabulary [0, {vocab_size})")
    if problems:
        raise EngineRequestError(400, "; ".join(problems))
