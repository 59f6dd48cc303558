"""Low-rank approximations of softmax attention, for encoder stacks: the ``linformer`` and
``nystrom`` sequence mixers.

- ``linformer`` ("Linformer: Self-Attention with Linear Complexity", Wang et al., arXiv
  2006.04768): keys and values projected along the sequence, ``n -> k = proj_dim``, by learned
  ``E`` and ``F`` (``k × max_seq_len``, one pair per layer shared by its heads; ``share_kv``,
  the default: ``F = E``, the paper's key-value sharing, which it reports costs little), ``y = softmax(q (E K)ᵀ / √d) (F V)``. Column ``j`` of ``E`` multiplies the
  ``j``-th *real* token of the document, so the sequence may not exceed ``model.max_seq_len``.
- ``nystrom`` ("Nyströmformer", Xiong et al., arXiv 2102.03902): ``landmarks = m`` segment
  means of the queries and keys (the document's real tokens cut into ``m`` contiguous runs of
  near-equal length: token ``r`` of ``n`` is in run ``⌊r·m/n⌋``), ``y = softmax(q K̃ᵀ) ·
  pinv(softmax(Q̃ K̃ᵀ)) · softmax(Q̃ Kᵀ) V``; the Moore–Penrose pseudo-inverse by the paper's
  iteration ``Z ← Z (13 I - AZ (15 I - AZ (7 I - AZ))) / 4`` from ``Z₀ = Aᵀ / (‖A‖₁ ‖A‖∞)``,
  ``pinv_iters`` times (0: exact, by SVD). A document shorter than ``m`` tokens leaves runs
  empty: their landmarks are left out (zero rows and columns, which the iteration keeps zero),
  so ``m >= n`` with the exact inverse is softmax attention exactly. ``Z₀``'s norms are taken
  per row and head (the reference implementation's maximum over the whole batch would let one
  row change another's outputs).

Both mix every token with every other one (no causal form): a causal stack with either is
refused in one line (``causal_form = False``; ``model.mixer.encoder=[...]`` puts them in an
encoder). Padding never changes an output: padded keys enter no projection and no landmark,
columns and runs count real tokens only, padded queries output 0. Packed documents
(``segments``) are computed *per document exactly*: the documents are gathered into rows of
their own (one row each, padded to the longest), attended alone, and scattered back — the
number of documents and their longest length are read on the host once per forward, so a
packed batch costs a device sync and (under ``torch.compile``) graph breaks; unpacked, padded
batches keep fixed shapes. Neither applies rotary angles or score biases (positions: none, sinusoidal, learned).

Shape legend: B batch (N documents when unpacked), T tokens, H query heads, Hkv key/value
heads, D d_head, k projected length (linformer), m landmarks (nystrom), d d_model.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from blocklab.config import ModelConfig
from blocklab.config.checks import require
from blocklab.model.mixer import Mixer, Sequence


def masked_softmax(scores: Tensor, keep: Tensor) -> Tensor:
    """Softmax over the last dim among ``keep`` (broadcast bool); a row keeping nothing is 0
    (never NaN, finite gradients)."""
    scores = scores.masked_fill(~keep, torch.finfo(scores.dtype).min)
    return torch.softmax(scores, -1) * keep


def iterative_pinv(a: Tensor, iters: int) -> Tensor:
    """The Moore–Penrose pseudo-inverse of ``a`` (..., m, m) by Nyströmformer's iteration
    (Razavi et al.'s cubic scheme), ``Z₀ = aᵀ / (max column sum · max row sum)`` per matrix;
    ``iters = 0``: exact (``torch.linalg.pinv``)."""
    if iters == 0:
        return torch.linalg.pinv(a)
    absolute = a.abs()
    norm = absolute.sum(-1).amax(-1) * absolute.sum(-2).amax(-1)  # (...)
    z = a.transpose(-1, -2) / norm.clamp(min=torch.finfo(a.dtype).tiny)[..., None, None]
    eye = torch.eye(a.shape[-1], dtype=a.dtype, device=a.device)
    for _ in range(iters):
        az = a @ z
        z = 0.25 * z @ (13 * eye - az @ (15 * eye - az @ (7 * eye - az)))
    return z


def real_ranks(valid: Tensor | None, b: int, t: int, device: torch.device) -> tuple[Tensor,
                                                                                   Tensor]:
    """Each token's index among its row's real tokens (B, T) (padding: 0) and the real
    tokens per row (B,)."""
    if valid is None:
        return (torch.arange(t, device=device).expand(b, t),
                torch.full((b,), t, device=device))
    rank = (valid.long().cumsum(-1) - 1).clamp(min=0) * valid
    return rank, valid.sum(-1)


@dataclass(frozen=True)
class Documents:
    """Packed documents gathered into rows of their own (the module docstring)."""

    doc: Tensor  # (R,) the document of each real token (R real tokens in the batch)
    pos: Tensor  # (R,) its index in the document
    real: Tensor  # (B, T) bool
    valid: Tensor  # (N, L) bool: the document rows' real slots

    @classmethod
    def of(cls, seq: Sequence) -> Documents:
        real, starts = seq.real(), seq.starts()
        flat = real.flatten()
        doc = (starts.flatten().long().cumsum(0) - 1)[flat]  # (R,)
        first = torch.nonzero(starts.flatten()).flatten()  # (N,) flat index of each start
        index = torch.nonzero(flat).flatten()  # (R,) flat index of each real token
        rank = torch.arange(index.numel(), device=index.device)
        first_rank = torch.searchsorted(index, first)  # the rank of each document's start
        pos = rank - first_rank[doc]
        n_docs, longest = first.numel(), int(pos.max()) + 1 if pos.numel() else 1
        valid = torch.zeros(max(n_docs, 1), longest, dtype=torch.bool, device=real.device)
        valid[doc, pos] = True
        return cls(doc, pos, real, valid)

    def gather(self, x: Tensor) -> Tensor:
        """(B, T, C) -> (N, L, C)."""
        out = x.new_zeros(*self.valid.shape, x.shape[-1])
        out[self.doc, self.pos] = x[self.real]
        return out

    def scatter(self, y: Tensor) -> Tensor:
        """(N, L, C) -> (B, T, C), padding 0."""
        out = y.new_zeros(*self.real.shape, y.shape[-1])
        out[self.real] = y[self.doc, self.pos]
        return out


class LowRank(Mixer):
    """What both share: one fused q/k/v projection (the head layout of ``model.attention``:
    GQA and MQA share each key/value head among ``g`` query heads), per-document rows for
    packed input, padded queries zeroed, an output projection. Subclasses attend."""

    residual_outputs = ("out",)
    #: no causal form: refused in a causal stack (decoder) by :meth:`check`
    causal_form = False

    def __init__(self, m: ModelConfig, layer: int, *, causal: bool) -> None:
        super().__init__(m, layer, causal=causal)
        self.n_heads, self.n_kv_heads, self.d_head = m.n_heads, m.kv_heads, m.head_dim
        self.max_len = m.max_seq_len
        h, hkv, dh = self.n_heads, self.n_kv_heads, self.d_head
        self.qkv = nn.Linear(m.d_model, (h + 2 * hkv) * dh, bias=m.attention.bias)
        self.out = nn.Linear(h * dh, m.d_model, bias=m.attention.bias)

    def forward(self, x: Tensor, seq: Sequence, state: object) -> Tensor:
        assert state is None, "an encoder-only mixer keeps no decode state"
        qkv = self.qkv(x)
        if seq.segments is not None:
            docs = seq.memo("lowrank.documents", lambda: Documents.of(seq))  # once a forward
            y = docs.scatter(self._rows(docs.gather(qkv), docs.valid))
        else:
            y = self._rows(qkv, None if seq.valid is None else seq.valid.bool())
        return self.out(y.to(x.dtype))

    def _rows(self, qkv: Tensor, valid: Tensor | None) -> Tensor:
        """(B, T, (H + 2 Hkv) D) -> (B, T, H D), each row one document."""
        b, t, _ = qkv.shape
        h, hkv, dh = self.n_heads, self.n_kv_heads, self.d_head
        qkv = qkv.to(torch.promote_types(qkv.dtype, torch.float32))  # fp32 or fp64
        q, k, v = qkv.split((h * dh, hkv * dh, hkv * dh), -1)
        q = q.reshape(b, t, h, dh).transpose(1, 2) * dh ** -0.5  # (B, H, T, D)
        k = k.reshape(b, t, hkv, dh).transpose(1, 2).repeat_interleave(h // hkv, 1)
        v = v.reshape(b, t, hkv, dh).transpose(1, 2).repeat_interleave(h // hkv, 1)
        y = self.attend(q, k, v, valid)  # (B, H, T, D)
        if valid is not None:
            y = y * valid[:, None, :, None]
        return y.transpose(1, 2).reshape(b, t, h * dh)

    def attend(self, q: Tensor, k: Tensor, v: Tensor, valid: Tensor | None) -> Tensor:
        raise NotImplementedError

    @classmethod
    def _projections(cls, m: ModelConfig) -> int:
        h, hkv, dh, d = m.n_heads, m.kv_heads, m.head_dim, m.d_model
        width = (h + 2 * hkv) * dh
        return d * width + h * dh * d + (width + d if m.attention.bias else 0)

    @classmethod
    def check(cls, m: ModelConfig, layer: int, *, causal: bool, key: str) -> None:
        name = m.layer_mixer(layer, causal)
        require(not causal, key + m.mixer_key(causal).removeprefix("model.mixer"), name,
                f"mixer {name!r} has no causal form (each output mixes every token of the "
                f"document, the future included), and family {m.family.name!r} has a causal "
                "stack", "use it in an encoder: model.mixer.encoder=[" + name + "] with a "
                "causal mixer for the decoder, or an encoder family")


# ------------------------------------------------------------------------------- nystrom

@dataclass
class NystromOptions:
    """The ``nystrom`` mixer's options (``model.mixer.<option>``)."""

    landmarks: int = 32  # m: segment means of the queries and keys per document
    pinv_iters: int = 6  # iterations of the pseudo-inverse (0 = exact, by SVD)


class NystromAttention(LowRank):
    """Nyström attention (the module docstring)."""

    options = NystromOptions

    def __init__(self, m: ModelConfig, layer: int, *, causal: bool) -> None:
        super().__init__(m, layer, causal=causal)
        o = m.mixer.read(NystromOptions)
        self.landmarks, self.pinv_iters = o.landmarks, o.pinv_iters

    def attend(self, q: Tensor, k: Tensor, v: Tensor, valid: Tensor | None) -> Tensor:
        b, _, t, _ = q.shape
        rank, count = real_ranks(valid, b, t, q.device)
        run = rank * self.landmarks // count.clamp(min=1)[:, None]  # (B, T) in [0, m)
        member = run[:, None, :] == torch.arange(self.landmarks, device=q.device)[:, None]
        if valid is not None:
            member = member & valid[:, None, :]  # (B, m, T)
        sizes = member.sum(-1)  # (B, m)
        means = member.to(q.dtype) / sizes.clamp(min=1)[..., None]  # (B, m, T)
        q_land, k_land = means[:, None] @ q, means[:, None] @ k  # (B, H, m, D)
        land = (sizes > 0)[:, None, None, :]  # (B, 1, 1, m): non-empty runs
        keys = torch.ones_like(land[..., :1]) if valid is None else valid[:, None, None, :]
        k1 = masked_softmax(q @ k_land.transpose(-1, -2), land)  # (B, H, T, m)
        k2 = masked_softmax(q_land @ k_land.transpose(-1, -2), land & land.transpose(-1, -2))
        k3 = masked_softmax(q_land @ k.transpose(-1, -2), keys) * land.transpose(-1, -2)
        return k1 @ (iterative_pinv(k2, self.pinv_iters) @ (k3 @ v))

    @classmethod
    def param_count(cls, m: ModelConfig, layer: int, *, causal: bool) -> int:
        """The fused q/k/v and output projections (+ biases)."""
        return cls._projections(m)

    @classmethod
    def flops_per_token(cls, m: ModelConfig, layer: int, *, seq_len: int,
                        causal: bool) -> float:
        """``2 · params`` (projections) + per head ``4 · D`` (landmark means), ``2 · m · D``
        for each of ``q K̃ᵀ``, ``Q̃ Kᵀ``, ``softmax(Q̃ Kᵀ) V`` and the readout, and the
        ``m × m`` part shared by the sequence, ``(2 m² D + iters · 8 m³ + 2 m² D) / T``."""
        o = m.mixer.read(NystromOptions)
        lm, dh, t = o.landmarks, m.head_dim, max(seq_len, 1)
        shared = (4 * lm * lm * dh + o.pinv_iters * 8 * lm ** 3) / t
        return 2.0 * cls._projections(m) + m.n_heads * (4 * dh + 8 * lm * dh + shared)

    @classmethod
    def score_keys(cls, m: ModelConfig, layer: int, *, seq_len: int) -> int:
        """Each query scores the ``m`` landmarks (and each landmark every key: as wide)."""
        return 2 * m.mixer.read(NystromOptions).landmarks

    @classmethod
    def describe(cls, m: ModelConfig, layer: int) -> str:
        o = m.mixer.read(NystromOptions)
        return f"({o.landmarks} landmarks, pinv {o.pinv_iters or 'exact'})"

    @classmethod
    def check(cls, m: ModelConfig, layer: int, *, causal: bool, key: str) -> None:
        super().check(m, layer, causal=causal, key=key)
        o = m.mixer.read(NystromOptions)
        require(_count(o.landmarks, 1), f"{key}.landmarks", o.landmarks,
                "must be an integer >= 1 (landmarks per document)")
        require(_count(o.pinv_iters, 0), f"{key}.pinv_iters", o.pinv_iters,
                "must be an integer >= 0 (pseudo-inverse iterations; 0 = exact)")


# ----------------------------------------------------------------------------- linformer

@dataclass
class LinformerOptions:
    """The ``linformer`` mixer's options (``model.mixer.<option>``)."""

    proj_dim: int = 64  # k: the projected length of keys and values
    share_kv: bool = True  # one projection for keys and values (F = E; False: E and F)


class LinformerAttention(LowRank):
    """Linformer attention (the module docstring)."""

    options = LinformerOptions

    def __init__(self, m: ModelConfig, layer: int, *, causal: bool) -> None:
        super().__init__(m, layer, causal=causal)
        o = m.mixer.read(LinformerOptions)
        self.proj_dim = o.proj_dim
        self.e = nn.Parameter(torch.empty(o.proj_dim, m.max_seq_len))
        self.f = None if o.share_kv else nn.Parameter(torch.empty(o.proj_dim, m.max_seq_len))
        self.init_weights()

    def init_weights(self) -> None:
        """``U(-1/√k, 1/√k)``, as the reference implementation draws them."""
        bound = self.proj_dim ** -0.5
        for p in (self.e, self.f):
            if p is not None:
                nn.init.uniform_(p, -bound, bound)

    def attend(self, q: Tensor, k: Tensor, v: Tensor, valid: Tensor | None) -> Tensor:
        b, _, t, _ = q.shape
        if t > self.max_len:
            raise ValueError(f"linformer: {t} tokens, more than model.max_seq_len="
                             f"{self.max_len} (the length its projections E, F span)")
        rank, _ = real_ranks(valid, b, t, q.device)
        keep = 1.0 if valid is None else valid[:, None, :].to(q.dtype)

        def columns(p: Tensor) -> Tensor:  # (B, k, T): column rank_j of p, padding zeroed
            return p[:, rank].to(q.dtype).transpose(0, 1) * keep

        e = columns(self.e)
        f = e if self.f is None else columns(self.f)
        k_proj, v_proj = e[:, None] @ k, f[:, None] @ v  # (B, H, k, D)
        return torch.softmax(q @ k_proj.transpose(-1, -2), -1) @ v_proj

    @classmethod
    def param_count(cls, m: ModelConfig, layer: int, *, causal: bool) -> int:
        """The projections (+ biases) and ``E`` (and ``F``), ``k · max_seq_len`` each."""
        o = m.mixer.read(LinformerOptions)
        return cls._projections(m) + (1 if o.share_kv else 2) * o.proj_dim * m.max_seq_len

    @classmethod
    def flops_per_token(cls, m: ModelConfig, layer: int, *, seq_len: int,
                        causal: bool) -> float:
        """``2 · (q/k/v and output projections)`` + per head ``2 · k · D`` for each of the
        key and value projections along the sequence, the scores and the readout."""
        o = m.mixer.read(LinformerOptions)
        return 2.0 * cls._projections(m) + m.n_heads * 8 * o.proj_dim * m.head_dim

    @classmethod
    def score_keys(cls, m: ModelConfig, layer: int, *, seq_len: int) -> int:
        """Each query scores the ``k`` projected keys."""
        return m.mixer.read(LinformerOptions).proj_dim

    @classmethod
    def describe(cls, m: ModelConfig, layer: int) -> str:
        o = m.mixer.read(LinformerOptions)
        return f"(k {o.proj_dim}{', shared E = F' if o.share_kv else ''})"

    @classmethod
    def check(cls, m: ModelConfig, layer: int, *, causal: bool, key: str) -> None:
        super().check(m, layer, causal=causal, key=key)
        o = m.mixer.read(LinformerOptions)
        require(_count(o.proj_dim, 1), f"{key}.proj_dim", o.proj_dim,
                "must be an integer >= 1 (the projected length of keys and values)")
        require(isinstance(o.share_kv, bool), f"{key}.share_kv", o.share_kv,
                "must be true or false (one projection for keys and values)")


def _count(x: object, least: int) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x >= least
