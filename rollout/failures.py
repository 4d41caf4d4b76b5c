"""What the rollout side says when it stops a run: which engines failed, where each was, why, and the fix.

The core decides that the run stops (an engine failed without FT, a restart budget ran out, the servers did not
start); these messages are the controller's account of it, read from what it recorded of each engine (the state
it was marked in, the reason it was given, whether it is an external engine and at which address).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from engines.engine import EngineFailed
from lifecycle.decide.core import EVAL, ROLLOUT, Failure
from lifecycle.decide.errors import LifecycleError

if TYPE_CHECKING:
    from rollout.controller import InferenceController


class ControllerError(LifecycleError):
    """The rollout side cannot go on (no routable engine, an engine failed without FT, a bounded wait ran out)."""


def slot_of(engine_id: str) -> tuple[str, int]:
    """The group and index of an engine slot, from its id (``engine-3``: rollout 3; ``eval-0``: eval 0)."""
    prefix, _, index = engine_id.rpartition("-")
    return (EVAL if prefix == "eval" else ROLLOUT), int(index)


def start_failure(controller: InferenceController, failed: Failure) -> ControllerError:
    """Every rollout engine that failed while the servers started (launched, attached or loading the first
    weights), each with its own reason, its address and the fix."""
    lines = []
    for engine_id, where in controller.marked.items():
        if slot_of(engine_id)[0] != ROLLOUT:
            continue
        reason = controller.runner.reasons.get(engine_id, "did not start").rstrip(".")
        url = controller.external.url(engine_id)
        if url is None:
            at = "" if where == "Starting" else f" (while {where})"
            fix = (
                "Fix: the reason above is the engine's own; a server that is only slow to start needs a "
                "longer --engine-startup-timeout"
            )
        else:
            at = f" (external engine at {url}{'' if where == 'Starting' else ', while ' + where})"
            fix = (
                ""  # the reason names what was expected, what was found and the fix
                if "Fix:" in reason
                else f"Fix: start the server at {url} (an external engine is attached, never launched), or "
                "leave it out of --rollout-external-engine-addrs"
                if where == "Starting"
                else f"Fix: the server at {url} must be a --rollout-backend {controller.config.rollout_backend} "
                "server that takes the job's weights (started on the checkpoint given as --hf-checkpoint)"
            )
        lines.append(f"{engine_id}{at}: {reason}" + (f". {fix}" if fix else ""))
    detail = "; ".join(lines) or str(failed)
    return ControllerError(f"the rollout servers did not start: {detail}")


def engine_failure(controller: InferenceController, instance: str) -> EngineFailed:
    """Why an engine stopped the run: not recovered (rollout FT off), its restart budget spent, or an external
    engine, which rl-lifecycle never restarts."""
    reason = controller.runner.reasons.get(instance, "unhealthy")
    where = controller.marked.get(instance, "?")
    url = controller.external.url(instance)
    if url is not None:
        return EngineFailed(
            instance,
            "Unhealthy",
            f"{reason} (while {where}); it is an external engine ({url}): rl-lifecycle never restarts a server "
            "it did not start. Fix: restart the server at that address and run again; with --use-fault-tolerance "
            "--ft-components rollout the run goes on without it instead",
        )
    if instance in controller.gave_up:
        budget = controller.config
        how = (
            f"restart budget spent ({budget.engine_max_restarts} restarts within "
            f"{budget.engine_restart_window:g}s: --engine-max-restarts / --engine-restart-window)"
        )
        return EngineFailed(instance, "Recovering", f"{reason} (while {where}); {how}")
    how = (
        "not recovered: rollout fault tolerance is off (blocked by rollout_ft; "
        "use --use-fault-tolerance --ft-components rollout)"
    )
    return EngineFailed(instance, "Unhealthy", f"{reason} (while {where}); {how}")
