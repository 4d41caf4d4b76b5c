"""The project's pydantic models of vLLM 0.32.0's HTTP bodies: the endpoints :class:`VLLMClient` calls.

vLLM's OpenAPI document types the request bodies but not one response (every 200 is ``{}`` there), so the
response models are read from recorded answers of a real server (``tests/engines/vllm/contract-0.32.0.json``,
written by ``scripts/record_vllm_contract.py``) and hold only the fields we use; they allow extra fields,
because vLLM adds some in every release. The request models carry vLLM's field names; the contract test
checks each against the recorded OpenAPI schema, because ``CompletionRequest`` accepts unknown keys (a
misspelled sampling field would otherwise be dropped silently, with only a warning in the server's log).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

# /pause?mode=: abort (in-flight requests end with finish_reason "abort", HTTP 200), wait (the call returns
# once they have finished), keep (they are frozen and continue on /resume). New requests are held, not
# refused, until /resume in every mode.
VLLMPauseMode = Literal["abort", "wait", "keep"]
VLLM_PAUSE_MODES: tuple[str, ...] = ("abort", "wait", "keep")
WeightCheckerAction = Literal["checksum", "reset", "compare"]
# vllm.v1.engine.FINISH_REASON_STRINGS; a reason added by a new release fails the contract test.
VLLMFinishReason = Literal["stop", "length", "abort", "error", "repetition"]


class _Request(BaseModel):
    """A request body; the client sends only the fields set (``exclude_unset``), so vLLM's defaults apply."""

    model_config = ConfigDict(extra="forbid")


class _Response(BaseModel):
    """A response body: a real server sends more fields than we use; keep them."""

    model_config = ConfigDict(extra="allow", protected_namespaces=())


# --------------------------------------------------------------------------------------------
# Requests (JSON bodies; /pause, /sleep take query parameters instead)
# --------------------------------------------------------------------------------------------


class CompletionRequest(_Request):
    """POST /v1/completions: a batch of prompts (token-id lists, or strings), one parameter set for all."""

    model: str
    prompt: list[list[int]] | list[int] | list[str] | str
    max_tokens: int | None = None
    min_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool | None = None
    skip_special_tokens: bool | None = None
    spaces_between_special_tokens: bool | None = None
    include_stop_str_in_output: bool | None = None
    n: int | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    repetition_penalty: float | None = None
    logprobs: int | None = None  # 0: the sampled token's logprob only
    return_token_ids: bool | None = None
    request_id: str | None = None


class AbortRequestsRequest(_Request):
    """POST /abort_requests: no ids (or an empty list) aborts every request in flight. The body must be a
    JSON object (no body: 400 "Invalid JSON format"); the OpenAPI document does not declare it."""

    request_ids: list[str] | None = None


class UpdateWeightsRequest(_Request):
    update_info: dict[str, Any] | list[dict[str, Any]]


class FinishWeightUpdateRequest(_Request):
    weight_version: str | None = None


class UpdateWeightVersionRequest(_Request):
    new_version: str


class InitWeightTransferRequest(_Request):
    init_info: dict[str, Any]


class WeightCheckerRequest(_Request):
    action: WeightCheckerAction
    baseline: dict[str, str] | None = None


# --------------------------------------------------------------------------------------------
# Responses
# --------------------------------------------------------------------------------------------


class VersionResponse(_Response):
    version: str


class ModelCard(_Response):
    id: str
    max_model_len: int | None = None


class ModelList(_Response):
    data: list[ModelCard]


class CompletionLogprobs(_Response):
    token_logprobs: list[float | None]


class CompletionChoice(_Response):
    index: int
    text: str
    finish_reason: VLLMFinishReason | None
    stop_reason: int | str | None = None  # the stop token id or string; None for EOS and length
    logprobs: CompletionLogprobs | None = None
    token_ids: list[int] | None = None  # with return_token_ids
    prompt_token_ids: list[int] | None = None  # with return_token_ids


class CompletionUsage(_Response):
    prompt_tokens: int
    completion_tokens: int | None = None


class CompletionResponse(_Response):
    id: str
    model: str
    choices: list[CompletionChoice]
    usage: CompletionUsage | None = None


class StatusResponse(_Response):
    """``{"status": "paused"|"resumed"|"sleeping"|"awake"|"reset"|...}`` and endpoint-specific extras."""

    status: str


class AbortResponse(StatusResponse):
    aborted: int


class SleepResponse(StatusResponse):
    level: int


class WakeUpResponse(StatusResponse):
    tags: list[str] | None = None


class IsPausedResponse(_Response):
    is_paused: bool


class IsSleepingResponse(_Response):
    is_sleeping: bool


class MessageResponse(_Response):
    """The weight-transfer session's answers: ``{"message": "Weight update started"}`` and the like."""

    message: str


class WeightInfo(_Response):
    weight_version: str


class UpdateWeightVersionResponse(_Response):
    success: bool
    new_version: str


class WeightChecksums(_Response):
    """``action: checksum``: parameter name -> sha256 of its bytes."""

    checksums: dict[str, str]


class WeightComparison(_Response):
    """``action: compare`` against a baseline of checksums."""

    match: bool
    mismatches: list[str]


# --------------------------------------------------------------------------------------------
# Error bodies
# --------------------------------------------------------------------------------------------


class ErrorDetail(_Response):
    message: str
    type: str
    param: str | None = None
    code: int


class ErrorBody(_Response):
    """Every non-2xx answer we provoked: ``{"error": {"message", "type", "param", "code"}}``. Request
    validation is 400 (not FastAPI's 422) with ``param`` naming the field (``body.new_version``,
    ``query.mode``); a failure inside the worker is 500 ``InternalServerError`` quoting the worker's error.
    /pause answers a refused mode change as ``{"error": "<text>"}`` (a plain string; read from its source)."""

    error: ErrorDetail | str


# --------------------------------------------------------------------------------------------
# Every endpoint the client calls (the contract test fails on one without a recording)
# --------------------------------------------------------------------------------------------

WEIGHT_CHECKER_ANSWERS: dict[str, type[BaseModel]] = {
    "checksum": WeightChecksums,
    "compare": WeightComparison,
    "reset": StatusResponse,
}

# path -> (HTTP method, the 2xx answer's model; None: an empty body). /weight_checker's depends on the action.
ENDPOINTS: dict[str, tuple[str, type[BaseModel] | None]] = {
    "/health": ("GET", None),
    "/version": ("GET", VersionResponse),
    "/v1/models": ("GET", ModelList),
    "/v1/completions": ("POST", CompletionResponse),
    "/pause": ("POST", StatusResponse),
    "/resume": ("POST", StatusResponse),
    "/is_paused": ("GET", IsPausedResponse),
    "/abort_requests": ("POST", AbortResponse),
    "/init_weight_transfer_engine": ("POST", MessageResponse),
    "/shutdown_weight_transfer_engine": ("POST", MessageResponse),
    "/start_weight_update": ("POST", MessageResponse),
    "/update_weights": ("POST", MessageResponse),
    "/finish_weight_update": ("POST", MessageResponse),
    "/update_weight_version": ("POST", UpdateWeightVersionResponse),
    "/weight_info": ("GET", WeightInfo),
    "/weight_checker": ("POST", WeightChecksums),
    "/sleep": ("POST", SleepResponse),
    "/wake_up": ("POST", WakeUpResponse),
    "/is_sleeping": ("GET", IsSleepingResponse),
}


def response_model(path: str, request: Any = None) -> type[BaseModel] | None:
    """The model a 2xx answer of ``path`` parses into (KeyError: an endpoint the client does not call)."""
    if path == "/weight_checker" and isinstance(request, dict):
        return WEIGHT_CHECKER_ANSWERS[str(request.get("action"))]
    return ENDPOINTS[path][1]
