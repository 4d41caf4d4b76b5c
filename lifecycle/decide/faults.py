"""The fault kinds ``lifecycle run --inject FAULT:INDEX@STEP`` knows, as one table every reader takes them from.

Why here, at the bottom: the run timeline (``lifecycle/``) draws the fault events, and ``lifecycle/``
imports nothing above it; ``trainer/app/faults.py`` extends each kind with how it is applied (its injector)
and what the run promises (its outcome), and the CLI, the reliability matrix and its report read this
table too. ``tests/reliability/test_fault_table.py`` fails when a kind lacks any of them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

FAULT_INJECTED = "fault.injected"  # the injector applied a fault (target, details)
FAULT_FIRED = "fault.fired"  # an armed fault struck at its lifecycle point
FAULT_EVENTS = frozenset({FAULT_INJECTED, FAULT_FIRED})

Target = Literal["engine", "trainer", "router", "driver"]
Needs = Literal["", "broadcast", "disk", "offload", "ray-nodes", "save", "router"]


@dataclass(frozen=True)
class FaultKind:
    name: str
    target: Target  # the part it strikes; INDEX is its engine slot, worker rank, or 0 (one router, one driver)
    doc: str  # what is injected, in one line (the CLI's help and docs/reliability.md)
    needs: Needs = ""  # what a run must have for it to land (checked before anything starts)
    # a preemption with notice: a planned leave that an elastic fleet (--rollout-min/max-num-gpus) drains and
    # replaces, under every FT configuration; a fleet of fixed size cannot act on it (refused before anything starts)
    notice: bool = False


FAULT_KINDS: tuple[FaultKind, ...] = (
    FaultKind("kill-engine", "engine", "engine actor process SIGKILL (Ray reports the actor dead)"),
    FaultKind("hang-engine", "engine", "engine server SIGSTOP: health and generate stall, nothing dies"),
    FaultKind(
        "hang-serving",
        "engine",
        "engine server SIGSTOP once it is Serving and registered at the gateway: a stall mid-generate",
    ),
    FaultKind("kill-http", "engine", "HTTP server process SIGKILL, the Ray actor stays alive"),
    FaultKind("crash-during-update", "engine", "server SIGKILL on entering a weight update, before the HTTP call"),
    FaultKind(
        "fail-update",
        "engine",
        "the engine's next weight update reads a torn checkpoint (its largest file cut in half): the live server "
        "answers the load with an error",
        "disk",
    ),
    FaultKind("crash-during-offload", "engine", "server SIGKILL on entering Offloaded (--offload-rollout)", "offload"),
    FaultKind(
        "crash-during-broadcast",
        "engine",
        "server SIGKILL between two buckets of a broadcast weight update",
        "broadcast",
    ),
    FaultKind("lose-node", "engine", "the Ray worker node hosting the engine is removed (--ray-nodes 3)", "ray-nodes"),
    FaultKind(
        "preempt-engine",
        "engine",
        "a preemption notice for the engine (deadline --preempt-notice s), then its server's process group SIGTERM at "
        "the deadline and SIGKILL 5 s later",
        notice=True,
    ),
    FaultKind(
        "preempt-node",
        "engine",
        "the Ray worker node hosting the engine is drained with a deadline (--preempt-notice s; Ray tells the "
        "engines on it), then removed at the deadline",
        "ray-nodes",
        notice=True,
    ),
    FaultKind("crash-trainer", "trainer", "trainer worker actor process dies"),
    FaultKind(
        "crash-trainer-in-broadcast",
        "trainer",
        "trainer worker 0 (the broadcast's rank 0) SIGKILL between two buckets",
        "broadcast",
    ),
    FaultKind("kill-router", "router", "the rollout gateway (SMG) process SIGKILL (it restarts empty)", "router"),
    FaultKind(
        "kill-driver",
        "driver",
        "the driver (lifecycle run itself) SIGKILLs itself; lifecycle run --resume RUN_DIR continues",
        "save",
    ),
)
KINDS: dict[str, FaultKind] = {k.name: k for k in FAULT_KINDS}
FAULTS: tuple[str, ...] = tuple(KINDS)
NOTICE_FAULTS: tuple[str, ...] = tuple(k.name for k in FAULT_KINDS if k.notice)


def kinds(*, target: Target | None = None, needs: Needs | None = None) -> tuple[str, ...]:
    """The names of the kinds that strike ``target`` and/or need ``needs``, in table order."""
    return tuple(
        k.name for k in FAULT_KINDS if (target is None or k.target == target) and (needs is None or k.needs == needs)
    )
