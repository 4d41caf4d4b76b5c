"""``lifecycle explain``: every predicate's value for a config and which lifecycle gates are open."""

from __future__ import annotations

import argparse
import json
from typing import Any

from lifecycle.cli.args import add_config_arguments, add_debug_argument, config_from_args
from lifecycle.observe.explain import explain, render


def register(sub: Any) -> None:
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
    config = config_from_args(ns)
    if ns.json:
        print(json.dumps(explain(config), indent=2, sort_keys=False))
    else:
        print(render(config))
    return 0
