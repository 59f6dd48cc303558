"""Attention: fused projections, MHA / GQA / MQA through ``n_kv_heads``, self- and cross-attention,
and the preallocated KV cache. Which key a query may see is decided in masks.py only; this file
consumes a :class:`~blocklab.model.masks.Visibility`.

Shape legend: B batch, T tokens, H query heads, Hkv key/value heads, D d_head, d d_model,
L layers, C cache capacity, S ring slots of a local (sliding-window) layer.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from blocklab.config import AttentionConfig
from blocklab.model.masks import Visibility, layer_window, token_order
from blocklab.model.position import apply_rotary


@dataclass(frozen=True)
class CachedKeys:
    """What one stack forward attends over, from :meth:`KVCache.begin`: the key metadata of
    global layers (the whole buffer so far) and of local layers (ring slots, then the new
    tokens), each None when the stack has no layer of that kind."""

    positions: Tensor | None  # (B, Tk) global layers' key positions
    valid: Tensor | None  # (B, Tk) bool, None = no padding so far
    local_positions: Tensor | None  # (B, S + T) ring slots, then the new tokens
    local_valid: Tensor | None  # (B, S + T) bool: a real token in that slot
    local_order: Tensor | None  # (B, S + T) each key's order (index among the row's real tokens)
    q_order: Tensor | None  # (B, T) the new tokens' orders
    order: Tensor | None = None  # (B, Tk) global keys' orders: set, causality is by order


class KVCache:
    """Preallocated K/V buffers for every layer of one stack, plus per-slot key metadata
    (position ids and validity) so that relative biases and padding masks see the past.

    Global layers: decoding writes new keys at ``[length, length + T)`` of ``capacity`` slots;
    the stack advances ``length`` once per forward. Local (sliding-window) layers
    (``window``/``global_every``, :func:`~blocklab.model.masks.layer_window`) keep a ring of
    ``S = min(window - 1, capacity)`` slots instead, memory proportional to the window: a
    forward attends over the ring plus its own new keys (a transient copy), then writes each
    row's last ``S`` real tokens into the ring (token order ``o`` -> slot ``o mod S``), with
    their positions, orders and validity, which is all a later query's window can reach.
    Cross-attention K/V (encoder–decoder) are computed once and kept in ``cross``.
    The buffers are written in place, so decoding runs without autograd (``torch.no_grad`` or
    ``torch.inference_mode``); a write that would need gradients is refused.
    """

    def __init__(self, n_layers: int, batch: int, n_kv_heads: int, d_head: int, capacity: int,
                 *, dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu",
                 window: int | None = None, global_every: int = 0) -> None:
        self.layer_windows = [layer_window(window, global_every, i) for i in range(n_layers)]
        local = [w is not None for w in self.layer_windows]
        # layer -> its index among the global (k, v) or the local (ring_k, ring_v) buffers
        self._index = [sum(1 for other in local[:i] if other == local[i]) for i in range(n_layers)]
        self._local = local
        n_local = sum(local)
        n_global = n_layers - n_local
        self.slots = min(window - 1, capacity) if n_local else 0  # type: ignore[operator]
        shape = (n_global, batch, n_kv_heads, capacity, d_head)
        self.k = torch.zeros(shape, dtype=dtype, device=device)  # (L_global, B, Hkv, C, D)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        ring = (n_local, batch, n_kv_heads, self.slots, d_head)
        self.ring_k = torch.zeros(ring, dtype=dtype, device=device)  # (L_local, B, Hkv, S, D)
        self.ring_v = torch.zeros(ring, dtype=dtype, device=device)
        global_capacity = capacity if n_global else 0
        self.positions = torch.zeros(batch, global_capacity, dtype=torch.long, device=device)
        self.valid = torch.zeros(batch, global_capacity, dtype=torch.bool, device=device)
        self.ring_positions = torch.zeros(batch, self.slots, dtype=torch.long, device=device)
        self.ring_order = torch.zeros(batch, self.slots, dtype=torch.long, device=device)
        self.ring_valid = torch.zeros(batch, self.slots, dtype=torch.bool, device=device)
        # real tokens per row (kept for the local layers' token orders only)
        self.seen = torch.zeros(batch, dtype=torch.long, device=device)
        self.next_position = torch.zeros(batch, dtype=torch.long, device=device)
        self._capacity = capacity
        self.has_padding = False
        self.length = 0
        self.cross: list[tuple[Tensor, Tensor] | None] = [None] * n_layers
        self._pending: tuple[Tensor, Tensor, Tensor] | None = None  # this forward's ring writes
        self._views()

    def _views(self) -> None:
        self._k, self._v = self.k.unbind(0), self.v.unbind(0)  # (B, Hkv, C, D) views per layer
        self._rk, self._rv = self.ring_k.unbind(0), self.ring_v.unbind(0)  # (B, Hkv, S, D)

    @property
    def capacity(self) -> int:
        return self._capacity

    @property
    def nbytes(self) -> int:
        """Bytes held by the self-attention K/V buffers (the cache formula's quantity): the
        global layers' ``capacity`` slots and the local layers' rings."""
        return self.k.nbytes + self.v.nbytes + self.ring_k.nbytes + self.ring_v.nbytes

    def begin(self, positions: Tensor, valid: Tensor | None) -> CachedKeys:
        """Record the new tokens' positions/validity; return the metadata of every key that
        global and local layers attend over in this forward."""
        start, end = self.length, self.length + positions.shape[1]
        if end > self.capacity:
            raise ValueError(f"KV cache full: {end} tokens > capacity {self.capacity}")
        b, t = positions.shape
        real = None if valid is None else valid.bool()
        ends = positions + 1 if real is None else torch.where(real, positions + 1, 0)
        self.next_position = torch.maximum(self.next_position, ends.amax(-1))
        if real is not None and not self.has_padding:
            self.has_padding = not bool(real.all())
        g_positions = g_valid = None
        if self.k.shape[0]:
            self.positions[:, start:end] = positions
            self.valid[:, start:end] = True if real is None else real
            g_positions = self.positions[:, :end]
            g_valid = self.valid[:, :end] if self.has_padding else None
        if not self.ring_k.shape[0]:  # global layers only: no token orders to keep
            return CachedKeys(g_positions, g_valid, None, None, None, None)
        real = torch.ones_like(positions, dtype=torch.bool) if real is None else real
        q_order = self.seen[:, None] + token_order(valid, b, t, positions.device)  # (B, T)
        self.seen = self.seen + real.sum(-1)
        keys = CachedKeys(g_positions, g_valid,
                          torch.cat((self.ring_positions, positions), 1),
                          torch.cat((self.ring_valid, real), 1),
                          torch.cat((self.ring_order, q_order), 1), q_order)
        if self.slots:  # the last S real tokens of each row go to the ring, after attention
            keep = real & (q_order >= self.seen[:, None] - self.slots)
            rows, cols = keep.nonzero(as_tuple=True)
            order = q_order[rows, cols]
            slots = order % self.slots
            self._pending = (rows, cols, slots)
            self.ring_positions[rows, slots] = positions[rows, cols]
            self.ring_order[rows, slots] = order
            self.ring_valid[rows, slots] = True
        return keys

    def next_positions(self) -> Tensor:
        """(B,) the position after each row's last real cached token (what a caller's decode
        loop continues from when it passes no ``positions``)."""
        return self.next_position.clone()

    def write(self, layer: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Store this layer's new K/V (B, Hkv, T, D); return the K/V it attends over: global
        layers every key so far (B, Hkv, length+T, D), local layers the ring slots, then the new
        keys (B, Hkv, S+T, D), in the order of :meth:`begin`'s metadata."""
        if k.requires_grad:
            raise RuntimeError("KV cache: decoding with a cache needs gradients off; wrap the "
                               "loop in torch.no_grad() or torch.inference_mode() (generate() "
                               "does); to train, call the model without cache=")
        i = self._index[layer]
        if self._local[layer]:
            rk, rv = self._rk[i], self._rv[i]
            keys, values = torch.cat((rk, k), 2), torch.cat((rv, v), 2)  # copies: ring is free
            if self._pending is not None:
                rows, cols, slots = self._pending
                rk[rows, :, slots] = k[rows, :, cols]
                rv[rows, :, slots] = v[rows, :, cols]
            return keys, values
        start, end = self.length, self.length + k.shape[2]
        kl, vl = self._k[i], self._v[i]  # per-layer views, made once
        kl[:, :, start:end] = k
        vl[:, :, start:end] = v
        return kl[:, :, :end], vl[:, :, :end]

    def advance(self, n: int) -> None:
        self.length += n
        self._pending = None

    def select(self, rows: Tensor) -> KVCache:
        """A new cache whose row ``j`` is a copy of row ``rows[j]`` of this one (rows may repeat),
        so several continuations of each prefix run from one prefill."""
        new = KVCache.__new__(KVCache)
        new.__dict__.update(self.__dict__)
        for name in ("k", "v", "ring_k", "ring_v"):
            setattr(new, name, getattr(self, name).index_select(1, rows))
        for name in ("positions", "valid", "ring_positions", "ring_order", "ring_valid",
                     "seen", "next_position"):
            setattr(new, name, getattr(self, name).index_select(0, rows))
        new._pending = None
        new.cross = [None if kv is None else tuple(t.index_select(0, rows) for t in kv)
                     for kv in self.cross]
        new._views()
        return new


class StaticKVCache(KVCache):
    """A KV cache whose every forward has the same shapes, for compiled decoding
    (``torch.compile``, CUDA graphs): what changes from step to step lives in tensors, never in
    Python numbers a compiled graph would specialise on.

    Every layer, local ones included, keeps ``capacity`` slots; a forward writes its ``T`` new
    keys at slots ``[index, index + T)`` (``index`` a 0-d tensor, advanced in place) and
    attends over the whole buffer, masked by slot validity (unwritten slots never are) and by
    token order: key ``j`` is visible to query ``i`` iff ``o_j <= o_i`` (and, in a local layer,
    ``o_i - o_j < window``), which is the causal/window rule of the growing cache. Memory is
    ``capacity`` slots per layer (no ring for local layers); compute per step is proportional
    to ``capacity``, not to the tokens so far, the price of one graph for every step (as
    gpt-fast's and HF's static caches). Buffers are updated in place only (``index_copy_``,
    ``add_``) and marked as static addresses, so CUDA-graph replays see them.
    """

    def __init__(self, n_layers: int, batch: int, n_kv_heads: int, d_head: int, capacity: int,
                 *, dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu",
                 window: int | None = None, global_every: int = 0) -> None:
        super().__init__(n_layers, batch, n_kv_heads, d_head, capacity, dtype=dtype,
                         device=device)  # every layer gets full global buffers
        self.layer_windows = [layer_window(window, global_every, i) for i in range(n_layers)]
        self._has_local = any(w is not None for w in self.layer_windows)
        self._has_global = None in self.layer_windows
        self.order = torch.zeros(batch, capacity, dtype=torch.long, device=device)
        self.index = torch.zeros((), dtype=torch.long, device=device)  # next slot to write
        self._slots: Tensor | None = None  # this forward's slots
        for t in self._state():
            torch._dynamo.mark_static_address(t)

    def _state(self) -> list[Tensor]:
        return [self.k, self.v, self.positions, self.valid, self.order, self.index, self.seen,
                self.next_position]

    def reset(self) -> None:
        """Empty the cache in place (same buffers, so a compiled step keeps replaying): zero
        K/V too, so no stale value can reach a masked score as NaN."""
        for t in self._state():
            t.zero_()
        self.cross = [None] * len(self.cross)

    @property
    def length(self) -> int:  # type: ignore[override]
        return int(self.index)

    @length.setter
    def length(self, value: int) -> None:  # the base constructor's 0; index holds the truth
        pass

    def begin(self, positions: Tensor, valid: Tensor | None) -> CachedKeys:
        b, t = positions.shape
        if not torch.compiler.is_compiling() and int(self.index) + t > self.capacity:
            raise ValueError(f"KV cache full: {int(self.index) + t} tokens > capacity "
                             f"{self.capacity}")
        real = torch.ones_like(positions, dtype=torch.bool) if valid is None else valid.bool()
        q_order = self.seen[:, None] + token_order(valid, b, t, positions.device)  # (B, T)
        self._slots = slots = self.index + torch.arange(t, device=positions.device)
        self.positions.index_copy_(1, slots, positions)
        self.valid.index_copy_(1, slots, real)
        self.order.index_copy_(1, slots, q_order)
        self.seen.add_(real.sum(-1))
        self.next_position.copy_(torch.maximum(self.next_position,
                                               torch.where(real, positions + 1, 0).amax(-1)))
        every = (self.positions, self.valid, self.order)
        return CachedKeys(*(every[:2] if self._has_global else (None, None)),
                          *(every if self._has_local else (None, None, None)), q_order,
                          order=self.order if self._has_global else None)

    def write(self, layer: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Store this layer's new K/V at this forward's slots; return the whole buffers
        (B, Hkv, C, D)."""
        if k.requires_grad:
            return super().write(layer, k, v)  # the base class's refusal
        kl, vl = self._k[layer], self._v[layer]
        kl.index_copy_(2, self._slots, k)
        vl.index_copy_(2, self._slots, v)
        return kl, vl

    def advance(self, n: int) -> None:
        self.index.add_(n)
        self._slots = None

    def select(self, rows: Tensor) -> StaticKVCache:
        new = super().select(rows)
        new.order = self.order.index_select(0, rows)
        new.index = self.index.clone()
        for t in new._state():
            torch._dynamo.mark_static_address(t)
        return new  # type: ignore[return-value]


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
