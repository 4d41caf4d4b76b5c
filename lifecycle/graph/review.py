"""The review page of ``lifecycle graph --format html``: one self-contained HTML file.

Why one file with everything inlined: it is attached to a PR or opened from CI artifacts, often
offline, so it must not fetch anything. Every preset's SVGs (rendered by graphviz ``dot``, one
process for all of them) and its ``lifecycle explain`` data are embedded; a ``<select>`` swaps
which config is shown. With a reference export (``--compare``), edges added, removed or changed
since then are listed and highlighted in the graphs of the config the reference was made under.
"""

from __future__ import annotations

import html
import json
from collections.abc import Sequence
from importlib import resources
from typing import Any

from lifecycle.decide.config import LifecycleConfig
from lifecycle.decide.machines import MACHINES
from lifecycle.decide.predicates import PREDICATES
from lifecycle.decide.presets import PRESETS, preset
from lifecycle.graph.compare import diff_machines, reference_config
from lifecycle.graph.dot import render_svgs, to_dot
from lifecycle.graph.model import INACTIVE_MARK, SCHEMA, GraphJSON, graph_document
from lifecycle.observe.explain import explain

CLI_KEY = "command-line"
REF_KEY = "reference-config"


def _option(key: str, label: str, config: LifecycleConfig, machines: Sequence[str], prune: bool) -> dict[str, Any]:
    doc = graph_document(config, machines, preset_name=key if key in PRESETS else None, prune=prune)
    return {"key": key, "label": label, "explain": explain(config), "graph": doc}


def _single(doc: GraphJSON, name: str) -> GraphJSON:
    return {**doc, "machines": {name: doc["machines"][name]}}


def build_review(
    config: LifecycleConfig,
    preset_name: str | None,
    machines: Sequence[str],
    *,
    prune: bool = False,
    reference: GraphJSON | None = None,
    reference_name: str | None = None,
) -> str:
    """The HTML page: every preset (plus the command-line config when no preset was chosen)."""
    options = [_option(p, p, preset(p), machines, prune) for p in PRESETS]
    if preset_name is None:
        options.append(_option(CLI_KEY, "command-line config", config, machines, prune))
    selected = preset_name or CLI_KEY

    compare: dict[str, Any] | None = None
    if reference is not None:
        ref_config, ref_preset = reference_config(reference)
        target = ref_preset
        if target is None:
            options.append(_option(REF_KEY, "the reference's config", ref_config, machines, prune))
            target = REF_KEY
        current = graph_document(ref_config, machines, prune=bool(reference.get("pruned", False)))
        ref_machines = reference.get("machines", {})
        compare = {
            "reference": reference_name or "reference",
            "target": target,
            "machines": {
                name: diff_machines(ref_machines[name], current["machines"][name])
                for name in machines
                if name in ref_machines
            },
            "not_in_reference": [name for name in machines if name not in ref_machines],
            "not_current": [name for name in ref_machines if name not in machines],
        }
        selected = target

    sources = [
        to_dot(_single(opt["graph"], name), id_prefix=f"{opt['key']}/", title=opt["label"])
        for opt in options
        for name in machines
    ]
    svgs = iter(render_svgs(sources))
    graphs: dict[str, list[str]] = {name: [] for name in machines}
    for opt in options:
        for name in machines:
            hidden = "" if opt["key"] == selected else " hidden"
            graphs[name].append(
                f'<div class="graph" data-option="{html.escape(opt["key"])}"{hidden}>{next(svgs)}</div>'
            )

    data = {
        "schema": SCHEMA,
        "selected": selected,
        "machines": list(machines),
        "predicate_docs": {name: p.doc for name, p in PREDICATES.items()},
        "options": options,
        "compare": compare,
    }
    payload = json.dumps(data, ensure_ascii=False, sort_keys=False).replace("<", "\\u003c")

    select = "\n".join(
        f'<option value="{html.escape(o["key"])}"{" selected" if o["key"] == selected else ""}>'
        f"{html.escape(o['label'])}</option>"
        for o in options
    )
    sections = "\n".join(
        f"""<section class="machine" id="machine-{name}" data-machine="{name}">
<h2>{name}</h2>
<p class="doc">{html.escape(MACHINES[name].doc)}</p>
{"".join(graphs[name])}
<details class="edges-box" open><summary>edges of {name}</summary>
<table class="edges" data-machine="{name}"><thead><tr><th>edge</th><th>trigger</th><th>guards</th>
<th>effects</th><th>active</th></tr></thead><tbody></tbody></table></details>
</section>"""
        for name in machines
    )
    nav = " · ".join(f'<a href="#machine-{n}">{n}</a>' for n in machines)
    compare_box = (
        '<section id="compare" hidden><h2>Changes against the reference</h2><div id="compare-body"></div></section>'
    )
    return _asset("review.html").format(
        css=_asset("review.css"),
        js=_asset("review.js"),
        select=select,
        nav=nav,
        sections=sections,
        compare=compare_box,
        payload=payload,
        mark=INACTIVE_MARK,
        schema=SCHEMA,
    )


def _asset(name: str) -> str:
    """The page's HTML template, CSS and script, kept as files (package data) so editors treat them as such."""
    return (resources.files("lifecycle.graph") / "assets" / name).read_text(encoding="utf-8")
