"""THE only place that decides which key a query may see.

Polarity, once: ``allowed[..., i, j] is True`` means query ``i`` may attend to key ``j`` (the
convention of ``torch.nn.functional.scaled_dot_product_attention`` boolean masks).

Everything is expressed with *indices into the key buffer*, never with position ids, so the
same rules hold for KV-cache decoding (the ``T_q`` new queries sit at the end of ``T_k`` keys),
left padding and packed documents:

- causal:   key ``j`` visible to query ``i`` iff ``j <= i + (T_k - T_q)``;
- padding:  key ``j`` visible iff ``key_valid[b, j]``;
- document: key ``j`` visible iff ``segments[b, j] == segments[b, i]`` (packed rows);
- cross:    decoder query sees encoder key ``j`` iff ``source_valid[b, j]`` (never windowed);
- window:   with ``window = w`` (local layers, see :func:`layer_window`), key ``j`` visible iff
  ``0 <= o_i - o_j <= w - 1`` (causal: the query and the ``w - 1`` tokens before it) or
  ``|o_i - o_j| <= (w - 1) / 2`` (bidirectional, ``w`` odd), where ``o`` is the *order* of a
  token: its index among the real tokens of its row (``cumsum(key_valid) - 1``). Padding never
  counts and packed documents stay apart (the document rule), so a left-padded or packed row
  sees exactly what the same tokens see alone. A KV cache whose local layers keep only a ring
  of recent keys passes the orders of its slots (``q_order``/``k_order``); then the causal
  rule is ``o_j <= o_i`` too, since ring slots are not in key-buffer order (and so does the
  fixed-shape cache of compiled decoding for every layer, whose buffer holds unwritten slots).

A query whose row is entirely invisible (a padding query) gets an all-zero attention output from
SDPA (torch >= 2.5), never NaN; tests guard it.

Shapes: B batch, H heads, Tq queries, Tk keys.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor


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


def layer_window(window: int | None, global_every: int, layer: int) -> int | None:
    """The window of 0-based ``layer`` (``model.attention.window`` / ``global_every``): None
    (global) without a window and for layers ``n, 2n, ...`` (1-based) when ``global_every = n``
    >= 2; else ``window`` (every layer local at ``global_every = 0``), the interleaving of
    Gemma 2 / Mistral-style local attention ("Longformer", arXiv 2004.05150; "Gemma 2",
    arXiv 2408.00118)."""
    if window is None or (global_every and (layer + 1) % global_every == 0):
        return None
    return window


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


def cross_visibility(source_valid: Tensor | None, q_segments: Tensor | None = None,
                     k_segments: Tensor | None = None) -> Visibility:
    """Visibility of decoder queries over encoder outputs: only real (non-padding) sources, and
    in packed rows only the source document paired with the query's (same segment id)."""
    allowed = None if source_valid is None else source_valid[:, None, None, :].bool()  # (B,1,1,S)
    if q_segments is not None and k_segments is not None:
        same = q_segments[:, None, :, None] == k_segments[:, None, None, :]  # (B, 1, Tq, S)
        allowed = same if allowed is None else allowed & same
    return EVERYTHING if allowed is None else Visibility(allowed=allowed, causal=False)
