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
from blocklab.data.tokenizer import BLOCKLAB_SPECIALS, Specials
from blocklab.provenance import digest

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
    specials: Specials = BLOCKLAB_SPECIALS  # the tokenizer's pad / bos / eos / mask ids


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
    """A prepared corpus (built on first use, reused after: data/prepare.py), read by memory
    map as document-aligned pieces or packed windows (data/shards.py)."""
    from blocklab.data.prepare import prepare
    from blocklab.data.shards import Pieces, TokenCorpus, Windows

    prepared = prepare(data, tokenizer)
    corpus = TokenCorpus(prepared.path)
    stream = Windows(corpus, data) if data.packing else Pieces(corpus, data)
    m = prepared.meta
    reading = {k: getattr(data, k) for k in ("seed", "seq_len", "val_fraction", "long_documents",
                                             "packing")}
    described = (f"{m['documents']:,} documents ({m['empty_dropped']} empty dropped, "
                 f"{getattr(stream, 'split_documents', 0)} split, "
                 f"{getattr(stream, 'truncated_documents', 0)} truncated, {m['invalid_utf8']} "
                 f"invalid UTF-8 sequences replaced), {m['tokens']:,} tokens in "
                 f"{stream.pieces:,} {'windows' if data.packing else 'pieces'} "
                 f"(prepared corpus {prepared.path})")
    return Streams(train=stream.train_example, val=stream.val_example,
                   tokenizer=prepared.tokenizer_json, vocab_size=int(m["vocab_size"]),
                   fingerprint=digest({"corpus": prepared.fingerprint, **reading}),
                   description=described, specials=prepared.specials)
