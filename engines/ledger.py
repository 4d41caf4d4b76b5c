"""The run directory's engine ledger: which engine processes of a job may outlive its driver, and how to find them.

With ``--detach-engines`` a driver's death costs no engine (their Ray actors are detached), so the next driver must
know what is out there: per slot, the detached actor's name, the generation (epoch) of the process it runs, its
server's pid, and whether a weight transfer to it was under way -- a process that was receiving weights when the
driver died holds no version anyone committed, whatever it reports, so it is reloaded before it is routed.

The ledger is written by the driver before and after the I/O it records (a launch, a confirmed death, a transfer),
each time as a whole new file renamed over the old one, so a driver killed at any instant leaves the previous or
the next ledger, never half of one. It decides nothing: a resume hands its epochs to the core
(``Core.with_kept``), and each kept slot's adoption reads the process back before the core decides.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from lifecycle.decide.errors import LifecycleError

LEDGER = "engines.json"
FORMAT = 1
KEEP_NAMESPACE = "rl-lifecycle"  # the Ray namespace of every kept (detached) engine actor
RENEWALS_PER_LEASE = 3  # a driver renews each kept engine's lease this often per lease (engines.actor.Keep)
RENEWAL_TIMEOUT = 10.0  # seconds: the bound on one renewal call (engines.actor.CALL_TIMEOUT)
# the shortest lease a live driver is sure to renew in time: a renewal is due every lease/3 and may take up to
# RENEWAL_TIMEOUT, so a lease under lease/3 + RENEWAL_TIMEOUT (15 s) lapses while its driver is alive (a lease of
# 0.01 s ended the engine before it started: "engine actor died"); twice the call's bound leaves a slow Ray room
MIN_LEASE = 2 * RENEWAL_TIMEOUT


@dataclass(frozen=True)
class Kept:
    """One slot's process, as its driver last recorded it."""

    actor: str  # the detached actor's name (in the ledger's namespace)
    epoch: int  # the generation the core counted for this process
    server_pid: int | None = None
    url: str | None = None
    updating: bool = False  # a weight transfer to it was under way (or failed): reload it whatever it says


class LedgerError(LifecycleError):
    """The engine ledger cannot be read: it names the file and what to do."""


class EngineLedger:
    """``RUN_DIR/engines.json``: read at a resume, rewritten (atomically) after every change."""

    def __init__(self, path: str | os.PathLike[str], namespace: str, kept: dict[str, Kept] | None = None) -> None:
        self.path = Path(path)
        self.namespace = namespace
        self.kept: dict[str, Kept] = dict(kept or {})

    @classmethod
    def read(cls, path: str | os.PathLike[str], namespace: str) -> EngineLedger:
        """The ledger a previous driver left (an empty one where there is none: nothing was kept)."""
        p = Path(path)
        if not p.exists():
            return cls(p, namespace)
        try:
            data = json.loads(p.read_text())
            if data.get("format") != FORMAT:
                raise ValueError(f"format {data.get('format')!r}, expected {FORMAT}")
            kept = {str(k): Kept(**v) for k, v in dict(data["engines"]).items()}
            namespace = str(data.get("namespace", namespace))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise LedgerError(
                f"{p}: the engine ledger cannot be read ({exc}); its engines cannot be adopted -- delete the file "
                "to relaunch every engine (kept ones run out their lease and exit), or restore it"
            ) from None
        return cls(p, namespace, kept)

    def epochs(self, engine_ids: list[str]) -> tuple[int | None, ...]:
        """Per slot, the generation of the process that may still run in it (None: none), for ``Core.with_kept``."""
        return tuple(self.kept[e].epoch if e in self.kept else None for e in engine_ids)

    def record(self, engine_id: str, kept: Kept) -> None:
        self.kept[engine_id] = kept
        self._write()

    def updating(self, engine_id: str, flag: bool) -> None:
        """Before a transfer (True) and after one that loaded (False): a torn or later version is never trusted."""
        entry = self.kept.get(engine_id)
        if entry is not None and entry.updating != flag:
            self.kept[engine_id] = replace(entry, updating=flag)
            self._write()

    def forget(self, engine_id: str) -> None:
        """Its process is confirmed dead (or was never ours to keep)."""
        if self.kept.pop(engine_id, None) is not None:
            self._write()

    def _write(self) -> None:
        data: dict[str, Any] = {
            "format": FORMAT,
            "namespace": self.namespace,
            "engines": {k: asdict(v) for k, v in sorted(self.kept.items())},
        }
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(data, indent=1) + "\n")
        os.replace(tmp, self.path)  # whole or not at all, whenever the driver dies
