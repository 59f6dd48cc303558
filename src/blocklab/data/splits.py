"""Which text validates a run: a validation source of the user's own, or a held-out part of the
training corpus — said in the run's data summary line with the tokens it holds.

A validation source (:func:`validation_source`) is ``data.val_files`` (read like
``data.files``), a named split of a saved ``DatasetDict`` or of a hub dataset
(``data.val_split``), or — ``val_split=auto`` — a saved ``DatasetDict``'s own ``validation``
split. It is prepared as a corpus of its own with the training corpus's tokenizer, and every
document of it validates; nothing is held out of the training data.

Without one, :func:`held_out` holds out part of the training corpus (``data.val_fraction``):

- **whole documents**, each by a seeded draw, when the corpus has enough of them — at least
  ``1 / (2 · val_fraction)`` (25 at 0.02), so that one held-out document is not more than
  about twice the asked share — deterministic, and no document is on both sides;
- otherwise — or whatever the number of documents with ``data.val_split=last`` — **the last
  ``val_fraction`` of the corpus's tokens** in source order (one file: the end of that file),
  as nanoGPT cuts ``input.txt``: the training part is everything before the cut
  (``int(tokens · (1 - val_fraction))``), validation everything after it.

A split is two :class:`Spans` — token ranges of documents — so a document cut in two is read
by training up to the cut and by validation from it, never both.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from blocklab.config import DataConfig
from blocklab.errors import DataError

if TYPE_CHECKING:
    from blocklab.data.shards import TokenCorpus


LAST = "last"  # data.val_split: the corpus's last tokens validate, however many documents


@dataclass(frozen=True)
class Spans:
    """Token ranges ``[start, stop)`` of documents ``doc`` of one prepared corpus."""

    corpus: TokenCorpus
    doc: np.ndarray
    start: np.ndarray
    stop: np.ndarray

    @classmethod
    def whole(cls, corpus: TokenCorpus, docs: np.ndarray | None = None) -> Spans:
        docs = np.arange(len(corpus)) if docs is None else np.asarray(docs, dtype=np.int64)
        return cls(corpus, docs, np.zeros(len(docs), np.int64),
                   corpus.lengths[docs].astype(np.int64))

    @classmethod
    def none(cls, corpus: TokenCorpus) -> Spans:
        return cls.whole(corpus, np.zeros(0, np.int64))

    @property
    def lengths(self) -> np.ndarray:
        return self.stop - self.start

    @property
    def tokens(self) -> int:
        return int(self.lengths.sum())

    def __len__(self) -> int:
        return len(self.doc)

    def documents(self) -> list[np.ndarray]:
        """Each span's tokens (read-only views), in span order."""
        return [self.corpus.doc(int(d))[int(a):int(b)]
                for d, a, b in zip(self.doc, self.start, self.stop)]


@dataclass(frozen=True)
class Split:
    """What trains and what validates, and how that was decided (``how``: for the summary
    line; ``rule``: documents | tail | source | all, part of the streams' fingerprint)."""

    train: Spans
    val: Spans
    how: str
    rule: str


def min_documents(val_fraction: float) -> int:
    """Fewest documents held out by whole documents (fewer: the last tokens are)."""
    return max(2, math.ceil(0.5 / val_fraction - 1e-9))


def held_out(corpus: TokenCorpus, data: DataConfig) -> Split:
    """Training and validation parts of ``corpus`` by ``data.val_fraction`` (module doc)."""
    n, f = len(corpus), data.val_fraction
    total = int(corpus.lengths.sum())
    if n >= min_documents(f) and data.val_split != LAST:
        held = np.random.default_rng([data.seed, 7919]).random(n) < f
        if not held.any():
            held[-1] = True
        if held.all():
            held[0] = False
        train = Spans.whole(corpus, np.flatnonzero(~held))
        val = Spans.whole(corpus, np.flatnonzero(held))
        return Split(train, val, f"{len(val):,} of {n:,} documents held out by a seeded draw "
                     f"(data.val_fraction={f}): {val.tokens:,} of {total:,} tokens", "documents")
    return _tail(corpus, f, total, asked=data.val_split == LAST)


def _tail(corpus: TokenCorpus, f: float, total: int, *, asked: bool = False) -> Split:
    lens = corpus.lengths.astype(np.int64)
    cut = int(total * (1 - f))
    if cut < 2 or total - cut < 2:
        raise DataError(f"data error: the corpus's {total:,} tokens are too few to hold out the "
                        f"last data.val_fraction={f} of them (at least 2 tokens on each side); "
                        "add text, or give validation text with data.val_files")
    ends = np.cumsum(lens)
    k = int(np.searchsorted(ends, cut, side="right"))  # the document token `cut` is in
    off = cut - (int(ends[k - 1]) if k else 0)
    t_doc, t_stop = list(range(k)), lens[:k].tolist()
    if off:  # the document the cut is in: its start trains, the rest validates
        t_doc, t_stop = [*t_doc, k], [*t_stop, off]
    v_doc = list(range(k, len(lens)))
    v_start = [off] + [0] * (len(v_doc) - 1)
    train = Spans(corpus, np.asarray(t_doc, np.int64), np.zeros(len(t_doc), np.int64),
                  np.asarray(t_stop, np.int64))
    val = Spans(corpus, np.asarray(v_doc, np.int64), np.asarray(v_start, np.int64),
                lens[k:].copy())
    share = f"the last {f * 100:g}%"
    if asked:
        what = f"{share} of the corpus's tokens in source order (data.val_split={LAST})"
    elif len(lens) == 1:
        what = f"{share} of the one document's tokens, nanoGPT-style (data.val_fraction={f})"
    else:
        what = (f"{share} of the corpus's tokens in source order: {len(lens)} documents are "
                f"too few to hold out whole ones (fewer than {min_documents(f)} at "
                f"data.val_fraction={f})")
    return Split(train, val, f"{what}: {val.tokens:,} of {total:,} tokens held out", "tail")


def from_source(train: TokenCorpus, val: TokenCorpus, what: str) -> Split:
    """All of ``train`` trains, all of ``val`` (a validation source) validates."""
    spans = Spans.whole(val)
    return Split(Spans.whole(train), spans, f"{what}: {len(spans):,} documents, "
                 f"{spans.tokens:,} tokens; nothing held out of the training data", "source")


def everything(corpus: TokenCorpus, what: str) -> Split:
    """All of ``corpus`` validates (an evaluation corpus): nothing trains."""
    spans = Spans.whole(corpus)
    return Split(Spans.none(corpus), spans, f"{what}: {len(spans):,} documents, "
                 f"{spans.tokens:,} tokens", "all")


def validation_source(data: DataConfig) -> tuple[DataConfig | None, str]:
    """(the data config of the validation source, what it is), or (None, a note for the
    summary line, may be empty) where there is none and the held-out fraction validates."""
    if data.val_files:
        shown = ", ".join(data.val_files[:3]) + (" ..." if len(data.val_files) > 3 else "")
        return (dataclasses.replace(data, files=list(data.val_files), val_files=[], corpus=None,
                                    hub_dataset=None, val_split="none"),
                f"data.val_files=[{shown}]")
    split = data.val_split
    if data.hub_dataset:
        if split in ("auto", "none", LAST):
            return None, ("a hub dataset's own validation split validates only when named "
                          "(data.val_split=validation)" if split == "auto" else "")
        return (dataclasses.replace(data, hub_split=split, val_split="none"),
                f"split {split!r} of hub dataset {data.hub_dataset}")
    if data.format != "disk" or data.corpus or split in ("none", LAST):
        return None, ""
    from blocklab.data.sources import disk_splits

    path = data.files[0]
    names = disk_splits(path)
    want = "validation" if split == "auto" else split
    if names is None or want not in names or want == data.hub_split:
        if split == "auto":
            return None, ("" if names is None else f"{path} has no validation split besides "
                          f"the training one (splits: {', '.join(names)})")
        why = (f"{path} is a single Dataset, not a DatasetDict: it has no splits"
               if names is None else
               f"that is the training split (data.hub_split) of {path}; validate on another"
               if want == data.hub_split else
               f"no such split in {path} (splits: {', '.join(names)})")
        raise DataError(f"data error: data.val_split={split!r}: {why}")
    return (dataclasses.replace(data, hub_split=want, val_split="none"),
            f"split {want!r} of {path}")


def named_sources(data: DataConfig) -> str:
    """The text sources a data config names, without opening anything."""
    if data.corpus:
        return f"corpus {data.corpus}"
    if data.hub_dataset:
        return f"hub dataset {data.hub_dataset} ({data.hub_split})"
    shown = ", ".join(data.files[:3]) + (f" and {len(data.files) - 3} more"
                                         if len(data.files) > 3 else "")
    return f"data.files=[{shown}]"
