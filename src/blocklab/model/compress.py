"""Compressed memory of an XL layer ("Compressive Transformers for Long-Range Sequence
Modelling", Rae et al. 2019, arXiv 1911.05507, Algorithm 2): what the XL memory (memory.py)
evicts is compressed at ``model.mixer.compress_ratio`` instead of dropped, into a first-in
first-out memory of ``compress_len`` slots the layer attends to as extra keys.

Per forward and row, the entries that leave ``[memory; segment]`` (every real token but the
last ``mem_len``) are taken in token order and grouped ``ratio`` at a time; a remainder of
fewer than ``ratio`` is dropped, and so is a group that spans a document boundary (memory
never crosses documents). A group becomes one slot, ``f(group)``: ``compress_kind=mean`` (mean
pooling) or ``conv`` (a learned ``Conv1d(d, d, ratio, stride=ratio)``), at the position,
order and document of the group's last token.

The auxiliary attention-reconstruction loss (Rae et al., eq. 2) trains the compressor only:
``mse(attn(q.sg, K(old).sg, V(old).sg), attn(q.sg, K'(c), V'(c)))`` with ``q`` this segment's
queries, ``old`` the evicted inputs and ``K', V'`` the compressed slots projected by the
layer's key/value weights *detached*, so its gradient reaches the compressor and nothing else
(lucidrains' compressive-transformer-pytorch detaches the compressed keys and values instead,
which leaves the compressor no gradient). The attention there is content-only (unrotated, no
position bias); it is added, times ``compress_loss``, to the carry cache's ``aux_loss``
(a training forward only) — the segmented objective adds it to the loss and clears it.

Shape legend: B batch, C compressed slots, G groups, r ratio, N candidates (M + T), d d_model.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from blocklab.model import qknorm, scores
from blocklab.model.masks import cross_visibility


def kv_weights(layer: Any) -> tuple[Tensor, Tensor | None]:
    """The layer's fused projection, key/value rows *detached* (the stop-gradient of the
    reconstruction loss); a function of its own so a test can prove the stop matters."""
    w, b = layer.qkv.weight, layer.qkv.bias
    return w.detach(), None if b is None else b.detach()


class Compressor(nn.Module):
    """``f``: (B, G, r, d) groups -> (B, G, d) slots: mean pooling, or a learned Conv1d of
    kernel and stride ``r``."""

    def __init__(self, d_model: int, ratio: int, kind: str) -> None:
        super().__init__()
        self.kind, self.ratio = kind, ratio
        self.conv = nn.Conv1d(d_model, d_model, ratio, stride=ratio) if kind == "conv" else None

    def forward(self, groups: Tensor) -> Tensor:
        if self.conv is None:
            return groups.mean(2)
        b, g, r, d = groups.shape
        return self.conv(groups.reshape(b * g, r, d).transpose(1, 2)).view(b, g, d)


def evicted_groups(cat: Tensor, order: Tensor, valid: Tensor, segments: Tensor | None,
                   positions: Tensor, *, keep_from: Tensor, ratio: int) -> dict[str, Tensor]:
    """The groups of ``ratio`` entries leaving the memory: ``cat`` (B, N, d) the candidates
    (old memory slots, then the segment), ``order``/``valid``/``positions``/``segments`` (B,
    N) theirs; an entry leaves when valid with ``order < keep_from`` (B,). Returns ``x`` (B,
    G, r, d), ``valid`` (B, G) and the last token's ``positions`` / ``order`` / ``segments``
    (B, G)."""
    b, n, d = cat.shape
    out = valid & (order < keep_from[:, None])
    key = torch.where(out, order, torch.iinfo(order.dtype).max)
    idx = key.argsort(1)  # evicted first, in token order
    count = out.sum(1)  # (B,)
    g = int((count // ratio).max()) if n else 0
    idx = idx[:, :g * ratio].view(b, g, ratio)
    x = cat.gather(1, idx.reshape(b, -1, 1).expand(-1, -1, d)).view(b, g, ratio, d)
    ok = torch.arange(g, device=cat.device)[None] < (count // ratio)[:, None]
    seg = None if segments is None else segments.gather(1, idx.reshape(b, -1)).view(b, g, ratio)
    if seg is not None:  # a group spanning two documents is dropped
        ok &= seg[..., 0] == seg[..., -1]
    last = idx[..., -1]
    return {"x": x, "valid": ok, "positions": positions.gather(1, last),
            "order": order.gather(1, last),
            "segments": None if seg is None else seg[..., -1]}


def append(state: Any, new: dict[str, Tensor], c: Tensor) -> None:
    """The compressed slots ``c`` (B, G, d) of the groups ``new`` appended to ``state``'s
    FIFO of C slots: the C latest valid ones kept per row."""
    cap = state.c.shape[1]
    valid = torch.cat((state.c_valid, new["valid"]), 1)
    order = torch.cat((state.c_order, new["order"]), 1)
    key = torch.where(valid, order, -1)
    idx = key.argsort(dim=1, stable=True)[:, -cap:]  # oldest first, the newest C kept
    seg = new["segments"] if new["segments"] is not None else torch.zeros_like(new["order"])
    for name, old, fresh in (("c_valid", state.c_valid, new["valid"]),
                             ("c_order", state.c_order, new["order"]),
                             ("c_positions", state.c_positions, new["positions"]),
                             ("c_segments", state.c_segments, seg)):
        state.put(name, torch.cat((old, fresh), 1).gather(1, idx))
    both = torch.cat((state.c, c.to(state.c.dtype)), 1)
    state.put("c", both.gather(1, idx[..., None].expand(-1, -1, both.shape[-1])))


def reconstruction_loss(layer: Any, q: Tensor, old: Tensor, old_ok: Tensor, c: Tensor,
                        c_ok: Tensor) -> Tensor:
    """Rae et al.'s attention-reconstruction loss: ``q`` (B, T, H, D) queries, ``old`` (B, G·r,
    d) the evicted inputs (``old_ok`` (B, G·r)), ``c`` (B, G, d) their slots (``c_ok``)."""
    h, hkv, dh = layer.n_heads, layer.n_kv_heads, layer.d_head
    q = q.detach().transpose(1, 2)  # (B, H, T, D)

    def attend(x: Tensor, ok: Tensor, w: Tensor, bias: Tensor | None) -> Tensor:
        kv = F.linear(x, w[h * dh:], None if bias is None else bias[h * dh:])
        k, v = kv.view(*x.shape[:2], 2 * hkv, dh).split((hkv, hkv), 2)
        k = qknorm.keys(layer, k, detach=True)  # the layer's keys (its norm not trained here)
        # only the valid slots (masks.py's key-validity rule); a query with none gets zeros
        return scores.attend(q, k.transpose(1, 2), v.transpose(1, 2), cross_visibility(ok),
                             scale=layer.scale or dh ** -0.5, enable_gqa=hkv != h,
                             cap=getattr(layer, "softcap", None))

    w, bias = layer.qkv.weight, layer.qkv.bias
    want = attend(old, old_ok, w.detach(), None if bias is None else bias.detach()).detach()
    got = attend(c, c_ok, *kv_weights(layer))
    return F.mse_loss(got, want)
