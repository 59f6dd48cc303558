"""The sequence mechanics several mixers share, written once.

- :func:`compact`: a forward's rows with their *real tokens moved to the front* (a stable
  sort: their order kept, padding behind them), the packed documents of the compacted rows,
  and the way back (:meth:`Compact.scatter`). A mixer that counts real tokens (a convolution's
  taps, softmax's bands) works on compacted rows, so left, right and inner padding give the
  row-alone outputs. Built once per forward (memoised on the
  :class:`~blocklab.model.mixer.Sequence`, like its visibility) and shared by every layer.
- :func:`short_conv`: the depthwise short convolution over compacted rows — ``K`` taps, ``ahead``
  of them after the token (0: causal) — whose taps never cross a packed document's boundary
  and never read padding, with the decode *tail* (the last real inputs of each row, carried
  from one forward to the next). Linear attention's, the gated convolution's and the selective
  state space's short convolutions are this one.

Both are tested once against a naive per-document loop (tests/model/test_seqops.py).

Shape legend: B batch, T tokens, d channels, K taps.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import Tensor

if TYPE_CHECKING:
    from blocklab.model.mixer import Sequence


@dataclass(frozen=True)
class Compact:
    """The rows of one forward with their real tokens first (see the module docstring)."""

    order: Tensor | None  # (B, T) the caller's index of each compacted slot; None: no padding
    real: Tensor | None  # (B, T) bool, compacted: the first ``count`` slots; None: no padding
    docs: Tensor | None  # (B, T) document ids, compacted (runs; padding -1); None: no packing
    count: Tensor | None  # (B,) real tokens per row; None: every token is real
    carried: bool = False  # a carry forward: the tail belongs to the first document (id 0)

    def gather(self, x: Tensor) -> Tensor:
        """(B, T, ...) in the caller's order -> compacted."""
        if self.order is None:
            return x
        idx = self.order.view(*self.order.shape, *(1,) * (x.dim() - 2))
        return x.gather(1, idx.expand_as(x))

    def scatter(self, y: Tensor) -> Tensor:
        """(B, T, ...) compacted -> the caller's order (the inverse of :meth:`gather`)."""
        if self.order is None:
            return y
        idx = self.order.view(*self.order.shape, *(1,) * (y.dim() - 2))
        return torch.empty_like(y).scatter_(1, idx.expand_as(y), y)


def compact_rows(valid: Tensor | None, starts: Tensor | None, *,
                 carried: bool = False) -> Compact:
    """:class:`Compact` of rows with real tokens ``valid`` (B, T) (None: all) and document
    starts ``starts`` (B, T) bool (None: one document per row; padding never starts one);
    ``carried``: a carry forward's (the decode tail continues each row's first document)."""
    order = real = count = None
    if valid is not None:
        valid = valid.bool()
        order = torch.sort((~valid).to(torch.int8), dim=1, stable=True).indices
        real = valid.gather(1, order)
        count = valid.long().sum(-1)
    docs = None
    if starts is not None:
        docs = (starts if order is None else starts.gather(1, order)).long().cumsum(-1)
        docs = docs if real is None else torch.where(real, docs, -1)
    return Compact(order, real, docs, count, carried)


#: The decode tail's document id in a carry forward: that of each row's first document (its
#: start is not one, ``Sequence.starts``); elsewhere the tail belongs to no document (-2).
CARRIED_TAIL_DOC, TAIL_DOC = 0, -2


def compact(seq: Sequence) -> Compact:
    """The forward's :class:`Compact`, built once per forward and shared by its layers."""
    return seq.memo("compact", lambda: compact_rows(seq.valid, seq.starts(),
                                                    carried=seq.carried))


def short_conv(x: Tensor, weight: Tensor, bias: Tensor | None, rows: Compact, *,
               ahead: int = 0, tail: Tensor | None = None) -> tuple[Tensor, Tensor | None]:
    """``y_t = bias + Σ_i weight[:, i] · x_{t - back + i}``, ``back = K - 1 - ahead``, over
    the compacted rows ``x`` (B, T, d) (:meth:`Compact.gather`), weight (d, K) in
    ``F.conv1d``'s orientation (tap ``back`` is the token itself; causal: the last). A tap
    reads only real tokens of the token's own document (zero elsewhere, and beyond the row).

    ``tail`` (B, back, d): the row's last ``back`` real inputs before ``x`` (decoding: the
    forward's first document continues them; a carry forward's packed rows: the first
    document's, read by it alone, :data:`CARRIED_TAIL_DOC`). With it, returns
    the new tail as well: the last ``back`` real inputs, cached ones included (those of an
    earlier document zeroed); else (y, None). Computed in ``x``'s dtype."""
    b, t, d = x.shape
    k = weight.shape[1]
    back = k - 1 - ahead
    if rows.real is not None:  # padding sits behind the real tokens: never read
        x = x * rows.real[..., None].to(x.dtype)
    head = x.new_zeros(b, back, d) if tail is None else tail.to(x.dtype)
    ext = torch.cat((head, x, x.new_zeros(b, ahead, d)), 1)  # (B, back + T + ahead, d)
    docs = rows.docs
    dext = None
    if docs is not None:  # the tail: the first document's when carried, else none's
        dext = F.pad(docs, (back, ahead), value=CARRIED_TAIL_DOC if rows.carried else TAIL_DOC)
    y = torch.zeros((), dtype=x.dtype, device=x.device) if bias is None else bias.to(x.dtype)
    for i in range(k):
        shifted = ext[:, i: i + t]  # x_{t - back + i}
        if dext is not None:
            shifted = shifted * (dext[:, i: i + t] == docs)[..., None]
        y = y + shifted * weight[:, i].to(x.dtype)
    if tail is None:
        return y, None
    n = torch.full((b,), t, device=x.device) if rows.count is None else rows.count
    idx = n[:, None] + torch.arange(back, device=x.device)  # (B, back) into ext
    new = ext.gather(1, idx[..., None].expand(b, back, d))
    if dext is not None:  # inputs of an earlier document than the row's last one: none
        last = docs.gather(1, (n - 1).clamp(min=0)[:, None])  # (B, 1)
        new = new * (dext.gather(1, idx) == last)[..., None]
    return y, new
