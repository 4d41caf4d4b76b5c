"""Weights files: checked reads, so that every mismatch is one error naming the file and the tensor.

Written with ``safetensors.torch.save_file`` (or ``torch.save``) and read back with safetensors or
``torch.load(weights_only=True)``. Every mismatch is one :class:`WeightsFileError` naming the file
and the tensor, never a torch traceback, and a failed read changes nothing (nothing is assigned).
"""

from __future__ import annotations

import hashlib
import io
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import torch
from safetensors.torch import load as safetensors_load
from torch import Tensor

from lifecycle.errors import LifecycleError

LoadFormat = Literal["safetensors", "pt"]


class WeightsFileError(LifecycleError, ValueError):
    """A weights file that cannot be loaded into the model; names the file and, where known, the tensor."""

    def __init__(self, path: str | Path, problem: str, *, tensor: str | None = None) -> None:
        self.path = str(path)
        self.tensor = tensor
        self.problem = problem
        what = f" tensor {tensor!r}:" if tensor else ""
        super().__init__(f"weights file {self.path}:{what} {problem}")

    def __reduce__(self) -> tuple[object, ...]:
        # picklable as it is (message and fields): it crosses process boundaries, e.g. from a Ray trainer worker
        return (_rebuild, (type(self), self.args, dict(self.__dict__)))


def _rebuild(cls: type[WeightsFileError], args: tuple[object, ...], state: dict[str, object]) -> WeightsFileError:
    exc = cls.__new__(cls, *args)
    exc.args = args
    exc.__dict__.update(state)
    return exc


_WEIGHT_SUFFIXES = (".safetensors", ".pt", ".pth", ".bin")


def resolve_weights_path(path: str | Path) -> Path:
    """A weights file, or a directory holding exactly one (``*.safetensors``, ``*.pt``, ``*.pth``, ``*.bin``)."""
    p = Path(path)
    if p.is_dir():
        found = sorted(f for f in p.iterdir() if f.is_file() and f.suffix in _WEIGHT_SUFFIXES)
        if len(found) != 1:
            names = ", ".join(f.name for f in found) or "none"
            raise WeightsFileError(p, f"a weights directory must hold exactly one weights file; found: {names}")
        return found[0]
    if not p.is_file():
        raise WeightsFileError(p, "no such file or directory")
    return p


@dataclass(frozen=True)
class WeightsFile:
    """A checked weights file: its tensors (float32), the SHA-256 of the bytes they came from, and its format."""

    path: Path
    state: dict[str, Tensor]
    sha256: str
    load_format: LoadFormat


def read_weights_file(
    path: str | Path, expected: Mapping[str, tuple[int, ...]], *, load_format: str | None = None
) -> WeightsFile:
    """Load and check a weights file against ``expected`` (name -> shape).

    The file is read once: the digest and the tensors come from the same bytes. Raises one
    :class:`WeightsFileError` naming the file (and tensor) for: a missing file, an unreadable
    format, missing or unexpected tensors, a wrong shape, a non-float dtype, NaN/inf.
    """
    path = resolve_weights_path(path)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise WeightsFileError(path, f"cannot be read ({exc.strerror or exc})") from None
    fmt: LoadFormat
    if load_format in (None, "auto"):
        fmt = "pt" if data.startswith((b"PK\x03\x04", b"\x80")) else "safetensors"
    elif load_format in ("safetensors", "pt"):
        fmt = "pt" if load_format == "pt" else "safetensors"
    else:
        raise WeightsFileError(path, f"load_format {load_format!r} is not supported (use safetensors, pt or auto)")
    try:
        raw: object = (
            safetensors_load(data) if fmt == "safetensors" else torch.load(io.BytesIO(data), weights_only=True)
        )
    except Exception as exc:  # both readers raise a variety of types for a corrupt file
        reader = "safetensors" if fmt == "safetensors" else "torch.load(weights_only=True)"
        raise WeightsFileError(path, f"cannot be read as {fmt} ({reader}: {type(exc).__name__}: {exc})") from None
    if not isinstance(raw, Mapping) or not all(isinstance(k, str) and isinstance(v, Tensor) for k, v in raw.items()):
        raise WeightsFileError(path, "expected a flat mapping of tensor name -> tensor (a state_dict)")
    missing = sorted(set(expected) - set(raw))
    unexpected = sorted(set(raw) - set(expected))
    if missing or unexpected:
        parts = []
        if missing:
            parts.append(f"missing tensors: {', '.join(missing[:5])}" + (" ..." if len(missing) > 5 else ""))
        if unexpected:
            parts.append(f"unexpected tensors: {', '.join(unexpected[:5])}" + (" ..." if len(unexpected) > 5 else ""))
        raise WeightsFileError(path, "; ".join(parts) + " (not written by this model class?)")
    state: dict[str, Tensor] = {}
    for name, shape in expected.items():
        tensor = raw[name]
        if tuple(tensor.shape) != shape:
            raise WeightsFileError(path, f"shape {tuple(tensor.shape)} does not match the model's {shape}", tensor=name)
        if not tensor.is_floating_point():
            raise WeightsFileError(path, f"dtype {tensor.dtype} is not a floating-point dtype", tensor=name)
        tensor = tensor.to(torch.float32)
        if not bool(torch.isfinite(tensor).all()):
            raise WeightsFileError(path, "contains NaN or inf values", tensor=name)
        state[name] = tensor
    return WeightsFile(path=path, state=state, sha256=hashlib.sha256(data).hexdigest(), load_format=fmt)
