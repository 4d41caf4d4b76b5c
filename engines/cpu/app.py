"""The engine's HTTP layer (aiohttp): SGLang's paths, methods, bodies and status codes.

It only parses and answers; every decision is :class:`~engines.cpu.engine.TorchEngine`'s. Served on
a socket the CLI bound before torch was imported (see :mod:`engines.cpu.cli`).
"""

from __future__ import annotations

import argparse
import asyncio
import hmac
import logging
import os
import signal
import socket
import sys
import traceback
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

import torch
from aiohttp import web
from pydantic import BaseModel, ValidationError

from engines.cpu.engine import TorchEngine
from engines.cpu.memory import KVPoolTooLarge
from engines.cpu.validation import EngineRequestError, shown
from engines.models import WeightsFileError
from engines.protocol import (
    AbortReq,
    BeginWeightUpdateReqInput,
    ContinueGenerationReqInput,
    DestroyWeightsUpdateGroupReqInput,
    EndWeightUpdateReqInput,
    GenerateReqInput,
    GetWeightsByNameReqInput,
    InitWeightsUpdateGroupReqInput,
    PauseGenerationReqInput,
    ReleaseMemoryOccupationReqInput,
    ResumeMemoryOccupationReqInput,
    UpdateWeightFromDiskReqInput,
    UpdateWeightsFromDistributedReqInput,
    UpdateWeightVersionReqInput,
)
from lifecycle.decide import jsonio

OPEN_PATH_PREFIXES = ("/health", "/ready", "/metrics")  # never behind the api key, as in SGLang

M = TypeVar("M", bound=BaseModel)
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


async def parse_body(request: web.Request, model: type[M]) -> M:
    """SGLang's request parsing: a body is required (``{}`` for defaults); errors are 400 validation bodies."""
    raw = await request.read()
    if not raw.strip():
        raise EngineRequestError(400, "body: Field required (send {} for the defaults)", "validation")
    try:  # the bounded reader: a body nested 100,000 deep is a 400 like any other bad JSON, not a 500
        data = jsonio.loads(raw, source="body", allow_nan=True, allow_duplicate_keys=True)
    except jsonio.JSONFileError as exc:
        raise EngineRequestError(400, f"body: JSON decode error ({exc.problem})", "validation") from None
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(
            f"body{''.join(f'.{p}' for p in e['loc'])}: {e['msg']} (got {shown(e.get('input'))})"
            for e in exc.errors()[:5]
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

    async def init_group(request: web.Request) -> web.Response:
        status, answer = await engine.init_weights_update_group(
            await parse_body(request, InitWeightsUpdateGroupReqInput)
        )
        return web.json_response(answer, status=status)

    async def update_distributed(request: web.Request) -> web.Response:
        body = await parse_body(request, UpdateWeightsFromDistributedReqInput)
        status, answer = await engine.update_weights_from_distributed(body)
        return web.json_response(answer, status=status)

    async def destroy_group(request: web.Request) -> web.Response:
        body = await parse_body(request, DestroyWeightsUpdateGroupReqInput)
        status, answer = await engine.destroy_weights_update_group(body)
        return web.json_response(answer, status=status)

    async def get_weights(request: web.Request) -> web.Response:
        body = await parse_body(request, GetWeightsByNameReqInput)
        return web.json_response(engine.get_weights_by_name(body.name, body.truncate_size))

    async def begin_update(request: web.Request) -> web.Response:
        await parse_body(request, BeginWeightUpdateReqInput)
        status, answer = engine.begin_weight_update()
        return web.json_response(answer, status=status)

    async def end_update(request: web.Request) -> web.Response:
        await parse_body(request, EndWeightUpdateReqInput)
        status, answer = engine.end_weight_update()
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
        (("POST",), "/begin_weight_update", begin_update),
        (("POST",), "/end_weight_update", end_update),
        (("POST",), "/update_weight_version", update_weight_version),
        (("POST",), "/init_weights_update_group", init_group),
        (("POST",), "/update_weights_from_distributed", update_distributed),
        (("POST",), "/destroy_weights_update_group", destroy_group),
        (("GET", "POST"), "/get_weights_by_name", get_weights),
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
        group_timeout=args.weight_group_timeout_s,
    )
    try:
        engine.load()
    except WeightsFileError as exc:
        print(f"lifecycle-torch-engine: error: --weights: {exc}", file=sys.stderr, flush=True)
        return 2
    except KVPoolTooLarge as exc:
        print(f"lifecycle-torch-engine: error: {exc}", file=sys.stderr, flush=True)
        return 2
    asyncio.run(_serve(engine, sock, args))
    return 0


class _QuietPreface(logging.Filter):
    """A gateway (SMG, sglang-router) may probe a worker it registers for gRPC (an HTTP/2 preface, ``PRI *
    HTTP/2.0``); the 400 aiohttp answers is the HTTP-only answer the router expects, so its traceback is noise,
    not an error."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        return not (exc is not None and "PRI/Upgrade" in str(exc))


async def _serve(engine: TorchEngine, sock: socket.socket, args: argparse.Namespace) -> None:
    logging.getLogger("aiohttp.server").addFilter(_QuietPreface())
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
