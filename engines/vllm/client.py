"""One async HTTP client for a real vLLM server (``VLLM_SERVER_DEV_MODE=1``): generation and the RL control API.

It shares :class:`engines.http.HTTPTransport` with the SGLang client, so every failure is the same typed
:class:`~engines.errors.EngineError` (HTTP status and body, timeout, unreachable, a 2xx body that does not
match :mod:`engines.vllm.protocol`). Endpoint by endpoint it is vLLM's API; :meth:`VLLMClient.generate_batch`
and :meth:`VLLMClient.generate` additionally answer in SGLang's shape (:class:`engines.protocol.GenerateResponse`)
so that the rollout's routing and executor use a vLLM engine exactly as an SGLang one:

* SGLang sampling keys are translated (``max_new_tokens`` -> ``max_tokens``, ``min_new_tokens`` ->
  ``min_tokens``, ``sampling_seed`` -> ``seed``, ``no_stop_trim`` -> ``include_stop_str_in_output``; the
  rest share names); SGLang's default of 128 new tokens is sent when none is given (vLLM's is 16), and an
  unknown key is a ValueError (vLLM would ignore it silently).
* ``/v1/completions`` takes one parameter set per request, so prompts are grouped by identical parameters,
  one request per group, concurrently. A per-prompt ``sampling_seed`` therefore means one request per prompt
  (one seed for a whole batch would give every prompt the same random stream).
* Per prompt: ``output_ids`` = ``token_ids`` (a matched stop token included, as in SGLang), ``text``,
  ``meta_info.output_token_logprobs`` = ``(logprob, token_id, None)`` triples, ``prompt_tokens`` =
  ``len(prompt_token_ids)`` (vLLM adds the BOS token to a text prompt), ``finish_reason`` =
  ``{"type": "length", "length": n}`` / ``{"type": "stop", "matched": stop_reason or the last token}`` /
  ``{"type": "abort"}``; ``repetition`` reads as a stop, ``error`` (vLLM's retryable failure) raises.
* ``weight_version``: vLLM does not report it per request; it is ``/weight_info``'s version read before
  and after the batch when both agree (an update finished in between leaves it None).

An ``aiohttp`` session belongs to one event loop: one client per loop, closed after use.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from engines.errors import EngineError, EngineProtocolError
from engines.http import HTTPTransport, M, body_of
from engines.protocol import FinishReason, GenerateMetaInfo, GenerateResponse, SamplingParams
from engines.vllm.protocol import (
    AbortRequestsRequest,
    AbortResponse,
    CompletionChoice,
    CompletionRequest,
    CompletionResponse,
    FinishWeightUpdateRequest,
    InitWeightTransferRequest,
    IsPausedResponse,
    IsSleepingResponse,
    MessageResponse,
    ModelList,
    SleepResponse,
    StatusResponse,
    UpdateWeightsRequest,
    UpdateWeightVersionRequest,
    UpdateWeightVersionResponse,
    VersionResponse,
    VLLMPauseMode,
    WakeUpResponse,
    WeightCheckerAction,
    WeightCheckerRequest,
    WeightChecksums,
    WeightComparison,
    WeightInfo,
)

SamplingArg = SamplingParams | Mapping[str, Any]
METRICS = "/metrics"
# the Prometheus series of vLLM's scheduler, per engine core (summed over its labels): reported by the engine core
# at every step it takes, so they freeze while it is wedged (--disable-log-stats turns them off: not passed)
_SERIES = {
    "vllm:num_requests_running": "running",
    "vllm:num_requests_waiting": "waiting",
    "vllm:prompt_tokens_total": "prompt_tokens",
    "vllm:generation_tokens_total": "generation_tokens",
}


@dataclass(frozen=True)
class EngineProgress:
    """What the engine core last reported: requests it runs and holds, and the tokens it has processed so far."""

    running: float = 0.0
    waiting: float = 0.0
    prompt_tokens: float = 0.0
    generation_tokens: float = 0.0

    @property
    def tokens(self) -> float:
        """Every token prefilled or generated: grows at every step a working engine takes with requests."""
        return self.prompt_tokens + self.generation_tokens


def parse_progress(text: str) -> EngineProgress:
    """The scheduler's series in a /metrics answer (a missing one reads 0: an engine that exports none is
    caught by the probe's own generation)."""
    values = dict.fromkeys(_SERIES.values(), 0.0)
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        field = _SERIES.get(line.split("{", 1)[0].split(" ", 1)[0])
        if field is None:
            continue
        try:
            values[field] += float(line.rsplit(" ", 1)[1])
        except (IndexError, ValueError):
            continue
    return EngineProgress(**values)


COMPLETIONS = "/v1/completions"
SGLANG_DEFAULT_MAX_NEW_TOKENS = 128  # SGLang's default when a request names none; vLLM's would be 16
# SGLang sampling key -> vLLM CompletionRequest field (the contract test checks the right-hand names).
SAMPLING_KEYS: dict[str, str] = {
    "max_new_tokens": "max_tokens",
    "min_new_tokens": "min_tokens",
    "sampling_seed": "seed",
    "no_stop_trim": "include_stop_str_in_output",
    **{
        k: k
        for k in (
            "temperature",
            "top_p",
            "top_k",
            "min_p",
            "stop",
            "stop_token_ids",
            "ignore_eos",
            "skip_special_tokens",
            "spaces_between_special_tokens",
            "n",
            "frequency_penalty",
            "presence_penalty",
            "repetition_penalty",
        )
    },
}


def vllm_sampling(params: SamplingArg | None) -> dict[str, Any]:
    """SGLang sampling params as vLLM CompletionRequest fields; raises ValueError for a key we cannot send."""
    given = (
        {}
        if params is None
        else params.model_dump(mode="json", exclude_unset=True)
        if isinstance(params, SamplingParams)
        else dict(params)
    )
    unknown = sorted(set(given) - set(SAMPLING_KEYS))
    if unknown:
        raise ValueError(f"sampling params {unknown} have no vLLM equivalent here (known: {sorted(SAMPLING_KEYS)})")
    if given.get("n", 1) != 1:
        raise ValueError(f"sampling params: n={given['n']!r}; one sample per prompt only (repeat the prompt)")
    out = {SAMPLING_KEYS[k]: v for k, v in given.items() if k != "n"}
    out.setdefault("max_tokens", SGLANG_DEFAULT_MAX_NEW_TOKENS)
    return out


def _finish_reason(choice: CompletionChoice, output_ids: list[int]) -> FinishReason | None:
    reason = choice.finish_reason
    if reason is None:
        return None
    if reason == "length":
        return FinishReason(type="length", length=len(output_ids))
    if reason == "abort":
        return FinishReason(type="abort")
    matched = choice.stop_reason if choice.stop_reason is not None else (output_ids[-1] if output_ids else None)
    return FinishReason(type="stop", matched=matched)


class VLLMClient(HTTPTransport):
    """Async client of one vLLM server at ``base_url``; the served model id is read once from /v1/models."""

    keep_alive = False  # see HTTPTransport.keep_alive: vLLM drops the connection after a 500

    def __init__(
        self,
        base_url: str,
        *,
        engine_id: str,
        api_key: str | None = None,
        timeout: float = 30.0,
        versioned: bool = True,
    ) -> None:
        """``versioned=False``: a gateway in front of several servers, which has no ``/weight_info`` -- answers
        carry no weight version (the routing knows which version its routable engines serve)."""
        super().__init__(base_url, engine_id=engine_id, api_key=api_key, timeout=timeout)
        self._model: str | None = None
        self.versioned = versioned

    async def _get_model(self, path: str, model: type[M], timeout: float | None) -> M:
        return self._parse(path, model, self._json(path, await self._call("GET", path, timeout=timeout)))

    async def _post_query(
        self, path: str, params: Mapping[str, str] | None, model: type[M], timeout: float | None
    ) -> M:
        """A POST without a body (vLLM reads these endpoints' arguments from the query string)."""
        text = await self._call("POST", path, params=params, timeout=timeout)
        return self._parse(path, model, self._json(path, text))

    # -- health and info ------------------------------------------------------------------------------
    async def health(self, *, timeout: float | None = None) -> None:
        """GET /health: 200 with an empty body (also while paused or "sleeping")."""
        await self._call("GET", "/health", timeout=timeout)

    async def health_generate(self, *, timeout: float | None = None) -> None:
        """A real 1-token generation (SGLang's /health_generate has no vLLM equivalent). A paused server
        holds the request until /resume, so this times out while paused."""
        answer = await self.completions([[0]], {"max_tokens": 1}, timeout=timeout)
        if len(answer.choices) != 1:
            raise EngineProtocolError(self.engine_id, COMPLETIONS, f"{len(answer.choices)} choices for 1 prompt")

    async def version(self, *, timeout: float | None = None) -> str:
        answer: VersionResponse = await self._get_model("/version", VersionResponse, timeout)
        return answer.version

    async def models(self, *, timeout: float | None = None) -> ModelList:
        return await self._get_model("/v1/models", ModelList, timeout)

    async def model(self, *, timeout: float | None = None) -> str:
        """The served model id (what /v1/completions needs as ``model``), read once and remembered."""
        if self._model is None:
            listed = await self.models(timeout=timeout)
            if not listed.data:
                raise EngineProtocolError(self.engine_id, "/v1/models", "serves no model")
            self._model = listed.data[0].id
        return self._model

    # -- generation --------------------------------------------------------------------------------------
    async def completions(
        self,
        prompts: Sequence[Sequence[int]] | Sequence[str],
        params: Mapping[str, Any] | None = None,
        *,
        logprobs: bool = False,
        timeout: float | None = None,
    ) -> CompletionResponse:
        """POST /v1/completions for a batch, ``params`` in vLLM's names; choices sorted by prompt, one each."""
        if isinstance(prompts, str) or not prompts:
            raise ValueError("completions: prompts must be a non-empty sequence of token-id lists or strings")
        batch: list[list[int]] | list[str] = (
            [str(p) for p in prompts] if isinstance(prompts[0], str) else [[int(t) for t in p] for p in prompts]
        )
        fields: dict[str, Any] = {"model": await self.model(timeout=timeout), "prompt": batch}
        fields |= {"return_token_ids": True, **({"logprobs": 0} if logprobs else {}), **dict(params or {})}
        try:
            request = CompletionRequest(**fields)
        except ValidationError as exc:
            raise ValueError(f"completions: {exc.errors()[0]['msg']} at {exc.errors()[0]['loc']}") from None
        text = await self._call("POST", COMPLETIONS, body=body_of(request), send_body=True, timeout=timeout)
        answer = self._parse(COMPLETIONS, CompletionResponse, self._json(COMPLETIONS, text))
        answer.choices.sort(key=lambda c: c.index)
        if [c.index for c in answer.choices] != list(range(len(batch))):
            got = [c.index for c in answer.choices]
            raise EngineProtocolError(self.engine_id, COMPLETIONS, f"choice indexes {got} for {len(batch)} prompts")
        return answer

    def _as_sglang(self, answer: CompletionResponse, choice: CompletionChoice, version: str | None) -> GenerateResponse:
        if choice.finish_reason == "error":
            raise EngineError(
                self.engine_id, COMPLETIONS, f"prompt {choice.index} finished with vLLM's retryable error"
            )
        if choice.token_ids is None or choice.prompt_token_ids is None:
            raise EngineProtocolError(self.engine_id, COMPLETIONS, "no token_ids (return_token_ids was sent)")
        output_ids = choice.token_ids
        logprobs: list[tuple[float, int, str | None]] | None = None
        if choice.logprobs is not None:
            values = choice.logprobs.token_logprobs
            if len(values) != len(output_ids) or any(v is None for v in values):
                raise EngineProtocolError(
                    self.engine_id, COMPLETIONS, f"{len(values)} logprobs for {len(output_ids)} tokens"
                )
            logprobs = [(float(v or 0.0), t, None) for v, t in zip(values, output_ids, strict=True)]
        meta = GenerateMetaInfo(
            id=f"{answer.id}-{choice.index}",
            finish_reason=_finish_reason(choice, output_ids),
            prompt_tokens=len(choice.prompt_token_ids),
            completion_tokens=len(output_ids),
            weight_version=version,
            output_token_logprobs=logprobs,
        )
        return GenerateResponse(text=choice.text, output_ids=output_ids, meta_info=meta)

    async def generate_batch(
        self,
        texts: Sequence[str] | None = None,
        *,
        input_ids: Sequence[Sequence[int]] | None = None,
        sampling_params: SamplingArg | Sequence[SamplingArg] | None = None,
        return_logprob: bool | None = None,
        timeout: float | None = None,
    ) -> list[GenerateResponse]:
        """EngineClient.generate_batch's call and answer (SGLang's shape) over /v1/completions; see the module."""
        if (texts is None) == (input_ids is None):
            raise ValueError("generate_batch: pass exactly one of texts= or input_ids=")
        if isinstance(texts, str):
            raise ValueError("generate_batch: texts must be a sequence of strings, not one string")
        prompts: list[str] | list[list[int]] = list(texts) if texts is not None else [list(p) for p in input_ids or []]
        if not prompts:
            raise ValueError("generate_batch: an empty batch")
        if sampling_params is None or isinstance(sampling_params, SamplingParams | Mapping):
            per_prompt = [vllm_sampling(sampling_params)] * len(prompts)
        else:
            per_prompt = [vllm_sampling(p) for p in sampling_params]
            if len(per_prompt) != len(prompts):
                raise ValueError(f"generate_batch: {len(per_prompt)} sampling_params for {len(prompts)} prompts")
        groups: dict[str, list[int]] = {}
        for i, params in enumerate(per_prompt):
            groups.setdefault(repr(sorted(params.items())), []).append(i)
        before = await self.weight_info(timeout=timeout) if self.versioned else None

        async def send(members: list[int]) -> tuple[list[int], CompletionResponse]:
            batch: Any = [prompts[i] for i in members]
            answer = await self.completions(
                batch, per_prompt[members[0]], logprobs=bool(return_logprob), timeout=timeout
            )
            return members, answer

        answers = await asyncio.gather(*(send(m) for m in groups.values()))
        after = await self.weight_info(timeout=timeout) if self.versioned else None
        version = before if before == after else None
        out: list[GenerateResponse | None] = [None] * len(prompts)
        for members, answer in answers:
            for i, choice in zip(members, answer.choices, strict=True):
                out[i] = self._as_sglang(answer, choice, version)
        return [r for r in out if r is not None]

    async def generate(
        self,
        text: str | None = None,
        *,
        input_ids: Sequence[int] | None = None,
        sampling_params: SamplingArg | None = None,
        return_logprob: bool | None = None,
        timeout: float | None = None,
    ) -> GenerateResponse:
        """One prompt (``text`` or ``input_ids``), answered in SGLang's shape."""
        if (text is None) == (input_ids is None):
            raise ValueError("generate: pass exactly one of text= or input_ids=")
        if text is not None:
            answers = await self.generate_batch(
                [text], sampling_params=sampling_params, return_logprob=return_logprob, timeout=timeout
            )
        else:
            answers = await self.generate_batch(
                input_ids=[list(input_ids or [])],
                sampling_params=sampling_params,
                return_logprob=return_logprob,
                timeout=timeout,
            )
        return answers[0]

    # -- pause, abort ----------------------------------------------------------------------------------------
    async def pause(
        self, mode: VLLMPauseMode = "abort", *, clear_cache: bool | None = None, timeout: float | None = None
    ) -> StatusResponse:
        """POST /pause?mode=: ``abort`` ends in-flight requests (HTTP 200, finish_reason abort, partial tokens),
        ``wait`` returns once they finished, ``keep`` freezes them until /resume. New requests wait for /resume."""
        params = {"mode": mode} | ({} if clear_cache is None else {"clear_cache": "true" if clear_cache else "false"})
        return await self._post_query("/pause", params, StatusResponse, timeout)

    async def resume(self, *, timeout: float | None = None) -> StatusResponse:
        return await self._post_query("/resume", None, StatusResponse, timeout)

    async def is_paused(self, *, timeout: float | None = None) -> bool:
        answer: IsPausedResponse = await self._get_model("/is_paused", IsPausedResponse, timeout)
        return answer.is_paused

    async def abort_requests(
        self, request_ids: Sequence[str] | None = None, *, timeout: float | None = None
    ) -> AbortResponse:
        """POST /abort_requests: the given ids, or (none) every request in flight; the count aborted."""
        request = AbortRequestsRequest() if request_ids is None else AbortRequestsRequest(request_ids=list(request_ids))
        return await self._post_model("/abort_requests", request, AbortResponse, timeout)

    # -- the weight-update session ------------------------------------------------------------------------------
    async def init_weight_transfer_engine(
        self, init_info: Mapping[str, Any], *, timeout: float | None = None
    ) -> MessageResponse:
        request = InitWeightTransferRequest(init_info=dict(init_info))
        return await self._post_model("/init_weight_transfer_engine", request, MessageResponse, timeout)

    async def shutdown_weight_transfer_engine(self, *, timeout: float | None = None) -> MessageResponse:
        return await self._post_query("/shutdown_weight_transfer_engine", None, MessageResponse, timeout)

    async def start_weight_update(self, *, timeout: float | None = None) -> MessageResponse:
        """Opens the session (500 if one is open already, or no transfer engine is configured)."""
        return await self._post_query("/start_weight_update", None, MessageResponse, timeout)

    async def update_weights(
        self, update_info: Mapping[str, Any] | Sequence[Mapping[str, Any]], *, timeout: float | None = None
    ) -> MessageResponse:
        """One chunk (``update_info`` is the transfer engine's, e.g. ``{"path": DIR}``). A chunk that fails
        ends the session in the worker: the next call must be /start_weight_update again."""
        info: Any = dict(update_info) if isinstance(update_info, Mapping) else [dict(u) for u in update_info]
        return await self._post_model(
            "/update_weights", UpdateWeightsRequest(update_info=info), MessageResponse, timeout
        )

    async def finish_weight_update(
        self, weight_version: str | None = None, *, timeout: float | None = None
    ) -> MessageResponse:
        """Closes the session; ``weight_version`` becomes /weight_info's only then (500 without a start)."""
        request = (
            FinishWeightUpdateRequest()
            if weight_version is None
            else FinishWeightUpdateRequest(weight_version=weight_version)
        )
        return await self._post_model("/finish_weight_update", request, MessageResponse, timeout)

    async def update_weight_version(
        self, new_version: str, *, timeout: float | None = None
    ) -> UpdateWeightVersionResponse:
        """Sets the label only (SGLang's also aborts running requests)."""
        request = UpdateWeightVersionRequest(new_version=new_version)
        answer = await self._post_model("/update_weight_version", request, UpdateWeightVersionResponse, timeout)
        if not answer.success or answer.new_version != new_version:
            raise EngineProtocolError(self.engine_id, "/update_weight_version", f"answered {answer.model_dump()}")
        return answer

    async def weight_info(self, *, timeout: float | None = None) -> str:
        """The served weight version ("default" until one is set)."""
        answer: WeightInfo = await self._get_model("/weight_info", WeightInfo, timeout)
        return answer.weight_version

    async def weight_checksums(self, *, timeout: float | None = None) -> dict[str, str]:
        answer = await self.weight_checker("checksum", timeout=timeout)
        assert isinstance(answer, WeightChecksums)
        return answer.checksums

    async def weight_checker(
        self, action: WeightCheckerAction, baseline: Mapping[str, str] | None = None, *, timeout: float | None = None
    ) -> WeightChecksums | WeightComparison | StatusResponse:
        """POST /weight_checker: ``checksum`` (name -> sha256), ``compare`` (against ``baseline``), ``reset``."""
        if (action == "compare") != (baseline is not None):
            raise ValueError("weight_checker: a baseline with action='compare', and only then")
        request = WeightCheckerRequest(action=action, **({} if baseline is None else {"baseline": dict(baseline)}))
        if action == "checksum":
            return await self._post_model("/weight_checker", request, WeightChecksums, timeout)
        if action == "compare":
            return await self._post_model("/weight_checker", request, WeightComparison, timeout)
        return await self._post_model("/weight_checker", request, StatusResponse, timeout)

    # -- sleep ------------------------------------------------------------------------------------------------------
    async def sleep(
        self, level: int = 1, mode: VLLMPauseMode = "abort", *, timeout: float | None = None
    ) -> SleepResponse:
        """POST /sleep?level=&mode=. On the CPU platform the worker ignores it (nothing is released) yet the
        server answers 200 and /is_sleeping says true, and it still generates: do not rely on it there."""
        params = {"level": str(level), "mode": mode}
        return await self._post_query("/sleep", params, SleepResponse, timeout)

    async def wake_up(self, tags: Sequence[str] | None = None, *, timeout: float | None = None) -> WakeUpResponse:
        """POST /wake_up[?tags=weights|kv_cache]: what to bring back (none named: everything)."""
        if tags is not None and len(tags) != 1:
            raise ValueError("wake_up: one tag per call (weights, then kv_cache), or none for everything")
        params = None if tags is None else {"tags": tags[0]}
        return await self._post_query("/wake_up", params, WakeUpResponse, timeout)

    async def is_sleeping(self, *, timeout: float | None = None) -> bool:
        answer: IsSleepingResponse = await self._get_model("/is_sleeping", IsSleepingResponse, timeout)
        return answer.is_sleeping

    def __repr__(self) -> str:
        return f"VLLMClient({self.base_url!r}, engine_id={self.engine_id!r})"


async def read_metrics(client: VLLMClient, *, timeout: float | None = None) -> str:
    """GET /metrics (Prometheus text). Not one of the client's calls: /metrics is outside vLLM's OpenAPI document
    and the recorded contract; the series read from it are pinned on real servers by
    tests/engines/vllm/test_vllm_core.py (progress) and tests/rollout/test_external_vllm.py (the process)."""
    return await client._call("GET", METRICS, timeout=timeout)


async def read_progress(client: VLLMClient, *, timeout: float | None = None) -> EngineProgress:
    """The engine core's own counters, as its API server last heard them: they stop moving when the engine core
    stops, while /health (answered by the API server) stays 200."""
    return parse_progress(await read_metrics(client, timeout=timeout))


def process_start_time(metrics: str) -> float | None:
    """Prometheus' ``process_start_time_seconds`` from vLLM's ``/metrics`` text: when its API server process
    started, so a new process behind the same address is told apart (None when the metrics do not include it).
    The slow tests/rollout/test_external_vllm.py reads it from a real server."""
    for line in metrics.splitlines():
        name, _, value = line.partition(" ")
        if name == "process_start_time_seconds":
            try:
                return float(value.strip())
            except ValueError:
                return None
    return None
