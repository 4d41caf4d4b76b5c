"""``RUN_DIR/run.json``: what ``lifecycle run --resume RUN_DIR`` needs to start the same job again.

Kept apart from :mod:`trainer.job_state` (which imports torch) so that a bad ``--resume`` fails before any heavy
import. It records the directory the run started in: the run's relative paths (``--save runs/x/ckpt``, a
``--hf-checkpoint``, a rollout function's module) mean what they meant then, wherever the resume is started.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lifecycle.config import LifecycleConfig
from lifecycle.errors import ConfigError

RUN_MANIFEST = "run.json"
RUN_FORMAT = "rl-lifecycle/run@1"


@dataclass(frozen=True)
class RunManifest:
    config: dict[str, Any]  # LifecycleConfig.to_dict() of the run (its --load dropped)
    options: dict[str, Any]  # RunOptions.manifest()
    cwd: Path  # where the run started: its relative paths are relative to it
    path: Path  # the run.json this came from (for errors)


def write_run_manifest(run_dir: str | os.PathLike[str], config: LifecycleConfig, options: Mapping[str, Any]) -> Path:
    """``RUN_DIR/run.json``: the config, the loop's options and the working directory, written atomically."""
    path = Path(run_dir) / RUN_MANIFEST
    tmp = path.with_name(f".{RUN_MANIFEST}.tmp-{os.getpid()}")
    body = {"format": RUN_FORMAT, "config": config.to_dict(), "options": dict(options), "cwd": os.getcwd()}
    tmp.write_text(json.dumps(body, indent=2, sort_keys=True, default=str) + "\n")
    os.replace(tmp, path)
    return path


def read_run_manifest(run_dir: str | os.PathLike[str]) -> RunManifest:
    """The run in ``run_dir`` as it started; one ConfigError naming --resume and the fix otherwise."""
    path = Path(run_dir) / RUN_MANIFEST
    fix = "pass the --run-dir of a run that lifecycle run started with --save"
    if not Path(run_dir).is_dir():
        raise ConfigError("--resume", str(run_dir), "no such directory", fix)
    try:
        body = json.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError("--resume", str(path), "is missing: not a run directory of lifecycle run", fix) from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError("--resume", str(path), f"cannot be read ({exc})", fix) from None
    if not isinstance(body, dict) or body.get("format") != RUN_FORMAT:
        raise ConfigError("--resume", str(path), f"is not a {RUN_FORMAT} manifest", fix)
    config, options, cwd = body.get("config"), body.get("options"), body.get("cwd")
    if not isinstance(config, dict) or not isinstance(options, dict) or not isinstance(cwd, str):
        raise ConfigError("--resume", str(path), "is malformed (no config, options or cwd)", fix)
    if not config.get("save"):
        raise ConfigError("--resume", str(path), "that run wrote no job checkpoints (no --save)", fix)
    if not Path(cwd).is_dir():
        raise ConfigError(
            "--resume",
            str(path),
            f"the run started in {cwd}, which is gone (its relative paths were relative to it)",
            f"recreate {cwd} (or edit cwd in run.json to where those paths now are)",
        )
    return RunManifest(config, options, Path(cwd), path)
