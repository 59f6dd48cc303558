"""The data a run trains and validates on, as one typed object: :func:`build_streams`.

Training, ``blocklab-eval`` (validation loss from a checkpoint alone) and the probe builders all
get their examples, tokenizer and fingerprint here, so the stream a checkpoint is evaluated on
is the stream it was trained on. A stream is a pure function ``example(index, step)`` of the
data config: exact resume needs only the number of examples consumed.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from blocklab.config import ConfigError, DataConfig, DataName, TokenizerConfig, TokenizerName
from blocklab.data.synthetic import Example
from blocklab.data.tokenizer import BLOCKLAB_SPECIALS, Specials
from blocklab.provenance import digest

if TYPE_CHECKING:
    import numpy as np

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
    val_examples: int | None = None  # distinct validation examples (text; None: endless)
    train_examples: int | None = None  # distinct training examples, one epoch (text)
    # every training example's tokens as the rows of one array (packed text), else None
    train_rows: Callable[[], np.ndarray] | None = None
    # the validation text as whole documents (token arrays as prepared: ``bos ids eos``, a
    # document cut by the split from its cut), in corpus order (text; None: synthetic)
    val_documents: Callable[[], list[np.ndarray]] | None = None


def build_streams(data: DataConfig, tokenizer: TokenizerConfig, *, bptt: int = 1) -> Streams:
    """The streams of ``data`` tokenized by ``tokenizer`` (validates both first); ``bptt``
    (``trainer.bptt``) is the number of segments per row of ``data.segment_mode=stream``."""
    if data.name is DataName.text:
        return _text(data, tokenizer, bptt)
    if data.name is DataName.babilong:  # bAbI stories hidden in real text
        from blocklab.config import validate_data
        from blocklab.data.babilong_train import babilong_streams

        return Streams(**babilong_streams(validate_data(data, tokenizer), tokenizer))
    if tokenizer.name is not TokenizerName.synthetic:
        raise ConfigError(f"config error: tokenizer.name={tokenizer.name.value!r}: synthetic "
                          "data uses tokenizer=synthetic")
    from blocklab.data.mixture import Mixture

    train = Mixture(data, salt="train")
    val = Mixture(data, salt="val", only=list(data.val_tasks), length=data.val_len)
    return Streams(train=train, val=lambda i, step=None: val(i, None),
                   tokenizer=json.dumps(train.vocab.to_dict(), sort_keys=True),
                   vocab_size=train.vocab.size, fingerprint=train.fingerprint())


def _text(data: DataConfig, tokenizer: TokenizerConfig, bptt: int = 1) -> Streams:
    """A prepared corpus (built on first use, reused after: data/prepare.py), read by memory
    map as document-aligned pieces or packed windows (data/shards.py); validated on a
    validation source of its own or on a held-out part (data/splits.py)."""
    from blocklab.data.prepare import prepare
    from blocklab.data.shards import TokenCorpus
    from blocklab.data.splits import from_source, held_out, validation_source

    prepared = prepare(data, tokenizer)
    corpus = TokenCorpus(prepared.path)
    source, note = validation_source(data)
    if source is None:
        split = held_out(corpus, data)
        identity = {"val_fraction": data.val_fraction}
        if split.rule != "documents":  # the rule that held out before any other existed
            identity["val_rule"] = split.rule
    else:
        val = prepare(source, tokenizer, like=prepared, key=_key(data))
        split = from_source(corpus, TokenCorpus(val.path), f"{note} (prepared corpus {val.path})")
        identity, note = {"val": val.fingerprint}, ""
    return _streams(data, prepared, corpus, split, identity, note, bptt=bptt)


def _key(data: DataConfig) -> str:
    """The config key that names the validation source (for errors about its files)."""
    return "data.val_files" if data.val_files else "data.val_split"


def _streams(data: DataConfig, prepared, corpus, split, identity: dict, note: str = "",
             *, train: bool = True, bptt: int = 1) -> Streams:
    """The streams over ``split`` of ``corpus``, described (the summary line) and identified
    (``identity``: what decided the validation part). ``data.segment_mode``: stream reads
    lanes (data/lanes.py), split reads pieces of up to ``data.doc_len`` tokens (documents)."""
    from blocklab.data.lanes import Lanes
    from blocklab.data.shards import Pieces, Windows

    mode = data.segment_mode
    if mode == "stream":
        stream = Lanes(corpus, data, split, bptt=bptt, train=train)
    elif mode == "split":  # one document (piece) of <= doc_len tokens an example
        wide = dataclasses.replace(data, seq_len=data.doc_len or data.seq_len)
        stream = Pieces(corpus, wide, split, train=train)
    else:
        stream = (Windows if data.packing else Pieces)(corpus, data, split, train=train)
    m = prepared.meta
    reading = {k: getattr(data, k) for k in ("seed", "seq_len", "long_documents", "packing")}
    if mode != "none":  # only then: an unchanged run keeps its fingerprint
        reading["segment_mode"] = mode
        reading.update({"doc_len": data.doc_len} if data.doc_len is not None else {})
        reading.update({"bptt": bptt} if mode == "stream" and bptt != 1 else {})
    kind = {"stream": "lane rows", "split": "documents"}.get(
        mode, "windows" if data.packing else "pieces")
    described = (f"{m['documents']:,} documents ({m['empty_dropped']} empty dropped, "
                 f"{getattr(stream, 'split_documents', 0)} split, "
                 f"{getattr(stream, 'truncated_documents', 0)} truncated, {m['invalid_utf8']} "
                 f"invalid UTF-8 sequences replaced), {m['tokens']:,} tokens in "
                 f"{stream.pieces:,} {kind} "
                 f"(prepared corpus {prepared.path}); validation: {split.how}"
                 + (f" ({note})" if note else ""))
    return Streams(train=stream.train_example, val=stream.val_example,
                   tokenizer=prepared.tokenizer_json, vocab_size=int(m["vocab_size"]),
                   fingerprint=digest({"corpus": prepared.fingerprint, **reading, **identity}),
                   description=described, specials=prepared.specials,
                   val_examples=stream.val_examples,
                   train_examples=stream.pieces - stream.val_examples,
                   train_rows=getattr(stream, "train_rows", None),
                   val_documents=lambda: split.val.documents())


def build_eval_streams(data: DataConfig, tokenizer: TokenizerConfig, *, bptt: int = 1
                       ) -> Streams:
    """An evaluation corpus: every document of ``data``'s validation source where it names one
    (``val_files``, ``val_split``), else of its sources, as the validation stream (nothing
    trains); the tokenizer is ``tokenizer`` (``blocklab-eval``: the checkpoint's own)."""
    from blocklab.data.prepare import prepare
    from blocklab.data.shards import TokenCorpus
    from blocklab.data.splits import everything, named_sources, validation_source

    source, what = validation_source(data)
    prepared = prepare(source or data, tokenizer,
                       key=_key(data) if source is not None else "data.files")
    corpus = TokenCorpus(prepared.path)
    split = everything(corpus, what if source is not None else named_sources(data))
    return _streams(data, prepared, corpus, split, {"eval": "all"}, train=False, bptt=bptt)
