"""``lifecycle trace show|diff|check|timeline``: event logs read, compared, judged and drawn (libraries:
:mod:`lifecycle.observe.trace`, :mod:`lifecycle.observe.monitor`, :mod:`lifecycle.observe.timeline`)."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

from lifecycle.cli.args import add_debug_argument, no_subcommand
from lifecycle.cli.trace_check import add_check_parser
from lifecycle.decide.config import nonblank
from lifecycle.decide.errors import ConfigError
from lifecycle.decide.schema import SchemaError
from lifecycle.observe.outputs import check_output
from lifecycle.observe.timeline import load_events
from lifecycle.observe.timeline_page import output_path, write_page
from lifecycle.observe.trace import Event, diff, line, load, torn_tail


def register(sub: Any) -> None:
    p = sub.add_parser("trace", help="show, compare or check lifecycle event logs (events.jsonl)")
    tsub = p.add_subparsers(dest="trace_command", metavar="SUBCOMMAND")
    d = tsub.add_parser("diff", help="first divergence of two event logs in canonical form (no timestamps)")
    d.add_argument("a", type=nonblank, metavar="A")
    d.add_argument("b", type=nonblank, metavar="B")
    d.add_argument("--only", action="append", metavar="MACHINE", help="compare only this machine (repeatable)")
    add_debug_argument(d)
    d.set_defaults(func=cmd_diff)
    s = tsub.add_parser("show", help="print an event log, one line per event")
    s.add_argument("file", type=nonblank, metavar="FILE")
    s.add_argument("--only", action="append", metavar="MACHINE", help="show only this machine (repeatable)")
    add_debug_argument(s)
    s.set_defaults(func=cmd_show)
    add_check_parser(tsub, _load)
    add_timeline_parser(tsub)
    add_debug_argument(p)
    p.set_defaults(func=lambda ns: _no_subcommand(p))


def _no_subcommand(p: argparse.ArgumentParser) -> int:
    raise no_subcommand("lifecycle trace", p, "lifecycle trace show RUN_DIR/events.jsonl")


def _read(path: str, read: Callable[[str], list[Event]], *, flag: str = "trace", verb: str = "shown") -> list[Event]:
    """Read a log with ``read``; every way it can be unreadable is one ``ConfigError`` naming the file. Every
    subcommand comes here, and ``read`` goes through :func:`lifecycle.decide.events.read_jsonl` (bounded, line
    by line, regular files only, each event checked against its kind's schema)."""
    if not os.path.exists(path):
        raise ConfigError(flag, path, "the event log does not exist", "pass an events.jsonl file")
    if os.path.isdir(path):
        raise ConfigError(flag, path, "a directory, not an event log", "pass its events.jsonl file")
    try:
        events = read(path)
        torn = torn_tail(path)
    except FileNotFoundError:
        raise ConfigError(flag, path, "the event log does not exist", "pass an events.jsonl file") from None
    except IsADirectoryError:
        raise ConfigError(flag, path, "a directory, not an event log", "pass its events.jsonl file") from None
    except OSError as exc:
        raise ConfigError(flag, path, f"cannot read it ({exc.strerror or exc})", "check the path") from None
    except SchemaError as exc:  # a line's field typed otherwise than its writer types it
        raise ConfigError(flag, path, str(exc), exc.fix) from None
    except ValueError as exc:
        raise ConfigError(flag, path, str(exc), "pass an events.jsonl written by lifecycle run") from None
    if torn:
        print(
            f"lifecycle trace: note: {path}: the last line is incomplete (the writer was killed mid-line); "
            f"it was skipped, every complete line before it is {verb}",
            file=sys.stderr,
        )
    return events


def _load(path: str, only: Sequence[str] | None) -> list[Event]:
    return _read(path, lambda p: load(p, only))


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


# -- lifecycle trace timeline: the run as one offline HTML page (the library is lifecycle.observe.timeline) --


def add_timeline_parser(tsub: Any) -> None:
    t = tsub.add_parser(
        "timeline",
        help="write a one-file HTML timeline of a run: a lane per machine instance, faults, guard rejections",
        description="Draws every machine instance's states over wall time, one lane each, with faults, guard "
        "rejections, invariant violations and the step axis marked; details on hover. The page is one "
        "self-contained file (no network), for an incident report or a CI artifact.",
    )
    t.add_argument("file", metavar="FILE", help="an events.jsonl (a torn last line is skipped)")
    t.add_argument("-o", "--output", metavar="OUT", help="the HTML file to write (default: timeline.html next to FILE)")
    t.add_argument(
        "--linear", action="store_true", help="draw long quiet gaps at their true width (default: narrow, hatched)"
    )
    add_debug_argument(t)
    t.set_defaults(func=cmd_timeline)


def _load_timed(path: str) -> list[Event]:
    """The raw events (timestamps kept, unlike :func:`_load`), with the same errors and torn-line note."""
    return _read(path, load_events, flag="trace timeline", verb="drawn")


def cmd_timeline(ns: argparse.Namespace) -> int:
    out = check_output(output_path(ns.file, ns.output), flag="-o", inputs=[ns.file])  # before anything is read
    events = _load_timed(ns.file)
    try:
        written = write_page(events, ns.file, out, compress_gaps=not ns.linear)
    except OSError as exc:
        raise ConfigError(
            "-o", str(out), f"cannot write the page ({exc.strerror or exc})", "pass a writable -o path"
        ) from None
    print(written)
    return 0
