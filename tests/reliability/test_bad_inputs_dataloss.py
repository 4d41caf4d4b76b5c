"""Bad input never costs data (issue 27, causes 5 and 6): a run, a checkpoint or an output never replaces what it
did not create, and ``--resume`` trusts nothing of ``run.json`` before all of it is checked.

* a new run into a directory that holds a run (a killed or a finished one), a ``--save`` directory holding another
  job's checkpoints, an ``--hf-checkpoint`` inside the ``--run-dir``, ``trace timeline E -o E``: refused naming the
  flag, the path and the fix, before anything is touched -- the harness checks the other run's files byte for byte;
* a job checkpoint belongs to every setting that changes the trained state (seed, lr, model, workers, ...) and to
  its job (run.json's ``job_id``): another job's state is never continued;
* ``run.json`` is read whole (strict JSON: no ``Infinity``; every option typed and bounded) before ``--resume``
  enters its ``cwd``, imports its rollout function or writes anything.

Each cause has a ``test_catches_*`` that re-introduces the old behaviour and shows the check fail.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from badinput import (
    Case,
    _write,
    check_in_process,
    in_process_test,
    subprocess_test,
    tree_snapshot,
)

import lifecycle.cli as cli
from lifecycle.decide.config import LifecycleConfig
from lifecycle.decide.errors import ConfigError

pytestmark = pytest.mark.bad_input

EVENTS = '{"event": "lifecycle.started", "ts": "2026-01-01T00:00:00.000000Z"}\n'  # as the writer stamps it
Setup = Callable[[Path], None]


# -- runs as the loop writes them: run.json with a job id, checkpoints recording the job's settings and id -------
def _config(tmp: Path, name: str) -> LifecycleConfig:
    from lifecycle.cli.args import _embedded

    return LifecycleConfig.from_mapping({**_embedded("cpu"), "save": str(tmp / name / "ckpt")})


def _write_job(
    tmp: Path, name: str = "run", *, job_id: str = "job-a", seed: int = 0, steps: int = 3, rollout_fn: str | None = None
) -> None:
    """``tmp/name``: a run of ``steps`` steps started with --save ``tmp/name/ckpt``, checkpointed after step 1."""
    import torch

    from trainer.app.loop import RunOptions
    from trainer.app.run_manifest import write_run_manifest
    from trainer.job_state import JobCheckpoint, save_job_checkpoint

    config = _config(tmp, name)
    (tmp / name).mkdir(parents=True, exist_ok=True)
    opts = RunOptions(steps=steps, seed=seed, run_dir=tmp / name, rollout_fn=rollout_fn)
    write_run_manifest(tmp / name, config, opts.manifest(), job_id=job_id)
    facts, rng = {"restarts": [[] for _ in range(config.num_rollout_engines)]}, {"ranks": [{}]}
    job = JobCheckpoint(1, "1", {"w": torch.zeros(4)}, facts, rng)
    save_job_checkpoint(tmp / name / "ckpt", job, config, {**opts.job_settings(), "id": job_id})
    (tmp / name / "events.jsonl").write_text(EVENTS)
    (tmp / name / "metrics.jsonl").write_text('{"step": 0, "reward": 0.5}\n')


def _job(name: str = "run", **kwargs: Any) -> Setup:
    return lambda tmp: _write_job(tmp, name, **kwargs)


def _edit_run_json(change: Callable[[dict[str, Any]], None], name: str = "run") -> Setup:
    def setup(tmp: Path) -> None:
        path = tmp / name / "run.json"
        body = json.loads(path.read_text())
        change(body)
        path.write_text(json.dumps(body))

    return setup


def _set_option(key: str, value: Any) -> Setup:
    return _edit_run_json(lambda body: body["options"].__setitem__(key, value))


def _raw_run_json(old: str, new: str) -> Setup:
    """run.json with ``old`` replaced by ``new`` in its text (what json.dumps cannot write: Infinity)."""

    def setup(tmp: Path) -> None:
        path = tmp / "run" / "run.json"
        text = path.read_text()
        assert old in text, old
        path.write_text(text.replace(old, new))

    return setup


def _tiny_checkpoint(path: Path) -> None:
    from engines.models import TinyCausalLM

    TinyCausalLM("tiny", seed=0).save_pretrained(path)


def _save_elsewhere(body: dict[str, Any]) -> None:
    body["config"]["save"] += "/../../other/ckpt"


def _graph_json(name: str) -> Setup:
    def setup(tmp: Path) -> None:
        assert cli.main(["graph", "--format", "json", "-o", str(tmp / name)]) == 0

    return setup


CASES: list[Case] = [
    # --- 5a: a new run into another run's directory --------------------------------------------------------------
    Case(
        "run-into-a-killed-runs-dir",
        ("run", "--run-dir", "{tmp}/run"),
        ("--run-dir", "{tmp}/run", "already holds a run", "--resume {tmp}/run"),
        (_job(),),
        proc=True,
    ),
    Case(  # killed before its run.json was written (or run.json removed): its log and metrics are still a run's
        "run-into-a-dir-holding-only-a-log",
        ("run", "--run-dir", "{tmp}/run"),
        ("--run-dir", "{tmp}/run", "events.jsonl", "metrics.jsonl"),
        (_write("run/events.jsonl", EVENTS), _write("run/metrics.jsonl", '{"step": 0}\n')),
    ),
    Case(  # --load into a directory holding another run: not that run's continuation
        "run-load-into-another-runs-dir",
        ("run", "--run-dir", "{tmp}/other", "--load", "{tmp}/run/ckpt"),
        ("--run-dir", "{tmp}/other", "already holds a run"),
        (_job(), _job("other", job_id="job-b")),
    ),
    # --- 5b: a new run given another job's --save directory ------------------------------------------------------
    Case(
        "run-save-into-another-jobs-checkpoints",
        ("run", "--run-dir", "{tmp}/new", "--save", "{tmp}/run/ckpt"),
        ("--save", "{tmp}/run/ckpt", "already holds job checkpoints", "--resume"),
        (_job(),),
        proc=True,
    ),
    Case(  # continuing job A from --load A while saving into job B's checkpoints
        "run-load-one-save-into-another",
        ("run", "--run-dir", "{tmp}/new", "--load", "{tmp}/run/ckpt", "--save", "{tmp}/other/ckpt"),
        ("--save", "{tmp}/other/ckpt"),
        (_job(), _job("other", job_id="job-b")),
    ),
    Case(  # a leftover job-* directory (latest lost) is still another job's checkpoint
        "run-save-into-a-dir-with-a-job-checkpoint-but-no-latest",
        ("run", "--run-dir", "{tmp}/new", "--save", "{tmp}/ck"),
        ("--save", "{tmp}/ck"),
        (_write("ck/job-000004/state.json", "{}"),),
    ),
    # --- 5c: an --hf-checkpoint inside the --run-dir ---------------------------------------------------------------
    Case(
        "hf-checkpoint-inside-its-run-dir",
        ("run", "--hf-checkpoint", "{tmp}/run/weights/step-2", "--run-dir", "{tmp}/run"),
        ("--hf-checkpoint", "--run-dir", "{tmp}/run/weights/step-2", "overwrite its own input"),
        (lambda tmp: _tiny_checkpoint(tmp / "run" / "weights" / "step-2"),),
        proc=True,
    ),
    Case(  # the checkpoint directory is the run directory: the run's files go into the model's folder
        "hf-checkpoint-is-the-run-dir",
        ("run", "--hf-checkpoint", "{tmp}/out", "--run-dir", "{tmp}/out"),
        ("--hf-checkpoint", "--run-dir", "{tmp}/out"),
        (lambda tmp: _tiny_checkpoint(tmp / "out"),),
    ),
    # --- 5d: an output path over its input, or over a file no command of ours wrote -----------------------------
    Case(
        "timeline-output-is-its-input",
        ("trace", "timeline", "{tmp}/e.jsonl", "-o", "{tmp}/e.jsonl"),
        ("-o", "{tmp}/e.jsonl", "is the input"),
        (_write("e.jsonl", EVENTS),),
        proc=True,
    ),
    Case(  # the same file by another spelling
        "timeline-output-is-its-input-by-another-path",
        ("trace", "timeline", "{tmp}/e.jsonl", "-o", "{tmp}/sub/../e.jsonl"),
        ("-o", "is the input"),
        (_write("e.jsonl", EVENTS), _write("sub/x", "")),
    ),
    Case(
        "timeline-output-over-a-runs-manifest",
        ("trace", "timeline", "{tmp}/run/events.jsonl", "-o", "{tmp}/run/run.json"),
        ("-o", "{tmp}/run/run.json", "not a page or graph lifecycle wrote"),
        (_job(),),
    ),
    Case(
        "timeline-output-over-someones-notes",
        ("trace", "timeline", "{tmp}/e.jsonl", "-o", "{tmp}/notes.html"),
        ("-o", "{tmp}/notes.html"),
        (_write("e.jsonl", EVENTS), _write("notes.html", "<!DOCTYPE html><title>my notes</title>")),
    ),
    Case(  # no -o: timeline.html next to the log, which is someone else's file here
        "timeline-default-output-over-a-foreign-file",
        ("trace", "timeline", "{tmp}/e.jsonl"),
        ("-o", "{tmp}/timeline.html"),
        (_write("e.jsonl", EVENTS), _write("timeline.html", "hand-written\n")),
    ),
    Case(
        "graph-output-is-its-compare-input",
        ("graph", "--format", "html", "--compare", "{tmp}/ref.json", "-o", "{tmp}/ref.json"),
        ("-o", "{tmp}/ref.json", "is the input"),
        (_graph_json("ref.json"),),
    ),
    Case(
        "graph-output-over-an-event-log",
        ("graph", "--format", "json", "-o", "{tmp}/run/events.jsonl"),
        ("-o", "{tmp}/run/events.jsonl"),
        (_job(),),
    ),
    # --- 6: run.json is checked whole before --resume uses any of it ---------------------------------------------
    Case(
        "resume-manifest-infinity",
        ("run", "--resume", "{tmp}/run"),
        ("--resume", "{tmp}/run/run.json", "Infinity"),
        (_job(), _raw_run_json('"lr": 0.01', '"lr": Infinity')),
        proc=True,
    ),
    Case(
        "resume-manifest-option-of-the-wrong-type",
        ("run", "--resume", "{tmp}/run"),
        ("--resume", "{tmp}/run/run.json", "option seed"),
        (_job(), _set_option("seed", "zero")),
    ),
    Case(
        "resume-manifest-option-out-of-range",
        ("run", "--resume", "{tmp}/run"),
        ("--resume", "{tmp}/run/run.json", "option workers"),
        (_job(), _set_option("workers", 10**12)),
    ),
    Case(
        "resume-manifest-unknown-option",
        ("run", "--resume", "{tmp}/run"),
        ("--resume", "{tmp}/run/run.json", "unknown options", "sneaky"),
        (_job(), _set_option("sneaky", 1)),
    ),
    Case(
        "resume-manifest-relative-cwd",
        ("run", "--resume", "{tmp}/run"),
        ("--resume", "{tmp}/run/run.json", "not an absolute directory"),
        (_job(), _edit_run_json(lambda body: body.__setitem__("cwd", "."))),
    ),
    Case(
        "resume-manifest-bad-config",
        ("run", "--resume", "{tmp}/run"),
        ("{tmp}/run/run.json", "--rollout-num-gpus"),
        (_job(), _edit_run_json(lambda body: body["config"].__setitem__("rollout_num_gpus", -3))),
    ),
    Case(
        "resume-latest-not-utf8",
        ("run", "--resume", "{tmp}/run"),
        ("--resume", "{tmp}/run/ckpt/latest", "UTF-8"),
        (_job(), _write("run/ckpt/latest", b"\xff\xfejob-000001\n")),
        proc=True,
    ),
    Case(  # run.json's save names another job's checkpoints (of the very same settings): not this job's state
        "resume-save-of-another-job",
        ("run", "--resume", "{tmp}/run"),
        ("--resume", "another job", "job-b"),
        (
            _job(),
            _job("other", job_id="job-b"),
            _edit_run_json(_save_elsewhere),
        ),
    ),
    Case(  # the checkpoint of another seed: the fingerprint covers the loop's settings, not only the config
        "resume-checkpoint-of-another-seed",
        ("run", "--resume", "{tmp}/run"),
        ("--resume", "other settings", "seed"),
        (_job(seed=5), _set_option("seed", 0)),
    ),
]


test_bad_input_in_process = in_process_test(CASES)
test_bad_input_subprocess = subprocess_test(CASES)


def _case(case_id: str) -> Case:
    return next(c for c in CASES if c.id == case_id)


# -- the other run's files, byte for byte ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    "argv",
    [
        ["run", "--run-dir", "{run}"],
        ["run", "--run-dir", "{tmp}/new", "--save", "{run}/ckpt"],
        ["run", "--run-dir", "{tmp}/new", "--save", "{run}/ckpt", "--seed", "3", "--lr", "0.5"],
        ["trace", "timeline", "{run}/events.jsonl", "-o", "{run}/events.jsonl"],
        ["trace", "timeline", "{run}/events.jsonl", "-o", "{run}/metrics.jsonl"],
    ],
    ids=["run-dir", "save", "save-other-settings", "timeline-over-events", "timeline-over-metrics"],
)
def test_the_other_runs_files_are_unchanged_byte_for_byte(argv: list[str], tmp_path: Path) -> None:
    _write_job(tmp_path)
    run = tmp_path / "run"
    before = tree_snapshot(run)
    assert cli.main([a.format(tmp=tmp_path, run=run) for a in argv]) == 2
    assert tree_snapshot(run) == before
    assert not (tmp_path / "new").exists()


def test_a_run_may_continue_its_own_directory_and_checkpoints(tmp_path: Path) -> None:
    """The refusals are not 'every existing directory': the run's own continuation (--resume, or --load of its own
    checkpoints into its own directory) passes, and so does a fresh directory and a new, empty --save."""
    from trainer.app.run_manifest import check_new_run

    _write_job(tmp_path)
    run, ckpt = tmp_path / "run", str(tmp_path / "run" / "ckpt")
    check_new_run(run, save=ckpt, load=ckpt, hf_checkpoint=None)
    check_new_run(tmp_path / "new", save=str(tmp_path / "new" / "ckpt"), load=None, hf_checkpoint=None)
    check_new_run(tmp_path / "new", save=str(tmp_path / "fork"), load=ckpt, hf_checkpoint=run / "weights")
    # a model kept beside the run's own files (scripts/gpu_check.py builds one into RUN_DIR/model) is never written
    check_new_run(tmp_path / "new", save=None, load=None, hf_checkpoint=tmp_path / "new" / "model")
    (tmp_path / "empty").mkdir()
    check_new_run(tmp_path / "empty", save=str(tmp_path / "empty"), load=None, hf_checkpoint=None)


def test_a_default_run_dir_is_a_fresh_one_each_time(tmp_path: Path) -> None:
    """`make run` twice in one second: the second run gets its own runs/<timestamp>-2, never the first's."""
    from trainer.app.options import default_run_dir

    first = default_run_dir(tmp_path)
    first.mkdir()
    second = default_run_dir(tmp_path)
    second.mkdir()
    third = default_run_dir(tmp_path)
    assert len({first, second, third}) == 3 and not third.exists()
    assert second.name.startswith(first.name) and first.parent == second.parent == tmp_path


def test_an_output_may_replace_what_lifecycle_wrote(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Drawing a timeline (or a graph) again over the page it drew before is the normal case."""
    (tmp_path / "e.jsonl").write_text(EVENTS)
    for _ in range(2):
        assert cli.main(["trace", "timeline", str(tmp_path / "e.jsonl")]) == 0
        assert cli.main(["trace", "timeline", str(tmp_path / "e.jsonl"), "-o", str(tmp_path / "t.html")]) == 0
    (tmp_path / "empty.html").write_text("")
    assert cli.main(["trace", "timeline", str(tmp_path / "e.jsonl"), "-o", str(tmp_path / "empty.html")]) == 0
    for fmt in ("json", "html", "dot", "mermaid"):
        for _ in range(2):
            assert cli.main(["graph", "--format", fmt, "-o", str(tmp_path / f"g.{fmt}")]) == 0
    assert "Traceback" not in capsys.readouterr().err


# -- 5b: a job checkpoint belongs to every setting that changes the trained state -----------------------------------
JOB_CHANGES: dict[str, Any] = {
    "seed": 7,
    "lr": 0.5,
    "workers": 2,
    "model": "tiny-llama",
    "model_size": "small",
    "hf_checkpoint": "/elsewhere/model",
    "rollout_fn": "mypkg.rollout:make",
    "data_source": "mypkg.data:make",
    "async_mode": True,
    "use_tis": True,
    "tis_clip": 3.0,
    "tis_clip_low": 0.5,
}


def _refused_for_each_setting(tmp_path: Path) -> None:
    import dataclasses

    import torch

    from trainer.app.loop import RunOptions
    from trainer.job_state import JobCheckpoint, load_job_checkpoint, save_job_checkpoint

    config = _config(tmp_path, "run")
    opts = RunOptions(run_dir=tmp_path / "run")
    job = JobCheckpoint(1, "1", {"w": torch.zeros(2)}, {"restarts": [[]] * config.num_rollout_engines}, {"ranks": [{}]})
    save_job_checkpoint(tmp_path / "ckpt", job, config, opts.job_settings())
    assert load_job_checkpoint(tmp_path / "ckpt", config, opts.job_settings()).step == 1  # the same job
    for field_name, value in JOB_CHANGES.items():
        value = Path(value) if field_name == "hf_checkpoint" else value
        other = dataclasses.replace(opts, **{field_name: value})
        with pytest.raises(ConfigError, match=rf"other settings \(differing: {field_name}\)"):
            load_job_checkpoint(tmp_path / "ckpt", config, other.job_settings())


def test_a_checkpoint_of_other_loop_settings_is_refused(tmp_path: Path) -> None:
    _refused_for_each_setting(tmp_path)


def test_every_option_that_changes_the_trained_state_is_in_the_fingerprint() -> None:
    from trainer.app.loop import RunOptions
    from trainer.app.options import JOB_OPTIONS, MANIFEST
    from trainer.app.run_manifest import check_options

    assert set(JOB_CHANGES) == set(JOB_OPTIONS)
    manifest = RunOptions().manifest()
    assert set(manifest) == set(MANIFEST)  # the schema --resume checks is the options the loop writes
    check_options(manifest, "run.json")


# -- 6: nothing of run.json is imported, entered or written before all of it is checked -------------------------------
SIDE_EFFECT = "import pathlib, os\npathlib.Path(os.environ['DATALOSS_MARKER']).write_text('imported')\nmake = print\n"


@pytest.fixture
def planted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A run whose run.json names a rollout function in a module that writes a file when imported."""
    (tmp_path / "mods").mkdir()
    (tmp_path / "mods" / "dataloss_planted.py").write_text(SIDE_EFFECT)
    monkeypatch.syspath_prepend(str(tmp_path / "mods"))
    monkeypatch.delitem(sys.modules, "dataloss_planted", raising=False)  # imported afresh: its side effect again
    monkeypatch.setenv("DATALOSS_MARKER", str(tmp_path / "imported"))
    monkeypatch.chdir(tmp_path)  # --resume enters the run's cwd once every check passed: undone after the test
    _plant(tmp_path)
    return tmp_path


def _plant(tmp: Path) -> None:
    _write_job(tmp, steps=5, rollout_fn="dataloss_planted:make")


BAD_FIELDS: dict[str, Setup] = {
    "lr-infinity": _raw_run_json('"lr": 0.01', '"lr": Infinity'),
    "unknown-option": _set_option("extra", True),
    "cwd-gone": _edit_run_json(lambda body: body.__setitem__("cwd", "/nonexistent/dataloss")),
    "checkpoint-of-another-job": _edit_run_json(lambda body: body.__setitem__("job_id", "job-z")),
    "checkpoint-tampered": lambda tmp: (tmp / "run" / "ckpt" / "job-000001" / "state.safetensors").write_bytes(b"x"),
}


def _resume_refused_without_importing(tmp: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for name, damage in BAD_FIELDS.items():
        base = tmp / name
        _plant(base)
        damage(base)
        assert cli.main(["run", "--resume", str(base / "run")]) == 2, name
        assert "--resume" in capsys.readouterr().err
        assert not (tmp / "imported").exists(), f"{name}: the rollout function's module was imported first"


def test_resume_imports_nothing_before_the_manifest_and_checkpoint_are_checked(
    planted: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _resume_refused_without_importing(planted, capsys)
    started: list[object] = []
    monkeypatch.setattr("trainer.app.loop.run", lambda config, opts: started.append(opts))  # no Ray here
    assert cli.main(["run", "--resume", str(planted / "run"), "--quiet"]) == 0  # all good: now it is imported
    assert (planted / "imported").exists() and len(started) == 1


# -- each cause re-introduced: the checks above fail ------------------------------------------------------------------
def _stop_before_writing(monkeypatch: pytest.MonkeyPatch) -> None:
    """Past the refusals a new run creates its directory and starts Ray: stop it right there instead."""
    monkeypatch.setattr("trainer.app.cli._check_run_dir", lambda path: (_ for _ in ()).throw(RuntimeError("got past")))


def test_catches_a_run_into_another_runs_directory(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr("trainer.app.run_manifest.holds_run", lambda run_dir: [])
    _stop_before_writing(monkeypatch)
    with pytest.raises(RuntimeError, match="got past"):
        check_in_process(_case("run-into-a-killed-runs-dir"), tmp_path, capsys)


def test_catches_a_save_dir_holding_another_jobs_checkpoints(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr("trainer.app.run_manifest.holds_checkpoints", lambda save_dir: False)
    _stop_before_writing(monkeypatch)
    with pytest.raises(RuntimeError, match="got past"):
        check_in_process(_case("run-save-into-another-jobs-checkpoints"), tmp_path, capsys)


def test_catches_a_fingerprint_without_the_loops_settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from trainer import job_state

    def old(config: LifecycleConfig, job: object = None) -> str:  # the config's settings only
        import hashlib

        body = json.dumps(job_state.job_settings(config), sort_keys=True, default=str)
        return hashlib.sha256(body.encode()).hexdigest()

    monkeypatch.setattr(job_state, "fingerprint", old)
    with pytest.raises(pytest.fail.Exception, match="DID NOT RAISE"):
        _refused_for_each_setting(tmp_path)


def test_catches_an_hf_checkpoint_inside_the_run_dir(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr("trainer.app.run_manifest._inside", lambda path, folder: False)
    _stop_before_writing(monkeypatch)
    with pytest.raises(AssertionError, match="does not name '--hf-checkpoint'"):  # only the run-dir check is left
        check_in_process(_case("hf-checkpoint-inside-its-run-dir"), tmp_path, capsys)
    monkeypatch.setattr("trainer.app.run_manifest._same", lambda a, b: False)
    with pytest.raises(RuntimeError, match="got past"):  # the model's own folder as the run directory
        check_in_process(_case("hf-checkpoint-is-the-run-dir"), tmp_path / "same", capsys)


def test_catches_an_output_over_its_input(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr("lifecycle.cli.trace.check_output", lambda path, **kw: path)
    with pytest.raises(AssertionError, match="exit 0"):  # the event log replaced with HTML, exit 0
        check_in_process(_case("timeline-output-is-its-input"), tmp_path, capsys)
    assert (tmp_path / "e.jsonl").read_text().startswith("<!DOCTYPE html>")


def test_catches_infinity_read_from_run_json(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr("trainer.app.run_manifest.read_json", lambda path, **kw: json.loads(Path(path).read_text()))
    with pytest.raises(AssertionError, match="does not name 'Infinity'"):  # refused later, by the lr check alone
        check_in_process(_case("resume-manifest-infinity"), tmp_path, capsys)


def test_catches_a_latest_pointer_read_as_plain_text(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr("trainer.job_state.read_text", lambda path, **kw: Path(path).read_text())
    with pytest.raises((AssertionError, UnicodeDecodeError)):
        check_in_process(_case("resume-latest-not-utf8"), tmp_path, capsys)


def test_catches_a_manifest_trusted_before_it_is_checked(
    planted: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import trainer.app.cli
    import trainer.app.run_manifest as run_manifest

    checked = run_manifest.read_run_manifest

    def old(run_dir: str | os.PathLike[str]) -> Any:  # the rollout function imported before any other check
        body = json.loads((Path(run_dir) / "run.json").read_text(errors="replace").replace("Infinity", "1"))
        trainer.app.cli._check_environment("char", body["options"]["rollout_fn"], None)
        return checked(run_dir)

    monkeypatch.setattr(run_manifest, "read_run_manifest", old)
    with pytest.raises(AssertionError, match="module was imported first"):
        _resume_refused_without_importing(planted, capsys)


def test_catches_a_checkpoint_of_another_job_resumed(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Without the job id, the other job's checkpoints (the same settings) would be continued: past every check."""
    from trainer.app.run_manifest import RunManifest

    real = __import__("trainer.app.run_manifest", fromlist=["read_run_manifest"]).read_run_manifest

    def without_id(run_dir: str | os.PathLike[str]) -> RunManifest:
        got = real(run_dir)
        return RunManifest(got.config, got.options, got.cwd, got.path, None)

    monkeypatch.setattr("trainer.app.run_manifest.read_run_manifest", without_id)
    monkeypatch.setattr("trainer.app.cli._check_run_dir", lambda path: (_ for _ in ()).throw(RuntimeError("got past")))
    with pytest.raises(RuntimeError, match="got past"):
        check_in_process(_case("resume-save-of-another-job"), tmp_path, capsys)
