"""Softmax attention: the ``softmax`` sequence mixer (full, local/windowed, patterned,
fixed-shape) and cross-attention; the head layouts (MHA / GQA / MQA) are in head_layouts.py.
Its decode states and the key books they share (``History`` / ``Ring`` / ``Fixed``,
cross-attention's ``CrossKV``) are in kv.py; the blocked layout of local layers in bands.py.
Which key a query may see is decided in masks.py only; this file consumes a
:class:`~blocklab.model.masks.Visibility` from :meth:`Sequence.visibility
<blocklab.model.mixer.Sequence.visibility>`.

Shape legend: B batch, T tokens, H query heads, Hkv key/value heads, D d_head, d d_model,
C cache capacity, S ring slots of a local layer, nb blocks of L queries, K keys of a band.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from blocklab.config import AttentionConfig, ModelConfig
from blocklab.model import bands, masks, qknorm, random_blocks, scores, seqops
from blocklab.model.cache import check_no_grad
from blocklab.model.kv import CrossKV, FixedKVState, KVState, RingState, ring_slots, sink_slots
from blocklab.model.memory import MemoryState, attend_with_memory, carry_state
from blocklab.model.memory import setup as setup_memory
from blocklab.model.mixer import Mixer, Sequence, State
from blocklab.model.patterns import query_temperature
from blocklab.model.position import apply_rotary
from blocklab.model.softmax_options import (
    SoftmaxOptions,
    check_values,
    check_window,
    describe,
    extra_params,
    memory_flops,
    score_keys,
    softmax_options,
    state_bytes,
    summary_rows,
)

#: A local layer computes attention in blocks of at least this many queries (each over its
#: band of 2 or 3 blocks of keys) once the sequence spans more than two blocks.
MIN_BLOCK = 32


# ------------------------------------------------------------------------------------ mixers

def _merge(o: Tensor) -> Tensor:
    b, _, t, _ = o.shape
    return o.transpose(1, 2).reshape(b, t, -1)  # (B, T, H*D)


def attention_dims(m: ModelConfig) -> dict[str, object]:
    """The head sizes and the QK-norm (qknorm.py) of softmax self- and cross-attention."""
    return {"d_model": m.d_model, "n_heads": m.n_heads, "n_kv_heads": m.kv_heads,
            "d_head": m.head_dim, "qk_norm": qknorm.spec(m, softmax_options(m))}


def _sdpa(layer: nn.Module, q: Tensor, k: Tensor, v: Tensor,
          visibility: masks.Visibility) -> Tensor:
    """Scaled dot-product attention of ``layer`` (its dropout, score scale and head layout)
    over ``visibility``: (B, H, Tq, D). A layer with a learned sink logit (``sink``, per
    head) attends over one more key, of value zero, whose score is that logit: it takes
    attention mass and adds nothing (gpt-oss). A layer with a softcap, or whose ``stats`` is
    a list (the monitor's hook), computes it explicitly (scores.py), the same result."""
    sink = getattr(layer, "sink", None)
    return scores.attend(
        q, k, v, visibility, scale=layer.scale, dropout=layer.dropout if layer.training else 0.0,
        enable_gqa=layer.n_kv_heads != layer.n_heads, cap=getattr(layer, "softcap", None),
        sink=None if sink is None else sink.to(q.dtype), stats=getattr(layer, "stats", None),
    )  # (B, H, Tq, D)


def _init_heads(layer: nn.Module, cfg: AttentionConfig, opts: SoftmaxOptions, *,
                d_model: int, n_heads: int, n_kv_heads: int, d_head: int,
                qk_norm: qknorm.QKNorm | None = None) -> None:
    """What self- and cross-attention share: head sizes, dropout, score scale, softcap,
    QK-norm and the output projection."""
    layer.n_heads, layer.n_kv_heads, layer.d_head = n_heads, n_kv_heads, d_head
    layer.dropout = opts.dropout
    layer.scale = opts.scale  # None = 1/sqrt(d_head)
    layer.softcap = opts.softcap  # None = no attention-logit softcap (scores.py)
    qknorm.build(layer, qk_norm, n_heads=n_heads, n_kv_heads=n_kv_heads, d_head=d_head)
    layer.out = nn.Linear(n_heads * d_head, d_model, bias=cfg.bias)


class SoftmaxAttention(Mixer):
    """Multi-head softmax self-attention with one fused QKV projection ("Attention Is All You
    Need", arXiv 1706.03762). ``n_kv_heads < n_heads`` shares each K/V head among
    ``n_heads / n_kv_heads`` query heads (the head layout, ``model.attention``: GQA, arXiv
    2305.13245; MQA, arXiv 1911.02150).

    A local layer (``model.mixer.window`` on the layers ``global_every`` / ``layers`` leave
    local, :func:`~blocklab.model.masks.layer_window`: Longformer, arXiv 2004.05150; Mistral;
    Gemma 2)
    computes its scores in blocks: each block of ``L >= window - 1`` queries attends over the
    keys of its band (the previous and its own block; encoders also the next), masked by the
    same rules as the dense path, so training and prefill cost ``O(T · window)``, equal to the
    dense-mask result. Decoding keeps a ring of the last ``window - 1`` keys.

    Attention patterns (a :class:`~blocklab.model.masks.Pattern` on local layers; the rules in
    masks.py): attention sinks beside the window ("StreamingLLM", arXiv 2309.17453), chunks
    instead of a window (Llama 4's ``attention_chunk_size``), global tokens (Longformer) — the
    band gains each block's sink keys (bands.py) and an encoder's global queries one dense
    pass; the ring keeps the sinks. BigBird's random blocks (arXiv 2007.14062;
    random_blocks.py) add each block's drawn keys to its band, and keep the whole history for
    decoding. ``learned_sink`` adds a per-head logit to every softmax
    denominator (the gpt-oss model card); ``global_rope: false`` drops rotary angles on the
    global layers of a local stack, with Llama 4's query temperature (patterns.py)."""

    uses_score_bias = True
    uses_rotary = True
    residual_outputs = ("out",)
    options = SoftmaxOptions
    # what cross-attention reads (it is softmax too)
    cross_options = ("scale", "dropout", "qk_norm", "qk_norm_scope", "softcap")
    #: the monitor's hook: a list makes every attention call append its readings (scores.py)
    stats: list | None = None

    def __init__(self, m: ModelConfig, layer: int, *, causal: bool) -> None:
        super().__init__(m, layer, causal=causal)
        a, opts = m.attention, softmax_options(m)
        _init_heads(self, a, opts, **attention_dims(m))
        h, hkv, d = self.n_heads, self.n_kv_heads, self.d_head
        self.qkv = nn.Linear(m.d_model, (h + 2 * hkv) * d, bias=a.bias)
        #: what this layer sees: None (global), its window, or a masks.Pattern (sinks, chunks)
        self.window = masks.layer_pattern(opts, layer)
        setup_memory(self, opts, m.d_model)  # XL memory and its compressor (memory.py)
        #: the learned sink logit per head (init 0: transformer.init_weights zeroes 1-d)
        self.sink = nn.Parameter(torch.zeros(h)) if opts.learned_sink else None
        # the global layers of a local stack may rotate nothing (Llama 4's NoPE layers) and
        # then scale their queries with the position (its attention temperature tuning)
        nope = not opts.global_rope and self.window is None
        self.rope = not nope
        self.temperature = opts.global_temperature if nope else 0.0
        self.temperature_floor = opts.temperature_floor
        #: BigBird's random key blocks, drawn once (random_blocks.py): kept in the checkpoint
        self.random = getattr(self.window, "random_blocks", 0)
        self.marks = getattr(self.window, "marked", False)  # global_token_id's marked tokens
        self.register_buffer("random_table", random_blocks.draw(
            opts.pattern_seed, layer, -(-m.max_seq_len // opts.block_size), self.random,
            causal=causal) if self.random else None)
        if self.random:  # the pattern reads the table (and again after every move)
            self.window = dataclasses.replace(self.window, table=self.random_table)

    #: a carry cache's memory sizes ("train" / "eval") while new_carry_state makes a state
    carrying: str | None = None

    def new_carry_state(self, batch: int, capacity: int | None, *, dtype: torch.dtype,
                        device: torch.device | str, mem: str) -> State | None:
        """The state of a carry cache (model/carry.py): a global layer's XL memory."""
        self.carrying = mem
        try:
            return self.new_state(batch, capacity, dtype=dtype, device=device)
        finally:
            self.carrying = None

    def value_rows(self) -> tuple[str, list[int]]:
        """The fused input projection and its row parts, the values last (q, k, v): DeepNorm's
        init gives the values gain β (model/init.py)."""
        h, hkv, d = self.n_heads, self.n_kv_heads, self.d_head
        return "qkv", [h * d, hkv * d, hkv * d]

    def _apply(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        """The pattern reads the drawn table: a buffer, so a move makes a new tensor."""
        out = super()._apply(*args, **kwargs)
        if self.random:
            self.window = dataclasses.replace(self.window, table=self.random_table)
        return out

    def forward(self, x: Tensor, seq: Sequence, state: State | None) -> Tensor:
        if isinstance(state, MemoryState):  # a global layer's XL memory (memory.py)
            return attend_with_memory(self, x, seq, state, _sdpa, _merge)
        b, t, _ = x.shape
        h, hkv = self.n_heads, self.n_kv_heads
        # split, not sliced: the backward of a split is one concatenation, of three slices a
        # zero-filled gradient per slice (about 2 % of a small model's CPU training step)
        qk, v = self.qkv(x).view(b, t, h + 2 * hkv, -1).split((h + hkv, hkv), dim=2)
        qk = qknorm.fused(self, qk)  # QK-norm before rotary (off: qk itself)
        if seq.rotary is not None and self.rope:  # q and k rotated together, token-major
            qk = apply_rotary(qk, *seq.rotary)
        q, k = qk.split((h, hkv), dim=2)  # (B, T, heads, D) each
        if self.temperature:
            q = q * query_temperature(seq.positions, self.temperature,
                                      self.temperature_floor).to(q.dtype)[..., None, None]
        if self.window is not None and t > 2 * self.block and (
                state is None or _empty_ring(seq, state)) and not (
                self.random and seq.segments is not None):  # packed random blocks: dense
            o = self._banded(q, k, v, seq)
            if state is not None:  # prefill: the ring still keeps this forward's last keys
                check_no_grad(k, seq.cache)
                book = seq.cache.book(state.key)
                state.write(book, k.transpose(1, 2), v.transpose(1, 2))
                if self.marks:  # and the marks of those keys
                    state.write_marks(book, seq.real() & False if seq.marked is None
                                      else seq.marked)
            return self.out(o)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # (B, heads, T, D)
        if state is None:
            return self.out(_merge(_sdpa(self, q, k, v, seq.visibility(self.window))))
        check_no_grad(k, seq.cache)
        book = seq.cache.book(state.key)  # the keys' positions / validity / orders (kv.py)
        k, v = state.write(book, k, v)  # (B, Hkv, Tk, D)
        if self.marks:  # the marks of every key, kept beside them
            marked = seq.real() & False if seq.marked is None else seq.marked
            keys = dataclasses.replace(book.keys, marked=state.write_marks(book, marked))
            vis = seq.visibility(self.window, keys)
            return self.out(_merge(_sdpa(self, q, k, v, vis)))
        vis = seq.visibility(self.window, book.keys, share=state.key)
        return self.out(_merge(_sdpa(self, q, k, v, vis)))

    @property
    def block(self) -> int:
        """Queries per block of the blocked layout of rows of one document (bands.py)."""
        return self.layout(packed=False).block

    def layout(self, *, packed: bool) -> bands.Layout:
        assert self.window is not None
        return bands.layout(self.window, causal=self.causal, min_block=MIN_BLOCK,
                            packed=packed)

    def _banded(self, q: Tensor, k: Tensor, v: Tensor, seq: Sequence) -> Tensor:
        """Local attention in blocks over bands of keys: q (B, T, H, D), k and v (B, T, Hkv,
        D), token-major -> (B, T, H·D)."""
        qkv = torch.cat((q, k, v), 2)  # (B, T, H + 2·Hkv, D)
        b, t = qkv.shape[:2]
        h, hkv = self.n_heads, self.n_kv_heads
        positions, segments, valid = seq.positions, seq.segments, seq.valid
        lay = self.layout(packed=segments is not None)
        block = lay.block
        marked = seq.marked if self.marks else None
        rows = seqops.compact(seq)
        if valid is not None:  # real tokens first, so orders grow by one along the row
            qkv, positions = rows.gather(qkv), rows.gather(positions)
            marked = None if marked is None else rows.gather(marked)
            segments = None if segments is None else rows.gather(segments)
            valid = rows.real
        tp = -(-t // block) * block  # padded to whole blocks
        pad = tp - t
        real = torch.ones(b, t, dtype=torch.bool, device=qkv.device) if valid is None else valid
        if pad:
            qkv = F.pad(qkv, (0, 0, 0, 0, 0, pad))
            positions = F.pad(positions, (0, pad))
            real = F.pad(real, (0, pad), value=False)
            segments = None if segments is None else F.pad(segments, (0, pad), value=-1)
            marked = None if marked is None else F.pad(marked, (0, pad), value=False)
        nb = tp // block
        ranks = torch.arange(tp, device=qkv.device).expand(b, tp)
        marked = None if marked is None else marked & real
        band = bands.forward_band(self.window, lay, causal=self.causal, real=real,
                                  segments=segments, marked=marked,
                                  table=self.random_table if self.random else None)
        qb = positions.reshape(b * nb, block)
        kb = band.keys(positions)  # (B·nb, K + n)
        vis = bands.banded_visibility(causal=self.causal, window=self.window, band=band,
                                      order=ranks, valid=real, segments=segments,
                                      bias=seq.position.score_bias(qb, kb),
                                      marked=marked)
        q = qkv[:, :, :h].reshape(b * nb, block, h, -1).transpose(1, 2)  # (B·nb, H, L, D)
        kv = band.keys(qkv[:, :, h:]).transpose(1, 2)  # (B·nb, 2Hkv, K + n, D)
        o = _sdpa(self, q, kv[:, :hkv], kv[:, hkv:], vis)  # (B·nb, H, L, D)
        o = o.transpose(1, 2).reshape(b, tp, -1)  # (B, T', H·D)
        if marked is not None or (getattr(self.window, "global_tokens", 0) and not self.causal):
            o = self._global_rows(o, qkv, positions, real, segments, seq, marked)
        return rows.scatter(o[:, :t])  # back to the caller's token order

    def _global_rows(self, o: Tensor, qkv: Tensor, positions: Tensor, real: Tensor,
                     segments: Tensor | None, seq: Sequence, marked: Tensor | None) -> Tensor:
        """A bidirectional layer's global queries and any layer's marked ones (Longformer)
        see their whole document (causal: its past): one
        dense pass of those G queries over the T keys (cost G·T), written over their banded
        rows of ``o`` (B, T, H·D); compacted rows (real tokens first)."""
        b, tp = real.shape
        h, hkv = self.n_heads, self.n_kv_heads
        ranks = torch.arange(tp, device=qkv.device).expand(b, tp)
        idx, ok, vis = bands.global_queries(self.window, ranks, real, segments, positions,
                                            seq.position, marked, self.causal)
        g = idx.shape[1]
        at = idx[..., None, None].expand(b, g, h, qkv.shape[-1])
        q = qkv[:, :, :h].gather(1, at).transpose(1, 2)  # (B, G, H, D) -> (B, H, G, D)
        k, v = qkv[:, :, h:h + hkv].transpose(1, 2), qkv[:, :, h + hkv:].transpose(1, 2)
        og = _merge(_sdpa(self, q, k, v, vis))  # (B, G, H·D)
        at = idx[..., None].expand(b, g, o.shape[-1])
        return o.scatter(1, at, torch.where(ok[..., None], og, o.gather(1, at)))

    def new_state(self, batch: int, capacity: int, *, dtype: torch.dtype,
                  device: torch.device | str, static: bool = False) -> State:
        dims, marks = (batch, self.n_kv_heads), {"marks": True} if self.marks else {}
        if self.carrying is not None and self.window is None:  # a carry cache: XL memory
            kept = carry_state(self, batch, dtype=dtype, device=device, mem=self.carrying)
            if kept is not None:
                return kept
        if static:
            return FixedKVState(*dims, capacity, self.d_head, dtype=dtype, device=device, **marks)
        if self.window is not None and not (self.random or self.marks):  # the whole history
            return RingState(*dims, ring_slots(self.window, capacity), self.d_head,
                             dtype=dtype, device=device, sinks=sink_slots(self.window, capacity))
        return KVState(*dims, capacity, self.d_head, dtype=dtype, device=device, **marks)

    @classmethod
    def param_count(cls, m: ModelConfig, layer: int, *, causal: bool) -> int:
        sinks = m.n_heads if softmax_options(m).learned_sink else 0
        return projection_params(m.attention, **attention_dims(m)) + sinks + extra_params(m, layer)

    @classmethod
    def score_keys(cls, m: ModelConfig, layer: int, *, seq_len: int) -> int:
        return score_keys(m, layer, seq_len=seq_len)

    @classmethod
    def flops_per_token(cls, m: ModelConfig, layer: int, *, seq_len: int,
                        causal: bool) -> float:
        """Projections (and a memory's, memory.py), plus scores and values over the keys a
        query sees: ``4 · T_k · d_attn`` (:meth:`score_keys`)."""
        keys = cls.score_keys(m, layer, seq_len=seq_len)
        return (2.0 * cls.param_count(m, layer, causal=causal) + 4 * keys * m.n_heads
                * m.head_dim + memory_flops(m, layer, seq_len=seq_len))

    @classmethod
    def state_bytes(cls, m: ModelConfig, layer: int, *, batch: int, seq_len: int,
                    bytes_per_value: int) -> int:
        return state_bytes(m, layer, batch=batch, seq_len=seq_len,
                           bytes_per_value=bytes_per_value)

    @classmethod
    def describe(cls, m: ModelConfig, layer: int) -> str:
        return describe(m, layer)

    @classmethod
    def summary_rows(cls, m: ModelConfig) -> list[tuple[str, str]]:
        return summary_rows(softmax_options(m))

    @classmethod
    def check_options(cls, opts: SoftmaxOptions, key: str) -> None:
        """The values of softmax's options, whenever they are in use (cross-attention too)."""
        check_values(opts, key)

    @classmethod
    def check(cls, m: ModelConfig, layer: int, *, causal: bool, key: str) -> None:
        """The window against the stacks (softmax_options.py)."""
        check_window(m, softmax_options(m), causal=causal, key=key)


def _empty_ring(seq: Sequence, state: State) -> bool:
    """A local layer's first forward into a dynamic cache (prefill): no earlier key to see."""
    return isinstance(state, (RingState, KVState)) and seq.cache is not None and seq.cache.length == 0


def projection_params(cfg: AttentionConfig, *, d_model: int, n_heads: int, n_kv_heads: int,
                      d_head: int, qk_norm: qknorm.QKNorm | None = None) -> int:
    """q, k+v and output projections (fused or not), their biases and the QK-norm's."""
    q, kv = n_heads * d_head, 2 * n_kv_heads * d_head
    norms = qknorm.params(qk_norm, n_heads=n_heads, n_kv_heads=n_kv_heads, d_head=d_head)
    return d_model * q + d_model * kv + q * d_model + (q + kv + d_model if cfg.bias else 0) + norms


class CrossAttention(nn.Module):
    """Decoder queries over encoder outputs ("Attention Is All You Need", arXiv 1706.03762).
    The encoder's K/V are computed once per generation and kept in its decode state
    (:class:`~blocklab.model.kv.CrossKV`). Cross-attention
    is softmax attention in every model; it is not a sequence mixer."""

    residual_outputs = ("out",)
    stats: list | None = None  # the monitor's hook, as SoftmaxAttention's

    def __init__(self, cfg: AttentionConfig, opts: SoftmaxOptions, *, d_model: int,
                 n_heads: int, n_kv_heads: int, d_head: int,
                 qk_norm: qknorm.QKNorm | None = None) -> None:
        super().__init__()
        _init_heads(self, cfg, opts, d_model=d_model, n_heads=n_heads, n_kv_heads=n_kv_heads,
                    d_head=d_head, qk_norm=qk_norm)
        self.q = nn.Linear(d_model, n_heads * d_head, bias=cfg.bias)
        self.kv = nn.Linear(d_model, 2 * n_kv_heads * d_head, bias=cfg.bias)

    param_count = staticmethod(projection_params)

    def value_rows(self) -> tuple[str, list[int]]:
        """The key/value projection's row parts, the values last (model/init.py)."""
        return "kv", [self.n_kv_heads * self.d_head] * 2

    def forward(self, x: Tensor, memory: Tensor, visibility: masks.Visibility,
                state: CrossKV | None) -> Tensor:
        b, t, _ = x.shape
        q = qknorm.queries(self, self.q(x).view(b, t, self.n_heads, -1)).transpose(1, 2)
        if state is not None and state.k is not None:
            k, v = state.k, state.v  # (B, Hkv, S, D)
        else:
            k, v = self.kv(memory).view(*memory.shape[:2], 2 * self.n_kv_heads, -1).chunk(2, 2)
            k, v = qknorm.keys(self, k).transpose(1, 2), v.transpose(1, 2)
            if state is not None:
                state.k, state.v = k, v
        return self.out(_merge(_sdpa(self, q, k, v, visibility)))

    def new_state(self) -> CrossKV:
        """The decode state: the source's K/V, kept from the first forward on."""
        return CrossKV()
