"""The CPU torch engine: a token-by-token scheduler behind SGLang's HTTP API (aiohttp).

Everything runs on one asyncio loop: each scheduler step prefills newly admitted requests and
decodes one token for every running one, then yields, so that /pause_generation, /abort_request
and weight updates act *between tokens*, exactly where SGLang's scheduler acts. Each request
decodes alone (no cross-request batching), so its tokens do not depend on what else is running.

Memory is real: /release_memory_occupation swaps every parameter for an empty tensor and drops the
KV pool tensors (``internal_states[0]`` of /server_info reports the bytes held). Resuming weights
**re-reads the last weights file** (its SHA-256 must match what was loaded) or, if none was ever
loaded, re-creates the seed's initial weights -- so no hidden CPU copy keeps the memory alive.

Started by ``python -m engines.torch_engine`` (see :mod:`engines.torch_engine`).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import gc
import hmac
import json
import os
import random
import signal
import socket
import sys
import time
import traceback
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeVar

import torch
from aiohttp import web
from pydantic import BaseModel, ValidationError

from engines.errors import WeightsFileError
from engines.model import EOS_ID, KVCache, TinyCausalLM, read_weights_file, sample_token
from engines.protocol import (
    MEMORY_TAGS,
    SGLANG_ONLY_SAMPLING_KEYS,
    TAG_KV_CACHE,
    TAG_WEIGHTS,
    AbortReq,
    ContinueGenerationReqInput,
    GenerateReqInput,
    PauseGenerationReqInput,
    ReleaseMemoryOccupationReqInput,
    ResumeMemoryOccupationReqInput,
    SamplingParams,
    UpdateWeightFromDiskReqInput,
    UpdateWeightVersionReqInput,
)

ENGINE_VERSION = "rl-lifecycle-torch-engine 0.1.0 (SGLang 0.5.23 HTTP API)"
OPEN_PATH_PREFIXES = ("/health", "/ready", "/metrics")  # never behind the api key, as in SGLang

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


@dataclass(eq=False)
class _Request:
    rid: str
    prompt_ids: list[int]
    params: SamplingParams
    stops: tuple[str, ...]
    return_logprob: bool
    return_text_in_logprobs: bool
    generator: torch.Generator
    future: asyncio.Future[dict[str, Any]]
    created: float = field(default_factory=time.monotonic)
    output_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    slot: int | None = None
    num_retractions: int = 0


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


def rss_bytes() -> int:
    """Resident set size of this process (0 where /proc is unavailable)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


class TorchEngine:
    """The engine state and scheduler; the HTTP layer (:func:`build_app`) only parses and answers."""

    def __init__(
        self,
        *,
        seed: int = 0,
        model_size: str = "tiny",
        weights: str | Path | None = None,
        weight_version: str = "default",
        max_running_requests: int = 16,
        step_delay_s: float = 0.0,
        host: str = "127.0.0.1",
        port: int = 0,
    ) -> None:
        if max_running_requests < 1:
            raise ValueError(f"max_running_requests must be >= 1, got {max_running_requests}")
        if step_delay_s < 0:
            raise ValueError(f"step_delay_s must be >= 0, got {step_delay_s}")
        self.seed = seed
        self.model_size = model_size
        self.initial_weights = Path(weights) if weights is not None else None
        self.weight_version = weight_version
        self.max_running_requests = max_running_requests
        self.step_delay_s = step_delay_s
        self.host = host
        self.port = port
        self.status: Literal["starting", "ready", "shutting_down"] = "starting"
        self.startup_time = time.time()
        self._model: TinyCausalLM | None = None
        self._kv: KVCache | None = None
        self.weights_file: Path | None = None
        self.weights_sha256: str | None = None
        self.load_format = "seed-init"
        self.waiting: collections.deque[_Request] = collections.deque()
        self.running: list[_Request] = []
        self.paused = False
        self.pause_mode: str | None = None
        self._updating = 0
        self.generated_tokens = 0
        self._rng = random.Random(seed)
        self._wake = asyncio.Event()
        self._changed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    # -- setup ------------------------------------------------------------------------------------
    @property
    def model(self) -> TinyCausalLM:
        if self._model is None:
            raise RuntimeError("the engine has not loaded its model yet (call load())")
        return self._model

    @property
    def kv(self) -> KVCache:
        if self._kv is None:
            raise RuntimeError("the engine has not loaded its model yet (call load())")
        return self._kv

    def load(self) -> None:
        """Build the model from the seed, load ``weights`` if given, allocate the KV pool (blocking)."""
        model = TinyCausalLM(self.model_size, seed=self.seed)
        if self.initial_weights is not None:
            loaded = model.load_weights(self.initial_weights)
            self.weights_file, self.weights_sha256, self.load_format = loaded.path, loaded.sha256, loaded.load_format
        self._model = model
        self._kv = KVCache(model.config, self.max_running_requests)

    async def start(self) -> None:
        """Start the scheduler task (the model must be loaded)."""
        self.kv  # noqa: B018 -- raises if load() was not called
        self._wake = asyncio.Event()
        self._changed = asyncio.Event()
        self._task = asyncio.create_task(self._loop(), name="torch-engine-scheduler")

    def mark_ready(self) -> None:
        self.status = "ready"
        self._wake.set()

    async def shutdown(self) -> None:
        self.status = "shutting_down"
        self._abort_all("the server is shutting down")
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    # -- state ------------------------------------------------------------------------------------
    def _unavailable_reason(self) -> str | None:
        if self.status != "ready":
            return f"the engine is {self.status.replace('_', ' ')}"
        if self._task is None or self._task.done():
            return "the engine's scheduler is not running"
        if not self.model.weights_resident:
            return "the model weights are released (resume_memory_occupation with tag 'weights' first)"
        if not self.kv.resident:
            return "the KV cache is released (resume_memory_occupation with tag 'kv_cache' first)"
        return None

    def _all_requests(self) -> list[_Request]:
        return [*self.running, *self.waiting]

    def _notify(self) -> None:
        self._changed.set()

    async def _wait_until(self, predicate: Callable[[], bool], timeout: float | None = None) -> bool:
        """Wait (on scheduler progress, not by polling) until ``predicate()``; False on timeout."""
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        while not predicate():
            remaining = None if deadline is None else deadline - loop.time()
            if remaining is not None and remaining <= 0:
                return False
            self._changed.clear()
            try:
                await asyncio.wait_for(self._changed.wait(), remaining)
            except TimeoutError:
                return predicate()
        return True

    # -- generate --------------------------------------------------------------------------------------
    async def generate(self, body: GenerateReqInput) -> dict[str, Any] | list[dict[str, Any]]:
        batch, requests = self._build_requests(body)
        reason = self._unavailable_reason()
        if reason is not None:
            raise EngineRequestError(503, f"cannot generate: {reason}")
        for req in requests:
            self.waiting.append(req)
        self._wake.set()
        try:
            results = await asyncio.gather(*(req.future for req in requests))
        except asyncio.CancelledError:  # the client went away (or timed out): free its slots, as SGLang does
            for req in requests:
                if req in self.running or req in self.waiting:
                    self._abort(req, "the client disconnected")
            raise
        return list(results) if batch else results[0]

    def _build_requests(self, body: GenerateReqInput) -> tuple[bool, list[_Request]]:
        if body.stream:
            raise EngineRequestError(400, "stream=true is not implemented by the CPU torch engine; send stream=false")
        if (body.text is None) == (body.input_ids is None):
            raise EngineRequestError(400, "Either text or input_ids should be provided (exactly one of them).")
        tokenizer = self.model.tokenizer
        prompts: list[list[int]]
        if body.text is not None:
            batch = isinstance(body.text, list)
            texts = body.text if isinstance(body.text, list) else [body.text]
            prompts = [tokenizer.encode(t) for t in texts]
        else:
            ids = body.input_ids
            assert ids is not None
            batch = bool(ids) and isinstance(ids[0], list)
            prompts = [list(p) for p in ids] if batch else [list(ids)]  # type: ignore[arg-type]
        if not prompts:
            raise EngineRequestError(400, "an empty batch: text/input_ids must hold at least one prompt")
        n = len(prompts)

        def per_item(value: Any, name: str) -> list[Any]:
            if isinstance(value, list):
                if not batch or len(value) != n:
                    raise EngineRequestError(400, f"{name} is a list of {len(value)} but the batch has {n} prompts")
                return value
            return [value] * n

        raw_params = per_item(body.sampling_params, "sampling_params")
        params = [gate_sampling_params(raw) for raw in raw_params]
        logprob_flags = per_item(body.return_logprob, "return_logprob")
        if isinstance(body.rid, str) and batch:
            raise EngineRequestError(400, "rid must be a list with one id per prompt for a batch")
        rids = per_item(body.rid, "rid") if isinstance(body.rid, list) else [body.rid] * n
        rids = [r if r is not None else uuid.uuid4().hex for r in rids]
        in_flight = {r.rid for r in self._all_requests()}
        if len(set(rids)) != n or in_flight.intersection(rids):
            raise EngineRequestError(400, f"duplicate request id(s): {sorted(in_flight.intersection(rids)) or rids}")
        loop = asyncio.get_running_loop()
        context = self.model.config.max_seq_len
        requests = []
        for rid, prompt, p, logprob in zip(rids, prompts, params, logprob_flags, strict=True):
            check_sampling_values(p, tokenizer.vocab_size)
            if not prompt:
                raise EngineRequestError(400, "an empty prompt: input_ids must hold at least one token")
            bad = [t for t in prompt if not 0 <= t < tokenizer.vocab_size]
            if bad:
                raise EngineRequestError(
                    400, f"input_ids {bad[:5]} are outside the vocabulary [0, {tokenizer.vocab_size})"
                )
            if len(prompt) + p.max_new_tokens > context:
                raise EngineRequestError(
                    400,
                    f"Requested token count exceeds the model's maximum context length of {context} tokens: "
                    f"{len(prompt)} prompt tokens + max_new_tokens {p.max_new_tokens}",
                )
            seed = p.sampling_seed if p.sampling_seed is not None else self._rng.getrandbits(63)
            stops = (p.stop,) if isinstance(p.stop, str) else tuple(p.stop or ())
            requests.append(
                _Request(
                    rid=rid,
                    prompt_ids=prompt,
                    params=p,
                    stops=tuple(s for s in stops if s),
                    return_logprob=bool(logprob),
                    return_text_in_logprobs=body.return_text_in_logprobs,
                    generator=torch.Generator().manual_seed(seed),
                    future=loop.create_future(),
                )
            )
        return batch, requests

    # -- scheduler -------------------------------------------------------------------------------------
    def _runnable(self) -> bool:
        if self.status != "ready" or self.paused:
            return False
        if not self.model.weights_resident or not self.kv.resident:
            return False
        return bool(self.running) or (bool(self.waiting) and not self._updating)

    async def _loop(self) -> None:
        while True:
            if not self._runnable():
                self._wake.clear()
                await self._wake.wait()
                continue
            try:
                self._step()
            except Exception as exc:  # a bug must not wedge requests: fail them loudly, keep serving
                traceback.print_exc()
                self._abort_all(f"internal error in the engine scheduler: {exc!r}", err_type="InternalError")
            self._notify()
            await asyncio.sleep(self.step_delay_s)

    def _step(self) -> None:
        fresh: set[int] = set()
        while self.waiting and not self._updating and self.kv.free_slots:
            req = self.waiting.popleft()
            fresh.add(id(req))
            self._prefill(req)
        for req in list(self.running):
            if id(req) not in fresh:
                self._decode(req)

    def _prefill(self, req: _Request) -> None:
        req.slot = self.kv.acquire()
        self.running.append(req)
        logits = self.model.prefill(self.kv, req.slot, req.prompt_ids)
        if req.output_ids:
            # Retracted earlier: rebuild the KV cache exactly as it was first computed (prompt prefill,
            # then one decode step per generated token), so the continuation is bitwise the same.
            start = len(req.prompt_ids)
            for i, token in enumerate(req.output_ids[:-1]):
                self.model.decode_step(self.kv, req.slot, token, start + i)
            return
        if req.params.max_new_tokens == 0:
            self._finish(req, {"type": "length", "length": 0})
            return
        self._emit(req, logits)

    def _decode(self, req: _Request) -> None:
        assert req.slot is not None
        position = len(req.prompt_ids) + len(req.output_ids) - 1
        self._emit(req, self.model.decode_step(self.kv, req.slot, req.output_ids[-1], position))

    def _emit(self, req: _Request, logits: torch.Tensor) -> None:
        p = req.params
        banned: list[int] = []
        if len(req.output_ids) < p.min_new_tokens:
            banned = [*(p.stop_token_ids or []), *([] if p.ignore_eos else [EOS_ID])]
        token, logprob = sample_token(
            logits, temperature=p.temperature, top_p=p.top_p, top_k=p.top_k, generator=req.generator, banned=banned
        )
        req.output_ids.append(token)
        req.logprobs.append(logprob)
        self.generated_tokens += 1
        count = len(req.output_ids)
        finish: dict[str, Any] | None = None
        if count >= p.min_new_tokens:
            if token in (p.stop_token_ids or ()) or (token == EOS_ID and not p.ignore_eos):
                finish = {"type": "stop", "matched": token}
            elif req.stops:
                text = self.model.tokenizer.decode(req.output_ids)
                matched = next((s for s in req.stops if text.endswith(s)), None)
                if matched is not None:
                    finish = {"type": "stop", "matched": matched}
        if finish is None and count >= p.max_new_tokens:
            finish = {"type": "length", "length": p.max_new_tokens}
        if finish is not None:
            self._finish(req, finish)

    def _finish(self, req: _Request, reason: dict[str, Any]) -> None:
        if req in self.running:
            self.running.remove(req)
        elif req in self.waiting:
            self.waiting.remove(req)
        if req.slot is not None:
            self.kv.free(req.slot)
            req.slot = None
        if not req.future.done():
            req.future.set_result(self._response(req, reason))
        self._notify()

    def _response(self, req: _Request, reason: dict[str, Any]) -> dict[str, Any]:
        tokenizer = self.model.tokenizer
        text = tokenizer.decode(req.output_ids, skip_special_tokens=req.params.skip_special_tokens)
        matched = reason.get("matched")
        if reason["type"] == "stop" and isinstance(matched, str) and not req.params.no_stop_trim:
            text = text[: len(text) - len(matched)]
        meta: dict[str, Any] = {
            "id": req.rid,
            "finish_reason": reason,
            "prompt_tokens": len(req.prompt_ids),
            "completion_tokens": len(req.output_ids),
            "cached_tokens": 0,
            "weight_version": self.weight_version,
            "num_retractions": req.num_retractions,
            "e2e_latency": time.monotonic() - req.created,
        }
        if req.return_logprob:
            meta["output_token_logprobs"] = [
                [lp, tok, tokenizer.token_text(tok) if req.return_text_in_logprobs else None]
                for lp, tok in zip(req.logprobs, req.output_ids, strict=True)
            ]
        return {"text": text, "output_ids": list(req.output_ids), "meta_info": meta}

    def _abort(self, req: _Request, message: str, err_type: str | None = None) -> None:
        self._finish(req, {"type": "abort", "message": message, "status_code": None, "err_type": err_type})

    def _abort_all(self, message: str, err_type: str | None = None) -> int:
        requests = self._all_requests()
        for req in requests:
            self._abort(req, message, err_type)
        return len(requests)

    # -- control endpoints ------------------------------------------------------------------------------
    def pause_generation(self, mode: str) -> None:
        """abort: finish everything in flight with finish_reason abort; retract: free running requests'
        KV and requeue them (re-prefilled on continue); in_place: stop decoding, keep the KV. In every
        mode the engine stays paused (new requests queue) until /continue_generation."""
        self.paused = True
        self.pause_mode = mode
        if mode == "abort":
            self._abort_all("aborted by /pause_generation (mode abort)")
        elif mode == "retract":
            retracted = list(self.running)
            for req in retracted:
                if req.slot is not None:
                    self.kv.free(req.slot)
                    req.slot = None
                req.num_retractions += 1
            self.running.clear()
            self.waiting.extendleft(reversed(retracted))
        self._notify()

    def continue_generation(self) -> None:
        self.paused = False
        self.pause_mode = None
        self._wake.set()
        self._notify()

    def abort_request(self, body: AbortReq) -> None:
        message = body.abort_message or "aborted by /abort_request"
        if body.abort_all:
            self._abort_all(message)
        elif body.rid is not None:
            for req in self._all_requests():
                if req.rid == body.rid:
                    self._abort(req, message)

    def update_weight_version(self, body: UpdateWeightVersionReqInput) -> dict[str, Any]:
        if body.abort_all_requests:
            self._abort_all("aborted by /update_weight_version")
        self.weight_version = body.new_version
        return {
            "success": True,
            "message": f"Weight version updated to {body.new_version}.",
            "new_version": body.new_version,
        }

    async def update_weights_from_disk(self, body: UpdateWeightFromDiskReqInput) -> tuple[int, dict[str, Any]]:
        """Like SGLang's writer lock: no new request starts, running ones finish (or stay paused), then
        the file is read, checked and swapped in between two tokens. A bad file changes nothing."""

        def refuse(message: str) -> tuple[int, dict[str, Any]]:
            return 400, {"success": False, "message": message, "num_paused_requests": 0}

        if not self.model.weights_resident:
            return refuse("the model weights are released; resume_memory_occupation(['weights']) first")
        if body.abort_all_requests:
            self._abort_all("aborted by /update_weights_from_disk")
        self._updating += 1
        try:
            await self._wait_until(lambda: not self.running or self.paused)
            try:
                loaded = await asyncio.to_thread(
                    read_weights_file, body.model_path, self.model.expected_tensors(), load_format=body.load_format
                )
            except WeightsFileError as exc:
                return refuse(f"Failed to update weights: {exc}")
            if not self.model.weights_resident:
                return refuse("the model weights were released while the file was being read")
            self.model.assign_weights(loaded.state)
            self.weights_file, self.weights_sha256, self.load_format = loaded.path, loaded.sha256, loaded.load_format
            if body.weight_version is not None:
                self.weight_version = body.weight_version
            if body.flush_cache and self.kv.resident and not self.kv.slots_in_use:
                self.kv.clear()
            paused = len(self.running) if self.paused else 0
            return 200, {
                "success": True,
                "message": "Succeeded to update model weights.",
                "num_paused_requests": paused,
            }
        finally:
            self._updating -= 1
            self._wake.set()

    def _resident(self) -> dict[str, bool]:
        return {TAG_WEIGHTS: self.model.weights_resident, TAG_KV_CACHE: self.kv.resident}

    def _tags(self, tags: list[str] | None, *, want_resident: bool) -> list[str]:
        unknown = sorted(set(tags or ()) - set(MEMORY_TAGS))
        if unknown:
            raise EngineRequestError(400, f"unknown memory tag(s) {unknown}; known tags: {', '.join(MEMORY_TAGS)}")
        resident = self._resident()
        if tags is None:  # every tag that can be acted on
            chosen = [t for t, held in resident.items() if held == want_resident]
            if not chosen:
                state = "released" if want_resident else "resident"
                raise EngineRequestError(400, f"nothing to do: weights and KV cache are both already {state}")
            return chosen
        for tag in tags:
            if tag in resident and resident[tag] != want_resident:
                state = "released" if want_resident else "resident"
                raise EngineRequestError(400, f"{tag} is already {state}")
        return [t for t in dict.fromkeys(tags) if t in resident]

    def release_memory_occupation(self, tags: list[str] | None) -> None:
        chosen = self._tags(tags, want_resident=True)
        if TAG_KV_CACHE in chosen and self.kv.slots_in_use:
            raise EngineRequestError(
                400,
                f"cannot release the KV cache: {self.kv.slots_in_use} requests hold KV cache slots (running or "
                "paused in place); pause_generation with mode 'retract' or 'abort', or let them finish, first",
            )
        if TAG_WEIGHTS in chosen and self.running and not self.paused:
            raise EngineRequestError(
                400, f"cannot release the weights: {len(self.running)} requests are decoding; pause_generation first"
            )
        if TAG_WEIGHTS in chosen:
            self.model.release_weights()
        if TAG_KV_CACHE in chosen:
            self.kv.release()
        gc.collect()

    async def resume_memory_occupation(self, tags: list[str] | None) -> None:
        chosen = self._tags(tags, want_resident=False)
        if TAG_WEIGHTS in chosen:
            if self.weights_file is None:
                self.model.init_weights(self.seed)
            else:
                try:
                    loaded = await asyncio.to_thread(
                        read_weights_file,
                        self.weights_file,
                        self.model.expected_tensors(),
                        load_format=self.load_format,
                    )
                except WeightsFileError as exc:
                    raise EngineRequestError(400, f"cannot restore the released weights: {exc}") from None
                if loaded.sha256 != self.weights_sha256:
                    raise EngineRequestError(
                        400,
                        f"cannot restore the released weights: {self.weights_file} changed since it was loaded "
                        f"(sha256 {self.weights_sha256} -> {loaded.sha256}); load it with update_weights_from_disk",
                    )
                self.model.assign_weights(loaded.state)
        if TAG_KV_CACHE in chosen:
            self.kv.allocate()
        self._wake.set()

    async def flush_cache(self, timeout: float) -> tuple[int, str]:
        """Zero the KV pool once no request holds a slot (waiting up to ``timeout`` seconds)."""
        if not await self._wait_until(lambda: not self.kv.slots_in_use, timeout):
            return 400, (
                f"Cache not flushed: {self.kv.slots_in_use} requests hold KV cache slots "
                "(running or paused); retry when idle or with a longer ?timeout=.\n"
            )
        self.kv.clear()
        return 200, "Cache flushed.\n"

    def health_generate(self) -> bool:
        """A real 1-token greedy generation from input_ids [0] (False while starting or released)."""
        if self._unavailable_reason() is not None:
            return False
        try:
            with torch.no_grad():
                logits = self.model(torch.tensor([[0]]))[0, -1]
            sample_token(logits, temperature=0.0)
        except Exception:
            traceback.print_exc()
            return False
        return True

    def model_info(self) -> dict[str, Any]:
        model_path = str(self.weights_file) if self.weights_file else f"torch-engine:{self.model_size}:seed={self.seed}"
        return {
            "model_path": model_path,
            "tokenizer_path": None,
            "is_generation": True,
            "preferred_sampling_params": None,
            "weight_version": self.weight_version,
            "load_format": self.load_format,
            "reasoning_parser": None,
            "tool_call_parser": None,
            "disaggregation_mode": "null",
            "has_image_understanding": False,
            "has_audio_understanding": False,
            "model_type": "tiny_causal_lm",
            "architectures": ["TinyCausalLM"],
            "served_model_name": model_path,
        }

    def server_info(self) -> dict[str, Any]:
        weights_bytes = self.model.weight_bytes
        kv_bytes = self.kv.nbytes
        gib = float(1 << 30)
        state = {
            "memory_usage": {
                "weight": weights_bytes / gib,
                "kvcache": kv_bytes / gib,
                "token_capacity": self.kv.num_slots * self.model.config.max_seq_len,
                "graph": 0.0,
            },
            "weights_bytes": weights_bytes,
            "kv_cache_bytes": kv_bytes,
            "rss_bytes": rss_bytes(),
            "weights_resident": self.model.weights_resident,
            "kv_cache_resident": self.kv.resident,
            "paused": self.paused,
            "pause_mode": self.pause_mode,
            "num_running_reqs": len(self.running),
            "num_waiting_reqs": len(self.waiting),
            "kv_slots_in_use": self.kv.slots_in_use,
            "kv_slots_total": self.kv.num_slots,
            "num_generated_tokens": self.generated_tokens,
        }
        info = self.model_info()
        return {
            "model_path": info["model_path"],
            "served_model_name": info["served_model_name"],
            "host": self.host,
            "port": self.port,
            "random_seed": self.seed,
            "model_size": self.model_size,
            "context_length": self.model.config.max_seq_len,
            "max_running_requests": self.max_running_requests,
            "weight_version": self.weight_version,
            "weights_file": str(self.weights_file) if self.weights_file else None,
            "weights_sha256": self.weights_sha256,
            "launch_command": " ".join(sys.argv),
            "startup_time": self.startup_time,
            "status": self.status,
            "version": ENGINE_VERSION,
            "frontend": "python",
            "internal_states": [state],
        }


# ----------------------------------------------------------------------------------------------
# HTTP layer
# ----------------------------------------------------------------------------------------------

M = TypeVar("M", bound=BaseModel)
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


async def parse_body(request: web.Request, model: type[M]) -> M:
    """SGLang's request parsing: a body is required (``{}`` for defaults); errors are 400 validation bodies."""
    raw = await request.read()
    if not raw.strip():
        raise EngineRequestError(400, "body: Field required (send {} for the defaults)", "validation")
    try:
        data = json.loads(raw)
    except ValueError as exc:
        raise EngineRequestError(400, f"body: JSON decode error ({exc})", "validation") from None
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(
            f"body{''.join(f'.{p}' for p in e['loc'])}: {e['msg']} (got {e.get('input')!r})" for e in exc.errors()
        )
        raise EngineRequestError(400, problems, "validation") from None


def build_app(engine: TorchEngine, *, api_key: str | None = None) -> web.Application:
    """The aiohttp application: SGLang's paths, methods, bodies and status codes for the lifecycle endpoints."""

    @web.middleware
    async def errors(request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            return await handler(request)
        except EngineRequestError as exc:
            return web.json_response(exc.body(), status=exc.status)
        except web.HTTPException:
            raise
        except Exception as exc:
            traceback.print_exc()
            return web.json_response({"error": {"message": f"internal error: {exc!r}"}}, status=500)

    @web.middleware
    async def auth(request: web.Request, handler: Handler) -> web.StreamResponse:
        if api_key and not request.path.startswith(OPEN_PATH_PREFIXES):
            given = request.headers.get("Authorization", "")
            if not hmac.compare_digest(given.encode(), f"Bearer {api_key}".encode()):
                return web.json_response({"error": "Unauthorized"}, status=401)
        return await handler(request)

    # SGLang: /health runs the same 1-token generation as /health_generate unless this env switch is
    # false, then it only says the server is up (and not starting or shutting down).
    health_generates = os.environ.get("SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION", "true").lower() != "false"

    async def health(request: web.Request) -> web.Response:
        if request.path == "/health" and not health_generates:
            return web.Response(status=200 if engine.status == "ready" else 503)
        return web.Response(status=200 if engine.health_generate() else 503)

    async def ready(request: web.Request) -> web.Response:
        return web.Response(status=200 if engine.status == "ready" else 503)

    async def model_info(request: web.Request) -> web.Response:
        return web.json_response(engine.model_info())

    async def server_info(request: web.Request) -> web.Response:
        return web.json_response(engine.server_info())

    async def generate(request: web.Request) -> web.Response:
        body = await parse_body(request, GenerateReqInput)
        return web.json_response(await engine.generate(body))

    async def flush_cache(request: web.Request) -> web.Response:
        raw = request.query.get("timeout", "0")
        try:
            timeout = float(raw)
        except ValueError:
            timeout = -1.0
        if not timeout >= 0:
            raise EngineRequestError(400, f"query.timeout: must be a number >= 0 (got {raw!r})", "validation")
        status, text = await engine.flush_cache(timeout)
        return web.Response(status=status, text=text)

    async def update_weights_from_disk(request: web.Request) -> web.Response:
        body = await parse_body(request, UpdateWeightFromDiskReqInput)
        status, answer = await engine.update_weights_from_disk(body)
        return web.json_response(answer, status=status)

    async def update_weight_version(request: web.Request) -> web.Response:
        body = await parse_body(request, UpdateWeightVersionReqInput)
        return web.json_response(engine.update_weight_version(body))

    async def release(request: web.Request) -> web.Response:
        body = await parse_body(request, ReleaseMemoryOccupationReqInput)
        engine.release_memory_occupation(body.tags)
        return web.json_response(None)

    async def resume(request: web.Request) -> web.Response:
        body = await parse_body(request, ResumeMemoryOccupationReqInput)
        await engine.resume_memory_occupation(body.tags)
        return web.json_response(None)

    async def pause(request: web.Request) -> web.Response:
        body = await parse_body(request, PauseGenerationReqInput)
        engine.pause_generation(body.mode)
        return web.json_response({"message": "Generation paused successfully.", "status": "ok"})

    async def continue_(request: web.Request) -> web.Response:
        await parse_body(request, ContinueGenerationReqInput)
        engine.continue_generation()
        return web.json_response({"message": "Generation continued successfully.", "status": "ok"})

    async def abort(request: web.Request) -> web.Response:
        engine.abort_request(await parse_body(request, AbortReq))
        return web.Response(status=200)

    app = web.Application(middlewares=[errors, auth])
    routes: list[tuple[Sequence[str], str, Handler]] = [
        (("GET",), "/health", health),
        (("GET",), "/health_generate", health),
        (("GET",), "/ready", ready),
        (("GET",), "/model_info", model_info),
        (("GET",), "/get_model_info", model_info),
        (("GET",), "/server_info", server_info),
        (("GET",), "/get_server_info", server_info),
        (("POST", "PUT"), "/generate", generate),
        (("GET", "POST"), "/flush_cache", flush_cache),
        (("POST",), "/update_weights_from_disk", update_weights_from_disk),
        (("POST",), "/update_weight_version", update_weight_version),
        (("GET", "POST"), "/release_memory_occupation", release),
        (("GET", "POST"), "/resume_memory_occupation", resume),
        (("POST",), "/pause_generation", pause),
        (("POST",), "/continue_generation", continue_),
        (("POST",), "/abort_request", abort),
    ]
    for methods, path, handler in routes:
        for method in methods:
            app.router.add_route(method, path, handler)
    return app


def run(sock: socket.socket, args: argparse.Namespace) -> int:
    """Load the model, serve on the already-bound ``sock`` until SIGTERM/SIGINT; the exit code."""
    torch.set_num_threads(args.torch_threads)
    engine = TorchEngine(
        seed=args.seed,
        model_size=args.model_size,
        weights=args.weights,
        weight_version=args.weight_version,
        max_running_requests=args.max_running_requests,
        step_delay_s=args.step_delay_s,
        host=args.host,
        port=sock.getsockname()[1],
    )
    try:
        engine.load()
    except WeightsFileError as exc:
        print(f"lifecycle-torch-engine: error: --weights: {exc}", file=sys.stderr, flush=True)
        return 2
    asyncio.run(_serve(engine, sock, args))
    return 0


async def _serve(engine: TorchEngine, sock: socket.socket, args: argparse.Namespace) -> None:
    # handler_cancellation: a client that disconnects cancels its handler, so its requests are aborted.
    runner = web.AppRunner(
        build_app(engine, api_key=args.api_key), access_log=None, handle_signals=False, handler_cancellation=True
    )
    await runner.setup()
    await web.SockSite(runner, sock).start()
    await engine.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    if args.startup_delay_s > 0:
        await asyncio.sleep(args.startup_delay_s)  # /health answers 503 meanwhile (a startup probe's view)
    engine.mark_ready()
    shown = "127.0.0.1" if args.host in ("0.0.0.0", "") else args.host
    print(f"READY http://{shown}:{engine.port}", flush=True)
    await stop.wait()
    await engine.shutdown()
    await runner.cleanup()
