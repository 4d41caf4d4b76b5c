"""A rollout function for ``tests/trainer/app/test_kept_engines.py``: the default one, and -- where
``$LIFECYCLE_KILL_UPDATE_AT`` names a weight version -- a driver that SIGKILLs itself in the middle of the weight
update that pushes that version, right after the engine ledger recorded the transfer to ``engine-0`` as under way.

It is imported by ``lifecycle run --rollout-function kill_mid_update:factory`` (test code in the driver, as the
reliability matrix's audit is); a resumed driver runs without the variable and never dies.
"""

from __future__ import annotations

import os
import signal
from typing import Any

from rollout.controller import InferenceController
from rollout.executor import EngineRolloutFn
from rollout.pattern import PatternTask

KILL_ENV = "LIFECYCLE_KILL_UPDATE_AT"


def factory(task: PatternTask) -> EngineRolloutFn:
    version = os.environ.get(KILL_ENV)
    if version:
        original = InferenceController.transferring

        def transferring(self: InferenceController, engine: Any, flag: bool) -> None:
            original(self, engine, flag)
            pending = self.runner.pending
            if flag and engine.id == "engine-0" and pending is not None and pending[1] == version:
                self.log.emit("fault.injected", fault="kill-driver (mid-update)", target="driver", pid=os.getpid())
                os.kill(os.getpid(), signal.SIGKILL)

        InferenceController.transferring = transferring  # type: ignore[method-assign]
    return EngineRolloutFn(task)
