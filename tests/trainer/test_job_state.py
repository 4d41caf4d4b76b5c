"""Job checkpoints (issue 18, part 1): the whole trainer state round-trips exactly, a half-written checkpoint
is never the latest, and a missing, truncated, tampered, foreign or pickled one is one ConfigError naming
--load and the fix -- never unpickled."""

from __future__ import annotations

import json
import os
import pickle
import random
from pathlib import Path

import pytest
import torch

from lifecycle.decide.config import LifecycleConfig
from lifecycle.decide.errors import ConfigError
from trainer import job_state
from trainer.app import run_manifest
from trainer.backend import build_backend
from trainer.grpo import grpo_backend
from trainer.job_state import JobCheckpoint, latest_checkpoint, load_job_checkpoint, save_job_checkpoint

CONFIG = LifecycleConfig.from_mapping({"rollout_num_gpus": 2, "use_fault_tolerance": True})


def _samples(step: int) -> list[dict[str, object]]:
    return [
        {"group": 0, "reward": r, "prompt_ids": [1, 5, 6], "output_ids": [7 + step, 8], "logprobs": []}
        for r in (0.0, 1.0)
    ]


def _trained(steps: int) -> object:
    backend = build_backend(grpo_backend(seed=3), 0)
    for k in range(steps):
        grads, _ = backend.compute_grads(_samples(k))
        backend.apply_grads(grads)
    return backend


def _save(root: Path, step: int, backend: object, **lifecycle: object) -> Path:
    checkpoint = JobCheckpoint(
        step,
        str(step),
        backend.get_state(),
        {"restarts": [[], []], **lifecycle},  # CONFIG's two engines
        {"ranks": [{"torch": torch.get_rng_state(), "python": random.getstate()}]},
    )
    return save_job_checkpoint(root, checkpoint, CONFIG)


def test_the_trainer_state_round_trips_exactly_and_training_continues_bit_for_bit(tmp_path: Path) -> None:
    original = _trained(2)
    _save(tmp_path, 2, original, engines=2, restarts=[[], [12.5]])
    loaded = load_job_checkpoint(tmp_path, CONFIG)
    assert (loaded.step, loaded.weight_version, loaded.ranks) == (2, "2", 1)
    assert loaded.lifecycle == {"engines": 2, "restarts": [[], [12.5]]}
    rng = loaded.rng["ranks"][0]
    assert isinstance(rng["python"], tuple) and rng["torch"].equal(torch.get_rng_state())
    resumed = build_backend(grpo_backend(seed=99), 0)  # another seed: everything must come from the checkpoint
    resumed.set_state(loaded.trainer)  # the optimizer's int-keyed state survives JSON
    for step in (2, 3):
        a, _ = original.compute_grads(_samples(step))
        b, _ = resumed.compute_grads(_samples(step))
        assert all(a[k].equal(b[k]) for k in a)
        original.apply_grads(a)
        resumed.apply_grads(b)
    after_a, after_b = original.get_state()["model"], resumed.get_state()["model"]
    assert all(after_a[k].equal(after_b[k]) for k in after_a)


def test_latest_names_only_a_complete_checkpoint(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    backend = _trained(1)
    first = _save(tmp_path, 1, backend)
    assert latest_checkpoint(tmp_path) == first

    def disk_full(path: Path) -> str:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(job_state, "_sha256", disk_full)  # the write fails half-way through the directory
    with pytest.raises(OSError, match="No space left"):
        _save(tmp_path, 2, backend)
    monkeypatch.undo()
    assert latest_checkpoint(tmp_path) == first  # still the complete one
    assert sorted(p.name for p in tmp_path.iterdir()) == ["job-000001", "latest"]  # no half-written leftovers
    assert load_job_checkpoint(tmp_path, CONFIG).step == 1
    (tmp_path / ".job-000002.tmp-999999").mkdir()  # what a driver SIGKILLed mid-write leaves
    _save(tmp_path, 3, backend)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["job-000001", "job-000003", "latest"]  # every one kept


@pytest.mark.bad_input
def test_every_bad_checkpoint_is_one_error_naming_load_and_the_fix(tmp_path: Path) -> None:
    def refused(root: Path, config: LifecycleConfig = CONFIG) -> str:
        with pytest.raises(ConfigError) as info:
            load_job_checkpoint(root, config)
        assert info.value.flag == "--load" and "Fix:" in str(info.value)
        return str(info.value)

    assert "no such directory" in refused(tmp_path / "nowhere")
    assert "holds no job checkpoint (no latest file)" in refused(tmp_path)
    where = _save(tmp_path, 1, _trained(1))
    good = (where / "state.json").read_text()

    (where / "state.json").write_text(good[: len(good) // 2])  # truncated
    assert "cannot be read" in refused(tmp_path) and "truncated or not a job checkpoint" in refused(tmp_path)
    (where / "state.json").write_text(json.dumps({"format": "something-else@9"}))
    assert "is not a rl-lifecycle/job-checkpoint@1 manifest" in refused(tmp_path)
    edited = json.loads(good)
    edited["step"] = 5  # well-formed, but not what was written: steps 1-4 would be skipped
    (where / "state.json").write_text(json.dumps(edited))
    message = refused(tmp_path)  # the manifest's own sha, not the tensors' ("its manifest records")
    assert "does not match the sha256 it records" in message and "state.json'" in message
    (where / "state.json").write_text(good)

    tensors = where / "state.safetensors"
    blob = bytearray(tensors.read_bytes())
    blob[-1] ^= 0xFF  # one bit of one weight changed
    tensors.write_bytes(bytes(blob))
    assert "does not match the sha256 its manifest records" in refused(tmp_path)
    blob[-1] ^= 0xFF
    tensors.write_bytes(bytes(blob))

    other = LifecycleConfig.from_mapping({"rollout_num_gpus": 4, "use_fault_tolerance": True})
    assert "written by a run with other settings (differing: rollout_num_gpus)" in refused(tmp_path, other)
    (tmp_path / "latest").write_text("job-000042\n")
    assert "names 'job-000042', which is not a checkpoint here" in refused(tmp_path)


class _Planted:
    """Unpickling this writes a file: proof that a checkpoint was (or was not) unpickled."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[str, str]]:
        return (os.system, (f"touch {self.marker}",))


@pytest.mark.bad_input
def test_a_pickle_in_place_of_the_tensors_is_refused_and_never_unpickled(tmp_path: Path) -> None:
    where = _save(tmp_path, 1, _trained(1))
    marker = tmp_path / "unpickled"
    (where / "state.safetensors").write_bytes(pickle.dumps(_Planted(marker)))
    manifest = json.loads((where / "state.json").read_text())
    manifest["files"]["state.safetensors"] = job_state._sha256(where / "state.safetensors")  # a careful forger
    manifest["sha256"] = job_state._digest(manifest)  # (who also signs the manifest again)
    (where / "state.json").write_text(json.dumps(manifest))
    with pytest.raises(ConfigError, match="cannot be read as safetensors"):
        load_job_checkpoint(tmp_path, CONFIG)
    assert not marker.exists()


def test_state_that_is_neither_tensor_nor_plain_value_is_refused_when_saving(tmp_path: Path) -> None:
    checkpoint = JobCheckpoint(1, "1", {"model": object()})
    with pytest.raises(TypeError, match="trainer/model: a object cannot go into a job checkpoint"):
        save_job_checkpoint(tmp_path, checkpoint, CONFIG)
    assert not (tmp_path / "latest").exists()


# -- what lifecycle run --resume reads besides the checkpoint --------------------------------------------------------
def test_where_checkpoints_go_is_not_part_of_the_job(tmp_path: Path) -> None:
    """A resumed run sets --load (and may save elsewhere): the same job; another engine count is not."""
    saving = LifecycleConfig.from_mapping({**CONFIG.to_dict(), "save": str(tmp_path), "save_interval": 2})
    resuming = LifecycleConfig.from_mapping({**saving.to_dict(), "load": str(tmp_path), "save_interval": 5})
    assert job_state.fingerprint(saving) == job_state.fingerprint(resuming) == job_state.fingerprint(CONFIG)
    _save(tmp_path, 1, _trained(1))
    assert load_job_checkpoint(tmp_path, resuming).step == 1
    other = LifecycleConfig.from_mapping({**resuming.to_dict(), "rollout_num_gpus": 4})
    with pytest.raises(ConfigError, match=r"differing: rollout_num_gpus\)"):
        load_job_checkpoint(tmp_path, other)


def test_restart_budgets_are_read_back_checked(tmp_path: Path) -> None:
    _save(tmp_path, 1, _trained(0), restarts=[[], [3.5, 0.25]])
    assert load_job_checkpoint(tmp_path, CONFIG).restart_ages == [[], [3.5, 0.25]]
    for step, restarts in enumerate(({"engine-1": "soon"}, [[1.0]], [[], [-1.0]]), start=2):  # not by engine,
        _save(tmp_path, step, _trained(0), restarts=restarts)  # another fleet size, a negative age
        with pytest.raises(ConfigError, match="--load: records malformed restart budgets"):
            load_job_checkpoint(tmp_path, CONFIG)  # refused when read, before anything starts


def test_an_elastic_fleets_target_is_read_back_checked(tmp_path: Path) -> None:
    """An elastic job's checkpoint keeps its target (engines) and a restart row per slot; a target outside the
    fleet's bounds is refused when read, naming --load; a fixed fleet's checkpoint has none."""
    elastic = LifecycleConfig.from_mapping({**CONFIG.to_dict(), "rollout_min_num_gpus": 1, "rollout_max_num_gpus": 3})
    state = _trained(0).get_state()
    rng = {"ranks": [{"torch": torch.get_rng_state(), "python": random.getstate()}]}
    for step, target in enumerate((3, 1), start=1):
        save_job_checkpoint(
            tmp_path, JobCheckpoint(step, str(step), state, {"restarts": [[]] * 3, "target": target}, rng), elastic
        )
        assert load_job_checkpoint(tmp_path, elastic).target == target
    for step, target in enumerate((4, 0, "3", True), start=3):
        save_job_checkpoint(
            tmp_path, JobCheckpoint(step, str(step), state, {"restarts": [[]] * 3, "target": target}, rng), elastic
        )
        with pytest.raises(ConfigError, match="--load: records a fleet target"):
            load_job_checkpoint(tmp_path, elastic)
    _save(tmp_path / "fixed", 1, _trained(0))
    assert load_job_checkpoint(tmp_path / "fixed", CONFIG).target is None


def test_a_resumed_runs_metrics_keep_the_checkpointed_steps_and_move_the_rest_aside(tmp_path: Path) -> None:
    metrics = tmp_path / "metrics.jsonl"
    rows = [{"step": k, "reward": k / 10} for k in range(4)]
    metrics.write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"step": 4, "rew')  # died mid-row
    kept, superseded = job_state.continue_metrics(metrics, 2)
    assert kept == rows[:2] and superseded == [2, 3]
    assert [json.loads(line) for line in metrics.read_text().splitlines()] == rows[:2]
    aside = (tmp_path / "metrics.superseded.jsonl").read_text().splitlines()
    assert [json.loads(line) for line in aside[:2]] == rows[2:] and aside[2] == '{"step": 4, "rew'  # nothing lost
    with metrics.open("a") as f:
        f.write("not json\n" + json.dumps(rows[2]) + "\n")
    with pytest.raises(ConfigError, match="is not a metrics row"):
        job_state.continue_metrics(metrics, 2)


def test_the_run_manifest_round_trips_and_refuses_what_cannot_be_resumed(tmp_path: Path) -> None:
    from trainer.app.loop import RunOptions

    saving = LifecycleConfig.from_mapping({**CONFIG.to_dict(), "save": str(tmp_path / "ckpt")})
    options = RunOptions(steps=4, seed=1, run_dir=tmp_path).manifest()
    run_manifest.write_run_manifest(tmp_path, saving, options)
    got = run_manifest.read_run_manifest(tmp_path)
    assert LifecycleConfig.from_mapping(got.config) == saving and got.options == options
    assert got.cwd == Path.cwd()
    body = json.loads(got.path.read_text())
    got.path.write_text(json.dumps({**body, "cwd": str(tmp_path / "gone")}))
    with pytest.raises(ConfigError, match=r"--resume: .*the run started in .*gone, which is gone"):
        run_manifest.read_run_manifest(tmp_path)
    run_manifest.write_run_manifest(tmp_path, CONFIG, options)
    with pytest.raises(ConfigError, match=r"--resume: that run wrote no job checkpoints \(no --save\)"):
        run_manifest.read_run_manifest(tmp_path)
    with pytest.raises(ConfigError, match="--resume: no such directory"):
        run_manifest.read_run_manifest(tmp_path / "nowhere")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match="--resume: is missing: not a run directory"):
        run_manifest.read_run_manifest(tmp_path / "empty")
    (tmp_path / "run.json").write_text("{")
    with pytest.raises(ConfigError, match="cannot be read"):
        run_manifest.read_run_manifest(tmp_path)


def test_resume_reads_a_relative_save_directory_where_the_run_started(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--save runs/job/ckpt`` is relative to where the run started, wherever ``--resume`` is typed."""
    from lifecycle.cli import main

    monkeypatch.chdir(tmp_path)
    values = {**CONFIG.to_dict(), "rollout_num_gpus": 2, "save": "runs/job/ckpt"}
    config = LifecycleConfig.from_mapping(values)
    Path("runs/job").mkdir(parents=True)
    from trainer.app.loop import RunOptions

    run_manifest.write_run_manifest(Path("runs/job"), config, RunOptions(steps=2, run_dir=Path("runs/job")).manifest())
    facts, rng = {"restarts": [[], []]}, {"ranks": [{}]}
    save_job_checkpoint("runs/job/ckpt", JobCheckpoint(2, "2", {"w": torch.zeros(2)}, facts, rng), config)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    assert main(["run", "--resume", str(tmp_path / "runs" / "job")]) == 0  # complete: read, checked, not rerun
    assert "is complete (2 of 2 steps); nothing to resume" in capsys.readouterr().out


@pytest.mark.bad_input
def test_a_checkpoint_passed_to_the_loop_without_config_load_is_refused(tmp_path: Path) -> None:
    """The lifecycle resumes only under ``load`` (the ``resumes`` predicate): a checkpoint without it would
    start the job afresh under the checkpoint's step numbers."""
    from trainer.app.loop import RunOptions, check_options

    job = JobCheckpoint(2, "2", {}, {"restarts": [[], []]}, {"ranks": [{}]}, tmp_path)
    with pytest.raises(ConfigError, match=r"RunOptions\.resume: is a job checkpoint, but config\.load is unset"):
        check_options(CONFIG, RunOptions(run_dir=tmp_path, resume=job))
    resuming = LifecycleConfig.from_mapping({**CONFIG.to_dict(), "load": str(tmp_path)})
    check_options(resuming, RunOptions(run_dir=tmp_path, resume=job))  # the pair the loop needs
