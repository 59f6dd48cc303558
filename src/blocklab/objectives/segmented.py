"""Long rows read segment by segment with every layer's state carried: the causal LM of
``data.segment_mode`` ``split`` and ``stream`` (docs/memory.md).

A batch row is a whole number of segments of ``data.seq_len`` tokens (data/segment_collate.py
did the shift once, on the long row: a segment's last input is supervised by the next segment's
first token). :func:`segment_loss` runs the model one segment at a time through a *carry* — the
model's decode cache in carry mode (``model.new_cache(batch, None, carry=True)``; model/carry.py),
whose writes keep the autograd graph — so a segment reads what the earlier ones left in every
layer's state (a recurrent mixer's state, a window's keys, a softmax layer's memory), and its
loss reaches their weights. Documents are data: a batch's ``segments`` are document ids, and
``cache.enter`` empties a row's state where a new document begins.

- ``split``: a row is one whole document (synthetic or text); its carry lives for one batch.
  ``trainer.bptt = k`` detaches it every ``k`` segments (0: backpropagation through the whole
  document).
- ``stream``: row ``s`` of lane ``j`` continues row ``s - 1`` of lane ``j`` (data/lanes.py), so
  the training carry lives across steps: :class:`~blocklab.train.module.LitModel` keeps it,
  detached before each step (backpropagation through the row's ``trainer.bptt`` segments, as
  Transformer-XL trains), and saves it in every checkpoint, so a resume mid-document continues
  the very same state. An evaluation pass reads its lanes with one fresh carry
  (:meth:`SegmentedLM.reading`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from blocklab.config import DataConfig
from blocklab.data.segment_collate import SegmentCollate
from blocklab.data.synthetic import Example
from blocklab.model.carry import first_documents, run_segments
from blocklab.objectives.core import CausalLM, LossOut, pad_rows, token_loss


def segment_loss(model: torch.nn.Module, batch: dict[str, Tensor], carry: Any, *,
                 seg_len: int, bptt: int = 0, accuracy: bool = False,
                 z: bool = False) -> LossOut:
    """The token loss of ``batch`` read ``seg_len`` tokens at a time through ``carry``, summed
    over every segment into one graph (a backward reaches every segment since the last detach);
    ``bptt > 0`` detaches the carry after every ``bptt`` segments. Segments after every row's
    last real token (split padding) are not run. ``z``: also the summed log²Z (``LossOut.z``)."""
    ids, labels, docs = batch["input_ids"], batch["labels"], batch["segments"]
    valid = batch.get("valid")
    parts = []
    for n, start in enumerate(range(0, ids.shape[1], seg_len)):
        cut = slice(start, start + seg_len)
        v = None if valid is None else valid[:, cut]
        if v is not None and not bool(v.any()):
            break
        if v is not None and bool(v.all()):
            v = None  # no padding in this segment: the plain causal path
        carry.enter(first_documents(docs[:, cut], v, carry))
        logits = model(ids[:, cut], valid=v, segments=docs[:, cut], cache=carry)
        parts.append(token_loss(logits, labels[:, cut], accuracy=accuracy, z=z))
        if bptt and (n + 1) % bptt == 0:
            carry.detach()
    total = torch.stack([p.total for p in parts]).sum()
    count = torch.stack([p.count for p in parts]).sum()
    correct = torch.stack([p.correct for p in parts]).sum() if accuracy else None
    z_sum = torch.stack([p.z for p in parts]).sum() if z else None
    aux, carry.aux_loss = carry.aux_loss, None  # compressed memory's reconstruction loss
    mean = total / count.clamp(min=1)
    return LossOut(mean if aux is None else mean + aux, total, count, correct, z_sum)


class SegmentedLM(CausalLM):
    """The decoder's causal LM read segment by segment (``data.segment_mode``)."""

    packs = False  # a segment mode lays out its own rows

    def __init__(self, *, seg_len: int, mode: str) -> None:
        super().__init__()
        self.seg_len, self.mode = seg_len, mode
        self._reading: dict[int, Any] | None = None  # batch size -> the pass's carry (stream)

    @classmethod
    def from_config(cls, data: DataConfig) -> SegmentedLM:
        return cls(seg_len=data.seq_len, mode=data.segment_mode)

    def collate(self, examples: list[Example]) -> dict[str, Tensor]:
        return SegmentCollate(self.mode, self.seg_len, pad=self.specials.pad)(examples)

    # Probes, perplexity and blocklab-eval read a long input the way training did: segment by
    # segment through a fresh evaluation carry (not one forward over everything, nor a decode
    # cache that keeps every key).
    shares_prefix = False  # a shared-prefix K/V cache would read the prompt whole

    def _carried(self, model: torch.nn.Module, ids: Tensor, valid: Tensor | None,
                 segments: Tensor | None, room: int = 0) -> tuple[Tensor, Any]:
        carry = model.new_cache(ids.shape[0], ids.shape[1] + room, carry=True, mem="eval")
        return run_segments(model, ids, seg_len=self.seg_len, cache=carry, valid=valid,
                            segments=segments), carry

    def logits(self, model: torch.nn.Module, batch: dict[str, Tensor], **kw: Tensor) -> Tensor:
        """(B, T, V) read segment by segment (``select``: the (N, V) rows it marks)."""
        out, _ = self._carried(model, batch["input_ids"], batch.get("valid"),
                               batch.get("segments"))
        select = kw.get("select")
        return out if select is None else out[select]

    def token_nll(self, model: torch.nn.Module, windows: Tensor) -> Tensor:
        logits, _ = self._carried(model, windows[:, :-1], None, None)
        return F.cross_entropy(logits.float().transpose(1, 2), windows[:, 1:], reduction="none")

    @torch.no_grad()
    def greedy(self, model: torch.nn.Module, prompts: list[list[int]],
               max_new_tokens: int) -> list[list[int]]:
        """Greedy continuation: the (left-padded) prompts read segment by segment, then one
        token per forward through the same carry (what the memory kept is what it reads)."""
        if max_new_tokens < 1:
            return [[] for _ in prompts]
        ids, valid = pad_rows(prompts, left=True, pad=self.specials.pad)
        logits, carry = self._carried(model, ids, valid, None, room=max_new_tokens)
        eos = self.specials.eos
        token = logits[:, -1].argmax(-1)
        done = torch.zeros(len(prompts), dtype=torch.bool)
        out = []
        for i in range(max_new_tokens):
            token = token.where(~done, eos)
            done |= token == eos
            out.append(token)
            if i == max_new_tokens - 1 or bool(done.all()):
                break
            carry.enter(carry.last_doc)
            token = model(token[:, None], cache=carry)[:, -1].argmax(-1)
        rest = [torch.full_like(token, eos)] * (max_new_tokens - len(out))
        return torch.stack(out + rest, 1).tolist()

    def new_carry(self, model: torch.nn.Module, batch: int, *, length: int,
                  mem: str = "train") -> Any:
        """A fresh carry for ``batch`` rows; ``length``: the tokens one row holds (a split
        document: what a layer that keeps every token needs room for)."""
        return model.new_cache(batch, length if self.mode == "split" else None, carry=True,
                               mem=mem)

    @contextlib.contextmanager
    def reading(self) -> Iterator[None]:
        """One evaluation pass: in ``stream`` mode consecutive batches continue each lane, so
        the pass keeps one carry (per batch size) across them, made fresh for the pass."""
        self._reading = {}
        try:
            yield
        finally:
            self._reading = None

    def loss(self, model: torch.nn.Module, batch: dict[str, Tensor], *, carry: Any = None,
             bptt: int = 0, z: bool = False) -> LossOut:
        """The batch's loss through ``carry`` (stream training: the run's carry); without one,
        a fresh carry (split: every row is a whole document; stream: the evaluation pass's)."""
        b, length = batch["input_ids"].shape
        grad = torch.is_grad_enabled()
        if carry is None and self.mode == "stream" and self._reading is not None:
            carry = self._reading.get(b)
            if carry is None:
                carry = self._reading[b] = self.new_carry(model, b, length=length, mem="eval")
        if carry is None:
            carry = self.new_carry(model, b, length=length, mem="train" if grad else "eval")
        return segment_loss(model, batch, carry, seg_len=self.seg_len, bptt=bptt,
                            accuracy=not grad, z=z)
