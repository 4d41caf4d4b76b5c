"""``lifecycle.decide.jsonio``: every way ``json.loads`` fails is one ``JSONFileError`` naming the file (and line), and
nothing is read without bound. The last tests put ``json.loads`` / a whole-file read back and watch them fail."""

from __future__ import annotations

import json
import math
import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from lifecycle.decide import jsonio
from lifecycle.decide.errors import LifecycleError
from lifecycle.decide.jsonio import JSONFileError

DEEP = "[" * 100_000 + "]" * 100_000
HUGE = "1" * 5000


@pytest.mark.parametrize(
    ("data", "problem"),
    [
        (DEEP, "nested deeper than 64"),  # RecursionError in json.loads
        ("[" * 65 + "]" * 65, "nested deeper than 64"),  # parses, but deeper than anything the project writes
        (HUGE, "4300"),  # ValueError: Python's int digit limit
        ('{"a": ' + HUGE + "}", "4300"),
        (b'{"a": "\xff"}', "not UTF-8"),
        ('{"a": 1,', "not valid JSON"),
        ("", "not valid JSON"),
        ("NaN", "not standard JSON"),
        ('{"a": Infinity}', "not standard JSON"),
        ('{"a": 1, "a": 2}', "duplicate key 'a'"),
    ],
)
def test_loads_refuses_each_failure_as_one_error_naming_the_source(data: str | bytes, problem: str) -> None:
    with pytest.raises(JSONFileError, match=problem) as info:
        jsonio.loads(data, source="some/file.json", line=3)
    assert str(info.value).startswith("some/file.json:3: ") and info.value.line == 3
    assert isinstance(info.value, LifecycleError) and isinstance(info.value, ValueError)  # old callers still catch
    assert len(str(info.value)) < 400  # the message never echoes the input


def test_loads_allows_what_the_caller_opts_into() -> None:
    assert math.isnan(jsonio.loads('{"r": NaN}', source="m", allow_nan=True)["r"])
    assert jsonio.loads('{"a": 1, "a": 2}', source="m", allow_duplicate_keys=True) == {"a": 2}
    deep64: Any = jsonio.loads("[" * 64 + "]" * 64, source="m")
    depth = 0
    while isinstance(deep64, list):
        deep64, depth = (deep64[0] if deep64 else None), depth + 1
    assert depth == 64


def test_read_json_bounds_the_file_and_names_it(tmp_path: Path) -> None:
    path = tmp_path / "c.json"
    path.write_text('{"a": [1, 2]}')
    assert jsonio.read_json(path) == {"a": [1, 2]}
    path.write_text('{"a": "' + "x" * 100 + '"}')
    with pytest.raises(JSONFileError, match=r"c\.json: is larger than 64 bytes"):
        jsonio.read_json(path, max_bytes=64)
    with pytest.raises(JSONFileError, match="/dev/zero: is a character device, not a file"):
        jsonio.read_json("/dev/zero", max_bytes=1024)  # a device that never ends: refused before a byte is read
    with pytest.raises(JSONFileError, match="is a directory"):
        jsonio.read_json(tmp_path)
    with pytest.raises(JSONFileError, match="cannot be read"):
        jsonio.read_json(tmp_path / "missing.json")
    path.write_bytes(b"\xff\xfe")
    with pytest.raises(JSONFileError, match="not UTF-8"):
        jsonio.read_text(path)


def test_iter_lines_bounds_each_line_and_says_which_ended(tmp_path: Path) -> None:
    path = tmp_path / "e.jsonl"
    path.write_bytes(b'{"a": 1}\n\n{"b": 2}\n{"c": ')
    lines = list(jsonio.iter_lines(path))
    assert [(x.number, x.raw, x.ended) for x in lines] == [
        (1, b'{"a": 1}', True),
        (2, b"", True),
        (3, b'{"b": 2}', True),
        (4, b'{"c": ', False),
    ]
    path.write_bytes(b'{"a": 1}\n' + b"x" * 100 + b"\n")
    with pytest.raises(JSONFileError, match=r"e\.jsonl:2: has a line longer than 64 bytes"):
        list(jsonio.iter_lines(path, max_line_bytes=64))
    with pytest.raises(JSONFileError, match="/dev/zero: is a character device, not a file"):
        next(jsonio.iter_lines("/dev/zero", max_line_bytes=1024))
    with pytest.raises(JSONFileError, match="is a directory"):
        next(jsonio.iter_lines(tmp_path))


def test_read_jsonl_names_the_bad_line_and_allows_nan(tmp_path: Path) -> None:
    path = tmp_path / "m.jsonl"
    path.write_text('{"loss": NaN}\n\n{"loss": 1.5}\n')
    rows = [(line.number, value) for line, value in jsonio.read_jsonl(path)]
    assert rows[1] == (3, {"loss": 1.5}) and math.isnan(rows[0][1]["loss"])
    path.write_text('{"a": 1}\n' + DEEP + "\n")
    with pytest.raises(JSONFileError, match=r"m\.jsonl:2: is nested deeper"):
        list(jsonio.read_jsonl(path))


def test_the_event_log_reader_goes_through_jsonio(tmp_path: Path) -> None:
    """``events.read_jsonl`` (behind every ``trace`` subcommand): NaN allowed, a torn last line still skipped,
    a deep or huge line one error naming the line."""
    from lifecycle.decide.events import read_jsonl

    path = tmp_path / "events.jsonl"
    path.write_text('{"event": "x", "loss": NaN}\n{"event": "y"}\n{"event": "z", "na')
    events = read_jsonl(path)
    assert [e["event"] for e in events] == ["x", "y"] and math.isnan(events[0]["loss"])
    for bad in (DEEP, '{"n": ' + HUGE + "}"):
        path.write_text('{"event": "x"}\n' + bad + "\n")
        with pytest.raises(JSONFileError, match=r"events\.jsonl:2: not a JSON event line"):
            read_jsonl(path)


# -- the checks can fail: the old readers put back ---------------------------------------------------------------
def _check_refused(path: Path) -> None:
    with pytest.raises(JSONFileError):
        jsonio.read_json(path)
    with pytest.raises(JSONFileError):
        list(jsonio.read_jsonl(path))


def test_catches_loads_that_is_plain_json_loads(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """``json.loads`` as every reader had it: a deep document escapes as a ``RecursionError``, a long number as a
    bare ``ValueError`` -- neither the one ``JSONFileError`` a caller turns into a flag error."""
    deep, huge = tmp_path / "deep.json", tmp_path / "huge.json"
    deep.write_text(DEEP)
    huge.write_text(HUGE)
    _check_refused(deep)
    _check_refused(huge)
    monkeypatch.setattr(jsonio, "loads", lambda data, **_: json.loads(data))
    with pytest.raises(RecursionError):
        _check_refused(deep)
    with pytest.raises(ValueError, match="4300") as info:
        _check_refused(huge)
    assert not isinstance(info.value, JSONFileError)


def test_catches_a_whole_file_read(monkeypatch: pytest.MonkeyPatch) -> None:
    """The old event-log reader read the file whole, then split it: on ``/dev/zero`` that never ends. Put back
    with a guard on ``Path.read_bytes`` (refusing a device, so the test itself ends), the check fails."""

    def check_dev_zero() -> None:
        with pytest.raises(JSONFileError, match="is a character device"):
            list(jsonio.read_jsonl("/dev/zero", max_line_bytes=1024))

    check_dev_zero()
    whole = Path.read_bytes

    def guarded(self: Path) -> bytes:
        if stat.S_ISCHR(self.stat().st_mode):
            raise AssertionError(f"{self}: a device read whole")
        return whole(self)

    def old_iter_lines(path: str | os.PathLike[str], *, max_line_bytes: int = 0) -> Iterator[jsonio.Line]:
        for number, raw in enumerate(Path(path).read_bytes().split(b"\n"), start=1):
            yield jsonio.Line(number, raw, True)

    monkeypatch.setattr(Path, "read_bytes", guarded)
    monkeypatch.setattr(jsonio, "iter_lines", old_iter_lines)
    with pytest.raises(AssertionError, match="a device read whole"):
        check_dev_zero()
