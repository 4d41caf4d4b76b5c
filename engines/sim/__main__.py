"""``python -m engines.sim --engines N``: the simulated fleet; prints ``READY <control url>`` once it listens."""

from __future__ import annotations

import argparse
import asyncio
import socket
import sys

from aiohttp import web

from engines.cliargs import MAX_SECONDS, OneLineParser, bounded_int, bounded_seconds, port, shown
from engines.sim.fleet import Fleet

PROG = "lifecycle-sim-engine"  # python -m engines.sim
MAX_ENGINES = 1024  # each slot listens on a port of its own
_seconds = bounded_seconds("give a finite number of seconds >= 0")


def _latency(items: list[str]) -> dict[str, float]:
    out: dict[str, float] = {}
    for item in items:
        path, sep, seconds = item.partition("=")
        try:
            value = _seconds(seconds)
        except argparse.ArgumentTypeError:
            value = -1.0
        if not sep or value < 0:
            raise ValueError(
                f"--latency {shown(item)!r}: not PATH=SECONDS; Fix: give seconds in 0..{MAX_SECONDS:g}, "
                "e.g. /update_weights_from_disk=0.3 (or *=0.1)"
            )
        out[path] = value
    return out


async def main(args: argparse.Namespace, latency: dict[str, float], sock: socket.socket) -> None:
    fleet = Fleet(args.engines, latency, args.host)
    runner = web.AppRunner(fleet.control(), access_log=None)
    await runner.setup()
    await web.SockSite(runner, sock).start()
    print(f"READY http://{args.host}:{sock.getsockname()[1]}", flush=True)
    await asyncio.Event().wait()


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog=PROG, description=__doc__)
    parser.add_argument(
        "--engines",
        type=bounded_int(1, MAX_ENGINES, f"give 1..{MAX_ENGINES} engine slots"),
        required=True,
        help="engine slots (each gets its own port)",
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=port, default=0, help="the control port (0: a free one)")
    parser.add_argument(
        "--latency",
        action="append",
        default=[],
        metavar="PATH=SECONDS",
        help="delay before answering PATH (repeatable; * for every path), e.g. /update_weights_from_disk=0.3",
    )
    return parser


def cli(argv: list[str] | None = None) -> int:
    """Every flag is checked (one line, exit 2) before the fleet binds anything."""
    args = build_parser().parse_args(argv)
    try:
        latency = _latency(args.latency)
    except ValueError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr, flush=True)
        return 2
    try:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.bind((args.host, args.port))
        sock.listen(128)
    except OSError as exc:
        print(
            f"{PROG}: error: --host {shown(args.host)} --port {args.port}: cannot listen ({exc.strerror or exc}); "
            "Fix: use --port 0 for a free port",
            file=sys.stderr,
            flush=True,
        )
        return 2
    asyncio.run(main(args, latency, sock))
    return 0


if __name__ == "__main__":
    sys.exit(cli())
