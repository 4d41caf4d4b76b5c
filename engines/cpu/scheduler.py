"""The token-by-token scheduler: waiting and running queues, one step per token, pause and abort.

Everything runs on one asyncio loop: each step prefills newly admitted requests and decodes one
token for every running one, then yields, so that /pause_generation, /abort_request and weight
updates act *between tokens*, exactly where SGLang's scheduler acts. Each request decodes alone
(no cross-request batching), so its tokens do not depend on what else is running.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import random
import time
import traceback
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

import torch

from engines.cpu.memory import ModelMemory
from engines.cpu.validation import EngineRequestError, check_sampling_values, gate_sampling_params, shown
from engines.models import sample_token
from engines.protocol import AbortReq, GenerateReqInput, SamplingParams

Status = Literal["starting", "ready", "shutting_down"]


@dataclass(eq=False)
class Request:
    """One prompt in flight; ``slot`` is its KV cache slot while it runs (None while it waits)."""

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


class Scheduler:
    """The queues and the step loop over ``memory``'s model and KV pool.

    ``status`` lives here because it gates the loop: nothing steps while starting or shutting down.
    """

    def __init__(self, memory: ModelMemory, *, seed: int = 0, step_delay_s: float = 0.0) -> None:
        self.memory = memory
        self.step_delay_s = step_delay_s
        self.status: Status = "starting"
        self.waiting: collections.deque[Request] = collections.deque()
        self.running: list[Request] = []
        self.paused = False
        self.pause_mode: str | None = None
        self._updating = 0
        self.generated_tokens = 0
        self._rng = random.Random(seed)
        self._wake = asyncio.Event()
        self._changed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    # -- lifecycle ------------------------------------------------------------------------------------
    async def start(self) -> None:
        """Start the loop task (it steps only once :meth:`mark_ready` is called)."""
        self._wake = asyncio.Event()
        self._changed = asyncio.Event()
        self._task = asyncio.create_task(self._loop(), name="torch-engine-scheduler")

    @property
    def alive(self) -> bool:
        return self._task is not None and not self._task.done()

    def mark_ready(self) -> None:
        self.status = "ready"
        self._wake.set()

    async def shutdown(self) -> None:
        self.status = "shutting_down"
        self.abort_all("the server is shutting down")
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    def wake(self) -> None:
        """Re-check whether the loop can step (memory came back, an update finished)."""
        self._wake.set()

    def all_requests(self) -> list[Request]:
        return [*self.running, *self.waiting]

    def _notify(self) -> None:
        self._changed.set()

    async def wait_until(self, predicate: Callable[[], bool], timeout: float | None = None) -> bool:
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

    @contextlib.contextmanager
    def admission_held(self) -> Iterator[None]:
        """No waiting request is admitted inside the block (a weight update's writer lock)."""
        self._updating += 1
        try:
            yield
        finally:
            self._updating -= 1
            self._wake.set()

    # -- requests --------------------------------------------------------------------------------------
    def build_requests(self, body: GenerateReqInput) -> tuple[bool, list[Request]]:
        """The requests of one /generate body (and whether it was a batch); every check runs before any queues."""
        if body.stream:
            raise EngineRequestError(400, "stream=true is not implemented by the CPU torch engine; send stream=false")
        if (body.text is None) == (body.input_ids is None):
            raise EngineRequestError(400, "Either text or input_ids should be provided (exactly one of them).")
        model = self.memory.model
        tokenizer = model.tokenizer
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
        in_flight = {r.rid for r in self.all_requests()}
        if len(set(rids)) != n or in_flight.intersection(rids):
            raise EngineRequestError(400, f"duplicate request id(s): {sorted(in_flight.intersection(rids)) or rids}")
        loop = asyncio.get_running_loop()
        context = model.context_length
        requests = []
        for rid, prompt, p, logprob in zip(rids, prompts, params, logprob_flags, strict=True):
            if not prompt:
                raise EngineRequestError(400, "an empty prompt: input_ids must hold at least one token")
            bad = [t for t in prompt if not 0 <= t < tokenizer.vocab_size]
            if bad:
                raise EngineRequestError(
                    400, f"input_ids {shown(bad[:5])} are outside the vocabulary [0, {tokenizer.vocab_size})"
                )
            check_sampling_values(p, tokenizer.vocab_size, prompt_tokens=len(prompt), context_length=context)
            seed = p.sampling_seed if p.sampling_seed is not None else self._rng.getrandbits(63)
            stops = (p.stop,) if isinstance(p.stop, str) else tuple(p.stop or ())
            requests.append(
                Request(
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

    async def submit(self, requests: list[Request]) -> list[dict[str, Any]]:
        """Queue ``requests`` and wait for their responses."""
        for req in requests:
            self.waiting.append(req)
        self._wake.set()
        try:
            return list(await asyncio.gather(*(req.future for req in requests)))
        except asyncio.CancelledError:  # the client went away (or timed out): free its slots, as SGLang does
            for req in requests:
                if req in self.running or req in self.waiting:
                    self.abort(req, "the client disconnected")
            raise

    # -- the loop --------------------------------------------------------------------------------------
    def _runnable(self) -> bool:
        if self.status != "ready" or self.paused:
            return False
        if not self.memory.model.weights_resident or not self.memory.kv.resident:
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
                self.abort_all(f"internal error in the engine scheduler: {exc!r}", err_type="InternalError")
            self._notify()
            await asyncio.sleep(self.step_delay_s)

    def _step(self) -> None:
        fresh: set[int] = set()
        while self.waiting and not self._updating and self.memory.kv.free_slots:
            req = self.waiting.popleft()
            fresh.add(id(req))
            self._alone(self._prefill, req)
        for req in list(self.running):
            if id(req) not in fresh:
                self._alone(self._decode, req)

    def _alone(self, work: Callable[[Request], None], req: Request) -> None:
        """One request's step; if it raises, that request alone ends (abort, InternalError) and frees its
        slot: a request that slipped past validation must not cost other clients theirs."""
        try:
            work(req)
        except Exception as exc:
            traceback.print_exc()
            self.abort(req, f"internal error in the engine while serving this request: {exc!r}", "InternalError")

    def _prefill(self, req: Request) -> None:
        model, kv = self.memory.model, self.memory.kv
        req.slot = kv.acquire()
        self.running.append(req)
        logits = model.prefill(kv, req.slot, req.prompt_ids)
        if req.output_ids:
            # Retracted earlier: rebuild the KV cache exactly as it was first computed (prompt prefill,
            # then one decode step per generated token), so the continuation is bitwise the same.
            start = len(req.prompt_ids)
            for i, token in enumerate(req.output_ids[:-1]):
                model.decode_step(kv, req.slot, token, start + i)
            return
        if req.params.max_new_tokens == 0:
            self._finish(req, {"type": "length", "length": 0})
            return
        self._emit(req, logits)

    def _decode(self, req: Request) -> None:
        assert req.slot is not None
        position = len(req.prompt_ids) + len(req.output_ids) - 1
        self._emit(req, self.memory.model.decode_step(self.memory.kv, req.slot, req.output_ids[-1], position))

    def _emit(self, req: Request, logits: torch.Tensor) -> None:
        p = req.params
        eos = self.memory.model.tokenizer.eos_id  # the model's tokenizer's (None: the model has no EOS)
        banned: list[int] = []
        if len(req.output_ids) < p.min_new_tokens:
            banned = [*(p.stop_token_ids or []), *([] if p.ignore_eos or eos is None else [eos])]
        token, logprob = sample_token(
            logits, temperature=p.temperature, top_p=p.top_p, top_k=p.top_k, generator=req.generator, banned=banned
        )
        req.output_ids.append(token)
        req.logprobs.append(logprob)
        self.generated_tokens += 1
        count = len(req.output_ids)
        finish: dict[str, Any] | None = None
        if count >= p.min_new_tokens:
            if token in (p.stop_token_ids or ()) or (token == eos and not p.ignore_eos):
                finish = {"type": "stop", "matched": token}
            elif req.stops:
                text = self.memory.model.tokenizer.decode(req.output_ids)
                matched = next((s for s in req.stops if text.endswith(s)), None)
                if matched is not None:
                    finish = {"type": "stop", "matched": matched}
        if finish is None and count >= p.max_new_tokens:
            finish = {"type": "length", "length": p.max_new_tokens}
        if finish is not None:
            self._finish(req, finish)

    def _finish(self, req: Request, reason: dict[str, Any]) -> None:
        if req in self.running:
            self.running.remove(req)
        elif req in self.waiting:
            self.waiting.remove(req)
        if req.slot is not None:
            self.memory.kv.free(req.slot)
            req.slot = None
        if not req.future.done():
            req.future.set_result(self._response(req, reason))
        self._notify()

    def _response(self, req: Request, reason: dict[str, Any]) -> dict[str, Any]:
        tokenizer = self.memory.model.tokenizer
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
            "weight_version": self.memory.weight_version,
            "num_retractions": req.num_retractions,
            "e2e_latency": time.monotonic() - req.created,
        }
        if req.return_logprob:
            meta["output_token_logprobs"] = [
                [lp, tok, tokenizer.token_text(tok) if req.return_text_in_logprobs else None]
                for lp, tok in zip(req.logprobs, req.output_ids, strict=True)
            ]
        return {"text": text, "output_ids": list(req.output_ids), "meta_info": meta}

    def abort(self, req: Request, message: str, err_type: str | None = None) -> None:
        self._finish(req, {"type": "abort", "message": message, "status_code": None, "err_type": err_type})

    def abort_all(self, message: str, err_type: str | None = None) -> int:
        requests = self.all_requests()
        for req in requests:
            self.abort(req, message, err_type)
        return len(requests)

    # -- control ---------------------------------------------------------------------------------------
    def pause_generation(self, mode: str) -> None:
        """abort: finish everything in flight with finish_reason abort; retract: free running requests'
        KV and requeue them (re-prefilled on continue); in_place: stop decoding, keep the KV. In every
        mode the engine stays paused (new requests queue) until :meth:`continue_generation`."""
        self.paused = True
        self.pause_mode = mode
        if mode == "abort":
            self.abort_all("aborted by /pause_generation (mode abort)")
        elif mode == "retract":
            retracted = list(self.running)
            for req in retracted:
                if req.slot is not None:
                    self.memory.kv.free(req.slot)
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
            self.abort_all(message)
        elif body.rid is not None:
            for req in self.all_requests():
                if req.rid == body.rid:
                    self.abort(req, message)
