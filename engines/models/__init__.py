"""The shared model family: tokenizer, the tiny causal LM, its KV cache, weights files and sampling.

A package of its own because three sides use it: the CPU engine decodes with it, the trainer
trains it, and the rollout side tokenizes (and, train-only, samples) with it. A weights file one
side writes is exactly what another loads. Imports only torch, safetensors, numpy and
``lifecycle.decide.errors``; the Hugging Face family (:mod:`engines.models.hf`, :func:`build_tiny_llama`) imports
``transformers`` and ``tokenizers`` only when used (``pip install 'rl-lifecycle[hf]'``).
"""

from engines.models.checkpoint import CheckpointError
from engines.models.config import MODEL_SIZES, ModelConfig, model_config
from engines.models.family import (
    checkpoint_model_type,
    is_char_checkpoint,
    load_causal_lm,
    load_tokenizer,
    new_causal_lm,
)
from engines.models.kv import KVCache
from engines.models.protocol import CausalLM, Tokenizer
from engines.models.sampling import sample_token
from engines.models.tiny import Block, TinyCausalLM
from engines.models.tiny_llama import build_tiny_llama
from engines.models.tokenizer import ALPHABET, BOS_ID, EOS_ID, PAD_ID, SPECIAL_TOKENS, UNK_ID, VOCAB_SIZE, CharTokenizer
from engines.models.weights import LoadFormat, WeightsFile, WeightsFileError, read_weights_file, resolve_weights_path

__all__ = [
    "ALPHABET",
    "BOS_ID",
    "EOS_ID",
    "MODEL_SIZES",
    "PAD_ID",
    "SPECIAL_TOKENS",
    "UNK_ID",
    "VOCAB_SIZE",
    "Block",
    "CausalLM",
    "CharTokenizer",
    "CheckpointError",
    "KVCache",
    "LoadFormat",
    "ModelConfig",
    "TinyCausalLM",
    "Tokenizer",
    "WeightsFile",
    "WeightsFileError",
    "build_tiny_llama",
    "checkpoint_model_type",
    "is_char_checkpoint",
    "load_causal_lm",
    "load_tokenizer",
    "model_config",
    "new_causal_lm",
    "read_weights_file",
    "resolve_weights_path",
    "sample_token",
]
