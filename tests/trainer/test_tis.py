"""Truncated importance sampling in the project's trainer (``--use-tis``): the formula of ``trainer.policy``.

On-policy samples (the engine's logprobs equal the trainer's) train exactly as without it; an off-policy token's
weight is the trainer/engine probability ratio, truncated to ``[tis_clip_low, tis_clip]`` and detached; a sample
without usable engine logprobs is one error naming the sample, the option and the fix. Each check is shown to
fail on the bug it guards against (``test_catches_*``).
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import math
import pickle
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from engines.models import CharTokenizer, TinyCausalLM  # noqa: E402
from lifecycle.decide.config import LifecycleConfig  # noqa: E402
from lifecycle.decide.errors import ConfigError  # noqa: E402
from rollout.pattern import PatternTask  # noqa: E402
from trainer import policy  # noqa: E402
from trainer.backend import BackendError, build_backend  # noqa: E402
from trainer.grpo import TIS_CLIP, TIS_CLIP_LOW, GRPOBackend, default_use_tis, grpo_backend  # noqa: E402
from trainer.policy import TIS, LogprobsError, batch_tensors, grpo_loss  # noqa: E402

Samples = list[dict[str, Any]]
SLIME = TIS(clip=TIS_CLIP, clip_low=TIS_CLIP_LOW)  # slime's defaults: truncated at 2, not below


def _model() -> TinyCausalLM:
    return TinyCausalLM("tiny", seed=0)


def _samples() -> Samples:
    """Two GRPO groups of two, prompts of unequal length (the logprobs sit at different offsets)."""
    tok = CharTokenizer()
    out = []
    for g, prompt in enumerate(["ab:", "wxyz:"]):
        for k, resp in enumerate(["abab", "zzz"]):
            ids = tok.encode(resp, add_bos=False)
            out.append(
                {
                    "group": g,
                    "prompt_ids": tok.encode(prompt),
                    "output_ids": ids,
                    "reward": 1.0 - k,
                    "weight_version": "3",
                }
            )
    return out


def _own_logprobs(model: TinyCausalLM, samples: Samples) -> list[list[float]]:
    """The model's logprobs of each sample's output tokens: what an engine holding these weights reports."""
    ids, mask = batch_tensors(samples, pad_id=model.tokenizer.pad_id)
    with torch.no_grad():
        lps = model.token_logprobs(ids)
    return [lps[i][mask[i].bool()].tolist() for i in range(len(samples))]


def _with_engine(samples: Samples, logprobs: Sequence[Sequence[float]]) -> Samples:
    return [{**s, "logprobs": list(lp)} for s, lp in zip(samples, logprobs, strict=True)]


def _grads(model: TinyCausalLM, samples: Samples, tis: TIS | None) -> tuple[float, dict[str, float], dict[str, Any]]:
    model.zero_grad(set_to_none=True)
    loss, stats = grpo_loss(model, samples, tis=tis)
    loss.backward()  # type: ignore[no-untyped-call]
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return float(loss.detach()), stats, grads


def _shifted(model: TinyCausalLM, samples: Samples, shift: Sequence[float]) -> Samples:
    """Samples whose engine logprobs are the model's minus ``shift[i]`` (sample i's ratio is exp(shift[i]))."""
    own = _own_logprobs(model, samples)
    return _with_engine(samples, [[x - d for x in lp] for lp, d in zip(own, shift, strict=True)])


# -- the formula ---------------------------------------------------------------------------------------------------
def test_on_policy_samples_train_exactly_as_without_the_correction() -> None:
    model = _model()
    samples = _with_engine(_samples(), _own_logprobs(model, _samples()))
    loss, stats, grads = _grads(model, samples, SLIME)
    plain_loss, plain_stats, plain_grads = _grads(model, samples, None)
    assert loss == plain_loss and all(torch.equal(grads[n], plain_grads[n]) for n in plain_grads)
    assert stats["tis_mean_ratio"] == 1.0 and stats["tis_clipped_fraction"] == 0.0
    assert "tis_mean_ratio" not in plain_stats  # without the correction, no column of it


def test_a_ratio_inside_the_bounds_weights_the_gradient_and_is_not_itself_differentiated() -> None:
    """Every token 1.5x as likely under the trainer as under the engine: the gradient is 1.5x the plain one. A
    ratio left in the graph adds d(ratio)/d(theta) * logprob terms; an inverted ratio gives 1/1.5."""
    model = _model()
    samples = _shifted(model, _samples(), [math.log(1.5)] * 4)
    loss, stats, grads = _grads(model, samples, SLIME)
    plain_loss, _, plain_grads = _grads(model, samples, None)
    assert loss == pytest.approx(1.5 * plain_loss, rel=1e-5)
    assert all(torch.allclose(grads[n], 1.5 * plain_grads[n], rtol=1e-4, atol=1e-7) for n in plain_grads)
    assert stats["tis_mean_ratio"] == pytest.approx(1.5, rel=1e-5) and stats["tis_clipped_fraction"] == 0.0


def _planted(model: TinyCausalLM) -> tuple[Samples, float, float]:
    """Sample 1 generated by much older weights: its tokens are e^5 (~148) times as likely now. Returns the
    samples and the loss with that sample's weight truncated at 2 and the loss with it untruncated."""
    samples = _shifted(model, _samples(), [0.0, 5.0, 0.0, 0.0])
    ids, mask = batch_tensors(samples, pad_id=model.tokenizer.pad_id)
    with torch.no_grad():
        per_sample = (model.token_logprobs(ids) * mask).sum(-1) / mask.sum(-1)
    adv = torch.tensor(policy.advantages(samples))

    def expected(w1: float) -> float:
        weights = torch.tensor([1.0, w1, 1.0, 1.0])
        return float(-(adv * weights * per_sample).mean())

    return samples, expected(2.0), expected(math.exp(5.0))


def test_a_planted_off_policy_sample_gets_the_truncated_ratio() -> None:
    model = _model()
    samples, truncated, _ = _planted(model)
    loss, stats, _ = _grads(model, samples, SLIME)
    assert loss == pytest.approx(truncated, rel=1e-5)
    assert stats["tis_clipped_fraction"] == pytest.approx(3 / 14)  # sample 1's 3 tokens of 4 + 3 + 4 + 3
    assert stats["tis_mean_ratio"] == pytest.approx((11 + 3 * math.exp(5.0)) / 14, rel=1e-4)  # the raw ratio


def test_catches_a_correction_without_truncation(monkeypatch: pytest.MonkeyPatch) -> None:
    """The bug put back: the ratio not truncated above. The planted sample then weighs e^5, not 2, and the
    test above fails."""
    monkeypatch.setattr(policy, "truncated", lambda ratio, tis: ratio.clamp(min=tis.clip_low))
    with pytest.raises(AssertionError):
        test_a_planted_off_policy_sample_gets_the_truncated_ratio()
    model = _model()
    samples, _, untruncated = _planted(model)
    assert _grads(model, samples, SLIME)[0] == pytest.approx(untruncated, rel=1e-4)


def test_catches_a_ratio_left_in_the_graph() -> None:
    """The bug put back: the weight computed from the differentiable logprobs. Its gradient is not 1.5x the
    plain one, so the detach test would fail on it."""
    model = _model()
    samples = _shifted(model, _samples(), [math.log(1.5)] * 4)
    _, _, plain_grads = _grads(model, samples, None)
    ids, mask = batch_tensors(samples, pad_id=model.tokenizer.pad_id)
    engine = policy.engine_logprobs(samples, mask)
    model.zero_grad(set_to_none=True)
    lps = model.token_logprobs(ids)
    attached = torch.exp((lps - engine) * mask).clamp(max=2.0) * lps
    adv = torch.tensor(policy.advantages(samples))
    (-(adv * (attached * mask).sum(-1) / mask.sum(-1)).mean()).backward()
    grads = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    assert not all(torch.allclose(grads[n], 1.5 * plain_grads[n], rtol=1e-4, atol=1e-7) for n in plain_grads)


def test_the_lower_bound_raises_a_ratio_below_it() -> None:
    """A token 20x less likely now than when sampled (ratio 0.05) keeps weight 0.5 with --tis-clip-low 0.5."""
    model = _model()
    samples = _shifted(model, _samples(), [-math.log(20.0)] * 4)
    loss, stats, _ = _grads(model, samples, TIS(clip=2.0, clip_low=0.5))
    plain_loss, _, _ = _grads(model, samples, None)
    assert loss == pytest.approx(0.5 * plain_loss, rel=1e-5) and stats["tis_clipped_fraction"] == 1.0


def test_the_ratio_stays_finite_however_far_the_engine_was() -> None:
    model = _model()
    samples = _shifted(model, _samples(), [400.0, 0.0, 0.0, 0.0])  # exp(400) overflows a float
    loss, stats, _ = _grads(model, samples, SLIME)
    assert math.isfinite(loss) and math.isfinite(stats["tis_mean_ratio"])


# -- bad input: one error naming the sample, the option and the fix -------------------------------------------------
@pytest.mark.bad_input
@pytest.mark.parametrize(
    ("logprobs", "says"),
    [
        (None, "carries no engine logprobs"),
        ([], "carries no engine logprobs"),
        ([-0.5, -0.5], "has 2 engine logprobs for 3 output tokens"),
        ([-0.5, float("nan"), -0.5], "not a finite number (nan)"),
        ([-0.5, "x", -0.5], "not a finite number ('x')"),
    ],
)
def test_a_sample_without_usable_engine_logprobs_is_one_error_naming_the_option(
    logprobs: list[Any] | None, says: str
) -> None:
    model = _model()
    samples = _with_engine(_samples(), _own_logprobs(model, _samples()))
    if logprobs is None:
        del samples[1]["logprobs"]  # a replay file of an older run, a rollout function that built its own dicts
    else:
        samples[1]["logprobs"] = logprobs
    with pytest.raises(LogprobsError) as info:
        grpo_loss(model, samples, tis=SLIME)
    text = str(info.value)
    assert says in text and "--use-tis" in text and "sample 1 (group 0, weight version '3')" in text
    assert "Fix: " in text and "--no-use-tis" in text and "rollout.sample.sample(" in text
    grpo_loss(model, samples)  # without the correction the same batch trains: the engine's logprobs are not needed


@pytest.mark.bad_input
def test_the_error_crosses_a_worker_as_itself() -> None:
    """A worker passes a BackendError to the driver as it is (``WorkerHandle._await``), never as a crash to heal;
    Ray pickles it on the way."""
    backend = build_backend(grpo_backend(use_tis=True), 0)
    with pytest.raises(LogprobsError) as info:
        backend.compute_grads([{**s, "logprobs": []} for s in _samples()])
    assert isinstance(info.value, BackendError)
    again = pickle.loads(pickle.dumps(info.value))
    assert type(again) is LogprobsError and str(again) == str(info.value)


@pytest.mark.bad_input
@pytest.mark.parametrize(
    ("clip", "low"), [(0.0, 0.0), (2.0, 2.0), (2.0, -0.1), (float("nan"), 0.0), (float("inf"), 0.0)]
)
def test_truncation_bounds_outside_0_low_clip_are_refused(clip: float, low: float) -> None:
    with pytest.raises(
        ConfigError, match=r"grpo_backend\(tis_clip(_low)?=\): must be (a finite number|greater|at least)"
    ):
        grpo_backend(use_tis=True, tis_clip=clip, tis_clip_low=low)


# -- the backend and the run option ------------------------------------------------------------------------------------
def test_the_backend_applies_the_correction_only_when_asked() -> None:
    assert set(grpo_backend().kwargs) == {"model_size", "seed", "lr", "temperature", "checkpoint"}  # as before
    spec = grpo_backend(use_tis=True, tis_clip=3.0, tis_clip_low=0.25)
    backend = build_backend(spec, 0)
    assert isinstance(backend, GRPOBackend) and backend.tis == TIS(clip=3.0, clip_low=0.25)
    _, stats = backend.compute_grads(_with_engine(_samples(), _own_logprobs(_model(), _samples())))
    assert stats["tis_mean_ratio"] == pytest.approx(1.0) and stats["tis_clipped_fraction"] == 0.0
    assert build_backend(grpo_backend(), 0).tis is None  # type: ignore[attr-defined]


def test_the_correction_is_on_by_default_where_the_run_streams() -> None:
    assert default_use_tis(LifecycleConfig.from_mapping({"rollout_num_gpus": 1})) is False
    assert default_use_tis(LifecycleConfig.from_mapping({"rollout_num_gpus": 1, "fully_async": True})) is True


def test_the_run_options_parse_keep_and_check(tmp_path: Path) -> None:
    from trainer.app.checks import check_run
    from trainer.app.options import RunOptions, add_run_arguments

    parser = argparse.ArgumentParser()
    add_run_arguments(parser)
    default = RunOptions.from_args(parser.parse_args([]))
    assert (default.use_tis, default.tis_clip, default.tis_clip_low) == (None, 2.0, 0.0)  # slime's defaults
    given = RunOptions.from_args(parser.parse_args(["--use-tis", "--tis-clip", "3", "--tis-clip-low", "0.5"]))
    assert (given.use_tis, given.tis_clip, given.tis_clip_low) == (True, 3.0, 0.5)
    assert RunOptions.from_args(parser.parse_args(["--no-use-tis"])).use_tis is False
    back = RunOptions.from_manifest(given.manifest(), tmp_path / "run.json", run_dir=tmp_path / "r")
    assert (back.use_tis, back.tis_clip, back.tis_clip_low) == (True, 3.0, 0.5)
    older = {k: v for k, v in given.manifest().items() if not k.startswith(("use_tis", "tis_"))}
    assert RunOptions.from_manifest(older, tmp_path / "run.json", run_dir=tmp_path / "r").use_tis is None
    config = LifecycleConfig.from_mapping({"rollout_num_gpus": 1})
    bad = RunOptions.from_args(parser.parse_args(["--tis-clip", "0.5", "--tis-clip-low", "1"]), run_dir=tmp_path / "x")
    with pytest.raises(ConfigError, match=r"--tis-clip-low: must be at least 0 and below --tis-clip 0.5"):
        check_run(config, bad)


# -- learning: stale samples, corrected -------------------------------------------------------------------------------
@pytest.fixture
def one_thread() -> Iterator[None]:
    """The tiny model's batches are small: one torch thread runs them 10x faster than many on a shared machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _stale_run(lag: int, tis: TIS | None, steps: int) -> list[float]:
    """GRPO on PatternTask in-process: each batch sampled (with its logprobs) by the weights of ``lag`` updates
    ago -- a stream's engines behind the trainer -- and trained with ``tis``. The mean reward per step."""
    torch.manual_seed(0)
    task = PatternTask(prompts_per_step=8, group_size=8, seed=0)
    model, behaviour = _model(), _model()
    tok = model.tokenizer
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    history = [copy.deepcopy(model.state_dict())]
    generator = torch.Generator().manual_seed(0)
    rewards = []
    for step in range(steps):
        behaviour.load_state_dict(history[max(0, len(history) - 1 - lag)])
        prompts = task.prompts(step)
        prompt_ids = [tok.encode(p) for p in prompts for _ in range(task.group_size)]
        ids, lps = torch.tensor(prompt_ids), []
        with torch.no_grad():
            for _ in range(task.response_len):
                logp = torch.log_softmax(behaviour(ids)[:, -1] / task.temperature, -1)
                token = torch.multinomial(logp.exp(), 1, generator=generator)
                lps.append(logp.gather(-1, token))
                ids = torch.cat([ids, token], 1)
        logprobs = torch.cat(lps, 1)
        samples = []
        for i, p in enumerate(prompt_ids):
            out = ids[i, len(p) :].tolist()
            reward = task.reward(prompts[i // task.group_size], tok.decode(out))
            samples.append(
                {"group": i // task.group_size, "prompt_ids": p, "output_ids": out, "reward": reward,
                 "logprobs": logprobs[i].tolist()}
            )  # fmt: skip
        rewards.append(sum(s["reward"] for s in samples) / len(samples))
        opt.zero_grad()
        loss, _ = grpo_loss(model, samples, temperature=task.temperature, tis=tis)
        loss.backward()  # type: ignore[no-untyped-call]
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        history.append(copy.deepcopy(model.state_dict()))
    return rewards


@pytest.mark.usefixtures("one_thread")
def test_training_on_two_versions_old_samples_with_the_correction_learns() -> None:
    rewards = _stale_run(lag=2, tis=SLIME, steps=30)
    first5, last5 = sum(rewards[:5]) / 5, sum(rewards[-5:]) / 5
    assert last5 >= 2 * first5 and last5 > 0.5, rewards


@pytest.mark.usefixtures("one_thread")
def test_an_on_policy_run_with_the_correction_is_the_run_without_it() -> None:
    assert _stale_run(lag=0, tis=SLIME, steps=12) == _stale_run(lag=0, tis=None, steps=12)


# -- through a trainer group ------------------------------------------------------------------------------------------
def test_a_job_without_its_own_backend_gets_the_correction_where_it_streams(tmp_path: Path) -> None:
    pytest.importorskip("ray")
    from trainer.group import TrainerGroup

    for fully_async, kwargs in ((True, {"use_tis": True, "tis_clip": 2.0, "tis_clip_low": 0.0}), (False, {})):
        config = LifecycleConfig.from_mapping({"rollout_num_gpus": 1, "fully_async": fully_async})
        backend = TrainerGroup(config, tmp_path).backend
        assert {k: backend.kwargs[k] for k in kwargs} == kwargs and ("use_tis" in backend.kwargs) == fully_async


@pytest.mark.bad_input
@pytest.mark.usefixtures("ray_cluster")
def test_a_sample_without_logprobs_stops_the_step_naming_the_option_not_a_worker_crash(tmp_path: Path) -> None:
    """On real Ray workers, under train FT (where a failed step is healed and retried): a step's stats carry the
    correction's columns, and a sample without logprobs is an error that reaches the driver as itself, not as a
    crashed worker ("a worker crashed again in train after a heal") or Ray's ``RayTaskError``."""
    from lifecycle.decide.events import EventLog, MemorySink
    from lifecycle.decide.runner import Runner
    from trainer.group import TrainerGroup

    from .conftest import bind_rollout_stand_in, generated

    config = LifecycleConfig.from_mapping(
        {"use_fault_tolerance": True, "ft_components": ["train"], "rollout_num_gpus": 1}
    )
    runner = Runner(config, log=EventLog([MemorySink()]))
    bind_rollout_stand_in(runner)
    group = TrainerGroup(config, tmp_path, runner=runner, backend=grpo_backend(use_tis=True))

    async def scenario() -> str:
        try:
            await group.start()
            await generated(group.runner)
            stats = await group.train(_with_engine(_samples(), _own_logprobs(_model(), _samples())))
            assert stats is not None  # the columns of the step's metrics.jsonl row: the engines were the trainer
            assert stats["tis_mean_ratio"] == pytest.approx(1.0, abs=1e-4) and stats["tis_clipped_fraction"] == 0.0
            with pytest.raises(LogprobsError) as info:
                await group.train([{k: v for k, v in s.items() if k != "logprobs"} for s in _samples()])
            return str(info.value)
        finally:
            await group.dispose()

    text = asyncio.run(scenario())
    assert "--use-tis: sample 0" in text and "carries no engine logprobs" in text and "Fix: " in text


def test_a_run_at_the_defaults_is_the_same_job_as_before_the_options_existed(tmp_path: Path) -> None:
    """Job checkpoints written before --use-tis existed record no TIS settings: a run at their defaults records
    none either (one fingerprint, so such a checkpoint resumes); a run that sets one records it."""
    from trainer.app.options import RunOptions

    assert not {"use_tis", "tis_clip", "tis_clip_low"} & set(RunOptions(run_dir=tmp_path).job_settings())
    given = RunOptions(run_dir=tmp_path, use_tis=True, tis_clip=3.0).job_settings()
    assert (given["use_tis"], given["tis_clip"]) == (True, 3.0) and "tis_clip_low" not in given
