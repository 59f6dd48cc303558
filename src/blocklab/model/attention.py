"""Attention: fused projections, MHA / GQA / MQA through ``n_kv_heads``, self- and cross-attention,
and the preallocated KV cache. Which key a query may see is decided in masks.py only; this file
consumes a :class:`~blocklab.model.masks.Visibility`.

Shape legend: B batch, T tokens, H query heads, Hkv key/value heads, D d_head, d d_model,
L layers, C cache capacity.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from blocklab.config import AttentionConfig
from blocklab.model.masks import Visibility
from blocklab.model.position import apply_rotary


class KVCache:
    """Preallocated K/V buffers for every layer of one stack, plus per-slot key metadata
    (position ids and validity) so that relative biases and padding masks see the past.

    Decoding writes new keys at ``[length, length + T)``; the stack advances ``length`` once per
    forward. Cross-attention K/V (encoder–decoder) are computed once and kept in ``cross``.
    The buffers are written in place, so decoding runs without autograd (``torch.no_grad`` or
    ``torch.inference_mode``); a write that would need gradients is refused.
    """

    def __init__(self, n_layers: int, batch: int, n_kv_heads: int, d_head: int, capacity: int,
                 *, dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu") -> None:
        shape = (n_layers, batch, n_kv_heads, capacity, d_head)
        self.k = torch.zeros(shape, dtype=dtype, device=device)  # (L, B, Hkv, C, D)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self._k, self._v = self.k.unbind(0), self.v.unbind(0)  # (B, Hkv, C, D) views per layer
        self.positions = torch.zeros(batch, capacity, dtype=torch.long, device=device)
        self.valid = torch.zeros(batch, capacity, dtype=torch.bool, device=device)
        self.has_padding = False
        self.length = 0
        self.cross: list[tuple[Tensor, Tensor] | None] = [None] * n_layers

    @property
    def capacity(self) -> int:
        return self.k.shape[3]

    @property
    def nbytes(self) -> int:
        """Bytes held by the self-attention K/V buffers (the dense-cache formula's quantity)."""
        return self.k.nbytes + self.v.nbytes

    def begin(self, positions: Tensor, valid: Tensor | None) -> tuple[Tensor, Tensor | None]:
        """Record the new tokens' positions/validity; return those of every key so far."""
        start, end = self.length, self.length + positions.shape[1]
        if end > self.capacity:
            raise ValueError(f"KV cache full: {end} tokens > capacity {self.capacity}")
        self.positions[:, start:end] = positions
        self.valid[:, start:end] = True if valid is None else valid
        self.has_padding = self.has_padding or (valid is not None and not bool(valid.all()))
        return self.positions[:, :end], (self.valid[:, :end] if self.has_padding else None)

    def next_positions(self) -> Tensor:
        """(B,) the position after each row's last real cached token (what a caller's decode
        loop continues from when it passes no ``positions``)."""
        end = self.length
        return torch.where(self.valid[:, :end], self.positions[:, :end] + 1, 0).amax(-1)

    def write(self, layer: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Store this layer's new K/V (B, Hkv, T, D); return all K/V so far (B, Hkv, length+T, D)."""
        if k.requires_grad:
            raise RuntimeError("KV cache: decoding with a cache needs gradients off; wrap the "
                               "loop in torch.no_grad() or torch.inference_mode() (generate() "
                               "does); to train, call the model without cache=")
        start, end = self.length, self.length + k.shape[2]
        kl, vl = self._k[layer], self._v[layer]  # per-layer views, made once
        kl[:, :, start:end] = k
        vl[:, :, start:end] = v
        return kl[:, :, :end], vl[:, :, :end]

    def advance(self, n: int) -> None:
        self.length += n

    def select(self, rows: Tensor) -> KVCache:
        """A new cache whose row ``j`` is a copy of row ``rows[j]`` of this one (rows may repeat),
        so several continuations of each prefix run from one prefill."""
        new = KVCache.__new__(KVCache)
        new.k, new.v = self.k.index_select(1, rows), self.v.index_select(1, rows)
        new._k, new._v = new.k.unbind(0), new.v.unbind(0)
        new.positions = self.positions.index_select(0, rows)
        new.valid = self.valid.index_select(0, rows)
        new.has_padding, new.length = self.has_padding, self.length
        new.cross = [None if kv is None else tuple(t.index_select(0, rows) for t in kv)
                     for kv in self.cross]
        return new


def _heads(x: Tensor, n: int) -> Tensor:
    b, t, _ = x.shape
    return x.view(b, t, n, -1).transpose(1, 2)  # (B, n, T, D)


def _merge(o: Tensor) -> Tensor:
    b, _, t, _ = o.shape
    return o.transpose(1, 2).reshape(b, t, -1)  # (B, T, H*D)


class _Attention(nn.Module):
    def __init__(self, cfg: AttentionConfig, *, d_model: int, n_heads: int, n_kv_heads: int,
                 d_head: int) -> None:
        super().__init__()
        self.n_heads, self.n_kv_heads, self.d_head = n_heads, n_kv_heads, d_head
        self.dropout = cfg.dropout
        self.scale = cfg.scale  # None = 1/sqrt(d_head)
        self.out = nn.Linear(n_heads * d_head, d_model, bias=cfg.bias)

    @staticmethod
    def param_count(cfg: AttentionConfig, *, d_model: int, n_heads: int, n_kv_heads: int,
                    d_head: int) -> int:
        """q, k+v and output projections (fused or not) and their biases."""
        q, kv = n_heads * d_head, 2 * n_kv_heads * d_head
        return d_model * q + d_model * kv + q * d_model + (q + kv + d_model if cfg.bias else 0)

    def _attend(self, q: Tensor, k: Tensor, v: Tensor, visibility: Visibility) -> Tensor:
        o = F.scaled_dot_product_attention(
            q, k, v, dropout_p=self.dropout if self.training else 0.0,
            enable_gqa=self.n_kv_heads != self.n_heads, scale=self.scale,
            **visibility.sdpa_kwargs(),
        )  # (B, H, Tq, D)
        return self.out(_merge(o))  # (B, Tq, d)


class SelfAttention(_Attention):
    """Multi-head self-attention with one fused QKV projection. ``n_kv_heads < n_heads`` shares
    each K/V head among ``n_heads / n_kv_heads`` query heads: GQA ("GQA", arXiv 2305.13245), or
    MQA at one K/V head ("Fast Transformer Decoding", arXiv 1911.02150).

    An attention component (``ATTENTIONS``) is built as ``Attention(cfg: AttentionConfig, *,
    d_model, n_heads, n_kv_heads, d_head)`` and called as ``(x, visibility, rotary, cache,
    layer)``; the three built-in names differ only in their K/V head count
    (config.resolve_kv_heads)."""

    def __init__(self, cfg: AttentionConfig, *, d_model: int, n_heads: int, n_kv_heads: int,
                 d_head: int) -> None:
        super().__init__(cfg, d_model=d_model, n_heads=n_heads, n_kv_heads=n_kv_heads,
                         d_head=d_head)
        self.qkv = nn.Linear(d_model, (n_heads + 2 * n_kv_heads) * d_head, bias=cfg.bias)

    def forward(self, x: Tensor, visibility: Visibility, rotary: tuple[Tensor, Tensor] | None,
                cache: KVCache | None, layer: int) -> Tensor:
        b, t, _ = x.shape
        h, hkv = self.n_heads, self.n_kv_heads
        qkv = self.qkv(x).view(b, t, h + 2 * hkv, -1)  # (B, T, H + 2·Hkv, D)
        if rotary is not None:  # queries and keys rotated together, token-major
            qk = apply_rotary(qkv[:, :, : h + hkv], *rotary)
            q, k = qk[:, :, :h], qk[:, :, h:]
        else:
            q, k = qkv[:, :, :h], qkv[:, :, h: h + hkv]
        v = qkv[:, :, h + hkv:]
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # (B, heads, T, D)
        if cache is not None:
            k, v = cache.write(layer, k, v)  # (B, Hkv, Tk, D)
        return self._attend(q, k, v, visibility)


class CrossAttention(_Attention):
    """Decoder queries over encoder outputs ("Attention Is All You Need", arXiv 1706.03762).
    The encoder's K/V are computed once per generation and kept in the cache."""

    def __init__(self, cfg: AttentionConfig, *, d_model: int, n_heads: int, n_kv_heads: int,
                 d_head: int) -> None:
        super().__init__(cfg, d_model=d_model, n_heads=n_heads, n_kv_heads=n_kv_heads,
                         d_head=d_head)
        self.q = nn.Linear(d_model, n_heads * d_head, bias=cfg.bias)
        self.kv = nn.Linear(d_model, 2 * n_kv_heads * d_head, bias=cfg.bias)

    def forward(self, x: Tensor, memory: Tensor, visibility: Visibility, cache: KVCache | None,
                layer: int) -> Tensor:
        q = _heads(self.q(x), self.n_heads)  # (B, H, Tq, D)
        kv = cache.cross[layer] if cache is not None else None
        if kv is None:
            k, v = self.kv(memory).chunk(2, dim=-1)  # (B, S, Hkv*D) x2
            kv = (_heads(k, self.n_kv_heads), _heads(v, self.n_kv_heads))  # (B, Hkv, S, D)
            if cache is not None:
                cache.cross[layer] = kv
        return self._attend(q, kv[0], kv[1], visibility)


ATTENTIONS: dict[str, type[nn.Module]] = {
    "mha": SelfAttention,
    "gqa": SelfAttention,
    "mqa": SelfAttention,
}
