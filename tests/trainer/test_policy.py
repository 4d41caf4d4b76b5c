from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from engines.models import CharTokenizer, TinyCausalLM  # noqa: E402
from trainer.policy import advantages, batch_tensors, grpo_loss  # noqa: E402


def _samples() -> list[dict[str, object]]:
    tok = CharTokenizer()
    out = []
    for g, prompt in enumerate(["ab:", "cd:"]):
        for k, resp in enumerate(["abab", "zzzz"]):
            out.append(
                {
                    "group": g,
                    "prompt_ids": tok.encode(prompt),
                    "output_ids": tok.encode(resp, add_bos=False),
                    "reward": 1.0 if k == 0 else 0.0,
                }
            )
    return out


def test_group_baseline() -> None:
    adv = advantages(_samples())
    assert adv[0] > 0 > adv[1] and adv[2] > 0 > adv[3]
    assert abs(sum(adv)) < 1e-6


def test_mask_covers_response_tokens_only() -> None:
    ids, mask = batch_tensors(_samples())
    assert ids.shape == (4, 8) and mask.shape == (4, 7)
    assert mask.sum(-1).tolist() == [4.0] * 4
    assert mask[0, :3].sum() == 0  # BOS + "ab:" predict nothing of the response before position 3


def test_a_gradient_step_raises_the_rewarded_response() -> None:
    torch.manual_seed(0)
    model = TinyCausalLM("tiny", seed=0)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    samples = _samples()
    ids, mask = batch_tensors(samples)

    def good_logprob() -> float:
        with torch.no_grad():
            lp = model.token_logprobs(ids)
        return float((lp * mask)[0].sum())

    before = good_logprob()
    for _ in range(5):
        opt.zero_grad()
        loss, stats = grpo_loss(model, samples)
        loss.backward()
        opt.step()
    assert good_logprob() > before
    assert set(stats) >= {"loss", "logprob"}
