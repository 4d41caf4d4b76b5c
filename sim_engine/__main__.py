"""``python -m sim_engine --engines N``: the simulated fleet; prints ``READY <control url>`` once it listens."""

from __future__ import annotations

import argparse
import asyncio
import socket

from aiohttp import web

from sim_engine.fleet import Fleet


def _latency(items: list[str]) -> dict[str, float]:
    out: dict[str, float] = {}
    for item in items:
        path, sep, seconds = item.partition("=")
        try:
            value = float(seconds)
        except ValueError:
            value = -1.0
        if not sep or value < 0:
            raise SystemExit(f"--latency {item!r}: write PATH=SECONDS, e.g. /update_weights_from_disk=0.3 (or *=0.1)")
        out[path] = value
    return out


async def main(args: argparse.Namespace) -> None:
    fleet = Fleet(args.engines, _latency(args.latency), args.host)
    runner = web.AppRunner(fleet.control(), access_log=None)
    await runner.setup()
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind((args.host, args.port))
    sock.listen(128)
    await web.SockSite(runner, sock).start()
    print(f"READY http://{args.host}:{sock.getsockname()[1]}", flush=True)
    await asyncio.Event().wait()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m sim_engine", description=__doc__)
    parser.add_argument("--engines", type=int, required=True, help="engine slots (each gets its own port)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="the control port (0: a free one)")
    parser.add_argument(
        "--latency",
        action="append",
        default=[],
        metavar="PATH=SECONDS",
        help="delay before answering PATH (repeatable; * for every path), e.g. /update_weights_from_disk=0.3",
    )
    asyncio.run(main(parser.parse_args()))
