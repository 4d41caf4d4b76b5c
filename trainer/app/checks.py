"""Checks of ``lifecycle run``'s own options that need no runtime, shared by the CLI and ``run_loop``.

Light on purpose (no torch, Ray or HTTP imports): the CLI runs them before the loop is imported, so
a bad combination fails at once instead of after seconds of imports and a Ray start.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from lifecycle.decide.backends import capabilities
from lifecycle.decide.config import LifecycleConfig
from lifecycle.decide.errors import ConfigError
from lifecycle.decide.predicates import offloads_rollout
from trainer.app.faults import Fault


def check_async(config: LifecycleConfig, async_mode: bool) -> None:
    """--async overlaps generate(k+1) with train(k): the engines are never idle, so nothing can offload them."""
    if async_mode and offloads_rollout(config):
        raise ConfigError(
            "--async",
            True,
            "the async loop generates step k+1 while training step k, so the rollout engines are never idle "
            "and cannot be offloaded (offload is allowed only from Ready)",
            "drop --offload-rollout/--offload/--colocate, or run without --async",
        )
    if async_mode and config.save is not None:
        raise ConfigError(
            "--save",
            config.save,
            "a job checkpoint of the async loop would have to hold the next step's generation, which is in "
            "flight while the step ends; job checkpoints are written by the sync loop only",
            "run without --async to checkpoint, or drop --save",
        )


def check_steps(faults: Sequence[Fault], steps: int) -> None:
    """A fault scheduled after the last step would never be injected: say so instead of running without it."""
    for fault in faults:
        if fault.step >= steps:
            raise ConfigError(
                "--inject",
                str(fault),
                f"step {fault.step} is past the run (--steps {steps} runs steps 0 to {steps - 1})",
                f"inject at a step below {steps}, or raise --steps above {fault.step}",
            )


def check_hf_checkpoint(path: str | Path, model_size: str = "tiny") -> None:
    """``--hf-checkpoint``: read the directory whole now (config, tokenizer, every tensor's name and shape), so a
    wrong one is a flag error before Ray starts, not a worker that fails to load it. Either family: a char
    checkpoint must be of ``model_size``; any other ``model_type`` is built by transformers. Imports torch, lazily."""
    from engines.models import is_char_checkpoint, load_causal_lm
    from engines.models.checkpoint import read_checkpoint
    from engines.models.tiny import MODEL_TYPE, TinyCausalLM
    from engines.models.weights import WeightsFileError

    try:
        if is_char_checkpoint(path):
            read_checkpoint(path, TinyCausalLM(model_size).expected_tensors(), model_type=MODEL_TYPE)
        else:
            load_causal_lm(path)
    except WeightsFileError as exc:
        raise ConfigError(
            "--hf-checkpoint",
            str(path),
            str(exc),
            f"pass a checkpoint directory: RUN_DIR/weights/step-N of an earlier run, a char model's of size "
            f"{model_size!r} (TinyCausalLM.save_pretrained), or a local Hugging Face causal LM (config.json, "
            "model.safetensors, tokenizer files; e.g. models.build_tiny_llama)",
        ) from None


MODELS = ("char", "tiny-llama")


def check_backend_model(config: LifecycleConfig, model: str, hf_checkpoint: str | Path | None) -> None:
    """vLLM serves Hugging Face checkpoints: the project's char model is refused before anything starts; and
    external vLLM servers serve their own, which the trainer must start from (--hf-checkpoint)."""
    if config.rollout_backend == "vllm" and config.rollout_external_engine_addrs and hf_checkpoint is None:
        raise ConfigError(
            "--hf-checkpoint",
            None,
            "the external vLLM servers serve the checkpoint they were started on; the trainer must start from it",
            "pass --hf-checkpoint DIR (the directory the servers serve)",
        )
    if config.rollout_backend == "vllm" and model == "char" and hf_checkpoint is None and not config.debug_train_only:
        raise ConfigError(
            "--model",
            model,
            "--rollout-backend vllm serves Hugging Face checkpoints, not the project's char model",
            "use --model tiny-llama (the default with --rollout-backend vllm), or --hf-checkpoint DIR",
        )
    check_rollout_model(config, hf_checkpoint)


def check_rollout_model(config: LifecycleConfig, hf_checkpoint: str | Path | None) -> None:
    """A checkpoint the rollout backend cannot run is refused before any launch: its servers would start, pass
    /health and die at the first generation (vLLM's CPU attention and ``head_dim`` < 32). Read from config.json
    (``head_dim``, else ``hidden_size / num_attention_heads``); one that cannot be read is check_hf_checkpoint's."""
    least = capabilities(config.rollout_backend, config.rollout_device).min_head_dim
    if hf_checkpoint is None or not least or config.debug_train_only:
        return
    if not (Path(hf_checkpoint) / "config.json").is_file():  # not a FIFO's endless wait: check_hf_checkpoint's
        return
    try:
        with open(Path(hf_checkpoint) / "config.json", "rb") as f:
            model_config = json.loads(f.read(1 << 20))
        head_dim = model_config.get("head_dim") or model_config["hidden_size"] // model_config["num_attention_heads"]
        head_dim = int(head_dim)
    except (OSError, ValueError, TypeError, KeyError, AttributeError, ZeroDivisionError):
        return
    if head_dim < least:
        raise ConfigError(
            "--hf-checkpoint",
            str(hf_checkpoint),
            f"its attention heads have head_dim {head_dim} (config.json), and --rollout-backend "
            f"{config.rollout_backend} on --rollout-device {config.rollout_device} runs head_dim {least} or more "
            "(its engine would start, then die at the first generation)",
            f"use a checkpoint with head_dim >= {least} (e.g. hidden_size / num_attention_heads = 64), or "
            "--rollout-backend sglang",
        )


def check_model(model: str, hf_checkpoint: str | Path | None) -> None:
    """``--model``: the built-in char model, or ``tiny-llama`` (built into RUN_DIR/model); ``--hf-checkpoint``
    already says which model, so the two together are refused rather than one silently winning."""
    if model not in MODELS:
        raise ConfigError("--model", model, f"unknown model (known: {', '.join(MODELS)})", "use --model char")
    if model != "char" and hf_checkpoint is not None:
        raise ConfigError(
            "--model",
            model,
            "--hf-checkpoint gives the model already (its config.json's model_type)",
            f"drop --model {model}, or drop --hf-checkpoint",
        )


def check_detach(config: LifecycleConfig, launcher: str, ray_address: str | None, lease: float | None) -> None:
    """Kept engines (--detach-engines) are detached Ray actors on a cluster that outlives the driver; their lease
    (seconds) bounds how long they wait for the next driver."""
    if lease is not None and not lease > 0:
        raise ConfigError(
            "--engine-lease", lease, "must be a positive number of seconds", "pass e.g. --engine-lease 120"
        )
    if not config.detach_engines:
        return
    why, fix = "", ""
    if launcher != "ray":
        why, fix = "kept engines are Ray's detached actors", "use --launcher ray (the default)"
    elif not ray_address:
        why = "this driver's own Ray instance, and every engine in it, dies with the driver"
        fix = "start a cluster that outlives it (ray start --head) and pass --ray-address HOST:PORT"
    if why:
        raise ConfigError("--detach-engines", True, why, fix)
