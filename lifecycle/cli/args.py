"""The flags every ``lifecycle`` subcommand shares, for the built-in commands and for plug-ins.

A command that lives above ``lifecycle/`` (``lifecycle run`` in ``trainer/``) builds its parser
with these, so every command resolves a config the same way: miles' flag defaults, then
``--config FILE`` (by default the embedded CPU defaults, ``--config cpu``; ``--config none`` for
miles' bare defaults), then flags given explicitly.
"""

from __future__ import annotations

import argparse
from importlib import resources
from typing import Any

from lifecycle.decide.config import FLAG_BY_NAME, LifecycleConfig, add_lifecycle_arguments, load_config_file, nonblank
from lifecycle.decide.errors import ConfigError, UsageError

EMBEDDED = {"cpu": "cpu.toml"}


def _embedded(name: str) -> dict[str, Any]:
    path = resources.files("lifecycle") / "defaults" / EMBEDDED[name]
    with resources.as_file(path) as p:
        return load_config_file(p)


def flag_names() -> frozenset[str]:
    """The lifecycle settings' names as argparse stores them (``use_fault_tolerance``, ...)."""
    return frozenset(FLAG_BY_NAME)


def explicit_flags(ns: argparse.Namespace) -> dict[str, Any]:
    """The lifecycle flags given on this command line (defaults are suppressed, so absent ones are missing)."""
    names = flag_names()
    return {k: v for k, v in vars(ns).items() if k in names}


def add_config_arguments(parser: argparse.ArgumentParser) -> None:
    """``--config`` plus every lifecycle flag, with defaults suppressed so explicit flags win."""
    parser.add_argument(
        "--config",
        type=nonblank,
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
    explicit = explicit_flags(ns)
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


def no_subcommand(prog: str, parser: argparse.ArgumentParser, example: str) -> UsageError:
    """The error for a command group given without its command (``lifecycle``, ``lifecycle trace``): one paragraph
    naming the commands, where argparse printed the help page and exited 2."""
    names = [name for action in parser._actions if isinstance(action.choices, dict) for name in action.choices]
    return UsageError(
        prog, f"no command given (one of {', '.join(names)}). Fix: add one, e.g. `{example}`; `{prog} --help` says more"
    )


def add_debug_argument(parser: argparse.ArgumentParser) -> None:
    """``--debug`` on a subcommand too (``lifecycle explain --debug``)."""
    parser.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help="show tracebacks for errors")
