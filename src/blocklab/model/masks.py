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

A local layer may carry a :class:`Pattern` instead of a bare window (``layer_pattern``), its
rules on the *document order* ``d`` of a token (its index among the real tokens of its
document: ``o`` minus the order of the document's first real token; ``o`` when decoding, which
has no packing), so padding and packing never move them:

- sinks:    with ``sinks = n``, key ``j`` is visible too iff ``d_j < n`` (the first ``n`` real
  tokens of the query's document; causal: still ``o_j <= o_i``) — StreamingLLM's attention
  sinks beside the window;
- chunk:    with ``chunk = c`` (instead of a window), key ``j`` visible iff ``d_j // c ==
  d_i // c`` (the query's chunk of its document; causal: ``o_j <= o_i``) — Llama 4's chunked
  attention.
- global:   with ``global_tokens = g``, the first ``g`` real tokens of each document are
  global (Longformer): seen by every query of their document (``d_j < g``, as sinks are) and
  seeing every key of it (``d_i < g``; causal: ``o_j <= o_i``, so only their past — the other
  global tokens: causal global tokens are sinks). With ``marked``, tokens of
  ``global_token_id`` are global too (``marked_j`` / ``marked_i``; causal: all their past).
- random:   with ``random_blocks = r``, key ``j`` visible too iff its block ``d_j // s`` is
  among the ``r`` drawn for the query's ``d_i // s`` (BigBird; ``s = block_size``, the drawn
  ``table``: random_blocks.py; causal: earlier blocks only).

Two builders apply these rules: a dense one over all ``Tq × Tk`` pairs
(:func:`self_visibility`), and a banded one for local layers (:func:`banded_visibility`), which
applies the *same* predicates to the keys of a query's neighbouring blocks only, so a window
costs time and memory proportional to ``T · window`` instead of ``T²`` (a chunk of rows of
one document each: blocks of whole chunks over their own keys alone, ``T · chunk``; of packed
rows, whose documents begin anywhere: a band of ``chunk - 1`` keys each way; sinks add the
first ``n`` tokens of the one document that can begin before a band: bands.py). Recurrent mixers
(linear attention, state spaces, convolutions) need no mask at all, only the facts the rules
are made of: :func:`document_starts` (a packed document begins: the state restarts). A chunked
recurrent mixer applies the same rules in chunks (:func:`chunk_visibility`): densely within a
chunk, through its running state across chunks.

A query whose row is entirely invisible (a padding query) gets an all-zero attention output from
SDPA (torch >= 2.5), never NaN; tests guard it.

Shapes: B batch, H heads, Tq queries, Tk keys.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from blocklab.model import random_blocks

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


@dataclass(frozen=True)
class Pattern:
    """A local layer's visibility beyond a bare window (the module docstring's sink and chunk
    rules): hashable, so the visibility it makes is built once per forward."""

    window: int | None = None  # keys per query, the query included (None with a chunk)
    sinks: int = 0  # first real tokens of each document always visible
    chunk: int | None = None  # tokens per chunk of a document (instead of a window)
    global_tokens: int = 0  # first real tokens of each document that see and are seen by all
    random_blocks: int = 0  # BigBird: random key blocks per query block of a document
    block_size: int = 16  # tokens per random block
    draw: tuple[int, int] = (0, 0)  # (pattern_seed, layer): which draw the table holds
    marked: bool = False  # tokens marked by id (global_token_id) are global too
    table: Tensor | None = field(default=None, compare=False, hash=False, repr=False)

    def reach(self, *, causal: bool) -> int:
        """Keys the window or chunk reaches on one side (:func:`band_reach`)."""
        if self.chunk is not None:
            return self.chunk - 1
        assert self.window is not None
        return band_reach(self.window, causal=causal)

    @property
    def kept(self) -> int:
        """First real tokens of each document every query sees (sinks and global tokens)."""
        return max(self.sinks, self.global_tokens)

    def back(self) -> int:
        """Earlier keys (sinks aside) a later query can still see: a decode ring's slots."""
        return self.chunk - 1 if self.chunk is not None else self.window - 1  # type: ignore


def band_reach(window: int | Pattern, *, causal: bool) -> int:
    """Keys a local query reaches on one side: ``window - 1`` back (causal) or
    ``(window - 1) // 2`` each way (bidirectional); a chunk ``c``: ``c - 1`` either way. The
    blocked layout of these rules (bands.py) makes its blocks at least this long."""
    if isinstance(window, Pattern):
        return window.reach(causal=causal)
    return window - 1 if causal else (window - 1) // 2


def layer_pattern(attention: SoftmaxOptions, layer: int) -> int | Pattern | None:
    """What layer ``layer`` sees: None (global), its window (a bare window, as
    :func:`layer_window`), or a :class:`Pattern` (sinks, chunks). Local layers are those the
    window pattern leaves local (``global_every``, ``layers``), with a window or a chunk."""
    a = attention
    chunk, g = a.attention_chunk, a.global_tokens
    r = {"random_blocks": a.random_blocks, "block_size": a.block_size,
         "draw": (a.pattern_seed, layer)} if a.random_blocks else {}
    if a.global_token_id is not None:
        r["marked"] = True
    if chunk is None:
        w = layer_window(a, layer)
        if w is None or not (a.sinks or g or r):
            return w
        return Pattern(window=w, sinks=a.sinks, global_tokens=g, **r)
    if local_layer(a, layer):
        return Pattern(sinks=a.sinks, chunk=chunk, global_tokens=g, **r)
    return None


def local_layer(attention: SoftmaxOptions, layer: int) -> bool:
    """Whether ``layer`` is local under ``global_every`` / ``layers`` (every layer without
    either), given a window or a chunk."""
    a = attention
    if a.window is None and a.attention_chunk is None:
        return False
    if a.layers:
        return a.layers[layer % len(a.layers)] != "global"
    return not (a.global_every and (layer + 1) % a.global_every == 0)


def unpack(window: int | Pattern | None) -> tuple[int | None, int, int | None]:
    """(window, tokens every query sees — sinks and global tokens —, chunk) of a bare window
    or a :class:`Pattern`."""
    if isinstance(window, Pattern):
        return window.window, window.kept, window.chunk
    return window, 0, None


def document_order(order: Tensor, segments: Tensor | None, valid: Tensor | None) -> Tensor:
    """(B, T) each token's index among the real tokens of its document (``order`` minus the
    order of its document's first real token), over a row of one forward (``order`` counted
    along it, ``segments`` its packed documents; None: one per row)."""
    if segments is None:
        return order
    starts = document_starts(segments, valid)
    return order - torch.where(starts, order, 0).cummax(-1).values


def token_order(valid: Tensor | None, batch: int, length: int,
                device: torch.device | None = None) -> Tensor:
    """(B, T) each token's index among the real tokens of its row (``valid``), which is what a
    window counts; a padding slot gets its predecessor's (it is never visible anyway)."""
    if valid is None:
        return torch.arange(length, device=device).expand(batch, length)
    return valid.long().cumsum(-1) - 1


def window_allowed(q_order: Tensor, k_order: Tensor, window: int | Pattern | None, *,
                   causal: bool, q_doc: Tensor | None = None, k_doc: Tensor | None = None,
                   q_marked: Tensor | None = None, k_marked: Tensor | None = None) -> Tensor:
    """(B, 1, Tq, Tk) bool: the window rule on token orders (see the module docstring); a
    causal rule without a window (None) is causality by order alone, ``o_j <= o_i``. A
    :class:`Pattern` adds its sink and chunk rules on the document orders ``q_doc`` /
    ``k_doc`` (default: the token orders — one document per row)."""
    w, sinks, chunk = unpack(window)
    distance = q_order[:, None, :, None] - k_order[:, None, None, :]  # query minus key
    qd = q_order if q_doc is None else q_doc
    kd = k_order if k_doc is None else k_doc
    if chunk is not None:
        near = qd[:, None, :, None] // chunk == kd[:, None, None, :] // chunk
    elif w is None:
        assert causal, "a bidirectional order rule needs a window"
        near = None
    else:
        near = distance <= w - 1 if causal else distance.abs() <= (w - 1) // 2
    if sinks and near is not None:  # sinks and global tokens, as keys
        near = near | (kd[:, None, None, :] < sinks)
    g = window.global_tokens if isinstance(window, Pattern) else 0
    if g and near is not None:  # global tokens, as queries
        near = near | (qd[:, None, :, None] < g)
    if isinstance(window, Pattern) and window.random_blocks and near is not None:
        assert window.table is not None, "random blocks without their drawn table"
        near = near | random_blocks.member(window.table, window.block_size, qd, kd)
    if getattr(window, "marked", False) and near is not None and k_marked is not None:
        near = near | k_marked[:, None, None, :].bool() | q_marked[:, None, :, None].bool()
    if not causal:
        return near
    return distance >= 0 if near is None else (distance >= 0) & near


def self_visibility(
    *,
    causal: bool,
    q_len: int,
    k_len: int,
    key_valid: Tensor | None = None,  # (B, Tk) bool
    q_segments: Tensor | None = None,  # (B, Tq) int
    k_segments: Tensor | None = None,  # (B, Tk) int
    bias: Tensor | None = None,  # (B|1, H, Tq, Tk) float score bias (ALiBi, T5)
    window: int | Pattern | None = None,  # keys per query, the query included (None = global)
    q_order: Tensor | None = None,  # (B, Tq) int, token orders
    k_order: Tensor | None = None,  # (B, Tk) int
    q_doc: Tensor | None = None,  # (B, Tq) int, document orders (a Pattern's rules)
    k_doc: Tensor | None = None,  # (B, Tk) int
    q_marked: Tensor | None = None,  # (B, Tq) bool, marked global (a Pattern's ``marked``)
    k_marked: Tensor | None = None,  # (B, Tk) bool
    device: torch.device | None = None,
) -> Visibility:
    """Visibility for self-attention of ``q_len`` new queries over ``k_len`` keys; with a
    ``window``, only keys within it (orders given, or counted from ``key_valid`` over the key
    buffer, whose last ``q_len`` keys are the queries). Given orders (a cache whose keys are
    not in buffer order: local rings, the static cache's whole buffer), causality is by
    order. A :class:`Pattern`'s document orders are counted from the segments of one
    forward (``q_len == k_len``) unless given; without segments they are the token orders."""
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
            if isinstance(window, Pattern) and k_doc is None and k_segments is not None:
                assert q_len == k_len, "document orders of a cache are its token orders"
                k_doc = q_doc = document_order(k_order, k_segments, key_valid)
        assert q_order is not None, "k_order without q_order"
        near = window_allowed(q_order, k_order, window, causal=causal, q_doc=q_doc,
                              k_doc=k_doc, q_marked=q_marked, k_marked=k_marked)
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


def additive(vis: Visibility, q_len: int, k_len: int, device: torch.device) -> Tensor | None:
    """``vis`` as float scores to add (B|1, H|1, Tq, Tk): its bias, -inf at a pair it forbids
    (explicit attention, model/scores.py; a sink); None = every pair, no bias."""
    allowed = vis.allowed
    if allowed is None and vis.causal:
        allowed = causal_allowed(q_len, k_len, device)[None, None]
    if allowed is None or allowed.dtype != torch.bool:
        return allowed
    return torch.zeros(allowed.shape, device=device).masked_fill(~allowed, float("-inf"))


def with_sink(vis: Visibility, logits: Tensor, q_len: int, k_len: int) -> Visibility:
    """``vis`` over one more key, the last, visible to every query with the additive score
    ``logits`` (H,) per head: a learned attention sink (its value is zero). Additive float
    scores (B|1, H, Tq, Tk + 1) in ``logits``' dtype; a padding query then attends to the
    sink alone (output zero, never NaN)."""
    scores = additive(vis, q_len, k_len, logits.device)
    scores = logits.new_zeros(1, 1, q_len, k_len) if scores is None else scores.to(logits.dtype)
    h = logits.shape[0]
    scores = scores.expand(scores.shape[0], h, q_len, k_len)
    sink = logits.view(1, h, 1, 1).expand(scores.shape[0], h, q_len, 1)
    return Visibility(allowed=torch.cat((scores, sink), -1), causal=False)


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


def cross_visibility(source_valid: Tensor | None, q_segments: Tensor | None = None,
                     k_segments: Tensor | None = None) -> Visibility:
    """Visibility of decoder queries over encoder outputs: only real (non-padding) sources, and
    in packed rows only the source document paired with the query's (same segment id)."""
    allowed = None if source_valid is None else source_valid[:, None, None, :].bool()  # (B,1,1,S)
    if q_segments is not None and k_segments is not None:
        same = q_segments[:, None, :, None] == k_segments[:, None, None, :]  # (B, 1, Tq, S)
        allowed = same if allowed is None else allowed & same
    return EVERYTHING if allowed is None else Visibility(allowed=allowed, causal=False)
