"""``model.mixer.name=compact_kv``: a score-based mixer with a key layout of its own, added
without touching blocklab (issue 42: "the decode cache is generic").

Softmax attention with every query head sharing one key/value head (multi-query attention,
arXiv 1911.02150), whose decode state stores *only real tokens*: slot ``o`` holds the row's
``o``-th real token, padding is never written. That is not the layout of blocklab's softmax
states (kv.py: a slot per token, padding included; a ring; fixed slots), so it brings its own
keys: it tells ``Sequence.visibility`` where its keys are (positions, validity, token orders:
:class:`~blocklab.model.mixer.Keys`) and masks.py decides what each query sees, as it does
for built-in layers. The state reads nothing from the cache: its mixer passes the forward's
:class:`~blocklab.model.cache.Step` (orders, real tokens before and after) and the compacted
rows (seqops.py) explicitly. Every shape is fixed (``capacity`` slots), so the same state
serves the growing and the static (compiled) cache.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from blocklab.config import ModelConfig
from blocklab.model import seqops
from blocklab.model.cache import Step, check_no_grad
from blocklab.model.mixer import Keys, Mixer, Sequence, State
from blocklab.registry import register


class CompactKVState(State):
    """K and V (B, C, D) and the positions (B, C) of each row's real tokens, slot = order."""

    def __init__(self, batch: int, capacity: int, d_head: int, *, dtype: torch.dtype,
                 device: torch.device | str) -> None:
        self.k = torch.zeros(batch, capacity, d_head, dtype=dtype, device=device)
        self.v = torch.zeros_like(self.k)
        self.positions = torch.zeros(batch, capacity, dtype=torch.long, device=device)
        self.segments: Tensor | None = None  # (B, C) documents, made by a carry forward

    def write(self, step: Step, rows: seqops.Compact, k: Tensor, v: Tensor) -> Keys:
        """This forward's real tokens (k, v (B, T, D), the caller's order) into the slots of
        their orders, in place (rebound in a carry cache: ``put``); returns every slot as keys
        (written ones valid; a carry forward's: with their documents)."""
        b, c = self.positions.shape
        t = k.shape[1]
        if step.segments is not None and self.segments is None:
            self.segments = torch.zeros_like(self.positions)
        slot = torch.arange(c, device=k.device) - step.before[:, None]  # (B, C) new real index
        written = (slot >= 0) & (slot < (step.seen - step.before)[:, None])
        pick = slot.clamp(0, t - 1)
        news = {"k": k, "v": v, "positions": step.positions, "segments": step.segments}
        for name, new in news.items():
            if new is None:
                continue
            buf, new = getattr(self, name), rows.gather(new)  # real tokens first: the i-th real token at index i
            idx = pick.view(b, c, *(1,) * (new.dim() - 2)).expand(b, c, *new.shape[2:])
            mask = written.view(b, c, *(1,) * (new.dim() - 2))
            self.put(name, torch.where(mask, new.gather(1, idx).to(buf.dtype), buf))
        order = torch.arange(c, device=k.device).expand(b, c)
        return Keys(self.positions, order < step.seen[:, None], order, step.order,
                    segments=None if step.segments is None else self.segments)


@register("mixer", "compact_kv")
class CompactKV(Mixer):
    """``n_heads`` query heads over one key/value head of ``head_dim``; the stack's score
    bias (ALiBi, T5) applies through ``Sequence.visibility``; no rotary angles."""

    uses_score_bias = True
    residual_outputs = ("out",)  # its output projection: init scaled by depth

    def __init__(self, m: ModelConfig, layer: int, *, causal: bool) -> None:
        super().__init__(m, layer, causal=causal)
        self.n_heads, self.d_head = m.n_heads, m.head_dim
        self.q = nn.Linear(m.d_model, m.n_heads * m.head_dim)
        self.kv = nn.Linear(m.d_model, 2 * m.head_dim)
        self.out = nn.Linear(m.n_heads * m.head_dim, m.d_model)

    def forward(self, x: Tensor, seq: Sequence, state: State | None) -> Tensor:
        b, t, _ = x.shape
        q = self.q(x).view(b, t, self.n_heads, self.d_head).transpose(1, 2)  # (B, H, T, D)
        k, v = self.kv(x).chunk(2, -1)  # (B, T, D) each
        if state is None:
            vis = seq.visibility()
        else:
            assert isinstance(state, CompactKVState) and seq.cache is not None
            check_no_grad(k, seq.cache)
            keys = state.write(seq.cache.step, seqops.compact(seq), k, v)
            k, v = state.k, state.v  # (B, C, D): every slot, masked by the keys' validity
            vis = seq.visibility(None, keys)
        shape = (b, self.n_heads, k.shape[1], self.d_head)
        o = F.scaled_dot_product_attention(q, k[:, None].expand(shape), v[:, None].expand(shape),
                                           **vis.sdpa_kwargs())  # (B, H, T, D)
        return self.out(o.transpose(1, 2).reshape(b, t, -1))

    def new_state(self, batch: int, capacity: int, *, dtype: torch.dtype,
                  device: torch.device | str, static: bool = False) -> State:
        if capacity is None:
            raise ValueError("compact_kv keeps every real token: give its carry cache a capacity")
        return CompactKVState(batch, capacity, self.d_head, dtype=dtype, device=device)

    @classmethod
    def param_count(cls, m: ModelConfig, layer: int, *, causal: bool) -> int:
        hd, d = m.n_heads * m.head_dim, m.d_model
        return d * hd + hd + d * 2 * m.head_dim + 2 * m.head_dim + hd * d + d

    @classmethod
    def score_keys(cls, m: ModelConfig, layer: int, *, seq_len: int) -> int:
        return seq_len

    @classmethod
    def flops_per_token(cls, m: ModelConfig, layer: int, *, seq_len: int,
                        causal: bool) -> float:
        """Projections, and scores and values over ``T`` keys per query head."""
        return 2.0 * cls.param_count(m, layer, causal=causal) + 4 * seq_len * m.n_heads * m.head_dim

    @classmethod
    def state_bytes(cls, m: ModelConfig, layer: int, *, batch: int, seq_len: int,
                    bytes_per_value: int) -> int:
        """K and V of ``seq_len`` slots, and one int64 position per slot."""
        return batch * seq_len * (2 * m.head_dim * bytes_per_value + 8)
