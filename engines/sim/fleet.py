"""The simulated engines and their fleet: an aiohttp app per engine, a control app for the fleet."""

from __future__ import annotations

import asyncio
import json
import random
import socket
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from engines.models.family import load_tokenizer
from engines.models.protocol import Tokenizer
from engines.protocol import (
    ContinueGenerationResponse,
    GenerateMetaInfo,
    GenerateReqInput,
    GenerateResponse,
    ModelInfo,
    PauseGenerationResponse,
    ReleaseMemoryOccupationReqInput,
    ResumeMemoryOccupationReqInput,
    ServerInfo,
    UpdateWeightFromDiskReqInput,
    UpdateWeightsFromDiskResponse,
)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
TAGS = ("weights", "kv_cache")


@dataclass
class InFlight:
    """Requests being answered across the whole fleet, per path, and the most there ever were at once: how a
    test sees that a fleet operation fanned out (N at once) rather than walked the engines (one at a time)."""

    now: dict[str, int] = field(default_factory=dict)
    peak: dict[str, int] = field(default_factory=dict)

    def enter(self, path: str) -> None:
        self.now[path] = self.now.get(path, 0) + 1
        self.peak[path] = max(self.peak.get(path, 0), self.now[path])

    def leave(self, path: str) -> None:
        self.now[path] -= 1


@dataclass
class SimEngine:
    """What one simulated server holds: the weights it serves, what is released, whether it is paused."""

    index: int
    latency: Mapping[str, float]
    inflight: InFlight = field(default_factory=InFlight)
    model_path: str = "sim://initial"
    weight_version: str = "default"
    released: set[str] = field(default_factory=set)
    paused: bool = False
    hung: bool = False
    update_session: bool = False  # between /begin_weight_update and /end_weight_update (SGLang 0.5.23)
    generate_requests: int = 0
    calls: dict[str, int] = field(default_factory=dict)
    memory_requests: list[tuple[str, list[str] | None]] = field(default_factory=list)  # (path, tags) as asked
    _tokenizers: dict[str, Tokenizer] = field(default_factory=dict)

    async def wait(self, path: str) -> None:
        self.calls[path] = self.calls.get(path, 0) + 1
        if self.hung:
            await asyncio.Event().wait()  # a hung server: the caller's bound is the only way out
        delay = self.latency.get(path, self.latency.get("*", 0.0))
        if delay > 0:
            self.inflight.enter(path)
            try:
                await asyncio.sleep(delay)
            finally:
                self.inflight.leave(path)

    def tokenizer(self) -> Tokenizer | None:
        if self.model_path.startswith("sim://"):
            return None
        tok = self._tokenizers.get(self.model_path)
        if tok is None:
            tok = self._tokenizers[self.model_path] = load_tokenizer(self.model_path)
        return tok

    # -- endpoints -------------------------------------------------------------------------------------
    async def health(self, request: web.Request) -> web.Response:
        await self.wait(request.path)
        if self.released:
            return web.Response(status=503, text="memory released")
        return web.Response(text="")

    async def model_info(self, request: web.Request) -> web.Response:
        await self.wait(request.path)
        return _json(ModelInfo(model_path=self.model_path, weight_version=self.weight_version))

    async def server_info(self, request: web.Request) -> web.Response:
        await self.wait(request.path)
        state = {"num_generate_requests": self.generate_requests, "released": sorted(self.released)}
        return _json(ServerInfo(weight_version=self.weight_version, internal_states=[state]))

    async def generate(self, request: web.Request) -> web.Response:
        body = GenerateReqInput.model_validate(await request.json())
        await self.wait(request.path)
        if self.released or self.paused:
            return web.json_response({"error": {"message": "generation is paused or memory released"}}, status=503)
        self.generate_requests += 1
        texts = body.text if isinstance(body.text, list) else [body.text or ""]
        params = body.sampling_params if isinstance(body.sampling_params, list) else [body.sampling_params] * len(texts)
        answers = [
            self._answer(text, p or {}, body.return_logprob is True) for text, p in zip(texts, params, strict=True)
        ]
        if isinstance(body.text, list):
            return web.json_response([json.loads(a.model_dump_json()) for a in answers])
        return _json(answers[0])

    def _answer(self, text: str, params: Any, logprobs: bool) -> GenerateResponse:
        given = params if isinstance(params, dict) else params.model_dump(exclude_none=True)
        n = int(given.get("max_new_tokens") or 8)
        rng = random.Random(f"{self.weight_version}:{text}:{given.get('sampling_seed')}")
        answer = "".join(rng.choice("ab") for _ in range(n))
        tok = self.tokenizer()
        prompt = len(tok.encode(text)) if tok is not None else len(text)
        ids = tok.encode(answer)[len(tok.encode("")) :] if tok is not None else [ord(c) for c in answer]  # no BOS
        lps: list[tuple[float, int, str | None]] | None = [(-0.69, t, None) for t in ids] if logprobs else None
        meta = GenerateMetaInfo(
            id=f"sim-{self.index}-{self.generate_requests}",
            finish_reason={"type": "length", "length": len(ids)},  # type: ignore[arg-type]
            prompt_tokens=prompt,
            completion_tokens=len(ids),
            weight_version=self.weight_version,
            output_token_logprobs=lps,
        )
        return GenerateResponse(text=answer, output_ids=ids, meta_info=meta)

    async def update_weights_from_disk(self, request: web.Request) -> web.Response:
        body = UpdateWeightFromDiskReqInput.model_validate(await request.json())
        await self.wait(request.path)
        if "weights" in self.released:
            answer = UpdateWeightsFromDiskResponse(success=False, message="weights are released: resume them first")
            return _json(answer, status=400)
        self.model_path = body.model_path
        self.weight_version = body.weight_version or self.weight_version
        return _json(UpdateWeightsFromDiskResponse(success=True, message="Succeeded to update model weights."))

    async def release(self, request: web.Request) -> web.Response:
        body = ReleaseMemoryOccupationReqInput.model_validate(await request.json())
        self.memory_requests.append((request.path, body.tags))
        await self.wait(request.path)
        self.released |= set(body.tags or TAGS)
        return web.json_response({})

    async def resume(self, request: web.Request) -> web.Response:
        body = ResumeMemoryOccupationReqInput.model_validate(await request.json())
        self.memory_requests.append((request.path, body.tags))
        await self.wait(request.path)
        self.released -= set(body.tags or TAGS)
        return web.json_response({})

    async def begin_update(self, request: web.Request) -> web.Response:
        await self.wait(request.path)
        if self.update_session:
            return web.json_response(
                {"success": False, "message": "a weight-update session is already open"}, status=400
            )
        self.update_session = True
        return web.json_response({"success": True, "message": "Weight update session begun."})

    async def end_update(self, request: web.Request) -> web.Response:
        await self.wait(request.path)
        if not self.update_session:
            return web.json_response({"success": False, "message": "no weight-update session is open"}, status=400)
        self.update_session = False
        return web.json_response({"success": True, "message": "Weight update session ended."})

    async def pause(self, request: web.Request) -> web.Response:
        await self.wait(request.path)
        self.paused = True
        return _json(PauseGenerationResponse(message="Generation paused successfully.", status="ok"))

    async def resume_generation(self, request: web.Request) -> web.Response:
        await self.wait(request.path)
        self.paused = False
        return _json(ContinueGenerationResponse(message="Generation continued successfully.", status="ok"))

    async def flush_cache(self, request: web.Request) -> web.Response:
        await self.wait(request.path)
        return web.Response(text="Cache flushed.\n")

    async def abort_request(self, request: web.Request) -> web.Response:
        """Nothing to end: a simulated engine answers each generation at once, so none is ever held."""
        await self.wait(request.path)
        return web.Response(status=200)

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/health", self.health)
        app.router.add_get("/health_generate", self.health)
        app.router.add_get("/model_info", self.model_info)
        app.router.add_get("/server_info", self.server_info)
        app.router.add_post("/generate", self.generate)
        app.router.add_post("/begin_weight_update", self.begin_update)
        app.router.add_post("/update_weights_from_disk", self.update_weights_from_disk)
        app.router.add_post("/end_weight_update", self.end_update)
        app.router.add_post("/release_memory_occupation", self.release)
        app.router.add_post("/resume_memory_occupation", self.resume)
        app.router.add_post("/pause_generation", self.pause)
        app.router.add_post("/continue_generation", self.resume_generation)
        app.router.add_post("/flush_cache", self.flush_cache)
        app.router.add_post("/abort_request", self.abort_request)
        return app


def _json(model: Any, status: int = 200) -> web.Response:
    return web.Response(text=model.model_dump_json(), status=status, content_type="application/json")


class Fleet:
    """N engine slots on N loopback ports, started and killed through a control app (``/slots/{i}/...``)."""

    def __init__(self, size: int, latency: Mapping[str, float], host: str = "127.0.0.1") -> None:
        self.size, self.latency, self.host = size, dict(latency), host
        self.sockets = [_bind(host) for _ in range(size)]  # bound, not listening: the port is the slot's, refused
        self.runners: dict[int, web.AppRunner] = {}
        self.engines: dict[int, SimEngine] = {}
        self.deaths = [asyncio.Event() for _ in range(size)]
        self.inflight = InFlight()

    def url(self, i: int) -> str:
        return f"http://{self.host}:{self.sockets[i].getsockname()[1]}"

    async def start(self, i: int) -> str:
        """A fresh server in slot ``i`` (a restart forgets everything, as a new process would)."""
        await self.kill(i, notify=False)
        engine = self.engines[i] = SimEngine(i, self.latency, self.inflight)
        runner = web.AppRunner(engine.app(), access_log=None)
        await runner.setup()
        self.sockets[i].listen(128)
        await web.SockSite(runner, self.sockets[i]).start()
        self.runners[i] = runner
        self.deaths[i] = asyncio.Event()
        return self.url(i)

    async def kill(self, i: int, *, notify: bool = True) -> None:
        runner = self.runners.pop(i, None)
        if runner is not None:
            port = self.sockets[i].getsockname()[1]
            await runner.cleanup()  # closes the listening socket: connections are refused, as to a dead process
            self.sockets[i].close()
            self.sockets[i] = _bind(self.host, port)
            if notify:
                self.deaths[i].set()

    def control(self) -> web.Application:
        async def start(request: web.Request) -> web.Response:
            return web.json_response({"url": await self.start(int(request.match_info["i"]))})

        async def kill(request: web.Request) -> web.Response:
            await self.kill(int(request.match_info["i"]))
            return web.json_response({})

        async def hang(request: web.Request) -> web.Response:
            engine = self.engines.get(int(request.match_info["i"]))
            if engine is not None:
                engine.hung = True
            return web.json_response({})

        async def watch(request: web.Request) -> web.Response:
            await self.deaths[int(request.match_info["i"])].wait()
            return web.json_response({"reason": "killed"})

        async def calls(request: web.Request) -> web.Response:
            return web.json_response({str(i): e.calls for i, e in self.engines.items()})

        async def memory(request: web.Request) -> web.Response:
            return web.json_response({str(i): e.memory_requests for i, e in self.engines.items()})

        async def peak(request: web.Request) -> web.Response:
            return web.json_response(self.inflight.peak)

        async def reset_peak(request: web.Request) -> web.Response:
            self.inflight.peak.clear()
            return web.json_response({})

        app = web.Application()
        app.router.add_post("/slots/{i}/start", start)
        app.router.add_post("/slots/{i}/kill", kill)
        app.router.add_post("/slots/{i}/hang", hang)
        app.router.add_get("/slots/{i}/watch", watch)
        app.router.add_get("/calls", calls)
        app.router.add_get("/memory", memory)
        app.router.add_get("/peak", peak)
        app.router.add_post("/peak/reset", reset_peak)
        return app


def _bind(host: str, port: int = 0) -> socket.socket:
    """A slot's port, held but not listening (a connection is refused until the slot starts)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    return sock
