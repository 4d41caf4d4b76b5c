"""One async HTTP client for SGLang's lifecycle endpoints: the CPU torch engine and real SGLang servers.

Request bodies are serialised from :mod:`engines.protocol` (SGLang's field names; only the
fields the caller set are sent, so the server's own defaults apply to the rest) and answers are
parsed into it. Every call is bounded (``timeout`` per client, overridable per call) and every
failure is one typed :class:`~engines.errors.EngineError` naming the engine and the endpoint:
:class:`EngineHTTPError` (non-2xx; status and body), :class:`EngineTimeout`,
:class:`EngineUnreachable` (refused, reset, dropped) and :class:`EngineProtocolError` (a 2xx body
that does not match the contract); the transport is :class:`engines.http.HTTPTransport`, shared
with the vLLM client. Free of Ray: an actor wraps it, not the other way round.

An ``aiohttp`` session belongs to one event loop: use one client per loop, and close it
(``async with EngineClient(...)``, or ``await client.close()``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import BaseModel

from engines.errors import EngineHTTPError, EngineProtocolError
from engines.http import HTTPTransport
from engines.http import body_of as _body
from engines.protocol import (
    AbortReq,
    BeginWeightUpdateReqInput,
    ContinueGenerationReqInput,
    ContinueGenerationResponse,
    DestroyWeightsUpdateGroupReqInput,
    EndWeightUpdateReqInput,
    GenerateReqInput,
    GenerateResponse,
    GetWeightsByNameReqInput,
    InitWeightsUpdateGroupReqInput,
    ModelInfo,
    PauseGenerationReqInput,
    PauseGenerationResponse,
    PauseMode,
    ReleaseMemoryOccupationReqInput,
    ResumeMemoryOccupationReqInput,
    SamplingParams,
    ServerInfo,
    SuccessMessageResponse,
    UpdateWeightFromDiskReqInput,
    UpdateWeightsFromDiskResponse,
    UpdateWeightsFromDistributedReqInput,
    UpdateWeightVersionReqInput,
    UpdateWeightVersionResponse,
)

SamplingArg = SamplingParams | Mapping[str, Any]


def _sampling_dict(params: SamplingArg | None) -> dict[str, Any] | None:
    """A SamplingParams sends only the fields set; a plain mapping is sent as is (any SGLang key)."""
    if params is None:
        return None
    if isinstance(params, SamplingParams):
        return params.model_dump(mode="json", exclude_unset=True)
    return dict(params)


class EngineClient(HTTPTransport):
    """Async client of one engine at ``base_url`` (``http://host:port``)."""

    # -- health and info ------------------------------------------------------------------------------
    async def health(self, *, timeout: float | None = None) -> None:
        """GET /health: returns on 200; 503 (starting, released, unhealthy) raises EngineHTTPError."""
        await self._call("GET", "/health", timeout=timeout)

    async def health_generate(self, *, timeout: float | None = None) -> None:
        """GET /health_generate: a real 1-token generation; returns on 200, raises otherwise."""
        await self._call("GET", "/health_generate", timeout=timeout)

    async def server_info(self, *, timeout: float | None = None) -> ServerInfo:
        text = await self._call("GET", "/server_info", timeout=timeout)
        return self._parse("/server_info", ServerInfo, self._json("/server_info", text))

    async def model_info(self, *, timeout: float | None = None) -> ModelInfo:
        text = await self._call("GET", "/model_info", timeout=timeout)
        return self._parse("/model_info", ModelInfo, self._json("/model_info", text))

    # -- generation ----------------------------------------------------------------------------------------
    async def generate(
        self,
        text: str | None = None,
        *,
        input_ids: Sequence[int] | None = None,
        sampling_params: SamplingArg | None = None,
        return_logprob: bool | None = None,
        return_text_in_logprobs: bool | None = None,
        rid: str | None = None,
        timeout: float | None = None,
    ) -> GenerateResponse:
        """POST /generate for one prompt (``text`` or ``input_ids``, exactly one)."""
        if (text is None) == (input_ids is None):
            raise ValueError("generate: pass exactly one of text= or input_ids=")
        fields: dict[str, Any] = {"text": text, "input_ids": None if input_ids is None else list(input_ids)}
        fields |= {"sampling_params": _sampling_dict(sampling_params), "return_logprob": return_logprob}
        fields |= {"return_text_in_logprobs": return_text_in_logprobs, "rid": rid}
        answer = await self.generate_request(
            GenerateReqInput(**{k: v for k, v in fields.items() if v is not None}), timeout=timeout
        )
        if isinstance(answer, list):
            raise EngineProtocolError(self.engine_id, "/generate", "answered a list for a single prompt")
        return answer

    async def generate_batch(
        self,
        texts: Sequence[str] | None = None,
        *,
        input_ids: Sequence[Sequence[int]] | None = None,
        sampling_params: SamplingArg | Sequence[SamplingArg] | None = None,
        return_logprob: bool | None = None,
        return_text_in_logprobs: bool | None = None,
        rids: Sequence[str] | None = None,
        timeout: float | None = None,
    ) -> list[GenerateResponse]:
        """POST /generate for a batch (a list of texts or of token-id lists); one answer per prompt, in order."""
        if (texts is None) == (input_ids is None):
            raise ValueError("generate_batch: pass exactly one of texts= or input_ids=")
        if isinstance(texts, str):
            raise ValueError("generate_batch: texts must be a sequence of strings, not one string")
        prompts = len(texts if texts is not None else input_ids or [])
        if prompts == 0:
            raise ValueError("generate_batch: an empty batch")
        params: Any
        if sampling_params is None or isinstance(sampling_params, SamplingParams | Mapping):
            params = _sampling_dict(sampling_params)
        else:
            params = [_sampling_dict(p) for p in sampling_params]
            if len(params) != prompts:
                raise ValueError(f"generate_batch: {len(params)} sampling_params for {prompts} prompts")
        fields: dict[str, Any] = {
            "text": None if texts is None else list(texts),
            "input_ids": None if input_ids is None else [list(p) for p in input_ids],
            "sampling_params": params,
            "return_logprob": return_logprob,
            "return_text_in_logprobs": return_text_in_logprobs,
            "rid": None if rids is None else list(rids),
        }
        answer = await self.generate_request(
            GenerateReqInput(**{k: v for k, v in fields.items() if v is not None}), timeout=timeout
        )
        if not isinstance(answer, list) or len(answer) != prompts:
            raise EngineProtocolError(self.engine_id, "/generate", f"expected a list of {prompts} answers")
        return answer

    async def generate_request(
        self, request: GenerateReqInput, *, timeout: float | None = None
    ) -> GenerateResponse | list[GenerateResponse]:
        """POST /generate with a prepared body; a list answer for a batch body."""
        text = await self._call("POST", "/generate", body=_body(request), send_body=True, timeout=timeout)
        data = self._json("/generate", text)
        if isinstance(data, list):
            return [self._parse("/generate", GenerateResponse, item) for item in data]
        return self._parse("/generate", GenerateResponse, data)

    async def abort_request(
        self,
        rid: str | None = None,
        *,
        abort_all: bool = False,
        abort_message: str | None = None,
        timeout: float | None = None,
    ) -> None:
        """POST /abort_request: one request by ``rid``, or every one with ``abort_all``."""
        if (rid is None) == (not abort_all):
            raise ValueError("abort_request: pass rid= or abort_all=True (exactly one)")
        fields: dict[str, Any] = {"rid": rid, "abort_message": abort_message, "abort_all": abort_all or None}
        request = AbortReq(**{k: v for k, v in fields.items() if v is not None})
        await self._call("POST", "/abort_request", body=_body(request), send_body=True, timeout=timeout)

    async def pause_generation(
        self, mode: PauseMode = "abort", *, timeout: float | None = None
    ) -> PauseGenerationResponse:
        """POST /pause_generation (``abort``: in-flight requests end with finish_reason abort; ``retract``:
        they are requeued and recomputed on continue; ``in_place``: decoding stops, state kept)."""
        request = PauseGenerationReqInput(mode=mode)
        return await self._post_model("/pause_generation", request, PauseGenerationResponse, timeout)

    async def continue_generation(self, *, timeout: float | None = None) -> ContinueGenerationResponse:
        request = ContinueGenerationReqInput()
        return await self._post_model("/continue_generation", request, ContinueGenerationResponse, timeout)

    # -- weights and memory ------------------------------------------------------------------------------------
    async def flush_cache(self, *, wait: float | None = None, timeout: float | None = None) -> str:
        """POST /flush_cache (``wait``: SGLang's ``?timeout=`` seconds to wait for idle); the server's text."""
        params = None if wait is None else {"timeout": repr(float(wait))}
        return await self._call("POST", "/flush_cache", params=params, timeout=timeout)

    async def update_weights_from_disk(
        self,
        model_path: str,
        *,
        weight_version: str | None = None,
        load_format: str | None = None,
        flush_cache: bool | None = None,
        abort_all_requests: bool | None = None,
        timeout: float | None = None,
    ) -> UpdateWeightsFromDiskResponse:
        """POST /update_weights_from_disk. A refused file is HTTP 400 (``success`` false): EngineHTTPError."""
        fields: dict[str, Any] = {"weight_version": weight_version, "load_format": load_format}
        fields |= {"flush_cache": flush_cache, "abort_all_requests": abort_all_requests}
        request = UpdateWeightFromDiskReqInput(
            model_path=model_path, **{k: v for k, v in fields.items() if v is not None}
        )
        answer = await self._post_model("/update_weights_from_disk", request, UpdateWeightsFromDiskResponse, timeout)
        if not answer.success:
            raise EngineHTTPError(self.engine_id, "/update_weights_from_disk", 200, answer.model_dump_json())
        return answer

    # -- the weight-update group (distributed updates) ------------------------------------------------------
    async def _group_call(self, path: str, request: BaseModel, timeout: float | None) -> SuccessMessageResponse:
        answer = await self._post_model(path, request, SuccessMessageResponse, timeout)
        if not answer.success:
            raise EngineHTTPError(self.engine_id, path, 200, answer.model_dump_json())
        return answer

    async def init_weights_update_group(
        self,
        master_address: str,
        master_port: int,
        rank_offset: int,
        world_size: int,
        *,
        group_name: str = "weight_update_group",
        backend: str = "gloo",
        timeout: float | None = None,
    ) -> SuccessMessageResponse:
        """POST /init_weights_update_group: returns once every member joined (the trainer too)."""
        request = InitWeightsUpdateGroupReqInput(
            master_address=master_address,
            master_port=master_port,
            rank_offset=rank_offset,
            world_size=world_size,
            group_name=group_name,
            backend=backend,
        )
        return await self._group_call("/init_weights_update_group", request, timeout)

    async def update_weights_from_distributed(
        self,
        names: list[str],
        dtypes: list[str],
        shapes: list[list[int]],
        *,
        group_name: str = "weight_update_group",
        weight_version: str | None = None,
        flush_cache: bool | None = None,
        timeout: float | None = None,
    ) -> SuccessMessageResponse:
        """POST /update_weights_from_distributed: one bucket, received while the trainer broadcasts it."""
        extra: dict[str, Any] = {} if flush_cache is None else {"flush_cache": flush_cache}
        request = UpdateWeightsFromDistributedReqInput(
            names=names, dtypes=dtypes, shapes=shapes, group_name=group_name, weight_version=weight_version, **extra
        )
        return await self._group_call("/update_weights_from_distributed", request, timeout)

    async def get_weights_by_name(self, name: str, *, truncate_size: int = 100, timeout: float | None = None) -> Any:
        """POST /get_weights_by_name: the parameter's first ``truncate_size`` rows, as nested lists."""
        body = _body(GetWeightsByNameReqInput(name=name, truncate_size=truncate_size))
        return self._json(
            "/get_weights_by_name",
            await self._call("POST", "/get_weights_by_name", body=body, send_body=True, timeout=timeout),
        )

    async def destroy_weights_update_group(
        self, *, group_name: str = "weight_update_group", timeout: float | None = None
    ) -> SuccessMessageResponse:
        request = DestroyWeightsUpdateGroupReqInput(group_name=group_name)
        return await self._group_call("/destroy_weights_update_group", request, timeout)

    async def update_weight_version(
        self, new_version: str, *, abort_all_requests: bool | None = None, timeout: float | None = None
    ) -> UpdateWeightVersionResponse:
        """POST /update_weight_version (SGLang aborts running requests unless ``abort_all_requests`` is False)."""
        extra = {} if abort_all_requests is None else {"abort_all_requests": abort_all_requests}
        request = UpdateWeightVersionReqInput(new_version=new_version, **extra)
        return await self._post_model("/update_weight_version", request, UpdateWeightVersionResponse, timeout)

    async def begin_weight_update(self, *, timeout: float | None = None) -> Any:
        """POST /begin_weight_update: open the weight-update session (the body SGLang answers is untyped)."""
        text = await self._call(
            "POST", "/begin_weight_update", body=_body(BeginWeightUpdateReqInput()), send_body=True, timeout=timeout
        )
        return self._json("/begin_weight_update", text) if text else None

    async def end_weight_update(self, *, timeout: float | None = None) -> Any:
        """POST /end_weight_update: close the session."""
        text = await self._call(
            "POST", "/end_weight_update", body=_body(EndWeightUpdateReqInput()), send_body=True, timeout=timeout
        )
        return self._json("/end_weight_update", text) if text else None

    async def release_memory_occupation(
        self, tags: Sequence[str] | None = None, *, timeout: float | None = None
    ) -> None:
        """POST /release_memory_occupation (``tags``: ``weights``, ``kv_cache``; None: all)."""
        request = (
            ReleaseMemoryOccupationReqInput() if tags is None else ReleaseMemoryOccupationReqInput(tags=list(tags))
        )
        await self._call("POST", "/release_memory_occupation", body=_body(request), send_body=True, timeout=timeout)

    async def resume_memory_occupation(
        self, tags: Sequence[str] | None = None, *, timeout: float | None = None
    ) -> None:
        """POST /resume_memory_occupation (``tags``: ``weights``, ``kv_cache``; None: all released)."""
        request = ResumeMemoryOccupationReqInput() if tags is None else ResumeMemoryOccupationReqInput(tags=list(tags))
        await self._call("POST", "/resume_memory_occupation", body=_body(request), send_body=True, timeout=timeout)

    def __repr__(self) -> str:
        return f"EngineClient({self.base_url!r}, engine_id={self.engine_id!r})"
