"""Benchmark P8 (weight transfer): one weight update of two real CPU engines vs model size, disk vs broadcast.

For each size a Hugging Face Llama checkpoint is built here (no hub), two CPU engine processes start from
it, and the benchmark process plays the trainer: new weights, then

* ``disk``: the trainer writes the step's checkpoint directory (``save_pretrained``, atomic) and both engines
  load it at once (``/update_weights_from_disk``) -- the project's default path;
* ``broadcast``: the trainer is rank 0 of a weight-update group both engines joined once
  (``/init_weights_update_group``, timed apart) and broadcasts every tensor over gloo while both receive it
  bucket by bucket (``/update_weights_from_distributed``, ``--update-weight-buffer-size`` buckets).

Both are measured in the same run on the same engines, each the median of ``--repeat`` updates (disk's write and
load are those of its median update); printed:
seconds per update for each path, disk's write and load apart, and the ratio disk / broadcast. On a GPU host
broadcast goes over nccl and disk over a real file system: the ratio there is not this one.

Run: python benchmarks/bench_weights.py [--repeat 3] [--bucket-mb 64]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path

import torch

from engines.client import EngineClient
from engines.models import build_tiny_llama, new_causal_lm
from engines.models.weight_group import WeightGroup, buckets, metas_of
from engines.process import ServerProcess, torch_engine_command
from trainer.app.broadcast import free_port

# (name, LlamaConfig sizes): about 0.3 MB, 9 MB and 60 MB of float32 weights
SIZES: dict[str, dict[str, int]] = {
    "xs": {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2},
    "m": {"hidden_size": 256, "intermediate_size": 768, "num_hidden_layers": 4},
    "l": {"hidden_size": 512, "intermediate_size": 1536, "num_hidden_layers": 6},
}


async def measure(root: Path, size: str, repeat: int, bucket_bytes: int) -> dict[str, float]:
    initial = build_tiny_llama(root / size / "initial", seed=0, **SIZES[size])
    procs = [ServerProcess(torch_engine_command(seed=k, weights=initial), engine_id=f"p8-{k}") for k in range(2)]
    for p in procs:
        p.spawn()
    try:
        for p in procs:
            await asyncio.to_thread(p.wait_ready, 180.0)
        clients = [EngineClient(p.url, engine_id=p.engine_id, timeout=600.0) for p in procs]
        trainer = new_causal_lm(initial, seed=1)
        nbytes = sum(t.numel() * t.element_size() for t in trainer.state_dict().values())
        disk, write, load, cast = [], [], [], []
        for r in range(repeat):
            with torch.no_grad():
                for param in trainer.parameters():
                    param.add_(0.01)
            t0 = time.perf_counter()
            path = await asyncio.to_thread(trainer.save_pretrained, root / size / f"step-{r}")
            t1 = time.perf_counter()
            await asyncio.gather(*(c.update_weights_from_disk(str(path), weight_version=f"d{r}") for c in clients))
            t2 = time.perf_counter()
            write.append(t1 - t0)
            load.append(t2 - t1)
            disk.append(t2 - t0)
        port = free_port()
        t0 = time.perf_counter()
        sender = asyncio.to_thread(WeightGroup, "127.0.0.1", port, 0, 3, timeout=120.0, name="weight_update_group")
        joins = (c.init_weights_update_group("127.0.0.1", port, 1 + k, 3) for k, c in enumerate(clients))
        group, _ = await asyncio.gather(sender, asyncio.gather(*joins))
        connect = time.perf_counter() - t0
        for r in range(repeat):
            with torch.no_grad():
                for param in trainer.parameters():
                    param.add_(0.01)
            state = {n: p.detach().contiguous() for n, p in trainer.checkpoint_tensors().items()}
            plan = buckets(metas_of(state), bucket_bytes)
            t0 = time.perf_counter()
            for k, bucket in enumerate(plan):
                names = [m.name for m in bucket]
                version = f"b{r}" if k == len(plan) - 1 else None
                recv = (
                    c.update_weights_from_distributed(
                        names, [m.dtype for m in bucket], [list(m.shape) for m in bucket], weight_version=version
                    )
                    for c in clients
                )
                await asyncio.gather(asyncio.to_thread(group.broadcast, [state[n] for n in names]), *recv)
            cast.append(time.perf_counter() - t0)
        for c in clients:
            await c.destroy_weights_update_group()
            await c.close()
        group.close()
        med = statistics.median
        mid = sorted(range(repeat), key=disk.__getitem__)[repeat // 2]  # the median disk update, split in two
        return {
            "mb": nbytes / 1e6,
            "disk": disk[mid],
            "write": write[mid],
            "load": load[mid],
            "broadcast": med(cast),
            "connect": connect,
            "buckets": float(len(plan)),
        }
    finally:
        for p in procs:
            p.terminate()


async def main(repeat: int, bucket_mb: int) -> None:
    print(f"P8: one weight update of 2 CPU engines, median of {repeat}; buckets of {bucket_mb} MB")
    heads = ("size", "MB", "disk s", "(write", "load)", "bcast s", "connect", "disk/bcast")
    print(" ".join(f"{h:>{w}}" for h, w in zip(heads, (4, 7, 8, 8, 8, 8, 8, 10), strict=True)))
    with tempfile.TemporaryDirectory() as tmp:
        for size in SIZES:
            m = await measure(Path(tmp), size, repeat, bucket_mb * 1024 * 1024)
            print(
                f"{size:>4} {m['mb']:7.1f} {m['disk']:8.3f} {m['write']:8.3f} {m['load']:8.3f} "
                f"{m['broadcast']:8.3f} {m['connect']:8.3f} {m['disk'] / m['broadcast']:9.1f}x"
            )


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--bucket-mb", type=int, default=64)
    ns = ap.parse_args()
    asyncio.run(main(ns.repeat, ns.bucket_mb))
