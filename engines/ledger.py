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
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any

from lifecycle.decide.errors import LifecycleError, bounded_repr
from lifecycle.decide.jsonio import JSONFileError, loads, open_regular

LEDGER = "engines.json"
FORMAT = 1
KEEP_NAMESPACE = "rl-lifecycle"  # the Ray namespace of every kept (detached) engine actor
MAX_BYTES = 16 * 1024 * 1024  # ~100 bytes an engine: far above any fleet
LEDGER_FIX = (
    "delete the file to relaunch every engine (kept ones run out their lease and exit; new ones get generations "
    "above every one the event log records), or restore the ledger the driver wrote"
)
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
    """The engine ledger cannot be read: it names the file (``path``), what is wrong (``problem``) and what to
    do (``fix``)."""

    def __init__(self, path: Path, problem: str, fix: str) -> None:
        self.path, self.problem, self.fix = path, problem, fix
        super().__init__(
            f"{path}: the engine ledger cannot be read ({problem}); its engines cannot be adopted -- {fix}"
        )


def _unreadable(path: Path, problem: str) -> LedgerError:
    return LedgerError(path, problem, LEDGER_FIX)


def _count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _entry_problem(entry: object) -> str:
    """Why one engine's entry is not what :meth:`EngineLedger._write` writes ("" where it is)."""
    if not isinstance(entry, dict):
        return f"is {type(entry).__name__}, not an object"
    names = {f.name for f in fields(Kept)}
    if set(entry) != names:
        unknown, missing = sorted(set(entry) - names), sorted(names - set(entry))
        return f"unknown keys {bounded_repr(unknown)}" if unknown else f"lacks {', '.join(missing)}"
    actor, epoch, pid, url = entry["actor"], entry["epoch"], entry["server_pid"], entry["url"]
    if not isinstance(actor, str) or not actor:
        return f"actor {bounded_repr(actor)} is not an actor name"
    if not _count(epoch):
        return f"epoch {bounded_repr(epoch)} is not a generation (a whole number, 0 or more)"
    if pid is not None and not (_count(pid) and pid > 0):
        return f"server_pid {bounded_repr(pid)} is not a process id"
    if url is not None and not (isinstance(url, str) and url.startswith(("http://", "https://"))):
        return f"url {bounded_repr(url)} is not an http(s) address"
    if not isinstance(entry["updating"], bool):
        return f"updating {bounded_repr(entry['updating'])} is not true or false"
    return ""


class EngineLedger:
    """``RUN_DIR/engines.json``: read at a resume, rewritten (atomically) after every change."""

    def __init__(self, path: str | os.PathLike[str], namespace: str, kept: dict[str, Kept] | None = None) -> None:
        self.path = Path(path)
        self.namespace = namespace
        self.kept: dict[str, Kept] = dict(kept or {})

    @classmethod
    def read(cls, path: str | os.PathLike[str], namespace: str) -> EngineLedger:
        """The ledger a previous driver left (an empty one where there is none: nothing was kept), read bounded and
        checked by the schema :meth:`_write` writes: whatever else is there (torn, nested, huge, a string epoch,
        an unknown key) is one :class:`LedgerError` naming the file and the fix."""
        p = Path(path)
        if not p.exists() and not p.is_symlink():
            return cls(p, namespace)
        try:
            with open_regular(p) as f:  # a FIFO would block, a device never end
                raw = f.read(MAX_BYTES + 1)
            if len(raw) > MAX_BYTES:
                raise JSONFileError(p, f"is larger than {MAX_BYTES:,} bytes")
            data = loads(raw, source=p)
        except JSONFileError as exc:
            raise _unreadable(p, exc.problem) from None
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            got = data.get("format") if isinstance(data, dict) else type(data).__name__
            raise _unreadable(p, f"format {bounded_repr(got)}, expected {FORMAT}")
        if set(data) != {"format", "namespace", "engines"}:
            raise _unreadable(p, f"keys {bounded_repr(sorted(data))}, expected format, namespace and engines")
        recorded, engines = data["namespace"], data["engines"]
        if not isinstance(recorded, str) or not recorded:
            raise _unreadable(p, f"namespace {bounded_repr(recorded)} is not a Ray namespace")
        if not isinstance(engines, dict):
            raise _unreadable(p, f"engines is {type(engines).__name__}, not an object per engine")
        kept = {}
        for engine_id, entry in engines.items():
            problem = _entry_problem(entry)
            if problem:
                raise _unreadable(p, f"engine {bounded_repr(engine_id)}: {problem}")
            kept[engine_id] = Kept(**entry)
        return cls(p, recorded, kept)

    def epochs(self, engine_ids: list[str]) -> tuple[int | None, ...]:
        """Per slot, the generation of the process that may still run in it (None: none), for ``Core.with_kept``."""
        return tuple(self.kept[e].epoch if e in self.kept else None for e in engine_ids)

    def generations(self, engine_ids: list[str], logged: Mapping[str, int]) -> tuple[tuple[int | None, ...], int]:
        """What a resume hands ``Core.with_kept``: per slot, the generation to adopt (None: launch), and the
        floor above which every new process's generation lies.

        Generations fence stale news, so none is ever used twice in a run directory. The ledger alone cannot
        promise that: it forgets a slot whose process died, and a rewound or restored copy names older
        generations than the processes it describes. The event log (``logged``: the highest generation it
        records per engine, :func:`lifecycle.decide.events.log_facts`) is written before the I/O it records,
        so the floor is the maximum of both, never the ledger's word alone. The maximum, not a refusal: refusing
        a ledger behind the log would leave the user one fix, deleting it -- which loses the ledger's numbers too;
        the maximum is right whatever the ledger says and asks nothing of anyone. A slot the ledger names at a
        generation below what the log records for it is not the ledger's process (an honest ledger is
        rewritten at every launch): it is launched above the floor, not adopted -- the kept actor, which reports
        its own generation, would refuse that adoption anyway."""
        recorded = self.epochs(engine_ids)
        epochs = tuple(
            None if k is None or k < logged.get(e, 0) else k for e, k in zip(engine_ids, recorded, strict=True)
        )
        floor = max([*(k.epoch for k in self.kept.values()), *logged.values(), 0])
        return epochs, floor

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
