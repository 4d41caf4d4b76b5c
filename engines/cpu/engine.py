"""The CPU torch engine: a :class:`~engines.cpu.scheduler.Scheduler` over a :class:`~engines.cpu.memory.ModelMemory`.

This is where the two meet: a weight update holds admission while it swaps the weights, a flush
waits for the scheduler to free every KV slot, a release asks how many requests are decoding.
The HTTP layer (:func:`engines.cpu.app.build_app`) only parses and answers.
"""

from __future__ import annotations

import asyncio
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import torch

from engines.cpu.memory import ModelMemory, rss_bytes
from engines.cpu.scheduler import Scheduler, Status
from engines.cpu.validation import EngineRequestError
from engines.models import WeightsFileError, sample_token
from engines.models.weight_group import WeightGroup, WeightGroupError, parse_dtype
from engines.protocol import (
    AbortReq,
    DestroyWeightsUpdateGroupReqInput,
    GenerateReqInput,
    InitWeightsUpdateGroupReqInput,
    UpdateWeightFromDiskReqInput,
    UpdateWeightsFromDistributedReqInput,
    UpdateWeightVersionReqInput,
)

ENGINE_VERSION = "rl-lifecycle-torch-engine 0.1.0 (SGLang 0.5.23 HTTP API)"


def redacted(argv: list[str]) -> list[str]:
    """``argv`` with the value of ``--api-key`` hidden: /server_info answers whoever asks."""
    out: list[str] = []
    for i, arg in enumerate(argv):
        if arg.startswith("--api-key="):
            out.append("--api-key=<redacted>")
        elif i > 0 and argv[i - 1] == "--api-key":
            out.append("<redacted>")
        else:
            out.append(arg)
    return out


class TorchEngine:
    """The engine's endpoints, each composed from the scheduler and the memory."""

    def __init__(
        self,
        *,
        seed: int = 0,
        model_size: str = "tiny",
        weights: str | Path | None = None,
        weight_version: str = "default",
        max_running_requests: int = 16,
        step_delay_s: float = 0.0,
        host: str = "127.0.0.1",
        port: int = 0,
        group_timeout: float = 60.0,
    ) -> None:
        if max_running_requests < 1:
            raise ValueError(f"max_running_requests must be >= 1, got {max_running_requests}")
        if step_delay_s < 0:
            raise ValueError(f"step_delay_s must be >= 0, got {step_delay_s}")
        self.max_running_requests = max_running_requests
        self.host = host
        self.port = port
        self.startup_time = time.time()
        self.generate_requests = 0
        self.memory = ModelMemory(
            seed=seed,
            model_size=model_size,
            weights=weights,
            weight_version=weight_version,
            kv_slots=max_running_requests,
        )
        self.scheduler = Scheduler(self.memory, seed=seed, step_delay_s=step_delay_s)
        self.groups: dict[str, WeightGroup] = {}  # weight-update groups joined (by group_name)
        self.update_session = False  # between /begin_weight_update and /end_weight_update
        self.group_timeout = group_timeout

    # -- lifecycle ----------------------------------------------------------------------------------
    @property
    def status(self) -> Status:
        return self.scheduler.status

    def load(self) -> None:
        """Build the model, load the initial weights, allocate the KV pool (blocking; WeightsFileError)."""
        self.memory.load()

    async def start(self) -> None:
        """Start the scheduler (the model must be loaded)."""
        self.memory.kv  # noqa: B018 -- raises if load() was not called
        await self.scheduler.start()

    def mark_ready(self) -> None:
        self.scheduler.mark_ready()

    async def shutdown(self) -> None:
        await self.scheduler.shutdown()

    def _unavailable_reason(self) -> str | None:
        if self.status != "ready":
            return f"the engine is {self.status.replace('_', ' ')}"
        if not self.scheduler.alive:
            return "the engine's scheduler is not running"
        if not self.memory.model.weights_resident:
            return "the model weights are released (resume_memory_occupation with tag 'weights' first)"
        if not self.memory.kv.resident:
            return "the KV cache is released (resume_memory_occupation with tag 'kv_cache' first)"
        return None

    # -- generation --------------------------------------------------------------------------------
    async def generate(self, body: GenerateReqInput) -> dict[str, Any] | list[dict[str, Any]]:
        self.generate_requests += 1  # every /generate that reached this server (the router wire tests read it)
        batch, requests = self.scheduler.build_requests(body)
        reason = self._unavailable_reason()
        if reason is not None:
            raise EngineRequestError(503, f"cannot generate: {reason}")
        results = await self.scheduler.submit(requests)
        return results if batch else results[0]

    def pause_generation(self, mode: str) -> None:
        self.scheduler.pause_generation(mode)

    def continue_generation(self) -> None:
        self.scheduler.continue_generation()

    def abort_request(self, body: AbortReq) -> None:
        self.scheduler.abort_request(body)

    def health_generate(self) -> bool:
        """A real 1-token greedy generation from input_ids [0] (False while starting or released)."""
        if self._unavailable_reason() is not None:
            return False
        try:
            with torch.no_grad():
                logits = self.memory.model.forward(torch.tensor([[0]]))[0, -1]
            sample_token(logits, temperature=0.0)
        except Exception:
            traceback.print_exc()
            return False
        return True

    # -- weights and memory ----------------------------------------------------------------------------
    def update_weight_version(self, body: UpdateWeightVersionReqInput) -> dict[str, Any]:
        if body.abort_all_requests:
            self.scheduler.abort_all("aborted by /update_weight_version")
        self.memory.weight_version = body.new_version
        return {
            "success": True,
            "message": f"Weight version updated to {body.new_version}.",
            "new_version": body.new_version,
        }

    def begin_weight_update(self) -> tuple[int, dict[str, Any]]:
        """Open the weight-update session (SGLang brackets an update with it so quantized weights can be
        loaded in place; a full-precision model needs no preparation). One session at a time."""
        if self.update_session:
            return 400, {"success": False, "message": "a weight-update session is already open; end it first"}
        self.update_session = True
        return 200, {"success": True, "message": "Weight update session begun."}

    def end_weight_update(self) -> tuple[int, dict[str, Any]]:
        """Close the session opened by /begin_weight_update."""
        if not self.update_session:
            return 400, {"success": False, "message": "no weight-update session is open; begin one first"}
        self.update_session = False
        return 200, {"success": True, "message": "Weight update session ended."}

    async def update_weights_from_disk(self, body: UpdateWeightFromDiskReqInput) -> tuple[int, dict[str, Any]]:
        """Like SGLang's writer lock: no new request starts, running ones finish (or stay paused), then
        the checkpoint directory is read, checked and swapped in between two tokens. A bad one changes nothing."""

        def refuse(message: str) -> tuple[int, dict[str, Any]]:
            return 400, {"success": False, "message": message, "num_paused_requests": 0}

        memory, scheduler = self.memory, self.scheduler
        if not memory.model.weights_resident:
            return refuse("the model weights are released; resume_memory_occupation(['weights']) first")
        if body.abort_all_requests:
            scheduler.abort_all("aborted by /update_weights_from_disk")
        with scheduler.admission_held():
            await scheduler.wait_until(lambda: not scheduler.running or scheduler.paused)
            try:
                loaded = await memory.read_weights(body.model_path, body.load_format)
            except WeightsFileError as exc:
                return refuse(f"Failed to update weights: {exc}")
            if not memory.model.weights_resident:
                return refuse("the model weights were released while the file was being read")
            memory.assign(loaded, body.model_path)
            if body.weight_version is not None:
                memory.weight_version = body.weight_version
            if body.flush_cache and memory.kv.resident and not memory.kv.slots_in_use:
                memory.kv.clear()
            paused = len(scheduler.running) if scheduler.paused else 0
            return 200, {
                "success": True,
                "message": "Succeeded to update model weights.",
                "num_paused_requests": paused,
            }

    # -- the weight-update group (SGLang's distributed update) -------------------------------------------------
    async def init_weights_update_group(self, body: InitWeightsUpdateGroupReqInput) -> tuple[int, dict[str, Any]]:
        """Join the trainer's group at ``rank_offset`` (this engine has one rank); blocks until every member
        joined, at most the group timeout, off the event loop (``/health`` keeps answering)."""
        if body.backend not in ("gloo", "nccl"):
            return 400, {"success": False, "message": f"backend {body.backend!r}: use gloo or nccl"}
        if body.group_name in self.groups:
            return 400, {"success": False, "message": f"group {body.group_name!r} exists; destroy it first"}
        try:
            group = await asyncio.to_thread(
                WeightGroup,
                body.master_address,
                body.master_port,
                body.rank_offset,
                body.world_size,
                timeout=self.group_timeout,
                name=body.group_name,
            )
        except WeightGroupError as exc:
            return 400, {"success": False, "message": f"Failed to init group: {exc}"}
        self.groups[body.group_name] = group
        return 200, {"success": True, "message": f"Succeeded to initialize group {body.group_name!r}."}

    async def update_weights_from_distributed(
        self, body: UpdateWeightsFromDistributedReqInput
    ) -> tuple[int, dict[str, Any]]:
        """Receive one bucket by broadcast and copy it in as it arrives; the version changes with the bucket
        that names one (the last). Admission is held meanwhile, as for a disk update."""

        def refuse(message: str) -> tuple[int, dict[str, Any]]:
            return 400, {"success": False, "message": message}

        group = self.groups.get(body.group_name)
        if group is None and self.groups:  # a bucket stamped with another generation than the one joined
            return refuse(
                f"bucket of weight-update group {body.group_name!r}, but this engine is in {sorted(self.groups)}: "
                "a bucket of another generation is refused (each membership forms a new group)"
            )
        if group is None:
            return refuse(f"no weight-update group {body.group_name!r}: init_weights_update_group first")
        memory, scheduler = self.memory, self.scheduler
        if not memory.model.weights_resident:
            return refuse("the model weights are released; resume_memory_occupation(['weights']) first")
        if not len(body.names) == len(body.dtypes) == len(body.shapes):
            return refuse("names, dtypes and shapes must have the same length")
        expected = memory.model.expected_tensors()
        try:
            tensors = {}
            for name, dtype, shape in zip(body.names, body.dtypes, body.shapes, strict=True):
                if name not in expected or tuple(shape) != expected[name]:
                    want = expected.get(name)
                    return refuse(f"tensor {name!r} {shape}: the model has {want if want else 'no such tensor'}")
                tensors[name] = torch.empty(shape, dtype=parse_dtype(dtype))
        except WeightGroupError as exc:
            return refuse(str(exc))
        if body.abort_all_requests:
            scheduler.abort_all("aborted by /update_weights_from_distributed")
        with scheduler.admission_held():
            await scheduler.wait_until(lambda: not scheduler.running or scheduler.paused)
            try:
                await asyncio.to_thread(group.broadcast, list(tensors.values()))
            except WeightGroupError as exc:
                return refuse(f"Failed to update weights: {exc}")
            memory.assign_received(tensors, last=body.weight_version is not None)
            if body.weight_version is not None:
                memory.weight_version = body.weight_version
            if body.flush_cache and memory.kv.resident and not memory.kv.slots_in_use:
                memory.kv.clear()
        return 200, {"success": True, "message": "Succeeded to update parameter online."}

    def get_weights_by_name(self, name: str, truncate_size: int) -> list[Any]:
        params = self.memory.model.checkpoint_tensors()
        if name not in params:
            raise EngineRequestError(400, f"no parameter named {name!r}")
        if not self.memory.model.weights_resident:
            raise EngineRequestError(400, "the model weights are released")
        return list(params[name].detach()[:truncate_size].tolist())

    async def destroy_weights_update_group(self, body: DestroyWeightsUpdateGroupReqInput) -> tuple[int, dict[str, Any]]:
        group = self.groups.pop(body.group_name, None)
        if group is None:
            return 400, {"success": False, "message": f"no weight-update group {body.group_name!r}"}
        await asyncio.to_thread(group.close)
        return 200, {"success": True, "message": f"Succeeded to destroy group {body.group_name!r}."}

    def release_memory_occupation(self, tags: list[str] | None) -> None:
        decoding = 0 if self.scheduler.paused else len(self.scheduler.running)
        self.memory.release(tags, decoding=decoding)

    async def resume_memory_occupation(self, tags: list[str] | None) -> None:
        await self.memory.resume(tags)
        self.scheduler.wake()

    async def flush_cache(self, timeout: float) -> tuple[int, str]:
        """Zero the KV pool once no request holds a slot (waiting up to ``timeout`` seconds)."""
        kv = self.memory.kv
        if not await self.scheduler.wait_until(lambda: not kv.slots_in_use, timeout):
            return 400, (
                f"Cache not flushed: {kv.slots_in_use} requests hold KV cache slots "
                "(running or paused); retry when idle or with a longer ?timeout=.\n"
            )
        kv.clear()
        return 200, "Cache flushed.\n"

    # -- info --------------------------------------------------------------------------------------------
    def model_info(self) -> dict[str, Any]:
        memory = self.memory
        model_path = (
            str(memory.weights_file) if memory.weights_file else f"torch-engine:{memory.model_size}:seed={memory.seed}"
        )
        char = memory.is_char
        architectures = memory.model.hf_config().get("architectures") or []
        return {
            "model_path": model_path,
            # the tokenizer is the model family's: the char model's is built in, a HF model's is its first directory's
            "tokenizer_path": None if char else str(memory.initial_weights),
            "is_generation": True,
            "preferred_sampling_params": None,
            "weight_version": memory.weight_version,
            "load_format": memory.load_format,
            "reasoning_parser": None,
            "tool_call_parser": None,
            "disaggregation_mode": "null",
            "has_image_understanding": False,
            "has_audio_understanding": False,
            "model_type": "tiny_causal_lm" if char else memory.model.model_type,
            "architectures": list(architectures),
            "served_model_name": model_path,
        }

    def server_info(self) -> dict[str, Any]:
        memory, scheduler = self.memory, self.scheduler
        model, kv = memory.model, memory.kv
        weights_bytes = model.weight_bytes
        kv_bytes = kv.nbytes
        gib = float(1 << 30)
        state = {
            "memory_usage": {
                "weight": weights_bytes / gib,
                "kvcache": kv_bytes / gib,
                "token_capacity": kv.num_slots * model.context_length,
                "graph": 0.0,
            },
            "weights_bytes": weights_bytes,
            "kv_cache_bytes": kv_bytes,
            "rss_bytes": rss_bytes(),
            "weights_resident": model.weights_resident,
            "weights_torn": memory.torn,
            "weights_backup_bytes": sum(t.numel() * t.element_size() for t in (memory.backup or {}).values()),
            "weight_groups": sorted(self.groups),
            "kv_cache_resident": kv.resident,
            "paused": scheduler.paused,
            "pause_mode": scheduler.pause_mode,
            "num_running_reqs": len(scheduler.running),
            "num_waiting_reqs": len(scheduler.waiting),
            "kv_slots_in_use": kv.slots_in_use,
            "kv_slots_total": kv.num_slots,
            "num_generated_tokens": scheduler.generated_tokens,
            "num_generate_requests": self.generate_requests,
        }
        info = self.model_info()
        return {
            "model_path": info["model_path"],
            "served_model_name": info["served_model_name"],
            "host": self.host,
            "port": self.port,
            "random_seed": memory.seed,
            "model_size": memory.model_size if memory.is_char else None,
            "context_length": model.context_length,
            "max_running_requests": self.max_running_requests,
            "weight_version": memory.weight_version,
            "weights_file": str(memory.weights_file) if memory.weights_file else None,
            "weights_sha256": memory.weights_sha256,
            "launch_command": " ".join(redacted(sys.argv)),
            "startup_time": self.startup_time,
            "status": self.status,
            "version": ENGINE_VERSION,
            "frontend": "python",
            "internal_states": [state],
        }
