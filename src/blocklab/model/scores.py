"""Softmax attention computed explicitly — scores, softcap, mask, softmax, values — beside
PyTorch's fused ``scaled_dot_product_attention`` (SDPA), with the same arguments and the same
result within float tolerance (tests/model/test_stability_knobs.py checks it over the variant
grid's paths). :func:`~blocklab.model.attention._sdpa` runs it when SDPA cannot: a layer with
an attention-logit softcap (SDPA has none), or a layer whose ``stats`` list asks for the
monitor's readings (the largest raw score and the entropy of the attention distribution).

SDPA's semantics are kept: ``is_causal`` is its lower triangle (blocklab asks for it with as
many queries as keys only), a bool mask says which pairs are allowed, a float mask is added to
the scores (ALiBi / T5 biases, ``-inf`` for a forbidden pair) — masks.additive reads either —
a query row that sees no key gets zeros (never NaN), ``enable_gqa`` shares each key/value head
among ``H / Hkv`` consecutive query heads, ``scale`` None is ``1/sqrt(D)``, and dropout
(training only) acts on the probabilities.

The softcap ("Gemma 2", arXiv 2408.00118; HF ``modeling_gemma2.eager_attention_forward``):
``scores <- c · tanh(scores / c)`` after the score scale, before the mask (and any additive
bias) is added. A learned sink logit (gpt-oss) is one more column of the softmax, of value
zero, not capped (it is no ``q · k`` score).

Shape legend: B batch, H query heads, Hkv key/value heads, Tq queries, Tk keys, D d_head.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from blocklab.model import masks


def softcap(x: Tensor, cap: float | None) -> Tensor:
    """``cap · tanh(x / cap)`` (``cap`` None: ``x``): smooth, odd, bounded by ``cap``, the
    identity up to ``x³ / (3 cap²)`` for ``|x| << cap``."""
    return x if cap is None else torch.tanh(x / cap) * cap


def attend(q: Tensor, k: Tensor, v: Tensor, visibility: masks.Visibility, *,
           scale: float | None = None, dropout: float = 0.0, enable_gqa: bool = False,
           cap: float | None = None, sink: Tensor | None = None,
           stats: list | None = None) -> Tensor:
    """Attention of ``q`` (B, H, Tq, D) over ``k``, ``v`` (B, Hkv, Tk, D) under
    ``visibility``: SDPA, or :func:`explicit_attention` with a softcap ``cap`` or a ``stats``
    list (the same result). A sink logit per head ``sink`` (H,) is one more key of value zero
    (:func:`~blocklab.model.masks.with_sink` for SDPA)."""
    if stats is not None or cap is not None:
        return explicit_attention(q, k, v, mask=visibility.allowed, causal=visibility.causal,
                                  scale=scale, dropout=dropout, enable_gqa=enable_gqa,
                                  cap=cap, sink=sink, stats=stats)
    if sink is not None:
        visibility = masks.with_sink(visibility, sink, q.shape[2], k.shape[2])
        k, v = F.pad(k, (0, 0, 0, 1)), F.pad(v, (0, 0, 0, 1))
    return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout, enable_gqa=enable_gqa,
                                          scale=scale, **visibility.sdpa_kwargs())


def explicit_attention(q: Tensor, k: Tensor, v: Tensor, *, mask: Tensor | None = None,
                       causal: bool = False, scale: float | None = None, dropout: float = 0.0,
                       enable_gqa: bool = False, cap: float | None = None,
                       sink: Tensor | None = None, stats: list | None = None) -> Tensor:
    """Attention of ``q`` (B, H, Tq, D) over ``k``, ``v`` (B, Hkv, Tk, D) -> (B, H, Tq, D),
    as SDPA computes it (``mask``: its ``attn_mask``; ``causal``: its ``is_causal``), with
    the softcap ``cap`` on the scaled scores and a sink logit per head ``sink`` (H,). With a
    ``stats`` list, one dict is appended: ``logit_max`` (0-d) the largest raw score ``q · k ·
    scale`` over the allowed pairs (before the cap), ``entropy`` (H,) per head the mean over
    the query rows that see a key of the attention distribution's entropy, in nats; float32,
    detached."""
    h, tq, d = q.shape[1], q.shape[2], q.shape[3]
    tk = k.shape[2]
    if enable_gqa and k.shape[1] != h:
        k = k.repeat_interleave(h // k.shape[1], 1)
        v = v.repeat_interleave(h // v.shape[1], 1)
    raw = (q @ k.transpose(-1, -2)).float() * (d ** -0.5 if scale is None else scale)
    # the mask as scores to add: a bias (ALiBi, T5) and -inf at forbidden pairs (masks.py)
    add = masks.additive(masks.Visibility(mask, causal), tq, tk, q.device)
    ok = None if add is None else add > float("-inf")  # (B|1, H|1, Tq, Tk) allowed pairs
    s = softcap(raw, cap)
    s = s if add is None else s + add.float()
    sees = None if ok is None else ok.any(-1, keepdim=True)  # (B|1, H|1, Tq, 1)
    empty = sees is not None and sink is None  # rows may see nothing: SDPA gives them zeros
    if empty:  # finite scores there, so that neither the softmax nor its gradient is NaN
        s = s.masked_fill(~sees, 0.0)
    if sink is not None:
        s = torch.cat((s, sink.float().view(1, h, 1, 1).expand(*s.shape[:3], 1)), -1)
    p = torch.softmax(s, -1)
    if empty:
        p = torch.where(sees, p, 0.0)
    if stats is not None:
        stats.append(_readings(raw, p, ok, sees))
    if sink is not None:
        p = p[..., :tk]
    if dropout:
        p = F.dropout(p, dropout)
    return (p.to(v.dtype) @ v).to(q.dtype)


@torch.no_grad()
def _readings(raw: Tensor, p: Tensor, ok: Tensor | None, sees: Tensor | None) -> dict:
    """The monitor's readings of one attention call (:func:`explicit_attention`)."""
    shape = raw.shape
    top = raw if ok is None else raw[ok.expand(shape)]  # the allowed pairs' raw scores
    ent = -torch.special.xlogy(p, p).sum(-1)  # (B, H, Tq) in nats
    rows = torch.ones(shape[:3], device=raw.device) if sees is None else (
        sees[..., 0].expand(shape[:3]).float())
    ent = (ent * rows).sum((0, 2)) / rows.sum((0, 2)).clamp(min=1.0)
    big = top.amax() if top.numel() else raw.new_tensor(float("-inf"))
    return {"logit_max": big.detach().float(), "entropy": ent.detach().float()}
