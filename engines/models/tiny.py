"""A small causal language model in torch: the CPU engine's model and the trainer's policy.

One class serves both sides so that the weights a trainer writes are exactly what an engine
loads: ``forward(input_ids) -> logits`` (differentiable, for training) and ``prefill`` /
``decode_step`` over a slot-based :class:`~engines.models.kv.KVCache` (for incremental decoding).
Parameters are initialised from ``seed`` alone (the global RNG is left alone), so two processes
with the same seed hold bitwise-identical weights.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F  # noqa: N812
from safetensors.torch import save_file
from torch import Tensor, nn

from engines.models.checkpoint import read_checkpoint, write_checkpoint
from engines.models.config import ModelConfig, model_config
from engines.models.kv import KVCache
from engines.models.tokenizer import BOS_ID, EOS_ID, PAD_ID, CharTokenizer, tokenizer_config
from engines.models.weights import LoadFormat, WeightsFile, read_weights_file

MODEL_TYPE = "rl-lifecycle-char"  # config.json's model_type: the checkpoints this class reads


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


class TinyCausalLM(nn.Module):
    """GPT-style decoder: token + learned position embeddings, pre-LN blocks, untied LM head."""

    model_type = MODEL_TYPE

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

    @property
    def context_length(self) -> int:
        return self.config.max_seq_len

    def new_kv_cache(self, num_slots: int, *, allocate: bool = True) -> KVCache:
        return KVCache(self.config, num_slots, allocate=allocate)

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

    def reallocate_weights(self) -> None:
        self._reallocate()

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

    def checkpoint_tensors(self) -> dict[str, nn.Parameter]:
        return dict(self.named_parameters())

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

    # -- Hugging Face checkpoint directories ------------------------------------------------------
    def hf_config(self) -> dict[str, Any]:
        """``config.json``: the architecture, so a directory says which model it was written for."""
        c = self.config
        return {
            "architectures": ["TinyCausalLM"],
            "model_type": MODEL_TYPE,
            "model_size": c.name,
            "hidden_size": c.d_model,
            "num_hidden_layers": c.n_layers,
            "num_attention_heads": c.n_heads,
            "max_position_embeddings": c.max_seq_len,
            "vocab_size": c.vocab_size,
            "intermediate_size": c.mlp_ratio * c.d_model,
            "torch_dtype": "float32",
            "bos_token_id": BOS_ID,
            "eos_token_id": EOS_ID,
            "pad_token_id": PAD_ID,
        }

    def save_pretrained(self, directory: str | Path) -> Path:
        """Write a checkpoint directory (atomically: see :func:`engines.models.checkpoint.write_checkpoint`)."""
        state = {name: p.detach().contiguous().clone() for name, p in self.named_parameters()}
        return write_checkpoint(directory, state, self.hf_config(), {"tokenizer_config.json": tokenizer_config()})

    def load_pretrained(self, directory: str | Path) -> WeightsFile:
        """Read, check and assign a checkpoint directory written for this model. Nothing changes on error."""
        weights = read_checkpoint(directory, self.expected_tensors(), model_type=MODEL_TYPE)
        self.assign_weights(weights.state)
        return weights

    @torch.no_grad()
    def init_weights(self, seed: int) -> None:
        """Re-create the seed's initial weights (re-allocating them if released)."""
        self._reallocate()
        self.reset_parameters(seed)
        self.seed = seed
