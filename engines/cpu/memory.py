"""The engine's memory: the model and its KV pool, where their weights came from, and what is resident.

Memory is real: releasing swaps every parameter for an empty tensor and drops the KV pool tensors
(``internal_states[0]`` of /server_info reports the bytes held). Resuming weights **re-reads the
last checkpoint directory** (its weights' SHA-256 must match what was loaded) or, if none was ever
loaded, re-creates the seed's initial weights -- so no hidden CPU copy keeps the memory alive.
Weights come only from Hugging Face checkpoint directories, as SGLang's: a loose file is refused.
The model family is the initial directory's (``config.json``'s ``model_type``): the char model of
``--model-size``, or any local transformers causal LM; without a directory, the char model of the seed.
"""

from __future__ import annotations

import asyncio
import math
import os
from collections.abc import Mapping
from pathlib import Path

import torch

from engines.cpu.validation import EngineRequestError
from engines.models import (
    CausalLM,
    KVCache,
    TinyCausalLM,
    WeightsFile,
    WeightsFileError,
    is_char_checkpoint,
    new_causal_lm,
)
from engines.models.checkpoint import read_checkpoint
from engines.protocol import MEMORY_TAGS, TAG_KV_CACHE, TAG_WEIGHTS


def rss_bytes() -> int:
    """Resident set size of this process (0 where /proc is unavailable)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def physical_memory_bytes() -> int:
    """This machine's memory (0 where unknown)."""
    try:
        return int(os.sysconf("SC_PHYS_PAGES")) * int(os.sysconf("SC_PAGE_SIZE"))
    except (OSError, ValueError, AttributeError):
        return 0


class KVPoolTooLarge(Exception):
    """``--max-running-requests`` asks for a KV pool larger than the machine: refused before allocating it."""

    def __init__(self, slots: int, need: int, have: int) -> None:
        gib = float(1 << 30)
        super().__init__(
            f"--max-running-requests {slots}: the KV pool would take {need / gib:.1f} GiB, more than this "
            f"machine's {have / gib:.1f} GiB of memory; Fix: give fewer slots"
        )


class ModelMemory:
    """The model, the KV pool and the weights' provenance (file, SHA-256, format, version label).

    Knows nothing of requests: the caller says how many are decoding when it asks for a release.
    """

    def __init__(
        self,
        *,
        seed: int = 0,
        model_size: str = "tiny",
        weights: str | Path | None = None,
        weight_version: str = "default",
        kv_slots: int = 16,
    ) -> None:
        self.seed = seed
        self.model_size = model_size
        self.initial_weights = Path(weights) if weights is not None else None
        self.weight_version = weight_version
        self.kv_slots = kv_slots
        self._model: CausalLM | None = None
        self._kv: KVCache | None = None
        self.weights_file: Path | None = None
        self.weights_sha256: str | None = None
        self.load_format = "seed-init"
        # weights that came by broadcast have no file to re-read: a release keeps a CPU copy of them
        # (SGLang's --enable-weights-cpu-backup), reported in /server_info
        self.backup: dict[str, torch.Tensor] | None = None
        self.torn = False  # a broadcast update began and did not finish: the weights are a mix of two versions

    @property
    def model(self) -> CausalLM:
        if self._model is None:
            raise RuntimeError("the engine has not loaded its model yet (call load())")
        return self._model

    @property
    def kv(self) -> KVCache:
        if self._kv is None:
            raise RuntimeError("the engine has not loaded its model yet (call load())")
        return self._kv

    def load(self) -> None:
        """Build the model (the family of ``weights``, else the seed's char model), load ``weights`` if given,
        allocate the KV pool (blocking)."""
        model: CausalLM
        if self.initial_weights is None or is_char_checkpoint(self.initial_weights):
            model = TinyCausalLM(self.model_size, seed=self.seed)
        else:
            model = new_causal_lm(self.initial_weights, seed=self.seed)
        if self.initial_weights is not None:
            self._record(model.load_pretrained(self.initial_weights), self.initial_weights)
        kv = model.new_kv_cache(self.kv_slots, allocate=False)
        need, have = 2 * math.prod(kv.shape) * 4, physical_memory_bytes()  # K and V, float32
        if have and need > have:
            raise KVPoolTooLarge(self.kv_slots, need, have)
        kv.allocate()
        self._model = model
        self._kv = kv

    @property
    def is_char(self) -> bool:
        return isinstance(self.model, TinyCausalLM)

    # -- weights files ----------------------------------------------------------------------------
    async def read_weights(self, path: str | Path, load_format: str | None = None) -> WeightsFile:
        """Read and check a checkpoint directory off the event loop (requests keep decoding meanwhile).

        ``load_format`` is SGLang's field; a checkpoint directory's weights are always safetensors."""
        if load_format not in (None, "auto", "safetensors"):
            raise WeightsFileError(path, f"load_format {load_format!r} is not supported (use safetensors or auto)")
        model = self.model
        return await asyncio.to_thread(read_checkpoint, path, model.expected_tensors(), model_type=model.model_type)

    def assign(self, loaded: WeightsFile, source: str | Path) -> None:
        """Swap in checked weights and remember their directory, so that a later resume re-reads it."""
        self.model.assign_weights(loaded.state)
        self._record(loaded, source)

    def _record(self, loaded: WeightsFile, source: str | Path) -> None:
        self.weights_file, self.weights_sha256, self.load_format = Path(source), loaded.sha256, loaded.load_format
        self.torn = False

    @torch.no_grad()
    def assign_received(self, tensors: Mapping[str, torch.Tensor], *, last: bool) -> None:
        """Copy one broadcast bucket into the model as it arrives (as SGLang does: until the last bucket the
        model holds a mix of versions -- ``torn`` -- which is why the lifecycle never routes it then)."""
        params = self.model.checkpoint_tensors()
        for name, tensor in tensors.items():
            params[name].copy_(tensor)
        self.weights_file, self.weights_sha256, self.load_format = None, None, "distributed"
        self.torn = not last

    # -- release / resume ---------------------------------------------------------------------------
    def resident(self) -> dict[str, bool]:
        return {TAG_WEIGHTS: self.model.weights_resident, TAG_KV_CACHE: self.kv.resident}

    def _tags(self, tags: list[str] | None, *, want_resident: bool) -> list[str]:
        unknown = sorted(set(tags or ()) - set(MEMORY_TAGS))
        if unknown:
            raise EngineRequestError(400, f"unknown memory tag(s) {unknown}; known tags: {', '.join(MEMORY_TAGS)}")
        resident = self.resident()
        if tags is None:  # every tag that can be acted on
            chosen = [t for t, held in resident.items() if held == want_resident]
            if not chosen:
                state = "released" if want_resident else "resident"
                raise EngineRequestError(400, f"nothing to do: weights and KV cache are both already {state}")
            return chosen
        for tag in tags:
            if tag in resident and resident[tag] != want_resident:
                state = "released" if want_resident else "resident"
                raise EngineRequestError(400, f"{tag} is already {state}")
        return [t for t in dict.fromkeys(tags) if t in resident]

    def release(self, tags: list[str] | None, *, decoding: int) -> None:
        """Free the tagged memory; ``decoding`` requests (running and not paused) forbid releasing the weights."""
        chosen = self._tags(tags, want_resident=True)
        if TAG_KV_CACHE in chosen and self.kv.slots_in_use:
            raise EngineRequestError(
                400,
                f"cannot release the KV cache: {self.kv.slots_in_use} requests hold KV cache slots (running or "
                "paused in place); pause_generation with mode 'retract' or 'abort', or let them finish, first",
            )
        if TAG_WEIGHTS in chosen and decoding:
            raise EngineRequestError(
                400, f"cannot release the weights: {decoding} requests are decoding; pause_generation first"
            )
        if TAG_WEIGHTS in chosen:
            if self.load_format == "distributed":
                self.backup = {n: p.detach().clone() for n, p in self.model.checkpoint_tensors().items()}
            self.model.release_weights()
        if TAG_KV_CACHE in chosen:
            self.kv.release()
        # no gc.collect(): the dropped tensors' storage is freed by reference counting the moment the last
        # reference goes (tests/engines/cpu: RSS falls with collection disabled), and a full collection here ran
        # on the event loop, in every release request's path (tens of ms with torch loaded)

    async def resume(self, tags: list[str] | None) -> None:
        """Re-allocate the tagged memory; weights come back from their file (unchanged) or the seed."""
        chosen = self._tags(tags, want_resident=False)
        if TAG_WEIGHTS in chosen:
            if self.backup is not None:
                self.model.assign_weights(self.backup)
                self.backup = None
            elif self.weights_file is None:
                self.model.init_weights(self.seed)
            else:
                try:
                    loaded = await self.read_weights(self.weights_file)
                except WeightsFileError as exc:
                    raise EngineRequestError(400, f"cannot restore the released weights: {exc}") from None
                if loaded.sha256 != self.weights_sha256:
                    raise EngineRequestError(
                        400,
                        f"cannot restore the released weights: {self.weights_file} changed since it was loaded "
                        f"(sha256 {self.weights_sha256} -> {loaded.sha256}); load it with update_weights_from_disk",
                    )
                self.model.assign_weights(loaded.state)
        if TAG_KV_CACHE in chosen:
            self.kv.allocate()
