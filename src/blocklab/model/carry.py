"""Carrying state across segments: a long row read segment by segment, every layer's decode
state carried from one segment to the next with autograd on (truncated backpropagation
through time for recurrent mixers; an exact sliding window for local attention; the whole
document for softmax layers that keep every key).

The carried state *is* the decode cache (cache.py) in carry mode,
``model.new_cache(batch, None, carry=True)``: every state and book writes functionally
(:meth:`~blocklab.model.mixer.Rows.put`, ``writable``: new tensors instead of in-place
copies), so a forward with gradients may write it and a later segment's loss reaches earlier
segments' weights. The contract, per segment:

- ``cache.enter(doc_first)``: (B,) the lane-global document id of each row's first token in
  the coming segment; a row whose id differs from the last one it saw is emptied
  (``cache.reset_rows``), the others continue;
- ``model(ids, valid=, segments=, cache=cache)``: ``segments`` (B, T) are the same lane-global
  ids (monotone along a row). A document starting inside the segment restarts every
  recurrent state there, and the key books keep each key's document, so memory of one
  document is never visible to another; positions continue across the boundary for the
  continuing document (:func:`carry_positions`) and restart at each new one;
- ``cache.detach()`` every ``k`` segments (truncated backpropagation through ``k`` segments);
- ``cache.state_dict()`` / ``load_state_dict()``: the whole carry, for exact resume.

Exactness (tests/model/test_carry.py): segment by segment equals the plain forward over the
concatenated row — logits and every parameter's gradient — for every decoder mixer, packed
and padded. Limits: a softmax layer keeping every key (no window) and ``gated_conv``'s long
filter grow with the document: their carry needs a capacity (the document length). Attention
patterns that count from a document's start (sinks, global tokens, ``attention_chunk``) read
a document's token counts from the positions (which count them in a carry forward) and keep
each new document's sinks in the ring's sink slots: callers of a carry cache let the model
derive positions (``positions=None``).

Shape legend: B batch (lanes), T segment tokens, L row tokens.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from blocklab.model.masks import document_starts
from blocklab.model.position import positions_from_segments, positions_from_valid

if TYPE_CHECKING:
    from blocklab.model.cache import DecodeCache


def carry_positions(x: Tensor, valid: Tensor | None, segments: Tensor | None,
                    cache: DecodeCache) -> Tensor:
    """(B, T) positions of a carry forward: per document (counting real tokens), the row's
    first document continued from the position after its last real token in the cache (0
    for a row just emptied)."""
    b, t = x.shape[:2]
    if segments is not None:
        pos = positions_from_segments(segments, valid)
        first = document_starts(segments, valid).long().cumsum(-1) <= 1  # (B, T)
        return pos + torch.where(first, cache.next_position[:, None], 0)
    pos = (positions_from_valid(valid) if valid is not None
           else torch.arange(t, device=x.device).expand(b, t))
    return pos + cache.next_position[:, None]


def first_documents(segments: Tensor | None, valid: Tensor | None,
                    cache: DecodeCache) -> Tensor:
    """(B,) each row's document id at its first real token of a segment (``segments`` (B, T);
    None: one document, id 0); a row without a real token keeps its last id."""
    b = cache.last_doc.shape[0]
    if segments is None:
        return torch.zeros(b, dtype=torch.long, device=cache.last_doc.device)
    if valid is None:
        return segments[:, 0]
    real = valid.bool()
    first = real.long().argmax(-1)  # the first True (0 when none)
    doc = segments.gather(1, first[:, None])[:, 0]
    return torch.where(real.any(-1), doc, cache.last_doc)


def run_segments(model: Any, ids: Tensor, *, seg_len: int, cache: DecodeCache,
                 valid: Tensor | None = None, segments: Tensor | None = None) -> Tensor:
    """(B, L) ids read in segments of ``seg_len`` tokens through the carry ``cache``
    (``cache.enter`` then a forward per segment) -> (B, L, V) logits, concatenated. ``valid``
    (B, L) real tokens, ``segments`` (B, L) lane-global document ids (None: one document
    per row, continued)."""
    if not cache.carry:
        raise ValueError("run_segments needs a carry cache: model.new_cache(batch, None, "
                         "carry=True)")
    out = []
    for s in range(0, ids.shape[1], seg_len):
        cut = slice(s, s + seg_len)
        v = None if valid is None else valid[:, cut]
        sg = None if segments is None else segments[:, cut]
        cache.enter(first_documents(sg, v, cache))
        out.append(model(ids[:, cut], valid=v, segments=sg, cache=cache))
    return torch.cat(out, 1)
