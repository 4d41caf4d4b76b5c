"""Engines started outside the job (``--rollout-external-engine-addrs``): attached, never launched or restarted.

What the rollout side knows of them: each one's address, which process answers there (read again at every
boundary where the lifecycle relies on it: a process replaced behind its address is news for the core, which
lets the old one go and catches the new one up before routing it), and that no two addresses reach one process.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence

from engines.engine import Engine
from lifecycle.decide.core import ROLLOUT, Move, Outcome
from lifecycle.decide.runner import Runner
from rollout.failures import slot_of


class ExternalEngines:
    def __init__(self, runner: Runner, engines: Sequence[Engine]) -> None:
        self.runner = runner
        self.engines = engines  # the controller's rollout slots (the same list, filled as they are made)
        self.replacements: dict[str, int] = {}  # external engine -> how often its process was seen replaced
        self._news: set[asyncio.Task[None]] = set()  # news reported off a probe (a replaced external engine)

    def url(self, engine_id: str) -> str | None:
        """The address of a rollout engine started outside the job, or None for one the job launches."""
        group, i = slot_of(engine_id)
        addrs = self.runner.config.rollout_external_engine_addrs
        return addrs[i] if group == ROLLOUT and i < len(addrs) else None

    def twin(self, engine: Engine) -> str | None:
        """An external server attached under two addresses answers as one process: the second is refused."""
        for other in self.engines:
            if other is not engine and other.identity is not None and other.identity == engine.identity:
                expected = f"a server of its own (--rollout-external-engine-addrs lists {len(self.engines)})"
                return (
                    f"did not start: expected {expected}; found the process {other.id} is attached "
                    f"to at {other.url} ({engine.identity}). Fix: list each server once in "
                    "--rollout-external-engine-addrs (one address each)"
                )
        return None

    async def check(self) -> None:
        """Each attached external engine's process and served version are read again (before a rollout routes
        to them, and after it); one replaced behind its address is reported."""
        live = self.runner.core.live
        engines = [e for e in self.engines if e.external and self._state(e) in live]
        reasons = await asyncio.gather(*(e.replaced() for e in engines))
        for engine, reason in zip(engines, reasons, strict=True):
            if reason is not None:
                await self.report_replaced(engine, reason)

    def _state(self, engine: Engine) -> str:
        group, i = slot_of(engine.id)
        return self.runner.state.group(group)[i].state

    def replaced_since(self, seen: dict[str, int]) -> list[str]:
        """The external engines seen replaced since ``seen`` (a copy of :attr:`replacements`)."""
        return sorted(e for e, n in self.replacements.items() if n > seen.get(e, 0))

    async def report_replaced(self, engine: Engine, reason: str) -> None:
        group, i = slot_of(engine.id)
        self.replacements[engine.id] = self.replacements.get(engine.id, 0) + 1
        await self.runner.report(Outcome("replaced", group, i, reason, epoch=engine.epoch))

    def probe(self, engine: Engine) -> Callable[[float], Awaitable[Outcome]]:
        """The monitor's probe of an external engine also reads which process answers: a replaced one is news."""

        async def probe(timeout: float) -> Outcome:
            reason = await engine.replaced()
            if reason is None:
                return await engine.probe(timeout)
            # reported on its own task: the probe's timeout must not cancel the core's step (attaching the new one)
            task = asyncio.create_task(self.report_replaced(engine, reason), name=f"replaced-{engine.id}")
            self._news.add(task)
            task.add_done_callback(self._news.discard)
            return Outcome("probe_ok")  # the process it probed is let go: no verdict on it

        return probe

    def detached(self, move: Move) -> None:
        """An external engine let go (``detach``): the run goes on, its owner must act."""
        url = self.url(move.instance)
        self.runner.log.emit(
            "engine.detached",
            instance=move.instance,
            url=url,
            reason=self.runner.reasons.get(move.instance, "unhealthy"),
            fix=f"restart the server at {url}, then RolloutManager.start_engine({slot_of(move.instance)[1]}) "
            "attaches it again; rl-lifecycle never restarts an engine it did not start",
        )

    def tasks(self) -> list[asyncio.Task[None]]:
        """The reports still on their way (cancelled when the controller closes)."""
        return list(self._news)
