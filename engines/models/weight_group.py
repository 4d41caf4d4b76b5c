"""A weight-update process group: the trainer is rank 0 and broadcasts; every engine receives.

SGLang's ``/init_weights_update_group`` joins an engine to such a group at ``rank_offset``; the trainer
then broadcasts tensors bucket by bucket while each engine's ``/update_weights_from_distributed`` call
receives one bucket. This is the part both sides share: the rendezvous (a ``TCPStore`` the trainer
hosts), the group (gloo here; nccl on GPU hosts) and the bounded collectives. Every call has a
deadline -- a collective with a dead peer raises within ``timeout`` seconds, it never blocks for ever
(the field bug: "the trainer sat in a raw ncclBroadcast, which has no timeout").
"""

from __future__ import annotations

import contextlib
import datetime
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import torch
from torch._C._distributed_c10d import PrefixStore, ProcessGroupGloo, TCPStore

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float64": torch.float64,
    "int64": torch.int64,
    "int32": torch.int32,
}


class WeightGroupError(RuntimeError):
    """A group call failed or ran out of its deadline (the message says which and why)."""


def dtype_name(dtype: torch.dtype) -> str:
    """SGLang's dtype strings: ``torch.float32`` -> ``float32``."""
    return str(dtype).removeprefix("torch.")


def parse_dtype(name: str) -> torch.dtype:
    dtype = DTYPES.get(name.removeprefix("torch."))
    if dtype is None:
        raise WeightGroupError(f"dtype {name!r} is not supported; known: {', '.join(DTYPES)}")
    return dtype


@dataclass(frozen=True)
class TensorMeta:
    name: str
    dtype: str
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        n = parse_dtype(self.dtype).itemsize
        for d in self.shape:
            n *= d
        return n


def buckets(metas: Iterable[TensorMeta], max_bytes: int) -> list[list[TensorMeta]]:
    """Consecutive tensors in buckets of at most ``max_bytes`` (a bigger tensor is a bucket of its own)."""
    out: list[list[TensorMeta]] = []
    size = 0
    for m in metas:
        if not out or (size + m.nbytes > max_bytes and out[-1]):
            out.append([])
            size = 0
        out[-1].append(m)
        size += m.nbytes
    return out


def metas_of(state: Mapping[str, torch.Tensor]) -> list[TensorMeta]:
    return [TensorMeta(k, dtype_name(t.dtype), tuple(t.shape)) for k, t in state.items()]


class WeightGroup:
    """One member of a weight-update group (rank 0 hosts the rendezvous and sends)."""

    def __init__(
        self, master_address: str, master_port: int, rank: int, world_size: int, *, timeout: float, name: str
    ) -> None:
        if not 0 <= rank < world_size:
            raise WeightGroupError(f"rank {rank} is outside the group's world size {world_size}")
        self.name, self.rank, self.world_size, self.timeout = name, rank, world_size, timeout
        delta = datetime.timedelta(seconds=timeout)
        try:
            self.store = TCPStore(
                master_address, master_port, world_size, is_master=rank == 0, timeout=delta, wait_for_workers=False
            )
            self.pg = ProcessGroupGloo(PrefixStore(name, self.store), rank, world_size, delta)
        except Exception as exc:  # the rendezvous timed out, the port is taken, a peer went away
            raise WeightGroupError(
                f"group {name!r}: rank {rank}/{world_size} could not join at {master_address}:{master_port}: {exc}"
            ) from None
        self.closed = False

    def broadcast(self, tensors: Sequence[torch.Tensor]) -> None:
        """Rank 0's tensors into every member's (in place), one collective each, each within the deadline."""
        if self.closed:
            raise WeightGroupError(f"group {self.name!r} was destroyed")
        for t in tensors:
            try:
                delta = datetime.timedelta(seconds=self.timeout)
                work = self.pg.broadcast(t, 0, delta)  # type: ignore[attr-defined]
                if not work.wait(delta):
                    raise WeightGroupError(f"no completion within {self.timeout:g}s")
            except WeightGroupError:
                raise
            except Exception as exc:  # gloo: a peer closed its connection, or the timeout ran out
                first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
                raise WeightGroupError(f"group {self.name!r}: broadcast failed on rank {self.rank}: {first}") from None

    def close(self) -> None:
        """Leave the group (idempotent); a blocked peer then fails instead of waiting on us."""
        if self.closed:
            return
        self.closed = True
        with contextlib.suppress(Exception):  # already broken: nothing more to release
            self.pg.shutdown()
        del self.pg
