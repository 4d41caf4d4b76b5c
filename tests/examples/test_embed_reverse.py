"""``examples/embed_reverse.py``, the embedding example with its own task, trainer and loop, on a real Ray cluster.

It must learn (its own loss, its own checkpoints, served by the project's engines) and keep going through a
real engine death under rollout FT, the event log showing the engine recovered and serving again. Ray's
workers import the example's trainer as ``examples.embed_reverse`` from the driver's working directory, so
these tests run from the repository root, as ``make test`` runs them.
"""

from __future__ import annotations

import asyncio
import importlib
from pathlib import Path
from types import ModuleType

import pytest

from engines.models.checkpoint import checkpoint_config, checkpoint_steps
from lifecycle.decide.events import TRANSITION, read_jsonl

pytest.importorskip("ray")
pytest.importorskip("transformers", reason="the hf extra is not installed: pip install 'rl-lifecycle[hf]'")

pytestmark = pytest.mark.usefixtures("ray_cluster")

REPO = Path(__file__).resolve().parents[2]


def _example(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    """The example as its Ray workers import it (imported late: torch and transformers cost seconds)."""
    if Path.cwd().resolve() != REPO:
        pytest.fail(f"run pytest from {REPO}: Ray's workers import examples.embed_reverse from the driver's directory")
    monkeypatch.syspath_prepend(str(REPO))  # pytest's importlib mode puts no directory on sys.path
    return importlib.import_module("examples.embed_reverse")


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs)


def test_example_learns(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """12 steps, seed 0: the mean reward of the last 3 steps is well above that of the first 3 (measured
    0.04 -> 0.25; a random-init Llama scores about 0.04), and every step's weights reached the engines."""
    rewards = asyncio.run(_example(monkeypatch).main(steps=12, run_dir=tmp_path, seed=0, lr=1e-2))
    assert len(rewards) == 12 and all(0.0 <= r <= 1.0 for r in rewards), rewards
    first, last = _mean(rewards[:3]), _mean(rewards[-3:])
    assert last >= first + 0.1 and last >= 2 * first, rewards
    steps = checkpoint_steps(tmp_path / "weights")  # the backend's save_pretrained directories, pruned to 3
    assert [n for n, _ in steps] == [10, 11, 12] and checkpoint_config(steps[-1][1])["model_type"] == "llama"
    events = read_jsonl(tmp_path / "events.jsonl")
    loaded = [e for e in events if e.get("machine") == "engine" and e.get("trigger") == "finish_update"]
    assert len(loaded) >= 2 * 12, "each step's weights are loaded by both engines"


@pytest.mark.recovery
def test_example_survives_an_engine_death(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Engine 1 is SIGKILLed before step 2; under rollout FT the next generate recovers it (restart, the
    committed weights, then Serving) and the loop runs to its end."""
    rewards = asyncio.run(_example(monkeypatch).main(steps=4, run_dir=tmp_path, seed=0, kill_engine_at=2))
    assert len(rewards) == 4 and all(0.0 <= r <= 1.0 for r in rewards), rewards
    events = [e for e in read_jsonl(tmp_path / "events.jsonl") if e.get("event") == TRANSITION]
    moves = [(e["src"], e["dst"], e.get("step")) for e in events if e.get("instance") == "engine-1"]
    path = [(src, dst) for src, dst, _ in moves]
    died = path.index(("Quiesced", "Unhealthy"))  # between steps 1 and 2: the engines are quiesced
    recovery = [
        ("Unhealthy", "Recovering", 2),  # the next generate recovers it (rollout FT) ...
        ("Recovering", "Starting", 2),
        ("Starting", "PendingWeights", 2),
        ("PendingWeights", "LoadingWeights", 2),  # ... loads the committed weights before it is routed ...
        ("LoadingWeights", "Quiesced", 2),
        ("Quiesced", "Serving", 2),  # ... and serves in the same step
    ]
    assert moves[died + 1 : died + 1 + len(recovery)] == recovery, moves[died:]
    assert ("Quiesced", "Serving", 3) in moves and ("UpdatingWeights", "Quiesced", 3) in moves, moves[died:]
    engine0 = [e["dst"] for e in events if e.get("instance") == "engine-0"]
    assert "Unhealthy" not in engine0 and "Recovering" not in engine0, engine0


def test_the_examples_trainer_heals_through_its_own_state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """What train FT does with a crashed worker, for the example's backend: a fresh replica takes a peer's
    state (pickled, as it crosses Ray) and then trains bit for bit like the peer."""
    import pickle

    import torch

    from engines.models import build_tiny_llama

    example = _example(monkeypatch)
    checkpoint = str(build_tiny_llama(tmp_path / "model", seed=0))
    samples = [
        {"group": g, "reward": r, "prompt_ids": [1, 40, 41, 42], "output_ids": [43, 44, 45], "logprobs": []}
        for g, r in ((0, 0.0), (0, 1.0), (1, 0.5), (1, 0.25))
    ]
    peer, fresh = (example.ReverseBackend(rank=r, checkpoint=checkpoint) for r in (0, 1))
    peer.apply_grads(peer.compute_grads(samples)[0])  # the peer is one step ahead
    fresh.set_state(pickle.loads(pickle.dumps(peer.get_state())))
    for backend in (peer, fresh):
        backend.apply_grads(backend.compute_grads(samples)[0])
    a, b = peer.get_state()["model"], fresh.get_state()["model"]
    assert all(torch.equal(a[k], b[k]) for k in a)
    start = example.ReverseBackend(rank=2, checkpoint=checkpoint).get_state()["model"]
    assert any(not torch.equal(a[k], start[k]) for k in a)  # they did train
