"""Character-level tokenizer over a fixed alphabet (newline + printable ASCII) with PAD/BOS/EOS/UNK.

Fixed so that no vocabulary file travels with the weights: an engine and a trainer that share the
model family share the tokenizer by construction.
"""

from __future__ import annotations

from collections.abc import Sequence

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
        """Ids of ``text``, BOS first (as the engine tokenizes ``/generate``'s ``text``)."""
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


def tokenizer_config() -> str:
    """``tokenizer_config.json`` of a checkpoint directory: the fixed alphabet, so the directory is complete."""
    import json

    return (
        json.dumps(
            {
                "tokenizer_class": "CharTokenizer",
                "alphabet": ALPHABET,
                "special_tokens": list(SPECIAL_TOKENS),
                "bos_token": SPECIAL_TOKENS[BOS_ID],
                "eos_token": SPECIAL_TOKENS[EOS_ID],
                "pad_token": SPECIAL_TOKENS[PAD_ID],
                "unk_token": SPECIAL_TOKENS[UNK_ID],
            },
            indent=2,
        )
        + "\n"
    )
