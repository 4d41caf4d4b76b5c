"""The graph model: one JSON-ready document (schema ``rl-lifecycle/graph@1``, ``docs/graphs/SCHEMA.md``)
per config, built from the compiled specs; every rendering (mermaid, DOT, review page) reads it."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TypedDict

from lifecycle.decide import jsonio
from lifecycle.decide.config import LifecycleConfig
from lifecycle.decide.errors import ConfigError, LifecycleError, bounded_repr
from lifecycle.decide.machines import MACHINES
from lifecycle.decide.predicates import evaluate
from lifecycle.decide.presets import PRESET_FLAGS
from lifecycle.decide.schema import SchemaError, checker
from lifecycle.decide.spec import MachineSpec, Step

SCHEMA = "rl-lifecycle/graph@1"
INACTIVE_MARK = "✗"


# -- the model (JSON schema rl-lifecycle/graph@1) ---------------------------------------------------
class GuardJSON(TypedDict):
    predicate: str
    negated: bool
    value: bool


class EffectJSON(TypedDict):
    name: str
    when: str | None
    active: bool


class EdgeJSON(TypedDict):
    id: str
    trigger: str
    source: str
    dest: str
    guards: list[GuardJSON]
    active: bool
    effects: list[EffectJSON]
    doc: str


class StateJSON(TypedDict):
    name: str
    terminal: bool
    marked: bool
    reachable: bool
    doc: str


class MachineJSON(TypedDict):
    name: str
    doc: str
    initial: str
    states: list[StateJSON]
    edges: list[EdgeJSON]


class ConfigJSON(TypedDict):
    preset: str | None
    mode: str
    flags: list[str]
    values: dict[str, Any]
    predicates: dict[str, bool]


class GraphJSON(TypedDict):
    schema: str
    pruned: bool
    config: ConfigJSON
    machines: dict[str, MachineJSON]


_CHECK_GRAPH = checker(GraphJSON)  # what load_json checks an export against: the type graph_document returns
_REWRITE = "write the reference again with `lifecycle graph --format json -o FILE` (on the commit to compare with)"


def guard_text(guard: GuardJSON) -> str:
    """``rollout_ft=true`` or ``!rollout_ft (rollout_ft=false)``: the guard as written, with its value."""
    value = "true" if guard["value"] else "false"
    if guard["negated"]:
        return f"!{guard['predicate']} ({guard['predicate']}={value})"
    return f"{guard['predicate']}={value}"


def edge_label(edge: EdgeJSON) -> str:
    """``trigger [guards] / effects`` with only the effects that happen under the config."""
    label = edge["trigger"]
    if edge["guards"]:
        label += " [" + ", ".join(guard_text(g) for g in edge["guards"]) + "]"
    effects = [e["name"] + (f" if {e['when']}" if e["when"] else "") for e in edge["effects"] if e["active"]]
    if effects:
        label += " / " + ", ".join(effects)
    return label


def machine_graph(spec: MachineSpec, config: LifecycleConfig, *, prune: bool = False) -> MachineJSON:
    """One machine under ``config``: every state and edge, with guard values and activity.

    ``active`` comes from the compiled lookup table (the runtime's own answer), not from
    re-evaluating guards here, so the graph shows what the machine will do.
    """
    compiled = spec.compile(config)
    values = compiled.values
    reachable, _ = compiled.reachable()
    edges: list[EdgeJSON] = []
    seen: dict[str, int] = {}
    for t in spec.transitions:
        for src in t.source:
            out = compiled.table.get((src, t.trigger))
            active = isinstance(out, Step) and out.transition is t
            if prune and not (active and src in reachable):
                continue
            edge_id = f"{src}:{t.trigger}:{t.dest}"
            seen[edge_id] = seen.get(edge_id, 0) + 1
            if seen[edge_id] > 1:  # same hop under exclusive guards: keep ids unique and stable
                edge_id += f"#{seen[edge_id]}"
            edges.append(
                {
                    "id": edge_id,
                    "trigger": t.trigger,
                    "source": src,
                    "dest": t.dest,
                    "guards": [
                        {"predicate": g.predicate, "negated": g.negated, "value": values[g.predicate]} for g in t.guards
                    ],
                    "active": active,
                    "effects": [
                        {
                            "name": e.name,
                            "when": None if e.when is None else str(e.when),
                            "active": e.when is None or e.when.value(values),
                        }
                        for e in t.effects
                    ],
                    "doc": t.doc,
                }
            )
    states: list[StateJSON] = [
        {"name": s.name, "terminal": s.terminal, "marked": s.marked, "reachable": s.name in reachable, "doc": s.doc}
        for s in spec.states
        if not prune or s.name in reachable
    ]
    return {"name": spec.name, "doc": spec.doc, "initial": spec.initial, "states": states, "edges": edges}


def config_json(config: LifecycleConfig, preset_name: str | None = None) -> ConfigJSON:
    """Enough about the config to label a graph and to rebuild the config (``values``)."""
    return {
        "preset": preset_name,
        "mode": config.mode,
        "flags": config.to_flags(),
        "values": config.to_dict(),
        "predicates": evaluate(config),
    }


def graph_document(
    config: LifecycleConfig,
    machines: Sequence[str] | None = None,
    *,
    preset_name: str | None = None,
    prune: bool = False,
) -> GraphJSON:
    """The JSON document (schema ``rl-lifecycle/graph@1``) for some machines under ``config``."""
    names = list(MACHINES) if machines is None else list(machines)
    for name in names:
        if name not in MACHINES:
            raise LifecycleError(f"unknown machine {name!r}; known: {', '.join(MACHINES)}")
    return {
        "schema": SCHEMA,
        "pruned": prune,
        "config": config_json(config, preset_name),
        "machines": {name: machine_graph(MACHINES[name], config, prune=prune) for name in names},
    }


def to_json(doc: GraphJSON) -> str:
    return json.dumps(doc, indent=2, ensure_ascii=False) + "\n"


def load_json(path: str | Path) -> GraphJSON:
    """Read a JSON export, refusing other schemas (a version bump means the reader must change), a field typed
    otherwise than :func:`graph_document` writes it, and config values this version cannot build a config from
    (the review compares under them)."""
    p = Path(path)
    try:  # bounded and strict: a deep or huge-number file is this one error, not a RecursionError
        data = jsonio.read_json(p)
    except jsonio.JSONFileError as exc:
        raise ConfigError(
            "--compare",
            str(p),
            f"cannot read the graph JSON (it {exc.problem})",
            "write one with `lifecycle graph --format json -o FILE`",
        ) from None
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        found = data.get("schema") if isinstance(data, dict) else type(data).__name__
        raise ConfigError(
            "--compare",
            str(p),
            f"the file is not a {SCHEMA} export (schema: {found!r})",
            "write one with `lifecycle graph --format json -o FILE`",
        )
    wrong = _CHECK_GRAPH(data)
    if wrong is not None:
        problem = SchemaError(p, wrong, what=f"not a {SCHEMA} export", fix=_REWRITE).problem
        raise ConfigError("--compare", str(p), problem, _REWRITE)
    config: ConfigJSON = data["config"]
    if config["preset"] not in PRESET_FLAGS:  # the export is compared under its own values: they must make a config
        try:
            LifecycleConfig.from_mapping(config["values"], check_paths=False)
        except ConfigError as exc:
            problem = (
                f"field 'config.values' is not a config this version accepts ({exc.flag}: {exc.problem}, "
                f"got {bounded_repr(exc.value)})"
            )
            raise ConfigError("--compare", str(p), problem, _REWRITE) from None
    return data  # type: ignore[return-value]


def edge_ids_guarded_by(machine: MachineJSON, predicate: str) -> set[str]:
    """Ids of the edges with a guard on ``predicate`` (either polarity)."""
    return {e["id"] for e in machine["edges"] if any(g["predicate"] == predicate for g in e["guards"])}
