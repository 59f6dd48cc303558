"""Tokenizing a preparation's work items into shard files (data/prepare.py writes the corpus
around them): per item ``tokens-NNNNN.bin`` (the documents' ids, ``bos ids eos`` each, one
flat array) and ``docs-NNNNN.npy`` (their lengths), written by ``data.num_proc`` worker
processes — each with its own single-threaded tokenizer — in batches of bounded size, so
neither a long document's text nor its ids are ever held whole."""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import os
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from blocklab.config import DataConfig
from blocklab.data.sources import ReadStats, WorkItem, read_pieces
from blocklab.data.tokenizer import Specials
from blocklab.files import sha256_file

BATCH_CHARS = 1 << 18  # documents are encoded in batches of about this much text


def processes_default() -> int:
    return min(os.cpu_count() or 1, 8)


@dataclass(frozen=True)
class Task:
    """What every worker needs (picklable)."""

    tokenizer_json: str
    data: DataConfig
    specials: Specials
    dtype: str
    out: str


@dataclass
class ShardResult:
    index: int
    tokens: int
    stats: ReadStats
    files: dict[str, dict[str, Any]]


def tokenize_items(task: Task, items: list[WorkItem], num_proc: int | None
                   ) -> Iterator[ShardResult]:
    """Shard results in item order, from ``num_proc`` worker processes (1: in this one)."""
    procs = max(1, min(num_proc or processes_default(), len(items)))
    bar = _progress(sum(i.nbytes for i in items))
    try:
        if procs == 1:
            _init(task)
            results: Any = map(_work, enumerate(items))
            pool = None
        else:
            import multiprocessing as mp

            pool = mp.get_context("spawn").Pool(procs, initializer=_init, initargs=(task,))
            results = pool.imap(_work, enumerate(items))
        t0, tokens = time.perf_counter(), 0
        with pool or contextlib.nullcontext():
            for r in results:
                tokens += r.tokens
                if bar is not None:  # bytes: MB/s on the bar; tokens/s beside it
                    bar.update(r.stats.bytes)
                    rate = tokens / max(time.perf_counter() - t0, 1e-9)
                    bar.set_postfix_str(f"{rate:,.0f} tokens/s")
                yield r
    finally:
        if bar is not None:
            bar.close()


def _progress(total: int):
    if not sys.stderr.isatty():
        return None
    from tqdm.auto import tqdm

    return tqdm(total=total, unit="B", unit_scale=True, unit_divisor=1000,
                desc="preparing", file=sys.stderr)


_TASK: dict[str, Any] = {}


def _init(task: Task) -> None:
    """Worker start: one tokenizer per process, single-threaded (the processes are the
    parallelism)."""
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    from blocklab.data.tokenizer import tokenizer_from_json

    _TASK.update(task=task, tok=tokenizer_from_json(task.tokenizer_json))


def _work(args: tuple[int, WorkItem]) -> ShardResult:
    index, item = args
    task, tok = _TASK["task"], _TASK["tok"]
    stats, lengths = ReadStats(), []
    out = Path(task.out)
    tokens_path, docs_path = out / f"tokens-{index:05d}.bin", out / f"docs-{index:05d}.npy"
    h = hashlib.sha256()
    total = 0
    with tokens_path.open("wb") as f:
        for ids in _encoded(tok, read_pieces(item, task.data, stats), task, lengths):
            data = ids.tobytes()
            _write_tokens(f, data)
            h.update(data)
            total += len(ids)
        f.flush()
        os.fsync(f.fileno())
    np.save(docs_path, np.asarray(lengths, dtype=np.int64))
    files = {tokens_path.name: {"bytes": tokens_path.stat().st_size, "sha256": h.hexdigest()},
             docs_path.name: {"bytes": docs_path.stat().st_size,
                              "sha256": sha256_file(docs_path)}}
    return ShardResult(index, total, stats, files)


def _write_tokens(f, data: bytes) -> None:
    f.write(data)


def _encoded(tok, pieces: Iterator[tuple[str, bool]], task: Task, lengths: list[int]
             ) -> Iterator[np.ndarray]:
    """The ids of the documents' pieces (each document ``bos ids eos``), an array per batch of
    about BATCH_CHARS characters; the length of each document that ends goes to ``lengths``."""
    sp, dtype = task.specials, np.dtype(task.dtype)
    open_len = 0  # ids of the document in progress so far
    for batch in _piece_batches(pieces):
        runs: list[Any] = []
        encs = tok.encode_batch_fast([text for text, _, _ in batch], add_special_tokens=False)
        for (_, first, last), enc in zip(batch, encs, strict=True):
            ids = enc.ids
            runs += [(sp.bos,)] * first + [ids] + [(sp.eos,)] * last
            open_len += len(ids) + first + last
            if last:
                lengths.append(open_len)
                open_len = 0
        n = sum(map(len, runs))
        yield np.fromiter(itertools.chain.from_iterable(runs), dtype=dtype, count=n)


def _piece_batches(pieces: Iterator[tuple[str, bool]]
                   ) -> Iterator[list[tuple[str, bool, bool]]]:
    """``(text, first, last)`` pieces in batches of about BATCH_CHARS characters."""
    batch: list[tuple[str, bool, bool]] = []
    size, first = 0, True
    for text, last in pieces:
        batch.append((text, first, last))
        size, first = size + len(text), last
        if size >= BATCH_CHARS:
            yield batch
            batch, size = [], 0
    if batch:
        yield batch
