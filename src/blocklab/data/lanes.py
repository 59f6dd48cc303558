"""A text corpus read as lanes, for memory across segments (``data.segment_mode=stream``).

Transformer-XL's ``batchify`` (Dai et al. 2019, arXiv 1901.02860; kimiyoung/transformer-xl
``data_utils.LMOrderedIterator``): the training spans laid end to end (as
:class:`~blocklab.data.shards.Windows` lays them) are cut into ``L = data.batch_size`` lanes of
``Ln = N // L`` tokens, and row ``b`` of a batch is the ``b``-th consecutive stretch of its lane,
so a model that carries state from one batch to the next reads every lane in order.

Example ``i`` (the sampler's ``b·L + j``: batch ``b``, row ``j``) is a pure function of ``i``:
lane ``j = i % L``, row ``s = i // L`` of that lane, in epoch ``e = s // R`` (``R`` rows of
``k·T`` tokens fit a lane: ``k = trainer.bptt`` segments of ``T = data.seq_len``). The row is the
lane's tokens ``[r·k·T, r·k·T + k·T + 1)`` (``r = s % R``): its last token is the next row's
first, so the shift, done once on the row, supervises every token of the lane. Its
``segments`` are lane-global document ids ``e · n_spans + span``: monotone along a lane, and
changed at an epoch wrap (the lane starts again; the carried state must reset). Exact resume,
DDP-free multi-worker loading and validation need nothing more than the index. Validation
reads the validation spans the same way, in the same number of lanes.
"""

from __future__ import annotations

import numpy as np

from blocklab.config import DataConfig
from blocklab.data.splits import Spans, Split, held_out
from blocklab.data.synthetic import Example
from blocklab.errors import DataError


class LaneSet:
    """The spans of one part of a split (training or validation) read as ``lanes`` lanes of
    rows of ``width + 1`` tokens."""

    def __init__(self, spans: Spans, lanes: int, width: int) -> None:
        self.spans, self.lanes, self.width = spans, lanes, width
        self.ends = np.cumsum(spans.lengths) if len(spans) else np.zeros(0, np.int64)
        self.tokens = int(self.ends[-1]) if len(self.ends) else 0
        self.lane_len = self.tokens // lanes
        self.rows = max(self.lane_len - 1, 0) // width  # rows per lane per epoch

    def read(self, a: int, b: int) -> tuple[list[int], list[int]]:
        """Tokens ``[a, b)`` of the spans laid end to end, and the span index of each."""
        k = int(np.searchsorted(self.ends, a, side="right"))
        ids: list[int] = []
        spans: list[int] = []
        pos = a
        while pos < b:
            before = int(self.ends[k - 1]) if k else 0
            base = int(self.spans.start[k]) - before  # stream position -> document offset
            doc = self.spans.corpus.doc(int(self.spans.doc[k]))
            take = doc[pos + base:min(b, int(self.ends[k])) + base]
            ids += take.tolist()
            spans += [k] * len(take)
            pos += len(take)
            k += 1
        return ids, spans

    def lane(self, j: int) -> tuple[list[int], list[int]]:
        """Lane ``j``'s tokens and span indices, whole."""
        return self.read(j * self.lane_len, (j + 1) * self.lane_len)

    def example(self, index: int) -> Example:
        j, s = index % self.lanes, index // self.lanes
        epoch, r = divmod(s, self.rows)
        a = j * self.lane_len + r * self.width
        ids, spans = self.read(a, a + self.width + 1)
        offset = epoch * len(self.spans)
        return Example(ids, [False] + [True] * (len(ids) - 1),
                       {"task": "text", "lane": j, "row": s, "epoch": epoch},
                       [offset + sp for sp in spans])


class Lanes:
    """A split of ``corpus`` read as ``data.batch_size`` lanes (module docstring): rows of
    ``bptt · seq_len + 1`` tokens, document ids as ``segments``."""

    def __init__(self, corpus, data: DataConfig, split: Split | None = None, *, bptt: int = 1,
                 train: bool = True) -> None:
        self.corpus, self.data = corpus, data
        self.split = split if split is not None else held_out(corpus, data)
        self.width = bptt * data.seq_len
        self.train = LaneSet(self.split.train, data.batch_size, self.width)
        self.val = LaneSet(self.split.val, data.batch_size, self.width)
        for part, name in ((self.train, "training"), (self.val, "validation")):
            if part.rows < 1 and (train or part is self.val):
                raise DataError(
                    f"data error: the {name} text ({part.tokens:,} tokens) in "
                    f"data.batch_size={data.batch_size} lanes of {part.lane_len:,} tokens holds "
                    f"no row of trainer.bptt x data.seq_len + 1 = {self.width + 1} tokens "
                    f"({self.split.how}); lower data.batch_size, trainer.bptt or data.seq_len, "
                    "or give more text")

    def train_example(self, index: int, step: int | None = None) -> Example:
        return self.train.example(index)

    def val_example(self, index: int, step: int | None = None) -> Example:
        return self.val.example(index)

    @property
    def pieces(self) -> int:
        """Rows of one epoch, training and validation."""
        return (self.train.rows + self.val.rows) * self.data.batch_size

    @property
    def val_examples(self) -> int:
        return self.val.rows * self.data.batch_size
