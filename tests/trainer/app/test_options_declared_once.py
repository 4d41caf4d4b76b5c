"""Each run option is declared once: one ``option()`` field of ``RunOptions`` (trainer/app/options.py).

Its flag, bounds, help, run.json entry and the names errors give it are derived from that field. A second
declaration is what these scans find: an ``add_argument(`` outside the derivation, a ``RunOptions`` field without
``option()``, or a hand-written collection of option names or flags (the shape every old copy had: a bounds
table, run.json's schema, a flag-to-argument map, the set of flags allowed with --resume). Adding an option is
one edit, shown by the last test.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
from pathlib import Path

import pytest

from trainer.app import options as options_module
from trainer.app.options import (
    API_NAMES,
    BOUNDS,
    FLAGS,
    JOB_NAMES,
    MANIFEST,
    OPTIONS,
    RunOptions,
    add_run_arguments,
    derive,
    option,
)

ROOT = Path(__file__).resolve().parents[3]
TRAINER = ROOT / "trainer"
DERIVATION = TRAINER / "app" / "options.py"
NAMES = frozenset(o.name for o in OPTIONS)
SPELLINGS = frozenset(FLAGS.values()) | frozenset(JOB_NAMES)


def _strings(node: ast.AST) -> list[str]:
    """The string constants directly in a collection display (a dict's keys, a set's or tuple's items)."""
    items = node.keys if isinstance(node, ast.Dict) else getattr(node, "elts", [])
    return [i.value for i in items if isinstance(i, ast.Constant) and isinstance(i.value, str)]


def scan(source: str, path: str, *, app: bool = True) -> list[str]:
    """The second declarations of run options in one module's source (``app``: a module of trainer/app, where a
    collection of option names can only be a copy of the declarations; below it, a trainer's own keyword
    arguments share some names -- ``trainer.grpo``'s seed and lr -- and are the trainer's, not run options)."""
    problems = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "add_argument":
            problems.append(f"{path}:{node.lineno}: add_argument( outside trainer/app/options.py")
        if app and isinstance(node, ast.Dict | ast.Set | ast.Tuple | ast.List):
            named = [s for s in _strings(node) if s in NAMES or s in SPELLINGS]
            if len(named) >= 2:
                problems.append(f"{path}:{node.lineno}: options written out by hand ({', '.join(named[:4])})")
    return problems


def _modules() -> list[Path]:
    return [p for p in sorted(TRAINER.rglob("*.py")) if p != DERIVATION]


def test_no_run_option_is_declared_outside_its_field() -> None:
    problems = [
        problem
        for path in _modules()
        for problem in scan(path.read_text(), str(path.relative_to(ROOT)), app=path.parent.name == "app")
    ]
    assert problems == [], "\n".join(problems)


def test_every_runoptions_field_is_declared_with_option() -> None:
    assert [f.name for f in dataclasses.fields(RunOptions)] == [o.name for o in OPTIONS]
    assert all("option" in f.metadata for f in dataclasses.fields(RunOptions))


@pytest.mark.parametrize(
    "stray",
    [
        'p.add_argument("--keep-checkpoints", type=int, default=3)\n',
        'BOUNDS = {"steps": 1, "seed": 2}\n',
        'JOB_ARGUMENTS = {"--trainer-workers": "workers", "--seed": "seed"}\n',
        '_WITH_RESUME = frozenset({"steps", "quiet"})\n',
        'manifest = {"keep_checkpoints": opts.keep_checkpoints, "seed": opts.seed}\n',
    ],
)
def test_the_scan_finds_a_stray_declaration(stray: str) -> None:
    assert scan(stray, "stray.py"), stray


def test_the_scan_passes_a_single_name_and_plain_reads() -> None:
    source = 'x = API_NAMES["resume"]\nfor flag, value in (("--engines", 1), ("--steps", 2)):\n    pass\n'
    assert scan(source, "fine.py") == []


def test_a_runoptions_field_without_option_fails_the_derivation() -> None:
    @dataclasses.dataclass
    class Stray(RunOptions):
        extra: int = 1  # declared as a plain field: it has no flag, bounds, help, run.json entry

    with pytest.raises(TypeError, match=r"RunOptions.extra is not declared with option\(\)"):
        derive(Stray)


def test_adding_an_option_is_one_edit(monkeypatch: pytest.MonkeyPatch) -> None:
    """One ``option()`` field: its flag parses (bounded), run.json writes it and reads it back (checked), and the
    errors name it -- with no other edit."""

    @dataclasses.dataclass
    class Grown(RunOptions):
        max_widgets: int = option(
            4,
            "widgets per step (default 4)",
            flag="--max-widgets",
            cli=lambda: {"type": options_module.BOUNDS["max_widgets"], "metavar": "N"},
            bounds=options_module.Bounded(1, 8),
            fix="pass 1..8",
            manifest=lambda v: None if isinstance(v, int) and 1 <= v <= 8 else "must be an integer in 1..8",
        )

    grown = derive(Grown)
    monkeypatch.setattr(options_module, "OPTIONS", grown)
    monkeypatch.setitem(options_module.BOUNDS, "max_widgets", options_module.Bounded(1, 8))
    monkeypatch.setitem(options_module.MANIFEST, "max_widgets", grown[-1].manifest)
    parser = argparse.ArgumentParser()
    add_run_arguments(parser)
    assert parser.parse_args(["--max-widgets", "6"]).max_widgets == 6
    with pytest.raises(SystemExit):
        parser.parse_args(["--max-widgets", "9"])  # bounded where it is parsed
    written = Grown(max_widgets=6).manifest()
    assert written["max_widgets"] == 6
    assert Grown.from_manifest(written, Path("run.json")).max_widgets == 6  # type: ignore[attr-defined]


def test_the_derived_views_cover_every_option() -> None:
    assert set(BOUNDS) <= NAMES and set(MANIFEST) - {"custom"} <= NAMES
    assert set(API_NAMES) == NAMES
    assert all(flag in JOB_NAMES for flag in FLAGS.values())
