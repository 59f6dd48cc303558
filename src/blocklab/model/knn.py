"""Retrieval memory: the ``memorizing`` sequence mixer ("Memorizing Transformers", Wu et al.,
arXiv 2203.08913; lucidrains/memorizing-transformers-pytorch ``KNNAttention``).

A ``memorizing`` layer is a softmax layer (:class:`~blocklab.model.attention.SoftmaxAttention`,
every softmax option applies: window, patterns, scale of its local attention) that also attends
to the top-k of an external memory of this document's past (key, value) pairs:

    local      = the layer's ordinary softmax attention (its cache: every earlier key, or its
                 window's ring)
    retrieved  = softmax(q·K_top / sqrt(D)) V_top   over the ``knn_top_k`` memory keys of
                 largest inner product with q, per key/value head (query heads of a GQA
                 group share it), among the valid entries of the query's document
    out        = g · retrieved + (1 - g) · local,   g = sigmoid(b) per head, b = 0 at init

(the paper's form; lucidrains puts ``g`` on local, i.e. ``b -> -b``). The memory holds the
*unrotated* projections (rotary angles are not applied to the stored keys nor to the queries
that search them): retrieval is position-free, as in the paper. No l2-normalisation of keys
and queries (lucidrains normalises): so ``knn_top_k = knn_memory`` is exactly softmax
attention over the whole memory, the proof of tests/model/test_knn.py.

The memory lives in the layer's decode state (:class:`KNNState`: keys and values (B, Hkv, M,
D), the document id and validity of each slot (B, M), the next FIFO slot per row (B,)), beside
the K/V of its local attention. Keys and values are stored **detached** (no gradient flows
into the memory) and **after** attending (a forward never retrieves its own tokens), the last
``knn_memory`` real tokens of each row (FIFO; padding is never stored). A query retrieves only
entries of its own document id (``segments``; one document per row without it), so a
document never reads another's memory, even when the slot was not yet overwritten; a query
whose memory holds no entry of its document gets ``out = local`` exactly.

When is the memory written? A plain forward (no cache) has none: the layer *is* softmax
attention, output for output. A decode cache writes it only when asked: a cache carried
across segments (``cache.carry``, issue 45's segment modes) or one given :func:`remember`
(reading a long text segment by segment with the ordinary cache). An ordinary cache
(generation, scoring) leaves it empty, so cached decoding still equals the full forward (the
zoo's invariant: with a full K/V cache local attention already sees every earlier token, and
the memory is for what it no longer sees).

Search: ``knn_index: exact`` is ``torch.topk`` over every slot (``2·H·D·M`` FLOPs per query);
``faiss`` asks a ``faiss.IndexFlatIP`` per (row, key/value head, document) on the CPU — exact
inner-product search, so its result equals ``exact`` (the optional extra ``pip install
'blocklab[memory]'``; an approximate index would plug in at :func:`search_faiss`).

Shape legend: B batch, T tokens, H query heads, Hkv key/value heads, G = H / Hkv, D d_head,
M memory slots, k top-k.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from functools import cache

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from blocklab.config import ModelConfig
from blocklab.config.checks import require
from blocklab.model import qknorm
from blocklab.model.attention import SoftmaxAttention
from blocklab.model.mixer import Sequence, State
from blocklab.model.scores import softcap
from blocklab.model.softmax_options import SoftmaxOptions

INDEXES = ("exact", "faiss")


@dataclass
class KNNOptions(SoftmaxOptions):
    """The ``memorizing`` mixer's options: softmax's (its local attention) and the memory's."""

    knn_top_k: int = 32  # memory entries each query attends to (per key/value head)
    knn_memory: int = 2048  # (key, value) pairs kept per row and layer, first in first out
    knn_index: str = "exact"  # exact (torch.topk) or faiss (IndexFlatIP, equal to exact)


def knn_options(m: ModelConfig) -> KNNOptions:
    return m.mixer.read(KNNOptions)


# ------------------------------------------------------------------------------- the memory

def stored(t: Tensor) -> Tensor:
    """What the memory keeps of a key or value: detached (no gradient into the memory)."""
    return t.detach()


def stored_tokens(real: Tensor, slots: int) -> Tensor:
    """(B, T) bool: the tokens a forward appends, the last ``slots`` real ones of each row."""
    rank = real.long().cumsum(1) - 1
    return real & (rank >= real.sum(1, keepdim=True) - slots)


def gate(b: Tensor) -> Tensor:
    """The weight of the retrieved output per head, ``g = sigmoid(b)`` (the paper's form)."""
    return torch.sigmoid(b)


def same_document(memory_doc: Tensor, memory_valid: Tensor, q_doc: Tensor) -> Tensor:
    """(B, T, M) bool: the valid slots of each query's document."""
    return memory_valid[:, None, :] & (memory_doc[:, None, :] == q_doc[:, :, None])


class KNNState(State):
    """The retrieval memory, mixed into the local attention's state (its class becomes a
    subclass of both, :func:`with_memory`, so ``select`` / ``reset`` / ``nbytes`` and the books
    of the local state work unchanged, and so do a carry cache's ``reset_rows`` / ``detach`` /
    ``state_dict``). Every mutation goes through :meth:`_assign` / :meth:`_scatter`: the state's
    ``put`` / ``writable`` where it has them (in place while decoding, a new tensor rebound
    when written functionally), else the same by hand."""

    remembers: bool = False

    def init_memory(self, batch: int, n_kv_heads: int, slots: int, d_head: int, *,
                    dtype: torch.dtype, device: torch.device | str) -> None:
        self.memory_k = torch.zeros(batch, n_kv_heads, slots, d_head, dtype=dtype, device=device)
        self.memory_v = torch.zeros_like(self.memory_k)  # (B, Hkv, M, D)
        self.memory_doc = torch.zeros(batch, slots, dtype=torch.long, device=device)
        self.memory_valid = torch.zeros(batch, slots, dtype=torch.bool, device=device)
        self.memory_next = torch.zeros(batch, dtype=torch.long, device=device)  # FIFO slot

    def _assign(self, name: str, value: Tensor) -> None:
        put = getattr(self, "put", None)  # the carry core's gradient-safe write, when present
        if put is not None:
            put(name, value)
        else:
            setattr(self, name, value)

    def _scatter(self, name: str, index: tuple[Tensor | slice, ...], value: Tensor) -> None:
        writable = getattr(self, "writable", None)  # the carry core's, when present
        if writable is not None:
            writable(name)[index] = value
        elif getattr(self, "functional", False):
            t = getattr(self, name).clone()
            t[index] = value
            self._assign(name, t)
        else:
            getattr(self, name)[index] = value

    def append(self, k: Tensor, v: Tensor, doc: Tensor, real: Tensor) -> None:
        """Append this forward's real tokens (k, v: (B, T, Hkv, D), unrotated; doc, real: (B,
        T)) after the row's last entry, overwriting the oldest: detached, padding never."""
        slots = self.memory_k.shape[2]
        keep = stored_tokens(real, slots)
        rank = real.long().cumsum(1) - 1
        rows, cols = keep.nonzero(as_tuple=True)
        at = (self.memory_next[rows] + rank[rows, cols]) % slots
        self._scatter("memory_k", (rows, slice(None), at), stored(k[rows, cols]))
        self._scatter("memory_v", (rows, slice(None), at), stored(v[rows, cols]))
        self._scatter("memory_doc", (rows, at), doc[rows, cols])
        self._scatter("memory_valid", (rows, at), torch.ones_like(at, dtype=torch.bool))
        self._assign("memory_next", (self.memory_next + real.sum(1)) % slots)

    def retrieve(self, q: Tensor, doc: Tensor, *, top_k: int, index: str,
                 scale: float, cap: float | None = None) -> tuple[Tensor, Tensor]:
        """q (B, T, H, D) unrotated, doc (B, T) -> (retrieved (B, T, H, D), found (B, T)
        bool: the query's document has an entry); ``cap``: the scores' softcap."""
        b, t, h, d = q.shape
        hkv = self.memory_k.shape[1]
        qg = q.permute(0, 2, 1, 3).reshape(b, hkv, h // hkv, t, d)  # (B, Hkv, G, T, D)
        keep = same_document(self.memory_doc, self.memory_valid, doc)  # (B, T, M)
        search = search_faiss if index == "faiss" else search_exact
        idx, ok = search(qg, self.memory_k, keep, min(top_k, keep.shape[-1]))
        r = attend(qg, self.memory_k, self.memory_v, idx, ok, scale, cap)  # (B, Hkv, G, T, D)
        return r.reshape(b, h, t, d).transpose(1, 2), keep.any(-1)


def search_exact(q: Tensor, keys: Tensor, keep: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """The ``k`` kept slots of largest ``q·key`` per query and key/value head: q (B, Hkv, G,
    T, D), keys (B, Hkv, M, D), keep (B, T, M) -> (slots, kept) (B, Hkv, G, T, k); ``kept``
    False where the document has fewer than ``k`` entries."""
    scores = torch.einsum("bhgtd,bhmd->bhgtm", q, keys.to(q.dtype))
    keep = keep[:, None, None].expand_as(scores)
    scores = torch.where(keep, scores, torch.finfo(scores.dtype).min)
    idx = scores.topk(k, dim=-1).indices
    return idx, keep.gather(-1, idx)


def search_faiss(q: Tensor, keys: Tensor, keep: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """:func:`search_exact` by ``faiss.IndexFlatIP`` (exact inner product) on the CPU, one
    index per (row, key/value head, document of the row's queries) over its kept slots."""
    import faiss

    b, hkv, g, t, d = q.shape
    qs = q.detach().float().cpu().numpy()
    ks = keys.detach().float().cpu().numpy()
    keep = keep.cpu()
    idx = torch.zeros(b, hkv, g, t, k, dtype=torch.long)
    ok = torch.zeros(b, hkv, g, t, k, dtype=torch.bool)
    for row in range(b):
        for pattern in keep[row].unique(dim=0):  # the queries sharing one set of slots
            slots = pattern.nonzero().flatten()
            if slots.numel() == 0:
                continue
            queries = (keep[row] == pattern).all(-1).nonzero().flatten()  # (Tq,)
            n = min(k, slots.numel())
            for head in range(hkv):
                found = faiss.IndexFlatIP(d)
                found.add(ks[row, head][slots.numpy()])
                _, at = found.search(qs[row, head][:, queries.numpy()].reshape(-1, d), n)
                at = torch.from_numpy(at).view(g, -1, n)  # (G, Tq, n), -1 = none
                idx[row, head][:, queries, :n] = slots[at.clamp(min=0)]  # views: (G, T, k)
                ok[row, head][:, queries, :n] = at >= 0
    return idx.to(q.device), ok.to(q.device)


def attend(q: Tensor, keys: Tensor, values: Tensor, idx: Tensor, ok: Tensor,
           scale: float, cap: float | None = None) -> Tensor:
    """Softmax attention of each query over its chosen slots ``idx`` (those ``ok``): (B, Hkv,
    G, T, D); 0 where none is ``ok``. ``cap``: the softcap of the scores (scores.py; monotone,
    so the top k are the same)."""
    b, hkv, g, t, k = idx.shape
    d = keys.shape[-1]
    at = idx.reshape(b, hkv, g * t * k, 1).expand(-1, -1, -1, d)
    kk = keys.to(q.dtype).gather(2, at).view(b, hkv, g, t, k, d)
    vv = values.to(q.dtype).gather(2, at).view(b, hkv, g, t, k, d)
    scores = softcap(torch.einsum("bhgtd,bhgtkd->bhgtk", q, kk) * scale, cap)
    p = torch.softmax(torch.where(ok, scores, torch.finfo(scores.dtype).min), -1) * ok
    return torch.einsum("bhgtk,bhgtkd->bhgtd", p, vv)


@cache
def _with_memory_class(local: type) -> type:
    return type(f"KNN{local.__name__}", (KNNState, local), {})


def with_memory(local: State, batch: int, n_kv_heads: int, slots: int, d_head: int, *,
                dtype: torch.dtype, device: torch.device | str) -> KNNState:
    """``local`` (the softmax state) given the memory: its class becomes a subclass of
    :class:`KNNState` and of its own."""
    local.__class__ = _with_memory_class(type(local))
    assert isinstance(local, KNNState)
    local.init_memory(batch, n_kv_heads, slots, d_head, dtype=dtype, device=device)
    return local


def remember(cache: object, on: bool = True) -> None:
    """Let the memorizing layers of ``cache`` (a growing decode cache) write their memory at
    every forward (reading a long text segment by segment); a carried cache does by itself."""
    if getattr(cache, "static", False):
        raise ValueError("a static (compiled) decode cache keeps fixed shapes: the retrieval "
                         "memory is written between forwards; use a growing cache")
    for s in getattr(cache, "states", []):
        if isinstance(s, KNNState):
            s.remembers = on


# --------------------------------------------------------------------------------- the mixer

class _Tap(nn.Linear):
    """A projection that keeps its last input and output while ``keep`` is set (the
    memorizing layer reads the softmax layer's unrotated q/k/v and per-head output)."""

    keep = False
    seen: tuple[Tensor, Tensor] | None = None

    def forward(self, x: Tensor) -> Tensor:
        y = super().forward(x)
        if self.keep:
            self.seen = (x, y)
        return y


class Memorizing(SoftmaxAttention):
    """Softmax attention plus a retrieval memory of the document's past (the module
    docstring)."""

    bidirectional = False
    options = KNNOptions
    #: where a long row is cut into segments changes the outputs (the memory holds the earlier
    #: segments): a carried read equals the full forward only while the memory is empty
    segments_change_outputs = True
    cross_options = ()  # cross-attention reads softmax's options, not these

    def __init__(self, m: ModelConfig, layer: int, *, causal: bool) -> None:
        super().__init__(m, layer, causal=causal)
        o = knn_options(m)
        self.top_k, self.slots, self.index = o.knn_top_k, o.knn_memory, o.knn_index
        self.gate = nn.Parameter(torch.zeros(self.n_heads))  # b (init 0: g = 1/2)
        for proj in (self.qkv, self.out):
            proj.__class__ = _Tap

    def forward(self, x: Tensor, seq: Sequence, state: State | None) -> Tensor:
        if not (isinstance(state, KNNState) and (
                state.remembers or getattr(seq.cache, "carry", False))):
            return super().forward(x, seq, state)  # no memory: softmax attention
        taps = (self.qkv, self.out)
        for tap in taps:
            tap.keep = True
        try:
            y = super().forward(x, seq, state)
            qkv, local = self.qkv.seen[1], self.out.seen[0]  # type: ignore[index]
            qkv = qkv[:, -x.shape[1]:]  # this segment's rows (an XL layer projects [mem; x])
        finally:
            for tap in taps:
                tap.keep, tap.seen = False, None
        b, t, _ = x.shape
        h, hkv = self.n_heads, self.n_kv_heads
        q, k, v = qkv.view(b, t, h + 2 * hkv, -1).split((h, hkv, hkv), dim=2)  # unrotated
        q, k = qknorm.queries(self, q), qknorm.keys(self, k)  # the local attention's QK-norm
        doc = seq.segments if seq.segments is not None else torch.zeros_like(seq.positions)
        retrieved, found = state.retrieve(q, doc, top_k=self.top_k, index=self.index,
                                          scale=self.d_head ** -0.5, cap=self.softcap)
        state.append(k, v, doc, seq.real())  # after attending
        g = gate(self.gate).to(q.dtype)[:, None] * found[..., None, None]
        delta = g * (retrieved - local.view(b, t, h, -1))  # (B, T, H, D)
        return y + F.linear(delta.reshape(b, t, -1), self.out.weight)  # out(g·r + (1-g)·l)

    def new_state(self, batch: int, capacity: int, *, dtype: torch.dtype,
                  device: torch.device | str, static: bool = False) -> State:
        local = super().new_state(batch, capacity, dtype=dtype, device=device, static=static)
        return with_memory(local, batch, self.n_kv_heads, self.slots, self.d_head, dtype=dtype,
                           device=device)

    @classmethod
    def param_count(cls, m: ModelConfig, layer: int, *, causal: bool) -> int:
        """Softmax's, plus the gate's bias per head (``H``)."""
        return super().param_count(m, layer, causal=causal) + m.n_heads

    @classmethod
    def flops_per_token(cls, m: ModelConfig, layer: int, *, seq_len: int,
                        causal: bool) -> float:
        """Softmax's (with the gate's ``H`` parameters: ``2·H``), plus the search over every
        memory slot, ``2·H·D·M``, and the attention over the top k, ``4·k·H·D`` (scores and
        values), per token — a full memory (``M = knn_memory``, ``k = knn_top_k``)."""
        o = knn_options(m)
        hd = m.n_heads * m.head_dim
        return (super().flops_per_token(m, layer, seq_len=seq_len, causal=causal)
                + 2 * hd * o.knn_memory + 4 * o.knn_top_k * hd)

    @classmethod
    def state_bytes(cls, m: ModelConfig, layer: int, *, batch: int, seq_len: int,
                    bytes_per_value: int) -> int:
        """Softmax's, plus the memory: ``2·B·Hkv·D·M·bytes`` (keys and values) and ``9·B·M +
        8·B`` (each slot's int64 document id and validity, each row's next slot)."""
        slots = knn_options(m).knn_memory
        return (super().state_bytes(m, layer, batch=batch, seq_len=seq_len,
                                    bytes_per_value=bytes_per_value)
                + 2 * batch * m.kv_heads * m.head_dim * slots * bytes_per_value
                + 9 * batch * slots + 8 * batch)

    @classmethod
    def describe(cls, m: ModelConfig, layer: int) -> str:
        o = knn_options(m)
        local = super().describe(m, layer)[1:-1]
        extra = "" if local == "global" else f", {local}"
        return f"(memorizing, top {o.knn_top_k} of {o.knn_memory}{extra})"

    @classmethod
    def summary_rows(cls, m: ModelConfig) -> list[tuple[str, str]]:
        o = knn_options(m)
        return [*super().summary_rows(m), ("retrieval memory", f"top {o.knn_top_k} of the "
                f"last {o.knn_memory} (key, value) pairs per row, {o.knn_index} search")]

    @classmethod
    def check_options(cls, opts: KNNOptions, key: str) -> None:
        super().check_options(opts, key)
        m, k = opts.knn_memory, opts.knn_top_k
        require(isinstance(m, int) and m >= 1, f"{key}.knn_memory", m,
                "must be an integer >= 1 ((key, value) pairs kept per row and layer)")
        require(isinstance(k, int) and 1 <= k <= m, f"{key}.knn_top_k", k,
                f"must be an integer in [1, {key}.knn_memory={m}] (memory entries per query)")
        require(opts.knn_index in INDEXES, f"{key}.knn_index", opts.knn_index,
                f"must be one of {', '.join(INDEXES)}")
        require(opts.knn_index != "faiss" or importlib.util.find_spec("faiss") is not None,
                f"{key}.knn_index", opts.knn_index, "faiss is not installed (pip install "
                "'blocklab[memory]')")

    @classmethod
    def check(cls, m: ModelConfig, layer: int, *, causal: bool, key: str) -> None:
        super().check(m, layer, causal=causal, key=key)
        require(causal, key, "memorizing", "the retrieval memory holds the document's past: "
                "a bidirectional stack has none", "use it in a decoder")
