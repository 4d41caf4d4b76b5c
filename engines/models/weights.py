"""Weights files: checked reads, so that every mismatch is one error naming the file and the tensor.

Written with ``safetensors.torch.save_file`` (or ``torch.save``) and read back with safetensors or
``torch.load(weights_only=True)``. Every mismatch is one :class:`WeightsFileError` naming the file
and the tensor, never a torch traceback, and a failed read changes nothing (nothing is assigned).
"""

from __future__ import annotations

import hashlib
import io
import os
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch
from safetensors.torch import load as safetensors_load
from torch import Tensor

from lifecycle.decide import jsonio
from lifecycle.decide.errors import LifecycleError

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


SAFETENSORS_MAX_HEADER = 100_000_000  # bytes: the limit the safetensors library itself puts on a header
_NOT_SAFETENSORS = "cannot be read as safetensors"


def read_safetensors_header(path: str | Path) -> dict[str, Any]:
    """The header of a safetensors file (tensor name -> dtype, shape, data_offsets), read and checked before
    any tensor is: 8 bytes of little-endian length, then that much JSON (through :mod:`lifecycle.decide.jsonio`).

    A sparse multi-GB file with a garbage header used to be read whole (gigabytes of memory) before the
    safetensors library looked at its first bytes. Refused here, having read at most the header: a length that
    is absurd or runs past the file, a header that is not JSON tensor entries, tensors that do not cover the
    rest of the file exactly (the format has no holes: a file longer than its tensors is not one).
    """
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            prefix = f.read(8)
            if len(prefix) < 8:
                raise WeightsFileError(path, f"{_NOT_SAFETENSORS}: {size} bytes, shorter than its header length")
            (length,) = struct.unpack("<Q", prefix)
            if length > SAFETENSORS_MAX_HEADER:
                problem = f"its header length {length:,} is absurd (at most {SAFETENSORS_MAX_HEADER:,} bytes)"
                raise WeightsFileError(path, f"{_NOT_SAFETENSORS}: {problem}")
            if 8 + length > size:
                problem = f"its header length {length:,} runs past the end of the {size:,}-byte file"
                raise WeightsFileError(path, f"{_NOT_SAFETENSORS}: {problem}")
            raw = f.read(length)
    except OSError as exc:
        raise WeightsFileError(path, f"cannot be read ({exc.strerror or exc})") from None
    try:
        header = jsonio.loads(raw, source=path)
    except jsonio.JSONFileError as exc:
        raise WeightsFileError(path, f"{_NOT_SAFETENSORS}: its header {exc.problem}") from None
    if not isinstance(header, dict):
        raise WeightsFileError(path, f"{_NOT_SAFETENSORS}: its header is not a JSON object of tensors")
    data = size - 8 - length
    end = 0
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        offsets = entry.get("data_offsets") if isinstance(entry, dict) else None
        shape = entry.get("shape") if isinstance(entry, dict) else None
        if (
            not isinstance(entry, dict)
            or not isinstance(entry.get("dtype"), str)
            or not isinstance(shape, list)
            or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape)
            or not isinstance(offsets, list)
            or len(offsets) != 2
            or not all(isinstance(o, int) and not isinstance(o, bool) for o in offsets)
            or not 0 <= offsets[0] <= offsets[1] <= data
        ):
            problem = f"{_NOT_SAFETENSORS}: its header entry is not a tensor within the file's {data:,} data bytes"
            raise WeightsFileError(path, problem, tensor=name[:60])
        end = max(end, offsets[1])
    if end != data:
        problem = f"its tensors hold {end:,} bytes but the file has {data:,} after the header"
        raise WeightsFileError(path, f"{_NOT_SAFETENSORS}: {problem}")
    return header


def _sniff_format(path: Path) -> LoadFormat:
    """``pt`` for a zip or pickle (``torch.save``), else ``safetensors``: from the first bytes alone."""
    try:
        with open(path, "rb") as f:
            start = f.read(4)
    except OSError as exc:
        raise WeightsFileError(path, f"cannot be read ({exc.strerror or exc})") from None
    return "pt" if start.startswith((b"PK\x03\x04", b"\x80")) else "safetensors"


def read_weights_file(
    path: str | Path, expected: Mapping[str, tuple[int, ...]], *, load_format: str | None = None
) -> WeightsFile:
    """Load and check a weights file against ``expected`` (name -> shape).

    The file is read once: the digest and the tensors come from the same bytes. Raises one
    :class:`WeightsFileError` naming the file (and tensor) for: a missing file, an unreadable
    format, missing or unexpected tensors, a wrong shape, a non-float dtype, NaN/inf.
    """
    path = resolve_weights_path(path)
    fmt: LoadFormat
    if load_format in (None, "auto"):
        fmt = _sniff_format(path)
    elif load_format in ("safetensors", "pt"):
        fmt = "pt" if load_format == "pt" else "safetensors"
    else:
        raise WeightsFileError(path, f"load_format {load_format!r} is not supported (use safetensors, pt or auto)")
    if fmt == "safetensors":
        read_safetensors_header(path)  # before the whole file is read: a bad one is refused having read its header
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise WeightsFileError(path, f"cannot be read ({exc.strerror or exc})") from None
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
