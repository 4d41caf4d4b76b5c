"""Writes :mod:`lifecycle.decide.names` from the specs (``python -m lifecycle.decide.names_render``).

A test keeps it in step."""

from __future__ import annotations

import sys
from pathlib import Path

from lifecycle.decide.core.plan import OPERATIONS
from lifecycle.decide.machines import MACHINES
from lifecycle.decide.predicates import PREDICATES

ALIASES = {
    "engine": "EngineStateName",
    "monitor": "MonitorStateName",
    "rollout": "RolloutStateName",
    "eval_fleet": "FleetStateName",
    "trainer": "TrainerStateName",
    "weight_sync": "WeightSyncStateName",
}
HEADER = '''"""The names of the machines' states, triggers and predicates as types (written from the specs by
``python -m lifecycle.decide.names_render``; ``tests/lifecycle/decide/test_names.py`` fails when they drift).

A comparison with a name that no spec has (``state == "Serveing"``) is a mypy error
(``comparison-overlap`` under ``--strict``) instead of an expression that is silently ``False``.
"""

from typing import Literal
'''


def _literal(name: str, values: list[str]) -> str:
    body = ", ".join(f'"{v}"' for v in values)
    line = f"{name} = Literal[{body}]"
    if len(line) <= 120:
        return line
    items = "".join(f'    "{v}",\n' for v in values)
    return f"{name} = Literal[\n{items}]"


def render() -> str:
    out = [HEADER]
    for machine, alias in ALIASES.items():
        out.append(_literal(alias, list(MACHINES[machine].state_names)))
    states = sorted({n for m in MACHINES.values() for n in m.state_names})
    triggers = sorted({t for m in MACHINES.values() for t in m.triggers})
    out.append(_literal("StateName", states))
    out.append(_literal("Trigger", triggers))
    out.append(_literal("MachineName", list(MACHINES)))
    out.append(_literal("PredicateName", sorted(PREDICATES)))
    out.append(_literal("OperationName", list(OPERATIONS)))
    return "\n".join(out) + "\n"


def main() -> None:
    target = Path(__file__).with_name("names.py")
    target.write_text(render())
    print(f"wrote {target}", file=sys.stderr)


if __name__ == "__main__":
    main()
