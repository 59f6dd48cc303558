"""Batches for memory across segments (``data.segment_mode=split`` / ``stream``):
:class:`SegmentCollate`.

A row is one long sequence that the trainer reads ``data.seq_len`` tokens at a time, carrying
state from segment to segment (docs/memory.md). The next-token shift is done once, on the long
row, as :meth:`blocklab.objectives.CausalLM.collate` does on a packed row: a segment's last
input is supervised by the next segment's first token (when it is the same document), and no
target crosses a document boundary. Batch keys, each (B, W) with W a whole number of segments:

- ``input_ids`` (int64): the row's tokens but its last, right-padded with ``pad``;
- ``labels`` (int64): the next token where it is a target of the same document, else
  :data:`IGNORE` (also on padding);
- ``segments`` (int64): the document id of each input — stream mode: the lanes' lane-global,
  monotone ids (data/lanes.py); split mode: one id per row (its index in the batch); padding
  keeps its row's last id;
- ``valid`` (bool): real inputs (False on split mode's right padding; all True in stream rows).
"""

from __future__ import annotations

import torch
from torch import Tensor

from blocklab.data.synthetic import PAD, Example

IGNORE = -100  # blocklab.objectives.IGNORE (the objectives sit a floor above the data package)


class SegmentCollate:
    """Examples -> a batch of rows of whole segments of ``seq_len`` tokens (module docstring).
    ``mode`` is ``data.segment_mode`` (``split`` or ``stream``); ``pad`` the tokenizer's pad id."""

    def __init__(self, mode: str, seq_len: int, *, pad: int = PAD) -> None:
        if mode not in ("split", "stream"):
            raise ValueError(f"SegmentCollate reads data.segment_mode split or stream, not {mode!r}")
        self.mode, self.seq_len, self.pad = mode, seq_len, pad

    @classmethod
    def from_config(cls, data, *, pad: int = PAD) -> SegmentCollate | None:
        """The collate of a run's ``data.segment_mode`` (None for ``none``: the family's
        objective collates); ``pad`` the tokenizer's pad id (``Streams.specials.pad``)."""
        return None if data.segment_mode == "none" else cls(data.segment_mode, data.seq_len,
                                                                 pad=pad)

    def __call__(self, examples: list[Example]) -> dict[str, Tensor]:
        n_in = [len(e.tokens) - 1 for e in examples]  # inputs of each row
        t = self.seq_len
        width = max(-(-max(n_in) // t) * t, t)  # whole segments
        b = len(examples)
        tokens = torch.full((b, width + 1), self.pad, dtype=torch.long)
        targets = torch.zeros((b, width + 1), dtype=torch.bool)
        segments = torch.empty((b, width + 1), dtype=torch.long)
        for i, e in enumerate(examples):
            n = len(e.tokens)
            ids = e.segments if e.segments is not None else [i] * n
            if self.mode == "stream" and e.segments is None:
                raise ValueError("stream rows carry their document ids (data/lanes.py)")
            tokens[i, :n] = torch.tensor(e.tokens, dtype=torch.long)
            targets[i, :n] = torch.tensor(e.targets, dtype=torch.bool)
            segments[i, :n] = torch.tensor(ids, dtype=torch.long)
            segments[i, n:] = ids[-1]  # padding continues the row's last document
        # The shift, once: input u predicts token u+1, supervised where token u+1 is a target
        # of the same document (CausalLM.collate's rule on packed rows).
        labels = tokens[:, 1:].clone()
        keep = targets[:, 1:] & (segments[:, 1:] == segments[:, :-1])
        labels[~keep] = IGNORE
        valid = torch.arange(width)[None, :] < torch.tensor(n_in)[:, None]
        labels[~valid] = IGNORE
        inputs = tokens[:, :-1].masked_fill(~valid, self.pad)  # a row's last token is no input
        return {"input_ids": inputs, "labels": labels, "segments": segments[:, :-1],
                "valid": valid}
