"""The command line of ``python -m cpu_engine`` (``lifecycle-torch-engine``).

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

PROG = "lifecycle-torch-engine"


def _port(text: str) -> int:
    value = int(text)
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"must be in 0..65535, got {text}")
    return value


def _seconds(text: str) -> float:
    value = float(text)
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"must be >= 0 seconds, got {text}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG, description="A small CPU torch inference engine that speaks SGLang's HTTP API."
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    parser.add_argument("--port", type=_port, default=30000, help="port; 0 picks a free one")
    parser.add_argument("--seed", type=int, default=0, help="initial weights and sampling RNG seed")
    parser.add_argument("--api-key", default=None, help="require 'Authorization: Bearer KEY' (not on /health*)")
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
    parser.add_argument("--max-running-requests", type=int, default=16, help="KV cache slots (concurrent requests)")
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
    parser.add_argument("--torch-threads", type=int, default=1, help="torch intra-op threads (default 1)")
    return parser


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
    if args.max_running_requests < 1:
        return _error(f"--max-running-requests must be >= 1, got {args.max_running_requests}")
    if args.torch_threads < 1:
        return _error(f"--torch-threads must be >= 1, got {args.torch_threads}")
    if args.weights is not None and not Path(args.weights).exists():
        return _error(f"--weights: {args.weights}: no such file or directory")
    try:
        sock = bind(args.host, args.port)
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            return _error(
                f"--port {args.port}: {args.host}:{args.port} is already in use (use --port 0 for a free one)"
            )
        return _error(f"--host {args.host} --port {args.port}: cannot listen ({exc.strerror or exc})")
    from cpu_engine.app import run  # imports torch: only once the port is ours

    code = run(sock, args)
    # Shut down gracefully already; skip the interpreter's teardown of torch (seconds, nothing to save),
    # so that a SIGTERMed engine is gone at once.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
