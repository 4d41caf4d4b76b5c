"""One bounded reader for every JSON and JSON-lines file the project reads.

``json.loads`` fails in more ways than ``JSONDecodeError``: a document nested 100,000 deep is a
``RecursionError``, a number longer than Python's 4,300-digit limit a bare ``ValueError``, bytes that are not
UTF-8 a ``UnicodeDecodeError``, ``/dev/zero`` never ends and a FIFO blocks its reader forever. Every reader
of a file a user can hand us goes through here, so each of those is one :class:`JSONFileError` naming the file
(and line) -- which the caller turns into one ``ConfigError`` naming its flag and the fix. What is read is
bounded: a whole document by ``max_bytes``, a JSON-lines file line by line by ``max_line_bytes``, nesting by
``MAX_DEPTH``. Only regular files are read (:func:`open_regular`): a FIFO, a device, a socket or a directory
-- or a symlink to one -- is refused before a byte is read, without waiting for a writer.

Strict by default, because the project writes standard JSON: ``NaN``/``Infinity`` (Python's extension) and
duplicate keys (which silently keep the last) are refused unless a caller opts in (``allow_nan`` for event
logs and metrics, whose values a run computed).
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, BinaryIO, cast

from lifecycle.decide.errors import LifecycleError

MAX_BYTES = 64 * 1024 * 1024  # a manifest, a config, a replay file, a graph export: far below this
MAX_LINE_BYTES = 16 * 1024 * 1024  # one event of a JSON-lines log
MAX_DEPTH = 64  # deeper than anything the project writes (an event log line is 3 levels deep)
_SNIPPET = 60


class JSONFileError(LifecycleError, ValueError):
    """A JSON file that cannot be read: ``path`` (and ``line`` for JSON lines), ``problem`` in words."""

    def __init__(self, path: str | os.PathLike[str], problem: str, line: int | None = None) -> None:
        self.path = str(path)
        self.line = line
        self.problem = problem
        where = f"{self.path}:{line}" if line is not None else self.path
        super().__init__(f"{where}: {problem}")


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not standard JSON (a number must be finite)")


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"duplicate key {key[:_SNIPPET]!r} (JSON keeps only the last; say it once)")
        out[key] = value
    return out


def _too_deep(value: Any, limit: int) -> bool:
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        if depth > limit:
            return True
        stack.extend((child, depth + 1) for child in children if isinstance(child, dict | list))
    return False


def loads(
    data: str | bytes,
    *,
    source: str | os.PathLike[str],
    line: int | None = None,
    allow_nan: bool = False,
    allow_duplicate_keys: bool = False,
) -> Any:
    """``data`` parsed, or one :class:`JSONFileError` naming ``source`` (and ``line``) whatever is wrong."""
    if isinstance(data, bytes):
        try:
            data = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise JSONFileError(source, f"is not UTF-8 text (byte {exc.start})", line) from None
    try:
        value = json.loads(
            data,
            parse_constant=None if allow_nan else _refuse_constant,
            object_pairs_hook=None if allow_duplicate_keys else _unique_keys,
        )
    except RecursionError:
        raise JSONFileError(source, f"is nested deeper than {MAX_DEPTH} levels", line) from None
    except json.JSONDecodeError as exc:
        problem = f"is not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno})"
        raise JSONFileError(source, problem, line) from None
    except ValueError as exc:  # the 4,300-digit limit, a refused constant, a duplicate key
        raise JSONFileError(source, f"is not valid JSON ({str(exc)[:200]})", line) from None
    if _too_deep(value, MAX_DEPTH):
        raise JSONFileError(source, f"is nested deeper than {MAX_DEPTH} levels", line)
    return value


_NOT_REGULAR = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def open_regular(path: str | os.PathLike[str], mode: str = "rb") -> BinaryIO:
    """``path`` opened in binary (``rb``, or ``r+b`` to cut a torn tail), or one :class:`JSONFileError` when it is
    not a regular file.

    Opened non-blocking and judged by ``fstat`` of what was opened (not of the name, which may change in
    between): opening a FIFO for reading otherwise waits for a writer without end, and a device such as
    ``/dev/zero`` (or a symlink to it) never ends. A regular file ignores the non-blocking flag."""
    try:
        access = os.O_RDWR if "+" in mode else os.O_RDONLY
        fd = os.open(path, access | os.O_NONBLOCK | os.O_CLOEXEC)
    except IsADirectoryError:
        raise JSONFileError(path, "is a directory, not a file") from None
    except OSError as exc:
        raise JSONFileError(path, f"cannot be read ({exc.strerror or exc})") from None
    try:
        kind = os.fstat(fd).st_mode
        if not stat.S_ISREG(kind):
            what = next((name for test, name in _NOT_REGULAR if test(kind)), "not a regular file")
            if os.path.islink(path):
                what = f"a link to {os.path.realpath(path)}, {what}"
            raise JSONFileError(path, f"is {what}, not a file")
        os.set_blocking(fd, True)
        return cast(BinaryIO, os.fdopen(fd, mode))
    except BaseException:
        os.close(fd)
        raise


def read_bytes(path: str | os.PathLike[str], *, max_bytes: int = MAX_BYTES) -> bytes:
    """At most ``max_bytes`` of ``path`` (a longer file is refused; so is anything but a regular file)."""
    try:
        with open_regular(path) as f:
            data = f.read(max_bytes + 1)
    except OSError as exc:
        raise JSONFileError(path, f"cannot be read ({exc.strerror or exc})") from None
    if len(data) > max_bytes:
        raise JSONFileError(path, f"is larger than {max_bytes:,} bytes: not a file this project wrote")
    return data


def read_text(path: str | os.PathLike[str], *, max_bytes: int = MAX_BYTES) -> str:
    """``path`` as UTF-8 text, bounded like :func:`read_bytes`."""
    data = read_bytes(path, max_bytes=max_bytes)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise JSONFileError(path, f"is not UTF-8 text (byte {exc.start})") from None


def read_json(
    path: str | os.PathLike[str],
    *,
    max_bytes: int = MAX_BYTES,
    allow_nan: bool = False,
    allow_duplicate_keys: bool = False,
) -> Any:
    """One JSON document from ``path``, bounded and strict (see the module's docstring)."""
    return loads(
        read_bytes(path, max_bytes=max_bytes),
        source=path,
        allow_nan=allow_nan,
        allow_duplicate_keys=allow_duplicate_keys,
    )


@dataclass(frozen=True)
class Line:
    """One line of a JSON-lines file: its number, its bytes (without the newline), whether it ended."""

    number: int
    raw: bytes
    ended: bool


def iter_lines(path: str | os.PathLike[str], *, max_line_bytes: int = MAX_LINE_BYTES) -> Iterator[Line]:
    """The lines of a regular file ``path``, each bounded: a line longer than ``max_line_bytes`` (a binary file
    without newlines) is refused as soon as that many bytes were read, never read whole."""
    f = open_regular(path)
    with f:
        number = 0
        while True:
            try:
                raw = f.readline(max_line_bytes + 1)
            except OSError as exc:
                raise JSONFileError(path, f"cannot be read ({exc.strerror or exc})", number + 1) from None
            if not raw:
                return
            number += 1
            ended = raw.endswith(b"\n")
            if not ended and len(raw) > max_line_bytes:
                problem = f"has a line longer than {max_line_bytes:,} bytes: not a JSON-lines file"
                raise JSONFileError(path, problem, number)
            yield Line(number, raw[:-1] if ended else raw, ended)


def read_jsonl(
    path: str | os.PathLike[str], *, max_line_bytes: int = MAX_LINE_BYTES, allow_nan: bool = True
) -> Iterator[tuple[Line, Any]]:
    """Each non-blank line of ``path`` with its parsed value; the first bad line raises (naming its number).
    A caller that forgives a torn last line (a killed writer) uses :func:`iter_lines` and :func:`loads`."""
    for line in iter_lines(path, max_line_bytes=max_line_bytes):
        if line.raw.strip():
            yield line, loads(line.raw, source=path, line=line.number, allow_nan=allow_nan)
