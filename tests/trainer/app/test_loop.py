"""End to end: the real loop on a real local Ray cluster (one per test session), few small runs.

Each run costs engine and trainer start-up (seconds), so there are few of them, each short.
"""

from __future__ import annotations

import asyncio
import io
import json
from pathlib import Path

import pytest

from engines.models.checkpoint import checkpoint_config, checkpoint_steps
from lifecycle.decide.config import LifecycleConfig
from lifecycle.decide.events import TRANSITION, read_jsonl
from lifecycle.observe.trace import diff, load

pytest.importorskip("ray")
pytest.importorskip("torch")

from rollout.controller import ControllerError
from trainer.app.faults import parse_fault
from trainer.app.loop import Progress, RunOptions, RunResult, run_loop

pytestmark = pytest.mark.usefixtures("ray_cluster")

CPU = {
    "use_fault_tolerance": True,
    "ft_components": ["rollout"],
    "rollout_num_gpus": 2,
    "rollout_health_check_interval": 2.0,
    "rollout_health_check_timeout": 2.0,
    "rollout_health_check_first_wait": 0.0,
    "engine_restart_backoff": 0.1,
}


def _run(config: LifecycleConfig, run_dir: Path, steps: int, **kwargs: object) -> RunResult:
    out = io.StringIO()
    opts = RunOptions(steps=steps, seed=0, run_dir=run_dir, **kwargs)  # type: ignore[arg-type]
    return asyncio.run(run_loop(config, opts, out))


def _effects(events: list[dict[str, object]]) -> set[str]:
    return {e for ev in events for e in ev.get("effects", []) or []}  # type: ignore[union-attr]


def test_learning_criterion_fixed_seed(tmp_path: Path) -> None:
    """The default step count on the CPU defaults: last-5 mean reward >= 2x first-5 mean."""
    result = _run(LifecycleConfig.from_mapping(CPU), tmp_path / "run", RunOptions().steps)
    assert result.last5 >= 2 * result.first5, result.rewards
    metrics = read_jsonl(tmp_path / "run" / "metrics.jsonl")
    assert [m["step"] for m in metrics] == list(range(RunOptions().steps))
    assert all(0.0 <= m["reward"] <= 1.0 for m in metrics)
    assert (tmp_path / "run" / "events.jsonl").stat().st_size > 0
    # each weight version is a checkpoint directory; the last --keep-checkpoints (3) of them are kept
    kept = checkpoint_steps(tmp_path / "run" / "weights")
    assert len(kept) == 3 and kept[-1][0] == RunOptions().steps, kept
    assert all(checkpoint_config(path)["model_type"] == "rl-lifecycle-char" for _, path in kept)


def test_rollout_only_serves_the_hf_checkpoint_it_is_given(tmp_path: Path) -> None:
    """--hf-checkpoint DIR is version 0: the engines load that directory (not the seed's weights)."""
    from engines.models import TinyCausalLM

    config = LifecycleConfig.from_mapping({"debug_rollout_only": True, "rollout_num_gpus": 1})
    given = TinyCausalLM("tiny", seed=7).save_pretrained(tmp_path / "given")
    seed = _run(config, tmp_path / "seed", 1, launcher="local", quiet=True)
    ours = _run(config, tmp_path / "ours", 1, launcher="local", quiet=True, hf_checkpoint=given)
    assert (tmp_path / "seed" / "weights" / "step-0" / "config.json").is_file()
    assert not (tmp_path / "ours" / "weights").exists()  # nothing written: the given directory is served
    assert seed.rewards != ours.rewards  # same prompts and sampling seeds (64 samples), other weights


@pytest.mark.construction_gate
def test_seed_scenario_1_save_then_replay(tmp_path: Path) -> None:
    template = str(tmp_path / "data" / "{rollout_id}.json")
    save = LifecycleConfig.from_mapping({**CPU, "save_debug_rollout_data": template})
    saved = _run(save, tmp_path / "save", 3)
    assert sorted(p.name for p in (tmp_path / "data").iterdir()) == ["0.json", "1.json", "2.json"]

    replay = LifecycleConfig.from_mapping({"load_debug_rollout_data": template})  # no --rollout-num-gpus
    assert replay.rollout_num_gpus is None
    replayed = _run(replay, tmp_path / "replay", 3)
    assert replayed.rewards == saved.rewards  # trained on exactly the saved samples
    events = read_jsonl(tmp_path / "replay" / "events.jsonl")
    rollout = [e for e in events if e.get("machine") == "rollout" and e.get("event") == "lifecycle.transition"]
    assert rollout[0]["dst"] == "Replay"
    assert not _effects(events) & {"construct_rollout_fn", "construct_eval_fn", "start_servers", "start_monitor"}
    assert not [e for e in events if e.get("machine") == "engine"]
    # never created, so the monitor's only move is the dispose of a part that never existed
    assert [(e["src"], e["trigger"]) for e in events if e.get("machine") == "monitor"] == [("Init", "dispose")]
    trains = [e for e in events if e.get("machine") == "trainer" and e.get("trigger") == "train_done"]
    assert len(trains) == 3


@pytest.mark.recovery
@pytest.mark.lifecycle_gate
def test_seed_scenario_2_train_only_ft_equals_no_ft_and_rollout_ft_recovers(tmp_path: Path) -> None:
    base = {"rollout_num_gpus": 2}
    _run(LifecycleConfig.from_mapping(base), tmp_path / "noft", 3)
    train_ft = {**base, "use_fault_tolerance": True, "ft_components": ["train"]}
    _run(LifecycleConfig.from_mapping(train_ft), tmp_path / "trainft", 3)
    a, b = tmp_path / "noft" / "events.jsonl", tmp_path / "trainft" / "events.jsonl"
    assert diff(load(a, ["rollout"]), load(b, ["rollout"])) is None
    # engines start concurrently: compare each engine's own stream (their interleaving at start-up varies)
    per_engine_a = sorted(load(a, ["engine"]), key=lambda e: str(e["instance"]))
    per_engine_b = sorted(load(b, ["engine"]), key=lambda e: str(e["instance"]))
    assert diff(per_engine_a, per_engine_b) is None
    assert "probe_engine" not in _effects(read_jsonl(b))
    assert "start_monitor" not in _effects(read_jsonl(b))

    result = _run(LifecycleConfig.from_mapping(CPU), tmp_path / "kill", 5, faults=(parse_fault("kill-engine:1@3"),))
    assert len(result.rewards) == 5  # training continued
    events = read_jsonl(tmp_path / "kill" / "events.jsonl")
    e1 = [e for e in events if e.get("instance") == "engine-1" and e.get("event") == "lifecycle.transition"]
    path = [(e["src"], e["dst"]) for e in e1]
    assert ("Unhealthy", "Recovering") in path
    assert ("PendingWeights", "LoadingWeights") in path  # a recovered engine gets weights before it serves
    assert result.metrics[-1]["engines"] == {"engine-0": "Quiesced", "engine-1": "Quiesced"}
    assert "start_monitor" in _effects(events)


@pytest.mark.construction_gate
def test_plain_train_only_trains_without_engines(tmp_path: Path) -> None:
    """--debug-train-only without replay: the rollout fn is constructed and is the data source (the policy,
    sampled on CPU from the trainer's checkpoints); no engine, server or monitor ever appears."""
    config = LifecycleConfig.from_mapping({**CPU, "debug_train_only": True, "eval_interval": 3})
    result = _run(config, tmp_path / "to", 6)
    assert len(result.rewards) == 6
    # no engines to eval on: the skip and its reason are in the metrics rows (step 0, then every 3rd update)
    assert {m["step"]: m.get("eval_skipped") for m in result.metrics if "eval_skipped" in m} == {
        0: "no_engines",
        2: "no_engines",
        5: "no_engines",
    }
    assert not [m for m in result.metrics if "eval_reward" in m]
    assert sum(result.rewards[-2:]) > sum(result.rewards[:2]), result.rewards  # on-policy: the reward moves up
    assert all(m["logprob_diff"] < 1e-3 for m in result.metrics)  # producer and trainer agree on the policy
    events = read_jsonl(tmp_path / "to" / "events.jsonl")
    assert not [e for e in events if e.get("machine") == "engine"]
    # the monitor and the eval fleet were never created: their only move is the dispose of a never-made part
    others = [e for e in events if e.get("machine") in ("monitor", "eval_fleet")]
    assert [(e["machine"], e["src"], e["trigger"]) for e in others] == [
        ("eval_fleet", "Init", "dispose"),
        ("monitor", "Init", "dispose"),
    ]
    effects = _effects(events)
    assert "construct_rollout_fn" in effects
    assert not effects & {"start_servers", "start_monitor", "probe_engine", "transfer_weights", "stop_servers"}
    rollout = [e for e in events if e.get("machine") == "rollout" and e.get("event") == "lifecycle.transition"]
    assert [e["dst"] for e in rollout[:2]] == ["Constructed", "Ready"]  # init, skip_servers
    trains = [e for e in events if e.get("machine") == "trainer" and e.get("trigger") == "train_done"]
    assert len(trains) == 6


def test_train_only_with_the_engine_rollout_fn_fails(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Re-introduce the bug (train-only constructs the engine rollout fn): the run stops, no routable engine."""
    import rollout.executor

    monkeypatch.setattr(rollout.executor, "PolicyRolloutFn", rollout.executor.EngineRolloutFn)
    config = LifecycleConfig.from_mapping({**CPU, "debug_train_only": True})
    with pytest.raises(ControllerError, match="no routable engine"):
        _run(config, tmp_path / "bug", 2)


@pytest.mark.lifecycle_gate
def test_rollout_only_generates_and_never_trains(tmp_path: Path) -> None:
    """--debug-rollout-only: no trainer worker, no trainer event, no loss; the engines serve the seed's weights."""
    config = LifecycleConfig.from_mapping({"debug_rollout_only": True, "rollout_num_gpus": 2})
    result = _run(config, tmp_path / "ro", 3, launcher="local", quiet=True)
    assert len(result.rewards) == 3
    events = read_jsonl(tmp_path / "ro" / "events.jsonl")
    trainer = [e for e in events if e.get("machine") == "trainer"]
    assert not [e for e in trainer if e["event"] == TRANSITION]  # no trainer move at all
    # the one trainer event is the guard saying why it never started
    assert [(e["event"], e["trigger"], e["blocked_by"]) for e in trainer] == [
        ("lifecycle.blocked", "allocate", ["trains"])
    ]
    assert not [m for m in result.metrics if "loss" in m]
    updates = [e for e in events if e.get("machine") == "engine" and e.get("trigger") == "begin_update"]
    assert len(updates) == 2  # the initial weights on each engine, and no update after them


@pytest.mark.recovery
@pytest.mark.lifecycle_gate
def test_rollout_only_under_rollout_ft_recovers_a_killed_engine_without_a_trainer(tmp_path: Path) -> None:
    """No trainer means no update_weights: the next generate recovers the engine and loads the committed weights
    before it is routed again."""
    config = LifecycleConfig.from_mapping({**CPU, "debug_rollout_only": True})
    faults = (parse_fault("kill-engine:1@2"),)
    result = _run(config, tmp_path / "ro-ft", 5, launcher="local", quiet=True, faults=faults)
    assert len(result.rewards) == 5
    events = read_jsonl(tmp_path / "ro-ft" / "events.jsonl")
    moves = [e["trigger"] for e in events if e.get("instance") == "engine-1" and e.get("event") == TRANSITION]
    i = moves.index("mark_unhealthy")
    assert moves[i : i + 7] == [
        "mark_unhealthy",
        "recover",
        "restart",
        "ready",
        "begin_update",
        "finish_update",
        "resume",
    ]
    assert all(state == "Quiesced" for state in result.metrics[-1]["engines"].values()), result.metrics[-1]


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_redraws_one_line_on_a_tty() -> None:
    out = _Tty()
    progress = Progress(10, out)
    for step in range(3):
        progress.step(step, 0.1 * step, 0.0, "S S", 0.5, "abab")
    text = out.getvalue()
    assert "\n" not in text and text.count("\r") == 3
    last = text.split("\r")[-1]
    assert "step   3/10 [######--------------] reward 0.200" in last
    assert "engines [S S]" in last and "elapsed, ETA" in last
    progress.close()
    assert out.getvalue().endswith("\n")


def test_progress_prints_a_line_per_step_otherwise() -> None:
    out = io.StringIO()
    progress = Progress(2, out)
    progress.step(0, 0.25, 0.5, "Q Q", 1.0, "ab")
    progress.step(1, 0.5, -0.5, "Q Q", 1.0, "ab")
    progress.close()
    lines = out.getvalue().splitlines()
    assert len(lines) == 2 and "\r" not in out.getvalue()
    assert lines[1].startswith("  step   2/2  reward 0.500  loss -0.500  engines [Q Q]")
    quiet = io.StringIO()
    Progress(2, quiet, quiet=True).step(0, 0.0, 0.0, "", 0.0, "")
    assert quiet.getvalue() == ""


def test_policy_producer_samples_the_trainers_policy_faithfully(tmp_path: Path) -> None:
    """No Ray, no engine: samples are deterministic per rollout, grouped, rewarded, and their logprobs are the
    trainer's own (``token_logprobs`` on the same tokens) -- so GRPO trains on-policy on them."""
    import torch

    from engines.models import TinyCausalLM, WeightsFileError
    from rollout.pattern import PatternTask
    from rollout.policy_source import PolicyRolloutFn
    from trainer.policy import batch_tensors

    model = TinyCausalLM("tiny", seed=3)
    path = str(model.save_pretrained(tmp_path / "w"))
    task = PatternTask(seed=0)
    producer = PolicyRolloutFn(task)
    with pytest.raises(ControllerError, match="no policy weights"):
        asyncio.run(producer(0, None))  # type: ignore[arg-type]
    producer.load(path, "7")
    samples = asyncio.run(producer(2, None))  # type: ignore[arg-type]
    assert len(samples) == task.prompts_per_step * task.group_size
    assert samples == asyncio.run(producer(2, None))  # type: ignore[arg-type]
    assert samples != asyncio.run(producer(3, None))  # type: ignore[arg-type]
    assert {s["weight_version"] for s in samples} == {"7"}
    assert all(len(s["output_ids"]) == task.response_len for s in samples)
    assert [s["group"] for s in samples] == [i // task.group_size for i in range(len(samples))]
    assert all(s["reward"] == task.reward(s["prompt"], s["response"]) for s in samples)
    ids, mask = batch_tensors(samples)
    with torch.no_grad():
        trainer_lps = model.token_logprobs(ids, temperature=task.temperature)[mask.bool()]
    engine_lps = torch.tensor([lp for s in samples for lp in s["logprobs"]])
    assert torch.allclose(trainer_lps, engine_lps, atol=1e-4)
    small = str(TinyCausalLM("small", seed=3).save_pretrained(tmp_path / "small"))
    producer.load(small, "8")  # the architecture is the checkpoint's own (config.json), whatever it was before
    assert isinstance(producer.model, TinyCausalLM) and producer.model.config.name == "small"
    (tmp_path / "small" / "model.safetensors").write_bytes((tmp_path / "w" / "model.safetensors").read_bytes())
    with pytest.raises(WeightsFileError, match=r"small/model\.safetensors"):  # tensors of another size: named
        producer.load(small, "9")


@pytest.mark.determinism
@pytest.mark.monitor
def test_whole_event_log_is_deterministic_without_a_monitor(tmp_path: Path) -> None:
    """Invariant 8 for the whole log (every machine): engines launch concurrently but are confirmed
    in slot order, so two runs of one config write the same events. (With a monitor, probe events
    follow the wall clock; compare those runs with ``--only``.)"""
    config = LifecycleConfig.from_mapping({"rollout_num_gpus": 3})
    for name in ("a", "b"):
        _run(config, tmp_path / name, 2)
    a, b = load(tmp_path / "a" / "events.jsonl"), load(tmp_path / "b" / "events.jsonl")
    readies = [e["instance"] for e in a if e.get("machine") == "engine" and e.get("trigger") == "ready"]
    assert readies == ["engine-0", "engine-1", "engine-2"]
    assert diff(a, b) is None, diff(a, b)


@pytest.mark.slow  # the default run on the tiny Llama: about a minute on 2 cores
def test_tiny_llama_learns_within_the_default_run(tmp_path: Path) -> None:
    """``lifecycle run --model tiny-llama``: a Hugging Face Llama built into RUN_DIR/model (no hub), served by the
    engines and trained by the trainer through transformers, learns: last-5 mean reward >= 2x first-5."""
    pytest.importorskip("transformers", reason="the hf extra is not installed: pip install 'rl-lifecycle[hf]'")
    run_dir = tmp_path / "run"
    result = _run(LifecycleConfig.from_mapping(CPU), run_dir, RunOptions().steps, model="tiny-llama")
    assert result.last5 >= 2 * result.first5, result.rewards
    assert checkpoint_config(run_dir / "model")["architectures"] == ["LlamaForCausalLM"]
    kept = checkpoint_steps(run_dir / "weights")
    assert kept[-1][0] == RunOptions().steps and all(checkpoint_config(p)["model_type"] == "llama" for _, p in kept)
    assert all(m["logprob_diff"] < 1e-3 for m in result.metrics)  # engines and trainer: one model, one tokenizer
    events = read_jsonl(run_dir / "events.jsonl")
    engines = [e for e in events if e.get("machine") == "engine"]
    assert engines and not [e for e in engines if e.get("dst") in ("Failed", "Unhealthy")]
    pytest.importorskip("smg")  # with the router extra: it is in the path, membership by the effects
    assert [e["router"] for e in events if e.get("event") == "router.started"] == ["router-rollout"]
    routed = {(e["trigger"], e["dst"]) for e in engines if "route_traffic" in (e.get("effects") or ())}
    unrouted = {(e["trigger"], e["src"]) for e in engines if "stop_routing" in (e.get("effects") or ())}
    assert routed == {("resume", "Serving")} and unrouted == {("drain", "Serving")}


def test_a_model_and_an_hf_checkpoint_together_are_refused(tmp_path: Path) -> None:
    from lifecycle.decide.errors import ConfigError
    from trainer.app.loop import check_options

    opts = RunOptions(run_dir=tmp_path, model="tiny-llama", hf_checkpoint=tmp_path / "given")
    with pytest.raises(ConfigError, match="--hf-checkpoint gives the model already"):
        check_options(LifecycleConfig.from_mapping(CPU), opts)
    with pytest.raises(ConfigError, match="unknown model"):
        check_options(LifecycleConfig.from_mapping(CPU), RunOptions(run_dir=tmp_path, model="gpt"))


@pytest.mark.weight_update
def test_broadcast_updates_learn_exactly_like_disk_and_every_engine_holds_the_trainers_tensors(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--update-weight-transfer-mode broadcast``: the same seed gives the same rewards as disk, bit for bit,
    because every Serving engine holds exactly the trainer's tensors (read back and compared before every
    rollout); one group is connected once and broadcast to at every update."""
    monkeypatch.syspath_prepend(str(Path(__file__).parent))
    steps = 4
    results = {}
    for mode in ("disk", "broadcast"):
        check = tmp_path / f"{mode}.jsonl"
        monkeypatch.setenv("LIFECYCLE_WEIGHTS_CHECK", str(check))
        config = LifecycleConfig.from_mapping(
            {**CPU, "update_weight_transfer_mode": mode, "update_weight_buffer_size": 64 * 1024}
        )
        results[mode] = _run(config, tmp_path / mode, steps, rollout_fn="weights_check:factory")
        rows = [json.loads(line) for line in check.read_text().splitlines()]
        assert [r["version"] for r in rows] == [str(k) for k in range(steps)]
        assert all(
            r["engines"] == {"engine-0": r["engines"]["engine-0"], "engine-1": r["engines"]["engine-1"]} for r in rows
        )
        assert all(not r["mismatches"] for r in rows)
    assert results["broadcast"].rewards == results["disk"].rewards
    events = read_jsonl(tmp_path / "broadcast" / "events.jsonl")
    syncs = [e["trigger"] for e in events if e.get("instance") == "weight-sync" and e.get("event") == TRANSITION]
    assert syncs[:2] == ["connect", "connected"] and syncs.count("connect") == 1
    assert syncs.count("broadcast_done") == steps
    buckets = [e for e in events if e.get("event") == "weight_sync.bucket"]
    assert len({e["of"] for e in buckets}) == 1 and buckets[0]["of"] >= 2  # several buckets per update
    disk_events = read_jsonl(tmp_path / "disk" / "events.jsonl")
    assert not [e for e in disk_events if e.get("instance") == "weight-sync" and e.get("event") == TRANSITION]


@pytest.mark.slow  # its own lifecycle run process (its own Ray, started in the relative run's folder): ~20 s
def test_a_relative_run_dir_keeps_its_files_together(tmp_path: Path) -> None:
    """``make run`` runs in a relative ``runs/<time>``: the event log lands beside metrics.jsonl and run.json
    (a Job that joined the run directory to a path already under it wrote runs/X/runs/X/events.jsonl, and the
    run ended with "events.jsonl: cannot be read")."""
    import subprocess
    import sys

    argv = [sys.executable, "-m", "lifecycle.cli", "run", "--steps", "2", "--run-dir", "runs/relative", "--quiet"]
    done = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    where = tmp_path / "runs" / "relative"
    assert {"events.jsonl", "metrics.jsonl", "run.json"} <= {p.name for p in where.iterdir()}
    assert not (where / "runs").exists()
    assert len(read_jsonl(where / "metrics.jsonl")) == 2
