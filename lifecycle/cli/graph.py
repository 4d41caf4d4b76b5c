"""``lifecycle graph``: export, check and regenerate the state graphs (the library is :mod:`lifecycle.graph`)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from lifecycle.cli.args import add_config_arguments, add_debug_argument, config_from_args, explicit_flags
from lifecycle.decide.config import LifecycleConfig, nonblank
from lifecycle.decide.errors import ConfigError, LifecycleError
from lifecycle.decide.machines import MACHINES
from lifecycle.decide.presets import PRESETS, preset
from lifecycle.graph import (
    FORMATS,
    INACTIVE_MARK,
    build_review,
    check_golden,
    config_label,
    graph_document,
    load_json,
    render,
    to_dot,
    to_json,
    to_mermaid,
    to_mermaid_markdown,
    write_golden,
)
from lifecycle.observe.outputs import check_output


def register(sub: Any) -> None:
    p = sub.add_parser(
        "graph",
        help="export the state graphs (mermaid, DOT, JSON, SVG, PNG, HTML review page)",
        description="Export the lifecycle machines' state graphs under a config or a preset. Edges show their "
        "guards' values; edges whose guard is false are drawn dashed/grey (mermaid: marked with "
        f"{INACTIVE_MARK}) or left out with --prune.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="examples:\n"
        "  lifecycle graph --machine engine --preset ft-train\n"
        "  lifecycle graph --format svg --preset replay -o replay.svg\n"
        "  lifecycle graph --format json --preset ft-rollout -o ref.json   # on main\n"
        "  lifecycle graph --format html --compare ref.json -o review.html  # on your branch\n"
        "  lifecycle graph --check docs/graphs    # CI: are the committed graphs current?\n"
        "  lifecycle graph --write docs/graphs    # regenerate them after a spec change\n",
    )
    p.add_argument("--machine", choices=[*MACHINES, "all"], default="all", help="which machine (default: all)")
    p.add_argument("--format", choices=FORMATS, default="mermaid", help="output format (default: mermaid)")
    p.add_argument("-o", "--output", type=nonblank, metavar="FILE", help="write here (default: stdout)")
    p.add_argument("--preset", choices=PRESETS, help="a named config from lifecycle/decide/presets.py instead of flags")
    p.add_argument("--prune", action="store_true", help="omit inactive edges and states unreachable under the config")
    p.add_argument(
        "--compare",
        type=nonblank,
        metavar="REF_JSON",
        help="html: highlight edge changes against an earlier JSON export",
    )
    mode = p.add_mutually_exclusive_group()
    mode.add_argument(
        "--check", type=nonblank, metavar="DIR", help="exit 1 with a diff when DIR's golden graphs are out of date"
    )
    mode.add_argument("--write", type=nonblank, metavar="DIR", help="regenerate the golden graphs in DIR")
    add_debug_argument(p)
    add_config_arguments(p)
    p.set_defaults(func=cmd_graph)


def _config(ns: argparse.Namespace) -> tuple[LifecycleConfig, str | None]:
    if ns.preset is None:
        return config_from_args(ns, check_paths=False), None
    explicit = sorted(explicit_flags(ns))
    if explicit or ns.config != "cpu":
        given = ", ".join("--" + k.replace("_", "-") for k in explicit) or f"--config {ns.config}"
        problem = f"a preset is a whole config, but {given} was given too"
        raise ConfigError("--preset", ns.preset, problem, "use either --preset or config flags")
    return preset(ns.preset), ns.preset


def cmd_graph(ns: argparse.Namespace) -> int:
    if ns.check is not None:
        return _cmd_check(ns.check)
    if ns.write is not None:
        changed = write_golden(ns.write)
        print(f"{ns.write}: {len(changed)} file(s) rewritten" if changed else f"{ns.write}: already up to date")
        return 0
    config, preset_name = _config(ns)
    machines = list(MACHINES) if ns.machine == "all" else [ns.machine]
    if ns.compare is not None and ns.format != "html":
        raise LifecycleError("--compare only applies to --format html. Fix: add --format html, or drop --compare")
    if ns.format == "html":
        ref = load_json(ns.compare) if ns.compare else None
        page = build_review(config, preset_name, machines, prune=ns.prune, reference=ref, reference_name=ns.compare)
        return _emit(page.encode("utf-8"), ns.output, binary=False, inputs=[ns.compare] if ns.compare else [])
    doc = graph_document(config, machines, preset_name=preset_name, prune=ns.prune)
    if ns.format == "json":
        text = to_json(doc)
    elif ns.format == "mermaid":
        only = list(doc["machines"].values())
        text = (
            to_mermaid(only[0], title=f"{only[0]['name']} under {config_label(doc['config'])}")
            if len(only) == 1
            else to_mermaid_markdown(doc)
        )
    elif ns.format == "dot":
        text = to_dot(doc)
    else:
        data = render(to_dot(doc), ns.format)
        return _emit(data, ns.output, binary=ns.format == "png")
    return _emit(text.encode("utf-8"), ns.output, binary=False)


def _cmd_check(directory: str) -> int:
    if not Path(directory).is_dir():  # a typo must not read as "every golden graph is missing"
        raise ConfigError(
            "--check",
            directory,
            "not a directory",
            "pass the golden graphs folder (docs/graphs); create one with --write",
        )
    problems = check_golden(directory)
    if not problems:
        print(f"{directory}: the committed graphs match the specs")
        return 0
    for diff in problems:
        sys.stdout.write(diff if diff.endswith("\n") else diff + "\n")
    print(
        f"\n{directory}: {len(problems)} graph file(s) differ from what lifecycle/decide/machines.py produces. "
        f"If the spec change is intended, run `lifecycle graph --write {directory}` and commit the result."
    )
    return 1


def _emit(data: bytes, output: str | None, *, binary: bool, inputs: Sequence[str] = ()) -> int:
    if output:
        check_output(output, flag="-o", inputs=inputs)  # never the --compare file, never a file it did not write
        try:
            Path(output).write_bytes(data)
        except OSError as exc:
            raise ConfigError(
                "-o", output, f"cannot write there ({exc.strerror or exc})", "pick a writable path"
            ) from None
        return 0
    if not binary:
        sys.stdout.write(data.decode("utf-8"))
        return 0
    if sys.stdout.isatty():
        raise LifecycleError("PNG is binary: pass -o FILE (or redirect stdout)")
    sys.stdout.flush()
    sys.stdout.buffer.write(data)
    sys.stdout.flush()
    return 0
