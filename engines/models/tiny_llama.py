"""A tiny random-initialised Llama and a tokenizer trained here: a real Hugging Face model, built offline.

``lifecycle run --model tiny-llama`` trains it. Nothing comes from a hub: the tokenizer is a BPE trained
with ``tokenizers`` on a corpus generated from the task's alphabet (lowercase letters and ':', the
char model's printable ASCII as the base alphabet), the model is ``LlamaForCausalLM`` initialised from
the seed. The same seed writes bitwise the same files.
"""

from __future__ import annotations

import json
import random
import string
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from engines.models.checkpoint import write_checkpoint
from engines.models.hf import transformers_module
from engines.models.tokenizer import ALPHABET, SPECIAL_TOKENS

PAD, BOS, EOS, UNK = SPECIAL_TOKENS  # ids 0..3, as the char model's


def _corpus(seed: int, lines: int) -> Iterator[str]:
    """Prompts (4 letters + ':') and pattern-like answers (two letters repeated), from ``seed``."""
    rng = random.Random(seed)
    letters = string.ascii_lowercase
    for _ in range(lines):
        yield "".join(rng.choice(letters) for _ in range(4)) + ":"
        a, b = rng.sample(letters, 2)
        yield (a + b) * 4


def train_tokenizer(*, seed: int = 0, vocab_size: int = 128, context: int = 128) -> dict[str, str]:
    """``tokenizer.json`` and ``tokenizer_config.json``: BPE over the char model's alphabet plus merges of the
    corpus, BOS added on encode (by the tokenizer's post-processor, so every loader adds it the same way)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE(unk_token=UNK))
    tok.pre_tokenizer = pre_tokenizers.Split(":", behavior="isolated")  # no merge spans the prompt's end
    tok.decoder = decoders.Fuse()  # tokens join without spaces
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=list(SPECIAL_TOKENS), initial_alphabet=list(ALPHABET), show_progress=False
    )
    tok.train_from_iterator(_corpus(seed, 2000), trainer=trainer)
    bos = tok.token_to_id(BOS)
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, bos)]
    )
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS,
        "eos_token": EOS,
        "pad_token": PAD,
        "unk_token": UNK,
        "model_max_length": context,
        "clean_up_tokenization_spaces": False,
    }
    return {
        "tokenizer.json": tok.to_str(),
        "tokenizer_config.json": json.dumps(config, indent=2, sort_keys=True) + "\n",
    }


def tiny_llama_config(vocab_size: int, **sizes: int) -> dict[str, Any]:
    """The ``LlamaConfig`` keyword arguments of the tiny model (``sizes`` override the defaults)."""
    values = {
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 128,
        **sizes,
    }
    return {
        **values,
        "vocab_size": vocab_size,
        "pad_token_id": SPECIAL_TOKENS.index(PAD),
        "bos_token_id": SPECIAL_TOKENS.index(BOS),
        "eos_token_id": SPECIAL_TOKENS.index(EOS),
        "tie_word_embeddings": False,
        "architectures": ["LlamaForCausalLM"],
    }


def build_tiny_llama(directory: str | Path, *, seed: int = 0, vocab_size: int = 128, **sizes: int) -> Path:
    """Write a tiny random-init ``LlamaForCausalLM`` and its trained tokenizer as a checkpoint directory.

    Loadable offline by ``AutoModelForCausalLM.from_pretrained`` / ``AutoTokenizer.from_pretrained`` and by
    :func:`engines.models.load_causal_lm`; written atomically (:func:`engines.models.checkpoint.write_checkpoint`).
    ``sizes``: ``hidden_size``, ``intermediate_size``, ``num_hidden_layers``, ``num_attention_heads``,
    ``num_key_value_heads``, ``max_position_embeddings``.
    """
    transformers = transformers_module(directory)
    config_kwargs = tiny_llama_config(vocab_size, **sizes)
    files = train_tokenizer(seed=seed, vocab_size=vocab_size, context=config_kwargs["max_position_embeddings"])
    vocab = len(json.loads(files["tokenizer.json"])["model"]["vocab"])
    if vocab != vocab_size:  # a corpus too small for the merges asked for
        raise ValueError(f"the tokenizer trained {vocab} tokens, not vocab_size {vocab_size}; lower vocab_size")
    config = transformers.LlamaConfig(**config_kwargs)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        net = transformers.LlamaForCausalLM(config)
    state = {name: p.detach().contiguous().clone() for name, p in net.named_parameters()}
    return write_checkpoint(directory, state, json.loads(config.to_json_string(use_diff=False)), files)
