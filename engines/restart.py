"""The restart budget of an engine: at most N restarts within a window, with capped backoff.

Kubernetes' CrashLoopBackOff and Ray Serve's replica restarts make the same two promises: a
flapping engine is not restarted in a hot loop (exponential delay, capped), and one that keeps
dying is given up on (``Failed``) so the run stops fast with a reason instead of spinning.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from lifecycle.config import LifecycleConfig


@dataclass
class RestartBudget:
    max_restarts: int
    window: float
    backoff: float
    backoff_max: float
    clock: Callable[[], float] = time.monotonic
    _times: deque[float] = field(default_factory=deque, init=False, repr=False)

    @classmethod
    def from_config(cls, config: LifecycleConfig, clock: Callable[[], float] = time.monotonic) -> RestartBudget:
        return cls(
            config.engine_max_restarts,
            config.engine_restart_window,
            config.engine_restart_backoff,
            config.engine_restart_backoff_max,
            clock,
        )

    def _prune(self, now: float) -> None:
        while self._times and now - self._times[0] > self.window:
            self._times.popleft()

    @property
    def used(self) -> int:
        """Restarts counted in the current window."""
        self._prune(self.clock())
        return len(self._times)

    def next_delay(self) -> float | None:
        """Delay before the next restart, or None when the budget is spent (then: give up)."""
        now = self.clock()
        self._prune(now)
        if len(self._times) >= self.max_restarts:
            return None
        delay = float(min(self.backoff * (2 ** len(self._times)), self.backoff_max))
        self._times.append(now)
        return delay
