"""The effect ledger: which effects ran, per machine instance, in order.

It turns "replay never constructs the rollout function" into a query (``ledger.ever(...)``)
that a test, the explorer and a production assertion can all ask of the same data.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import NamedTuple


class LedgerEntry(NamedTuple):
    """One effect performed by one transition of one machine instance."""

    machine: str
    instance: str
    seq: int
    trigger: str
    src: str
    dst: str
    effect: str


class EffectLedger:
    """An append-only record of performed effects, shared by the machines of one job."""

    __slots__ = ("_entries",)

    def __init__(self) -> None:
        self._entries: list[LedgerEntry] = []

    def record(
        self, machine: str, instance: str, seq: int, trigger: str, src: str, dst: str, effects: tuple[str, ...]
    ) -> None:
        append = self._entries.append
        for effect in effects:
            append(LedgerEntry(machine, instance, seq, trigger, src, dst, effect))

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
        """Effect names in the order they ran, optionally for one machine and/or instance."""
        return [e.effect for e in self.entries(machine, instance)]

    def ever(self, effect: str, machine: str | None = None) -> bool:
        """Did ``effect`` ever run (on ``machine``, when given)?"""
        return any(e.effect == effect and (machine is None or e.machine == machine) for e in self._entries)

    def count(self, effect: str, machine: str | None = None) -> int:
        return sum(1 for e in self._entries if e.effect == effect and (machine is None or e.machine == machine))

    def clear(self) -> None:
        self._entries.clear()
