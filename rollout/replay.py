"""Debug rollout data: what ``--save-debug-rollout-data`` writes and replay reads back.

JSON, never pickle: a replay file may come from anywhere, and unpickling runs code. Each file
carries a schema version and a SHA-256 of its canonical payload, so a truncated, edited or
mismatched file fails with a :class:`ReplayDataError` naming the file and the rollout id --
instead of training on half a batch.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, cast

from lifecycle.decide import jsonio
from lifecycle.decide.errors import LifecycleError
from rollout.sample import Sample, sample_problem

SCHEMA = "rl-lifecycle/rollout@1"


class ReplayDataError(LifecycleError):
    """A replay file that cannot be used, with the file, the rollout id and the fix."""

    def __init__(self, path: str | os.PathLike[str], rollout_id: int, problem: str, fix: str) -> None:
        self.path, self.rollout_id, self.problem, self.fix = str(path), rollout_id, problem, fix
        super().__init__(f"--load-debug-rollout-data: {path} (rollout {rollout_id}): {problem}. Fix: {fix}")


def _canonical(payload: Mapping[str, Any]) -> bytes:
    return json.dumps(payload, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def rollout_path(template: str, rollout_id: int) -> Path:
    return Path(template.format(rollout_id=rollout_id))


def save_rollout(template: str, rollout_id: int, samples: Sequence[Mapping[str, Any]], **meta: Any) -> Path:
    """Write one rollout atomically (temp file + rename): a crash never leaves half a file."""
    path = rollout_path(template, rollout_id)
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {"rollout_id": rollout_id, "samples": [dict(s) for s in samples], "meta": dict(meta)}
    doc = {"schema": SCHEMA, "sha256": hashlib.sha256(_canonical(payload)).hexdigest(), **payload}
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(doc, ensure_ascii=False, indent=1))
    os.replace(tmp, path)
    return path


def load_rollout(template: str, rollout_id: int, *, trainable: bool = False) -> list[dict[str, Any]]:
    """Read one rollout's samples, verifying schema, rollout id and checksum (and, with ``trainable``,
    that there are samples and each has the fields the trainer reads, with the right types)."""
    path = rollout_path(template, rollout_id)
    if not path.is_file():
        raise ReplayDataError(
            path, rollout_id, "the file does not exist", "replay only rollout ids that --save-debug-rollout-data wrote"
        )
    try:  # bounded and strict (depth, digits, UTF-8, duplicate keys); NaN parses, the sample check refuses it
        doc = jsonio.read_json(path, allow_nan=True)
    except jsonio.JSONFileError as exc:
        raise ReplayDataError(
            path,
            rollout_id,
            f"the file {exc.problem}; it is truncated or corrupt",
            "re-create it with --save-debug-rollout-data",
        ) from None
    if not isinstance(doc, dict) or "schema" not in doc:
        raise ReplayDataError(
            path,
            rollout_id,
            "not an rl-lifecycle rollout file (no schema field)",
            "point --load-debug-rollout-data at files written by --save-debug-rollout-data",
        )
    if doc["schema"] != SCHEMA:
        raise ReplayDataError(
            path,
            rollout_id,
            f"schema {doc['schema']!r}, this version reads {SCHEMA!r}",
            "re-create the data with this version of rl-lifecycle",
        )
    payload = {k: doc.get(k) for k in ("rollout_id", "samples", "meta")}
    if hashlib.sha256(_canonical(payload)).hexdigest() != doc.get("sha256"):
        raise ReplayDataError(
            path,
            rollout_id,
            "checksum mismatch: the file was modified or damaged",
            "re-create it with --save-debug-rollout-data",
        )
    if payload["rollout_id"] != rollout_id:
        raise ReplayDataError(
            path,
            rollout_id,
            f"the file holds rollout {payload['rollout_id']}",
            "check the {rollout_id} placeholder of the path template",
        )
    samples = payload["samples"]
    if not isinstance(samples, list) or not all(isinstance(s, dict) for s in samples):
        raise ReplayDataError(path, rollout_id, "samples is not a list of objects", "re-create the file")
    if trainable:
        _check_trainable(path, rollout_id, samples)
    return samples


def _check_trainable(path: Path, rollout_id: int, samples: list[dict[str, Any]]) -> None:
    """The trainer's one sample check (:func:`rollout.sample.sample_problem`, also run on what a rollout function
    returns), so a checksummed file with a NaN or 7.0 reward, an empty ``output_ids`` or string ids is refused
    here, naming the sample and the field, not trained on or blamed on the trainer later."""
    fix = "replay files written by --save-debug-rollout-data of a training run"
    if not samples:
        raise ReplayDataError(path, rollout_id, "the rollout holds no samples, so there is nothing to train on", fix)
    problem = sample_problem(samples)
    if problem is not None:
        where = f"sample {problem.sample}" + (f", field {problem.field!r}" if problem.field else "")
        fix += " (each sample: rollout.sample.sample's fields, a reward in [0, 1], int token ids, output_ids not empty)"
        raise ReplayDataError(path, rollout_id, f"{where}: {problem.detail}", fix)


def load_samples(template: str, rollout_id: int) -> list[Sample]:
    """One rollout's samples for training: :func:`load_rollout` with every required sample field checked."""
    return cast(list[Sample], load_rollout(template, rollout_id, trainable=True))
