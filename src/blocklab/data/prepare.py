"""Prepare once, train many times: text sources -> memory-mapped token shards on disk.

A prepared corpus is a directory ``<cache>/<fingerprint>/`` holding, per work item of the
sources (data/sources.py), ``tokens-NNNNN.bin`` — the documents' token ids, each document
``bos ids eos``, as one flat array of the smallest unsigned dtype that fits the vocabulary
(``numpy.memmap``-able) — and ``docs-NNNNN.npy`` (the documents' lengths), plus
``tokenizer.json``, ``meta.json`` (counts, dtype, specials, what was prepared from what) and
``manifest.json`` (sha256 and size of every file, written last).

Why flat arrays and not a ``datasets`` Arrow cache: training reads random windows across
document boundaries, which is a slice of one flat array (as nanoGPT's and OLMo's prepared token
files); the documents' lengths give the boundaries. numpy's memmap reads them lazily, so a
training run's memory does not grow with the corpus. Reading the sources, by contrast, uses the
ecosystem's readers (``datasets``/``pyarrow`` for Parquet, saved and hub datasets).

- **Keyed by a fingerprint** of the sources (each file's name, size and modification time —
  ``data.fingerprint=stat``, like make and rsync — or its content hash, ``content``), the
  tokenizer and every data field that changes tokens. A second run with the same fingerprint
  reuses the shards without reading the text again.
- **Streaming and parallel:** work items are bounded in size; ``data.num_proc`` worker
  processes (every core, at most 8, by default) tokenize them with the tokenizer's
  ``encode_batch_fast`` and write shards as they go, in batches of bounded size: a long
  document arrives in pieces cut before a word (data/plaintext.py), so neither its text nor
  its ids are ever held whole. Progress shows MB/s and tokens/s.
- **Atomic and safe to share:** everything is written into a temporary sibling and renamed
  into place after the manifest; a killed preparation leaves nothing a later run would use,
  and the next preparation removes what it left (a temporary whose lock nobody holds:
  data/cache.py). Processes preparing the same fingerprint at once (DDP ranks, parallel sweep jobs) take turns
  on a file lock: one prepares, the others then reuse it. Before a run uses a prepared corpus,
  the manifest is checked (sizes and sha256): a changed shard is set aside and rebuilt.
- **The BPE tokenizer** is trained on a seeded sample of at most ``tokenizer.sample_bytes``
  of the sources, streamed, and cached the same way; it says how far it has got, also without
  a terminal (data/tokenizer.py).
"""

from __future__ import annotations

import itertools
import json
import os
import random
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from blocklab.config import DataConfig, TokenizerConfig, TokenizerName
from blocklab.data.cache import locked, sweep, verify, write_synced
from blocklab.data.sources import ReadStats, WorkItem, plan, read_pieces, resolve_files
from blocklab.data.tokenizer import (
    BLOCKLAB_SPECIALS,
    Specials,
    byte_tokenizer,
    char_tokenizer,
    load_user_tokenizer,
    train_bpe,
)
from blocklab.data.workers import BATCH_CHARS, Task, processes_default, tokenize_items  # noqa: F401
from blocklab.errors import DataError
from blocklab.faults import maybe_fault
from blocklab.files import set_aside, sha256_file, write_dir_atomic
from blocklab.provenance import digest

CACHE_ENV = "BLOCKLAB_DATA_CACHE"
DEFAULT_CACHE = "outputs/.cache/data"
FORMAT = 2  # 2: CRLF and lone-CR line ends read as LF
BINARY_FRACTION = 0.01  # invalid UTF-8 sequences per byte above which a file is called out
# Fields that change the tokens of a prepared corpus (the rest — seq_len, split, batching —
# only change how training reads it).
TOKEN_FIELDS = ("format", "text_key", "documents", "utf8_errors", "corpus", "hub_dataset",
                "hub_split")


@dataclass(frozen=True)
class Prepared:
    """A prepared corpus: where it is and what it holds."""

    path: Path
    fingerprint: str
    tokenizer_json: str
    specials: Specials
    meta: dict[str, Any]


def processes(data: DataConfig) -> int:
    return data.num_proc or processes_default()


def cache_root(data: DataConfig) -> Path:
    return Path(data.cache_dir or os.environ.get(CACHE_ENV) or DEFAULT_CACHE)


def prepare(data: DataConfig, tok_cfg: TokenizerConfig, *, log=None, like: Prepared | None = None,
            key: str = "data.files") -> Prepared:
    """The prepared corpus of ``data`` tokenized by ``tok_cfg`` — or, given ``like`` (another
    prepared corpus: the training corpus of a validation source), by ``like``'s tokenizer and
    special ids: reused when its fingerprint is on disk and verifies, built otherwise. ``key``
    is the config key errors about the sources name."""
    log = log or _stderr
    files = [] if data.hub_dataset else resolve_files(data, key)
    items = plan(data, files, processes(data))
    root = cache_root(data)
    sweep(root)
    source_fp = sources_fingerprint(data, files)
    if like is not None:
        from blocklab.data.tokenizer import tokenizer_from_json

        tok, specials, notes = tokenizer_from_json(like.tokenizer_json), like.specials, []
    else:
        tok, specials, notes = tokenizer_for(data, tok_cfg, items, source_fp, root, log)
    for note in notes:
        log(note)
    tok_json = tok.to_str()
    fingerprint = digest({"format": FORMAT, "sources": source_fp, "tokenizer": digest(tok_json),
                          "specials": specials.to_dict()})
    final = root / fingerprint
    with locked(root, fingerprint):
        if final.is_dir():
            problem = verify(final)
            if problem is None:
                return _load(final, fingerprint)
            aside = set_aside(final)
            log(f"warning: prepared corpus {final}: {problem}; kept as {aside.name}, "
                "preparing it again")
        _build(final, items, data, tok, specials, log, key)
    return _load(final, fingerprint)


def sources_fingerprint(data: DataConfig, files: list[Path]) -> str:
    """Identifies the sources and the reading settings (not the tokenizer). ``hub_split`` only
    where it picks the rows (a hub dataset, a saved DatasetDict): elsewhere it reads as its
    default, so it cannot change the fingerprint of files that have no splits."""
    fields = {k: getattr(data, k) for k in TOKEN_FIELDS}
    if not (data.hub_dataset or (data.format == "disk" and not data.corpus)):
        fields["hub_split"] = "train"
    if data.fingerprint == "content":
        listing = [(str(f.resolve()), sha256_file(f)) for f in files]
    else:
        listing = [(str(f.resolve()), f.stat().st_size, f.stat().st_mtime_ns) for f in files]
    return digest({"fields": fields, "files": listing})


# --------------------------------------------------------------------------------- tokenizer


def tokenizer_for(data: DataConfig, cfg: TokenizerConfig, items: list[WorkItem],
                  source_fp: str, root: Path, log) -> tuple[Any, Specials, list[str]]:
    """(tokenizer, specials, notes). A BPE or a character vocabulary is built once per
    (sources, settings) from a seeded sample and cached under ``<cache>/tokenizers/``."""
    name = cfg.name
    if name is TokenizerName.file:
        return load_user_tokenizer(cfg.path)
    if name is TokenizerName.byte:
        return byte_tokenizer(), BLOCKLAB_SPECIALS, []
    if name is TokenizerName.bpe:
        key = digest({"sources": source_fp, "vocab_size": cfg.vocab_size,
                      "sample_bytes": cfg.sample_bytes, "seed": data.seed})

        def build() -> Any:
            log(f"tokenizer: training a byte-level BPE (vocab {cfg.vocab_size}) on a sample of "
                f"at most {cfg.sample_bytes / 1e6:.0f} MB of the sources ...")
            return train_bpe(cfg, _sample(items, data, cfg.sample_bytes),
                             progress=sys.stderr.isatty(), log=log)
    elif name is TokenizerName.char:
        key = digest({"kind": "char", "sources": source_fp, "sample_bytes": cfg.sample_bytes,
                      "seed": data.seed})

        def build() -> Any:
            seen: set[str] = set()
            size = 0
            for piece in _sample(items, data, cfg.sample_bytes):
                seen.update(piece)
                size += len(piece)
            tok = char_tokenizer(seen)
            log(f"tokenizer: a character vocabulary of {tok.get_vocab_size():,} ids — "
                f"{len(seen):,} characters seen in {size:,} characters of the sources, "
                "blocklab's specials and <unk>")
            return tok
    else:
        raise DataError(f"data error: tokenizer.name={name.value!r}: cannot tokenize text")
    return _cached(root, f"{name.value}-{key}", build), BLOCKLAB_SPECIALS, []


def _cached(root: Path, stem: str, build) -> Any:
    """The tokenizer ``<root>/tokenizers/<stem>.json``, built (``build()``) and published
    atomically by the first preparer; the others wait for it and read it."""
    from tokenizers import Tokenizer

    path = root / "tokenizers" / f"{stem}.json"
    with locked(root, stem):
        if path.is_file():
            tok = Tokenizer.from_file(str(path))
            tok.encode_special_tokens = True
            return tok
        tok = build()
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
        tmp.write_text(tok.to_str())
        maybe_fault("publish", next(_PUBLISHED))
        tmp.replace(path)
    return tok


def _sample(items: list[WorkItem], data: DataConfig, budget: int) -> Iterator[str]:
    """Documents of the work items in a seeded order, until ``budget`` characters (a long
    document in pieces, never whole)."""
    order = list(range(len(items)))
    random.Random(f"bpe-sample:{data.seed}").shuffle(order)
    used = 0
    for i in order:
        for piece, _last in read_pieces(items[i], data, ReadStats()):
            yield piece[: budget - used]
            used += min(len(piece), budget - used)
            if used >= budget:
                return


# ------------------------------------------------------------------------------------ build


def dtype_for(vocab_size: int) -> np.dtype:
    """The smallest unsigned dtype holding every id."""
    return np.dtype(np.uint16 if vocab_size <= 1 << 16 else np.uint32)


def _build(final: Path, items: list[WorkItem], data: DataConfig, tok, specials: Specials,
           log, key: str = "data.files") -> None:
    """Tokenize ``items`` into ``final``, written whole (files.write_dir_atomic; the caller
    holds the fingerprint's lock, so every temporary beside ``final`` is a dead preparer's)."""
    dtype = dtype_for(tok.get_vocab_size())
    t0, stats, done = time.perf_counter(), ReadStats(), {"tokens": 0, "seconds": 0.0}

    def fill(tmp: Path) -> None:
        task = Task(tok.to_str(), data, specials, str(dtype), str(tmp))
        files: dict[str, dict[str, Any]] = {}
        for n, result in enumerate(tokenize_items(task, items, data.num_proc), 1):
            stats.add(result.stats)
            done["tokens"] += result.tokens
            files.update(result.files)
            maybe_fault("shard", n)
        _check_documents(stats, items, key, log)
        done["seconds"] = time.perf_counter() - t0
        meta = {"format": FORMAT, "dtype": str(dtype), "shards": len(items),
                "tokens": done["tokens"], "documents": stats.documents,
                "empty_dropped": stats.empty_dropped, "invalid_utf8": stats.invalid_utf8,
                "bytes": stats.bytes, "seconds": round(done["seconds"], 3),
                "specials": specials.to_dict(), "vocab_size": tok.get_vocab_size(),
                "data": {k: getattr(data, k) for k in TOKEN_FIELDS}}
        write_synced(tmp / "tokenizer.json", tok.to_str().encode(), files)
        write_synced(tmp / "meta.json", json.dumps(meta, indent=2, default=str).encode(), files)
        write_synced(tmp / "manifest.json", json.dumps({"files": files}, indent=2).encode(), {})

    def publish(stage: str) -> None:
        if stage == "filled":
            maybe_fault("publish", next(_PUBLISHED))

    # only a corrupt copy set aside can have been at ``final``: replaced if it is back
    write_dir_atomic(final, fill, what=f"I/O error: preparing {final}", key=None,
                     overwrite=True, owner=True, fault=publish,
                     full=lambda: f"{stats.bytes:,} bytes of text read so far, the shards need "
                     "about 2-4 bytes per token; nothing was kept")
    tokens, seconds = done["tokens"], done["seconds"]
    rate = stats.bytes / max(seconds, 1e-9)
    log(f"data: prepared {stats.bytes / 1e6:.1f} MB into {tokens:,} tokens in {seconds:.1f} s "
        f"({rate / 1e6:.1f} MB/s, {tokens / max(seconds, 1e-9):,.0f} tokens/s): {final}")


def _check_documents(stats: ReadStats, items: list[WorkItem], key: str, log) -> None:
    """Refuse sources without a document; call out files that look binary."""
    if not stats.documents and not stats.empty_dropped:
        raise DataError(f"data error: {key}: no documents at all — no lines, records "
                        f"or rows ({_where(items)})")
    if not stats.documents:
        raise DataError(f"data error: {key}: all {stats.empty_dropped} documents are "
                        f"empty or whitespace only ({_where(items)})")
    for name, n in stats.invalid_by_file.items():
        size = max(os.path.getsize(name), 1) if os.path.exists(name) else 1
        if n > BINARY_FRACTION * size:
            log(f"warning: {key}: {name}: {n:,} invalid UTF-8 sequences in {size:,} "
                "bytes replaced — is it a text file? (data.utf8_errors=strict refuses it)")


# ------------------------------------------------------------------------------------ files

_PUBLISHED = itertools.count(1)  # renames into place by this process (fault point publish:N)


def _load(path: Path, fingerprint: str) -> Prepared:
    meta = json.loads((path / "meta.json").read_text())
    return Prepared(path, fingerprint, (path / "tokenizer.json").read_text(),
                    Specials.from_dict(meta["specials"]), meta)


def _where(items: list[WorkItem]) -> str:
    names = list(dict.fromkeys(p for i in items for p in i.paths))
    return ", ".join(names[:5]) + (" ..." if len(names) > 5 else "")


def _stderr(message: str) -> None:
    print(message, file=sys.stderr)

