"""A model vLLM cannot run, and a probe a backend does not answer, refused before anything starts (issue 41,
cases 10 and 11): exit 2, ONE paragraph naming the flag and the fix, nothing written.

vLLM's CPU attention refuses ``head_dim`` 16 only when it first runs: such a server starts, passes /health, and
its engine core dies at the first generation (tests/engines/vllm/test_vllm_core.py) -- so the checkpoint is
read up front (config.json) and refused naming --hf-checkpoint. The ``test_catches_*`` test puts the old
capability table back (no minimum) and the case then passes the check.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from badinput import Case, Setup, check_in_process

from lifecycle.decide import backends
from lifecycle.decide.config import LifecycleConfig
from trainer.app.checks import check_rollout_model


def _config_json(name: str, **fields: int) -> Setup:
    def setup(tmp: Path) -> None:
        (tmp / name).mkdir(parents=True, exist_ok=True)
        (tmp / name / "config.json").write_text(json.dumps({"model_type": "llama", **fields}))

    return setup


HD16 = {"hidden_size": 64, "num_attention_heads": 4}
VLLM = ("run", "--rollout-backend", "vllm", "--run-dir", "{tmp}/run", "--steps", "1")
CASES = [
    Case(
        "vllm-head-dim-16",
        (*VLLM, "--hf-checkpoint", "{tmp}/hd16"),
        ("--hf-checkpoint", "head_dim 16", "32"),
        (_config_json("hd16", **HD16),),
    ),
    Case(
        "vllm-explicit-head-dim-16",
        (*VLLM, "--hf-checkpoint", "{tmp}/hd16"),
        ("--hf-checkpoint", "head_dim 16"),
        (_config_json("hd16", hidden_size=512, num_attention_heads=8, head_dim=16),),
    ),
    Case(
        "sglang-progress-probe",
        ("run", "--run-dir", "{tmp}/run", "--steps", "1", "--rollout-health-check-endpoint", "progress"),
        ("--rollout-health-check-endpoint", "health_generate"),
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_refused_cleanly(case: Case, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    check_in_process(case, tmp_path, capsys)


def _vllm() -> LifecycleConfig:
    return LifecycleConfig.from_mapping({"rollout_backend": "vllm", "rollout_num_gpus": 1}, check_paths=False)


def test_a_runnable_checkpoint_and_other_backends_pass(tmp_path: Path) -> None:
    _config_json("hd64", hidden_size=128, num_attention_heads=2)(tmp_path)
    check_rollout_model(_vllm(), tmp_path / "hd64")
    _config_json("hd16", **HD16)(tmp_path)
    sglang = LifecycleConfig.from_mapping({"rollout_num_gpus": 1}, check_paths=False)
    check_rollout_model(sglang, tmp_path / "hd16")  # the project's CPU engine runs any head size
    check_rollout_model(_vllm(), tmp_path / "missing")  # unreadable: check_hf_checkpoint's to name


def test_catches_a_backend_with_no_head_dim_minimum(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    old = replace(backends.CAPABILITIES[("vllm", "cpu")], min_head_dim=0)
    monkeypatch.setitem(backends.CAPABILITIES, ("vllm", "cpu"), old)
    _config_json("hd16", **HD16)(tmp_path)
    check_rollout_model(_vllm(), tmp_path / "hd16")  # accepted: the engine would die at its first generation
