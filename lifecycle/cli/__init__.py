"""The ``lifecycle`` command line.

Built-in commands (``explain``, ``check``, ``graph``, ``trace``) live here; commands that need the
runtime (``run``: Ray, torch) live in higher packages and plug in through the entry-point group
``rl_lifecycle.commands`` (each entry a ``register(subparsers)`` function), so ``lifecycle/``
imports nothing above itself. Bad input prints one paragraph naming the flag or file and exits 2;
``--debug`` shows the traceback.
"""

from __future__ import annotations

import argparse
import sys
import traceback
from collections.abc import Callable, Iterable, Sequence
from importlib.metadata import EntryPoint, entry_points
from typing import Any

from lifecycle.cli import check, explain, graph, trace
from lifecycle.cli.args import no_subcommand
from lifecycle.decide.config import RaisingParser
from lifecycle.decide.errors import LifecycleError, UsageError

COMMAND_GROUP = "rl_lifecycle.commands"
Registrar = Callable[[Any], None]
BUILTIN: tuple[Registrar, ...] = (explain.register, check.register, graph.register, trace.register)


def plugin_commands() -> list[EntryPoint]:
    """The commands other installed packages add (``lifecycle run`` from ``trainer``), by name."""
    return sorted(entry_points(group=COMMAND_GROUP), key=lambda ep: ep.name)


def _register_plugin(sub: Any, ep: EntryPoint) -> None:
    """Load one plug-in command; one that cannot load still shows up and says why when called."""
    try:
        register: Registrar = ep.load()
        register(sub)
    except ImportError as exc:
        problem = (
            f"`lifecycle {ep.name}` is provided by {ep.value}, which cannot be imported ({exc}). "
            "Fix: install the runtime extras, e.g. pip install 'rl-lifecycle[engines,ray,plot,hf,router]' "
            "(torch==2.13.0 first)"
        )
        # any flag the user passes is taken as a plain word (no prefix chars): the command only explains
        p = sub.add_parser(ep.name, help=f"(unavailable: {exc})", add_help=False, prefix_chars="\0")
        p.add_argument("rest", nargs="*")

        def unavailable(ns: argparse.Namespace) -> int:
            raise LifecycleError(problem)

        p.set_defaults(func=unavailable)


class _Parser(RaisingParser):
    """The CLI's parser: its own class, so a test can swap ``error`` back to argparse's for the CLI only."""


def build_parser(plugins: Iterable[EntryPoint] | None = None) -> argparse.ArgumentParser:
    parser = _Parser(
        prog="lifecycle",
        description="rl-lifecycle: explicit, checkable lifecycle machines for RL post-training jobs.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="examples:\n"
        "  lifecycle explain                                  # the embedded CPU defaults\n"
        "  lifecycle explain --use-fault-tolerance --ft-components train --rollout-num-gpus 8\n"
        "  lifecycle explain --config examples/replay.toml --json\n"
        "  lifecycle run --steps 6 --inject kill-engine:1@3   # the RL loop (needs the runtime extras)\n",
    )
    parser.add_argument("--debug", action="store_true", help="show tracebacks for errors")
    parser.set_defaults(func=lambda ns: _no_command(parser))  # a command's own func replaces it
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for register in BUILTIN:
        register(sub)
    for ep in plugin_commands() if plugins is None else plugins:
        _register_plugin(sub, ep)
    return parser


def _no_command(parser: argparse.ArgumentParser) -> int:
    """``lifecycle`` alone: one paragraph naming the commands (it printed the help page and exited 2)."""
    raise no_subcommand("lifecycle", parser, "lifecycle explain")


def _paragraph(exc: BaseException) -> str:
    """The error as one paragraph: parser messages (YAML, TOML) carry line breaks and blank lines."""
    return " ".join(str(exc).split())


def _report(prog: str, exc: BaseException, debug: bool, *, cause: BaseException | None = None) -> int:
    if debug:
        traceback.print_exception(cause or exc, file=sys.stderr)
    print(f"{prog}: error: {_paragraph(exc)}", file=sys.stderr)
    return 2


def main(argv: Sequence[str] | None = None) -> int:
    """Bad input -- a rejected flag, a ``ConfigError``, any ``LifecycleError``, a file the OS refuses --
    is one paragraph on stderr and exit 2; ``--debug`` prints the traceback above it (still exit 2)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    try:
        ns = parser.parse_args(argv)
    except UsageError as exc:
        return _report(exc.prog, exc, "--debug" in argv)
    func: Callable[[argparse.Namespace], int] = ns.func
    prog = f"lifecycle {ns.command}" if ns.command else "lifecycle"
    try:
        return func(ns)
    except BrokenPipeError:  # `lifecycle trace show ... | head`: the reader has what it wanted
        sys.stderr.close()
        return 0
    except LifecycleError as exc:  # ConfigError, UsageError, ReplayDataError, EngineError, ...
        return _report(prog, exc, ns.debug)
    except OSError as exc:
        if exc.filename is None:  # not a file problem: a bug or an environment failure, show it whole
            raise
        problem = LifecycleError(
            f"{exc.filename}: {exc.strerror or exc}. Fix: check that the path exists and is readable/writable"
        )
        return _report(prog, problem, ns.debug, cause=exc)


__all__ = ["BUILTIN", "COMMAND_GROUP", "build_parser", "main", "plugin_commands"]
