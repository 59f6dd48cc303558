"""The blocked layout of masks.py's rules for local layers: blocks of ``L`` queries, each over
the keys of its *band* (its own block of keys and the ``back`` blocks before it; encoders also
the ``ahead`` blocks after it: :class:`Layout`) and, with attention sinks, the first ``n``
tokens of the one document that can begin before the band, and with BigBird's random blocks
each block's drawn keys (random_blocks.py). Every key of a query's window, chunk, sinks or
random blocks is in its band or its extras, and each key appears once, so a local layer costs
time and memory proportional to ``T · (K + n)`` instead of ``T²``. Which of those keys a query
sees is then decided by the same predicates as the dense mask
(:func:`~blocklab.model.masks.self_visibility`, applied here per band).

The layouts (:func:`layout`): a window — blocks of ``L >= reach`` queries over the previous
and their own block (``K = 2L``; encoders ``3L``); a chunked layer whose rows hold one
document each — blocks of whole chunks aligned with them (compacted rows start their one
document at slot 0), over their own block alone (``K = L``, a multiple of the chunk, so a
chunk ``c`` scores about ``c / T`` of the pairs); packed chunked rows, whose documents begin
anywhere, the window's layout with ``reach = c - 1``; random blocks — blocks of whole random
blocks (``L`` a multiple of ``block_size``, at least ``MIN_BLOCK``) over as many earlier
(and later) blocks as the reach needs, so each query scores the drawn keys of its own query
block only (``r · L`` keys, ``r · block_size`` for ``L = block_size``).

Shapes: B batch, nb blocks of L queries, K keys of a band ((back + 1 + ahead) · L), n sinks.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from blocklab.model import masks, random_blocks

if TYPE_CHECKING:
    from blocklab.model.position import Position

#: the order a key beyond either end of the row gets (never within a window)
FAR = -(1 << 30)


@dataclass(frozen=True)
class Layout:
    """Blocks of ``block`` queries, each over its own block of keys, the ``back`` blocks
    before it and the ``ahead`` blocks after it (its band)."""

    block: int
    back: int = 1
    ahead: int = 0

    @property
    def width(self) -> int:
        """K: the keys of a band."""
        return (self.back + 1 + self.ahead) * self.block

    def bounds(self, nb: int, device: torch.device | None = None) -> tuple[Tensor, Tensor]:
        """(nb,) each band's first key and (nb,) the key after its last (row slots; beyond
        the row's ends where the band is)."""
        first = (torch.arange(nb, device=device) - self.back) * self.block
        return first, first + self.width


def layout(window: int | masks.Pattern, *, causal: bool, min_block: int,
           packed: bool) -> Layout:
    """The blocked layout of a local layer's rule (the module docstring): ``packed`` rows
    hold several documents (their chunks then begin anywhere in the compacted row)."""
    reach = masks.band_reach(window, causal=causal)
    pattern = window if isinstance(window, masks.Pattern) else masks.Pattern(window=window)
    base = max(min_block, pattern.kept)
    s = pattern.block_size if pattern.random_blocks else 1
    if pattern.chunk is not None and not packed:  # whole chunks, aligned: own block only
        unit = math.lcm(pattern.chunk, s)
        block = -(-base // unit) * unit
        if block < 2 * max(reach, base):  # cheaper than the window's layout
            return Layout(block, 0, 0)
    if s > 1:  # whole random blocks; as many neighbouring blocks as the reach needs
        block = -(-base // s) * s
        back = max(1, -(-reach // block))
        return Layout(block, back, 0 if causal else back)
    return Layout(max(reach, base), 1, 0 if causal else 1)


def band_blocks(x: Tensor, lay: Layout, fill: float | int | bool = 0) -> Tensor:
    """(B, nb·L, ...) -> (B, nb, K, ...): for every block of ``L`` queries, the keys it may
    reach — the ``back`` blocks before it, its own, the ``ahead`` blocks after it; blocks
    beyond the ends read ``fill``. With :func:`layout`'s blocks every key within a query's
    window (or chunk) is in its band."""
    b, t = x.shape[:2]
    nb = t // lay.block
    blocks = x.reshape(b, nb, lay.block, *x.shape[2:])  # (B, nb, L, ...)
    if not lay.back and not lay.ahead:
        return blocks
    edge = torch.full_like(blocks[:, :1], fill)
    padded = torch.cat((edge.expand(b, lay.back, *blocks.shape[2:]), blocks,
                        edge.expand(b, lay.ahead, *blocks.shape[2:])), 1)
    parts = [padded[:, j:j + nb] for j in range(lay.back + 1 + lay.ahead)]
    return torch.cat(parts, 2)  # (B, nb, K, ...)


@dataclass(frozen=True)
class Band:
    """The keys of every query block of one forward's compacted rows (real tokens first, so
    orders grow by one along a row): its band (:func:`band_blocks`) then its ``n`` sink keys
    — the first ``n`` tokens of the document holding the band's first key, the only document
    of the block's queries that can begin before the band (``n <= L``: a document beginning
    inside the band has its sinks there). A sink key already inside the band is not
    ``fresh``: invalid here, so no key is counted twice."""

    lay: Layout
    extra: Tensor | None = None  # (B, nb, n) indices of the sink keys into the row
    fresh: Tensor | None = None  # (B, nb, n) bool: the sink key lies before the band

    @staticmethod
    def of(length: int, lay: Layout, *, sinks: int = 0,
           segments: Tensor | None = None, batch: int = 1,
           device: torch.device | None = None,
           extras: tuple[tuple[Tensor, Tensor], ...] = ()) -> Band:
        """The band of rows of ``length = nb·L`` slots (``segments``: their packed
        documents, contiguous runs; None: one document per row). ``extras``: more keys of
        each block after the sink keys, (B|1, nb, E) indices and ``fresh`` (random blocks:
        random_blocks.py ``band_keys``; marked tokens: :func:`marked_keys`)."""
        if not sinks and not extras:
            return Band(lay)
        assert sinks <= lay.block, "sinks beyond a block could begin outside the band"
        nb = length // lay.block
        first = lay.bounds(nb, device)[0]  # (nb,) each band's first key
        if segments is None:
            start = torch.zeros(batch, nb, dtype=torch.long, device=device)
        else:
            idx = torch.arange(length, device=device).expand_as(segments)
            starts = masks.document_starts(segments)
            doc_first = torch.where(starts, idx, 0).cummax(-1).values  # (B, T)
            start = doc_first[:, first.clamp(min=0)]  # (B, nb)
        extra = start[..., None] + torch.arange(sinks, device=device)  # (B, nb, n)
        fresh = extra < first[None, :, None]
        extra = extra.clamp(max=length - 1)
        for idx, ok in extras:
            b = max(extra.shape[0], idx.shape[0] if idx.dim() == 3 else 1)
            extra = torch.cat((extra.expand(b, -1, -1), idx.expand(b, -1, -1)), -1)
            fresh = torch.cat((fresh.expand(b, -1, -1), ok.expand(b, -1, -1)), -1)
        return Band(lay, extra, fresh)

    def keys(self, x: Tensor, fill: float | int | bool = 0) -> Tensor:
        """(B, nb·L, ...) -> (B·nb, K + n, ...): each query block's keys (band, then sinks,
        then random keys)."""
        band = band_blocks(x, self.lay, fill)  # (B, nb, K, ...)
        b, nb = band.shape[:2]
        if self.extra is not None:
            n = self.extra.shape[-1]
            idx = self.extra.reshape(b, nb * n, *(1,) * (x.dim() - 2))
            sink = x.gather(1, idx.expand(b, nb * n, *x.shape[2:]))
            band = torch.cat((band, sink.reshape(b, nb, n, *x.shape[2:])), 2)
        return band.reshape(b * nb, -1, *x.shape[2:])

    def valid(self, real: Tensor) -> Tensor:
        """(B, nb·L) real tokens -> (B·nb, K + n): a key that exists, and a sink key only
        where it is fresh (not already in the band)."""
        k = self.keys(real, False)
        if self.fresh is None:
            return k
        n = self.fresh.shape[-1]
        return torch.cat((k[:, :-n], k[:, -n:] & self.fresh.reshape(-1, n)), 1)


def marked_keys(marked: Tensor, doc: Tensor, lay: Layout, *,
                kept: int) -> tuple[Tensor, Tensor]:
    """The marked keys (``global_token_id``) of compacted rows (B, nb·L) as every block's
    extra keys: (B, nb, M) indices and ``fresh`` — a real marked key outside the band and not
    among the first ``kept`` of its document (the sink keys hold those). ``M``: the most
    marked tokens of a row, a count read from the data (one graph break under compile)."""
    b, t = marked.shape
    nb = t // lay.block
    count = int(marked.sum(-1).max())
    idx = torch.sort((~marked).to(torch.int8), dim=1, stable=True).indices[:, :count]
    ok = marked.gather(1, idx) & (doc.gather(1, idx) >= kept)  # (B, M)
    lo, hi = (z[None, :, None] for z in lay.bounds(nb, marked.device))
    pos = idx[:, None, :]
    return pos.expand(b, nb, count), ok[:, None, :] & ((pos < lo) | (pos >= hi))


def forward_band(window: int | masks.Pattern, lay: Layout, *, causal: bool, real: Tensor,
                 segments: Tensor | None, marked: Tensor | None,
                 table: Tensor | None) -> Band:
    """The :class:`Band` of one forward's compacted rows (B, nb·L) (``real``: their real
    tokens): the sink keys (sinks and global tokens), BigBird's drawn keys (``table``:
    random_blocks.py, rows of one document each) and the marked keys, each listed once."""
    b, tp = real.shape
    kept = masks.unpack(window)[1]
    extras = [] if table is None else [random_blocks.band_keys(
        table, window.block_size, length=tp, lay=lay, kept=kept)]  # type: ignore[union-attr]
    if marked is not None:  # marked keys, each once (not again as a random key)
        ranks = torch.arange(tp, device=real.device).expand(b, tp)
        extras = [(i, f & ~marked[:, i]) for i, f in extras] + [marked_keys(
            marked, masks.document_order(ranks, segments, real), lay, kept=kept)]
    return Band.of(tp, lay, sinks=kept, segments=segments, batch=b, device=real.device,
                   extras=tuple(extras))


def banded_visibility(
    *,
    causal: bool,
    window: int | masks.Pattern,
    band: Band,  # the keys of each block
    order: Tensor,  # (B, nb·L) token orders, queries and keys alike (one forward, no cache)
    valid: Tensor,  # (B, nb·L) bool: a real token (blocks past the end are padding)
    segments: Tensor | None = None,  # (B, nb·L)
    bias: Tensor | None = None,  # (B·nb, H, L, K + n) score bias of the blocked layout
    marked: Tensor | None = None,  # (B, nb·L) bool: tokens marked global (global_token_id)
) -> masks.Visibility:
    """The window rule (or a :class:`~blocklab.model.masks.Pattern`'s), the padding rule and
    the document rule of :func:`~blocklab.model.masks.self_visibility`, for the blocked
    layout of :class:`Band`: (B·nb, 1, L, K + n) — query block ``i`` over its keys. Orders
    must grow by one per real token along the row (real tokens contiguous: callers move
    padding to the end first), so the band holds the whole window."""
    b, t = order.shape
    block = band.lay.block
    nb = t // block
    q_order = order.reshape(b * nb, block)
    k_order = band.keys(order, FAR)
    k_valid = band.valid(valid)
    seg_q = seg_k = q_doc = k_doc = q_marked = k_marked = None
    if marked is not None:
        q_marked, k_marked = marked.reshape(b * nb, block), band.keys(marked, False)
    if segments is not None:
        seg_q = segments.reshape(b * nb, block)
        seg_k = band.keys(segments, -1)
    if isinstance(window, masks.Pattern):
        doc = masks.document_order(order, segments, valid)
        q_doc, k_doc = doc.reshape(b * nb, block), band.keys(doc, FAR)
    return masks.self_visibility(causal=causal, q_len=block, k_len=k_order.shape[1],
                                 key_valid=k_valid, q_segments=seg_q, k_segments=seg_k,
                                 bias=bias, window=window, q_order=q_order, k_order=k_order,
                                 q_doc=q_doc, k_doc=k_doc, q_marked=q_marked,
                                 k_marked=k_marked, device=order.device)


def global_queries(pattern: masks.Pattern, order: Tensor, valid: Tensor,
                   segments: Tensor | None, positions: Tensor, position: Position,
                   marked: Tensor | None = None,
                   causal: bool = False) -> tuple[Tensor, Tensor, masks.Visibility]:
    """The global queries of compacted rows (``order`` growing by one per real token): the
    first ``g = pattern.global_tokens`` real tokens of each document, (B, G) indices into the
    row with (B, G) ``ok`` (a real global query: the rest pad the count), and their
    bidirectional visibility over every key of the row (the dense rule, so all of their
    document; ``causal``: their past). With ``marked``, the marked tokens too. G is ``g`` for
    rows of one document each without marks, else the most global queries of a row (a count
    read from the data)."""
    b, t = order.shape
    doc = masks.document_order(order, segments, valid)
    is_global = valid & (doc < pattern.global_tokens)
    if marked is not None:  # and the marked tokens (their count read from the data too)
        is_global = is_global | (valid & marked)
    if segments is None and marked is None:  # the first g slots (real tokens first)
        idx = torch.arange(min(pattern.global_tokens, t), device=order.device).expand(b, -1)
    else:
        count = int(is_global.sum(-1).max())
        idx = torch.sort((~is_global).to(torch.int8), dim=1, stable=True).indices[:, :count]
    ok = is_global.gather(1, idx)
    seg_q = None if segments is None else segments.gather(1, idx)
    q_marked = None if marked is None else marked.gather(1, idx)
    vis = masks.self_visibility(
        causal=causal, q_len=idx.shape[1], k_len=t, key_valid=valid, q_segments=seg_q,
        q_marked=q_marked, k_marked=marked,
        k_segments=segments, window=pattern, q_order=order.gather(1, idx), k_order=order,
        q_doc=doc.gather(1, idx), k_doc=doc,
        bias=position.score_bias(positions.gather(1, idx), positions), device=order.device)
    return idx, ok, vis
