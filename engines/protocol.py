"""The project's own pydantic models of SGLang 0.5.23's HTTP bodies (lifecycle endpoints only).

One set of models serves both sides: :class:`engines.client.EngineClient` serialises requests
from them and parses answers into them, and the CPU torch engine parses requests with them, so
the CPU engine and a real SGLang server cannot drift apart silently. Request models carry SGLang's
schema names (``GenerateReqInput``, ``UpdateWeightFromDiskReqInput``...) and, for every field
modelled, SGLang's exact name, JSON type and default (checked against the OpenAPI schema in
``tests/engines/test_protocol_contract.py``). Only a subset of optional fields is modelled;
unknown fields are ignored, as SGLang's dataclass parsing ignores them.

Response models are read from SGLang's source (``response_from_source`` in the contracts) and
allow extra fields, because a real server sends more than the CPU engine does.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

# Memory-occupation tags (SGLang's GPU_MEMORY_TYPE_*). ``cuda_graph`` is accepted by the CPU engine
# as a no-op so that a miles-style tag list works unchanged.
TAG_WEIGHTS = "weights"
TAG_KV_CACHE = "kv_cache"
TAG_CUDA_GRAPH = "cuda_graph"
MEMORY_TAGS: tuple[str, ...] = (TAG_WEIGHTS, TAG_KV_CACHE, TAG_CUDA_GRAPH)

PauseMode = Literal["abort", "retract", "in_place"]
PAUSE_MODES: tuple[str, ...] = ("abort", "retract", "in_place")


class _Request(BaseModel):
    """A request body: unknown fields are ignored, as SGLang does."""

    model_config = ConfigDict(extra="ignore")


class _Response(BaseModel):
    """A response body: a real server sends more fields than we model; keep them."""

    model_config = ConfigDict(extra="allow", protected_namespaces=())


# --------------------------------------------------------------------------------------------
# Requests (names = SGLang's component schemas)
# --------------------------------------------------------------------------------------------


class GenerateReqInput(_Request):
    """POST /generate. Exactly one of ``text`` / ``input_ids``; a list of either makes a batch.

    ``input_ids`` is untyped in SGLang's schema (a custom validator); its real type is modelled.
    """

    text: str | list[str] | None = None
    input_ids: list[int] | list[list[int]] | None = None
    sampling_params: list[dict[str, Any]] | dict[str, Any] | None = None
    return_logprob: list[bool] | bool | None = None
    return_text_in_logprobs: bool = False
    stream: bool = False
    rid: str | list[str] | None = None


class UpdateWeightFromDiskReqInput(_Request):
    """POST /update_weights_from_disk."""

    model_path: str
    load_format: str | None = None
    abort_all_requests: bool = False
    weight_version: str | None = None
    flush_cache: bool = True


class InitWeightsUpdateGroupReqInput(_Request):
    """POST /init_weights_update_group: join the trainer's weight-update group at ``rank_offset``."""

    master_address: str
    master_port: int
    rank_offset: int
    world_size: int
    group_name: str = "weight_update_group"
    backend: str = "nccl"


class UpdateWeightsFromDistributedReqInput(_Request):
    """POST /update_weights_from_distributed: receive one bucket (these tensors, in this order) by broadcast."""

    names: list[str]
    dtypes: list[str]
    shapes: list[list[int]]
    group_name: str = "weight_update_group"
    flush_cache: bool = True
    abort_all_requests: bool = False
    weight_version: str | None = None


class GetWeightsByNameReqInput(_Request):
    """POST /get_weights_by_name: one parameter's values (its first ``truncate_size`` rows), for checks."""

    name: str
    truncate_size: int = 100


class DestroyWeightsUpdateGroupReqInput(_Request):
    """POST /destroy_weights_update_group."""

    group_name: str = "weight_update_group"


class BeginWeightUpdateReqInput(_Request):
    """POST /begin_weight_update: opens the server's weight-update session (SGLang 0.5.23)."""

    http_worker_ipc: str | None = None
    rid: str | None = None
    selector: Literal["target", "draft", "all"] = "all"


class EndWeightUpdateReqInput(_Request):
    """POST /end_weight_update: closes the session (finalises what was loaded in it)."""

    http_worker_ipc: str | None = None
    rid: str | None = None


class UpdateWeightVersionReqInput(_Request):
    """POST /update_weight_version (``abort_all_requests`` defaults to true here, unlike above)."""

    new_version: str
    abort_all_requests: bool = True


class ReleaseMemoryOccupationReqInput(_Request):
    """GET|POST /release_memory_occupation; ``tags`` None means every tag."""

    tags: list[str] | None = None


class ResumeMemoryOccupationReqInput(_Request):
    """GET|POST /resume_memory_occupation; ``tags`` None means every tag."""

    tags: list[str] | None = None


class PauseGenerationReqInput(_Request):
    """POST /pause_generation."""

    mode: PauseMode = "abort"


class ContinueGenerationReqInput(_Request):
    """POST /continue_generation (``torch_empty_cache`` is a no-op on CPU)."""

    torch_empty_cache: bool = True


class AbortReq(_Request):
    """POST /abort_request: ``rid`` aborts one request, ``abort_all`` every one."""

    rid: str | None = None
    abort_all: bool = False
    abort_message: str | None = None


# --------------------------------------------------------------------------------------------
# Sampling parameters (not a schema in the spec: ``sampling_params`` is a free object there)
# --------------------------------------------------------------------------------------------


class SamplingParams(BaseModel):
    """The sampling parameters the CPU engine implements, with SGLang's names and defaults.

    Strict (``max_new_tokens: 8.0`` is refused, as SGLang's contract gate refuses it) and closed:
    a key not listed here is refused by the CPU engine. The client sends only the fields set, so
    a real server applies its own defaults to the rest.
    """

    model_config = ConfigDict(extra="forbid", strict=True)

    max_new_tokens: int = 128
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_new_tokens: int = 0
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    no_stop_trim: bool = False
    sampling_seed: int | None = None
    n: int = 1
    # Accepted only at their neutral value (so clients that always send them keep working).
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    repetition_penalty: float = 1.0
    min_p: float = 0.0


# Sampling keys SGLang knows but the CPU engine does not implement (refused with a clearer message).
SGLANG_ONLY_SAMPLING_KEYS: frozenset[str] = frozenset(
    {"json_schema", "regex", "ebnf", "structural_tag", "custom_params", "stream_interval", "logit_bias", "stop_regex"}
)


# --------------------------------------------------------------------------------------------
# Responses
# --------------------------------------------------------------------------------------------


class FinishReason(_Response):
    """``{"type": "length", "length": N}`` | ``{"type": "stop", "matched": id|str}`` | ``{"type": "abort", ...}``."""

    type: Literal["length", "stop", "abort"]
    length: int | None = None
    matched: int | str | list[int] | None = None
    message: str | None = None
    status_code: int | None = None
    err_type: str | None = None


class GenerateMetaInfo(_Response):
    id: str
    finish_reason: FinishReason | None
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = 0
    weight_version: str | None = None
    e2e_latency: float | None = None
    num_retractions: int = 0
    # [[logprob, token_id, text | None], ...], present when return_logprob was set
    output_token_logprobs: list[tuple[float, int, str | None]] | None = None


class GenerateResponse(_Response):
    """One /generate answer (a batch request answers a list of these)."""

    text: str
    output_ids: list[int]
    meta_info: GenerateMetaInfo


class ModelInfo(_Response):
    """GET /model_info."""

    model_path: str
    tokenizer_path: str | None = None
    is_generation: bool = True
    preferred_sampling_params: Any = None
    weight_version: str | None = None
    load_format: str | None = None
    served_model_name: str | None = None
    model_type: str | None = None
    architectures: list[str] | None = None
    has_image_understanding: bool = False
    has_audio_understanding: bool = False


class EngineMemory(BaseModel):
    """What the CPU engine holds, in bytes (``internal_states[0]`` of its /server_info)."""

    weights_bytes: int
    kv_cache_bytes: int
    rss_bytes: int
    weights_resident: bool
    kv_cache_resident: bool


class ServerInfo(_Response):
    """GET /server_info: resolved server args plus ``internal_states`` (one per DP rank)."""

    version: str | None = None
    weight_version: str | None = None
    startup_time: float | None = None  # when the server process started (time.time()): which process answers
    internal_states: list[dict[str, Any]] = Field(default_factory=list)

    def engine_memory(self) -> EngineMemory | None:
        """The CPU engine's exact byte counts; None for a server that does not report them (SGLang)."""
        if not self.internal_states or "weights_bytes" not in self.internal_states[0]:
            return None
        return EngineMemory.model_validate(self.internal_states[0], strict=False)


class UpdateWeightsFromDiskResponse(_Response):
    """200 (or 400 with ``success`` false)."""

    success: bool
    message: str
    num_paused_requests: int = 0


class SuccessMessageResponse(_Response):
    """200 ``{success: true, message}`` / 400 with ``success`` false: the weight-update group's three endpoints."""

    success: bool
    message: str


class UpdateWeightVersionResponse(_Response):
    success: bool
    message: str
    new_version: str | None = None


class PauseGenerationResponse(_Response):
    message: str
    status: str


class ContinueGenerationResponse(_Response):
    message: str
    status: str


# --------------------------------------------------------------------------------------------
# Error bodies (SGLang's, per the contracts README)
# --------------------------------------------------------------------------------------------


class ValidationErrorBody(_Response):
    """400 from request-schema validation (the spec says 422; SGLang answers 400 with this)."""

    object: Literal["error"] = "error"
    message: str
    type: Literal["Bad Request"] = "Bad Request"
    param: None = None
    code: Literal[400] = 400


class GateErrorBody(_Response):
    """400 from /generate's contract gate: unknown sampling keys or wrong JSON types."""

    error: str


class ErrorMessage(BaseModel):
    message: str


class MessageErrorBody(_Response):
    """400/503 ``{"error": {"message": ...}}`` from a handler that failed."""

    error: ErrorMessage


class UnauthorizedBody(_Response):
    error: Literal["Unauthorized"] = "Unauthorized"
