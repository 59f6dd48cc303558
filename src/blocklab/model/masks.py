"""THE only place that decides which key a query may see.

Polarity, once: ``allowed[..., i, j] is True`` means query ``i`` may attend to key ``j`` (the
convention of ``torch.nn.functional.scaled_dot_product_attention`` boolean masks).

Everything is expressed with *indices into the key buffer*, never with position ids, so the
same rules hold for KV-cache decoding (the ``T_q`` new queries sit at the end of ``T_k`` keys),
left padding and packed documents:

- causal:   key ``j`` visible to query ``i`` iff ``j <= i + (T_k - T_q)``;
- padding:  key ``j`` visible iff ``key_valid[b, j]``;
- document: key ``j`` visible iff ``segments[b, j] == segments[b, i]`` (packed rows);
- cross:    decoder query ``i`` sees encoder key ``j`` iff ``source_valid[b, j]`` and, in packed
  rows, ``segments[b, i] == source_segments[b, j]`` (the source document paired with the
  query's). Neither causal nor windowed: a query sees every such key, before or after it
  (:func:`cross_visibility`; no ``source_valid`` and no segments = every key);
- window:   with ``window = w`` (local layers, see :func:`layer_window`), key ``j`` visible iff
  ``0 <= o_i - o_j <= w - 1`` (causal: the query and the ``w - 1`` tokens before it) or
  ``|o_i - o_j| <= (w - 1) / 2`` (bidirectional, ``w`` odd), where ``o`` is the *order* of a
  token: its index among the real tokens of its row (``cumsum(key_valid) - 1``). Padding never
  counts and packed documents stay apart (the document rule), so a left-padded or packed row
  sees exactly what the same tokens see alone. A KV cache whose local layers keep only a ring
  of recent keys passes the orders of its slots (``q_order``/``k_order``); then the causal
  rule is ``o_j <= o_i`` too, since ring slots are not in key-buffer order (and so does the
  fixed-shape cache of compiled decoding for every layer, whose buffer holds unwritten slots).

Two builders apply these rules: a dense one over all ``Tq × Tk`` pairs
(:func:`self_visibility`), and a banded one for local layers (:func:`banded_visibility`), which
applies the *same* predicates to the keys of a query's neighbouring blocks only, so a window
costs time and memory proportional to ``T · window`` instead of ``T²``. Recurrent mixers
(linear attention, state spaces, convolutions) need no mask at all, only the facts the rules
are made of: :func:`document_starts` (a packed document begins: the state restarts). A chunked
recurrent mixer applies the same rules in chunks (:func:`chunk_visibility`): densely within a
chunk, through its running state across chunks.

A query whose row is entirely invisible (a padding query) gets an all-zero attention output from
SDPA (torch >= 2.5), never NaN; tests guard it.

Shapes: B batch, H heads, Tq queries, Tk keys.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

if TYPE_CHECKING:
    from blocklab.model.softmax_options import SoftmaxOptions


@dataclass(frozen=True)
class Visibility:
    """What SDPA needs: an explicit mask (bool ``allowed`` or additive float scores) or the
    ``is_causal`` fast path, never both."""

    allowed: Tensor | None  # bool (B|1, 1, Tq, Tk), or float additive (B|1, H|1, Tq, Tk)
    causal: bool

    def sdpa_kwargs(self) -> dict[str, Any]:
        return {"attn_mask": self.allowed, "is_causal": self.causal}


EVERYTHING = Visibility(allowed=None, causal=False)


def causal_allowed(q_len: int, k_len: int, device: torch.device | None = None) -> Tensor:
    """(Tq, Tk) bool: the last ``q_len`` of ``k_len`` positions see themselves and the past."""
    q_idx = torch.arange(k_len - q_len, k_len, device=device)[:, None]
    k_idx = torch.arange(k_len, device=device)[None, :]
    return k_idx <= q_idx


def layer_window(attention: SoftmaxOptions, layer: int) -> int | None:
    """The window of 0-based ``layer`` of a stack under the softmax options (window,
    global_every, layers): None (global) without a window; with an explicit ``layers``
    pattern, its entry (repeated over the layers: Qwen2's "first k layers full"); else None for
    layers ``n, 2n, ...`` (1-based) when ``global_every = n`` >= 2 and ``window`` otherwise
    (every layer local at ``global_every = 0``) — the interleaving of Gemma 2 / Mistral-style
    local attention ("Longformer", arXiv 2004.05150; "Gemma 2", arXiv 2408.00118). Every
    caller (the softmax mixer, its cost model, the estimator) asks here, so they agree."""
    a = attention
    if a.window is None:
        return None
    if a.layers:
        return None if a.layers[layer % len(a.layers)] == "global" else a.window
    if a.global_every and (layer + 1) % a.global_every == 0:
        return None
    return a.window


def token_order(valid: Tensor | None, batch: int, length: int,
                device: torch.device | None = None) -> Tensor:
    """(B, T) each token's index among the real tokens of its row (``valid``), which is what a
    window counts; a padding slot gets its predecessor's (it is never visible anyway)."""
    if valid is None:
        return torch.arange(length, device=device).expand(batch, length)
    return valid.long().cumsum(-1) - 1


def window_allowed(q_order: Tensor, k_order: Tensor, window: int | None, *,
                   causal: bool) -> Tensor:
    """(B, 1, Tq, Tk) bool: the window rule on token orders (see the module docstring); a
    causal rule without a window (None) is causality by order alone, ``o_j <= o_i``."""
    distance = q_order[:, None, :, None] - k_order[:, None, None, :]  # query minus key
    if causal:
        return distance >= 0 if window is None else (distance >= 0) & (distance <= window - 1)
    assert window is not None, "a bidirectional order rule needs a window"
    return distance.abs() <= (window - 1) // 2


def self_visibility(
    *,
    causal: bool,
    q_len: int,
    k_len: int,
    key_valid: Tensor | None = None,  # (B, Tk) bool
    q_segments: Tensor | None = None,  # (B, Tq) int
    k_segments: Tensor | None = None,  # (B, Tk) int
    bias: Tensor | None = None,  # (B|1, H, Tq, Tk) float score bias (ALiBi, T5)
    window: int | None = None,  # keys per query, the query included (None = global)
    q_order: Tensor | None = None,  # (B, Tq) int, token orders
    k_order: Tensor | None = None,  # (B, Tk) int
    device: torch.device | None = None,
) -> Visibility:
    """Visibility for self-attention of ``q_len`` new queries over ``k_len`` keys; with a
    ``window``, only keys within it (orders given, or counted from ``key_valid`` over the key
    buffer, whose last ``q_len`` keys are the queries). Given orders (a cache whose keys are
    not in buffer order: local rings, the static cache's whole buffer), causality is by
    order."""
    if window is None and key_valid is None and q_segments is None and bias is None:
        if not causal or q_len == 1:  # one new query sees every cached key
            return EVERYTHING
        if q_len == k_len:
            return Visibility(allowed=None, causal=True)  # SDPA fast path
    allowed = None
    if window is not None or k_order is not None:  # rules on token orders
        if k_order is None:
            b = 1 if key_valid is None else key_valid.shape[0]
            k_order = token_order(key_valid, b, k_len, device)
            q_order = k_order[:, k_len - q_len:]
            if causal:
                allowed = causal_allowed(q_len, k_len, device)[None, None]
        assert q_order is not None, "k_order without q_order"
        near = window_allowed(q_order, k_order, window, causal=causal)
        allowed = near if allowed is None else allowed & near
    elif causal:
        allowed = causal_allowed(q_len, k_len, device)[None, None]  # (1, 1, Tq, Tk)
    if key_valid is not None:
        kv = key_valid[:, None, None, :].bool()  # (B, 1, 1, Tk)
        allowed = kv if allowed is None else allowed & kv
    if q_segments is not None:
        assert k_segments is not None, "q_segments without k_segments"
        same = q_segments[:, None, :, None] == k_segments[:, None, None, :]  # (B, 1, Tq, Tk)
        allowed = same if allowed is None else allowed & same
    if bias is None:
        return Visibility(allowed=allowed, causal=False)
    if allowed is None:
        return Visibility(allowed=bias, causal=False)
    return Visibility(allowed=bias.masked_fill(~allowed, float("-inf")), causal=False)


def document_starts(segments: Tensor, valid: Tensor | None = None) -> Tensor:
    """(B, T) bool: the first real token of each packed document (the document rule's
    boundaries, as a recurrent mixer sees them: its state restarts there)."""
    real = torch.ones_like(segments, dtype=torch.bool) if valid is None else valid.bool()
    # the segment of the previous *real* token (padding never separates or joins documents)
    idx = torch.arange(segments.shape[1], device=segments.device).expand_as(segments)
    last_real = torch.where(real, idx, -1).cummax(-1).values  # (B, T) index of last real <= t
    prev = torch.cat((torch.full_like(last_real[:, :1], -1), last_real[:, :-1]), 1)
    prev_seg = segments.gather(1, prev.clamp(min=0))
    return real & ((prev < 0) | (prev_seg != segments))


@dataclass(frozen=True)
class ChunkVisibility:
    """The causal, padding and document rules for a chunked recurrent mixer (linear
    attention's chunked form), over blocks of ``L`` tokens: ``n`` chunks. ``carried`` and
    ``kept`` are None when every token is real and one document fills the row (all True)."""

    within: Tensor  # (B|1, n|1, L, L) bool: query i sees key j of its own chunk
    carried: Tensor | None  # (B, n, L) bool: token i's document is the one entering its chunk
    kept: Tensor | None  # (B, n, L) bool: key j is in the state leaving its chunk

    @property
    def continues(self) -> Tensor | None:
        """(B, n) bool: the state entering chunk n carries on through it (no document ends
        in it)."""
        return None if self.carried is None else self.carried[:, :, -1]


def chunk_visibility(docs: Tensor | None, valid: Tensor | None, chunk: int, *,
                     strict: bool = False,
                     device: torch.device | None = None) -> ChunkVisibility:
    """The rules of :func:`self_visibility` for ``docs`` (B, n·L) document indices (monotone
    along the row: documents are contiguous runs, padding takes a neighbour's; None = one
    per row) and ``valid`` (B, n·L) real tokens (None = all), in chunks of ``L = chunk``:
    within a chunk, query i sees key j iff ``j <= i`` (``j < i`` with ``strict``: the
    second, reversed half of a bidirectional pass), the same document and a real key. Across
    chunks, query i sees every visible earlier key iff its document is the one the state
    entering its chunk holds — that of the previous chunk's last token (the first token's,
    for chunk 0: a decode state's); and a key enters the state leaving its chunk iff it is
    real and of the chunk's last token's document."""
    order = torch.ones(chunk, chunk, dtype=torch.bool, device=device).tril(-1 if strict else 0)
    if docs is None and valid is None:
        return ChunkVisibility(within=order[None, None], carried=None, kept=None)
    if docs is None:
        docs = torch.zeros_like(valid, dtype=torch.long)
    b, n = docs.shape[0], docs.shape[1] // chunk
    d = docs.reshape(b, n, chunk)  # (B, n, L)
    real = (torch.ones_like(d, dtype=torch.bool) if valid is None
            else valid.reshape(b, n, chunk))
    within = order & (d[..., :, None] == d[..., None, :]) & real[..., None, :]  # (B, n, L, L)
    last = d[..., -1]  # (B, n)
    entering = torch.cat((d[:, :1, 0], last[:, :-1]), 1)  # (B, n) the state's document
    return ChunkVisibility(within=within, carried=d == entering[..., None],
                           kept=real & (d == last[..., None]))


def band_reach(window: int, *, causal: bool) -> int:
    """Keys a local query reaches on one side: ``window - 1`` back (causal) or
    ``(window - 1) // 2`` each way (bidirectional)."""
    return window - 1 if causal else (window - 1) // 2


def band_blocks(x: Tensor, block: int, *, causal: bool, fill: float | int | bool = 0) -> Tensor:
    """(B, nb·L, ...) -> (B, nb, K, ...): for every block of ``L = block`` queries, the keys it
    may reach — the previous block and its own (causal, ``K = 2L``), or the previous, its own
    and the next (bidirectional, ``K = 3L``); blocks beyond the ends read ``fill``. With
    ``L >= band_reach(window)`` every key within a query's window is in its band."""
    b, t = x.shape[:2]
    nb = t // block
    blocks = x.reshape(b, nb, block, *x.shape[2:])  # (B, nb, L, ...)
    edge = torch.full_like(blocks[:, :1], fill)
    prev = torch.cat((edge, blocks[:, :-1]), 1)
    parts = [prev, blocks]
    if not causal:
        parts.append(torch.cat((blocks[:, 1:], edge), 1))
    return torch.cat(parts, 2)  # (B, nb, K, ...)


def banded_visibility(
    *,
    causal: bool,
    window: int,
    block: int,
    order: Tensor,  # (B, nb·L) token orders, queries and keys alike (one forward, no cache)
    valid: Tensor,  # (B, nb·L) bool: a real token (blocks past the end are padding)
    segments: Tensor | None = None,  # (B, nb·L)
    bias: Tensor | None = None,  # (B·nb, H, L, K) score bias of the blocked layout
) -> Visibility:
    """The window rule, the padding rule and the document rule of :func:`self_visibility`,
    for the blocked layout of :func:`band_blocks`: (B·nb, 1, L, K) — query block ``i`` over
    the keys of its band. Orders must grow by one per real token along the row (real tokens
    contiguous: callers move padding to the end first), so the band holds the whole
    window."""
    b, t = order.shape
    nb = t // block
    q_order = order.reshape(b * nb, block)
    k_order = band_blocks(order, block, causal=causal, fill=-(1 << 30)).reshape(b * nb, -1)
    k_valid = band_blocks(valid, block, causal=causal, fill=False).reshape(b * nb, -1)
    seg_q = seg_k = None
    if segments is not None:
        seg_q = segments.reshape(b * nb, block)
        seg_k = band_blocks(segments, block, causal=causal, fill=-1).reshape(b * nb, -1)
    return self_visibility(causal=causal, q_len=block, k_len=k_order.shape[1],
                           key_valid=k_valid, q_segments=seg_q, k_segments=seg_k, bias=bias,
                           window=window, q_order=q_order, k_order=k_order,
                           device=order.device)


def cross_visibility(source_valid: Tensor | None, q_segments: Tensor | None = None,
                     k_segments: Tensor | None = None) -> Visibility:
    """Visibility of decoder queries over encoder outputs: only real (non-padding) sources, and
    in packed rows only the source document paired with the query's (same segment id)."""
    allowed = None if source_valid is None else source_valid[:, None, None, :].bool()  # (B,1,1,S)
    if q_segments is not None and k_segments is not None:
        same = q_segments[:, None, :, None] == k_segments[:, None, None, :]  # (B, 1, Tq, S)
        allowed = same if allowed is None else allowed & same
    return EVERYTHING if allowed is None else Visibility(allowed=allowed, causal=False)
