"""The Grafana dashboard (docs/grafana/rl-lifecycle.json) asks only for what the exporter really emits.

No Grafana, no Prometheus: the dashboard's PromQL is tokenized here, and the metric and label names it
uses are compared with what a real :class:`trainer.app.metrics.Metrics` exports after being fed the event
log of a real run (rollout FT, two engines, engine-1 SIGKILLed at step 3 and recovered; that run had no
guard refusal, so one real refusal by a ``LifecycleMachine`` is logged to the same exporter). The checker,
:func:`dashboard_problems`, returns a list of problems; the tests below show it finds none in the
dashboard and finds each kind of mistake planted in a copy of it.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import pytest

from lifecycle.decide.events import EventLog
from lifecycle.decide.machines import MACHINES
from lifecycle.decide.presets import preset
from lifecycle.decide.runtime import LifecycleMachine
from lifecycle.decide.spec import Blocked
from tests.helpers import EVENT_LOGS
from trainer.app.metrics import Metrics

ROOT = Path(__file__).resolve().parents[3]
DASHBOARD = ROOT / "docs" / "grafana" / "rl-lifecycle.json"
EVENTS = EVENT_LOGS / "rollout_ft_kill_events.jsonl"
# the stream's group events of a real `lifecycle run --fully-async` (the recorded run above does not stream)
STREAM_EVENTS = EVENT_LOGS / "stream_groups_events.jsonl"
# an elastic fleet's scale, retire, notice and drain (the recorded runs have a fixed fleet)
ELASTIC_EVENTS = EVENT_LOGS / "elastic_events.jsonl"

PREFIX = "rl_lifecycle_"
DATASOURCE_UIDS = {"${datasource}", "$datasource"}
# labels Prometheus attaches at scrape time; "instance" is not here: the exporter's own instance label (the
# engine slot) is kept with honor_labels: true, and a metric without it must not be filtered by it
TARGET_LABELS = frozenset({"job"})
GROUPING = frozenset({"by", "without", "on", "ignoring", "group_left", "group_right"})
KEYWORDS = GROUPING | {"bool", "and", "or", "unless", "offset", "atan2", "inf", "nan"}
MATCH_OPS = frozenset({"=", "!=", "=~", "!~"})
COUNTER_FUNCTIONS = frozenset({"rate", "irate", "increase", "resets"})
AGGREGATIONS = frozenset(
    {"sum", "min", "max", "avg", "group", "stddev", "stdvar", "count", "count_values", "bottomk", "topk", "quantile"}
)


# -- what the exporter emits -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Exported:
    """Sample names the exporter emitted, each with its label names and its family's type."""

    labels: Mapping[str, frozenset[str]]
    types: Mapping[str, str]


def exported(metrics: Metrics) -> Exported:
    labels: dict[str, set[str]] = {}
    types: dict[str, str] = {}
    for family in metrics.registry.collect():
        for sample in family.samples:
            labels.setdefault(sample.name, set()).update(sample.labels)
            types[sample.name] = family.type
    return Exported({name: frozenset(names) for name, names in labels.items()}, types)


def _refuse_a_move(metrics: Metrics) -> None:
    """One real guard refusal, logged to ``metrics``: a machine of the run's preset fires, from its initial
    state, a trigger a guard refuses there (the recorded run had none, so its guard-rejection family is empty)."""
    config = preset("ft-rollout")
    for spec in MACHINES.values():
        refused = [trigger for (state, trigger), out in spec.compile(config).table.items()
                   if state == spec.initial and isinstance(out, Blocked)]  # fmt: skip
        if refused:
            result = LifecycleMachine(spec, config, spec.name, log=EventLog([metrics])).fire(refused[0])
            assert not result.ok and result.blocked_by
            return
    raise AssertionError("no machine refuses a move from its initial state under ft-rollout")


@pytest.fixture(scope="module")
def run_metrics() -> Exported:
    """What the exporter emitted for the recorded run, a stream's group events and an elastic fleet's events (plus
    one real guard refusal if the run had none)."""
    metrics = Metrics()
    for path in (EVENTS, STREAM_EVENTS, ELASTIC_EVENTS):
        with path.open() as f:
            for line in f:
                if line.strip():
                    metrics(json.loads(line))
    if not any(f.samples for f in metrics.registry.collect() if f.name == f"{PREFIX}guard_rejections"):
        _refuse_a_move(metrics)
    return exported(metrics)


def families() -> list[str]:
    """The metric families the exporter defines (with or without samples)."""
    return [f.name for f in Metrics().registry.collect()]


# -- PromQL, as far as the check needs it -------------------------------------------------------------------------
TOKEN = re.compile(
    r"""
    (?P<ws>\s+)
    |(?P<comment>\#[^\n]*)
    |(?P<string>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|`[^`]*`)
    |(?P<var>\$\{[^}]*\}|\$\w+|\[\[\w+\]\])
    |(?P<range>\[[^\]]*\])
    |(?P<number>(?:\d|\.\d)[\w.]*)
    |(?P<ident>[A-Za-z_:][\w:]*)
    |(?P<op>=~|!~|!=|==|<=|>=|[-+*/%^<>=(){},@])
    """,
    re.VERBOSE,
)


@dataclass(frozen=True)
class Token:
    kind: str  # string, var, range, number, ident, op
    text: str


@dataclass
class Expr:
    """One PromQL expression, tokenized, with what the checks read from it."""

    text: str
    tokens: list[Token] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    metrics: dict[int, str] = field(default_factory=dict)  # token index -> metric name
    matchers: list[tuple[str | None, str, str, str]] = field(default_factory=list)  # (metric, label, op, value)
    # (keyword, its labels, the metrics it groups, its token index): by (...), without (...), on (...), ...
    groupings: list[tuple[str, list[str], set[str], int]] = field(default_factory=list)
    created_labels: set[str] = field(default_factory=set)  # label_replace / label_join destinations
    # (function, the metrics among its arguments, the token indexes of its parentheses' contents)
    calls: list[tuple[str, set[str], range]] = field(default_factory=list)
    variables: set[str] = field(default_factory=set)


def _unquote(text: str) -> str:
    body = text[1:-1]
    return body if text[0] == "`" else re.sub(r"\\(.)", r"\1", body)


def _variables(text: str) -> set[str]:
    """Grafana variables used in ``text``: $name, ${name}, ${name:format}, [[name]] (not $1, a regex group)."""
    found = re.findall(r"\$\{([A-Za-z_]\w*)[^}]*\}|\$([A-Za-z_]\w*)|\[\[([A-Za-z_]\w*)\]\]", text)
    return {next(g for g in groups if g) for groups in found}


def parse(text: str) -> Expr:
    """Tokenize ``text`` and classify its identifiers: metric names, label names, functions, keywords."""
    e = Expr(text)
    e.variables = _variables(text)
    pos = 0
    while pos < len(text):
        m = TOKEN.match(text, pos)
        if m is None:
            e.errors.append(f"cannot read PromQL at {text[pos : pos + 20]!r}")
            return e
        pos = m.end()
        kind = m.lastgroup or ""
        if kind not in ("ws", "comment"):
            e.tokens.append(Token(kind, m.group()))
    toks = e.tokens
    pair: dict[int, int] = {}
    parent: list[int | None] = []  # the innermost open bracket around each token
    stack: list[int] = []
    for i, t in enumerate(toks):
        if t.text in (")", "}"):
            if not stack or toks[stack[-1]].text != {")": "(", "}": "{"}[t.text]:
                e.errors.append(f"unbalanced {t.text!r}")
                return e
            j = stack.pop()
            pair[i], pair[j] = j, i
        parent.append(stack[-1] if stack else None)
        if t.text in ("(", "{"):
            stack.append(i)
    if stack:
        e.errors.append(f"unclosed {toks[stack[-1]].text!r}")
        return e

    def kind_at(i: int) -> str:
        return toks[i].kind if 0 <= i < len(toks) else ""

    def text_at(i: int) -> str:
        return toks[i].text if 0 <= i < len(toks) else ""

    def label_list(i: int) -> bool:  # is the "(" at i a grouping keyword's label list?
        return text_at(i) == "(" and kind_at(i - 1) == "ident" and text_at(i - 1) in GROUPING

    matchers: list[tuple[int, str, str, str]] = []  # (index of the selector's "{", label, op, value)
    for i, t in enumerate(toks):
        if t.kind != "ident":
            continue
        p = parent[i]
        if p is not None and toks[p].text == "{":
            if text_at(i + 1) in MATCH_OPS and kind_at(i + 2) == "string":
                matchers.append((p, t.text, text_at(i + 1), _unquote(text_at(i + 2))))
            else:
                e.errors.append(f"cannot read the matcher at {t.text!r}")
        elif p is not None and label_list(p):
            pass  # a label name in by (...), on (...), ...
        elif t.text in KEYWORDS or text_at(i + 1) == "(" or (t.text in AGGREGATIONS and text_at(i + 1) in GROUPING):
            pass  # a keyword, a function, an aggregation (sum by (l) (x))
        else:
            e.metrics[i] = t.text
    for brace, label, op, value in matchers:  # a bare selector {__name__="..."} names its metric inside
        if label == "__name__" and op == "=" and (brace - 1) not in e.metrics:
            e.metrics[brace] = value
    for brace, label, op, value in matchers:
        e.matchers.append((e.metrics.get(brace - 1, e.metrics.get(brace)), label, op, value))

    def metrics_in(lo: int, hi: int) -> set[str]:
        return {name for k, name in e.metrics.items() if lo <= k <= hi}

    for i, t in enumerate(toks):
        if t.kind == "ident" and t.text in GROUPING and text_at(i + 1) == "(":
            close = pair[i + 1]
            labels = [x.text for x in toks[i + 2 : close] if x.kind == "ident"]
            lo, hi = 0, len(toks) - 1
            if t.text in ("by", "without") and text_at(i - 1) == ")":  # sum (x) by (l)
                lo, hi = pair[i - 1], i - 1
            elif t.text in ("by", "without") and text_at(close + 1) == "(":  # sum by (l) (x)
                lo, hi = close + 1, pair[close + 1]
            elif parent[i] is not None:  # on/ignoring/group_*: the enclosing group holds both operands
                lo, hi = parent[i] or 0, pair[parent[i] or 0]
            e.groupings.append((t.text, labels, metrics_in(lo, hi), i))
        if t.kind == "ident" and text_at(i + 1) == "(" and not label_list(i + 1) and t.text not in GROUPING:
            close = pair[i + 1]
            e.calls.append((t.text, metrics_in(i + 1, close), range(i + 1, close)))
            if t.text in ("label_replace", "label_join"):
                args = [k for k in range(i + 2, close) if parent[k] == i + 1]
                commas = [k for k in args if toks[k].text == ","]
                if commas and kind_at(commas[0] + 1) == "string":
                    e.created_labels.add(_unquote(toks[commas[0] + 1].text))
    return e


def metric_names(expr: str) -> list[str]:
    """The metric names ``expr`` selects, in order of appearance (label names and functions are not metrics)."""
    e = parse(expr)
    return [e.metrics[k] for k in sorted(e.metrics)]


# -- the dashboard --------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Query:
    where: str  # how a failure names it: panel 'Title' (id 3) target B
    expr: str
    legend: str | None
    datasource: Any


def panels(dashboard: Mapping[str, Any]) -> Iterator[Mapping[str, Any]]:
    """Every panel, the panels of (collapsed) rows included."""

    def walk(items: list[Mapping[str, Any]]) -> Iterator[Mapping[str, Any]]:
        for p in items:
            yield p
            yield from walk(p.get("panels") or [])

    return walk(dashboard.get("panels") or [])


def queries(dashboard: Mapping[str, Any]) -> Iterator[Query]:
    for p in panels(dashboard):
        for t in p.get("targets") or []:
            yield Query(
                f"panel {p.get('title')!r} (id {p.get('id')}) target {t.get('refId')}",
                str(t.get("expr", "")),
                t.get("legendFormat"),
                t.get("datasource"),
            )
    for v in (dashboard.get("templating") or {}).get("list") or []:
        if v.get("type") == "query":
            q = v.get("query")
            expr = str(q.get("query", "") if isinstance(q, Mapping) else q)
            yield Query(f"variable ${v.get('name')}", expr, None, v.get("datasource"))
    for a in (dashboard.get("annotations") or {}).get("list") or []:
        if "expr" in a:
            text = f"{a.get('titleFormat', '')} {a.get('textFormat', '')}"
            yield Query(f"annotation {a.get('name')!r}", str(a["expr"]), text, a.get("datasource"))


LABEL_VALUES = re.compile(r"^\s*label_values\((?:(?P<selector>.*),)?\s*(?P<label>\w+)\s*\)\s*$", re.DOTALL)


def _datasource_ok(ds: Any) -> bool:
    uid = ds.get("uid") if isinstance(ds, Mapping) else ds
    return uid in DATASOURCE_UIDS


def query_problems(q: Query, run: Exported, variables: set[str]) -> list[str]:
    problems: list[str] = []
    expr = q.expr
    lv = LABEL_VALUES.match(expr)
    if lv:  # a variable's label_values(selector, label): check the selector, and the label on it
        expr = lv.group("selector") or ""
    e = parse(expr)
    problems += [f"{q.where}: {err} in {q.expr!r}" for err in e.errors]
    if e.errors:
        return problems
    names = set(e.metrics.values())
    if not any(n.startswith(PREFIX) for n in names):
        problems.append(f"{q.where}: names no {PREFIX}* metric: {q.expr!r}")
    if not _datasource_ok(q.datasource):
        problems.append(f"{q.where}: datasource {q.datasource!r} is not the ${{datasource}} variable")
    for name in sorted(names - run.labels.keys()):
        problems.append(f"{q.where}: metric {name} is not emitted by the exporter")
    known = names & run.labels.keys()
    created = e.created_labels | TARGET_LABELS

    def labels_of(metrics: set[str]) -> set[str]:
        return set().union(*(run.labels[m] for m in metrics & known)) | created

    for owner, label, _op, _value in e.matchers:
        if owner in known and label != "__name__" and label not in labels_of({owner}):
            problems.append(f"{q.where}: {owner} has no label {label!r} (it has {sorted(run.labels[owner])})")
    for keyword, labels, scope, _at in e.groupings:
        if not scope & known:
            continue
        have = labels_of(scope)
        for label in labels:
            if label not in have:
                problems.append(f"{q.where}: {keyword} ({label}) over {sorted(scope)}, which have no label {label!r}")
    for function, scope, span in e.calls:
        for name in sorted(scope & known):
            if function in COUNTER_FUNCTIONS and (run.types[name] == "gauge" or name.endswith("_created")):
                problems.append(f"{q.where}: {function}() of {name}, which is not a counter")
        if function == "histogram_quantile":
            if not any(n.endswith("_bucket") for n in scope):
                problems.append(f"{q.where}: histogram_quantile() over no _bucket series")
            for keyword, labels, _inner, at in e.groupings:
                if keyword == "by" and at in span and "le" not in labels:
                    problems.append(f"{q.where}: histogram_quantile() of an aggregation by ({', '.join(labels)}) "
                                    "without le")  # fmt: skip
    if lv and known and lv.group("label") not in labels_of(known):
        problems.append(f"{q.where}: label_values of {sorted(known)} by {lv.group('label')!r}, a label they lack")
    if q.legend and known:
        have = labels_of(known)
        for label in re.findall(r"\{\{\s*(\w+)\s*\}\}", q.legend):
            if label not in have:
                problems.append(f"{q.where}: legend {{{{{label}}}}} is a label none of {sorted(known)} has")
    for var in sorted(e.variables - variables):
        if not var.startswith("__"):
            problems.append(f"{q.where}: uses ${var}, which is not a dashboard variable")
    return problems


def _matches(op: str, value: str, label_value: str) -> bool:
    """Does a PromQL label matcher ``label op "value"`` select a series whose label is ``label_value``?"""
    if op in ("=", "!="):
        return (label_value == value) == (op == "=")
    return (re.fullmatch(value, label_value) is not None) == (op == "=~")


CODE = re.compile(r'label_replace\(\s*vector\((\d+)\)\s*,\s*"state"\s*,\s*"(\w+)"\s*,\s*""\s*,\s*""\s*\)')


def timeline_problems(p: Mapping[str, Any]) -> list[str]:
    """A state timeline over the StateSet: its code table covers the shown machines' states, and its value
    mappings name exactly those codes."""
    where = f"panel {p.get('title')!r} (id {p.get('id')})"
    problems: list[str] = []
    for t in p.get("targets") or []:
        e = parse(str(t.get("expr", "")))
        table = {int(code): state for code, state in CODE.findall(e.text)}
        if not table:
            continue
        if len(set(table.values())) != len(table):
            problems.append(f"{where}: a state has two codes in its table")
        shown = set(MACHINES)
        for owner, label, op, value in e.matchers:
            if owner == "rl_lifecycle_state" and label == "machine":
                shown = {m for m in shown if _matches(op, value, m)}
        states = {s for m in shown for s in MACHINES[m].state_names}
        if missing := states - set(table.values()):
            problems.append(f"{where}: the code table lacks the states {sorted(missing)} of {sorted(shown)}")
        if extra := set(table.values()) - states:
            problems.append(f"{where}: the code table has states no shown machine has: {sorted(extra)}")
        mapped: dict[int, str] = {}
        for mapping in (p.get("fieldConfig") or {}).get("defaults", {}).get("mappings") or []:
            if mapping.get("type") == "value":
                mapped |= {int(k): v.get("text") for k, v in mapping.get("options", {}).items()}
        if mapped != table:
            diff = sorted(set(mapped.items()) ^ set(table.items()))
            problems.append(f"{where}: value mappings and the query's code table differ: {diff}")
    return problems


def dashboard_problems(dashboard: Mapping[str, Any], run: Exported) -> list[str]:
    """Every problem found in ``dashboard`` against what the exporter emitted in ``run``; empty when none."""
    problems: list[str] = []
    variable_list = (dashboard.get("templating") or {}).get("list") or []
    if not any(v.get("type") == "datasource" and v.get("query") == "prometheus" for v in variable_list):
        problems.append("no Prometheus datasource template variable")
    seen: dict[Any, str] = {}
    for p in panels(dashboard):
        where = f"panel {p.get('title')!r} (id {p.get('id')})"
        if p.get("id") in seen:
            problems.append(f"{where}: id {p.get('id')} is also panel {seen[p.get('id')]!r}'s")
        seen[p.get("id")] = str(p.get("title"))
        if not str(p.get("title") or "").strip():
            problems.append(f"{where}: no title")
        if p.get("type") == "row":
            continue
        if not str(p.get("description") or "").strip():
            problems.append(f"{where}: no description")
        if not p.get("targets"):
            problems.append(f"{where}: no targets")
        if not _datasource_ok(p.get("datasource")):
            problems.append(f"{where}: datasource {p.get('datasource')!r} is not the ${{datasource}} variable")
        refs = [t.get("refId") for t in p.get("targets") or []]
        if len(set(refs)) != len(refs):
            problems.append(f"{where}: repeated refId in {refs}")
        if p.get("type") == "state-timeline":
            problems += timeline_problems(p)
    variables = {str(v.get("name")) for v in variable_list}
    for q in queries(dashboard):
        problems += query_problems(q, run, variables)
    return problems


# -- the tests ------------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def dashboard() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return loaded


def test_the_dashboard_asks_only_for_what_the_exporter_emits(dashboard: dict[str, Any], run_metrics: Exported) -> None:
    assert dashboard_problems(dashboard, run_metrics) == []


def test_the_dashboard_is_importable_as_the_project_s(dashboard: dict[str, Any]) -> None:
    assert dashboard["uid"] == "rl-lifecycle"
    assert dashboard["title"] == "rl-lifecycle: fleet lifecycle"
    assert 36 <= dashboard["schemaVersion"] <= 41
    kinds = {p["type"] for p in panels(dashboard)}
    assert {"state-timeline", "timeseries", "stat", "bargauge", "heatmap", "row"} <= kinds
    assert len(list(queries(dashboard))) >= 20


def test_every_family_has_samples_and_a_panel(dashboard: dict[str, Any], run_metrics: Exported) -> None:
    # a family without samples would make the metric check vacuous for it; one without a panel is unwatched
    exprs = [q.expr for q in queries(dashboard)]
    for family in families():
        emitted = {name for name in run_metrics.labels if name == family or name.startswith(f"{family}_")}
        assert emitted, f"the recorded run emits no sample of {family}: the check cannot vouch for its queries"
        assert any(set(metric_names(e)) & emitted for e in exprs), f"no panel shows {family}"
    assert run_metrics.labels["rl_lifecycle_state"] == {"machine", "instance", "state"}


@pytest.mark.parametrize(
    ("expr", "names"),
    [
        (
            'sum by (instance) (rate(rl_lifecycle_probes_total{outcome="failed", by="monitor"}[$__rate_interval]))',
            ["rl_lifecycle_probes_total"],
        ),
        (
            "histogram_quantile(0.95, sum by (by, le) (rate(rl_lifecycle_probe_duration_seconds_bucket[5m])))",
            ["rl_lifecycle_probe_duration_seconds_bucket"],
        ),
        (
            "scalar(rl_lifecycle_committed_weight_version) - rl_lifecycle_weight_version",
            ["rl_lifecycle_committed_weight_version", "rl_lifecycle_weight_version"],
        ),
        ('{__name__="rl_lifecycle_step", job="x"} offset 5m', ["rl_lifecycle_step"]),
        ('label_replace(vector(1), "state", "rl_lifecycle_not_a_metric", "", "") # rl_lifecycle_comment', []),
        ("sum(rate(rl_lifecycle_transitions_total[1h])) by (machine) > bool 0", ["rl_lifecycle_transitions_total"]),
    ],
)
def test_metric_names_are_told_from_labels_functions_strings(expr: str, names: list[str]) -> None:
    assert metric_names(expr) == names


@pytest.mark.parametrize(
    "expr",
    [
        # an aggregation around histogram_quantile needs no le; "by" is also a label name
        "max by (by) (histogram_quantile(0.9, sum by (by, le) (rate(rl_lifecycle_probe_duration_seconds_bucket"
        '{by="monitor"}[5m]))))',
        # a label made by label_replace may be grouped by
        'sum by (slot) (label_replace(rl_lifecycle_weight_version, "slot", "$1", "instance", "engine-(.*)"))',
        # a bare selector names its metric in __name__
        'sum by (machine) ({__name__="rl_lifecycle_transitions_total", trigger="restart"})',
        "rl_lifecycle_restarts_in_window / on (job) group_left () rl_lifecycle_restart_budget",
    ],
)
def test_correct_queries_are_not_reported(expr: str, run_metrics: Exported) -> None:
    assert query_problems(Query("test", expr, None, {"uid": "${datasource}"}), run_metrics, set()) == []


def _first(dashboard: dict[str, Any], title: str) -> dict[str, Any]:
    return cast(dict[str, Any], next(p for p in panels(dashboard) if p.get("title") == title))


MUTANTS = [
    # (panel, old text in its first target, new text, a phrase the problem must contain)
    ("Fleet composition by state", "rl_lifecycle_state", "rl_lifecycle_engine_up", "metric rl_lifecycle_engine_up"),
    ("Fleet composition by state", "by (state)", "by (status)", "no label 'status'"),
    ("Probe failures", 'outcome="failed"', 'result="failed"', "no label 'result'"),
    ("Restart budget used", "rl_lifecycle_restart_budget{", 'rl_lifecycle_restart_budget{instance="x", ', "no label"),
    ("Probe latency", "sum by (by, le)", "sum by (by)", "without le"),
    ("Probe failures", "rl_lifecycle_probes_total", "rl_lifecycle_step", "not a counter"),
    ("Transitions by machine and trigger", "{{trigger}}", "{{reason}}", "legend {{reason}}"),
    ("Weight-version lag", "$instance", "$engine", "$engine"),
    ("Transitions by machine and trigger", "(rate(", "(rate((", "unclosed"),
]


@pytest.mark.parametrize(("title", "old", "new", "phrase"), MUTANTS, ids=[m[2] for m in MUTANTS])
def test_the_check_finds_a_planted_mistake(
    dashboard: dict[str, Any], run_metrics: Exported, title: str, old: str, new: str, phrase: str
) -> None:
    broken = copy.deepcopy(dashboard)
    target = _first(broken, title)["targets"][0]
    assert old in target["expr"] or old in target["legendFormat"]
    target["expr"] = target["expr"].replace(old, new, 1)
    target["legendFormat"] = target["legendFormat"].replace(old, new, 1)
    found = dashboard_problems(broken, run_metrics)
    assert found, f"planting {new!r} in {title!r} went unnoticed"
    assert all(repr(title) in problem for problem in found), found
    assert any(phrase in problem for problem in found), found


def test_the_check_finds_a_metric_in_a_collapsed_row(dashboard: dict[str, Any], run_metrics: Exported) -> None:
    broken = copy.deepcopy(dashboard)
    rows = [p for p in broken["panels"] if p["type"] == "row" and p.get("panels")]
    assert rows, "the dashboard has a collapsed row (its panels nested)"
    nested = rows[0]["panels"][0]
    nested["targets"][0]["expr"] = "rl_lifecycle_engine_up"
    assert dashboard_problems(broken, run_metrics) == [
        f"panel {nested['title']!r} (id {nested['id']}) target A: metric rl_lifecycle_engine_up is not emitted by "
        "the exporter"
    ]


def test_the_check_finds_structural_mistakes(dashboard: dict[str, Any], run_metrics: Exported) -> None:
    broken = copy.deepcopy(dashboard)
    stat = _first(broken, "Step")
    stat["targets"][0]["datasource"] = {"type": "prometheus", "uid": "prometheus-prod"}
    _first(broken, "Probe latency")["id"] = stat["id"]
    _first(broken, "Recoveries")["targets"] = []
    _first(broken, "Weight versions")["targets"][1]["expr"] = "up"
    timeline = _first(broken, "Engine state timeline")
    del timeline["fieldConfig"]["defaults"]["mappings"][0]["options"]["4"]
    found = "\n".join(dashboard_problems(broken, run_metrics))
    assert "'prometheus-prod'" in found
    assert f"id {stat['id']} is also panel 'Step'" in found
    assert "'Recoveries'" in found and "no targets" in found
    assert "names no rl_lifecycle_* metric" in found and "metric up is not emitted" in found
    assert "value mappings and the query's code table differ" in found


def test_a_timeline_s_code_table_must_cover_the_spec(dashboard: dict[str, Any], run_metrics: Exported) -> None:
    broken = copy.deepcopy(dashboard)
    target = _first(broken, "Engine state timeline")["targets"][0]
    target["expr"] = re.sub(
        r'\n\s*or label_replace\(vector\(\d+\), "state", "Recovering", "", ""\)', "", target["expr"]
    )
    found = dashboard_problems(broken, run_metrics)
    assert any("lacks the states ['Recovering']" in problem for problem in found), found
