"""One schema per file kind (issue 41, cause 5): an event log's events and a graph export are checked, when read,
against the ``TypedDict`` their writer is typed with (:mod:`lifecycle.decide.schema`). A field typed otherwise is
one error naming the file, the line, the field, what was expected and what was found -- and real logs pass."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal, TypedDict, get_type_hints

import pytest

from lifecycle.cli import main
from lifecycle.decide import events as ev
from lifecycle.decide.events import BLOCKED, EVENT_SCHEMAS, STARTED, TRANSITION, read_jsonl
from lifecycle.decide.jsonio import JSONFileError
from lifecycle.decide.presets import preset
from lifecycle.decide.schema import Mismatch, SchemaError, checker, expected, found
from lifecycle.graph import graph_document
from lifecycle.graph.model import GraphJSON, to_json
from tests.helpers import EVENT_LOGS, GOLDEN_RUN, REPO

REAL_LOGS = [
    GOLDEN_RUN,
    EVENT_LOGS / "fault_run_events.jsonl",
    EVENT_LOGS / "resumed_run_events.jsonl",
    EVENT_LOGS / "rollout_ft_kill_events.jsonl",
]


# -- the checker ----------------------------------------------------------------------------------------------
class _Inner(TypedDict):
    name: str
    n: int


class _Outer(TypedDict, total=False):
    items: list[_Inner]
    by: dict[str, float]
    kind: Literal["a", "b"]
    maybe: str | None


def test_checker_names_the_field_what_was_expected_and_what_was_found() -> None:
    check = checker(_Outer)
    assert check({"items": [{"name": "x", "n": 1}], "by": {"a": 1, "b": 2.5}, "kind": "a", "maybe": None}) is None
    assert check({"items": [{"name": "x", "n": 1}, {"name": "y", "n": True}]}) == Mismatch(
        "items[1].n", "an integer", "true (true/false)"
    )
    assert check({"items": [{"name": "x"}]}) == Mismatch("items[0].n", "an integer", "missing")
    assert check({"by": {"a": "fast"}}) == Mismatch("by.a", "a number", '"fast" (a string)')
    assert check({"kind": "c"}) == Mismatch("kind", 'one of "a", "b"', '"c" (a string)')
    assert check({"maybe": 3}) == Mismatch("maybe", "a string or null", "3 (a number)")
    assert check(5) is not None and check({"unknown": object()}) is None  # fields it does not name: left alone
    assert expected(list[str]) == "a list (each a string)"
    assert found("x" * 100).endswith("… (a string)") and len(found("x" * 100)) < 60


def test_a_schema_error_is_a_json_file_error_naming_file_line_field_and_fix() -> None:
    err = SchemaError("e.jsonl", Mismatch("effects", "a list", "5 (a number)"), what="a t event", fix="F", line=3)
    assert isinstance(err, JSONFileError) and isinstance(err, ValueError)
    assert str(err) == "e.jsonl:3: a t event: field 'effects' is 5 (a number), expected a list"
    assert (err.field, err.expected, err.found, err.fix, err.line) == ("effects", "a list", "5 (a number)", "F", 3)


# -- event logs -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("path", REAL_LOGS, ids=[p.name for p in REAL_LOGS])
def test_real_logs_pass_the_schema(path: Path) -> None:
    events = read_jsonl(path)
    assert events and all(ev.event_mismatch(e) is None for e in events)


def test_real_logs_still_pass_trace_check(capsys: pytest.CaptureFixture[str]) -> None:
    for path in REAL_LOGS:
        if not any(e.get("event") == STARTED for e in read_jsonl(path)):
            continue  # a log without its config: `trace check` asks for --config (another test)
        assert main(["trace", "check", str(path)]) == 0, capsys.readouterr()
        assert capsys.readouterr().out.startswith("ok: ")


def _wrong_value(hint: Any) -> Any:
    """A value no writer writes for ``hint``: a number where an object goes, an object anywhere else."""
    return 7 if checker(hint)({}) is None else {"not": "this"}


_CONTEXT = get_type_hints(ev.EventFields)  # every kind's: checked once, on a transition
FIELDS = [(TRANSITION, field, hint) for field, hint in _CONTEXT.items() if field != "event"] + [
    (kind, field, hint)
    for kind, cls in EVENT_SCHEMAS.items()
    for field, hint in get_type_hints(cls).items()
    if field not in _CONTEXT
]


@pytest.mark.parametrize(("kind", "field", "hint"), FIELDS, ids=[f"{k}.{f}" for k, f, _ in FIELDS])
def test_every_field_of_every_event_kind_is_typed(kind: str, field: str, hint: Any, tmp_path: Path) -> None:
    """Each field of each kind the project writes, given a wrong type, is refused naming the line and the field."""
    path = tmp_path / "events.jsonl"
    good = json.dumps({"event": TRANSITION, "machine": "engine", "src": "Init", "dst": "Starting"})
    path.write_text(good + "\n" + json.dumps({"event": kind, field: _wrong_value(hint)}) + "\n")
    with pytest.raises(SchemaError) as info:
        read_jsonl(path)
    assert (info.value.line, info.value.field) == (2, field)
    assert str(info.value).startswith(f"{path}:2: a") and kind in str(info.value)


def test_an_unknown_kind_still_has_its_context_typed(tmp_path: Path) -> None:
    """A kind this version does not write (a later one, an older one) is read; its context fields are typed."""
    path = tmp_path / "events.jsonl"
    path.write_text('{"event": "engine.unrouted", "instance": "engine-0", "anything": [1]}\n')
    assert read_jsonl(path)[0]["anything"] == [1]
    path.write_text('{"event": "engine.unrouted", "step": "three"}\n')
    with pytest.raises(SchemaError, match="field 'step' is \"three\" \\(a string\\), expected an integer"):
        read_jsonl(path)
    path.write_text('{"event": 5}\n')
    with pytest.raises(SchemaError, match="field 'event' is 5"):
        read_jsonl(path)


def test_lines_without_an_event_field_are_left_to_their_reader(tmp_path: Path) -> None:
    """metrics.jsonl shares the reader; its rows are no events (the timeline refuses a file of them itself)."""
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1, "ts": 12.5, "reward": 0.5}\n')
    assert read_jsonl(path) == [{"step": 1, "ts": 12.5, "reward": 0.5}]


def test_the_schema_agrees_with_what_the_runtime_writes() -> None:
    """The machines' own moves, captured from a live EventLog, pass the schema: the writer and the reader share
    one definition (the trainer's tests read every real run's log through the same check)."""
    from lifecycle.decide.config import LifecycleConfig
    from lifecycle.decide.events import EventLog, bind_context
    from lifecycle.decide.machines import MACHINES
    from lifecycle.decide.runtime import LifecycleMachine

    log = EventLog()
    config = preset("ft-rollout")
    with log.capture() as events, bind_context(step=1, rollout_id=1, reason="probe failed"):
        log.emit(STARTED, config=config.to_dict(), engines=2, evals=0)
        m = LifecycleMachine(MACHINES["engine"], config, "engine-0", log=log)
        for trigger in ("adopt", "start", "ready", "begin_update", "finish_update", "resume"):
            m.fire(trigger)  # adopt: its guard (keeps_engines) is false here, a lifecycle.blocked line
    assert {e["event"] for e in events} == {STARTED, BLOCKED, TRANSITION}
    assert [ev.event_mismatch(e) for e in events] == [None] * len(events)
    assert LifecycleConfig.from_mapping(events[0]["config"], check_paths=False) == config


# -- graph exports --------------------------------------------------------------------------------------------
def test_a_graph_export_matches_the_type_its_writer_declares() -> None:
    doc = json.loads(to_json(graph_document(preset("ft-rollout"))))
    assert checker(GraphJSON)(doc) is None
    doc["machines"]["engine"]["edges"][0]["guards"] = "rollout_ft"
    wrong = checker(GraphJSON)(doc)
    assert wrong is not None and wrong.field == "machines.engine.edges[0].guards"


def _written_kinds() -> dict[str, str]:
    """Every event kind the project's code writes (``log.emit(KIND, ...)``, ``Fact.of(KIND, ...)``,
    ``self._fact(KIND, ...)``), found in its source: kind -> where."""
    import ast

    from lifecycle.decide import faults

    names = {k: v for mod in (ev, faults) for k, v in vars(mod).items() if k.isupper() and isinstance(v, str)}
    found: dict[str, str] = {}
    for package in ("lifecycle", "engines", "rollout", "trainer"):
        for path in sorted((REPO / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.args):
                    continue
                if node.func.attr not in ("emit", "_fact") and not (
                    node.func.attr == "of" and isinstance(node.func.value, ast.Name) and node.func.value.id == "Fact"
                ):
                    continue
                first = node.args[0]
                where = f"{path.relative_to(REPO)}:{node.lineno}"
                if isinstance(first, ast.Constant) and isinstance(first.value, str):
                    found[first.value] = where
                elif isinstance(first, ast.Name) and first.id in names:
                    found[names[first.id]] = where
    return found


def test_every_kind_the_project_writes_has_a_schema() -> None:
    """A new kind of event without its TypedDict would be read unchecked: it fails here, naming where it is
    written."""
    written = _written_kinds()
    assert {BLOCKED, STARTED, "engine.detached", "fault.injected"} <= set(written)  # the scan finds them
    assert {k: w for k, w in written.items() if k not in EVENT_SCHEMAS} == {}
