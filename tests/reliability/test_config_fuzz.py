"""Hypothesis over the whole config space: every entry point either builds a config or raises ConfigError.

tests/lifecycle/decide/test_config.py fuzzes ``from_mapping`` with known keys and a fixed value pool. This goes
wider, at every door a user or an embedding script can come through:

* ``from_mapping`` with every key at once, every spelling (``rollout_num_gpus``, ``rollout-num-gpus``,
  ``--rollout-num-gpus``), unknown and non-string keys, and value types nobody plans for (bytes, Path,
  Decimal, Fraction, complex, huge ints, nested containers, arbitrary objects), and non-mapping inputs;
* ``from_namespace`` over a Namespace (or any object) carrying those values plus unrelated attributes;
* the CLI: ``lifecycle explain`` / ``check`` / ``graph`` argv built from every flag with random
  tokens, which must exit 0 or 2 and, on 2, print one paragraph and no traceback;
* the file loaders with random TOML / JSON / YAML content (structured and raw text/bytes), through
  ``from_file`` and through ``lifecycle explain --config FILE``.

Outcome rule: a ``LifecycleConfig`` (which then round-trips and gives boolean predicates) or a
``ConfigError`` whose message names a flag and carries a ``Fix:``. Anything else is a bug.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import math
import tempfile
from collections.abc import Callable, Iterator
from decimal import Decimal
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import lifecycle.cli as cli
from lifecycle.decide.config import FLAG_BY_NAME, FLAGS, LifecycleConfig, load_config_file
from lifecycle.decide.errors import ConfigError, UsageError
from lifecycle.decide.predicates import evaluate

pytestmark = pytest.mark.bad_input

KEYS = sorted(FLAG_BY_NAME)
FUZZ = settings(suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much], deadline=None)


class Weird:
    """An object no loader produces, but a miles Namespace might carry."""

    def __repr__(self) -> str:
        return "Weird()"


class Exploding:
    """An object whose str/format/bool raise: the config must not call them blindly."""

    def __str__(self) -> str:
        raise RuntimeError("str() of Exploding")

    def __repr__(self) -> str:
        return "Exploding()"


ODD_STRINGS = st.sampled_from(
    [
        "",
        " ",
        "\t",
        "\x00",
        "a\x00b",
        "é",
        "🚀",
        "train",
        "rollout",
        "train rollout",
        "train,rollout,",
        ",",
        "TRAIN",
        "r/{rollout_id}.json",
        "{rollout_id:>05}",
        "{rollout_id!r}",
        "{rollout_id.__class__}",
        "{0}{1}",
        "}{",
        "-1",
        "+3",
        "0x10",
        "1_000",
        "\uff11\uff12",  # full-width digits: int() accepts them
        "1e309",
        "-inf",
        "NaN",
        "9" * 400,
        "True",
        "yes",
        "off",
        "None",
        "null",
    ]
)
NUMBERS = st.one_of(
    st.integers(),
    st.integers(min_value=-(10**400), max_value=10**400),
    st.sampled_from([0, 1, -1, 2**63, -(2**63), 10**400]),
    st.floats(),
    st.floats(min_value=-1e-300, max_value=1e-300),
    st.sampled_from([math.nan, math.inf, -math.inf, -0.0, 5e-324, 1.7976931348623157e308]),
    st.decimals(allow_nan=True, allow_infinity=True),
    st.fractions(),
    st.complex_numbers(max_magnitude=10),
)
SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    NUMBERS,
    ODD_STRINGS,
    st.text(max_size=20),
    st.binary(max_size=8),
    st.builds(bytearray, st.binary(max_size=4)),
    st.builds(Path, st.sampled_from(["r/{rollout_id}.json", "", ".", "x.json"])),
    st.builds(Weird),
    st.builds(Exploding),
    st.just(Ellipsis),
    st.just(NotImplemented),
)
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.tuples(inner, inner),
        st.frozensets(st.sampled_from(["train", "rollout", "x"]), max_size=3),
        st.dictionaries(st.text(max_size=4), inner, max_size=2),
    ),
    max_leaves=6,
)


def _spell(key: str, style: int) -> str:
    return [key, key.replace("_", "-"), "--" + key.replace("_", "-"), "-" + key][style]


@st.composite
def whole_space(draw: st.DrawFn) -> dict[Any, Any]:
    """Every known key (in some spelling), each with a wild value, plus a few unknown keys."""
    out: dict[Any, Any] = {}
    for key in KEYS:
        if draw(st.integers(0, 9)) < 8:  # most keys present at once
            out[_spell(key, draw(st.integers(0, 3)))] = draw(VALUES)
    for extra in draw(
        st.lists(st.one_of(st.text(max_size=8), st.integers(), st.none(), st.tuples(st.integers())), max_size=2)
    ):
        out[extra] = draw(VALUES)
    return out


def plausible_value(flag_kind: str) -> st.SearchStrategy[Any]:
    """Right-typed values (as Python objects or as strings), so builds succeed often enough to check them."""
    if flag_kind == "bool":
        return st.one_of(st.booleans(), st.sampled_from(["true", "false", "1", "0", "yes", "no"]))
    if flag_kind == "int":
        return st.one_of(st.none(), st.integers(-2, 16), st.integers(-2, 16).map(str), st.sampled_from([2.0, 4.0, 1.5]))
    if flag_kind == "float":
        return st.one_of(st.none(), st.floats(-1, 700), st.floats(0, 60).map(repr), st.integers(0, 60))
    if flag_kind == "path":
        return st.one_of(
            st.none(), st.sampled_from(["r/{rollout_id}.json", "r.json", "{rollout_id}", "s/{rollout_id:03d}.j"])
        )
    if flag_kind == "addresses":
        return st.one_of(
            st.none(),
            st.lists(st.sampled_from(["127.0.0.1:30000", "h:1", "http://h:2", "h", "h:x", "ftp://h:1"]), max_size=3),
            st.sampled_from(["h:1,h:2", "h:1 h:1", ""]),
        )
    return st.one_of(  # components
        st.none(),
        st.lists(st.sampled_from(["train", "rollout"]), max_size=2, unique=True),
        st.sampled_from(["train", "rollout", "train,rollout", "rollout train"]),
    )


PLAUSIBLE_WHOLE = st.fixed_dictionaries(
    {"rollout_num_gpus": st.sampled_from([1, 2, 4, 8])},
    optional={f.name: plausible_value(f.kind) for f in FLAGS if f.name != "rollout_num_gpus"},
)


def check_outcome(build: Callable[[], LifecycleConfig]) -> LifecycleConfig | None:
    """The outcome rule. Returns the config when one was built (after checking it)."""
    try:
        config = build()
    except ConfigError as exc:
        message = str(exc)
        assert exc.flag and exc.flag in message and "Fix:" in message, message
        assert exc.flag.startswith("-") or exc.flag in ("trace",), exc.flag
        return None
    assert isinstance(config, LifecycleConfig)
    hash(config)
    assert isinstance(config.ft_components, frozenset) and config.ft_components <= {"train", "rollout"}
    assert all(isinstance(v, bool) for v in evaluate(config).values())
    for f in FLAGS:  # after construction every field has its final type
        v = getattr(config, f.name, None)
        if f.kind == "bool" and f.name != "offload":
            assert isinstance(v, bool), (f.name, v)
        elif f.kind == "int" and v is not None:
            assert type(v) is int, (f.name, v)
        elif f.kind == "float" and v is not None:
            assert type(v) is float and math.isfinite(v), (f.name, v)
    assert LifecycleConfig.from_mapping(config.to_dict(), check_paths=False) == config
    return config


# -- from_mapping / from_namespace ------------------------------------------------------------------------
@FUZZ
@given(whole_space(), st.booleans())
@example({"rollout_num_gpus": Exploding()}, False)
@example({"--rollout-num-gpus": Decimal("NaN")}, False)
@example({"rollout_num_gpus": Fraction(7, 2)}, False)
@example({"rollout_num_gpus": 2, "load_debug_rollout_data": "a\x00b/{rollout_id}.json"}, True)
@example({"rollout_num_gpus": 2, "rollout_health_check_interval": 10**400}, False)
@example({"rollout_num_gpus": "\uff11\uff12"}, False)
@example({("tuple",): 1}, False)
@example({"ft_components": frozenset({"x"}), "use_fault_tolerance": True, "rollout_num_gpus": 1}, False)
def test_from_mapping_whole_space(values: dict[Any, Any], check_paths: bool) -> None:
    check_outcome(lambda: LifecycleConfig.from_mapping(values, check_paths=check_paths))


@FUZZ
@given(PLAUSIBLE_WHOLE)
def test_from_mapping_plausible_whole_space_builds_and_round_trips(values: dict[str, Any]) -> None:
    config = check_outcome(lambda: LifecycleConfig.from_mapping(values, check_paths=False))
    if config is not None:
        assert LifecycleConfig.from_args(config.to_flags(), check_paths=False) == config


@FUZZ
@given(
    st.one_of(st.none(), st.lists(st.integers(), max_size=2), st.text(max_size=5), st.integers(), st.binary(max_size=3))
)
def test_from_mapping_of_a_non_mapping(values: Any) -> None:
    with pytest.raises(ConfigError, match="--config"):
        LifecycleConfig.from_mapping(values)


@FUZZ
@given(
    whole_space(), st.dictionaries(st.from_regex(r"[a-z_]{1,10}", fullmatch=True), VALUES, max_size=4), st.booleans()
)
def test_from_namespace_whole_space(values: dict[Any, Any], unrelated: dict[str, Any], plain_object: bool) -> None:
    """A miles Namespace: our flags (attribute names are always the underscore spelling) among others."""
    attrs = {**unrelated, **{str(k).lstrip("-").replace("-", "_"): v for k, v in values.items() if isinstance(k, str)}}
    attrs = {k: v for k, v in attrs.items() if k.isidentifier()}
    ns: Any = argparse.Namespace(**attrs)
    if plain_object:
        ns = type("MilesArgs", (), {})()
        for k, v in attrs.items():
            setattr(ns, k, v)
    check_outcome(lambda: LifecycleConfig.from_namespace(ns, check_paths=False))


# -- the CLI parser --------------------------------------------------------------------------------------------
TOKENS = st.one_of(
    ODD_STRINGS,
    st.text(max_size=10),
    st.integers().map(str),
    st.floats().map(repr),
    st.sampled_from(["-", "--", "-x", "--="]),
)


@st.composite
def argv_whole_space(draw: st.DrawFn) -> list[str]:
    argv: list[str] = []
    for f in draw(st.lists(st.sampled_from(FLAGS), max_size=8)):
        if f.kind == "bool" and draw(st.booleans()):
            argv.append(f.flag)
        elif draw(st.integers(0, 4)) == 0:
            argv.append(f"{f.flag}={draw(TOKENS)}")
        else:
            argv += [f.flag, *draw(st.lists(TOKENS, min_size=0, max_size=2))]
    if draw(st.integers(0, 5)) == 0:
        argv.append(draw(st.sampled_from(["--no-such-flag", "--rollout-num-gpu", "positional", "--config=none"])))
    return argv


def _main(argv: list[str]) -> tuple[int, str]:
    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        code = cli.main(argv)
    return code, err.getvalue()


def check_cli(argv: list[str]) -> int:
    code, err = _main(argv)
    assert code in (0, 2), (argv, code, err)
    if code == 2:
        assert "Traceback" not in err, err
        text = err.strip()
        assert text.startswith("lifecycle") and "\n" not in text and "Fix:" in text, (argv, text)
    return code


@FUZZ
@given(
    argv_whole_space(),
    st.sampled_from([["explain"], ["explain", "--json"], ["graph", "--machine", "engine", "--format", "json"]]),
)
@example(["--rollout-num-gpus", "1e999"], ["explain"])
@example(["--ft-components", "--rollout-num-gpus", "2"], ["explain"])
@example(["--rollout-health-check-interval=-inf"], ["explain"])
@example(["--load-debug-rollout-data", "\x00"], ["explain"])
def test_cli_whole_space_is_exit_0_or_one_paragraph_exit_2(argv: list[str], command: list[str]) -> None:
    check_cli([*command, *argv])


@FUZZ
@given(argv_whole_space())
def test_library_parser_is_config_or_config_error(argv: list[str]) -> None:
    """``LifecycleConfig.from_args``: a command line argparse rejects is a ``UsageError`` (never
    argparse's ``SystemExit(2)``); everything that parses is a config or a ConfigError; only a help
    request (``-h``, ``--he``...) exits, with 0 after printing the help."""
    shown = io.StringIO()
    try:
        with contextlib.redirect_stdout(shown):
            check_outcome(lambda: LifecycleConfig.from_args(argv, check_paths=False))
    except UsageError as exc:
        assert "Fix:" in str(exc) and exc.prog == "lifecycle"
    except SystemExit as exc:
        assert exc.code == 0 and shown.getvalue().startswith("usage: lifecycle"), (exc.code, argv)


# -- config files --------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def scratch() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="config-fuzz-") as d:
        yield Path(d)


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int | float) and not isinstance(v, bool):
        return (
            repr(v)
            if not (isinstance(v, float) and not math.isfinite(v))
            else ("nan" if math.isnan(v) else ("inf" if v > 0 else "-inf"))
        )
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    return json.dumps(str(v))


FILE_VALUES = st.one_of(
    st.booleans(),
    st.integers(-(2**63), 2**63 - 1),
    st.floats(),
    ODD_STRINGS,
    st.text(max_size=10),
    st.lists(st.one_of(st.sampled_from(["train", "rollout", "x"]), st.integers(-2, 3)), max_size=3),
)
FILE_MAPPING = st.dictionaries(
    st.one_of(
        st.sampled_from(KEYS),
        st.sampled_from([k.replace("_", "-") for k in KEYS]),
        st.from_regex(r"[a-z_]{1,12}", fullmatch=True),
    ),
    FILE_VALUES,
    max_size=len(KEYS),
)


@st.composite
def config_file(draw: st.DrawFn) -> tuple[str, bytes]:
    """(suffix, content): a structured mapping in its format (optionally under [lifecycle]), or raw junk."""
    suffix = draw(st.sampled_from([".toml", ".json", ".yaml", ".yml", ".TOML", ".txt", ""]))
    kind = draw(st.integers(0, 4))
    if kind == 0:
        return suffix, draw(st.binary(max_size=60))
    if kind == 1:
        return suffix, draw(st.text(max_size=80)).encode()
    mapping = draw(FILE_MAPPING)
    nested = draw(st.booleans())
    fmt = suffix.lower().lstrip(".") or "toml"
    if fmt == "toml" or fmt == "txt":
        body = "\n".join(f"{json.dumps(k)} = {_toml_value(v)}" for k, v in mapping.items())
        text = f"[lifecycle]\n{body}\n" if nested else body + "\n"
    elif fmt == "json":
        text = json.dumps({"lifecycle": mapping} if nested else mapping)
    else:
        import yaml

        text = yaml.safe_dump({"lifecycle": mapping} if nested else mapping, allow_unicode=True)
    if draw(st.integers(0, 4)) == 0:  # truncate it somewhere
        text = text[: draw(st.integers(0, max(len(text) - 1, 0)))]
    return suffix, text.encode("utf-8", "surrogatepass")


_counter = iter(range(10**9))


@FUZZ
@given(config_file())
@example((".toml", b"\xff\xfe"))
@example((".json", b"[]"))
@example((".yaml", b"- a\n- b\n"))
@example((".toml", b'rollout_num_gpus = 2\n[lifecycle]\nrollout_num_gpus = "x"\n'))
@example((".json", b'{"lifecycle": {"rollout_num_gpus": 1e999}}'))
@example((".yaml", b"rollout_num_gpus: !!python/object:os.system ls\n"))
def test_config_files_are_config_or_config_error(scratch: Path, file: tuple[str, bytes]) -> None:
    suffix, content = file
    path = scratch / f"c{next(_counter)}{suffix}"
    path.write_bytes(content)
    check_outcome(lambda: LifecycleConfig.from_file(path, check_paths=False))
    try:
        assert isinstance(load_config_file(path), dict)
    except ConfigError as exc:
        assert str(path) in str(exc) or exc.source == str(path), str(exc)
    check_cli(["explain", "--config", str(path)])  # and the CLI: exit 0, or 2 with one paragraph


# -- the fuzz can fail: re-introduce a naive parser and watch hypothesis find the crash ---------------------------
def _naive_number(name: str, value: object, kind: str, optional: bool) -> int | float | None:
    return None if value is None else (int(value) if kind == "int" else float(value))  # type: ignore[arg-type]


def test_fuzz_catches_a_naive_number_parser(monkeypatch: pytest.MonkeyPatch) -> None:
    import lifecycle.decide.config

    monkeypatch.setattr(lifecycle.decide.config, "_as_number", _naive_number)
    with pytest.raises(Exception) as info:
        test_from_mapping_whole_space()
    assert not isinstance(info.value, ConfigError)


def test_fuzz_catches_a_naive_file_loader(monkeypatch: pytest.MonkeyPatch) -> None:
    import tomllib

    import lifecycle.decide.config

    monkeypatch.setattr(lifecycle.decide.config, "load_config_file", lambda p: tomllib.loads(Path(p).read_text()))
    with pytest.raises(Exception) as info:
        test_config_files_are_config_or_config_error(Path(tempfile.mkdtemp(prefix="config-fuzz-mutant-")))
    assert not isinstance(info.value, ConfigError)


def test_fuzz_oracle_catches_argparse_exits(monkeypatch: pytest.MonkeyPatch) -> None:
    """The CLI oracle refuses argparse's usage dump + SystemExit (what the CLI did before UsageError)."""
    monkeypatch.setattr(cli._Parser, "error", argparse.ArgumentParser.error)
    with pytest.raises(SystemExit), contextlib.redirect_stderr(io.StringIO()):
        check_cli(["explain", "--no-such-flag"])
