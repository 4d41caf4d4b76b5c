"""``lifecycle trace show|diff``: event logs in canonical form (the library is :mod:`lifecycle.trace`)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

from lifecycle.cli.args import add_debug_argument
from lifecycle.errors import ConfigError
from lifecycle.trace import Event, diff, line, load, torn_tail


def register(sub: Any) -> None:
    p = sub.add_parser("trace", help="show or compare lifecycle event logs (events.jsonl)")
    tsub = p.add_subparsers(dest="trace_command", metavar="SUBCOMMAND")
    d = tsub.add_parser("diff", help="first divergence of two event logs in canonical form (no timestamps)")
    d.add_argument("a", metavar="A")
    d.add_argument("b", metavar="B")
    d.add_argument("--only", action="append", metavar="MACHINE", help="compare only this machine (repeatable)")
    add_debug_argument(d)
    d.set_defaults(func=cmd_diff)
    s = tsub.add_parser("show", help="print an event log, one line per event")
    s.add_argument("file", metavar="FILE")
    s.add_argument("--only", action="append", metavar="MACHINE", help="show only this machine (repeatable)")
    add_debug_argument(s)
    s.set_defaults(func=cmd_show)
    p.set_defaults(func=lambda ns: (p.print_help(), 2)[1])


def _load(path: str, only: Sequence[str] | None) -> list[Event]:
    try:
        events = load(path, only)
        torn = torn_tail(path)
    except FileNotFoundError:
        raise ConfigError("trace", path, "the event log does not exist", "pass an events.jsonl file") from None
    except IsADirectoryError:
        raise ConfigError("trace", path, "a directory, not an event log", "pass its events.jsonl file") from None
    except OSError as exc:
        raise ConfigError("trace", path, f"cannot read it ({exc.strerror or exc})", "check the path") from None
    except ValueError as exc:
        raise ConfigError("trace", path, str(exc), "pass an events.jsonl written by lifecycle run") from None
    if torn:
        print(
            f"lifecycle trace: note: {path}: the last line is incomplete (the writer was killed mid-line); "
            "it was skipped, every complete line before it is shown",
            file=sys.stderr,
        )
    return events


def cmd_diff(ns: argparse.Namespace) -> int:
    left, right = _load(ns.a, ns.only), _load(ns.b, ns.only)
    scope = f" (machines: {', '.join(ns.only)})" if ns.only else ""
    found = diff(left, right)
    if found is None:
        print(f"no difference: {len(left)} events{scope}")
        return 0
    print(found.describe(ns.a, ns.b) + scope)
    return 1


def cmd_show(ns: argparse.Namespace) -> int:
    for e in _load(ns.file, ns.only):
        print(line(e))
    return 0
