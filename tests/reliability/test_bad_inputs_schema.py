"""Bad-input corpus, typed fields and files that are not files (issue 41, cause 5 and cause 4's FIFO).

An event log whose ``effects`` or ``config`` is a number crashed ``trace check/show/diff`` with a ``TypeError``, and
``trace check`` said "ok" on other wrong-typed fields; a graph export whose ``machines`` (or
``machines.engine.states``) is a number crashed ``graph --compare``. Each file kind now has one schema, the
``TypedDict`` its writer is typed with, checked where the file is read (``events.read_jsonl``, ``graph.load_json``):
one paragraph naming the file, the line, the field, what was expected and found, and the fix; exit 2.

``trace show`` on a FIFO hung: every reader opens through ``jsonio.open_regular``, which refuses a FIFO, a device,
a directory or a symlink to one before reading a byte. The FIFO cases run as one subprocess with a timeout, so a
reader that blocks fails the test instead of hanging the suite. The ``test_catches_*`` tests at the end put each
old reader back and watch a case fail.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from badinput import REPO, Case, _paragraph_problems, check_in_process, in_process_test

import lifecycle.cli as cli
import lifecycle.graph.model as graph_model
from lifecycle.decide import events, jsonio
from tests.helpers import GOLDEN_RUN

pytestmark = pytest.mark.bad_input

Damage = Callable[[list[dict[str, Any]]], None]


def _first(kind: str, key: str | None = None) -> Callable[[list[dict[str, Any]]], dict[str, Any]]:
    """The first event of ``kind`` (that has a non-empty ``key``) of a log."""
    return lambda log: next(e for e in log if e.get("event") == kind and (key is None or e.get(key)))


def _set(kind: str, key: str, value: Any, *, inner: str | None = None) -> Damage:
    def damage(log: list[dict[str, Any]]) -> None:
        event = _first(kind, key)(log)
        if inner is None:
            event[key] = value
        else:
            event[key][inner] = value

    return damage


def _log(name: str, damage: Damage | None = None) -> Callable[[Path], None]:
    """The golden run's log (a real ``lifecycle run``'s, canonical), optionally damaged, as ``name``."""

    def setup(tmp: Path) -> None:
        log = [json.loads(line) for line in GOLDEN_RUN.read_text().splitlines()]
        if damage is not None:
            damage(log)
        (tmp / name).write_text("".join(json.dumps(e) + "\n" for e in log))

    return setup


def _line_of(damage: Damage) -> int:
    """The line of the golden log a damage changes (the error must name it)."""
    log = [json.loads(line) for line in GOLDEN_RUN.read_text().splitlines()]
    before = [json.dumps(e) for e in log]
    damage(log)
    return next(i for i, (a, e) in enumerate(zip(before, log, strict=True), start=1) if a != json.dumps(e))


T, S, W = "lifecycle.transition", "lifecycle.started", "engine.weights"
WRONG: dict[str, tuple[Damage, str]] = {  # the two, and fields `trace check` said "ok" on
    "effects-number": (_set(T, "effects", 5), "effects"),
    "config-number": (_set(S, "config", 7), "config"),
    "dst-list": (_set(T, "dst", ["Serving"]), "dst"),
    "guards-list": (_set(T, "guards", ["rollout_ft"]), "guards"),
    "guard-value-string": (_set(T, "guards", "yes", inner="offload_rollout"), "guards.offload_rollout"),
    "weights-instance-object": (_set(W, "instance", {"id": 0}), "instance"),
    "seq-string": (_set(T, "seq", "1"), "seq"),
    "started-engines-null": (_set(S, "engines", None), "engines"),
}


def _typed_cases() -> list[Case]:
    e, a = "{tmp}/e.jsonl", "{tmp}/a.jsonl"
    cases = []
    for kind, (damage, field) in WRONG.items():
        where = f"{e}:{_line_of(damage)}"
        argvs = {
            "show": ("trace", "show", e),
            "check": ("trace", "check", e),
            "diff": ("trace", "diff", a, e),
            "timeline": ("trace", "timeline", e, "-o", "{tmp}/t.html"),
        }
        for sub, argv in argvs.items():
            names = (where, f"field '{field}'", "expected")
            cases.append(Case(f"trace-{sub}-{kind}", argv, names, (_log("e.jsonl", damage), _log("a.jsonl"))))
    bad_config = _set(S, "config", "many", inner="rollout_num_gpus")
    cases.append(
        Case(
            "trace-check-config-value",
            ("trace", "check", e),
            (e, "lifecycle.started", "--rollout-num-gpus", "many", "--config"),
            (_log("e.jsonl", bad_config),),
        )
    )
    return cases


def _graph(change: Callable[[dict[str, Any]], None]) -> Callable[[Path], None]:
    """A graph export written by ``lifecycle graph --format json``, then changed."""

    def setup(tmp: Path) -> None:
        doc = json.loads(graph_model.to_json(graph_model.graph_document(_config())))
        change(doc)
        (tmp / "ref.json").write_text(json.dumps(doc))

    return setup


def _config() -> Any:
    from lifecycle.decide.presets import preset

    return preset("ft-rollout")


def _set_path(*keys: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def change(doc: dict[str, Any]) -> None:
        for key in keys[:-1]:
            doc = doc[key]
        doc[keys[-1]] = value

    return change


COMPARE = ("graph", "--format", "html", "--compare", "{tmp}/ref.json", "-o", "{tmp}/review.html")
GRAPH_CASES = [
    Case(
        "graph-compare-machines-number",
        COMPARE,
        ("{tmp}/ref.json", "'machines'", "5"),
        (_graph(_set_path("machines", value=5)),),
    ),
    Case(
        "graph-compare-states-number",
        COMPARE,
        ("{tmp}/ref.json", "'machines.engine.states'", "3 (a number)", "expected a list"),
        (_graph(_set_path("machines", "engine", "states", value=3)),),
    ),
    Case(
        "graph-compare-edge-guards-string",
        COMPARE,
        ("{tmp}/ref.json", "'machines.rollout.edges[0].guards'"),
        (_graph(lambda d: d["machines"]["rollout"]["edges"][0].__setitem__("guards", "x")),),
    ),
    Case(
        "graph-compare-config-values",
        COMPARE,
        ("{tmp}/ref.json", "config.values", "--rollout-num-gpus"),
        (
            _graph(
                lambda d: (
                    d["config"].__setitem__("preset", None),
                    d["config"]["values"].__setitem__("rollout_num_gpus", "x"),
                )
            ),
        ),
    ),
]


# -- files that are not files: a directory, /dev/zero, a symlink to /dev/zero (the FIFO: a subprocess below) ------
def _readers(path: str) -> dict[str, tuple[str, ...]]:
    """Every command that reads a file a user names, reading ``path``."""
    return {
        "trace-show": ("trace", "show", path),
        "trace-check": ("trace", "check", path),
        "trace-diff": ("trace", "diff", path, path),
        "trace-timeline": ("trace", "timeline", path, "-o", "{tmp}/t.html"),
        "explain-config": ("explain", "--config", path),
        "graph-compare": ("graph", "--format", "html", "--compare", path, "-o", "{tmp}/review.html"),
    }


def _link_to_dev_zero(tmp: Path) -> None:
    (tmp / "zero.jsonl").symlink_to("/dev/zero")


def _not_file_cases() -> list[Case]:
    cases = []
    kinds: dict[str, tuple[str, str, tuple[Callable[[Path], None], ...]]] = {
        "directory": ("{tmp}/logs", "directory", (lambda tmp: (tmp / "logs").mkdir(),)),
        "dev-zero": ("/dev/zero", "", ()),
        "link-dev-zero": ("{tmp}/zero.jsonl", "", (_link_to_dev_zero,)),
    }
    for kind, (path, word, setup) in kinds.items():
        for name, argv in _readers(path).items():
            cases.append(Case(f"{name}-{kind}", argv, (path, word) if word else (path,), setup))
    return cases


CASES = [*_typed_cases(), *GRAPH_CASES, *_not_file_cases()]


test_bad_input_in_process = in_process_test(CASES)


def test_a_real_log_and_a_real_export_are_still_read(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The check refuses what the writer never writes, not what it writes."""
    _log("e.jsonl")(tmp_path)
    _graph(lambda doc: None)(tmp_path)
    assert cli.main(["trace", "check", str(tmp_path / "e.jsonl")]) == 0
    assert cli.main(["trace", "diff", str(GOLDEN_RUN), str(tmp_path / "e.jsonl")]) == 0
    assert (
        cli.main(["graph", "--format", "html", "--compare", str(tmp_path / "ref.json"), "-o", str(tmp_path / "r.html")])
        == 0
    )
    capsys.readouterr()


# -- a FIFO: every reading command, in one subprocess bounded by a timeout ---------------------------------------
_RUN_ALL = r"""
import contextlib, io, json, sys
import lifecycle.cli as cli
results = []
for argv in json.loads(sys.argv[1]):
    print("start", json.dumps(argv), flush=True)
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        code = cli.main(argv)
    results.append([argv, code, err.getvalue()])
print(json.dumps(results), flush=True)
"""
FIFO_WORDS = {"explain-config": "not a regular file"}  # the config reader's own check; every other: jsonio's


def test_a_fifo_is_refused_by_every_reader_without_waiting(tmp_path: Path) -> None:
    fifo = tmp_path / "events.jsonl"
    os.mkfifo(fifo)
    readers = {name: [a.format(tmp=tmp_path) for a in argv] for name, argv in _readers(str(fifo)).items()}
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    try:
        done = subprocess.run(
            [sys.executable, "-c", _RUN_ALL, json.dumps(list(readers.values()))],
            capture_output=True,
            text=True,
            timeout=120,  # a few seconds normally; a reader that blocks on the FIFO never ends
            env=env,
            cwd=REPO,
        )
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode() if isinstance(exc.stdout, bytes) else exc.stdout or ""
        pytest.fail(f"a reader hangs on a FIFO: {out.strip().splitlines()[-1:]}")
    assert done.returncode == 0, done.stderr
    results = json.loads(done.stdout.strip().splitlines()[-1])
    for name, (argv, code, err) in zip(readers, results, strict=True):
        word = FIFO_WORDS.get(name, "is a FIFO (named pipe), not a file")
        assert code == 2, (argv, code, err)
        assert not _paragraph_problems(err, [str(fifo), word]), (argv, err)
    assert not list(tmp_path.glob("*.html")), "a refused command wrote its output"


# -- the old readers put back ---------------------------------------------------------------------------------------
def _case(case_id: str) -> Case:
    return next(c for c in CASES if c.id == case_id)


def test_catches_an_event_reader_without_the_schema(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Without the schema check, ``effects`` a number is a TypeError in ``trace check``, and a wrong ``dst`` or
    ``effects`` passes as "ok" (exit 0)."""
    monkeypatch.setattr(events, "event_mismatch", lambda event: None)
    for case_id in ("trace-check-effects-number", "trace-check-dst-list", "trace-show-effects-number"):
        (tmp_path / case_id).mkdir()
        with pytest.raises((AssertionError, TypeError)):
            check_in_process(_case(case_id), tmp_path / case_id, capsys)


def test_catches_a_graph_reader_without_the_schema(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(graph_model, "_CHECK_GRAPH", lambda doc: None)
    for case_id in ("graph-compare-machines-number", "graph-compare-states-number"):
        (tmp_path / case_id).mkdir()
        with pytest.raises((TypeError, AttributeError)):
            check_in_process(_case(case_id), tmp_path / case_id, capsys)


def test_catches_a_reader_that_opens_a_fifo(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The old opener (a plain ``open``) waits on a FIFO for a writer that never comes. In a thread, so the test
    ends: after two seconds it is still waiting; then a writer opens and closes the FIFO until the thread is done."""

    def hangs() -> bool:
        fifo = tmp_path / f"events-{time.monotonic_ns()}.jsonl"
        os.mkfifo(fifo)
        finished = threading.Event()

        def read() -> None:
            try:
                cli.main(["trace", "show", str(fifo)])
            finally:
                finished.set()

        threading.Thread(target=read, daemon=True).start()
        waiting = not finished.wait(2.0)
        deadline = time.monotonic() + 30
        while not finished.is_set() and time.monotonic() < deadline:  # let a waiting open through, with no data
            with contextlib.suppress(OSError):  # ENXIO: no reader has it open right now
                os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
            finished.wait(0.05)
        return waiting

    assert not hangs()
    monkeypatch.setattr(jsonio, "open_regular", lambda path: open(path, "rb"))  # noqa: SIM115 -- the old opener
    assert hangs()
