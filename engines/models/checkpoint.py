"""Hugging Face checkpoint directories: what SGLang's ``--model-path`` and ``/update_weights_from_disk`` take.

A weight version is a directory (``config.json``, ``model.safetensors``, tokenizer files), never a loose
file: SGLang resolves a path that is not a checkpoint directory as a hub name and fails. A directory is
written whole under a hidden sibling name and renamed into place, so an engine never reads half of one;
the trainer keeps the last K (:func:`prune_checkpoints`) and never removes the one the engines serve.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from safetensors.torch import save_file
from torch import Tensor

from engines.models.weights import WeightsFile, WeightsFileError, read_weights_file
from lifecycle.decide import jsonio

CONFIG = "config.json"
WEIGHTS = "model.safetensors"
STEP_DIR = re.compile(r"^step-(\d+)$")
SHAPE = "a Hugging Face checkpoint directory (config.json + model.safetensors, as SGLang's --model-path takes)"


class CheckpointError(WeightsFileError):
    """A path that is not a loadable checkpoint directory; the message names the path and the fix."""

    def __init__(self, path: str | Path, problem: str) -> None:
        self.path, self.problem, self.tensor = str(path), problem, None
        Exception.__init__(self, f"checkpoint {self.path}: {problem}")


def write_checkpoint(
    directory: str | Path,
    state: Mapping[str, Tensor],
    config: Mapping[str, Any],
    files: Mapping[str, str | bytes] | None = None,
) -> Path:
    """Write ``directory`` atomically (:func:`write_directory`): tensors, ``config.json`` and the extra
    (tokenizer) files."""

    def fill(tmp: Path) -> None:
        tensors = {k: v.detach().contiguous() for k, v in state.items()}
        save_file(tensors, str(tmp / WEIGHTS), metadata={"format": "pt"})
        (tmp / CONFIG).write_text(json.dumps(dict(config), indent=2, sort_keys=True) + "\n")
        for name, content in (files or {}).items():
            if isinstance(content, bytes):
                (tmp / name).write_bytes(content)
            else:
                (tmp / name).write_text(content)

    return write_directory(directory, fill)


def write_directory(directory: str | Path, fill: Callable[[Path], None]) -> Path:
    """Write a directory atomically: ``fill(tmp)`` writes its files into a hidden sibling.

    The sibling (``.<name>.tmp-<pid>``) is fsynced file by file, then renamed into place; a failed write
    removes it and leaves an existing directory of that name as it was. Hidden leftovers of a process
    killed mid-write are removed by :func:`prune_checkpoints`.
    """
    final = Path(directory)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.parent / f".{final.name}.tmp-{os.getpid()}"
    old = final.parent / f".{final.name}.old-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        tmp.mkdir()
        fill(tmp)
        for f in tmp.iterdir():
            _fsync(f)
        _fsync(tmp)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    replaced = final.exists()
    if replaced:  # a step written again (a heal retried the update): move the old one aside first
        os.rename(final, old)
    try:
        os.rename(tmp, final)
    except BaseException:
        if replaced:
            os.rename(old, final)  # the old directory comes back under its name
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    _fsync(final.parent)
    shutil.rmtree(old, ignore_errors=True)
    return final


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def checkpoint_config(directory: str | Path) -> dict[str, Any]:
    """The checked ``config.json`` of a checkpoint directory (raises :class:`CheckpointError` naming the path)."""
    p = Path(directory)
    if p.is_file():
        raise CheckpointError(p, f"is a file; pass {SHAPE}")
    if not p.is_dir():
        raise CheckpointError(p, f"no such directory; pass {SHAPE}")
    cfg = p / CONFIG
    if not cfg.is_file():
        raise CheckpointError(p, f"has no {CONFIG}; pass {SHAPE}")
    try:  # bounded and strict: a deep, huge-number, non-UTF-8 or duplicate-key config.json is this one error
        data = jsonio.read_json(cfg)
    except jsonio.JSONFileError as exc:
        raise CheckpointError(cfg, f"cannot be read as JSON: it {exc.problem}; write it with save_pretrained") from None
    if not isinstance(data, dict):
        raise CheckpointError(cfg, "must hold a JSON object")
    if not (p / WEIGHTS).is_file():
        raise CheckpointError(p, f"has no {WEIGHTS}; pass {SHAPE}")
    return data


def read_checkpoint(
    directory: str | Path, expected: Mapping[str, tuple[int, ...]], *, model_type: str | None = None
) -> WeightsFile:
    """Load and check a checkpoint directory's tensors against ``expected`` (and its ``model_type``)."""
    config = checkpoint_config(directory)
    if model_type is not None and config.get("model_type") != model_type:
        raise CheckpointError(
            Path(directory) / CONFIG,
            f"model_type {config.get('model_type')!r} is not this engine's {model_type!r} (written for another model)",
        )
    return read_weights_file(Path(directory) / WEIGHTS, expected)


def checkpoint_steps(root: str | Path) -> list[tuple[int, Path]]:
    """The ``step-N`` checkpoint directories under ``root``, oldest first."""
    r = Path(root)
    if not r.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in r.iterdir() if p.is_dir() and (m := STEP_DIR.match(p.name))]
    return sorted(found)


def prune_checkpoints(
    root: str | Path, keep: int, protect: Iterable[str | Path] = (), among: Iterable[str | Path] | None = None
) -> list[Path]:
    """Remove all but the newest ``keep`` step directories, never one in ``protect`` (what is served), and
    the hidden leftovers of interrupted writes. ``among``: consider only these (what this run wrote, so a
    reused run folder's older steps are never ranked against this run's)."""
    if keep < 1:
        raise ValueError(f"--keep-checkpoints must be at least 1, got {keep}")
    kept = {Path(p).resolve() for p in protect}
    steps = checkpoint_steps(root)
    if among is not None:
        mine = {Path(p).resolve() for p in among}
        steps = [(n, p) for n, p in steps if p.resolve() in mine]
    removed = []
    for _, path in steps[: max(0, len(steps) - keep)]:
        if path.resolve() not in kept:
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed + remove_leftovers(root, "step")


def remove_leftovers(root: str | Path, prefix: str) -> list[Path]:
    """The hidden directories :func:`write_directory` left for ``<prefix>-N`` when its process was killed
    mid-write (never those of a write of this process)."""
    leftover = re.compile(rf"^\.{re.escape(prefix)}-\d+\.(tmp|old)-\d+$")
    r = Path(root)
    removed = []
    for path in r.glob(f".{prefix}-*.*-*") if r.is_dir() else ():
        if leftover.match(path.name) and not _own(path):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


def _own(path: Path) -> bool:
    """A write of this process may be in flight under that name: leave it."""
    return path.name.rsplit("-", 1)[-1] == str(os.getpid())
