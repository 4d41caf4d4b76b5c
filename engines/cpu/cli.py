"""The command line of ``python -m engines.cpu`` (``lifecycle-torch-engine``).

The port is bound *before* torch is imported, so a taken port fails in well under a second with
one line naming it (exit 2); so does a missing ``--weights`` directory. Once the model is loaded and
the server listens it prints one line ``READY http://HOST:PORT`` (``--port 0`` picks a free port).
"""

from __future__ import annotations

import argparse
import errno
import os
import socket
import sys
from collections.abc import Sequence
from pathlib import Path

from engines.apikey import API_KEY_ENV, given_api_key  # by environment: unlike --api-key, not in /proc/PID/cmdline
from engines.cliargs import OneLineParser, bounded_int, bounded_seconds, port

PROG = "lifecycle-torch-engine"


MAX_API_KEY_FILE_BYTES = 4096
MAX_RUNNING_REQUESTS = 4096  # slots of one CPU engine's KV pool; far more than one CPU decodes in turn
_seconds = bounded_seconds("give a finite number of seconds >= 0")


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog=PROG, description="A small CPU torch inference engine that speaks SGLang's HTTP API.")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    parser.add_argument("--port", type=port, default=30000, help="port; 0 picks a free one")
    parser.add_argument(
        "--seed",
        type=bounded_int(-(1 << 63), (1 << 64) - 1, "give a seed that fits in 64 bits"),
        default=0,
        help="initial weights and sampling RNG seed (64 bits)",
    )
    keys = parser.add_mutually_exclusive_group()
    keys.add_argument(
        "--api-key",
        default=None,
        help="require 'Authorization: Bearer KEY' (not on /health*); visible to other users in the process "
        f"list: prefer --api-key-file or ${API_KEY_ENV}",
    )
    keys.add_argument(
        "--api-key-file", default=None, help="read the API key from this file (mode 0600: the owner's only)"
    )
    parser.add_argument(
        "--weights",
        default=None,
        help="Hugging Face checkpoint directory (config.json + model.safetensors) to load at start; its "
        "config.json's model_type picks the model: the char model (of --model-size), or any local transformers "
        "causal LM with its tokenizer (pip install 'rl-lifecycle[hf]')",
    )
    parser.add_argument("--weight-version", default="default", help="initial weight version (SGLang's default)")
    parser.add_argument(
        "--model-size", choices=("tiny", "small"), default="tiny", help="the char model's size (not a HF model's)"
    )
    parser.add_argument(
        "--max-running-requests",
        type=bounded_int(1, MAX_RUNNING_REQUESTS, f"give 1..{MAX_RUNNING_REQUESTS} KV cache slots"),
        default=16,
        help=f"KV cache slots (concurrent requests), 1..{MAX_RUNNING_REQUESTS}",
    )
    parser.add_argument(
        "--step-delay-s", type=_seconds, default=0.0, help="sleep after each decode step (a slower engine)"
    )
    parser.add_argument("--startup-delay-s", type=_seconds, default=0.0, help="listen but answer 503 this long first")
    parser.add_argument(
        "--weight-group-timeout-s",
        type=_seconds,
        default=60.0,
        help="deadline of every weight-update group call: joining, each broadcast (default 60)",
    )
    parser.add_argument(
        "--torch-threads",
        type=bounded_int(1, 1024, "give 1..1024 threads"),
        default=1,
        help="torch intra-op threads (default 1)",
    )
    return parser


def api_key(args: argparse.Namespace) -> str | None:
    """The key from --api-key, --api-key-file or $LIFECYCLE_ENGINE_API_KEY (None: no key); ValueError
    names the file and what is wrong with it."""
    if args.api_key is not None:
        return str(args.api_key) or None
    if args.api_key_file is not None:
        path = Path(args.api_key_file)
        try:
            with open(path, "rb") as f:
                raw = f.read(MAX_API_KEY_FILE_BYTES + 1)
        except OSError as exc:
            raise ValueError(
                f"--api-key-file {path}: cannot read it ({exc.strerror or exc}); Fix: give a file that holds the key"
            ) from None
        try:
            key = raw.decode("utf-8").strip()
        except UnicodeDecodeError:
            key = ""
        if len(raw) > MAX_API_KEY_FILE_BYTES or not key or any(c.isspace() for c in key):
            raise ValueError(
                f"--api-key-file {path}: not one key of 1..{MAX_API_KEY_FILE_BYTES} UTF-8 characters without "
                "spaces; Fix: write the key alone in the file"
            )
        return key
    return given_api_key()


def bind(host: str, port: int) -> socket.socket:
    """A listening socket, or OSError (EADDRINUSE for a taken port)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(128)
    except OSError:
        sock.close()
        raise
    sock.setblocking(False)
    return sock


def _error(message: str) -> int:
    print(f"{PROG}: error: {message}", file=sys.stderr, flush=True)
    return 2


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        args.api_key = api_key(args)
    except ValueError as exc:
        return _error(str(exc))
    if args.weights is not None and not Path(args.weights).exists():
        return _error(
            f"--weights: {args.weights}: no such file or directory; Fix: give a checkpoint directory "
            "(config.json + model.safetensors)"
        )
    try:
        sock = bind(args.host, args.port)
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            return _error(
                f"--port {args.port}: {args.host}:{args.port} is already in use; Fix: use --port 0 for a free one"
            )
        return _error(
            f"--host {args.host} --port {args.port}: cannot listen ({exc.strerror or exc}); Fix: give an address "
            "of this machine and a free port (--port 0 picks one)"
        )
    from engines.cpu.app import run  # imports torch: only once the port is ours

    code = run(sock, args)
    # Shut down gracefully already; skip the interpreter's teardown of torch (seconds, nothing to save),
    # so that a SIGTERMed engine is gone at once.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
