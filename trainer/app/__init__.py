"""The application, above both sides: a run's assembly, the project's loop, ``lifecycle run``, faults, checks.

Nothing below this package imports it (tests/test_layering.py). The names below are imported on first
use: ``lifecycle run`` is registered from :mod:`trainer.app.cli` on every ``lifecycle`` invocation,
which must not pay for importing torch and Ray.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from trainer.app.broadcast import WeightBroadcast
    from trainer.app.fleet import Fleet
    from trainer.app.job import Job
    from trainer.app.loop import RunResult, run_loop
    from trainer.app.metrics import Metrics, MetricsServer, serve_metrics
    from trainer.app.options import RunOptions

_EXPORTS = {
    "Fleet": "trainer.app.fleet",
    "Job": "trainer.app.job",
    "Metrics": "trainer.app.metrics",
    "MetricsServer": "trainer.app.metrics",
    "serve_metrics": "trainer.app.metrics",
    "RunOptions": "trainer.app.options",
    "RunResult": "trainer.app.loop",
    "run_loop": "trainer.app.loop",
    "WeightBroadcast": "trainer.app.broadcast",
}
__all__ = [
    "Fleet",
    "Job",
    "Metrics",
    "MetricsServer",
    "RunOptions",
    "RunResult",
    "WeightBroadcast",
    "run_loop",
    "serve_metrics",
]


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'trainer.app' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
