"""The engine programs' bad flags (issue 27, cause 2): ``python -m engines.cpu`` and ``python -m engines.sim``.

A number that parses but overflows where it is used (a seed past 64 bits, a KV pool of terabytes, an infinite
timeout) is refused at parse time: exit 2, ONE line ``lifecycle-...: error:`` naming the flag and the fix,
before the port is bound or torch imported. Each case runs in-process (``main(argv)``); a few also as real
processes. The ``test_catches_*`` tests put the old parsing back and show the cases then fail.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from badinput import REPO, _paragraph_problems, tree_snapshot, written

import engines.cpu.cli as engine_cli
import engines.sim.__main__ as sim_cli

HUGE = str(1 << 70)
DIGITS = "9" * 5000  # past Python's int-parsing limit
Main = Callable[[list[str]], int]


def _engine(argv: list[str]) -> int:
    return engine_cli.main(argv)


def _sim(argv: list[str]) -> int:
    return sim_cli.cli(argv)


# (id, program, argv, what the one line must name)
CASES: list[tuple[str, Main, tuple[str, ...], tuple[str, ...]]] = [
    ("engine-seed-past-64-bits", _engine, ("--seed", HUGE), ("--seed",)),
    ("engine-seed-5000-digits", _engine, ("--seed", DIGITS), ("--seed",)),
    ("engine-seed-not-a-number", _engine, ("--seed", "abc"), ("--seed",)),
    (
        "engine-max-running-requests-terabytes",
        _engine,
        ("--max-running-requests", "10000000000"),
        ("--max-running-requests",),
    ),
    ("engine-max-running-requests-zero", _engine, ("--max-running-requests", "0"), ("--max-running-requests",)),
    ("engine-port-huge", _engine, ("--port", HUGE), ("--port",)),
    ("engine-port-negative", _engine, ("--port=-1",), ("--port",)),
    ("engine-torch-threads-huge", _engine, ("--torch-threads", HUGE), ("--torch-threads",)),
    ("engine-torch-threads-zero", _engine, ("--torch-threads", "0"), ("--torch-threads",)),
    ("engine-step-delay-inf", _engine, ("--step-delay-s", "inf"), ("--step-delay-s",)),
    ("engine-step-delay-nan", _engine, ("--step-delay-s", "nan"), ("--step-delay-s",)),
    ("engine-startup-delay-huge", _engine, ("--startup-delay-s", "1e300"), ("--startup-delay-s",)),
    ("engine-group-timeout-inf", _engine, ("--weight-group-timeout-s", "inf"), ("--weight-group-timeout-s",)),
    ("engine-model-size-unknown", _engine, ("--model-size", "huge"), ("--model-size",)),
    ("engine-unknown-flag", _engine, ("--sead", "1"), ("--sead",)),
    ("engine-two-keys", _engine, ("--api-key", "a", "--api-key-file", "f"), ("--api-key",)),
    ("engine-key-file-missing", _engine, ("--api-key-file", "{tmp}/nokey"), ("--api-key-file", "{tmp}/nokey")),
    ("engine-key-file-empty", _engine, ("--api-key-file", "{tmp}/empty"), ("--api-key-file",)),
    ("engine-weights-missing", _engine, ("--weights", "{tmp}/nothing"), ("--weights",)),
    ("sim-engines-zero", _sim, ("--engines", "0"), ("--engines",)),
    ("sim-engines-huge", _sim, ("--engines", HUGE), ("--engines",)),
    ("sim-engines-missing", _sim, (), ("--engines",)),
    ("sim-port-huge", _sim, ("--engines", "1", "--port", "70000"), ("--port",)),
    ("sim-latency-inf", _sim, ("--engines", "1", "--latency", "*=inf"), ("--latency",)),
    ("sim-latency-malformed", _sim, ("--engines", "1", "--latency", "0.3"), ("--latency",)),
]


def _setup(tmp: Path) -> None:
    (tmp / "empty").write_text("\n")


def _check(main: Main, argv: tuple[str, ...], names: tuple[str, ...], tmp: Path, capsys: Any) -> None:
    _setup(tmp)
    args = [a.format(tmp=tmp) for a in argv]
    before = tree_snapshot(tmp)
    capsys.readouterr()
    try:
        code = main(args)
    except SystemExit as exc:  # argparse's refusal
        code = exc.code if isinstance(exc.code, int) else 1
    err = capsys.readouterr().err
    assert code == 2, f"exit {code}, stderr {err!r}"
    problems = _paragraph_problems(err, [n.format(tmp=tmp) for n in names])
    assert not problems, f"{problems}: {err!r}"
    assert len(err) < 600, "the error echoes what it refuses, bounded"
    assert not written(before, tree_snapshot(tmp))


@pytest.mark.parametrize(("main", "argv", "names"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input_in_process(
    main: Main, argv: tuple[str, ...], names: tuple[str, ...], tmp_path: Path, capsys: Any
) -> None:
    _check(main, argv, names, tmp_path, capsys)


@pytest.mark.parametrize(
    ("module", "argv", "flag"),
    [
        ("engines.cpu", ("--seed", HUGE), "--seed"),
        ("engines.cpu", ("--max-running-requests", "10000000000"), "--max-running-requests"),
        ("engines.sim", ("--engines", "1", "--latency", "*=nan"), "--latency"),
    ],
    ids=["engine-seed", "engine-kv-slots", "sim-latency"],
)
def test_bad_input_as_a_process(module: str, argv: tuple[str, ...], flag: str) -> None:
    out = subprocess.run([sys.executable, "-m", module, *argv], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert out.returncode == 2, out
    assert not _paragraph_problems(out.stderr, [flag]), out.stderr


def test_a_kv_pool_larger_than_the_machine_is_refused_before_allocating(monkeypatch: pytest.MonkeyPatch) -> None:
    """Within the parse-time bound a model's slots can still outgrow a small machine: refused by name at load."""
    import engines.cpu.memory as memory

    monkeypatch.setattr(memory, "physical_memory_bytes", lambda: 1 << 20)
    with pytest.raises(memory.KVPoolTooLarge, match=r"--max-running-requests 64: .* Fix: give fewer slots"):
        memory.ModelMemory(kv_slots=64).load()


# -- the old parsing, re-introduced, is caught ------------------------------------------------------------
class _GotPast(Exception):
    pass


def test_catches_an_unbounded_seed(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: Any) -> None:
    monkeypatch.setattr(engine_cli, "bounded_int", lambda low, high, fix: int)  # the old `type=int`
    monkeypatch.setattr(engine_cli, "bind", lambda *a: (_ for _ in ()).throw(_GotPast()))  # where torch came next
    with pytest.raises(_GotPast):
        _check(_engine, ("--seed", HUGE), ("--seed",), tmp_path, capsys)


def test_catches_argparse_usage_block(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: Any) -> None:
    import engines.cliargs

    monkeypatch.setattr(engines.cliargs.OneLineParser, "error", argparse.ArgumentParser.error)
    with pytest.raises(AssertionError, match=r"not one paragraph|no 'Fix:'"):
        _check(_engine, ("--port", HUGE), ("--port",), tmp_path, capsys)
