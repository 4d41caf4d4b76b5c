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
