"""``RUN_DIR/run.json``: what ``lifecycle run --resume RUN_DIR`` needs to start the same job again; and what a run
may write over (:func:`check_new_run`).

Kept apart from :mod:`trainer.job_state` (which imports torch) so that a bad ``--resume`` fails before any heavy
import. It records the directory the run started in: the run's relative paths (``--save runs/x/ckpt``, a
``--hf-checkpoint``, a rollout function's module) mean what they meant then, wherever the resume is started.

``run.json`` is read like any file a user can hand us: whole and strict (one bounded JSON reader, no NaN or
Infinity, every option of its schema typed and bounded, the config through :class:`LifecycleConfig`) before
``--resume`` changes directory, imports the rollout function it names, or writes anything.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lifecycle.decide.config import LifecycleConfig
from lifecycle.decide.errors import ConfigError
from lifecycle.decide.jsonio import JSONFileError, read_json
from trainer.app.options import MANIFEST, SINCE

RUN_MANIFEST = "run.json"
RUN_FORMAT = "rl-lifecycle/run@1"
# what a run writes into its directory: one of these there means the directory holds a run
RUN_FILES = ("run.json", "events.jsonl", "metrics.jsonl", "metrics.superseded.jsonl", "weights")
_FIX = "pass the --run-dir of a run that lifecycle run started with --save"
_RESTORE = "restore the run.json lifecycle run wrote into the run directory"


@dataclass(frozen=True)
class RunManifest:
    config: dict[str, Any]  # LifecycleConfig.to_dict() of the run (its --load dropped)
    options: dict[str, Any]  # RunOptions.manifest()
    cwd: Path  # where the run started: its relative paths are relative to it
    path: Path  # the run.json this came from (for errors)
    job_id: str | None = None  # the job's identity, also recorded in each of its checkpoints (None: an older run)


def write_run_manifest(
    run_dir: str | os.PathLike[str],
    config: LifecycleConfig,
    options: Mapping[str, Any],
    *,
    job_id: str | None = None,
) -> Path:
    """``RUN_DIR/run.json``: the config, the loop's options and the working directory, written atomically."""
    path = Path(run_dir) / RUN_MANIFEST
    tmp = path.with_name(f".{RUN_MANIFEST}.tmp-{os.getpid()}")
    body = {"format": RUN_FORMAT, "config": config.to_dict(), "options": dict(options), "cwd": os.getcwd()}
    if job_id is not None:
        body["job_id"] = job_id
    tmp.write_text(json.dumps(body, indent=2, sort_keys=True, default=str) + "\n")
    os.replace(tmp, path)
    return path


def check_options(options: Mapping[str, Any], path: Path | str) -> None:
    """Every option of ``RunOptions.manifest()`` there, of its type and in its range; nothing else."""
    missing = [k for k in MANIFEST if k not in options and k not in SINCE]
    if missing:
        raise ConfigError("--resume", str(path), f"lacks the option {', '.join(missing)}", _RESTORE)
    unknown = sorted(k for k in options if k not in MANIFEST)
    if unknown:
        raise ConfigError("--resume", str(path), f"has unknown options {', '.join(unknown)[:200]}", _RESTORE)
    for key, check in MANIFEST.items():
        if key in options:
            problem = check(options[key])
            if problem:
                raise ConfigError("--resume", str(path), f"option {key} {problem}", _RESTORE)


def read_run_manifest(run_dir: str | os.PathLike[str]) -> RunManifest:
    """The run in ``run_dir`` as it started, checked whole; one ConfigError naming --resume and the fix otherwise."""
    path = Path(run_dir) / RUN_MANIFEST
    if not Path(run_dir).is_dir():
        raise ConfigError("--resume", str(run_dir), "no such directory", _FIX)
    if not path.exists():
        raise ConfigError("--resume", str(path), "is missing: not a run directory of lifecycle run", _FIX)
    try:
        body = read_json(path, max_bytes=4 * 1024 * 1024)
    except JSONFileError as exc:
        raise ConfigError("--resume", str(path), f"cannot be read ({exc.problem})", _FIX) from None
    if not isinstance(body, dict) or body.get("format") != RUN_FORMAT:
        raise ConfigError("--resume", str(path), f"is not a {RUN_FORMAT} manifest", _FIX)
    unknown = sorted(set(body) - {"format", "config", "options", "cwd", "job_id"})
    config, options, cwd, job_id = body.get("config"), body.get("options"), body.get("cwd"), body.get("job_id")
    if unknown or not isinstance(config, dict) or not isinstance(options, dict) or not isinstance(cwd, str):
        what = f"unknown entries {', '.join(unknown)[:200]}" if unknown else "no config, options or cwd"
        raise ConfigError("--resume", str(path), f"is malformed ({what})", _RESTORE)
    if job_id is not None and (not isinstance(job_id, str) or not 0 < len(job_id) <= 128):
        raise ConfigError("--resume", str(path), "is malformed (job_id is not a short string)", _RESTORE)
    try:
        LifecycleConfig.from_mapping(config)
    except ConfigError as exc:
        raise exc.with_source(str(path)) from None
    if not config.get("save"):
        raise ConfigError("--resume", str(path), "that run wrote no job checkpoints (no --save)", _FIX)
    check_options(options, path)
    if not os.path.isabs(cwd) or not Path(cwd).is_dir():
        raise ConfigError(
            "--resume",
            str(path),
            f"the run started in {cwd}, which is gone or not an absolute directory (its relative paths were relative "
            "to it)",
            f"recreate {cwd} (or edit cwd in run.json to where those paths now are)",
        )
    return RunManifest(config, options, Path(cwd), path, job_id)


# -- what a run may write over -------------------------------------------------------------------------------------
def holds_run(run_dir: Path) -> list[str]:
    """What of a run ``run_dir`` holds (empty: no run there)."""
    return [name for name in RUN_FILES if (run_dir / name).exists()]


def holds_checkpoints(save_dir: Path) -> bool:
    """Whether ``save_dir`` holds job checkpoints (its ``latest``, or any ``job-*`` directory)."""
    from trainer.job_state import JOB_PREFIX, LATEST  # the checkpoint format's names (it imports torch)

    if (save_dir / LATEST).exists():
        return True
    try:
        return any(p.name.startswith(JOB_PREFIX) for p in save_dir.iterdir())
    except OSError:  # no such directory (a new run's), or one that is not: nothing there to lose
        return False


def _same(a: str | os.PathLike[str], b: str | os.PathLike[str]) -> bool:
    return Path(a).resolve() == Path(b).resolve()


def _inside(path: Path, folder: Path) -> bool:
    path, folder = path.resolve(), folder.resolve()
    return path == folder or folder in path.parents


def _saved_into(run_dir: Path) -> Path | None:
    """The --save directory the run in ``run_dir`` wrote its job checkpoints to, as its run.json says."""
    try:
        body = read_json(run_dir / RUN_MANIFEST, max_bytes=4 * 1024 * 1024)
        save, cwd = body["config"]["save"], body["cwd"]
    except (JSONFileError, KeyError, TypeError):
        return None
    return Path(cwd, save) if isinstance(save, str) and save and isinstance(cwd, str) else None


def check_new_run(
    run_dir: Path, *, save: str | None, load: str | None, hf_checkpoint: str | os.PathLike[str] | None
) -> None:
    """A run never writes over what it did not create: not another run's directory, not another job's
    checkpoints, not its own input. Checked before anything is written; ``load`` set: the run continues the job
    whose checkpoints are there (``--resume``, or ``--load``), which may then use its run directory and save dir."""
    # the run writes its files into RUN_DIR and its weights under RUN_DIR/weights (pruned to --keep-checkpoints)
    hf = None if hf_checkpoint is None else Path(hf_checkpoint)
    if hf is not None and (_inside(hf, run_dir / "weights") or _same(hf, run_dir)):
        raise ConfigError(
            "--hf-checkpoint",
            str(hf_checkpoint),
            f"is --run-dir {run_dir} or inside its weights directory, which the run writes (and prunes): it would "
            "overwrite its own input",
            f"copy the checkpoint out of {run_dir} (cp -r), or pass another --run-dir",
        )
    found = holds_run(run_dir)
    if found:
        saved = _saved_into(run_dir)
        if load is None or saved is None or not _same(saved, load):
            raise ConfigError(
                "--run-dir",
                str(run_dir),
                f"already holds a run ({', '.join(found)}): a new run would overwrite it",
                f"continue that run with `lifecycle run --resume {run_dir}`, or pass another --run-dir (or none: a "
                f"fresh runs/<timestamp>), or remove {run_dir}",
            )
    if save is not None and holds_checkpoints(Path(save)) and (load is None or not _same(save, load)):
        raise ConfigError(
            "--save",
            save,
            "already holds job checkpoints: this run would replace their latest, and that job's --resume would then "
            "continue from this run's state",
            "pass a new (or empty) --save directory, or continue that job with `lifecycle run --resume` on its run "
            "directory",
        )
