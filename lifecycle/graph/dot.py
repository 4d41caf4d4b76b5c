"""Graphviz: DOT source for one or many machines, and SVG/PNG through the ``dot`` program."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Mapping, Sequence

from lifecycle.decide.errors import LifecycleError
from lifecycle.graph.model import ConfigJSON, GraphJSON, MachineJSON, edge_label


def _q(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def _attrs(attrs: Mapping[str, str]) -> str:
    return "[" + ", ".join(f"{k}={v}" for k, v in attrs.items()) + "]"


def _dot_body(machine: MachineJSON, node_prefix: str, id_prefix: str, indent: str) -> list[str]:
    lines: list[str] = []
    start = node_prefix + "__start__"
    lines.append(f"{indent}{_q(start)} {_attrs({'shape': 'point', 'width': '0.15', 'label': _q('')})}")
    for s in machine["states"]:
        attrs = {"label": _q(s["name"]), "id": _q(f"{id_prefix}{machine['name']}/state/{s['name']}")}
        if s["doc"]:
            attrs["tooltip"] = _q(s["doc"])
        styles = ["rounded"]
        if s["terminal"]:
            attrs["peripheries"] = "2"
        if s["marked"]:
            styles.append("filled")
            attrs.update(fillcolor=_q("#fdecea"), color=_q("#c62828"), fontcolor=_q("#7f1d1d"))
        if not s["reachable"]:
            styles.append("dashed")
            attrs.update(color=_q("#e57373" if s["marked"] else "#9e9e9e"), fontcolor=_q("#9e9e9e"))
            if s["marked"]:
                attrs["fillcolor"] = _q("#f2f2f2")
        attrs["style"] = _q(",".join(styles))
        lines.append(f"{indent}{_q(node_prefix + s['name'])} {_attrs(attrs)}")
    names = {s["name"] for s in machine["states"]}
    if machine["initial"] in names:
        lines.append(f"{indent}{_q(start)} -> {_q(node_prefix + machine['initial'])}")
    reachable = {s["name"] for s in machine["states"] if s["reachable"]}
    for e in machine["edges"]:
        label = edge_label(e)
        if e["effects"] and " / " in label:
            label = label.replace(" / ", "\n/ ", 1)
        tip = [str(e["doc"])] if e["doc"] else []
        tip += [
            f"{x['name']}" + (f" if {x['when']}" if x["when"] else "") + ("" if x["active"] else " (off)")
            for x in e["effects"]
        ]
        attrs = {"label": _q(label), "id": _q(f"{id_prefix}{machine['name']}/edge/{e['id']}")}
        if tip:
            attrs["tooltip"] = _q("\n".join(tip))
        if not e["active"]:
            attrs.update(style="dashed", color=_q("#9e9e9e"), fontcolor=_q("#9e9e9e"))
        elif e["source"] not in reachable:
            attrs.update(style="dotted", color=_q("#9e9e9e"), fontcolor=_q("#757575"))
        lines.append(f"{indent}{_q(node_prefix + e['source'])} -> {_q(node_prefix + e['dest'])} {_attrs(attrs)}")
    return lines


_DOT_DEFAULTS = [
    '    node [shape=box, fontname="Helvetica", fontsize=11]',
    '    edge [fontname="Helvetica", fontsize=9]',
]


def to_dot(doc: GraphJSON, *, id_prefix: str = "", title: str | None = None) -> str:
    """One digraph; several machines become one cluster each (node ids ``machine/State``)."""
    machines = list(doc["machines"].values())
    label = title or config_label(doc["config"])
    lines: list[str] = []
    if len(machines) == 1:
        m = machines[0]
        lines.append(f"digraph {_q(m['name'])} {{")
        heading = f"{m['name']}  ({label})"
        lines.append(
            f'    graph [id={_q(id_prefix + m["name"])}, label={_q(heading)}, labelloc=t, fontname="Helvetica"]'
        )
        lines.extend(_DOT_DEFAULTS)
        lines.extend(_dot_body(m, "", id_prefix, "    "))
    else:
        lines.append('digraph "lifecycle" {')
        lines.append(
            f'    graph [id={_q(id_prefix + "lifecycle")}, label={_q(label)}, labelloc=t, fontname="Helvetica"]'
        )
        lines.extend(_DOT_DEFAULTS)
        for m in machines:
            lines.append(f"    subgraph {_q('cluster_' + m['name'])} {{")
            lines.append(f"        graph [label={_q(m['name'])}, style=rounded, color={_q('#bdbdbd')}]")
            lines.extend(_dot_body(m, m["name"] + "/", id_prefix, "        "))
            lines.append("    }")
    lines.append("}")
    return "\n".join(lines) + "\n"


def config_label(cfg: ConfigJSON) -> str:
    if cfg["preset"]:
        return f"preset {cfg['preset']}"
    return " ".join(cfg["flags"]) or "miles defaults"


# -- graphviz ---------------------------------------------------------------------------------------------
def require_dot() -> str:
    """The path of graphviz's ``dot``, or a LifecycleError that says how to install it."""
    dot = shutil.which("dot")
    if dot is None:
        raise LifecycleError(
            "graphviz's `dot` program is not on PATH, and SVG, PNG and HTML output need it. "
            "Install graphviz: `apt-get install graphviz` (Debian/Ubuntu) or `brew install graphviz` (macOS). "
            "--format mermaid, dot and json work without it."
        )
    return dot


def render(dot_source: str, fmt: str) -> bytes:
    """Run ``dot -T<fmt>`` on one graph."""
    return _run_dot(dot_source, fmt)


def render_svgs(dot_sources: Sequence[str]) -> list[str]:
    """Many graphs through one ``dot`` process (one start-up, not one per graph); bare ``<svg>`` each."""
    if not dot_sources:
        return []
    out = _run_dot("\n".join(dot_sources), "svg").decode("utf-8")
    svgs = []
    for chunk in out.split("</svg>")[:-1]:
        start = chunk.find("<svg")
        svgs.append(chunk[start:] + "</svg>")
    if len(svgs) != len(dot_sources):
        raise LifecycleError(f"dot returned {len(svgs)} SVGs for {len(dot_sources)} graphs")
    return svgs


def _run_dot(source: str, fmt: str) -> bytes:
    dot = require_dot()
    proc = subprocess.run([dot, f"-T{fmt}"], input=source.encode("utf-8"), capture_output=True, check=False)
    if proc.returncode != 0:
        raise LifecycleError(f"dot -T{fmt} failed: {proc.stderr.decode('utf-8', 'replace').strip()}")
    return proc.stdout
