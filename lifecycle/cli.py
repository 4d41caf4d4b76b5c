"""The ``lifecycle`` command line.

Config resolution, lowest to highest: miles' flag defaults, then ``--config FILE`` (by default
the embedded CPU defaults, ``--config cpu``; ``--config none`` for miles' bare defaults), then
flags given explicitly. Bad input prints one paragraph naming the flag or file and exits 2;
``--debug`` shows the traceback.
"""

from __future__ import annotations

import argparse
import json
import sys
import traceback
from collections.abc import Callable, Sequence
from importlib import resources
from typing import Any

from lifecycle.config import LifecycleConfig, RaisingParser, add_lifecycle_arguments, load_config_file
from lifecycle.errors import ConfigError, LifecycleError, UsageError

EMBEDDED = {"cpu": "cpu.toml"}


def _embedded(name: str) -> dict[str, Any]:
    path = resources.files("lifecycle") / "defaults" / EMBEDDED[name]
    with resources.as_file(path) as p:
        return load_config_file(p)


def add_config_arguments(parser: argparse.ArgumentParser) -> None:
    """``--config`` plus every lifecycle flag, with defaults suppressed so explicit flags win."""
    parser.add_argument(
        "--config",
        default="cpu",
        metavar="FILE",
        help="TOML/YAML/JSON settings file; 'cpu' = the embedded CPU defaults (default), 'none' = miles' defaults",
    )
    add_lifecycle_arguments(parser, suppress_defaults=True)


def config_from_args(ns: argparse.Namespace, *, check_paths: bool = True) -> LifecycleConfig:
    """Merge file settings and explicit flags into one validated config."""
    values: dict[str, Any] = {}
    source = ns.config
    if source in EMBEDDED:
        values.update(_embedded(source))
        source = f"embedded {source} defaults"
    elif source not in (None, "none"):
        values.update(load_config_file(source))
    from_file = {str(k).lstrip("-").replace("-", "_") for k in values}
    explicit = {k: v for k, v in vars(ns).items() if k.replace("-", "_") in _flag_names()}
    values.update(explicit)
    try:
        config = LifecycleConfig.from_mapping(values, check_paths=check_paths, source=None)
    except ConfigError as exc:
        key = exc.flag.lstrip("-").replace("-", "_")
        if exc.source is None and key in from_file and key not in explicit:  # the value came from the file: say so
            raise exc.with_source(str(source)) from None
        raise
    config.emit_warnings()
    return config


def _flag_names() -> set[str]:
    from lifecycle.config import FLAG_BY_NAME

    return set(FLAG_BY_NAME)


def add_debug_argument(parser: argparse.ArgumentParser) -> None:
    """``--debug`` on a subcommand too (``lifecycle explain --debug``)."""
    parser.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help="show tracebacks for errors")


# -- commands ----------------------------------------------------------------------------------
# Each command module exposes register(subparsers); adding a command is one line here.
def _registrars() -> list[Callable[[Any], None]]:
    from lifecycle.check_cli import register_check
    from lifecycle.graph import register_graph
    from lifecycle.run_cli import register_run
    from lifecycle.trace import register_trace

    return [register_explain, register_check, register_graph, register_run, register_trace]


def register_explain(sub: Any) -> None:
    p = sub.add_parser(
        "explain",
        help="print what a config constructs, starts, monitors and recovers",
        description="Print every predicate's value for a config and which lifecycle gates are open.",
    )
    p.add_argument("--json", action="store_true", help="machine-readable output")
    add_debug_argument(p)
    add_config_arguments(p)
    p.set_defaults(func=cmd_explain)


def cmd_explain(ns: argparse.Namespace) -> int:
    from lifecycle.explain import explain, render

    config = config_from_args(ns)
    if ns.json:
        print(json.dumps(explain(config), indent=2, sort_keys=False))
    else:
        print(render(config))
    return 0


class _Parser(RaisingParser):
    """The CLI's parser: its own class, so a test can swap ``error`` back to argparse's for the CLI only."""


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="lifecycle",
        description="rl-lifecycle: explicit, checkable lifecycle machines for RL post-training jobs.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="examples:\n"
        "  lifecycle explain                                  # the embedded CPU defaults\n"
        "  lifecycle explain --use-fault-tolerance --ft-components train --rollout-num-gpus 8\n"
        "  lifecycle explain --config examples/replay.toml --json\n",
    )
    parser.add_argument("--debug", action="store_true", help="show tracebacks for errors")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    for register in _registrars():
        register(sub)
    return parser


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
    func: Callable[[argparse.Namespace], int] | None = getattr(ns, "func", None)
    if func is None:
        parser.print_help()
        return 2
    prog = f"lifecycle {ns.command}"
    try:
        return func(ns)
    except LifecycleError as exc:  # ConfigError, UsageError, ReplayDataError, EngineError, ...
        return _report(prog, exc, ns.debug)
    except OSError as exc:
        if exc.filename is None:  # not a file problem: a bug or an environment failure, show it whole
            raise
        problem = LifecycleError(
            f"{exc.filename}: {exc.strerror or exc}. Fix: check that the path exists and is readable/writable"
        )
        return _report(prog, problem, ns.debug, cause=exc)


if __name__ == "__main__":
    sys.exit(main())
