"""``lifecycle trace check``: judge a finished (or torn) event log with the live invariant monitor's rules."""

from __future__ import annotations

import argparse
from typing import Any

from lifecycle.check.invariants import INVARIANTS
from lifecycle.cli.args import add_debug_argument
from lifecycle.decide.config import LifecycleConfig, nonblank
from lifecycle.decide.errors import ConfigError, bounded_repr
from lifecycle.decide.events import STARTED
from lifecycle.observe.monitor import JUDGED, EventMonitor, Violation
from lifecycle.observe.trace import Event, line

CONTEXT = 6  # events shown before the one that broke an invariant


def add_check_parser(tsub: Any, load: Any) -> None:
    c = tsub.add_parser(
        "check",
        help="judge an event log against the invariants events can show; exit 1 naming the first violation",
        description="Replays the log through the live invariant monitor (the same rules `lifecycle run` applies "
        "as it writes the log). The config is read from the log's lifecycle.started line, or --config. "
        f"Judged: {', '.join(JUDGED)}.",
    )
    c.add_argument(
        "file", nargs="?", type=nonblank, metavar="FILE", help="an events.jsonl (a torn last line is skipped)"
    )
    c.add_argument("--list", action="store_true", help="print the invariants judged, each with its rule, and exit")
    c.add_argument(
        "--config", type=nonblank, metavar="FILE", help="settings file for a log without a lifecycle.started line"
    )
    c.add_argument(
        "--invariant", action="append", choices=JUDGED, metavar="NAME", help="judge only this one (repeatable)"
    )
    c.add_argument("--all", action="store_true", help="list every violation, not only the first")
    add_debug_argument(c)
    c.set_defaults(func=lambda ns: cmd_check(ns, load))


def _config(path: str | None) -> LifecycleConfig | None:
    if path is None:
        return None
    return LifecycleConfig.from_file(path, check_paths=False)


def describe(events: list[Event], v: Violation) -> str:
    """The violation, its invariant's rule, and the events around it (the related ones marked)."""
    doc = INVARIANTS[v.invariant].doc
    lines = [f"invariant {v.invariant} violated at event {v.index + 1}: {v.problem}", f"  rule: {doc}", "  context:"]
    shown = sorted({*range(max(0, v.index - CONTEXT), v.index + 1), *v.related})
    for i in shown:
        mark = ">>" if i == v.index else " *" if i in v.related else "  "
        lines.append(f"  {mark} {i + 1:>5}  {line(events[i])}")
    return "\n".join(lines)


def list_judged() -> str:
    """Every invariant an event log is judged against, with its rule (``--list``)."""
    return "\n".join(f"{name}\n  {INVARIANTS[name].doc}" for name in JUDGED)


def cmd_check(ns: argparse.Namespace, load: Any) -> int:
    if ns.list:
        print(list_judged())
        return 0
    if ns.file is None:
        raise ConfigError("trace check", None, "no event log given", "pass FILE (an events.jsonl), or --list")
    events: list[Event] = load(ns.file, None)
    config = _config(ns.config)
    if config is None and not any(e.get("event") == STARTED for e in events):
        raise ConfigError(
            "trace check",
            ns.file,
            "the log has no lifecycle.started line, so its config is unknown",
            "pass --config FILE with the run's settings (logs written by lifecycle run carry it)",
        )
    monitor = EventMonitor(config, only=ns.invariant)
    try:
        found = monitor.feed_all(events) + monitor.finish()
    except ConfigError as exc:  # the config of a lifecycle.started line (the reader typed it; its values are here)
        raise ConfigError(
            "trace check",
            ns.file,
            f"the config of its {STARTED} event (event {monitor.index + 1}) is not one this version accepts "
            f"({exc.flag}: {exc.problem}, got {bounded_repr(exc.value)})",
            "pass --config FILE with the run's settings, or check the log with the version that wrote it",
        ) from None
    judged = sorted(monitor.only)
    if not found:
        print(f"ok: {len(events)} events, no violation of {len(judged)} invariants ({', '.join(judged)})")
        return 0
    for v in found if ns.all else found[:1]:
        print(describe(events, v))
    if not ns.all and len(found) > 1:
        print(f"({len(found) - 1} more violations: --all lists them)")
    return 1
