"""The eval fleet (``--eval-num-gpus``): dedicated engines pinned to one weight snapshot per eval.

The fleet's lifecycle is the core's ``pin`` operation over the ``eval_fleet`` machine and the eval
engines (``eval-0``, ``eval-1``, ...; their I/O is the controller's): probe them -- only when no rollout
monitor does (``eval_fleet_self_probes``: rollout FT off, as miles' ``EvalFleet.pin``; under rollout FT
the monitor's verdicts and the launchers' death reports are the source, and the fleet sends no
``/health_generate`` of its own) -- stop and start again the dead or unhealthy ones within their
restart budget, check every one is alive, load the committed weights on every one and check them all
(all or nothing), then serve. A pin that cannot succeed is a typed skip -- ``SkippedUnhealthy``
(``unhealthy``) or ``SkippedPinViolation`` (``pin_violation``) -- never an eval on mixed weights.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from lifecycle.decide.core import EVAL, instance_name
from lifecycle.decide.names import FleetStateName
from lifecycle.decide.runner import Runner

if TYPE_CHECKING:
    from rollout.controller import InferenceController

SkipReason = Literal["unhealthy", "pin_violation"]
SKIPS: dict[FleetStateName, SkipReason] = {"SkippedUnhealthy": "unhealthy", "SkippedPinViolation": "pin_violation"}


@dataclass(frozen=True)
class PinResult:
    """The outcome of one pin: ``Pinned`` (``ok``), or a skip with its typed reason and the detail."""

    state: FleetStateName
    weight_version: str
    reason: SkipReason | None = None
    detail: str = ""
    versions: dict[str, str | None] = field(default_factory=dict)  # what every eval engine loaded
    restarted: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return self.state == "Pinned"


async def pin_fleet(runner: Runner, controller: InferenceController) -> PinResult:
    """The ``pin`` operation, read back as a :class:`PinResult` (the fleet's state says which)."""
    starts_before = {e.id: _starts(runner, e.id) for e in controller.evals}
    await runner.operate("pin")
    controller.check()
    state = runner.state.fleet
    version = controller.committed[1] if controller.committed else ""
    versions = {e.id: e.weight_version for e in controller.evals}
    restarted = tuple(e.id for e in controller.evals if _starts(runner, e.id) > starts_before.get(e.id, 0))
    if state == "Pinned":
        return PinResult(state, version, versions=versions, restarted=restarted)
    problems = [
        f"{instance_name(EVAL, i)}: {runner.reasons.get(instance_name(EVAL, i), e.state)}"
        for i, e in enumerate(runner.state.evals)
        if e.state != "Quiesced" or not e.current
    ]
    return PinResult(state, version, SKIPS.get(state), "; ".join(problems), versions, restarted)


def _starts(runner: Runner, instance: str) -> int:
    return sum(
        1 for e in runner.ledger.entries("engine", instance) if e.effect == "launch_engine" and e.status == "done"
    )
