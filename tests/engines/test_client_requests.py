"""What EngineClient really puts on the wire, and how it reports failures -- against real servers.

A tiny aiohttp server captures every request the client sends; each captured body is validated
against SGLang's resolved request schema (``sglang-lifecycle-endpoints.json``), with its method,
path and auth header. Failures come from real sockets: a slow handler (timeout), a closed port
(refused), a handler that drops the connection (reset), a 500, a non-JSON 200.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import jsonschema
import pytest
from aiohttp import web

from engines.client import EngineClient
from engines.errors import (
    EngineError,
    EngineHTTPError,
    EngineProtocolError,
    EngineTimeout,
    EngineUnreachable,
)
from engines.protocol import PauseMode, SamplingParams
from lifecycle.decide.errors import LifecycleError
from tests.helpers import free_port


@dataclass
class Captured:
    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]
    body: bytes


def _generate_answer(body: dict[str, Any]) -> Any:
    def one(i: int) -> dict[str, Any]:
        meta = {"id": f"r{i}", "finish_reason": {"type": "length", "length": 2}, "prompt_tokens": 3}
        meta |= {"completion_tokens": 2, "cached_tokens": 0, "weight_version": "default", "e2e_latency": 0.01}
        if body.get("return_logprob"):
            meta["output_token_logprobs"] = [[-1.0, 5, None], [-2.0, 6, None]]
        return {"text": "ab", "output_ids": [5, 6], "meta_info": meta}

    prompts = body.get("text", body.get("input_ids"))
    if isinstance(prompts, list) and prompts and not isinstance(prompts[0], int):
        return [one(i) for i in range(len(prompts))]
    return one(0)


CANNED: dict[str, Callable[[dict[str, Any]], web.Response]] = {
    "/health": lambda b: web.Response(status=200),
    "/health_generate": lambda b: web.Response(status=200),
    "/server_info": lambda b: web.json_response({"version": "0.5.23", "internal_states": [{}], "port": 1}),
    "/model_info": lambda b: web.json_response({"model_path": "m", "weight_version": "v7", "is_generation": True}),
    "/generate": lambda b: web.json_response(_generate_answer(b)),
    "/flush_cache": lambda b: web.Response(text="Cache flushed.\n"),
    "/update_weights_from_disk": lambda b: web.json_response(
        {"success": True, "message": "ok", "num_paused_requests": 0}
    ),
    "/update_weight_version": lambda b: web.json_response(
        {"success": True, "message": "ok", "new_version": b["new_version"]}
    ),
    "/release_memory_occupation": lambda b: web.json_response(None),
    "/resume_memory_occupation": lambda b: web.json_response(None),
    "/pause_generation": lambda b: web.json_response({"message": "Generation paused successfully.", "status": "ok"}),
    "/continue_generation": lambda b: web.json_response(
        {"message": "Generation continued successfully.", "status": "ok"}
    ),
    "/abort_request": lambda b: web.Response(status=200),
}

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@asynccontextmanager
async def capture_server(override: dict[str, Handler] | None = None) -> AsyncIterator[tuple[str, list[Captured]]]:
    captured: list[Captured] = []

    async def handle(request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        captured.append(Captured(request.method, request.path, dict(request.query), dict(request.headers), raw))
        if override and request.path in override:
            return await override[request.path](request)
        return CANNED[request.path](json.loads(raw) if raw else {})

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"http://127.0.0.1:{port}", captured
    finally:
        await runner.cleanup()


async def _exercise_every_method(client: EngineClient) -> dict[str, Any]:
    """Call every endpoint method, with and without options; return what came back."""
    results: dict[str, Any] = {}
    await client.health()
    await client.health_generate()
    results["server_info"] = await client.server_info()
    results["model_info"] = await client.model_info()
    results["generate"] = await client.generate(
        "hi", sampling_params=SamplingParams(max_new_tokens=4, temperature=0.0), return_logprob=True, rid="req-1"
    )
    results["generate_ids"] = await client.generate(input_ids=[1, 5, 6], sampling_params={"max_new_tokens": 2})
    results["batch"] = await client.generate_batch(
        ["a", "b"], sampling_params=[SamplingParams(temperature=0.5), {"top_p": 0.9}], rids=["x", "y"]
    )
    results["batch_ids"] = await client.generate_batch(input_ids=[[1, 5], [1, 6]], return_logprob=True)
    results["flush"] = await client.flush_cache()
    await client.flush_cache(wait=2.5)
    results["update"] = await client.update_weights_from_disk("/w/model.safetensors")
    await client.update_weights_from_disk(
        "/w/m.pt", weight_version="v2", load_format="pt", flush_cache=False, abort_all_requests=True
    )
    results["version"] = await client.update_weight_version("v3")
    await client.update_weight_version("v4", abort_all_requests=False)
    await client.release_memory_occupation()
    await client.release_memory_occupation(["weights"])
    await client.resume_memory_occupation(["weights", "kv_cache"])
    await client.resume_memory_occupation()
    modes: tuple[PauseMode, ...] = ("abort", "retract", "in_place")
    for mode in modes:
        results[f"pause_{mode}"] = await client.pause_generation(mode)
    results["continue"] = await client.continue_generation()
    await client.abort_request("req-1")
    await client.abort_request(abort_all=True, abort_message="bye")
    return results


def test_every_request_matches_sglangs_schema_method_and_auth(contracts):
    async def main() -> tuple[list[Captured], dict[str, Any]]:
        async with (
            capture_server() as (url, captured),
            EngineClient(url, engine_id="e0", api_key="sekret", timeout=5.0) as client,
        ):
            results = await _exercise_every_method(client)
        return captured, results

    captured, results = asyncio.run(main())
    assert len(captured) == 24
    for req in captured:
        endpoint = contracts.endpoint(req.path)
        assert req.method in endpoint["methods"], f"{req.method} {req.path}"
        assert req.headers.get("Authorization") == "Bearer sekret", req.path
        spec = endpoint["request_body"]
        if spec is None:
            assert req.body == b"", f"{req.path} takes no body"
            continue
        assert req.body, f"{req.path}: SGLang needs a body even when every field is optional"
        assert req.headers["Content-Type"].startswith("application/json")
        body = json.loads(req.body)
        jsonschema.Draft202012Validator(spec["schema"]).validate(body)
        unknown = set(body) - set(spec["schema"]["properties"])
        assert not unknown, f"{req.path}: fields SGLang does not know: {unknown}"
        for params in [body.get("sampling_params")] if isinstance(body.get("sampling_params"), dict) else []:
            assert set(params) <= set(SamplingParams.model_fields)

    by_path = [(r.path, json.loads(r.body) if r.body else None, r.query) for r in captured]
    # only what the caller set is sent (the server's defaults apply to the rest)
    assert (
        "/generate",
        {
            "text": "hi",
            "sampling_params": {"max_new_tokens": 4, "temperature": 0.0},
            "return_logprob": True,
            "rid": "req-1",
        },
        {},
    ) in by_path
    assert ("/generate", {"input_ids": [1, 5, 6], "sampling_params": {"max_new_tokens": 2}}, {}) in by_path
    assert (
        "/generate",
        {"text": ["a", "b"], "sampling_params": [{"temperature": 0.5}, {"top_p": 0.9}], "rid": ["x", "y"]},
        {},
    ) in by_path
    assert ("/release_memory_occupation", {}, {}) in by_path
    assert ("/release_memory_occupation", {"tags": ["weights"]}, {}) in by_path
    assert ("/resume_memory_occupation", {"tags": ["weights", "kv_cache"]}, {}) in by_path
    assert ("/update_weights_from_disk", {"model_path": "/w/model.safetensors"}, {}) in by_path
    assert (
        "/update_weights_from_disk",
        {
            "model_path": "/w/m.pt",
            "weight_version": "v2",
            "load_format": "pt",
            "flush_cache": False,
            "abort_all_requests": True,
        },
        {},
    ) in by_path
    assert ("/update_weight_version", {"new_version": "v4", "abort_all_requests": False}, {}) in by_path
    assert [b for p, b, _ in by_path if p == "/pause_generation"] == [
        {"mode": m} for m in ("abort", "retract", "in_place")
    ]
    assert ("/continue_generation", {}, {}) in by_path
    assert ("/abort_request", {"rid": "req-1"}, {}) in by_path
    assert ("/abort_request", {"abort_all": True, "abort_message": "bye"}, {}) in by_path
    assert ("/flush_cache", None, {"timeout": "2.5"}) in by_path

    # answers parsed into the protocol models
    assert results["model_info"].weight_version == "v7"
    assert results["generate"].meta_info.output_token_logprobs == [(-1.0, 5, None), (-2.0, 6, None)]
    assert [r.meta_info.id for r in results["batch"]] == ["r0", "r1"]
    assert results["update"].success and results["version"].new_version == "v3"
    assert results["pause_retract"].status == "ok" and results["flush"].startswith("Cache flushed.")


def test_no_auth_header_without_api_key():
    async def main() -> list[Captured]:
        async with capture_server() as (url, captured), EngineClient(url, engine_id="e0") as client:
            await client.health()
            await client.pause_generation("in_place")
        return captured

    assert all("Authorization" not in c.headers for c in asyncio.run(main()))


def test_bad_arguments_fail_before_any_request():
    client = EngineClient("http://127.0.0.1:1", engine_id="e0")
    with pytest.raises(ValueError, match="exactly one of text= or input_ids="):
        asyncio.run(client.generate())
    with pytest.raises(ValueError, match="2 sampling_params for 3 prompts"):
        asyncio.run(client.generate_batch(["a", "b", "c"], sampling_params=[{}, {}]))
    with pytest.raises(ValueError, match="rid= or abort_all=True"):
        asyncio.run(client.abort_request())
    with pytest.raises(ValueError, match="base_url"):
        EngineClient("127.0.0.1:30000", engine_id="e0")
    with pytest.raises(ValueError, match="timeout"):
        EngineClient("http://127.0.0.1:1", engine_id="e0", timeout=0)


def test_typed_errors_name_engine_and_endpoint():
    async def slow(request: web.Request) -> web.Response:
        await asyncio.sleep(0.5)
        return web.Response(status=200)

    async def fail(request: web.Request) -> web.Response:
        return web.json_response({"error": {"message": "boom"}}, status=500)

    async def garbage(request: web.Request) -> web.Response:
        return web.Response(text="<html>not json</html>")

    async def wrong_shape(request: web.Request) -> web.Response:
        return web.json_response({"message": "no model_path here"})

    async def drop(request: web.Request) -> web.Response:
        assert request.transport is not None
        request.transport.abort()  # connection reset mid-request
        await asyncio.sleep(0.2)
        return web.Response(status=200)

    async def unavailable(request: web.Request) -> web.Response:
        return web.Response(status=503)

    overrides: dict[str, Handler] = {
        "/health": slow,
        "/server_info": fail,
        "/model_info": garbage,
        "/pause_generation": wrong_shape,
        "/flush_cache": drop,
        "/health_generate": unavailable,
    }

    async def main() -> dict[str, EngineError]:
        errors: dict[str, EngineError] = {}
        async with capture_server(overrides) as (url, _), EngineClient(url, engine_id="e7", timeout=5.0) as client:
            calls: dict[str, Callable[[], Awaitable[object]]] = {
                "timeout": lambda: client.health(timeout=0.1),
                "http": client.server_info,
                "not_json": client.model_info,
                "wrong_shape": lambda: client.pause_generation("abort"),
                "reset": client.flush_cache,
                "503": client.health_generate,
            }
            for name, call in calls.items():
                try:
                    await call()
                except EngineError as exc:
                    errors[name] = exc
        async with EngineClient(f"http://127.0.0.1:{free_port()}", engine_id="e8") as gone:
            try:
                await gone.generate("x")
            except EngineError as exc:
                errors["refused"] = exc
        return errors

    errors = asyncio.run(main())
    assert isinstance(errors["timeout"], EngineTimeout) and isinstance(errors["timeout"], TimeoutError)
    assert errors["timeout"].endpoint == "/health" and errors["timeout"].timeout == 0.1
    assert isinstance(errors["http"], EngineHTTPError) and errors["http"].status == 500
    assert json.loads(errors["http"].body) == {"error": {"message": "boom"}}
    assert type(errors["not_json"]) is EngineProtocolError and errors["not_json"].endpoint == "/model_info"
    assert type(errors["wrong_shape"]) is EngineProtocolError and "PauseGenerationResponse" in str(
        errors["wrong_shape"]
    )
    assert isinstance(errors["reset"], EngineUnreachable) and errors["reset"].endpoint == "/flush_cache"
    assert isinstance(errors["503"], EngineHTTPError) and errors["503"].status == 503 and errors["503"].body == ""
    assert isinstance(errors["refused"], EngineUnreachable) and isinstance(errors["refused"], ConnectionError)
    assert errors["refused"].engine_id == "e8" and errors["refused"].endpoint == "/generate"
    for exc in errors.values():
        assert isinstance(exc, LifecycleError)
        assert str(exc).startswith(f"engine {exc.engine_id} {exc.endpoint}: ")


def test_async_with_closes_the_session():
    async def main() -> tuple[bool, bool, bool]:
        async with capture_server() as (url, _):
            client = EngineClient(url, engine_id="e0")
            async with client:
                await client.health()
                open_inside = not client.closed
            closed_after = client.closed
            await client.health()  # a later call opens a fresh session
            reopened = not client.closed
            await client.close()
            return open_inside, closed_after, reopened

    assert asyncio.run(main()) == (True, True, True)
