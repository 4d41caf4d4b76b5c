"""Comparing a graph export with the specs as they are now (the review page's ``--compare``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from lifecycle.decide.config import LifecycleConfig
from lifecycle.decide.errors import LifecycleError
from lifecycle.decide.presets import PRESET_FLAGS, preset
from lifecycle.graph.model import EdgeJSON, GraphJSON, MachineJSON, edge_label


def _edge_fingerprint(edge: EdgeJSON | Mapping[str, Any]) -> dict[str, Any]:
    return {"guards": edge["guards"], "active": edge["active"], "effects": edge["effects"]}


def diff_machines(ref: Mapping[str, Any], cur: MachineJSON) -> dict[str, Any]:
    """Edges added, removed and changed (guards, activity or effects) from ``ref`` to ``cur``."""
    ref_edges = {e["id"]: e for e in ref.get("edges", [])}
    cur_edges = {e["id"]: e for e in cur["edges"]}
    changed = []
    for eid, e in cur_edges.items():
        old = ref_edges.get(eid)
        if old is None:
            continue
        fields = [k for k in ("guards", "active", "effects") if _edge_fingerprint(old)[k] != _edge_fingerprint(e)[k]]
        if fields:
            changed.append(
                {
                    "id": eid,
                    "fields": fields,
                    "before": edge_label(old),
                    "after": edge_label(e),
                    "active_before": old["active"],
                    "active_after": e["active"],
                }
            )
    ref_states = [s["name"] for s in ref.get("states", [])]
    cur_states = [s["name"] for s in cur["states"]]
    return {
        "added": [{"id": eid, "label": edge_label(e)} for eid, e in cur_edges.items() if eid not in ref_edges],
        "removed": [{"id": eid, "label": edge_label(e)} for eid, e in ref_edges.items() if eid not in cur_edges],
        "changed": changed,
        "states_added": [s for s in cur_states if s not in ref_states],
        "states_removed": [s for s in ref_states if s not in cur_states],
    }


def reference_config(ref: GraphJSON) -> tuple[LifecycleConfig, str | None]:
    """The config a reference export was made under (its preset, else its recorded values)."""
    cfg = ref.get("config") or {}
    name = cfg.get("preset")
    if name in PRESET_FLAGS:
        return preset(name), name
    values = cfg.get("values")
    if not isinstance(values, dict):
        raise LifecycleError("the reference JSON has neither a known preset nor config values to compare under")
    return LifecycleConfig.from_mapping(values, check_paths=False), None
