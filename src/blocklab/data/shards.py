"""Reading a prepared corpus (data/prepare.py) by memory map, as training examples.

Token shards are ``numpy.memmap`` s: the operating system pages in what an example touches, so
a run's memory does not grow with the corpus. The documents' lengths (a few bytes per
document) are loaded whole. What trains and what validates is a :class:`~blocklab.data.splits.Split`
(token ranges of documents, data/splits.py): a validation source of its own, whole documents
held out by a seeded draw, or the corpus's last tokens — disjoint by construction.

Two ways to cut the training documents into sequences of ``data.seq_len + 1`` tokens:

- :class:`Pieces` (the default): document-aligned pieces — each document cut into consecutive
  pieces (``data.long_documents=split``) or kept to its first piece (``truncate``);
- :class:`Windows` (``data.packing=true``): fixed-length windows over the training spans
  laid end to end, with the document boundaries inside a window carried as segment ids (the
  decoder's packing: no attention and no target across documents).

Example ``i`` is a pure function of (seed, i): a seeded permutation of the pieces or windows
per epoch, so an exact resume needs only the number of examples consumed, and DDP ranks,
which take disjoint example indices, read disjoint examples of one shared corpus.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import NamedTuple

import numpy as np

from blocklab.config import DataConfig
from blocklab.data.splits import Spans, Split, held_out
from blocklab.data.synthetic import Example
from blocklab.errors import DataError


class TokenCorpus:
    """The documents of a prepared corpus: ``doc(i)`` is a read-only view of its tokens."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.meta = json.loads((self.path / "meta.json").read_text())
        dtype = np.dtype(self.meta["dtype"])
        shards, lengths, which = [], [], []
        for i in range(self.meta["shards"]):
            lens = np.load(self.path / f"docs-{i:05d}.npy")
            tokens_file = self.path / f"tokens-{i:05d}.bin"
            shards.append(np.memmap(tokens_file, dtype=dtype, mode="r")
                          if tokens_file.stat().st_size else np.zeros(0, dtype))
            lengths.append(lens)
            which.append(np.full(len(lens), i, dtype=np.int32))
        self.shards = shards
        self.lengths = np.concatenate(lengths) if lengths else np.zeros(0, np.int64)
        self.shard_of = np.concatenate(which) if which else np.zeros(0, np.int32)
        starts = [np.concatenate(([0], np.cumsum(lens)[:-1])) if len(lens) else lens
                  for lens in lengths]
        self.start_in_shard = np.concatenate(starts) if starts else np.zeros(0, np.int64)

    def __len__(self) -> int:
        return len(self.lengths)

    def doc(self, i: int) -> np.ndarray:
        s = int(self.start_in_shard[i])
        return self.shards[self.shard_of[i]][s:s + int(self.lengths[i])]


class Table(NamedTuple):
    """Where each sequence of a stream starts: document, token offset, the end of its span,
    and the corpus the documents are in."""

    doc: np.ndarray
    offset: np.ndarray
    stop: np.ndarray
    corpus: TokenCorpus


class _Stream:
    """Per-epoch seeded order over the sequences of the training part of a :class:`Split`
    (default: held out of ``corpus`` by ``data.val_fraction``, data/splits.py)."""

    def __init__(self, corpus: TokenCorpus, data: DataConfig, split: Split | None = None, *,
                 train: bool = True) -> None:
        self.corpus, self.data = corpus, data
        self.width = data.seq_len + 1
        self.split = split if split is not None else held_out(corpus, data)
        self.train_spans, self.val_spans = self.split.train, self.split.val
        self.needs_train = train
        self._order: tuple[int, np.ndarray] | None = None

    @property
    def train_docs(self) -> np.ndarray:
        return self.train_spans.doc

    @property
    def val_docs(self) -> np.ndarray:
        return self.val_spans.doc

    def _permuted(self, index: int, n: int) -> int:
        epoch, pos = divmod(index, n)
        if self._order is None or self._order[0] != epoch:
            self._order = (epoch, np.random.default_rng([self.data.seed, epoch]).permutation(n))
        return int(self._order[1][pos])

    def _check(self, n_train: int, n_val: int, what: str) -> None:
        if self.needs_train and n_train < self.data.batch_size:
            raise DataError(f"data error: {n_train} training {what} of <= {self.width} tokens "
                            f"is less than one batch (data.batch_size={self.data.batch_size})")
        if n_val == 0:
            kind = "piece of 2 tokens" if what == "pieces" else f"window of {self.width} tokens"
            raise DataError(f"data error: the validation text holds no {kind} ({self.split.how}); "
                            "raise data.val_fraction or give more validation text")


class Pieces(_Stream):
    """Document-aligned pieces of at most ``seq_len + 1`` tokens; a trailing piece of one
    token (nothing to predict) is dropped."""

    def __init__(self, corpus: TokenCorpus, data: DataConfig, split: Split | None = None, *,
                 train: bool = True) -> None:
        super().__init__(corpus, data, split, train=train)
        self.train = self._table(self.train_spans)
        self.val = self._table(self.val_spans)
        self.split_documents = self.truncated_documents = 0
        long = len({(id(s.corpus), int(d)) for s in (self.train_spans, self.val_spans)
                    for d in s.doc[s.lengths > self.width]})  # a document cut in two: once
        if data.long_documents == "truncate":
            self.truncated_documents = long
        else:
            self.split_documents = long
        self._check(len(self.train[0]), len(self.val[0]), "pieces")

    def _table(self, spans: Spans) -> Table:
        """Where every piece of ``spans`` starts."""
        lens = spans.lengths
        if self.data.long_documents == "truncate":
            counts = (lens > 1).astype(np.int64)
        else:
            counts = lens // self.width + (lens % self.width > 1)
        span = np.repeat(np.arange(len(spans)), counts)
        first = np.repeat(np.cumsum(counts) - counts, counts)
        offset = spans.start[span] + (np.arange(len(span)) - first) * self.width
        return Table(spans.doc[span], offset, spans.stop[span], spans.corpus)

    def _example(self, table: Table, i: int) -> Example:
        d, off, stop = int(table.doc[i]), int(table.offset[i]), int(table.stop[i])
        ids = table.corpus.doc(d)[off:min(off + self.width, stop)].tolist()
        return Example(ids, [False] + [True] * (len(ids) - 1), {"task": "text"})

    def train_example(self, index: int, step: int | None = None) -> Example:
        return self._example(self.train, self._permuted(index, len(self.train[0])))

    def val_example(self, index: int, step: int | None = None) -> Example:
        return self._example(self.val, index % len(self.val[0]))

    @property
    def pieces(self) -> int:
        return len(self.train[0]) + len(self.val[0])

    @property
    def val_examples(self) -> int:
        return len(self.val[0])


class Windows(_Stream):
    """Fixed windows of ``seq_len + 1`` tokens over the split's spans laid end to end; segment
    ids mark the documents inside a window (the last partial window is dropped)."""

    def __init__(self, corpus: TokenCorpus, data: DataConfig, split: Split | None = None, *,
                 train: bool = True) -> None:
        super().__init__(corpus, data, split, train=train)
        self.train_ends = np.cumsum(self.train_spans.lengths)
        self.val_ends = np.cumsum(self.val_spans.lengths)
        self.n_train = int(self.train_ends[-1]) // self.width if len(self.train_ends) else 0
        self.n_val = int(self.val_ends[-1]) // self.width if len(self.val_ends) else 0
        self._check(self.n_train, self.n_val, "windows")

    def _window(self, spans: Spans, ends: np.ndarray, w: int) -> Example:
        a, b = w * self.width, (w + 1) * self.width
        k = int(np.searchsorted(ends, a, side="right"))
        ids: list[int] = []
        segments: list[int] = []
        pos, seg = a, 0
        while pos < b:
            base = int(spans.start[k]) - (int(ends[k - 1]) if k else 0)  # stream -> doc offset
            doc = spans.corpus.doc(int(spans.doc[k]))
            take = doc[pos + base:min(b, int(ends[k])) + base]
            ids += take.tolist()
            segments += [seg] * len(take)
            pos += len(take)
            k, seg = k + 1, seg + 1
        return Example(ids, [False] + [True] * (len(ids) - 1), {"task": "text"}, segments)

    def train_example(self, index: int, step: int | None = None) -> Example:
        return self._window(self.train_spans, self.train_ends,
                            self._permuted(index, self.n_train))

    def train_rows(self) -> np.ndarray:
        """Every training window's tokens, one row each (in stream order, not an epoch's):
        the spans laid end to end, cut every ``seq_len + 1`` tokens, as ``_window`` cuts them."""
        s = self.train_spans
        flat = np.concatenate([s.corpus.doc(int(d))[int(a):int(b)]
                               for d, a, b in zip(s.doc, s.start, s.stop)] or [np.zeros(0, np.int64)])
        return flat[:self.n_train * self.width].reshape(self.n_train, self.width)

    def val_example(self, index: int, step: int | None = None) -> Example:
        return self._window(self.val_spans, self.val_ends, index % self.n_val)

    @property
    def pieces(self) -> int:
        return self.n_train + self.n_val

    @property
    def val_examples(self) -> int:
        return self.n_val
