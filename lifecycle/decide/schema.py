"""Type checks of what is read back, derived from the ``TypedDict`` its writer is typed with.

A file the project writes and reads again (an event log, a graph export) is described once, as the
``TypedDict`` the writer builds; :func:`checker` turns that same definition into a check of a parsed JSON
value, so a field that is a number where a list was written is one :class:`SchemaError` naming the file,
the line, the field, what was expected and what was found -- never a ``TypeError`` deep in a reader, never a
silent "ok". The writer and the reader cannot drift apart: there is no second list of fields.

What a hint may be: ``str``, ``int``, ``float`` (an int is a number too), ``bool``, ``None``, ``Any``,
``X | Y``, ``Literal[...]``, ``list[X]``, ``dict[str, X]``, a ``TypedDict`` (its required keys must be
there; keys it does not name are left alone, so a field added later does not break an older reader). What a
type cannot say (a config's values) is its reader's own check.
"""

from __future__ import annotations

import json
import os
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Union, get_args, get_origin, get_type_hints, is_typeddict

from lifecycle.decide.jsonio import JSONFileError

_SHOWN = 40  # characters of a wrong value quoted in an error
_KINDS: tuple[tuple[Any, str], ...] = (
    (str, "a string"),
    ((int, float), "a number"),
    (list, "a list"),
    (dict, "an object"),
)


@dataclass(frozen=True)
class Mismatch:
    """The first field that is not what the writer writes: its dotted path, what it must be, what it is."""

    field: str
    expected: str
    found: str

    def under(self, parent: str) -> Mismatch:
        """This mismatch inside ``parent`` (a key, or ``[i]`` of a list)."""
        if not self.field:
            return Mismatch(parent, self.expected, self.found)
        joint = "" if self.field.startswith("[") else "."
        return Mismatch(f"{parent}{joint}{self.field}", self.expected, self.found)


class SchemaError(JSONFileError):
    """A file whose JSON parsed but holds a field of the wrong type: ``field``, ``expected``, ``found``, ``fix``."""

    def __init__(
        self, path: str | os.PathLike[str], mismatch: Mismatch, *, what: str, fix: str, line: int | None = None
    ) -> None:
        self.field = mismatch.field
        self.expected = mismatch.expected
        self.found = mismatch.found
        self.fix = fix
        name = f"field {mismatch.field!r}" if mismatch.field else "the value"
        super().__init__(path, f"{what}: {name} is {mismatch.found}, expected {mismatch.expected}", line)


Checker = Callable[[Any], Mismatch | None]


def found(value: Any) -> str:
    """``value`` as the user would see it in the file, with its JSON kind: ``5 (a number)``."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"{json.dumps(value)} (true/false)"
    kind = next((word for t, word in _KINDS if isinstance(value, t)), type(value).__name__)
    text = json.dumps(value, default=str, ensure_ascii=False)
    if len(text) > _SHOWN:
        text = text[: _SHOWN - 1] + "…"
    return f"{text} ({kind})"


_MISSING = "missing"


def _simple(expected: str, test: Callable[[Any], bool]) -> tuple[str, Checker]:
    def check(value: Any) -> Mismatch | None:
        return None if test(value) else Mismatch("", expected, found(value))

    return expected, check


_PRIMITIVES: dict[Any, tuple[str, Checker]] = {
    str: _simple("a string", lambda v: isinstance(v, str)),
    int: _simple("an integer", lambda v: isinstance(v, int) and not isinstance(v, bool)),
    float: _simple("a number", lambda v: isinstance(v, int | float) and not isinstance(v, bool)),
    bool: _simple("true or false", lambda v: isinstance(v, bool)),
    type(None): _simple("null", lambda v: v is None),
}
_cache: dict[Any, tuple[str, Checker]] = {}


def checker(hint: Any) -> Checker:
    """The check of a parsed JSON value against ``hint`` (compiled once per hint)."""
    return _compile(hint)[1]


def expected(hint: Any) -> str:
    """What ``hint`` requires, in words (``a list (each a string)``)."""
    return _compile(hint)[0]


def _compile(hint: Any) -> tuple[str, Checker]:
    out = _cache.get(hint)
    if out is None:
        out = _cache[hint] = _build(hint)
    return out


def _none(value: Any) -> Mismatch | None:
    return None


def _build(hint: Any) -> tuple[str, Checker]:
    if hint is Any or hint is object:
        return "anything", _none
    if hint is None:
        hint = type(None)
    if hint in _PRIMITIVES:
        return _PRIMITIVES[hint]
    if is_typeddict(hint):
        return _typeddict(hint)
    origin, args = get_origin(hint), get_args(hint)
    if origin in (typing.Required, typing.NotRequired):
        return _compile(args[0])
    if origin in (Union, types.UnionType):
        return _union(args)
    if origin is typing.Literal:
        allowed = tuple(args)
        words = "one of " + ", ".join(json.dumps(a) for a in allowed)
        return _simple(words, lambda v: any(v == a and type(v) is type(a) for a in allowed))
    if origin is list:
        return _list(args[0] if args else Any)
    if origin is dict:
        return _dict(args[1] if len(args) == 2 else Any)
    raise TypeError(f"lifecycle.decide.schema cannot check {hint!r}")


def _union(args: tuple[Any, ...]) -> tuple[str, Checker]:
    parts = [_compile(a) for a in args]
    words = " or ".join(w for w, _ in parts)
    checks = [c for _, c in parts]

    def check(value: Any) -> Mismatch | None:
        misses = [c(value) for c in checks]
        if any(m is None for m in misses):
            return None
        deeper = [m for m in misses if m is not None and m.field]  # the right kind, a wrong part: say which
        return deeper[0] if len(deeper) == 1 else Mismatch("", words, found(value))

    return words, check


def _list(item: Any) -> tuple[str, Checker]:
    inner_words, inner = _compile(item)
    words = "a list" if item is Any else f"a list (each {inner_words})"

    def check(value: Any) -> Mismatch | None:
        if not isinstance(value, list):
            return Mismatch("", words, found(value))
        for i, x in enumerate(value):
            wrong = inner(x)
            if wrong is not None:
                return wrong.under(f"[{i}]")
        return None

    return words, check


def _dict(item: Any) -> tuple[str, Checker]:
    inner_words, inner = _compile(item)
    words = "an object" if item is Any else f"an object (each value {inner_words})"

    def check(value: Any) -> Mismatch | None:
        if not isinstance(value, dict):
            return Mismatch("", words, found(value))
        for k, x in value.items():
            wrong = inner(x)
            if wrong is not None:
                return wrong.under(str(k))
        return None

    return words, check


def _required(cls: Any, key: str, hint: Any) -> bool:
    """Whether ``key`` must be there. Python 3.11 ignores ``NotRequired`` written as a postponed annotation (its
    ``__required_keys__`` lists the key), so the wrapper, which ``get_type_hints`` keeps, decides first."""
    origin = get_origin(hint)
    if origin is typing.NotRequired:
        return False
    return origin is typing.Required or key in cls.__required_keys__


_ABSENT = object()
_EXACT = {str: (str,), int: (int,), float: (int, float), bool: (bool,), None: (type(None),), type(None): (type(None),)}


def _exact(hint: Any) -> frozenset[type] | None:
    """The built-in types a JSON value of ``hint`` may have, when that says it all (a scalar, a union of them):
    ``json.loads`` makes exact built-in types, so one set lookup checks the field (the event log's hot path)."""
    if get_origin(hint) in (typing.Required, typing.NotRequired):
        hint = get_args(hint)[0]
    parts = get_args(hint) if get_origin(hint) in (Union, types.UnionType) else (hint,)
    if not all(p in _EXACT for p in parts):
        return None
    return frozenset(t for p in parts for t in _EXACT[p])


def _typeddict(cls: Any) -> tuple[str, Checker]:
    hints = get_type_hints(cls, include_extras=True)
    fields = [(key, _required(cls, key, hint), _exact(hint), *_compile(hint)) for key, hint in hints.items()]
    names = ", ".join(key for key, want, *_ in fields if want)
    words = f"an object with {names}" if names else "an object"

    def check(value: Any) -> Mismatch | None:
        if not isinstance(value, dict):
            return Mismatch("", words, found(value))
        for key, want, exact, field_words, field_check in fields:
            item = value.get(key, _ABSENT)
            if item is _ABSENT:
                if want:
                    return Mismatch(key, field_words, _MISSING)
            elif exact is None or type(item) not in exact:
                wrong = field_check(item)
                if wrong is not None:
                    return wrong.under(key)
        return None

    return words, check
