"""Reading a prepared corpus (data/prepare.py) by memory map, as training examples.

Token shards are ``numpy.memmap`` s: the operating system pages in what an example touches, so
a run's memory does not grow with the corpus. The documents' lengths (a few bytes per
document) are loaded whole. Validation holds out whole documents, chosen by a seeded draw per
document (``data.val_fraction``): deterministic, and disjoint from training by construction.

Two ways to cut the training documents into sequences of ``data.seq_len + 1`` tokens:

- :class:`Pieces` (the default): document-aligned pieces — each document cut into consecutive
  pieces (``data.long_documents=split``) or kept to its first piece (``truncate``);
- :class:`Windows` (``data.packing=true``): fixed-length windows over the training documents
  laid end to end, with the document boundaries inside a window carried as segment ids (the
  decoder's packing: no attention and no target across documents).

Example ``i`` is a pure function of (seed, i): a seeded permutation of the pieces or windows
per epoch, so an exact resume needs only the number of examples consumed, and DDP ranks,
which take disjoint example indices, read disjoint examples of one shared corpus.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from blocklab.config import DataConfig
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

    def split(self, data: DataConfig) -> tuple[np.ndarray, np.ndarray]:
        """(train, val) document indices: each document held out with probability
        ``data.val_fraction`` by a seeded draw; at least one of each."""
        n = len(self)
        if n < 2:
            raise DataError(f"data error: {n} document(s) leave nothing for validation: add "
                            "data, or cut the text finer (data.documents=line or paragraph)")
        held = np.random.default_rng([data.seed, 7919]).random(n) < data.val_fraction
        if not held.any():
            held[-1] = True
        if held.all():
            held[0] = False
        return np.flatnonzero(~held), np.flatnonzero(held)


class _Stream:
    """Per-epoch seeded order over ``n`` sequences of the training split."""

    def __init__(self, corpus: TokenCorpus, data: DataConfig) -> None:
        self.corpus, self.data = corpus, data
        self.width = data.seq_len + 1
        self.train_docs, self.val_docs = corpus.split(data)
        self._order: tuple[int, np.ndarray] | None = None

    def _permuted(self, index: int, n: int) -> int:
        epoch, pos = divmod(index, n)
        if self._order is None or self._order[0] != epoch:
            self._order = (epoch, np.random.default_rng([self.data.seed, epoch]).permutation(n))
        return int(self._order[1][pos])

    def _check(self, n_train: int, what: str) -> None:
        if n_train < self.data.batch_size:
            raise DataError(f"data error: {n_train} training {what} of <= {self.width} tokens "
                            f"is less than one batch (data.batch_size={self.data.batch_size})")


class Pieces(_Stream):
    """Document-aligned pieces of at most ``seq_len + 1`` tokens; a trailing piece of one
    token (nothing to predict) is dropped."""

    def __init__(self, corpus: TokenCorpus, data: DataConfig) -> None:
        super().__init__(corpus, data)
        self.train = self._table(self.train_docs)
        self.val = self._table(self.val_docs)
        lens = corpus.lengths
        self.split_documents = self.truncated_documents = 0
        long = int((lens > self.width).sum())
        if data.long_documents == "truncate":
            self.truncated_documents = long
        else:
            self.split_documents = long
        self._check(len(self.train[0]), "pieces")

    def _table(self, docs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(document, offset) of every piece of ``docs``."""
        lens = self.corpus.lengths[docs]
        if self.data.long_documents == "truncate":
            counts = (lens > 1).astype(np.int64)
        else:
            counts = lens // self.width + (lens % self.width > 1)
        doc = np.repeat(docs, counts)
        first = np.repeat(np.cumsum(counts) - counts, counts)
        offset = (np.arange(len(doc)) - first) * self.width
        return doc, offset

    def _example(self, table: tuple[np.ndarray, np.ndarray], i: int) -> Example:
        d, off = int(table[0][i]), int(table[1][i])
        ids = self.corpus.doc(d)[off:off + self.width].tolist()
        return Example(ids, [False] + [True] * (len(ids) - 1), {"task": "text"})

    def train_example(self, index: int, step: int | None = None) -> Example:
        return self._example(self.train, self._permuted(index, len(self.train[0])))

    def val_example(self, index: int, step: int | None = None) -> Example:
        return self._example(self.val, index % len(self.val[0]))

    @property
    def pieces(self) -> int:
        return len(self.train[0]) + len(self.val[0])


class Windows(_Stream):
    """Fixed windows of ``seq_len + 1`` tokens over the split's documents laid end to end;
    segment ids mark the documents inside a window (the last partial window is dropped)."""

    def __init__(self, corpus: TokenCorpus, data: DataConfig) -> None:
        super().__init__(corpus, data)
        self.train_ends = np.cumsum(corpus.lengths[self.train_docs])
        self.val_ends = np.cumsum(corpus.lengths[self.val_docs])
        self.n_train = int(self.train_ends[-1]) // self.width if len(self.train_ends) else 0
        self.n_val = int(self.val_ends[-1]) // self.width if len(self.val_ends) else 0
        if self.n_val == 0:
            raise DataError(f"data error: the validation documents hold fewer than "
                            f"{self.width} tokens (one window); raise data.val_fraction")
        self._check(self.n_train, "windows")

    def _window(self, docs: np.ndarray, ends: np.ndarray, w: int) -> Example:
        a, b = w * self.width, (w + 1) * self.width
        k = int(np.searchsorted(ends, a, side="right"))
        ids: list[int] = []
        segments: list[int] = []
        pos, seg = a, 0
        while pos < b:
            doc_start = int(ends[k - 1]) if k else 0
            take = self.corpus.doc(int(docs[k]))[pos - doc_start:min(b, int(ends[k])) - doc_start]
            ids += take.tolist()
            segments += [seg] * len(take)
            pos += len(take)
            k, seg = k + 1, seg + 1
        return Example(ids, [False] + [True] * (len(ids) - 1), {"task": "text"}, segments)

    def train_example(self, index: int, step: int | None = None) -> Example:
        return self._window(self.train_docs, self.train_ends,
                            self._permuted(index, self.n_train))

    def val_example(self, index: int, step: int | None = None) -> Example:
        return self._window(self.val_docs, self.val_ends, index % self.n_val)

    @property
    def pieces(self) -> int:
        return self.n_train + self.n_val
