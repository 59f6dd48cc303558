"""Causal linear attention: the ``linear`` sequence mixer.

Softmax's ``exp(q·k)`` replaced by a kernel ``φ(q)·φ(k)`` with an explicit feature map, so
attention becomes a running sum ("Transformers are RNNs: Fast Autoregressive Transformers with
Linear Attention", Katharopoulos et al., arXiv 2006.16236):

    y_i = φ(q_i)ᵀ S_i / (φ(q_i)ᵀ z_i + eps),   S_i = Σ_j φ(k_j) v_jᵀ,   z_i = Σ_j φ(k_j)

over the keys query ``i`` may see (causal: ``j <= i``; the same packed document; real tokens
only — the rules of masks.py). Decoding keeps ``S`` and ``z`` per key/value head: memory and
time per token constant in the context. Training uses the chunked parallel form (dense within
a chunk, through the running state across chunks), so its cost is linear in ``T``.

Feature maps (``model.mixer.feature_map``):

- ``elu``: ``elu(x) + 1`` on the ``d_head``-wide queries and keys (Katharopoulos et al.);
- ``taylor``: queries and keys projected to ``feature_dim = D`` per head and mapped to
  ``[1, x / D^¼, (x ⊗ x) / (√2 · √D)]`` (``1 + D + D²`` features), so that ``φ(q)·φ(k) =
  1 + s + s²/2`` with ``s = q·k / √D``: the 2nd-order Taylor expansion of ``exp(s)``, Based's
  feature map ("Simple linear attention language models balance the recall-throughput
  tradeoff", Arora et al., arXiv 2402.18668);
- ``favor``: FAVOR+'s positive random features of the softmax kernel, ``n_features`` of them
  per head from a (block-orthogonal, ``orthogonal``) random projection of the ``d_head``-wide
  queries and keys, redrawn every ``redraw_every`` training forwards (0 = never) from
  ``feature_seed`` (Performer, Choromanski et al., arXiv 2009.14794; model/favor.py).

``model.mixer.short_conv = K >= 1`` adds a causal depthwise convolution of ``K`` taps on the
input before the projections, as Based does (local token mixing the kernel cannot express);
its taps count real tokens of the same document only, and decoding keeps the last ``K - 1``
real inputs of each row. Linear attention applies no rotary angles and no score bias;
softmax's ``scale`` and ``dropout`` (attention probabilities) are not its options.

Shape legend: B batch, T tokens, H query heads, Hkv key/value heads, g = H / Hkv query heads
per key/value head, E projected query/key width per head (d_head or feature_dim), F features
(``E`` or ``1 + E + E²``), V value width (d_head), V1 = V + 1 (values with a ones column: the
normaliser ``z`` rides along with ``S``), n chunks of L tokens, K taps, d d_model.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from blocklab.config import ModelConfig
from blocklab.config.checks import require
from blocklab.model import favor, masks, seqops
from blocklab.model.cache import check_no_grad
from blocklab.model.mixer import Mixer, Sequence, State

#: Added to the normaliser ``φ(q)ᵀ z``: a query that sees no key (padding) reads 0, not NaN.
EPS = 1e-6


# ------------------------------------------------------------------------------ feature maps

def elu_features(x: Tensor) -> Tensor:
    """``elu(x) + 1`` (positive, so every normaliser is > 0): (..., E) -> (..., E).
    Pointwise, so the mixer applies it to the fused projection's query/key slice before the
    heads are split (one pass; AOTAutograd's backward of ``F.elu`` on a permuted view fails
    to ``view`` its gradient, torch 2.13)."""
    return F.elu(x) + 1


def dot_kernel(q: Tensor, k: Tensor) -> Tensor:
    """``q_i·k_j`` of features: (..., Tq, F), (..., Tk, F) -> (..., Tq, Tk)."""
    return q @ k.transpose(-1, -2)


def taylor_features(x: Tensor) -> Tensor:
    """``[1, x / E^¼, vec(x ⊗ x) / (√2 · √E)]``: (..., E) -> (..., 1 + E + E²), so that
    ``φ(q)·φ(k) = 1 + s + s²/2``, ``s = q·k / √E`` (Based's TaylorExp; always >= 1/2)."""
    e = x.shape[-1]
    half = x * (2 * e) ** -0.25  # its outer product is (x ⊗ x) / √(2E): one scaling pass
    square = (half[..., :, None] * half[..., None, :]).flatten(-2)  # (..., E²)
    return torch.cat((torch.ones_like(x[..., :1]), x * e ** -0.25, square), -1)


def taylor_kernel(q: Tensor, k: Tensor) -> Tensor:
    """``1 + s + s²/2``, ``s = q·k / √E`` — what the features' dot product equals, from the
    ``E``-wide projections instead of the ``1 + E + E²`` features (the dense part within a
    chunk: Based's parallel form): (..., Tq, E), (..., Tk, E) -> (..., Tq, Tk)."""
    s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    return 1 + s + s * s / 2


def identity_features(x: Tensor) -> Tensor:
    """``x`` unchanged — the part of a feature map that does nothing."""
    return x


@dataclass(frozen=True)
class FeatureMap:
    """``φ`` in two parts — ``pointwise`` on the projections (before the heads are split),
    ``features`` per head (what the state sums) — and ``kernel``, ``φ(q)·φ(k)`` from what
    ``pointwise`` gives (the pairs within a chunk); ``query``: the queries' features where
    they differ from the keys' (FAVOR+'s stabilisers), None: ``features``."""

    pointwise: Callable[[Tensor], Tensor]
    features: Callable[[Tensor], Tensor]
    kernel: Callable[[Tensor, Tensor], Tensor]
    query: Callable[[Tensor], Tensor] | None = None

    def query_features(self, x: Tensor) -> Tensor:
        return (self.query or self.features)(x)


FEATURE_MAPS = {"elu": FeatureMap(elu_features, identity_features, dot_kernel),
                "taylor": FeatureMap(identity_features, taylor_features, taylor_kernel),
                "favor": None}  # per layer: its random projection (LinearAttention.favor_map)


def feature_width(feature_map: str, width: int, n_features: int = 0) -> int:
    """F: features per head of a ``width``-wide query or key (favor: ``n_features``)."""
    return {"elu": width, "favor": n_features}.get(feature_map, 1 + width + width * width)


# ------------------------------------------------------------------------------ chunked form

def _chunks(x: Tensor, chunk: int) -> Tensor:
    """(..., n·L, D) -> (..., n, L, D)."""
    return x.reshape(*x.shape[:-2], x.shape[-2] // chunk, chunk, x.shape[-1])


def carry_scan(u: Tensor, continues: Tensor | None) -> Tensor:
    """The states leaving each chunk, ``P_n = c_n · P_{n-1} + U_n`` (``c_n`` = 0 where a
    document starts in chunk n; None: always 1, a cumulative sum): u (B, Hkv, n, F, V1),
    continues (B, n) bool -> (B, Hkv, n, F, V1). A Hillis–Steele scan over chunks: ``log2
    n`` steps, no subtraction (exact restarts), fixed Python control flow (compile-clean)."""
    if continues is None:
        return u.cumsum(2)
    c = continues.to(u.dtype)[:, None, :, None, None]  # (B, 1, n, 1, 1)
    n, step = u.shape[2], 1
    while step < n:
        u = torch.cat((u[:, :, :step], u[:, :, step:] + c[:, :, step:] * u[:, :, :-step]), 2)
        c = torch.cat((c[:, :, :step], c[:, :, step:] * c[:, :, :-step]), 2)
        step *= 2
    return u


def _masked(x: Tensor, mask: Tensor | None) -> Tensor:
    return x if mask is None else x * mask


def chunked_attention(q: Tensor, k: Tensor, v: Tensor, docs: Tensor | None,
                      real: Tensor | None, chunk: int, phi: FeatureMap, *, strict: bool = False,
                      initial: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """Unnormalised causal linear attention in chunks of ``chunk`` tokens.

    q (B, Hkv, g, T, E) and k (B, Hkv, T, E) projections after ``phi.pointwise`` (fp32), v
    (B, Hkv, T, V1), docs (B, T) document indices (None: one per row), real (B, T) bool (None:
    no padding), initial (B, Hkv, F, V1) the state before these tokens. Returns ``Σ_j A_ij
    φ(q_i)·φ(k_j) v_j`` (B, Hkv, g, T, V1) and the state after the last token (B, Hkv, F,
    V1); ``A`` is :func:`~blocklab.model.masks.chunk_visibility`'s: pairs within a chunk by
    the kernel, earlier chunks through the features' state."""
    b, t = q.shape[0], q.shape[3]
    chunk = min(chunk, t)
    pad = -t % chunk
    if pad:  # whole chunks: padding keys are invalid, and keep the last token's document
        q, k, v = F.pad(q, (0, 0, 0, pad)), F.pad(k, (0, 0, 0, pad)), F.pad(v, (0, 0, 0, pad))
        docs = None if docs is None else torch.cat((docs, docs[:, -1:].expand(-1, pad)), 1)
        real = torch.ones(b, t, dtype=torch.bool, device=q.device) if real is None else real
        real = F.pad(real, (0, pad), value=False)
    vis = masks.chunk_visibility(docs, real, chunk, strict=strict, device=q.device)
    qc, kc, vc = _chunks(q, chunk), _chunks(k, chunk), _chunks(v, chunk)  # (..., n, L, ·)
    scores = phi.kernel(qc, kc[:, :, None]) * vis.within[:, None, None]  # (B, Hkv, g, n, L, L)
    out = scores @ vc[:, :, None]  # (B, Hkv, g, n, L, V1)
    fq, fk = phi.query_features(qc), phi.features(kc)  # (B, Hkv, g, n, L, F), (B, Hkv, n, L, F)
    kept = None if vis.kept is None else vis.kept[:, None, :, :, None]
    u = fk.transpose(-1, -2) @ _masked(vc, kept)  # (B, Hkv, n, F, V1)
    continues = vis.continues
    if initial is not None:  # the decode state enters chunk 0
        first = initial[:, :, None]
        if continues is not None:
            first = continues[:, None, :1, None, None].to(u.dtype) * first
        u = torch.cat((u[:, :, :1] + first, u[:, :, 1:]), 2)
    after = carry_scan(u, continues)  # (B, Hkv, n, F, V1)
    start = torch.zeros_like(after[:, :, :1]) if initial is None else initial[:, :, None]
    entering = torch.cat((start, after[:, :, :-1]), 2)  # (B, Hkv, n, F, V1)
    carried = None if vis.carried is None else vis.carried[:, None, None, :, :, None]
    out = out + _masked(fq @ entering[:, :, None], carried)  # (B, Hkv, g, n, L, V1)
    out = out.flatten(3, 4)[:, :, :, :t]  # (B, Hkv, g, T, V1)
    return out, after[:, :, -1]


def attend(q: Tensor, k: Tensor, v: Tensor, docs: Tensor | None, real: Tensor | None,
           chunk: int, phi: FeatureMap, *, causal: bool) -> Tensor:
    """Normalised linear attention without a decode state (shapes of
    :func:`chunked_attention`): causal, or bidirectional as the causal pass plus the strictly
    anticausal one (the same chunked form, reversed). -> (B, Hkv, g, T, V)."""
    o, _ = chunked_attention(q, k, v, docs, real, chunk, phi)
    if not causal:
        back, _ = chunked_attention(q.flip(3), k.flip(2), v.flip(2), _flip(docs), _flip(real),
                                    chunk, phi, strict=True)
        o = o + back.flip(3)  # (B, Hkv, g, T, V1)
    return o[..., :-1] / (o[..., -1:] + EPS)


# ----------------------------------------------------------------------------- decode state

class LinearState(State):
    """``S`` (B, Hkv, F, V) and ``z`` (B, Hkv, F) in fp32, and with a short convolution the
    last ``K - 1`` real inputs of each row (B, K-1, d): constant in the context length."""

    def __init__(self, batch: int, kv_heads: int, features: int, d_value: int, d_model: int,
                 taps: int, *, dtype: torch.dtype, device: torch.device | str) -> None:
        self.s = torch.zeros(batch, kv_heads, features, d_value, dtype=torch.float32,
                             device=device)
        self.z = torch.zeros(batch, kv_heads, features, dtype=torch.float32, device=device)
        if taps:  # the short convolution's tail (no values with one tap)
            self.tail = torch.zeros(batch, taps - 1, d_model, dtype=dtype, device=device)

    def joined(self) -> Tensor:
        return torch.cat((self.s, self.z[..., None]), -1)  # (B, Hkv, F, V1)

    def write(self, after: Tensor) -> None:
        """In place (compiled decoding), rebound in a carry cache (``Rows.put``)."""
        self.put("s", after[..., :-1])
        self.put("z", after[..., -1])


# ------------------------------------------------------------------------------------ mixer

@dataclass
class LinearOptions:
    """The ``linear`` mixer's options (``model.mixer.<option>``)."""

    feature_map: str = "elu"  # elu (d_head features) | taylor (1 + D + D²) | favor (n_features)
    feature_dim: int = 16  # taylor: query/key projection width per head
    n_features: int = 64  # favor: random features per head (m)
    orthogonal: bool = True  # favor: block-orthogonal draws (False: i.i.d. Gaussian)
    redraw_every: int = 0  # favor: training forwards between redraws (0 = never)
    feature_seed: int = 0  # favor: the draws' seed (with the layer and the draw's index)
    short_conv: int = 0  # causal depthwise convolution taps on the input (0 = none)
    chunk: int = 64  # tokens per chunk of the chunked parallel form (training, prefill)


def key_width(m: ModelConfig) -> int:
    """E: the projected query/key width per head."""
    o = m.mixer.read(LinearOptions)
    return o.feature_dim if o.feature_map == "taylor" else m.head_dim


class LinearAttention(Mixer):
    """Linear attention (module docstring): one fused projection to queries (H · E), keys
    (Hkv · E) and values (Hkv · V), the feature map, the kernel sum, an output projection.
    ``n_kv_heads < n_heads`` shares each key/value feature head and its state among ``g``
    query heads (the head layout, ``model.attention``: GQA, arXiv 2305.13245; MQA, arXiv
    1911.02150). Bidirectional stacks see every real key of the same document: the causal
    pass plus the strictly anticausal one (the same chunked form, reversed)."""

    residual_outputs = ("out",)
    options = LinearOptions

    def __init__(self, m: ModelConfig, layer: int, *, causal: bool) -> None:
        super().__init__(m, layer, causal=causal)
        o = m.mixer.read(LinearOptions)
        self.phi = FEATURE_MAPS[o.feature_map]
        self.chunk, self.taps, self.d_model = o.chunk, o.short_conv, m.d_model
        self.n_heads, self.n_kv_heads, self.d_value = m.n_heads, m.kv_heads, m.head_dim
        self.d_key = key_width(m)
        self.features = feature_width(o.feature_map, self.d_key, o.n_features)
        self.favor = None
        if o.feature_map == "favor":  # its random projection W (a checkpointed buffer)
            self.favor = favor.Favor(o.n_features, self.d_key, orthogonal=o.orthogonal,
                                     redraw_every=o.redraw_every, seed=o.feature_seed,
                                     layer=layer)
            self.phi = FeatureMap(identity_features, self.favor.keys, self.favor.kernel,
                                  self.favor.queries)
        h, hkv = self.n_heads, self.n_kv_heads
        self.qkv = nn.Linear(m.d_model, (h + hkv) * self.d_key + hkv * self.d_value,
                             bias=m.attention.bias)
        self.out = nn.Linear(h * self.d_value, m.d_model, bias=m.attention.bias)
        self.conv = (nn.Conv1d(m.d_model, m.d_model, o.short_conv, groups=m.d_model)
                     if o.short_conv else None)

    def init_weights(self) -> None:
        """The convolution keeps PyTorch's default init (Mamba's and Based's short
        convolutions do): GPT-2's N(0, init_std) would make it all but zero at the start."""
        if self.conv is not None:
            self.conv.reset_parameters()

    def forward(self, x: Tensor, seq: Sequence, state: State | None) -> Tensor:
        b, t, _ = x.shape
        real, starts = seq.valid, seq.starts()
        real = None if real is None else real.bool()
        docs = None if starts is None else starts.long().cumsum(-1)  # (B, T) document index
        if state is not None:
            assert isinstance(state, LinearState) and self.causal
            check_no_grad(x, seq.cache)
        if self.training and self.favor is not None and self.favor.redraw_every:
            self.favor.count_forward()
        if self.conv is not None:  # over real tokens, compacted (seqops)
            rows = seqops.compact(seq)
            y, tail = seqops.short_conv(rows.gather(x), self.conv.weight[:, 0], self.conv.bias,
                                        rows, tail=None if state is None else state.tail)
            x = rows.scatter(y)
            if state is not None:
                state.put("tail", tail)
        q, k, v = self._project(x)  # (B, Hkv, g, T, E), (B, Hkv, T, E), (B, Hkv, T, V1)
        if self.causal and state is not None:
            o, after = chunked_attention(q, k, v, docs, real, self.chunk, self.phi,
                                         initial=state.joined())
            state.write(after)
            y = o[..., :-1] / (o[..., -1:] + EPS)  # (B, Hkv, g, T, V)
        else:
            y = attend(q, k, v, docs, real, self.chunk, self.phi, causal=self.causal)
        y = y.permute(0, 3, 1, 2, 4).reshape(b, t, -1)  # (B, T, H·V)
        return self.out(y.to(x.dtype))

    def _project(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Queries and keys after ``phi.pointwise``, values with a ones column (fp32,
        head-major)."""
        b, t, _ = x.shape
        h, hkv, e = self.n_heads, self.n_kv_heads, self.d_key
        qk, v = self.qkv(x).split(((h + hkv) * e, hkv * self.d_value), -1)
        q, k = self.phi.pointwise(qk.float()).split((h * e, hkv * e), -1)
        q = q.reshape(b, t, hkv, h // hkv, e).permute(0, 2, 3, 1, 4)  # (B, Hkv, g, T, E)
        k = k.reshape(b, t, hkv, e).transpose(1, 2)  # (B, Hkv, T, E)
        v = v.float().reshape(b, t, hkv, self.d_value).transpose(1, 2)  # (B, Hkv, T, V)
        v = torch.cat((v, torch.ones_like(v[..., :1])), -1)  # (B, Hkv, T, V1)
        return q, k, v

    def new_state(self, batch: int, capacity: int, *, dtype: torch.dtype,
                  device: torch.device | str, static: bool = False) -> State:
        """The same fixed-size state for a growing and a static cache (updated in place)."""
        return LinearState(batch, self.n_kv_heads, self.features, self.d_value, self.d_model,
                           self.taps, dtype=dtype, device=device)

    @classmethod
    def param_count(cls, m: ModelConfig, layer: int, *, causal: bool) -> int:
        """The fused q/k/v and output projections (+ biases), and the convolution's
        ``d · K`` taps + ``d`` biases."""
        h, hkv, e, v, d = m.n_heads, m.kv_heads, key_width(m), m.head_dim, m.d_model
        width = (h + hkv) * e + hkv * v
        bias = width + d if m.attention.bias else 0
        taps = m.mixer.read(LinearOptions).short_conv
        conv = d * taps + d if taps else 0
        return d * width + h * v * d + bias + conv

    @classmethod
    def flops_per_token(cls, m: ModelConfig, layer: int, *, seq_len: int,
                        causal: bool) -> float:
        """The recurrent form, constant in ``T``: ``2 · params`` (projections, convolution)
        + ``(H + Hkv) · F`` (feature maps) + ``2 · Hkv · F · (V + 1)`` (state update) + ``2 ·
        H · F · (V + 1) + H · V`` (readout and normalisation). Training's chunked form adds
        ``O(L · (E + V))`` per token and head for the dense part within a chunk (the
        kernel of the pairs)."""
        h, hkv, v = m.n_heads, m.kv_heads, m.head_dim
        o = m.mixer.read(LinearOptions)
        f = feature_width(o.feature_map, key_width(m), o.n_features)
        return (2.0 * cls.param_count(m, layer, causal=causal) + (h + hkv) * f
                + 2 * (hkv + h) * f * (v + 1) + h * v)

    @classmethod
    def state_bytes(cls, m: ModelConfig, layer: int, *, batch: int, seq_len: int,
                    bytes_per_value: int) -> int:
        """``S`` and ``z`` in fp32, ``B · Hkv · F · (V + 1) · 4``, plus the convolution's tail
        ``B · (K - 1) · d · bytes``: constant in the context length."""
        o = m.mixer.read(LinearOptions)
        f = feature_width(o.feature_map, key_width(m), o.n_features)
        taps = max(o.short_conv - 1, 0)
        return batch * (m.kv_heads * f * (m.head_dim + 1) * 4
                        + taps * m.d_model * bytes_per_value)

    @classmethod
    def describe(cls, m: ModelConfig, layer: int) -> str:
        o = m.mixer.read(LinearOptions)
        return f"({o.feature_map}, {feature_width(o.feature_map, key_width(m), o.n_features)} features)"

    @classmethod
    def check(cls, m: ModelConfig, layer: int, *, causal: bool, key: str) -> None:
        o = m.mixer.read(LinearOptions)
        require(o.feature_map in FEATURE_MAPS, f"{key}.feature_map", o.feature_map,
                f"one of {', '.join(FEATURE_MAPS)}")
        if o.feature_map == "taylor":
            require(_count(o.feature_dim, 1), f"{key}.feature_dim", o.feature_dim,
                    "must be an integer >= 1 (taylor: the query/key width per head)",
                    "the state holds 1 + D + D² features per key/value head, e.g. 16")
        require(_count(o.feature_dim, 0), f"{key}.feature_dim", o.feature_dim,  # never negative
                "must be an integer >= 0 (unread by feature_map=elu, a width all the same)")
        favor.check(o, key)
        require(_count(o.short_conv, 0), f"{key}.short_conv", o.short_conv,
                "must be an integer >= 0 (convolution taps; 0 = none)")
        require(_count(o.chunk, 1), f"{key}.chunk", o.chunk,
                "must be an integer >= 1 (tokens per chunk of the chunked form)")


def _flip(x: Tensor | None) -> Tensor | None:
    return None if x is None else x.flip(1)


def _count(x: object, least: int) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x >= least
