"""The bad-input corpus: every case driven end to end through the real ``lifecycle`` CLI.

Each case must end as ONE paragraph on stderr that names the flag or the file and says how to fix
it, exit code 2, and no traceback -- unless ``--debug`` is given, which must show one (still exit 2).
Most cases run in-process through ``lifecycle.cli.main`` (fast, no Ray); the ones marked ``proc``
also run as true subprocesses (``python -m lifecycle.cli``). Engine cases start real CPU engine
processes; one slow case runs a real replay job on Ray whose second replay file is corrupt, so the
error is raised *inside* a running ``lifecycle run``.

This complements tests/lifecycle/decide/test_config.py (LifecycleConfig on its own) with what a user types.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from badinput import (
    R0,
    REPLAY,
    REPO,
    SAMPLE,
    Case,
    _edit_json,
    _mkdir,
    _paragraph_problems,
    _replay,
    _run_dir,
    _small_checkpoint,
    _write,
    check_in_process,
    in_process_test,
    subprocess_test,
)

import lifecycle.cli as cli
import lifecycle.cli.trace as trace_cli
from lifecycle.decide.errors import LifecycleError
from rollout.replay import SCHEMA, save_rollout
from tests.helpers import free_port

pytestmark = pytest.mark.bad_input

CASES: list[Case] = [
    # --- config files ---------------------------------------------------------------------------------
    Case(
        "toml-truncated",
        ("explain", "--config", "{tmp}/c.toml"),
        ("--config", "{tmp}/c.toml"),
        (_write("c.toml", "rollout_num_gpus = [\n"),),
        proc=True,
    ),
    Case(
        "yaml-broken",
        ("explain", "--config", "{tmp}/c.yaml"),
        ("--config", "{tmp}/c.yaml"),
        (_write("c.yaml", "rollout_num_gpus: [1,\n\n  foo: {\n"),),
    ),
    Case(
        "json-truncated",
        ("check", "--config", "{tmp}/c.json"),
        ("--config", "{tmp}/c.json"),
        (_write("c.json", '{"rollout_num_gpus": 2,'),),
    ),
    Case(
        "toml-unknown-key",
        ("explain", "--config", "{tmp}/c.toml"),
        ("{tmp}/c.toml", "--rolout-num-gpu", "--rollout-num-gpus"),
        (_write("c.toml", "rollout_num_gpus = 2\nrolout_num_gpu = 3\n"),),
    ),
    Case(
        "toml-wrong-type",
        ("graph", "--config", "{tmp}/c.toml"),
        ("{tmp}/c.toml", "--rollout-num-gpus"),
        (_write("c.toml", 'rollout_num_gpus = "two"\n'),),
    ),
    Case(
        "yaml-bad-bool",
        ("explain", "--config", "{tmp}/c.yml"),
        ("{tmp}/c.yml", "--use-fault-tolerance"),
        (_write("c.yml", "use_fault_tolerance: maybe\nrollout_num_gpus: 2\n"),),
    ),
    Case(
        "json-bad-component",
        ("check", "--config", "{tmp}/c.json"),
        ("{tmp}/c.json", "--ft-components", "rollout"),
        (_write("c.json", '{"use_fault_tolerance": true, "ft_components": ["rollot"], "rollout_num_gpus": 2}'),),
    ),
    Case(
        "json-not-a-table",
        ("explain", "--config", "{tmp}/c.json"),
        ("--config", "{tmp}/c.json"),
        (_write("c.json", "[1, 2]"),),
    ),
    Case(
        "toml-lifecycle-not-a-table",
        ("explain", "--config", "{tmp}/c.toml"),
        ("{tmp}/c.toml", "--lifecycle"),
        (_write("c.toml", "lifecycle = 3\n"),),
    ),
    Case(
        "yaml-empty-needs-gpus",
        ("run", "--config", "{tmp}/c.yaml"),
        ("--rollout-num-gpus",),
        (_write("c.yaml", ""),),
    ),
    Case(
        "config-unknown-suffix",
        ("explain", "--config", "{tmp}/c.ini"),
        ("--config", "{tmp}/c.ini", ".toml"),
        (_write("c.ini", "x = 1\n"),),
    ),
    Case(
        "config-is-a-directory",
        ("explain", "--config", "{tmp}/c.toml"),
        ("--config", "{tmp}/c.toml", "directory"),
        (_mkdir("c.toml"),),
    ),
    Case("config-missing", ("run", "--config", "{tmp}/nope.toml"), ("--config", "{tmp}/nope.toml"), proc=True),
    Case(
        "config-not-utf8",
        ("explain", "--config", "{tmp}/c.toml"),
        ("--config", "{tmp}/c.toml", "UTF-8"),
        (_write("c.toml", b"\xff\xfe\x00rollout_num_gpus = 2"),),
        proc=True,
    ),
    # --- flags ------------------------------------------------------------------------------------------
    Case("flag-not-a-number", ("explain", "--rollout-num-gpus", "abc"), ("--rollout-num-gpus",)),
    Case(
        "flag-jitter-out-of-range",
        ("explain", "--rollout-health-check-jitter", "1.5"),
        ("--rollout-health-check-jitter",),
    ),
    Case(
        "flag-timeout-over-interval",
        ("explain", "--rollout-health-check-interval", "5", "--rollout-health-check-timeout", "60"),
        ("--rollout-health-check-timeout",),
    ),
    Case("flag-modes-exclude", ("explain", "--debug-train-only", "--debug-rollout-only"), ("--debug-rollout-only",)),
    Case(
        "flag-backoff-over-cap",
        ("explain", "--engine-restart-backoff", "60", "--engine-restart-backoff-max", "10"),
        ("--engine-restart-backoff",),
    ),
    Case("flag-infinite", ("check", "--rollout-health-check-interval", "1e999"), ("--rollout-health-check-interval",)),
    Case("flag-unknown", ("explain", "--rollout-num-gpu", "2"), ("--rollout-num-gpu",), proc=True),
    # --- lifecycle run -------------------------------------------------------------------------------------
    # --- resume (issue 18) ------------------------------------------------------------------------------------------
    Case("resume-missing", ("run", "--resume", "{tmp}/nope"), ("--resume", "{tmp}/nope"), proc=True),
    Case("resume-not-a-run", ("run", "--resume", "{tmp}"), ("--resume", "run.json")),
    Case(
        "resume-never-saved",
        ("run", "--resume", "{tmp}/run"),
        ("--resume", "no --save"),
        (_run_dir(save=False, checkpoint=False),),
    ),
    Case(
        "resume-no-checkpoint-yet",
        ("run", "--resume", "{tmp}/run"),
        ("--resume", "{tmp}/run", "before it wrote its first job checkpoint", "without --resume"),
        (_run_dir(checkpoint=False),),
    ),
    Case(
        "resume-with-other-settings",
        ("run", "--resume", "{tmp}/run", "--use-fault-tolerance", "--seed", "3"),
        ("--resume", "--use-fault-tolerance", "--seed"),
        (_run_dir(),),
    ),
    Case(
        "resume-truncated",
        ("run", "--resume", "{tmp}/run"),
        ("--resume", "{tmp}/run/ckpt/job-000001/state.json", "truncated"),
        (_run_dir("truncated"),),
        proc=True,
    ),
    Case(
        "resume-tampered",
        ("run", "--resume", "{tmp}/run"),
        ("--resume", "{tmp}/run/ckpt/job-000001/state.safetensors", "sha256"),
        (_run_dir("tampered"),),
    ),
    Case(
        "resume-foreign",
        ("run", "--resume", "{tmp}/run"),
        ("--resume", "other settings", "rollout_num_gpus"),
        (_run_dir("foreign"),),
    ),
    Case(  # the checkpoint is sound, but run.json lost the loop's options: nothing starts
        "resume-run-json-incomplete",
        ("run", "--resume", "{tmp}/run"),
        ("--resume", "{tmp}/run/run.json", "lacks the option"),
        (_run_dir("options"),),
    ),
    Case(  # checked on this machine before Ray starts, as for a new run
        "resume-factory-not-importable",
        ("run", "--resume", "{tmp}/run"),
        ("{tmp}/run/run.json", "--rollout-function", "no_such_pkg_xyz"),
        (_run_dir("factory"),),
    ),
    Case("save-interval-without-save", ("run", "--save-interval", "2"), ("--save-interval", "--save DIR")),
    Case("save-with-async", ("run", "--async", "--save", "{tmp}/c"), ("--save", "--async")),
    Case("kill-driver-without-save", ("run", "--inject", "kill-driver:0@1"), ("--inject", "--save DIR")),
    Case(
        "kill-driver-before-the-first-checkpoint",
        ("run", "--save", "{tmp}/ck", "--save-interval", "5", "--steps", "8", "--inject", "kill-driver:0@3"),
        ("--inject", "kill-driver:0@3", "first job checkpoint", "--save-interval"),
    ),
    Case("run-steps-zero", ("run", "--steps", "0", "--run-dir", "{tmp}/run"), ("--steps",)),
    Case("run-steps-not-int", ("run", "--steps", "abc"), ("--steps",), proc=True),
    Case("run-engines-zero", ("run", "--engines", "0", "--run-dir", "{tmp}/run"), ("--engines",)),
    Case("run-engines-negative", ("run", "--engines=-2", "--run-dir", "{tmp}/run"), ("--engines",)),
    Case("run-workers-zero", ("run", "--trainer-workers", "0", "--run-dir", "{tmp}/run"), ("--trainer-workers",)),
    Case("run-launcher-unknown", ("run", "--launcher", "docker"), ("--launcher", "docker")),
    Case("run-lr-nan", ("run", "--lr", "nan", "--run-dir", "{tmp}/run"), ("--lr",)),
    Case(
        "run-keep-checkpoints-zero",
        ("run", "--keep-checkpoints", "0", "--run-dir", "{tmp}/run"),
        ("--keep-checkpoints",),
    ),
    Case(
        "run-hf-checkpoint-missing",
        ("run", "--hf-checkpoint", "{tmp}/nope", "--run-dir", "{tmp}/run"),
        ("--hf-checkpoint", "{tmp}/nope", "no such directory"),
    ),
    Case(
        "run-hf-checkpoint-a-file",
        ("run", "--hf-checkpoint", "{tmp}/w.safetensors", "--run-dir", "{tmp}/run"),
        ("--hf-checkpoint", "is a file", "config.json + model.safetensors"),
        setup=(_write("w.safetensors", b"\x00" * 16),),
    ),
    Case(
        "run-hf-checkpoint-no-config",
        ("run", "--hf-checkpoint", "{tmp}/ckpt", "--run-dir", "{tmp}/run"),
        ("--hf-checkpoint", "has no config.json"),
        setup=(_write("ckpt/model.safetensors", b"\x00" * 16),),
    ),
    Case(
        "run-hf-checkpoint-another-size",
        ("run", "--hf-checkpoint", "{tmp}/small", "--run-dir", "{tmp}/run"),
        ("--hf-checkpoint", "{tmp}/small/model.safetensors", "unexpected tensors", "'tiny'"),
        setup=(lambda tmp: _small_checkpoint(tmp / "small"),),
    ),
    Case(
        "run-hf-checkpoint-hf-garbage",  # a HF model_type: refused from the weights header, before its model is built
        ("run", "--hf-checkpoint", "{tmp}/llama", "--run-dir", "{tmp}/run"),
        ("--hf-checkpoint", "{tmp}/llama/model.safetensors", "cannot be read as safetensors"),
        setup=(_write("llama/config.json", '{"model_type": "llama"}'), _write("llama/model.safetensors", b"\x00" * 16)),
    ),
    Case(
        "run-hf-checkpoint-no-model-type",
        ("run", "--hf-checkpoint", "{tmp}/typeless", "--run-dir", "{tmp}/run"),
        ("--hf-checkpoint", "{tmp}/typeless/config.json", "has no model_type"),
        setup=(_write("typeless/config.json", "{}"), _write("typeless/model.safetensors", b"\x00" * 16)),
    ),
    Case(
        "run-model-and-hf-checkpoint",
        ("run", "--model", "tiny-llama", "--hf-checkpoint", "{tmp}/x", "--run-dir", "{tmp}/run"),
        ("--model", "tiny-llama", "--hf-checkpoint gives the model already"),
    ),
    Case("run-model-unknown", ("run", "--model", "gpt5"), ("--model", "gpt5"), proc=True),
    # --rollout-backend vllm: what a backend cannot do, or cannot start from, is refused before anything starts
    Case(
        "run-vllm-offload-on-cpu",
        ("run", "--rollout-backend", "vllm", "--offload-rollout", "--run-dir", "{tmp}/run"),
        ("--offload-rollout", "--rollout-backend vllm", "sleep mode", "--rollout-device cuda"),
        proc=True,
    ),
    Case(
        "run-vllm-char-model",
        ("run", "--rollout-backend", "vllm", "--model", "char", "--run-dir", "{tmp}/run"),
        ("--model", "char", "--rollout-backend vllm", "tiny-llama"),
    ),
    Case(
        "run-vllm-no-engine-environment",
        ("run", "--rollout-backend", "vllm", "--vllm-python", "{tmp}/no-env/bin/python", "--run-dir", "{tmp}/run"),
        ("--vllm-python", "{tmp}/no-env/bin/python", "make engine-env"),
    ),
    Case(
        "run-vllm-external-without-checkpoint",
        (
            "run",
            "--rollout-backend",
            "vllm",
            "--rollout-external-engine-addrs",
            "127.0.0.1:30000",
            "--rollout-num-gpus",
            "1",
        ),
        ("--hf-checkpoint", "external vLLM servers"),
    ),
    Case(
        "run-data-source-missing-module",
        ("run", "--data-source", "no_such_prompts:make", "--run-dir", "{tmp}/run"),
        ("--data-source", "no_such_prompts"),
    ),
    Case(
        "run-request-timeout-zero",
        ("run", "--engine-request-timeout", "0", "--run-dir", "{tmp}/run"),
        ("--engine-request-timeout",),
    ),
    Case(
        "run-startup-timeout-inf",
        ("run", "--engine-startup-timeout", "inf", "--run-dir", "{tmp}/run"),
        ("--engine-startup-timeout",),
    ),
    Case(
        "run-rollout-fn-missing-module",
        ("run", "--rollout-function", "no_such_mod:make", "--run-dir", "{tmp}/run"),
        ("--rollout-function", "no_such_mod"),
    ),
    Case(
        "run-rollout-fn-missing-attr",
        ("run", "--rollout-function", "json:no_such_factory", "--run-dir", "{tmp}/run"),
        ("--rollout-function", "no_such_factory"),
    ),
    Case(
        "run-inject-unknown-fault",
        ("run", "--inject", "explode:1@2", "--run-dir", "{tmp}/run"),
        ("--inject", "explode:1@2"),
    ),
    Case("run-inject-malformed", ("run", "--inject", "kill-engine@3", "--run-dir", "{tmp}/run"), ("--inject",)),
    Case(
        "run-inject-past-the-run",
        ("run", "--steps", "3", "--inject", "kill-engine:0@5", "--run-dir", "{tmp}/run"),
        ("--inject", "kill-engine:0@5", "--steps 3"),
    ),
    Case(
        "ft-components-without-a-value",
        ("explain", "--use-fault-tolerance", "--ft-components"),
        ("--ft-components",),
        proc=True,
    ),
    Case(
        "run-inject-engine-out-of-range",
        ("run", "--engines", "1", "--inject", "kill-engine:9@0", "--run-dir", "{tmp}/run"),
        ("--inject", "kill-engine:9@0"),
    ),
    Case(
        "run-ray-address-unreachable",
        (),
        ("--ray-address",),
        proc=True,
        argv_fn=lambda: ("run", "--run-dir", "{tmp}/run", "--ray-address", f"127.0.0.1:{free_port()}"),
    ),
    Case(
        "run-ray-address-malformed",
        ("run", "--run-dir", "{tmp}/run", "--ray-address", "nohost:abc"),
        ("--ray-address", "nohost:abc"),
    ),
    Case(
        "run-dir-under-a-file",
        ("run", "--run-dir", "{tmp}/blocker/run"),
        ("--run-dir", "{tmp}/blocker/run"),
        (_write("blocker", ""),),
        proc=True,
    ),
    # --- replay data through lifecycle run ---------------------------------------------------------------------
    Case(
        "replay-dir-missing",
        ("run", "--load-debug-rollout-data", "{tmp}/nodir/{{rollout_id}}.json"),
        ("--load-debug-rollout-data", "{tmp}/nodir"),
    ),
    Case(
        "replay-template-malformed",
        ("run", "--load-debug-rollout-data", "{tmp}/{{bad}}.json"),
        ("--load-debug-rollout-data", "{{rollout_id}}"),
    ),
    Case("replay-file-missing", REPLAY, ("--load-debug-rollout-data", R0, "rollout 0"), (_mkdir("replay"),)),
    Case(
        "replay-truncated",
        REPLAY,
        ("--load-debug-rollout-data", R0, "truncated"),
        (_replay(damage=lambda p: p.write_text(p.read_text()[:40])),),
        proc=True,
    ),
    Case(
        "replay-wrong-version",
        REPLAY,
        ("--load-debug-rollout-data", R0, "rl-lifecycle/rollout@0"),
        (_replay(damage=lambda p: p.write_text(p.read_text().replace(SCHEMA, "rl-lifecycle/rollout@0"))),),
    ),
    Case(
        "replay-edited",
        REPLAY,
        ("--load-debug-rollout-data", R0, "checksum"),
        (_replay(damage=_edit_json(lambda d: d["samples"][0].update(reward=0.0))),),
    ),
    Case(
        "replay-no-schema",
        REPLAY,
        ("--load-debug-rollout-data", R0, "schema"),
        (_replay(damage=_edit_json(lambda d: {"samples": d["samples"]})),),
    ),
    Case(
        "replay-not-json",
        REPLAY,
        ("--load-debug-rollout-data", R0),
        (_replay(damage=lambda p: p.write_bytes(b"\x80PK\x03\x04")),),
    ),
    Case(
        "replay-other-rollout",
        REPLAY,
        ("--load-debug-rollout-data", R0, "holds rollout 4"),
        (_replay(4, damage=lambda p: p.rename(p.with_name("0.json"))),),
    ),
    Case("replay-no-samples", REPLAY, ("--load-debug-rollout-data", R0, "no samples"), (_replay(samples=[]),)),
    Case(
        "replay-sample-without-reward",
        REPLAY,
        ("--load-debug-rollout-data", R0, "'reward'"),
        (_replay(samples=[{k: v for k, v in SAMPLE.items() if k != "reward"}]),),
    ),
    Case(
        "replay-sample-bad-ids",
        REPLAY,
        ("--load-debug-rollout-data", R0, "'prompt_ids'"),
        (_replay(samples=[{**SAMPLE, "prompt_ids": "1 2"}]),),
    ),
    # --- check --------------------------------------------------------------------------------------------------
    Case("check-engines-out-of-range", ("check", "--engines", "9"), ("--engines",)),
    Case("check-engines-not-int", ("check", "--engines", "abc"), ("--engines",)),
    Case("check-faults-negative", ("check", "--faults=-1"), ("--faults",)),
    Case("check-jobs-zero", ("check", "--jobs", "0"), ("--jobs",)),
    Case(
        "check-unknown-invariant", ("check", "--invariant", "no_such_invariant"), ("--invariant", "no_such_invariant")
    ),
    Case("check-unknown-mutant", ("check", "--mutant", "no_such_mutant"), ("--mutant", "no_such_mutant"), proc=True),
    # --- graph ----------------------------------------------------------------------------------------------------
    Case("graph-unknown-format", ("graph", "--format", "gif"), ("--format", "gif"), proc=True),
    Case("graph-unknown-machine", ("graph", "--machine", "router"), ("--machine", "router")),
    Case("graph-unknown-preset", ("graph", "--preset", "ft-all"), ("--preset", "ft-all")),
    Case("graph-preset-and-flags", ("graph", "--preset", "replay", "--use-fault-tolerance"), ("--preset",)),
    Case(
        "graph-output-unwritable",
        ("graph", "--machine", "engine", "-o", "{tmp}/blocker/g.mmd"),
        ("-o", "{tmp}/blocker/g.mmd"),
        (_write("blocker", ""),),
    ),
    Case("graph-check-missing-dir", ("graph", "--check", "{tmp}/no-graphs"), ("--check", "{tmp}/no-graphs")),
    Case(
        "graph-compare-missing",
        ("graph", "--format", "html", "-o", "{tmp}/r.html", "--compare", "{tmp}/ref.json"),
        ("--compare", "{tmp}/ref.json"),
    ),
    Case(
        "graph-compare-wrong-schema",
        ("graph", "--format", "html", "-o", "{tmp}/r.html", "--compare", "{tmp}/ref.json"),
        ("--compare", "{tmp}/ref.json", "rl-lifecycle/graph@1"),
        (_write("ref.json", '{"schema": "other@9"}'),),
    ),
    Case("graph-compare-without-html", ("graph", "--compare", "{tmp}/ref.json"), ("--compare", "--format html")),
    # --- trace ------------------------------------------------------------------------------------------------------
    Case("trace-missing", ("trace", "show", "{tmp}/events.jsonl"), ("{tmp}/events.jsonl",)),
    Case("trace-directory", ("trace", "show", "{tmp}"), ("{tmp}", "directory")),
    Case(
        "trace-garbage-line",
        ("trace", "show", "{tmp}/e.jsonl"),
        ("{tmp}/e.jsonl", ":1:"),
        (_write("e.jsonl", 'garbage\n{"event": "x"}\n'),),
        proc=True,
    ),
    Case(
        "trace-non-object-line",
        ("trace", "show", "{tmp}/e.jsonl"),
        ("{tmp}/e.jsonl:2", "not an event object"),
        (_write("e.jsonl", '{"event": "x"}\n[1, 2]\n{"event": "y"}\n'),),
    ),
    Case(
        "trace-binary",
        ("trace", "show", "{tmp}/e.jsonl"),
        ("{tmp}/e.jsonl", "not an event log"),
        (_write("e.jsonl", b"\x89PNG\r\n\x1a\n\x00"),),
    ),
    Case(  # one line of binary, no newline: not mistaken for a torn last line of a real log
        "trace-binary-one-line",
        ("trace", "show", "{tmp}/e.jsonl"),
        ("{tmp}/e.jsonl", "not an event log"),
        (_write("e.jsonl", b"\x00\xff\xfegarbage"),),
        proc=True,
    ),
    Case(
        "trace-diff-missing-side",
        ("trace", "diff", "{tmp}/a.jsonl", "{tmp}/b.jsonl"),
        ("{tmp}/b.jsonl",),
        (_write("a.jsonl", '{"event": "x"}\n'),),
    ),
]


test_bad_input_in_process = in_process_test(CASES)
test_bad_input_subprocess = subprocess_test(CASES, debug=True)
PROC = [c for c in CASES if c.proc]


def test_corpus_is_large_and_distinct() -> None:
    assert len(CASES) >= 30 and len({c.id for c in CASES}) == len(CASES)
    assert len(PROC) >= 8
    assert {c.argv[0] for c in CASES if c.argv} == {"run", "check", "graph", "explain", "trace"}


# -- permissions: a real unreadable config and a real unwritable run dir (root cannot be refused, so drop to nobody) --
def _as_nobody() -> list[str] | None:
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        return None
    return ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]


@pytest.fixture
def world_tmp(tmp_path: Path) -> Iterator[Path]:
    """A folder (and parents) that user nobody can traverse."""
    tmp_path.chmod(0o755)
    for parent in tmp_path.parents:
        if parent == Path("/"):
            break
        if parent.stat().st_uid == 0:
            parent.chmod(parent.stat().st_mode | 0o005)
    yield tmp_path


@pytest.mark.parametrize("kind", ["unreadable-config", "unwritable-run-dir"])
def test_permission_refusals_as_an_unprivileged_user(kind: str, world_tmp: Path) -> None:
    prefix = _as_nobody()
    if prefix is None:
        pytest.skip("needs root and setpriv to run the CLI as an unprivileged user")
    if kind == "unreadable-config":
        target = world_tmp / "secret.toml"
        target.write_text("rollout_num_gpus = 2\n")
        target.chmod(0o000)
        argv, names = ["explain", "--config", str(target)], ["--config", str(target), "Permission denied"]
    else:
        target = world_tmp / "readonly"
        target.mkdir()
        target.chmod(0o555)
        argv, names = ["run", "--run-dir", str(target / "run")], ["--run-dir", str(target / "run"), "Permission denied"]
    env = {**os.environ, "HOME": str(world_tmp)}
    cmd = [*prefix, sys.executable, "-m", "lifecycle.cli", *argv]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env, cwd=REPO)
    if "Permission denied" in out.stderr and "lifecycle" not in out.stderr:
        pytest.skip(f"user nobody cannot run the venv's python here: {out.stderr[-200:]}")
    if "No module named 'lifecycle'" in out.stderr:  # the checkout sits in a folder only root may enter
        pytest.skip(f"user nobody cannot read this checkout: {out.stderr[-200:]}")
    assert out.returncode == 2, out
    assert not _paragraph_problems(out.stderr, names), (_paragraph_problems(out.stderr, names), out.stderr)


# -- the corpus can fail: re-introduce each fixed behaviour and watch the check catch it ---------------------------
def _case(case_id: str) -> Case:
    return next(c for c in CASES if c.id == case_id)


def test_catches_the_argparse_usage_dump(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(cli._Parser, "error", argparse.ArgumentParser.error)  # usage block + SystemExit, as before
    with pytest.raises((AssertionError, SystemExit)):
        check_in_process(_case("run-steps-not-int"), tmp_path, capsys)


def test_catches_a_multi_line_message(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(cli, "_paragraph", str)  # the YAML parser's message, line breaks and all
    with pytest.raises(AssertionError, match="not one paragraph"):
        check_in_process(_case("yaml-broken"), tmp_path, capsys)


def test_catches_a_non_object_event_line(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from lifecycle.decide import jsonio
    from lifecycle.decide.events import canonical

    # the event log's reader without its checks: any JSON value of a line is taken for an event
    monkeypatch.setattr(trace_cli, "load", lambda path, only=None: [canonical(v) for _, v in jsonio.read_jsonl(path)])
    with pytest.raises(AttributeError):
        check_in_process(_case("trace-non-object-line"), tmp_path, capsys)


def test_catches_a_silent_debug_flag(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(cli.traceback, "print_exception", lambda *a, **k: None)
    with pytest.raises(AssertionError, match="no traceback"):
        check_in_process(_case("flag-not-a-number"), tmp_path, capsys)


def test_catches_a_replay_file_the_trainer_cannot_use(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import rollout.replay

    monkeypatch.setattr(rollout.replay, "_check_trainable", lambda *a: None)
    # without the check the run would go on to start Ray: stop it right there instead
    monkeypatch.setattr(
        "trainer.app.cli._check_run_dir", lambda path: (_ for _ in ()).throw(RuntimeError("got past replay"))
    )
    with pytest.raises(RuntimeError, match="got past replay"):
        check_in_process(_case("replay-no-samples"), tmp_path, capsys)


def test_good_input_still_passes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The checks are not simply 'everything fails': the same commands with good files succeed."""
    (tmp_path / "c.toml").write_text("rollout_num_gpus = 2\n")
    assert cli.main(["explain", "--config", str(tmp_path / "c.toml")]) == 0
    (tmp_path / "e.jsonl").write_text('{"event": "x"}\n')
    assert cli.main(["trace", "show", str(tmp_path / "e.jsonl")]) == 0
    assert "Traceback" not in capsys.readouterr().err


# -- engines: a taken port and a weights file of the wrong shape -------------------------------------------------------
@pytest.fixture
def taken_port() -> Iterator[int]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        yield int(s.getsockname()[1])


def test_engine_port_already_taken(taken_port: int) -> None:
    from engines.errors import EngineStartError
    from engines.process import ServerProcess, torch_engine_command

    out = subprocess.run(
        [sys.executable, "-m", "engines.cpu", "--port", str(taken_port)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
    )
    assert out.returncode == 2 and "Traceback" not in out.stderr, out
    assert out.stderr.strip().count("\n") == 0 and f"--port {taken_port}" in out.stderr and "--port 0" in out.stderr
    proc = ServerProcess(torch_engine_command(port=taken_port), engine_id="taken")  # the launcher's path
    with pytest.raises(EngineStartError) as info:
        proc.start(timeout=60)
    assert (
        info.value.returncode == 2 and "already in use" in str(info.value) and f"--port {taken_port}" in str(info.value)
    )
    assert isinstance(info.value, LifecycleError)


def _wide_weights(path: Path) -> Path:
    from engines.models import ModelConfig, TinyCausalLM

    wide = ModelConfig("wide", d_model=64, n_layers=2, n_heads=2, max_seq_len=256)
    return TinyCausalLM(wide, seed=1).save_pretrained(path)


def test_engine_weights_of_the_wrong_shape_at_start(tmp_path: Path) -> None:
    """``lifecycle-torch-engine --weights FILE`` of the wrong shape: exit 2, one line naming file and tensor."""
    from engines.process import torch_engine_command

    bad = _wide_weights(tmp_path / "wide")
    out = subprocess.run(
        torch_engine_command(port=0, weights=bad), capture_output=True, text=True, timeout=120, cwd=REPO
    )
    assert out.returncode == 2 and "Traceback" not in out.stderr, out
    line = out.stderr.strip()
    assert "\n" not in line and "--weights" in line and str(bad) in line and "'tok_emb.weight'" in line, line


@pytest.mark.slow
def test_engine_weights_of_the_wrong_shape_at_runtime(tmp_path: Path) -> None:
    """``/update_weights_from_disk`` with the wrong shape on a serving engine: HTTP 400 naming file and
    tensor, and the old weights keep serving (same version)."""
    import asyncio

    from engines.client import EngineClient
    from engines.errors import EngineHTTPError
    from engines.process import ServerProcess, torch_engine_command

    bad = _wide_weights(tmp_path / "wide")
    with ServerProcess(torch_engine_command(port=0), engine_id="shape") as engine:

        async def attempt() -> tuple[EngineHTTPError, str, str]:
            async with EngineClient(engine.url, engine_id="shape", timeout=30.0) as client:
                before = (await client.model_info()).weight_version
                try:
                    await client.update_weights_from_disk(str(bad), weight_version="never")
                except EngineHTTPError as exc:
                    return exc, before, (await client.model_info()).weight_version
                raise AssertionError("a wrong-shape weights file was accepted")

        exc, before, after = asyncio.run(attempt())
    assert exc.status == 400 and str(bad) in exc.body and "does not match the model's" in exc.body
    assert after == before


# -- inside a running job: the second replay file is corrupt ----------------------------------------------------
@pytest.mark.slow
def test_replay_file_corrupt_mid_run_is_exit_2_and_one_paragraph(tmp_path: Path) -> None:
    """Rollout 0 is fine (read before Ray starts, trained on); rollout 1 is truncated: the error is raised
    inside the running loop, after Ray, the trainer and step 0 -- and still ends as exit 2 + one paragraph."""
    template = str(tmp_path / "replay" / "{rollout_id}.json")
    samples = [{**SAMPLE, "group": g, "reward": float(g % 2)} for g in range(4) for _ in range(2)]
    save_rollout(template, 0, samples)
    broken = save_rollout(template, 1, samples)
    broken.write_text(broken.read_text()[:60])
    run_dir = tmp_path / "run"
    argv = ["run", "--steps", "3", "--quiet", "--run-dir", str(run_dir), "--load-debug-rollout-data", template]
    proc = subprocess.Popen(
        [sys.executable, "-m", "lifecycle.cli", *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
        start_new_session=True,
    )
    try:
        _, err = proc.communicate(timeout=400)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
    assert proc.returncode == 2, err[-3000:]
    ours = [ln for ln in err.splitlines() if ln.startswith("lifecycle")]  # Ray prints its own INFO lines
    assert len(ours) == 1 and "Traceback" not in err, err[-3000:]
    assert not _paragraph_problems(ours[0], ["--load-debug-rollout-data", str(broken), "rollout 1", "truncated"])
    events = [json.loads(ln) for ln in (run_dir / "events.jsonl").read_text().splitlines()]
    assert any(e.get("machine") == "trainer" and e.get("step") == 0 for e in events), "step 0 trained first"
