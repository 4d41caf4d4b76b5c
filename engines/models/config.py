"""Model sizes: a weights file is only compatible with the config it was written for."""

from __future__ import annotations

from dataclasses import dataclass

from engines.models.tokenizer import VOCAB_SIZE


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
