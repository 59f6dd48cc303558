"""Tokenizers saved with every run: the synthetic task vocabulary, or a HF ``tokenizers`` model
(byte-level BPE trained on the corpus, raw bytes, or a given tokenizer.json)."""

from __future__ import annotations

import json
from typing import Any

from blocklab.data.synthetic import Vocab


def tokenizer_from_json(text: str) -> Any:
    """A tokenizer from its saved JSON: a :class:`Vocab` for synthetic tasks, else a
    ``tokenizers.Tokenizer``."""
    spec = json.loads(text)
    if spec.get("kind") == "synthetic":
        return Vocab(n_filler=spec["n_filler"], n_keys=spec["n_keys"], n_values=spec["n_values"])
    from tokenizers import Tokenizer

    tok = Tokenizer.from_str(text)
    tok.encode_special_tokens = True  # not serialized; see data/text.py build_tokenizer
    return tok
