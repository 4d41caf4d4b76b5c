"""The trainer backend protocol: the project's GRPO trainer is one implementation; a bad one names itself."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from trainer.backend import BackendError, BackendSpec, GRPOBackend, TrainerBackend, build_backend


class Half:
    def __init__(self, *, rank: int) -> None:
        self.rank = rank

    def compute_grads(self, samples: object) -> None:
        return None


def _samples() -> list[dict[str, object]]:
    return [
        {"group": 0, "reward": r, "prompt_ids": [1, 5, 6], "output_ids": [7, 8], "logprobs": []}
        for r in (0.0, 1.0)
    ]


@pytest.mark.bad_input
def test_a_factory_that_is_not_a_backend_is_refused_naming_it_and_what_it_lacks() -> None:
    with pytest.raises(BackendError, match=r"'tests.trainer.test_backend:Half' built a Half without apply_grads"):
        build_backend(BackendSpec("tests.trainer.test_backend:Half"), 0)
    with pytest.raises(BackendError, match="name it module:attr"):
        build_backend(BackendSpec("no_colon"), 0)
    with pytest.raises(BackendError, match="cannot be imported"):
        build_backend(BackendSpec("no_such_module_here:Thing"), 0)


def test_the_grpo_backend_trains_and_a_second_one_heals_from_its_state() -> None:
    a = build_backend(BackendSpec(kwargs={"seed": 1}), 0)
    assert isinstance(a, TrainerBackend) and isinstance(a, GRPOBackend)
    before = {k: v.clone() for k, v in a.get_state()["model"].items()}
    grads, stats = a.compute_grads(_samples())
    a.apply_grads(grads)
    after = a.get_state()["model"]
    assert "loss" in stats and any(not before[k].equal(after[k]) for k in before)
    b = build_backend(BackendSpec(kwargs={"seed": 2}), 1)
    assert any(not b.get_state()["model"][k].equal(after[k]) for k in after)
    b.set_state(a.get_state())
    assert all(b.get_state()["model"][k].equal(after[k]) for k in after)
