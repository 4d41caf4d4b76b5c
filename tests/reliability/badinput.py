"""The bad-input corpus's harness: the files a case points at, a ``Case``, and the one check every case
passes -- exit 2, ONE paragraph naming the input and the fix, no traceback (``--debug`` shows one), and
nothing written: the case's folder is byte for byte what its setup left (``tree_snapshot``).

Shared by ``test_bad_inputs.py`` and the other corpus files of this folder (imported by name: the folder's
conftest puts it on ``sys.path``); a corpus file declares its ``CASES`` and takes its two tests from
:func:`in_process_test` and :func:`subprocess_test`.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

import lifecycle.cli as cli
from rollout.replay import save_rollout
from tests.helpers import REPO

SAMPLE = {
    "index": 0,
    "group": 0,
    "prompt": "xy:",
    "prompt_ids": [1, 2],
    "output_ids": [3, 4],
    "reward": 1.0,
    "response": "ab",
}
Setup = Callable[[Path], None]


# -- the files the cases point at ------------------------------------------------------------------
def _write(name: str, content: str | bytes) -> Setup:
    def setup(tmp: Path) -> None:
        path = tmp / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content)

    return setup


def _mkdir(name: str) -> Setup:
    return lambda tmp: (tmp / name).mkdir(parents=True, exist_ok=True)


def _replay(
    rollout_id: int = 0, samples: list[dict[str, Any]] | None = None, damage: Callable[[Path], None] | None = None
) -> Setup:
    """A replay file written by the product (right schema and checksum), then optionally damaged."""

    def setup(tmp: Path) -> None:
        path = save_rollout(
            str(tmp / "replay" / "{rollout_id}.json"), rollout_id, [SAMPLE] if samples is None else samples
        )
        if damage is not None:
            damage(path)

    return setup


def _edit_json(change: Callable[[dict[str, Any]], Any]) -> Callable[[Path], None]:
    def damage(path: Path) -> None:
        doc = json.loads(path.read_text())
        doc = change(doc) or doc
        path.write_text(json.dumps(doc))

    return damage


def _small_checkpoint(path: Path) -> None:
    from engines.models import TinyCausalLM

    TinyCausalLM("small", seed=0).save_pretrained(path)


@dataclass(frozen=True)
class Case:
    """``argv`` may hold ``{tmp}``; ``names`` (also formatted) must all appear in the error paragraph."""

    id: str
    argv: tuple[str, ...]
    names: tuple[str, ...]
    setup: tuple[Setup, ...] = ()
    proc: bool = False  # also run as a real subprocess
    argv_fn: Callable[[], tuple[str, ...]] | None = field(default=None, compare=False)

    def materialise(self, tmp: Path) -> tuple[list[str], list[str]]:
        for setup in self.setup:
            setup(tmp)
        argv = self.argv_fn() if self.argv_fn else self.argv
        return [a.format(tmp=tmp) for a in argv], [n.format(tmp=tmp) for n in self.names]


def _run_dir(damage: str = "", *, save: bool = True, checkpoint: bool = True) -> Setup:
    """RUN_DIR of a run started with --save (run.json and one job checkpoint), then optionally damaged:
    ``truncated`` (its manifest cut), ``tampered`` (a tensor byte changed), ``foreign`` (another job's),
    ``options`` (run.json lost most of the loop's options), ``factory`` (its rollout function is not importable
    here)."""

    def setup(tmp: Path) -> None:
        import torch

        from lifecycle.cli.args import _embedded
        from lifecycle.decide.config import LifecycleConfig
        from trainer.app.loop import RunOptions
        from trainer.app.run_manifest import write_run_manifest
        from trainer.job_state import JobCheckpoint, save_job_checkpoint

        values = {**_embedded("cpu"), **({"save": str(tmp / "run" / "ckpt")} if save else {})}
        config = LifecycleConfig.from_mapping(values)
        (tmp / "run").mkdir(parents=True, exist_ok=True)
        options = RunOptions(steps=3, run_dir=tmp / "run").manifest()
        if damage == "options":
            options = {"steps": 3, "seed": 0, "faults": []}
        if damage == "factory":  # a rollout function this machine cannot import
            options["rollout_fn"] = "no_such_pkg_xyz.rollout:make"
        write_run_manifest(tmp / "run", config, options)
        if not checkpoint:
            return
        writer = LifecycleConfig.from_mapping({**values, "rollout_num_gpus": 4}) if damage == "foreign" else config
        facts, rng = {"restarts": [[] for _ in range(config.num_rollout_engines)]}, {"ranks": [{}]}
        job = JobCheckpoint(1, "1", {"w": torch.zeros(4)}, facts, rng)
        where = save_job_checkpoint(tmp / "run" / "ckpt", job, writer)
        if damage == "truncated":
            text = (where / "state.json").read_text()
            (where / "state.json").write_text(text[: len(text) // 2])
        elif damage == "tampered":
            data = bytearray((where / "state.safetensors").read_bytes())
            data[-1] ^= 0xFF
            (where / "state.safetensors").write_bytes(bytes(data))

    return setup


REPLAY = ("run", "--quiet", "--run-dir", "{tmp}/run", "--load-debug-rollout-data", "{tmp}/replay/{{rollout_id}}.json")
R0 = "{tmp}/replay/0.json"


def tree_snapshot(root: Path) -> dict[str, str]:
    """Every path under ``root`` with what it holds (a file's sha256, a link's target, ``dir``)."""
    out: dict[str, str] = {}
    for path in sorted(root.rglob("*")):
        rel = str(path.relative_to(root))
        if path.is_symlink():
            out[rel] = "link:" + os.readlink(path)
        elif path.is_dir():
            out[rel] = "dir"
        elif path.is_file():
            try:
                with path.open("rb") as f:  # in chunks: a case's file may be large (or sparse)
                    out[rel] = hashlib.file_digest(f, "sha256").hexdigest()
            except OSError as exc:  # an unreadable file (a permission case) is still one that must not change
                out[rel] = f"unreadable:{exc.errno}:{path.stat().st_size}"
        else:
            out[rel] = "special"
    return out


def written(before: dict[str, str], after: dict[str, str]) -> list[str]:
    """What a refused command created, changed or removed (empty: nothing)."""
    return sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))


# -- the checks ---------------------------------------------------------------------------------------------
def _paragraph_problems(err: str, names: list[str]) -> list[str]:
    """Why ``err`` is not a good error report (empty list: it is one)."""
    problems = []
    text = err.strip()
    if "Traceback" in err:
        problems.append("a traceback without --debug")
    if not text:
        return [*problems, "nothing on stderr"]
    if "\n" in text:
        problems.append(f"{text.count(chr(10)) + 1} lines, not one paragraph")
    if not text.startswith("lifecycle") or ": error: " not in text:
        problems.append("does not start with 'lifecycle ...: error:'")
    if "Fix:" not in text:
        problems.append("no 'Fix:'")
    problems += [f"does not name {n!r}" for n in names if n not in text]
    return problems


def check_in_process(case: Case, tmp: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv, names = case.materialise(tmp)
    before = tree_snapshot(tmp)
    capsys.readouterr()
    code = cli.main(argv)
    err = capsys.readouterr().err
    assert code == 2, f"{case.id}: exit {code}, stderr {err!r}"
    assert not _paragraph_problems(err, names), f"{case.id}: {_paragraph_problems(err, names)}: {err!r}"
    assert not written(before, tree_snapshot(tmp)), f"{case.id}: wrote {written(before, tree_snapshot(tmp))}"
    code = cli.main(["--debug", *argv])
    err = capsys.readouterr().err
    assert code == 2, f"{case.id} --debug: exit {code}"
    assert "Traceback (most recent call last)" in err, f"{case.id}: --debug shows no traceback: {err!r}"
    assert err.strip().splitlines()[-1].startswith("lifecycle"), "the paragraph still ends the --debug output"


def _cli(argv: list[str], timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.run(
        [sys.executable, "-m", "lifecycle.cli", *argv],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        cwd=REPO,
    )


def check_subprocess(case: Case, tmp: Path, *, debug: bool = False) -> None:
    """``case`` as a real ``python -m lifecycle.cli`` process: exit 2, one paragraph, nothing written (and with
    ``debug``, ``--debug`` shows the traceback, still exit 2)."""
    argv, names = case.materialise(tmp)
    before = tree_snapshot(tmp)
    plain = _cli(argv)
    assert plain.returncode == 2, plain
    assert not written(before, tree_snapshot(tmp)), f"{case.id}: wrote {written(before, tree_snapshot(tmp))}"
    assert not _paragraph_problems(plain.stderr, names), (_paragraph_problems(plain.stderr, names), plain.stderr)
    if debug:
        traced = _cli(["--debug", *argv])
        assert traced.returncode == 2 and "Traceback (most recent call last)" in traced.stderr, traced


# -- the two tests of a corpus file ------------------------------------------------------------------------------
def in_process_test(cases: list[Case]) -> Callable[..., None]:
    """Every case through ``lifecycle.cli.main`` in this process (assign it to ``test_bad_input_in_process``)."""

    @pytest.mark.parametrize("case", cases, ids=[c.id for c in cases])
    def test_bad_input_in_process(case: Case, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
        check_in_process(case, tmp_path, capsys)

    return test_bad_input_in_process


def subprocess_test(cases: list[Case], *, debug: bool = False) -> Callable[..., None]:
    """The cases marked ``proc`` as a real process (assign it to ``test_bad_input_subprocess``)."""
    proc = [c for c in cases if c.proc]

    @pytest.mark.parametrize("case", proc, ids=[c.id for c in proc])
    def test_bad_input_subprocess(case: Case, tmp_path: Path) -> None:
        check_subprocess(case, tmp_path, debug=debug)

    return test_bad_input_subprocess
