"""A small causal language model in torch: the CPU engine's model and, later, the trainer's policy.

One class serves both sides so that the weights a trainer writes are exactly what an engine
loads: ``forward(input_ids) -> logits`` (differentiable, for training) and ``prefill`` /
``decode_step`` over a slot-based :class:`KVCache` (for incremental decoding).

* Tokenizer: character level over a fixed alphabet (newline + printable ASCII) with PAD/BOS/EOS/UNK,
  so no vocabulary file travels with the weights.
* Deterministic: parameters are initialised from ``seed`` alone (the global RNG is left alone), so two
  processes with the same seed hold bitwise-identical weights.
* Weights files: written with ``safetensors.torch.save_file`` (or ``torch.save``) and read back with
  safetensors or ``torch.load(weights_only=True)``. Every mismatch is one :class:`WeightsFileError`
  naming the file and the tensor, never a torch traceback, and a failed load changes nothing.
"""

from __future__ import annotations

import hashlib
import io
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import torch
import torch.nn.functional as F  # noqa: N812
from safetensors.torch import load as safetensors_load
from safetensors.torch import save_file
from torch import Tensor, nn

from engines.errors import WeightsFileError

# --------------------------------------------------------------------------------------------
# Tokenizer
# --------------------------------------------------------------------------------------------

PAD_ID, BOS_ID, EOS_ID, UNK_ID = 0, 1, 2, 3
SPECIAL_TOKENS: tuple[str, ...] = ("<pad>", "<bos>", "<eos>", "<unk>")
ALPHABET = "\n" + "".join(chr(c) for c in range(32, 127))
VOCAB_SIZE = len(SPECIAL_TOKENS) + len(ALPHABET)


class CharTokenizer:
    """Character-level tokenizer; characters outside the alphabet become ``<unk>`` (decoded as U+FFFD)."""

    vocab_size = VOCAB_SIZE
    pad_id, bos_id, eos_id, unk_id = PAD_ID, BOS_ID, EOS_ID, UNK_ID

    def __init__(self) -> None:
        self._ids = {ch: i + len(SPECIAL_TOKENS) for i, ch in enumerate(ALPHABET)}

    def encode(self, text: str, *, add_bos: bool = True) -> list[int]:
        ids = [self._ids.get(ch, UNK_ID) for ch in text]
        return [BOS_ID, *ids] if add_bos else ids

    def token_text(self, token_id: int) -> str:
        """The text of one token; special tokens render as their names."""
        if not 0 <= token_id < VOCAB_SIZE:
            raise ValueError(f"token id {token_id} is outside the vocabulary [0, {VOCAB_SIZE})")
        if token_id < len(SPECIAL_TOKENS):
            return SPECIAL_TOKENS[token_id]
        return ALPHABET[token_id - len(SPECIAL_TOKENS)]

    def decode(self, ids: Sequence[int], *, skip_special_tokens: bool = True) -> str:
        out = []
        for token_id in ids:
            if token_id == UNK_ID:
                out.append("\ufffd")
            elif token_id < len(SPECIAL_TOKENS):
                if not skip_special_tokens:
                    out.append(SPECIAL_TOKENS[token_id])
            else:
                out.append(self.token_text(token_id))
        return "".join(out)


# --------------------------------------------------------------------------------------------
# Configuration
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ModelConfig:
    """Architecture of one model size; weights files are only compatible within one config."""

    name: str
    d_model: int
    n_layers: int
    n_heads: int
    max_seq_len: int
    vocab_size: int = VOCAB_SIZE
    mlp_ratio: int = 4

    def __post_init__(self) -> None:
        if self.d_model <= 0 or self.n_layers <= 0 or self.n_heads <= 0 or self.max_seq_len <= 0:
            raise ValueError(f"model config {self.name!r}: sizes must be positive, got {self}")
        if self.d_model % self.n_heads:
            raise ValueError(f"model config {self.name!r}: d_model {self.d_model} is not divisible by n_heads")

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    def describe(self) -> str:
        return (
            f"model size {self.name!r} (d_model={self.d_model}, n_layers={self.n_layers}, "
            f"n_heads={self.n_heads}, max_seq_len={self.max_seq_len}, vocab_size={self.vocab_size})"
        )


MODEL_SIZES: dict[str, ModelConfig] = {
    "tiny": ModelConfig("tiny", d_model=32, n_layers=2, n_heads=2, max_seq_len=256),
    "small": ModelConfig("small", d_model=128, n_layers=4, n_heads=4, max_seq_len=512),
}


def model_config(size: str | ModelConfig) -> ModelConfig:
    if isinstance(size, ModelConfig):
        return size
    try:
        return MODEL_SIZES[size]
    except KeyError:
        raise ValueError(f"unknown model size {size!r}; known sizes: {', '.join(MODEL_SIZES)}") from None


# --------------------------------------------------------------------------------------------
# KV cache
# --------------------------------------------------------------------------------------------


class KVCache:
    """A slot-based KV pool, allocated up front like SGLang's token pool: one slot per running request.

    ``release()`` drops the tensors (their memory is really freed), ``allocate()`` makes fresh zeroed
    ones; slots are handed out lowest-first so that a run is reproducible.
    """

    def __init__(self, config: ModelConfig, num_slots: int, *, allocate: bool = True) -> None:
        if num_slots <= 0:
            raise ValueError(f"a KV cache needs at least one slot, got {num_slots}")
        self.config = config
        self.num_slots = num_slots
        self.shape = (config.n_layers, num_slots, config.n_heads, config.max_seq_len, config.head_dim)
        self.k: Tensor | None = None
        self.v: Tensor | None = None
        self._free = list(range(num_slots))
        if allocate:
            self.allocate()

    @property
    def resident(self) -> bool:
        return self.k is not None

    @property
    def nbytes(self) -> int:
        if self.k is None or self.v is None:
            return 0
        return self.k.numel() * self.k.element_size() + self.v.numel() * self.v.element_size()

    @property
    def slots_in_use(self) -> int:
        return self.num_slots - len(self._free)

    @property
    def free_slots(self) -> int:
        return len(self._free)

    def allocate(self) -> None:
        if self.k is None:
            self.k = torch.zeros(self.shape)
            self.v = torch.zeros(self.shape)

    def release(self) -> None:
        """Free the tensors; every slot must be free (a held slot would lose its request's state)."""
        if self.slots_in_use:
            raise RuntimeError(f"cannot release the KV cache: {self.slots_in_use} slots are in use")
        self.k = None
        self.v = None

    def clear(self) -> None:
        if self.slots_in_use:
            raise RuntimeError(f"cannot clear the KV cache: {self.slots_in_use} slots are in use")
        if self.k is not None and self.v is not None:
            self.k.zero_()
            self.v.zero_()

    def acquire(self) -> int:
        if not self._free:
            raise RuntimeError("no free KV cache slot")
        self._free.sort()
        return self._free.pop(0)

    def free(self, slot: int) -> None:
        if slot in self._free or not 0 <= slot < self.num_slots:
            raise RuntimeError(f"KV cache slot {slot} is not in use")
        self._free.append(slot)

    def _tensors(self) -> tuple[Tensor, Tensor]:
        if self.k is None or self.v is None:
            raise RuntimeError("the KV cache is released")
        return self.k, self.v


# --------------------------------------------------------------------------------------------
# The model
# --------------------------------------------------------------------------------------------


class Block(nn.Module):
    """Pre-LayerNorm transformer block."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        d = config.d_model
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.fc = nn.Linear(d, config.mlp_ratio * d)
        self.out = nn.Linear(config.mlp_ratio * d, d)


LoadFormat = Literal["safetensors", "pt"]


class TinyCausalLM(nn.Module):
    """GPT-style decoder: token + learned position embeddings, pre-LN blocks, untied LM head."""

    def __init__(self, config: str | ModelConfig = "tiny", *, seed: int = 0) -> None:
        super().__init__()
        self.config = model_config(config)
        self.seed = seed
        self.tokenizer = CharTokenizer()
        c = self.config
        self._released_shapes: dict[str, tuple[int, ...]] | None = None
        with torch.random.fork_rng(devices=[]):  # torch's default init must not move the global RNG
            self.tok_emb = nn.Embedding(c.vocab_size, c.d_model)
            self.pos_emb = nn.Embedding(c.max_seq_len, c.d_model)
            self.blocks = nn.ModuleList(Block(c) for _ in range(c.n_layers))
            self.ln_f = nn.LayerNorm(c.d_model)
            self.lm_head = nn.Linear(c.d_model, c.vocab_size)
        self.reset_parameters(seed)

    @torch.no_grad()
    def reset_parameters(self, seed: int) -> None:
        """Deterministic init from ``seed`` only: LayerNorms at identity, biases 0, weights N(0, 0.02)."""
        generator = torch.Generator().manual_seed(seed)
        for name, param in self.named_parameters():
            if name.endswith("bias"):
                param.zero_()
            elif ".ln" in name or name.startswith("ln_"):
                param.fill_(1.0)
            else:
                param.normal_(0.0, 0.02, generator=generator)

    # -- training path --------------------------------------------------------------------------
    def forward(self, input_ids: Tensor) -> Tensor:
        """``[batch, seq]`` token ids -> ``[batch, seq, vocab]`` logits (causal; differentiable)."""
        if input_ids.dim() != 2:
            raise ValueError(f"input_ids must be [batch, seq], got shape {tuple(input_ids.shape)}")
        seq = input_ids.shape[1]
        if seq > self.config.max_seq_len:
            raise ValueError(f"sequence of {seq} tokens exceeds max_seq_len {self.config.max_seq_len}")
        logits: Tensor = self.lm_head(self.ln_f(self._layers(input_ids, cache=None, slot=0, start=0)))
        return logits

    def token_logprobs(self, input_ids: Tensor, *, temperature: float = 1.0) -> Tensor:
        """Log-probability of each next token, ``[batch, seq - 1]``: the trainer's side of the engine's
        ``output_token_logprobs`` (same temperature scaling; ``temperature`` 0 means unscaled)."""
        logits = self.forward(input_ids)[:, :-1]
        if temperature > 0:
            logits = logits / temperature
        return torch.log_softmax(logits.float(), dim=-1).gather(-1, input_ids[:, 1:, None]).squeeze(-1)

    # -- inference path ----------------------------------------------------------------------------
    @torch.no_grad()
    def prefill(self, cache: KVCache, slot: int, token_ids: Sequence[int]) -> Tensor:
        """Run the prompt, writing its keys/values into ``slot``; returns the last position's logits."""
        if not token_ids:
            raise ValueError("cannot prefill an empty prompt")
        ids = torch.tensor([list(token_ids)], dtype=torch.long)
        hidden = self._layers(ids, cache=cache, slot=slot, start=0)
        logits: Tensor = self.lm_head(self.ln_f(hidden[0, -1]))
        return logits

    @torch.no_grad()
    def decode_step(self, cache: KVCache, slot: int, token_id: int, position: int) -> Tensor:
        """Feed one token at ``position`` (keys/values of earlier positions are in ``slot``); returns logits."""
        ids = torch.tensor([[token_id]], dtype=torch.long)
        hidden = self._layers(ids, cache=cache, slot=slot, start=position)
        logits: Tensor = self.lm_head(self.ln_f(hidden[0, -1]))
        return logits

    def _layers(self, ids: Tensor, *, cache: KVCache | None, slot: int, start: int) -> Tensor:
        c = self.config
        batch, seq = ids.shape
        if start + seq > c.max_seq_len:
            raise ValueError(f"position {start + seq - 1} is beyond max_seq_len {c.max_seq_len}")
        x: Tensor = self.tok_emb(ids) + self.pos_emb.weight[start : start + seq]
        for layer, block in enumerate(self.blocks):
            assert isinstance(block, Block)
            qkv = block.qkv(block.ln1(x)).view(batch, seq, 3, c.n_heads, c.head_dim).permute(2, 0, 3, 1, 4)
            q, k, v = qkv[0], qkv[1], qkv[2]
            if cache is None or start == 0:
                if cache is not None:
                    ck, cv = cache._tensors()
                    ck[layer, slot, :, :seq] = k[0]
                    cv[layer, slot, :, :seq] = v[0]
                att = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            else:
                ck, cv = cache._tensors()
                ck[layer, slot, :, start : start + seq] = k[0]
                cv[layer, slot, :, start : start + seq] = v[0]
                keys = ck[layer, slot, :, : start + seq].unsqueeze(0)
                values = cv[layer, slot, :, : start + seq].unsqueeze(0)
                mask = None
                if seq > 1:
                    rows = torch.arange(start, start + seq)[:, None]
                    mask = torch.arange(start + seq)[None, :] <= rows
                att = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask)
            x = x + block.proj(att.transpose(1, 2).reshape(batch, seq, c.d_model))
            x = x + block.out(F.gelu(block.fc(block.ln2(x))))
        return x

    # -- memory ----------------------------------------------------------------------------------------
    @property
    def weights_resident(self) -> bool:
        return self._released_shapes is None

    @property
    def weight_bytes(self) -> int:
        return sum(p.numel() * p.element_size() for p in self.parameters())

    def release_weights(self) -> None:
        """Drop every parameter's storage (each becomes an empty tensor; the shapes are remembered)."""
        if self._released_shapes is not None:
            return
        self._released_shapes = self.expected_tensors()
        for param in self.parameters():
            param.data = torch.empty(0)

    def _reallocate(self) -> None:
        if self._released_shapes is not None:
            for name, param in self.named_parameters():
                param.data = torch.empty(self._released_shapes[name])
            self._released_shapes = None

    def expected_tensors(self) -> dict[str, tuple[int, ...]]:
        """Name -> shape of every tensor a weights file must hold (known even while released)."""
        if self._released_shapes is not None:
            return dict(self._released_shapes)
        return {name: tuple(p.shape) for name, p in self.named_parameters()}

    @torch.no_grad()
    def assign_weights(self, state: Mapping[str, Tensor]) -> None:
        """Copy a state already checked by :func:`read_weights_file` into the model (re-allocating if released)."""
        expected = self.expected_tensors()
        if set(state) != set(expected) or any(tuple(state[n].shape) != s for n, s in expected.items()):
            raise ValueError("assign_weights needs a state checked by read_weights_file for this model")
        self._reallocate()
        for name, param in self.named_parameters():
            param.copy_(state[name])

    # -- weights files -------------------------------------------------------------------------------
    def save_weights(self, path: str | Path, *, load_format: LoadFormat | None = None) -> Path:
        """Write the weights: safetensors unless the suffix is .pt/.pth/.bin (or ``load_format`` says so)."""
        path = Path(path)
        fmt = load_format or ("pt" if path.suffix in (".pt", ".pth", ".bin") else "safetensors")
        state = {name: p.detach().contiguous().clone() for name, p in self.named_parameters()}
        if fmt == "pt":
            torch.save(state, path)
        else:
            save_file(state, str(path), metadata={"model_size": self.config.name, "format": "pt"})
        return path

    def load_weights(self, path: str | Path, *, load_format: str | None = None) -> WeightsFile:
        """Read, check and assign a weights file. Nothing changes on error."""
        weights = read_weights_file(path, self.expected_tensors(), load_format=load_format)
        self.assign_weights(weights.state)
        return weights

    @torch.no_grad()
    def init_weights(self, seed: int) -> None:
        """Re-create the seed's initial weights (re-allocating them if released)."""
        self._reallocate()
        self.reset_parameters(seed)
        self.seed = seed


# --------------------------------------------------------------------------------------------
# Weights files
# --------------------------------------------------------------------------------------------

_WEIGHT_SUFFIXES = (".safetensors", ".pt", ".pth", ".bin")


def resolve_weights_path(path: str | Path) -> Path:
    """A weights file, or a directory holding exactly one (``*.safetensors``, ``*.pt``, ``*.pth``, ``*.bin``)."""
    p = Path(path)
    if p.is_dir():
        found = sorted(f for f in p.iterdir() if f.is_file() and f.suffix in _WEIGHT_SUFFIXES)
        if len(found) != 1:
            names = ", ".join(f.name for f in found) or "none"
            raise WeightsFileError(p, f"a weights directory must hold exactly one weights file; found: {names}")
        return found[0]
    if not p.is_file():
        raise WeightsFileError(p, "no such file or directory")
    return p


@dataclass(frozen=True)
class WeightsFile:
    """A checked weights file: its tensors (float32), the SHA-256 of the bytes they came from, and its format."""

    path: Path
    state: dict[str, Tensor]
    sha256: str
    load_format: LoadFormat


def read_weights_file(
    path: str | Path, expected: Mapping[str, tuple[int, ...]], *, load_format: str | None = None
) -> WeightsFile:
    """Load and check a weights file against ``expected`` (name -> shape).

    The file is read once: the digest and the tensors come from the same bytes. Raises one
    :class:`WeightsFileError` naming the file (and tensor) for: a missing file, an unreadable
    format, missing or unexpected tensors, a wrong shape, a non-float dtype, NaN/inf.
    """
    path = resolve_weights_path(path)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise WeightsFileError(path, f"cannot be read ({exc.strerror or exc})") from None
    fmt: LoadFormat
    if load_format in (None, "auto"):
        fmt = "pt" if data.startswith((b"PK\x03\x04", b"\x80")) else "safetensors"
    elif load_format in ("safetensors", "pt"):
        fmt = "pt" if load_format == "pt" else "safetensors"
    else:
        raise WeightsFileError(path, f"load_format {load_format!r} is not supported (use safetensors, pt or auto)")
    try:
        raw: object = (
            safetensors_load(data) if fmt == "safetensors" else torch.load(io.BytesIO(data), weights_only=True)
        )
    except Exception as exc:  # both readers raise a variety of types for a corrupt file
        reader = "safetensors" if fmt == "safetensors" else "torch.load(weights_only=True)"
        raise WeightsFileError(path, f"cannot be read as {fmt} ({reader}: {type(exc).__name__}: {exc})") from None
    if not isinstance(raw, Mapping) or not all(isinstance(k, str) and isinstance(v, Tensor) for k, v in raw.items()):
        raise WeightsFileError(path, "expected a flat mapping of tensor name -> tensor (a state_dict)")
    missing = sorted(set(expected) - set(raw))
    unexpected = sorted(set(raw) - set(expected))
    if missing or unexpected:
        parts = []
        if missing:
            parts.append(f"missing tensors: {', '.join(missing[:5])}" + (" ..." if len(missing) > 5 else ""))
        if unexpected:
            parts.append(f"unexpected tensors: {', '.join(unexpected[:5])}" + (" ..." if len(unexpected) > 5 else ""))
        raise WeightsFileError(path, "; ".join(parts) + " (not written by this model class?)")
    state: dict[str, Tensor] = {}
    for name, shape in expected.items():
        tensor = raw[name]
        if tuple(tensor.shape) != shape:
            raise WeightsFileError(path, f"shape {tuple(tensor.shape)} does not match the model's {shape}", tensor=name)
        if not tensor.is_floating_point():
            raise WeightsFileError(path, f"dtype {tensor.dtype} is not a floating-point dtype", tensor=name)
        tensor = tensor.to(torch.float32)
        if not bool(torch.isfinite(tensor).all()):
            raise WeightsFileError(path, "contains NaN or inf values", tensor=name)
        state[name] = tensor
    return WeightsFile(path=path, state=state, sha256=hashlib.sha256(data).hexdigest(), load_format=fmt)


# --------------------------------------------------------------------------------------------
# Sampling
# --------------------------------------------------------------------------------------------


def sample_token(
    logits: Tensor,
    *,
    temperature: float,
    top_p: float = 1.0,
    top_k: int = -1,
    generator: torch.Generator | None = None,
    banned: Sequence[int] = (),
) -> tuple[int, float]:
    """Pick the next token; returns ``(token_id, logprob)``.

    ``temperature`` 0 is greedy. The logprob is of the chosen token under ``softmax(logits / T)``
    (``softmax(logits)`` when greedy), before top-k/top-p/banning -- SGLang's default reporting, so
    a trainer can recompute it with :meth:`TinyCausalLM.token_logprobs`.
    """
    logits = logits.float()
    scaled = logits / temperature if temperature > 0 else logits
    logprobs = torch.log_softmax(scaled, dim=-1)
    work = scaled.clone()
    if banned:
        work[list(banned)] = -math.inf
    if temperature <= 0:
        token = int(torch.argmax(work))
        return token, float(logprobs[token])
    if 0 < top_k < work.numel():
        kth = torch.topk(work, top_k).values[-1]
        work[work < kth] = -math.inf
    probs = torch.softmax(work, dim=-1)
    if top_p < 1.0:
        sorted_probs, order = torch.sort(probs, descending=True)
        before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs
        sorted_probs[before >= top_p] = 0.0  # keep the smallest prefix whose mass reaches top_p
        probs = torch.zeros_like(probs).scatter(0, order, sorted_probs)
    token = int(torch.multinomial(probs, 1, generator=generator))
    return token, float(logprobs[token])
