"""The rollout function of the reliability matrix: the default one, plus "nothing lost" checks.

It runs *inside* every fault run (in-process cells and ``lifecycle run`` subprocess cells alike,
via ``--rollout-function matrix_audit:factory``). Before each rollout it asks every routable
(``Serving``) engine for the version it serves -- a real HTTP call, ``/model_info`` or vLLM's
``/weight_info`` -- and requires the trainer's weight
version (``str(rollout_id)``: the loop pushes version ``k+1`` at the end of step ``k``; ``0`` throughout a
``--debug-rollout-only`` run, which has no trainer). After the
rollout it requires exactly one sample per request index (none lost, none duplicated by a retry),
each generated under that version. A violation raises, so the run fails where it happened; every
rollout also appends one JSON line to ``$LIFECYCLE_MATRIX_AUDIT`` for the test to read.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from engines.errors import EngineError
from rollout.controller import ControllerError, InferenceController
from rollout.executor import EngineRolloutFn, Sample
from rollout.pattern import PatternTask

AUDIT_ENV = "LIFECYCLE_MATRIX_AUDIT"


class AuditedRollout:
    def __init__(self, task: PatternTask) -> None:
        self.task = task
        self.inner = EngineRolloutFn(task)

    async def __call__(self, rollout_id: int, controller: InferenceController) -> list[Sample]:
        # the loop pushes version k+1 at the end of step k; without a trainer the seed's version 0 stays
        trainer_version = "0" if controller.config.debug_rollout_only else str(rollout_id)
        committed = controller.committed[1] if controller.committed else None
        if controller.config.update_weight_transfer_mode == "broadcast" and committed is not None:
            # a failed broadcast commits nothing: the engines serve the last committed version until the next
            # update goes through (the cells check that it does); they must all agree on it
            trainer_version = committed
        versions: dict[str, str | None] = {}
        nodes: dict[str, str] = {}
        for engine in controller.routable():
            try:
                versions[engine.id] = await engine.served_version()  # SGLang's /model_info, vLLM's /weight_info
            except EngineError as exc:  # a stalled engine (hang-serving): its failed request, as any caller's
                await controller.engine_unhealthy(engine.id, f"the audit's version read failed: {exc}")
                continue
            if controller.config.rollout_backend == "sglang":
                assert engine.client is not None
                memory = (await engine.client.server_info()).internal_states[0]
                if memory.get("weights_torn"):  # the CPU engine says it holds a mix of two versions
                    versions[engine.id] = f"{versions[engine.id]} (torn: a failed broadcast's mix)"
            info = getattr(engine.launcher, "info", None)
            if callable(info):
                nodes[engine.id] = str((await info()).get("node_id"))
        samples = await self.inner(rollout_id, controller)
        want = len(self.task.prompts(rollout_id)) * self.task.group_size
        problems = find_problems(trainer_version, committed, versions, samples, want)
        sample_versions = sorted({str(s["weight_version"]) for s in samples})
        row: dict[str, Any] = {
            "rollout_id": rollout_id,
            "trainer_version": trainer_version,
            "serving_versions": versions,
            "nodes": nodes,
            "samples": len(samples),
            "requests": want,
            "sample_versions": sample_versions,
            "states": controller.states(),
            "problems": problems,
        }
        path = os.environ.get(AUDIT_ENV)
        if path:
            with Path(path).open("a") as f:
                f.write(json.dumps(row) + "\n")
        if problems:
            raise ControllerError(f"rollout {rollout_id} audit: {'; '.join(problems)}")
        return samples


def find_problems(
    trainer_version: str, committed: str | None, versions: dict[str, str | None], samples: list[Sample], want: int
) -> list[str]:
    """Everything "nothing lost" forbids, as messages (empty: all good)."""
    problems = []
    if committed != trainer_version:
        problems.append(f"controller committed version {committed!r}, trainer pushed {trainer_version!r}")
    stale = {k: v for k, v in versions.items() if v != trainer_version}
    if stale:
        problems.append(f"Serving engines report weight versions {stale}, trainer has {trainer_version!r}")
    indexes = sorted(int(s["index"]) for s in samples)
    if indexes != list(range(want)):
        problems.append(f"{len(samples)} samples for {want} requests (indexes {indexes})")
    sample_versions = sorted({str(s["weight_version"]) for s in samples})
    if sample_versions != [trainer_version]:
        problems.append(f"samples generated under versions {sample_versions}, want {trainer_version!r}")
    return problems


def factory(task: PatternTask) -> AuditedRollout:
    return AuditedRollout(task)
