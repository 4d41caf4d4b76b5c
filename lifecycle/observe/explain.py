"""``lifecycle explain``: what a config turns on, in words, before anything runs."""

from __future__ import annotations

from typing import Any

from lifecycle.decide.config import LifecycleConfig
from lifecycle.decide.predicates import PREDICATES, evaluate

# (what the gate decides, the predicate that decides it)
GATES: tuple[tuple[str, str], ...] = (
    ("construct the rollout/eval function", "constructs_rollout_fn"),
    ("start rollout servers", "starts_servers"),
    ("start rollout health monitors (probes)", "monitors_rollout"),
    ("arm CI fault injection", "ci_injects_rollout_faults"),
    ("recover dead rollout engines (engine + trainer side)", "rollout_ft"),
    ("attach external engines: never restarted, let go when dead", "external_engines"),
    ("trainer's update_weights recovers engines first", "trainer_recovers_rollout"),
    ("start the eval fleet", "eval_fleet_enabled"),
    ("eval fleet probes its engines itself", "eval_fleet_self_probes"),
    ("push weights to rollout engines", "updates_rollout_weights"),
    ("heal crashed trainer workers from a peer", "heals_trainer"),
    ("offload rollout engines around training", "offloads_rollout"),
    ("offload the trainer around generation", "offloads_train"),
    ("save rollouts for replay", "saves_rollout_data"),
)


def explain(config: LifecycleConfig) -> dict[str, Any]:
    """The machine-readable explanation (``--json``)."""
    values = evaluate(config)
    return {
        "flags": config.to_flags(),
        "mode": config.mode,
        "ft_components": sorted(config.ft_components),
        "rollout_engines": config.num_rollout_engines,
        "eval_engines": config.num_eval_engines if values["eval_fleet_enabled"] else 0,
        "predicates": values,
        "gates": [{"gate": text, "predicate": name, "open": values[name]} for text, name in GATES],
        "warnings": list(config.warnings),
        "config": config.to_dict(),
    }


def render(config: LifecycleConfig) -> str:
    """The human-readable table."""
    data = explain(config)
    flags = " ".join(data["flags"]) or "(defaults)"
    lines = [f"config: {flags}", f"mode:   {data['mode']}", ""]
    lines.append("Gates (what this config constructs, starts, monitors and recovers)")
    width = max(len(g["gate"]) for g in data["gates"])
    for g in data["gates"]:
        mark = "yes" if g["open"] else "no "
        lines.append(f"  {g['gate']:<{width}}  {mark}  [{g['predicate']}]")
    lines.append("")
    lines.append("Predicates")
    pw = max(len(n) for n in PREDICATES)
    for name, value in data["predicates"].items():
        lines.append(f"  {name:<{pw}}  {'true ' if value else 'false'}  {PREDICATES[name].doc}")
    lines.append("")
    lines.append(f"Engines: {data['rollout_engines']} rollout, {data['eval_engines']} eval")
    if data["warnings"]:
        lines.append("")
        lines.append("Warnings")
        lines.extend(f"  ! {w}" for w in data["warnings"])
    return "\n".join(lines)
