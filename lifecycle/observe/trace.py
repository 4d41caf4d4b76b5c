"""``lifecycle trace``: read, show and compare event logs in canonical form.

Canonical form drops volatile keys (timestamps), so two runs with the same config, seed and fault
schedule have equal logs line by line; ``diff`` reports the first divergence, optionally only for
one machine (``--only rollout``). Pure: no Ray, no torch.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from lifecycle.decide import jsonio
from lifecycle.decide.events import STARTED, canonical, is_torn_line, read_jsonl

Event = dict[str, Any]


def load(path: str | os.PathLike[str], only: Sequence[str] | None = None) -> list[Event]:
    """The canonical events of one log, optionally of some machines only."""
    events = [canonical(e) for e in read_jsonl(path)]  # objects, each typed as its writer types it
    if only:
        wanted = set(only)
        events = [e for e in events if e.get("machine") in wanted]
    return events


@dataclass(frozen=True)
class Divergence:
    index: int  # position in the (filtered) streams
    left: Event | None  # None: the left stream ended
    right: Event | None

    def describe(self, a: str = "A", b: str = "B") -> str:
        def show(e: Event | None) -> str:
            return "(end of log)" if e is None else line(e)

        return f"first difference at event {self.index}:\n  {a}: {show(self.left)}\n  {b}: {show(self.right)}"


def diff(left: Sequence[Event], right: Sequence[Event]) -> Divergence | None:
    for i in range(max(len(left), len(right))):
        a = left[i] if i < len(left) else None
        b = right[i] if i < len(right) else None
        if a != b:
            return Divergence(i, a, b)
    return None


def line(e: Event) -> str:
    """One event as one readable line."""
    ctx = " ".join(f"{k}={e[k]}" for k in ("step", "rollout_id") if k in e)
    if e.get("event") == "lifecycle.blocked":
        who = f"{_field(e, 'machine')}[{_field(e, 'instance')}]"
        core = f"{who} {_field(e, 'state')} {_arrow(e, 'x')} blocked by {_field(e, 'blocked_by')}"
    elif "src" in e:
        who = f"{_field(e, 'machine')}[{_field(e, 'instance')}]"
        core = f"{who} {_field(e, 'src')} {_arrow(e, '>')} {_field(e, 'dst')}"
        effects = e.get("effects")
        if effects and isinstance(effects, list):  # typed by read_jsonl; a caller's own dict may hold anything
            core += f"  effects={','.join(map(str, effects))}"
    elif e.get("event") == STARTED:
        config = e.get("config")
        settings = len(config) if isinstance(config, dict) else 0
        core = f"{STARTED}: {e.get('engines')} engines, {e.get('evals')} eval engines, {settings} settings"
    elif isinstance(e.get("event"), str) and "machine" not in e:  # a shell's fact: engine.weights engine-0 ...
        rest = " ".join(f"{k}={v}" for k, v in e.items() if k not in ("event", "instance", "step", "rollout_id"))
        core = " ".join(str(x) for x in (e["event"], e.get("instance"), rest) if x)
    else:
        core = json.dumps(e, sort_keys=True)
    return f"{ctx + '  ' if ctx else ''}{core}"


def _field(e: Event, key: str) -> str:
    """A value as text; one the event lacks (or holds as null) is ``?``, never Python's ``None``."""
    value = e.get(key)
    return "?" if value is None else str(value)


def _arrow(e: Event, head: str) -> str:
    """``--trigger-->``, or a bare ``-->`` when the event names no trigger."""
    trigger = e.get("trigger")
    return f"--{head}" if trigger is None else f"--{trigger}--{head}"


def torn_tail(path: str | os.PathLike[str]) -> bool:
    """Whether the log ends in a partial line (its writer was killed mid-write): ``load`` skips it."""
    with jsonio.open_regular(path) as f:
        f.seek(0, os.SEEK_END)
        if f.tell() == 0:
            return False
        f.seek(max(0, f.tell() - 65536))
        tail = f.read()
    last = tail.rsplit(b"\n", 1)[-1]
    if not last.strip():
        return False
    try:
        jsonio.loads(last, source=path, allow_nan=True)
    except jsonio.JSONFileError:
        return is_torn_line(last)
    return False
