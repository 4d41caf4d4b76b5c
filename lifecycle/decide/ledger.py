"""The effect ledger: which effects ran, per machine instance, in order.

It turns "replay never constructs the rollout function" into a query (``ledger.ever(...)``)
that a test, the explorer and a production assertion can all ask of the same data.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import NamedTuple


class LedgerEntry(NamedTuple):
    """One effect of one transition of one machine instance, and whether its work was done.

    ``status`` is ``done`` (the handler ran, or the effect needs none) or ``failed`` (its handler
    raised, or reported that the work did not happen: a refused load, a request to a dead engine).
    """

    machine: str
    instance: str
    seq: int
    trigger: str
    src: str
    dst: str
    effect: str
    status: str = "done"


class EffectLedger:
    """An append-only record of performed effects, shared by the machines of one job."""

    __slots__ = ("_entries",)

    def __init__(self) -> None:
        self._entries: list[LedgerEntry] = []

    def record(
        self,
        machine: str,
        instance: str,
        seq: int,
        trigger: str,
        src: str,
        dst: str,
        effects: tuple[str, ...],
        status: str = "done",
    ) -> None:
        append = self._entries.append
        for effect in effects:
            append(LedgerEntry(machine, instance, seq, trigger, src, dst, effect, status))

    def extend(self, entries: Iterable[LedgerEntry]) -> None:
        """Append entries already built (the runner's, a step's at once)."""
        self._entries.extend(entries)

    def __len__(self) -> int:
        return len(self._entries)

    def __iter__(self) -> Iterator[LedgerEntry]:
        return iter(self._entries)

    def entries(self, machine: str | None = None, instance: str | None = None) -> list[LedgerEntry]:
        return [
            e
            for e in self._entries
            if (machine is None or e.machine == machine) and (instance is None or e.instance == instance)
        ]

    def effects(self, machine: str | None = None, instance: str | None = None) -> list[str]:
        """Effect names in the order they were recorded (done or failed), for one machine and/or instance."""
        return [e.effect for e in self.entries(machine, instance)]

    def ever(self, effect: str, machine: str | None = None) -> bool:
        """Was ``effect`` ever done (on ``machine``, when given)? A failed attempt does not count."""
        return any(
            e.effect == effect and e.status == "done" and (machine is None or e.machine == machine)
            for e in self._entries
        )

    def failed(self, effect: str, machine: str | None = None) -> bool:
        """Was ``effect`` attempted and failed?"""
        return any(
            e.effect == effect and e.status == "failed" and (machine is None or e.machine == machine)
            for e in self._entries
        )

    def count(self, effect: str, machine: str | None = None) -> int:
        """How often ``effect`` was done."""
        return sum(
            1
            for e in self._entries
            if e.effect == effect and e.status == "done" and (machine is None or e.machine == machine)
        )

    def clear(self) -> None:
        self._entries.clear()
