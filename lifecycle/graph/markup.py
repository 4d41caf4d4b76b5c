"""The graph JSON as ``transitions``' own markup: load an exported machine back into a ``MarkupMachine``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from transitions.extensions.markup import MarkupMachine

from lifecycle.graph.model import MachineJSON


def to_markup(machine: MachineJSON | Mapping[str, Any], *, config_only: bool = False) -> dict[str, Any]:
    """Keyword arguments for ``transitions.extensions.markup.MarkupMachine(**markup)``.

    By default every edge is kept and each guard becomes a condition naming the real predicate
    (``lifecycle.decide.predicates.rollout_ft``; negated guards go to ``unless``), which ``transitions``
    calls with the event's arguments: fire ``m.recover(config)`` and the config decides.
    ``config_only=True`` keeps only the edges active under the exported config and drops the
    guards, giving a self-contained machine that needs no lifecycle import to fire.
    """
    transitions: list[dict[str, Any]] = []
    for edge in machine["edges"]:
        if config_only and not edge["active"]:
            continue
        row: dict[str, Any] = {"trigger": edge["trigger"], "source": edge["source"], "dest": edge["dest"]}
        if not config_only:
            conditions = [f"lifecycle.decide.predicates.{g['predicate']}" for g in edge["guards"] if not g["negated"]]
            unless = [f"lifecycle.decide.predicates.{g['predicate']}" for g in edge["guards"] if g["negated"]]
            if conditions:
                row["conditions"] = conditions
            if unless:
                row["unless"] = unless
        transitions.append(row)
    states = [{"name": s["name"], **({"final": True} if s["terminal"] else {})} for s in machine["states"]]
    return {
        "name": machine["name"],
        "states": states,
        "transitions": transitions,
        "initial": machine["initial"],
        "auto_transitions": False,
    }


def markup_machine(machine: MachineJSON | Mapping[str, Any], *, config_only: bool = False) -> MarkupMachine:
    """One exported machine (``load_json(path)["machines"]["engine"]``) as a live ``MarkupMachine``.

    The way back from a graph file to ``transitions``: review tools and notebooks can fire events on
    exactly the machine that was exported, without this project's runtime.
    """
    return MarkupMachine(**to_markup(machine, config_only=config_only))
