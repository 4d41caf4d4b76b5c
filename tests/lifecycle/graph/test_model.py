"""The graph model (JSON schema rl-lifecycle/graph@1) against the compiled specs it comes from."""

from __future__ import annotations

import json

import pytest

from lifecycle.decide.machines import ENGINE, MACHINES, MONITOR
from lifecycle.decide.presets import PRESETS, preset
from lifecycle.decide.spec import Blocked, Step
from lifecycle.graph import SCHEMA, edge_ids_guarded_by, edge_label, graph_document, machine_graph, to_json


@pytest.fixture(scope="module")
def docs():
    return {p: json.loads(to_json(graph_document(preset(p), preset_name=p))) for p in PRESETS}


def test_document_has_the_documented_shape(docs):
    doc = docs["ft-rollout"]
    assert doc["schema"] == SCHEMA == "rl-lifecycle/graph@1"
    assert list(doc["machines"]) == list(MACHINES)
    assert doc["config"]["preset"] == "ft-rollout"
    assert doc["config"]["predicates"]["rollout_ft"] is True
    engine = doc["machines"]["engine"]
    assert set(engine) == {"name", "doc", "initial", "states", "edges"}
    assert set(engine["states"][0]) == {"name", "terminal", "marked", "reachable", "doc"}
    edge = next(e for e in engine["edges"] if e["id"] == "Unhealthy:recover:Recovering")
    assert edge["guards"] == [
        {"predicate": "rollout_ft", "negated": False, "value": True},
        {"predicate": "external_engines", "negated": True, "value": False},
    ]
    assert edge["active"] is True
    assert [(x["name"], x["when"], x["active"]) for x in edge["effects"]] == [
        ("recover_engine", None, True),
        ("kill_engine", None, True),
    ]


@pytest.mark.lifecycle_gate
def test_engine_ft_train_vs_ft_rollout_differs_exactly_at_rollout_ft_edges(docs):
    """Issue 4.6: the only edges whose activity flips are the ones guarded by rollout_ft."""
    train = {e["id"]: e["active"] for e in docs["ft-train"]["machines"]["engine"]["edges"]}
    roll = {e["id"]: e["active"] for e in docs["ft-rollout"]["machines"]["engine"]["edges"]}
    assert train.keys() == roll.keys()
    flipped = {eid for eid in train if train[eid] != roll[eid]}
    guarded = edge_ids_guarded_by(docs["ft-rollout"]["machines"]["engine"], "rollout_ft")
    assert flipped == {"Unhealthy:recover:Recovering", "Unhealthy:fail:Failed", "Serving:republish:Serving"}
    # detach also names rollout_ft, but it needs external engines too (off in both presets)
    assert guarded == flipped | {"Unhealthy:detach:Stopping"}


@pytest.mark.parametrize("name", PRESETS)
def test_activity_and_effects_agree_with_the_compiled_table(name):
    """Every active edge is the Step the runtime would take, with the same effects; inactive ones are not."""
    config = preset(name)
    for spec in MACHINES.values():
        compiled = spec.compile(config)
        graph = machine_graph(spec, config)
        assert len(graph["edges"]) == sum(len(t.source) for t in spec.transitions)
        for e in graph["edges"]:
            out = compiled.table[(e["source"], e["trigger"])]
            if e["active"]:
                assert isinstance(out, Step)
                assert out.dest == e["dest"]
                assert out.effects == tuple(x["name"] for x in e["effects"] if x["active"])
            else:
                assert isinstance(out, Blocked) or out.dest != e["dest"]
                assert any(g["value"] == g["negated"] for g in e["guards"])


def test_gated_effects_follow_their_predicate(docs):
    def servers_ready(preset_name):
        edges = docs[preset_name]["machines"]["rollout"]["edges"]
        return {x["name"]: x["active"] for x in next(e for e in edges if e["trigger"] == "servers_ready")["effects"]}

    assert servers_ready("ft-rollout")["start_monitor"] is True
    assert servers_ready("ft-train")["start_monitor"] is False
    ready = next(e for e in docs["ft-train"]["machines"]["rollout"]["edges"] if e["trigger"] == "servers_ready")
    assert "start_monitor" not in edge_label(ready)
    assert "start_eval_fleet if eval_fleet_enabled" in edge_label(ready)


@pytest.mark.recovery
def test_reachability_marks_replay_and_recovery(docs):
    def reachable(p, machine):
        return {s["name"] for s in docs[p]["machines"][machine]["states"] if s["reachable"]}

    assert reachable("replay", "rollout") == {"Init", "Replay", "Disposed"}
    assert "Recovering" not in reachable("ft-train", "engine")
    assert "Recovering" in reachable("ft-rollout", "engine")
    assert reachable("no-ft", "monitor") == {"Init", "Stopped"}  # never created: only disposed


def test_prune_keeps_only_what_the_config_can_do():
    graph = machine_graph(ENGINE, preset("ft-train"), prune=True)
    assert all(e["active"] for e in graph["edges"])
    names = {s["name"] for s in graph["states"]}
    assert "Recovering" not in names
    assert {e["source"] for e in graph["edges"]} <= names
    assert {e["dest"] for e in graph["edges"]} <= names
    edges = machine_graph(MONITOR, preset("no-ft"), prune=True)["edges"]
    assert [(e["trigger"], e["effects"]) for e in edges] == [("dispose", [])]  # no probe, no start


@pytest.mark.determinism
def test_output_is_deterministic():
    a = to_json(graph_document(preset("ft-both"), preset_name="ft-both"))
    MACHINES["engine"]._compiled.clear()  # a cold compile must give the same bytes
    b = to_json(graph_document(preset("ft-both"), preset_name="ft-both"))
    assert a == b


def test_edge_ids_are_unique_per_machine(docs):
    for doc in docs.values():
        for machine in doc["machines"].values():
            ids = [e["id"] for e in machine["edges"]]
            assert len(ids) == len(set(ids))
