"""engines.protocol against SGLang 0.5.23's own OpenAPI schema.

Every field a request model declares must exist in SGLang's component schema with the same JSON
type and the same default, and the model must sit on the endpoint whose request body it claims.
Endpoints covered (request body schema in brackets):

    /generate [GenerateReqInput], /update_weights_from_disk [UpdateWeightFromDiskReqInput],
    /update_weight_version [UpdateWeightVersionReqInput],
    /release_memory_occupation [ReleaseMemoryOccupationReqInput],
    /resume_memory_occupation [ResumeMemoryOccupationReqInput],
    /pause_generation [PauseGenerationReqInput], /continue_generation [ContinueGenerationReqInput],
    /abort_request [AbortReq]; and body-less /health, /health_generate, /server_info, /model_info,
    /flush_cache (method and query parameter checked).
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import BaseModel

from engines import protocol

MODELS: dict[str, type[BaseModel]] = {
    "/generate": protocol.GenerateReqInput,
    "/update_weights_from_disk": protocol.UpdateWeightFromDiskReqInput,
    "/update_weight_version": protocol.UpdateWeightVersionReqInput,
    "/begin_weight_update": protocol.BeginWeightUpdateReqInput,
    "/end_weight_update": protocol.EndWeightUpdateReqInput,
    "/release_memory_occupation": protocol.ReleaseMemoryOccupationReqInput,
    "/resume_memory_occupation": protocol.ResumeMemoryOccupationReqInput,
    "/pause_generation": protocol.PauseGenerationReqInput,
    "/continue_generation": protocol.ContinueGenerationReqInput,
    "/init_weights_update_group": protocol.InitWeightsUpdateGroupReqInput,
    "/update_weights_from_distributed": protocol.UpdateWeightsFromDistributedReqInput,
    "/destroy_weights_update_group": protocol.DestroyWeightsUpdateGroupReqInput,
    "/abort_request": protocol.AbortReq,
}
BODYLESS = {"/health": {"GET"}, "/health_generate": {"GET"}, "/server_info": {"GET"}, "/model_info": {"GET"}}

# Fields SGLang leaves untyped in the schema (a custom validator) that we model with their real type
# (from response_from_source: "input_ids is untyped in the spec; real type list[int] | list[list[int]]").
# Allowed only while SGLang's side stays untyped; if SGLang types it, the exact comparison applies.
NARROWED_UNTYPED = {("GenerateReqInput", "input_ids")}

_MISSING = object()


def normalise(schema: dict[str, Any]) -> Any:
    """A JSON schema without titles/defaults, anyOf branches in a canonical order."""
    out = {k: v for k, v in schema.items() if k not in ("title", "description", "default")}
    if "anyOf" in out:
        out["anyOf"] = sorted((normalise(s) for s in out["anyOf"]), key=lambda s: json.dumps(s, sort_keys=True))
    if isinstance(out.get("items"), dict):
        out["items"] = normalise(out["items"])
    if isinstance(out.get("additionalProperties"), dict):
        out["additionalProperties"] = normalise(out["additionalProperties"])
    return out


def field_default(prop: dict[str, Any], required: bool) -> Any:
    """SGLang omits ``default`` for Optional fields defaulting to None; a required field has none."""
    if required:
        return _MISSING
    return prop.get("default")


def drift(model: type[BaseModel], sglang: dict[str, Any]) -> list[str]:
    """Every difference between the fields ``model`` declares and SGLang's schema ``sglang``."""
    ours = model.model_json_schema()
    name = model.__name__
    problems = []
    for field, prop in ours["properties"].items():
        theirs = sglang["properties"].get(field)
        if theirs is None:
            problems.append(f"{name}.{field}: not a field of SGLang's {sglang.get('title', name)}")
            continue
        our_type, their_type = normalise(prop), normalise(theirs)
        if our_type != their_type and not ((name, field) in NARROWED_UNTYPED and their_type == {}):
            problems.append(f"{name}.{field}: type {our_type} != SGLang's {their_type}")
        our_req, their_req = field in ours.get("required", []), field in sglang.get("required", [])
        if our_req != their_req:
            problems.append(f"{name}.{field}: required={our_req}, SGLang required={their_req}")
        ours_default, theirs_default = field_default(prop, our_req), field_default(theirs, their_req)
        if ours_default != theirs_default:
            problems.append(f"{name}.{field}: default {ours_default!r} != SGLang's {theirs_default!r}")
    missing_required = set(sglang.get("required", [])) - set(ours["properties"])
    problems += [f"{name}: SGLang requires {f!r}, not modelled" for f in sorted(missing_required)]
    return problems


@pytest.mark.parametrize("path", sorted(MODELS))
def test_request_model_matches_sglang_schema(contracts, path):
    model = MODELS[path]
    endpoint = contracts.endpoint(path)
    assert endpoint["request_body"] is not None, f"{path} takes no body in SGLang"
    schema_name = endpoint["request_body"]["schema_name"]
    assert schema_name == model.__name__, f"{path} takes {schema_name}, modelled as {model.__name__}"
    assert drift(model, contracts.schemas[schema_name]) == []


def test_get_weights_by_name_matches_sglangs_openapi(contracts):
    """/get_weights_by_name is outside the lifecycle subset: its body is checked against the full OpenAPI schema."""
    for method in ("get", "post"):
        body = contracts.openapi["paths"]["/get_weights_by_name"][method]["requestBody"]
        assert body["content"]["application/json"]["schema"]["$ref"].endswith("/GetWeightsByNameReqInput")
    assert drift(protocol.GetWeightsByNameReqInput, contracts.schemas["GetWeightsByNameReqInput"]) == []


def test_every_request_model_field_is_an_sglang_field(contracts):
    """Field names alone, across all models (a typo anywhere is one clear line)."""
    unknown = [
        f"{m.__name__}.{f}"
        for m in MODELS.values()
        for f in m.model_fields
        if f not in contracts.schemas[m.__name__]["properties"]
    ]
    assert unknown == []


def test_the_drift_check_catches_a_changed_default_type_and_name(contracts):
    """The comparison above can fail: three deliberate drifts are each reported."""

    class PauseGenerationReqInput(BaseModel):
        mode: str = "retract"  # SGLang: enum, default "abort"

    class UpdateWeightVersionReqInput(BaseModel):
        new_version: str
        abort_all_request: bool = True  # misspelled

    class ReleaseMemoryOccupationReqInput(BaseModel):
        tags: list[int] | None = None  # SGLang: list[str]

    schemas = contracts.schemas
    pause = drift(PauseGenerationReqInput, schemas["PauseGenerationReqInput"])
    assert any("type" in p for p in pause) and any("default 'retract'" in p for p in pause)
    assert any(
        "abort_all_request" in p for p in drift(UpdateWeightVersionReqInput, schemas["UpdateWeightVersionReqInput"])
    )
    assert any(
        "tags: type" in p for p in drift(ReleaseMemoryOccupationReqInput, schemas["ReleaseMemoryOccupationReqInput"])
    )


@pytest.mark.parametrize("path", sorted(MODELS))
def test_sglang_requires_a_body_on_every_modelled_endpoint(contracts, path):
    body = contracts.endpoint(path)["request_body"]
    assert body["required"] is True and body["content_type"] == "application/json"


@pytest.mark.parametrize(("path", "methods"), sorted(BODYLESS.items()))
def test_bodyless_endpoints_are_get_without_body(contracts, path, methods):
    endpoint = contracts.endpoint(path)
    assert set(endpoint["methods"]) == methods
    assert endpoint["request_body"] is None


def test_flush_cache_methods_and_timeout_query(contracts):
    endpoint = contracts.endpoint("/flush_cache")
    assert set(endpoint["methods"]) == {"GET", "POST"}
    assert [(p["name"], p["in"], p["type"], p["default"]) for p in endpoint["parameters"]] == [
        ("timeout", "query", "number", 0.0)
    ]


def test_pause_modes_are_sglangs(contracts):
    mode = contracts.schemas["PauseGenerationReqInput"]["properties"]["mode"]
    assert tuple(mode["enum"]) == protocol.PAUSE_MODES


def test_sampling_params_are_a_free_object_in_the_schema(contracts):
    """SGLang's schema does not type sampling_params; our strict SamplingParams is the contract gate's view."""
    prop = contracts.schemas["GenerateReqInput"]["properties"]["sampling_params"]
    assert normalise(prop) == normalise(protocol.GenerateReqInput.model_json_schema()["properties"]["sampling_params"])
    assert set(protocol.SamplingParams.model_fields).isdisjoint(protocol.SGLANG_ONLY_SAMPLING_KEYS)
