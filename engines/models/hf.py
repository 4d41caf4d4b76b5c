"""A local Hugging Face causal LM as a :class:`~engines.models.protocol.CausalLM`: served by the engine, trained
by the trainer.

``transformers`` is imported only when a model of this family is built (``import engines.models`` works
without it; the char model never needs it), and only from local directories (``local_files_only``).

KV handling: the engine's pool is the same preallocated :class:`~engines.models.kv.KVCache` the char model
uses (``[layers, slots, kv_heads, context, head_dim]``), not one growing transformers cache per
request. Memory is then allocated once, reported exactly and released as a whole -- refused while a
slot is held -- as SGLang's token pool is. Each call builds a transformers ``DynamicCache`` from the
slot's keys/values, runs the model, and writes the new positions back; a retracted request that is
prefilled again runs the same operations on the same inputs, so it continues bitwise the same.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from engines.models.checkpoint import (
    CONFIG,
    WEIGHTS,
    CheckpointError,
    checkpoint_config,
    read_checkpoint,
    write_checkpoint,
)
from engines.models.kv import KVCache
from engines.models.weights import WeightsFile, WeightsFileError, read_safetensors_header

INSTALL = "pip install 'rl-lifecycle[hf]'"


def transformers_module(path: str | Path) -> Any:
    """``transformers``, or one error naming the checkpoint that needs it and the install line."""
    try:
        import transformers
    except ImportError:
        raise CheckpointError(
            path, f"is a Hugging Face model directory, which needs transformers (not installed); {INSTALL}"
        ) from None
    return transformers


class HFTokenizer:
    """A transformers tokenizer behind :class:`~engines.models.protocol.Tokenizer` (``encode`` adds its special tokens,
    e.g. BOS, as ``/generate`` on ``text`` does)."""

    def __init__(self, tokenizer: Any) -> None:
        self.hf = tokenizer
        self.vocab_size: int = len(tokenizer)
        self.bos_id: int | None = tokenizer.bos_token_id
        self.eos_id: int | None = tokenizer.eos_token_id
        pad = tokenizer.pad_token_id
        self.pad_id: int = pad if pad is not None else (self.eos_id if self.eos_id is not None else 0)

    @classmethod
    def from_pretrained(cls, directory: str | Path) -> HFTokenizer:
        transformers = transformers_module(directory)
        try:
            tok = transformers.AutoTokenizer.from_pretrained(str(directory), local_files_only=True)
        except (OSError, ValueError, TypeError) as exc:
            raise CheckpointError(directory, f"its tokenizer cannot be loaded ({type(exc).__name__}: {exc})") from None
        return cls(tok)

    def encode(self, text: str) -> list[int]:
        return [int(i) for i in self.hf.encode(text)]

    def decode(self, ids: Sequence[int], *, skip_special_tokens: bool = True) -> str:
        return str(self.hf.decode(list(ids), skip_special_tokens=skip_special_tokens))

    def token_text(self, token_id: int) -> str:
        if not 0 <= token_id < self.vocab_size:
            raise ValueError(f"token id {token_id} is outside the vocabulary [0, {self.vocab_size})")
        return str(self.hf.decode([token_id], skip_special_tokens=False))


@dataclass(frozen=True)
class HFLayout:
    """The KV pool's shape for a transformers config (grouped-query attention: ``n_heads`` is the KV heads')."""

    n_layers: int
    n_heads: int
    max_seq_len: int
    head_dim: int

    @classmethod
    def of(cls, config: Any) -> HFLayout:
        heads = config.num_attention_heads
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
        kv_heads = getattr(config, "num_key_value_heads", None) or heads
        return cls(config.num_hidden_layers, kv_heads, config.max_position_embeddings, head_dim)


def check_tensor_names(path: Path, expected: Mapping[str, tuple[int, ...]]) -> None:
    """Names and shapes from the safetensors header alone (no tensor is read): the cheap half of
    :func:`~engines.models.weights.read_weights_file`'s checks, same messages."""
    header = read_safetensors_header(path)  # bounded: a sparse multi-GB file is refused having read its header
    found = {name: tuple(entry["shape"]) for name, entry in header.items() if name != "__metadata__"}
    missing, unexpected = sorted(set(expected) - set(found)), sorted(set(found) - set(expected))
    if missing or unexpected:
        parts = [f"missing tensors: {', '.join(missing[:5])}"] if missing else []
        parts += [f"unexpected tensors: {', '.join(unexpected[:5])}"] if unexpected else []
        raise WeightsFileError(path, "; ".join(parts) + " (not written for this architecture?)")
    for name, shape in expected.items():
        if found[name] != shape:
            raise WeightsFileError(path, f"shape {found[name]} does not match the model's {shape}", tensor=name)


def _tokenizer_files(directory: Path) -> dict[str, str | bytes]:
    """Every file of a checkpoint but its config and weights: they travel unchanged into the checkpoints we write."""
    return {
        f.name: f.read_bytes()
        for f in sorted(directory.iterdir())
        if f.is_file() and f.name != CONFIG and not f.name.startswith(".") and ".safetensors" not in f.name
    }


class HFCausalLM(nn.Module):
    """A transformers ``AutoModelForCausalLM`` (``self.net``) with its tokenizer, over the engine's KV pool."""

    def __init__(
        self, net: Any, tokenizer: HFTokenizer, config_json: Mapping[str, Any], files: Mapping[str, Any]
    ) -> None:
        super().__init__()
        self.net = net
        self._tokenizer = tokenizer
        self._config_json = dict(config_json)
        self._files = dict(files)
        self.layout = HFLayout.of(net.config)
        self.seed = 0
        self._released_shapes: dict[str, tuple[int, ...]] | None = None
        params = inspect.signature(net.forward).parameters  # transformers 5 renamed past_key_values to cache
        self._cache_kw = "cache" if "cache" in params else "past_key_values"

    @classmethod
    def from_pretrained(cls, directory: str | Path, *, seed: int = 0) -> HFCausalLM:
        """The architecture and tokenizer of ``directory`` with fresh weights from ``seed`` (load_pretrained next)."""
        path = Path(directory)
        config_json = checkpoint_config(path)
        transformers = transformers_module(path)
        try:
            config = transformers.AutoConfig.from_pretrained(str(path), local_files_only=True)
            with torch.device("meta"):  # the tensor names and shapes, before any memory is allocated
                shapes = {
                    n: tuple(p.shape)
                    for n, p in transformers.AutoModelForCausalLM.from_config(config).named_parameters()
                }
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise CheckpointError(
                path / CONFIG, f"is not a causal LM transformers can build ({type(exc).__name__}: {exc})"
            ) from None
        check_tensor_names(path / WEIGHTS, shapes)  # a wrong directory fails here, not after building its model
        tokenizer = HFTokenizer.from_pretrained(path)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            net = transformers.AutoModelForCausalLM.from_config(config)
        net.eval()
        model = cls(net, tokenizer, config_json, _tokenizer_files(path))
        model.seed = seed
        return model

    @property
    def model_type(self) -> str:
        return str(self._config_json.get("model_type"))

    @property
    def tokenizer(self) -> HFTokenizer:
        return self._tokenizer

    @property
    def context_length(self) -> int:
        return self.layout.max_seq_len

    def hf_config(self) -> dict[str, Any]:
        return dict(self._config_json)

    # -- training path --------------------------------------------------------------------------------
    def forward(self, input_ids: Tensor) -> Tensor:
        if input_ids.dim() != 2:
            raise ValueError(f"input_ids must be [batch, seq], got shape {tuple(input_ids.shape)}")
        if input_ids.shape[1] > self.context_length:
            raise ValueError(f"sequence of {input_ids.shape[1]} tokens exceeds the context of {self.context_length}")
        logits: Tensor = self.net(input_ids=input_ids, use_cache=False).logits
        return logits

    def token_logprobs(self, input_ids: Tensor, *, temperature: float = 1.0) -> Tensor:
        """Same scaling as the engine's reported logprobs (``temperature`` 0: unscaled)."""
        logits = self.forward(input_ids)[:, :-1]
        if temperature > 0:
            logits = logits / temperature
        return torch.log_softmax(logits.float(), dim=-1).gather(-1, input_ids[:, 1:, None]).squeeze(-1)

    # -- inference path ----------------------------------------------------------------------------------
    def new_kv_cache(self, num_slots: int, *, allocate: bool = True) -> KVCache:
        return KVCache(self.layout, num_slots, allocate=allocate)

    @torch.no_grad()
    def prefill(self, cache: KVCache, slot: int, token_ids: Sequence[int]) -> Tensor:
        if not token_ids:
            raise ValueError("cannot prefill an empty prompt")
        return self._run(cache, slot, list(token_ids), 0)

    @torch.no_grad()
    def decode_step(self, cache: KVCache, slot: int, token_id: int, position: int) -> Tensor:
        return self._run(cache, slot, [token_id], position)

    def _run(self, cache: KVCache, slot: int, ids: list[int], start: int) -> Tensor:
        end = start + len(ids)
        if end > self.context_length:
            raise ValueError(f"position {end - 1} is beyond the context of {self.context_length}")
        from transformers import DynamicCache  # imported already: the model was built by transformers

        ck, cv = cache._tensors()
        past = (
            None
            if start == 0
            else [(ck[i, slot, :, :start][None], cv[i, slot, :, :start][None]) for i in range(ck.shape[0])]
        )
        kv: Any = DynamicCache(ddp_cache_data=past) if past is not None else DynamicCache()
        out = self.net(
            input_ids=torch.tensor([ids], dtype=torch.long),
            position_ids=torch.arange(start, end)[None],
            use_cache=True,
            **{self._cache_kw: kv},
        )
        for i, layer in enumerate(kv.layers):
            ck[i, slot, :, start:end] = layer.keys[0, :, start:end]
            cv[i, slot, :, start:end] = layer.values[0, :, start:end]
        logits: Tensor = out.logits[0, -1]
        return logits

    # -- memory ------------------------------------------------------------------------------------------
    @property
    def weights_resident(self) -> bool:
        return self._released_shapes is None

    @property
    def weight_bytes(self) -> int:
        return sum(p.numel() * p.element_size() for p in self.net.parameters())

    def release_weights(self) -> None:
        if self._released_shapes is not None:
            return
        self._released_shapes = self.expected_tensors()
        for param in self.net.parameters():
            param.data = torch.empty(0)

    def reallocate_weights(self) -> None:
        if self._released_shapes is not None:
            for name, param in self.net.named_parameters():
                param.data = torch.empty(self._released_shapes[name])
            self._released_shapes = None

    def checkpoint_tensors(self) -> dict[str, nn.Parameter]:
        return dict(self.net.named_parameters())  # transformers' names, tied weights once

    def expected_tensors(self) -> dict[str, tuple[int, ...]]:
        """The checkpoint's tensor names (transformers' own: ``model.layers.0...``; tied weights once)."""
        if self._released_shapes is not None:
            return dict(self._released_shapes)
        return {name: tuple(p.shape) for name, p in self.net.named_parameters()}

    @torch.no_grad()
    def assign_weights(self, state: Mapping[str, Tensor]) -> None:
        expected = self.expected_tensors()
        if set(state) != set(expected) or any(tuple(state[n].shape) != s for n, s in expected.items()):
            raise ValueError("assign_weights needs a state checked by read_checkpoint for this model")
        self.reallocate_weights()
        for name, param in self.net.named_parameters():
            param.copy_(state[name])

    @torch.no_grad()
    def init_weights(self, seed: int) -> None:
        """The architecture's own random init from ``seed`` (the global RNG is left alone)."""
        transformers = transformers_module("<model>")
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            fresh = transformers.AutoModelForCausalLM.from_config(self.net.config)
        self.assign_weights(dict(fresh.named_parameters()))
        self.seed = seed

    # -- checkpoint directories ------------------------------------------------------------------------------
    def save_pretrained(self, directory: str | Path) -> Path:
        """A real Hugging Face directory (loadable by ``AutoModelForCausalLM.from_pretrained``), written atomically:
        the config and tokenizer files it was loaded from, the current weights."""
        state = {name: p.detach().contiguous().clone() for name, p in self.net.named_parameters()}
        return write_checkpoint(directory, state, self._config_json, self._files)

    def load_pretrained(self, directory: str | Path) -> WeightsFile:
        """Read, check (names, shapes, finite) and assign a directory of this architecture. Nothing changes on error."""
        weights = read_checkpoint(directory, self.expected_tensors(), model_type=self.model_type)
        self.assign_weights(weights.state)
        return weights
