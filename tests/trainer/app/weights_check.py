"""A rollout function for the broadcast tests: before each rollout, every Serving engine's tensors are read
back (``/get_weights_by_name``) and compared, tensor for tensor, with the committed checkpoint the trainer
wrote of the same version; one JSON line per rollout goes to ``$LIFECYCLE_WEIGHTS_CHECK``."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file

from rollout.controller import ControllerError, InferenceController
from rollout.executor import EngineRolloutFn, Sample
from rollout.pattern import PatternTask

CHECK_ENV = "LIFECYCLE_WEIGHTS_CHECK"


class CheckedRollout:
    def __init__(self, task: PatternTask) -> None:
        self.inner = EngineRolloutFn(task)

    async def __call__(self, rollout_id: int, controller: InferenceController) -> list[Sample]:
        assert controller.committed is not None
        path, version = controller.committed
        trainer = load_file(str(Path(path) / "model.safetensors"))
        row: dict[str, Any] = {"rollout_id": rollout_id, "version": version, "engines": {}, "mismatches": []}
        for engine in controller.routable():
            assert engine.client is not None
            for name, tensor in trainer.items():
                held = await engine.client.get_weights_by_name(name, truncate_size=1 << 30)
                if not torch.equal(torch.tensor(held, dtype=tensor.dtype), tensor):
                    row["mismatches"].append(f"{engine.id}:{name}")
            row["engines"][engine.id] = len(trainer)
        out = os.environ.get(CHECK_ENV)
        if out:
            with Path(out).open("a") as f:
                f.write(json.dumps(row) + "\n")
        if row["mismatches"]:
            raise ControllerError(f"rollout {rollout_id}: engines differ from the trainer: {row['mismatches'][:5]}")
        return await self.inner(rollout_id, controller)


def factory(task: PatternTask) -> CheckedRollout:
    return CheckedRollout(task)
