"""A release frees the memory at once, with no garbage collection on the request path (issue 32, P7)."""

from __future__ import annotations

import gc
import math
from collections.abc import Iterator

import pytest

from engines.cpu.memory import ModelMemory, rss_bytes


@pytest.fixture
def no_collection(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[tuple[object, ...]]]:
    """Automatic collection off, and every explicit ``gc.collect`` call counted (none may run)."""
    asked: list[tuple[object, ...]] = []

    def collect(*args: object) -> int:
        asked.append(args)
        return 0

    monkeypatch.setattr(gc, "collect", collect)
    was = gc.isenabled()
    gc.disable()
    try:
        yield asked
    finally:
        if was:
            gc.enable()


@pytest.mark.skipif(rss_bytes() == 0, reason="no /proc/self/statm: RSS cannot be read here")
def test_a_release_frees_the_kv_pool_and_the_weights_without_a_collection(no_collection: list[object]) -> None:
    memory = ModelMemory(model_size="tiny", kv_slots=256)
    memory.load()
    kv_bytes = 2 * math.prod(memory.kv.shape) * 4
    assert kv_bytes > 16 << 20  # large allocations: returned to the OS when freed, so RSS shows it
    before = rss_bytes()
    memory.release(["weights", "kv_cache"], decoding=0)
    freed = before - rss_bytes()
    assert freed >= 0.9 * kv_bytes, (freed, kv_bytes)
    assert memory.resident() == {"weights": False, "kv_cache": False}
    assert all(p.numel() == 0 for p in memory.model.checkpoint_tensors().values())
    assert no_collection == []  # nothing collected on the request path
