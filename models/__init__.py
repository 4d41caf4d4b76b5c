"""The shared model family: tokenizer, the tiny causal LM, its KV cache, weights files and sampling.

A package of its own because three sides use it: the CPU engine decodes with it, the trainer
trains it, and the rollout side tokenizes (and, train-only, samples) with it. A weights file one
side writes is exactly what another loads. Imports only torch, safetensors, numpy and
``lifecycle.errors``.
"""

from models.config import MODEL_SIZES, ModelConfig, model_config
from models.kv import KVCache
from models.sampling import sample_token
from models.tiny import Block, TinyCausalLM
from models.tokenizer import ALPHABET, BOS_ID, EOS_ID, PAD_ID, SPECIAL_TOKENS, UNK_ID, VOCAB_SIZE, CharTokenizer
from models.weights import LoadFormat, WeightsFile, WeightsFileError, read_weights_file, resolve_weights_path

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
    "CharTokenizer",
    "KVCache",
    "LoadFormat",
    "ModelConfig",
    "TinyCausalLM",
    "WeightsFile",
    "WeightsFileError",
    "model_config",
    "read_weights_file",
    "resolve_weights_path",
    "sample_token",
]
