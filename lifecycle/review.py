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
from typing import Any

from lifecycle.config import LifecycleConfig
from lifecycle.explain import explain
from lifecycle.graph import (
    INACTIVE_MARK,
    SCHEMA,
    GraphJSON,
    diff_machines,
    graph_document,
    reference_config,
    render_svgs,
    to_dot,
)
from lifecycle.machines import MACHINES
from lifecycle.predicates import PREDICATES
from lifecycle.presets import PRESETS, preset

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
    return _PAGE.format(
        css=_CSS,
        js=_JS,
        select=select,
        nav=nav,
        sections=sections,
        compare=compare_box,
        payload=payload,
        mark=INACTIVE_MARK,
        schema=SCHEMA,
    )


_CSS = """
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Helvetica, Arial, sans-serif; margin: 0; color: #1f2328; }
header { background: #f6f8fa; border-bottom: 1px solid #d0d7de; padding: 8px 16px; z-index: 1; }
header h1 { font-size: 18px; margin: 0 0 4px; display: inline-block; margin-right: 16px; }
main { padding: 0 16px 32px; }
#preset { width: auto; max-width: 70vw; font-size: 14px; padding: 2px 4px; }
#flags { font-family: ui-monospace, monospace; font-size: 12px; color: #57606a; }
table { border-collapse: collapse; margin: 6px 0; font-size: 13px; }
th, td { border: 1px solid #d0d7de; padding: 2px 8px; text-align: left; vertical-align: top; }
th { background: #f6f8fa; }
td.true { color: #1a7f37; font-weight: 600; } td.false { color: #cf222e; }
.cols { display: flex; gap: 32px; flex-wrap: wrap; }
.graph svg { max-width: 100%; height: auto; }
tr.inactive td { color: #8c959f; } tr.inactive td:first-child::before { content: "\\2717  "; }
s.off { color: #8c959f; }
.diff-added path, .diff-added polygon { stroke: #1a7f37 !important; stroke-width: 3px; }
.diff-added text { fill: #1a7f37 !important; font-weight: bold; }
.diff-changed path, .diff-changed polygon { stroke: #bf8700 !important; stroke-width: 3px; }
.diff-changed text { fill: #9a6700 !important; font-weight: bold; }
.diff-touched path, .diff-touched polygon { stroke: #cf222e !important; stroke-width: 3px; stroke-dasharray: 2 2; }
tr.diff-added { background: #dafbe1; } tr.diff-changed { background: #fff8c5; }
#compare { border: 1px solid #d4a72c; background: #fffbeb; padding: 4px 12px; margin: 12px 0; }
#compare li.added { color: #1a7f37; } #compare li.removed { color: #cf222e; } #compare li.changed { color: #9a6700; }
code, .mono { font-family: ui-monospace, monospace; font-size: 12px; }
footer { color: #57606a; font-size: 12px; padding: 8px 16px; border-top: 1px solid #d0d7de; }
"""

_JS = r"""
(() => {
  const data = JSON.parse(document.getElementById('review-data').textContent);
  const byKey = Object.fromEntries(data.options.map(o => [o.key, o]));
  const el = (tag, text, cls) => {
    const e = document.createElement(tag);
    if (text !== undefined) e.textContent = text;
    if (cls) e.className = cls;
    return e;
  };
  const guardText = g => g.negated ? `!${g.predicate} (${g.predicate}=${g.value})` : `${g.predicate}=${g.value}`;
  const cmp = data.compare;
  const diffOf = (machine) => (cmp && cmp.machines[machine]) || {added: [], removed: [], changed: []};

  function fillPredicates(opt) {
    const body = document.querySelector('#predicate-table tbody');
    body.replaceChildren();
    for (const [name, value] of Object.entries(opt.explain.predicates)) {
      const tr = el('tr'); tr.dataset.predicate = name;
      tr.append(el('td', name, 'mono'), el('td', String(value), String(value)),
                el('td', data.predicate_docs[name] || ''));
      body.append(tr);
    }
    const gates = document.querySelector('#gate-table tbody');
    gates.replaceChildren();
    for (const g of opt.explain.gates) {
      const tr = el('tr'); tr.dataset.predicate = g.predicate;
      tr.append(el('td', g.gate), el('td', g.open ? 'yes' : 'no', String(g.open)), el('td', g.predicate, 'mono'));
      gates.append(tr);
    }
    document.getElementById('flags').textContent =
      `mode ${opt.explain.mode} · flags: ${opt.explain.flags.join(' ') || '(miles defaults)'}` +
      (opt.explain.warnings.length ? ` · warnings: ${opt.explain.warnings.join('; ')}` : '');
  }

  function fillEdges(opt) {
    const isTarget = cmp && cmp.target === opt.key;
    for (const table of document.querySelectorAll('table.edges')) {
      const machine = table.dataset.machine;
      const graph = opt.graph.machines[machine];
      const diff = diffOf(machine);
      const added = new Set(diff.added.map(e => e.id)), changed = new Set(diff.changed.map(e => e.id));
      const body = table.querySelector('tbody');
      body.replaceChildren();
      for (const e of graph.edges) {
        const tr = el('tr'); tr.dataset.edge = e.id; tr.dataset.active = String(e.active);
        if (!e.active) tr.classList.add('inactive');
        if (isTarget && added.has(e.id)) tr.classList.add('diff-added');
        if (isTarget && changed.has(e.id)) tr.classList.add('diff-changed');
        const effects = el('td');
        e.effects.forEach((x, i) => {
          if (i) effects.append(', ');
          const text = x.when ? `${x.name} if ${x.when}` : x.name;
          if (x.active) effects.append(text);
          else { const s = el('s', text, 'off'); s.title = `${x.when} is false: not performed`; effects.append(s); }
        });
        tr.append(el('td', `${e.source} \u2192 ${e.dest}`, 'mono'), el('td', e.trigger, 'mono'),
                  el('td', e.guards.map(guardText).join(', '), 'mono'), effects,
                  el('td', e.active ? 'active' : 'inactive', String(e.active)));
        body.append(tr);
      }
    }
  }

  function show(key) {
    const opt = byKey[key];
    for (const div of document.querySelectorAll('div.graph')) div.hidden = div.dataset.option !== key;
    fillPredicates(opt);
    fillEdges(opt);
    document.body.dataset.option = key;
  }

  function fillCompare() {
    if (!cmp) return;
    const box = document.getElementById('compare');
    const body = document.getElementById('compare-body');
    box.hidden = false;
    const target = byKey[cmp.target];
    const intro = el('p');
    intro.append(`Reference: `, el('code', cmp.reference), `, compared under `, el('b', target.label),
                 ' (highlighted there: green added, amber changed, red dotted the states of removed edges).');
    body.append(intro);
    let total = 0;
    for (const [machine, diff] of Object.entries(cmp.machines)) {
      const items = [
        ...diff.added.map(e => ['added', `+ ${e.id}  ${e.label}`, e.id]),
        ...diff.removed.map(e => ['removed', `- ${e.id}  ${e.label}`, e.id]),
        ...diff.changed.map(e => ['changed',
                                  `~ ${e.id}  ${e.before}  \u21d2  ${e.after} (${e.fields.join(', ')})`, e.id]),
        ...diff.states_added.map(s => ['added', `+ state ${s}`, s]),
        ...diff.states_removed.map(s => ['removed', `- state ${s}`, s]),
      ];
      total += items.length;
      const h = el('h3', `${machine}: ${items.length ? items.length + ' change(s)' : 'no changes'}`);
      body.append(h);
      if (!items.length) continue;
      const ul = el('ul'); ul.dataset.machine = machine;
      for (const [kind, text, id] of items) {
        const li = el('li', text, kind + ' mono'); li.dataset.edge = id; ul.append(li);
      }
      body.append(ul);
      const svgId = (edge) => `${cmp.target}/${machine}/edge/${edge}`;
      for (const e of diff.added) document.getElementById(svgId(e.id))?.classList.add('diff-added');
      for (const e of diff.changed) document.getElementById(svgId(e.id))?.classList.add('diff-changed');
      for (const e of diff.removed) {
        const [src, , dst] = e.id.split(':');
        for (const s of [src, dst]) {
          document.getElementById(`${cmp.target}/${machine}/state/${s}`)?.classList.add('diff-touched');
        }
      }
    }
    for (const m of cmp.not_in_reference) body.append(el('p', `${m}: not in the reference export`));
    box.dataset.total = String(total);
  }

  const select = document.getElementById('preset');
  select.addEventListener('change', () => show(select.value));
  fillCompare();
  show(select.value);
  document.body.dataset.ready = 'true';
})();
"""

_PAGE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>rl-lifecycle state graphs</title>
<style>{css}</style>
</head>
<body>
<header>
<h1>rl-lifecycle state graphs</h1>
<label>config <select id="preset">
{select}
</select></label>
<div id="flags"></div>
<nav>{nav} · <a href="#predicates">predicates</a></nav>
</header>
<main>
{compare}
<section id="predicates"><h2>Predicates and gates</h2>
<div class="cols">
<table id="predicate-table"><thead><tr><th>predicate</th><th>value</th><th>meaning</th></tr></thead>
<tbody></tbody></table>
<table id="gate-table"><thead><tr><th>gate</th><th>open</th><th>predicate</th></tr></thead><tbody></tbody></table>
</div>
</section>
{sections}
</main>
<footer>Generated by <code>lifecycle graph --format html</code> from lifecycle/machines.py (data schema {schema}).
Edge labels read <code>trigger [guards] / effects</code>; dashed grey edges (<code>{mark}</code> in tables) have a false
guard under the selected config; dotted grey edges leave a state that config cannot reach; red states are marked,
double borders terminal; struck effects are gated off.</footer>
<script type="application/json" id="review-data">{payload}</script>
<script>{js}</script>
</body>
</html>
"""
