"""The trainer's Adam (``trainer.adam``) takes torch's Adam step bit for bit, reads a state torch's wrote, and a
trainer that trains, saves and restores never imports ``torch._dynamo`` (what ``torch.optim`` costs every worker)."""

from __future__ import annotations

import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

from trainer.adam import Adam  # noqa: E402


def _params(seed: int) -> list[torch.nn.Parameter]:
    g = torch.Generator().manual_seed(seed)
    shapes = [(7, 5), (5,), (3, 4, 2), (1,)]
    return [torch.nn.Parameter(torch.randn(s, generator=g)) for s in shapes]


def _grads(params: list[torch.nn.Parameter], step: int, g: torch.Generator) -> list[torch.Tensor | None]:
    # the second parameter has no gradient every third step: its moments and step count must stay as they are
    return [None if (i == 1 and step % 3 == 0) else torch.randn(p.shape, generator=g) for i, p in enumerate(params)]


@pytest.mark.parametrize("lr", [1e-2, 3e-4])
def test_each_step_equals_torchs_adam_bit_for_bit(lr: float) -> None:
    ours, theirs = _params(0), _params(0)
    mine, reference = Adam(ours, lr=lr), torch.optim.Adam(theirs, lr=lr)
    g = torch.Generator().manual_seed(1)
    for step in range(1, 31):
        grads = _grads(ours, step, g)
        for a, b, grad in zip(ours, theirs, grads, strict=True):
            a.grad = None if grad is None else grad.clone()
            b.grad = None if grad is None else grad.clone()
        mine.step()
        reference.step()
        for a, b in zip(ours, theirs, strict=True):
            assert torch.equal(a, b), f"step {step}: {float((a - b).abs().max())} apart"
        if step == 15:  # a worker restored from a saved state continues the same trajectory
            state = mine.state_dict()
            mine = Adam(ours, lr=lr)
            mine.load_state_dict(state)


def test_a_state_written_by_torchs_adam_continues_the_same_trajectory() -> None:
    """A job checkpoint written while the trainer used ``torch.optim.Adam`` resumes as that optimizer would."""
    ours, theirs = _params(2), _params(2)
    reference = torch.optim.Adam(theirs, lr=1e-2)
    g = torch.Generator().manual_seed(3)
    for step in range(1, 6):
        for p, grad in zip(theirs, _grads(theirs, step, g), strict=True):
            p.grad = grad
        reference.step()
    with torch.no_grad():
        for a, b in zip(ours, theirs, strict=True):
            a.copy_(b)
    mine = Adam(ours, lr=0.5)  # the state's hyperparameters win
    mine.load_state_dict(reference.state_dict())
    for step in range(6, 12):
        for a, b, grad in zip(ours, theirs, _grads(ours, step, g), strict=True):
            a.grad = None if grad is None else grad.clone()
            b.grad = None if grad is None else grad.clone()
        mine.step()
        reference.step()
        assert all(torch.equal(a, b) for a, b in zip(ours, theirs, strict=True)), f"step {step}"


_TRAINS = """
import sys, tempfile
from trainer.grpo import GRPOBackend
backend = GRPOBackend()
samples = [{"group": 0, "reward": r, "prompt_ids": [1, 5, 6], "output_ids": [7, 8], "logprobs": []} for r in (0.0, 1.0)]
for _ in range(2):
    grads, _ = backend.compute_grads(samples)
    backend.apply_grads(grads)
backend.set_state(backend.get_state())
backend.offload()
backend.onload()
backend.save_checkpoint(tempfile.mkdtemp())
print(sorted(m for m in ("torch._dynamo", "sympy") if m in sys.modules))
"""


def test_a_trainer_that_trains_saves_and_restores_never_imports_dynamo() -> None:
    """``torch.optim`` (or anything else) pulling ``torch._dynamo`` back into the trainer fails this."""
    done = subprocess.run([sys.executable, "-c", _TRAINS], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[]", done.stdout
