"""The data a run trains and validates on, as one typed object: :func:`build_streams`.

Training, ``blocklab-eval`` (validation loss from a checkpoint alone) and the probe builders all
get their examples, tokenizer and fingerprint here, so the stream a checkpoint is evaluated on
is the stream it was trained on. A stream is a pure function ``example(index, step)`` of the
data config: exact resume needs only the number of examples consumed.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass

from blocklab.config import ConfigError, DataConfig, DataName, TokenizerConfig, TokenizerName
from blocklab.data.synthetic import Example

ExampleFn = Callable[[int, "int | None"], Example]


@dataclass(frozen=True)
class Streams:
    """Training and validation examples of one data config, and what identifies them."""

    train: ExampleFn  # example(index, step): the step drives the length curriculum
    val: ExampleFn  # a disjoint stream (another salt / held-out pieces)
    tokenizer: str  # the tokenizer as JSON (the synthetic vocabulary or a HF tokenizers model)
    vocab_size: int
    fingerprint: str  # same fingerprint, same examples
    description: str | None = None  # what loading found (text data: documents, tokens, ...)


def build_streams(data: DataConfig, tokenizer: TokenizerConfig) -> Streams:
    """The streams of ``data`` tokenized by ``tokenizer`` (validates both first)."""
    if data.name is DataName.text:
        return _text(data, tokenizer)
    if tokenizer.name is not TokenizerName.synthetic:
        raise ConfigError(f"config error: tokenizer.name={tokenizer.name.value!r}: synthetic "
                          "data uses tokenizer=synthetic")
    from blocklab.data.mixture import Mixture

    train, val = Mixture(data, salt="train"), Mixture(data, salt="val")
    return Streams(train=train, val=lambda i, step=None: val(i, None),
                   tokenizer=json.dumps(train.vocab.to_dict(), sort_keys=True),
                   vocab_size=train.vocab.size, fingerprint=train.fingerprint())


def _text(data: DataConfig, tokenizer: TokenizerConfig) -> Streams:
    from tokenizers import Tokenizer

    from blocklab.data.text import text_data

    train, val, tok_json, fingerprint, stats = text_data(data, tokenizer)
    described = (f"{stats.documents} documents ({stats.empty_dropped} empty dropped, "
                 f"{stats.split_documents} split, {stats.truncated_documents} truncated, "
                 f"{stats.invalid_utf8} invalid UTF-8 sequences replaced), "
                 f"{stats.tokens:,} tokens in {stats.pieces} pieces")
    return Streams(train=train, val=val, tokenizer=tok_json,
                   vocab_size=Tokenizer.from_str(tok_json).get_vocab_size(),
                   fingerprint=fingerprint, description=described)
