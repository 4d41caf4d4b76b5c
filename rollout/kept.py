"""Kept engines (``--detach-engines``): server processes that outlive their driver, found again by the next one.

The ledger (:class:`engines.ledger.EngineLedger`) is rewritten around every launch, death and transfer, so a
driver that dies at any moment leaves each kept process findable, with its generation and whether a weight
transfer to it was under way. A resumed driver adopts what the ledger names: the core decides from the answer
(``adopted``: the committed version and no transfer torn; ``behind``; ``lost``).
"""

from __future__ import annotations

from collections.abc import Callable

from engines.engine import Engine
from engines.errors import EngineError
from engines.launcher import Keepable
from engines.ledger import EngineLedger, Kept
from lifecycle.decide.core import Fact, Outcome
from lifecycle.decide.events import ADOPTED
from lifecycle.decide.runner import Runner


class KeptEngines:
    def __init__(self, runner: Runner, ledger: EngineLedger | None, serve: Callable[[Engine], None]) -> None:
        self.runner = runner
        self.ledger = ledger  # None: engines die with their driver
        self.serve = serve  # a process of a slot runs: watch it (and probe it, where a monitor exists)

    async def record(self, engine: Engine) -> None:
        """A kept process is in the ledger the moment it runs (a driver that dies now leaves it findable)."""
        launcher = engine.launcher
        if self.ledger is None or not isinstance(launcher, Keepable) or engine.epoch is None:
            return
        kept = Kept(launcher.kept_name(), engine.epoch, await engine.launcher.server_pid(), engine.url)
        self.ledger.record(engine.id, kept)

    async def adopt(self, engine: Engine, instance: str) -> Outcome:
        """A slot the ledger names: reach its process, check it is the ledger's, read what it serves."""
        kept = self.ledger.kept.get(engine.id) if self.ledger is not None else None
        launcher = engine.launcher
        if kept is None or not isinstance(launcher, Keepable):
            return Outcome("lost", reason=f"{engine.id}: no kept process is recorded for it")
        try:
            url = await launcher.adopt(kept.epoch, kept.server_pid)
            version = await engine.adopt(url)
        except (EngineError, TimeoutError, OSError) as exc:
            return Outcome("lost", reason=f"{engine.id}: not adopted ({exc})")
        engine.epoch = kept.epoch
        self.serve(engine)
        committed = self.runner.committed
        holds = not kept.updating and committed is not None and version == committed[1]
        fact = Fact.of(
            ADOPTED,
            instance=instance,
            epoch=kept.epoch,
            server_pid=kept.server_pid,
            weight_version=version,
            updating=kept.updating,
            outcome="adopted" if holds else "behind",
        )
        return Outcome("adopted" if holds else "behind", facts=(fact,))

    def forget(self, engine: Engine) -> None:
        """Its process is confirmed dead: nothing of it is kept."""
        if self.ledger is not None:
            self.ledger.forget(engine.id)

    def transferring(self, engine: Engine, flag: bool) -> None:
        """A transfer to ``engine`` begins (True), or ended without a whole new version (still True)."""
        if self.ledger is not None:
            self.ledger.updating(engine.id, flag)
