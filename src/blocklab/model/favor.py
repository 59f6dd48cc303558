"""FAVOR+: positive orthogonal random features of the softmax kernel, the ``favor`` feature map
of the ``linear`` mixer (``model.mixer.feature_map=favor``; "Rethinking Attention with
Performers", Choromanski et al., arXiv 2009.14794).

With ``m`` random vectors ``w_r ~ N(0, I_E)`` (the rows of the projection ``W``, m × E) and
``x' = x / E^¼``,

    φ(x)_r = exp(w_r·x' - |x'|²/2 - c) / √m,   E_w[φ(q)·φ(k)] = exp(q·k / √E) · exp(-2c)

(the paper's Lemma 1, positive features), so ``φ(q)·φ(k)`` is an unbiased estimate of softmax's
``exp(q·k/√E)`` up to the stabilisers ``c``, which cancel in the normalised output
``φ(q)ᵀS / φ(q)ᵀz`` exactly as long as each is one number per *query*, or one number for
*all* keys. The stabilisers (the paper's numerical stabilisation; performer-pytorch's
``softmax_kernel``):

- queries: ``c = max_r w_r·x'`` of the query itself (per token, detached): the largest query
  feature is ``exp(-|x'|²/2)/√m <= 1/√m``; it multiplies the query's numerator and its
  normaliser alike, so it cancels;
- keys: a *constant* ``c = max(0, max_r |w_r|²/2 - 60)``, from ``W`` alone. performer-pytorch
  subtracts the maximum over every key of the sequence (and batch and heads) instead: then a
  future token, a padding token or another packed document changes every output — it breaks
  causality, padding and packing invariance. A per-key maximum would not (it is the key's own),
  but it reweights key ``j`` by ``exp(-c_j)`` relative to the others: a biased estimate. A
  constant does neither, and it suffices: ``w·x' - |x'|²/2 <= |w|²/2`` for every ``x'``, so the
  key exponent is at most 60 (``exp(60) ≈ 1e26``, far from fp32's overflow) whatever the key;
  for ``E <= 64`` (``|w|² ≈ E``) the constant is 0.

``W`` is drawn block-orthogonal (``orthogonal=True``, the paper's ORF): each E × E block the
Q of a Gaussian matrix's QR decomposition, rows rescaled by the norms of independent Gaussian
vectors (chi-distributed, so each row is marginally N(0, I) — performer-pytorch's
``gaussian_orthogonal_random_matrix`` with ``scaling=0``); else i.i.d. Gaussian. A draw is a
function of ``(feature_seed, layer, draw)`` alone (:func:`draw_projection`), so a redraw is
deterministic and a checkpoint (which saves ``W`` and the forward counter) resumes exactly.
"""

from __future__ import annotations

import hashlib
import math

import torch
from torch import Tensor, nn

from blocklab.config.checks import require

#: The key-side exponent's ceiling (see the module docstring): ``exp(60)`` stays far from fp32's
#: overflow after a sum over tokens.
KEY_CEILING = 60.0


def draw_projection(n_features: int, width: int, *, orthogonal: bool, seed: int, layer: int,
                    draw: int) -> Tensor:
    """``W`` (m, E) fp32 on the CPU, a function of ``(seed, layer, draw)`` alone."""
    key = hashlib.sha256(f"favor:{seed}:{layer}:{draw}".encode()).digest()
    g = torch.Generator().manual_seed(int.from_bytes(key[:7], "little"))
    if not orthogonal:
        return torch.randn(n_features, width, generator=g)
    blocks = []
    for _ in range(math.ceil(n_features / width)):
        q, _ = torch.linalg.qr(torch.randn(width, width, generator=g))
        blocks.append(q.T)  # orthonormal rows
    rows = torch.cat(blocks)[:n_features]
    norms = torch.randn(n_features, width, generator=g).norm(dim=1)  # chi(E)-distributed
    return norms[:, None] * rows


def _exponent(x: Tensor, projection: Tensor) -> Tensor:
    """``w_r·x' - |x'|²/2``, ``x' = x / E^¼``: (..., E) -> (..., m), fp32."""
    x = x.float() * x.shape[-1] ** -0.25
    return x @ projection.t() - (x * x).sum(-1, keepdim=True) / 2


def query_features(x: Tensor, projection: Tensor) -> Tensor:
    """φ of queries, stabilised by the query's own maximum: (..., E) -> (..., m)."""
    a = _exponent(x, projection)
    return torch.exp(a - a.amax(-1, keepdim=True).detach()) / math.sqrt(projection.shape[0])


def key_features(x: Tensor, projection: Tensor) -> Tensor:
    """φ of keys, stabilised by a constant of ``W`` alone: (..., E) -> (..., m)."""
    ceiling = (projection.square().sum(-1).amax() / 2 - KEY_CEILING).clamp(min=0)
    return torch.exp(_exponent(x, projection) - ceiling) / math.sqrt(projection.shape[0])


class Favor(nn.Module):
    """One layer's FAVOR+ features: ``W`` (m, E) and the training forwards counted, buffers
    (saved in checkpoints: a resumed run continues with the same ``W`` and redraws at the same
    forwards). ``redraw_every = n > 0``: every n-th training forward draws ``W`` anew (draw
    ``forwards // n``), before that forward — a training *forward* (micro-batch) as
    performer-pytorch counts them, which is a step without gradient accumulation."""

    def __init__(self, n_features: int, width: int, *, orthogonal: bool, redraw_every: int,
                 seed: int, layer: int) -> None:
        super().__init__()
        self.n_features, self.width, self.orthogonal = n_features, width, orthogonal
        self.redraw_every, self.seed, self.layer = redraw_every, seed, layer
        self.register_buffer("projection", self.draw(0))
        self.register_buffer("forwards", torch.zeros((), dtype=torch.long))

    def draw(self, index: int) -> Tensor:
        return draw_projection(self.n_features, self.width, orthogonal=self.orthogonal,
                               seed=self.seed, layer=self.layer, draw=index)

    def init_weights(self) -> None:
        """The first draw again (the model's init runs after construction)."""
        self.projection.copy_(self.draw(0))
        self.forwards.zero_()

    def queries(self, x: Tensor) -> Tensor:
        return query_features(x, self.projection)

    def keys(self, x: Tensor) -> Tensor:
        return key_features(x, self.projection)

    def kernel(self, q: Tensor, k: Tensor) -> Tensor:
        """``φ(q)·φ(k)``: (..., Tq, E), (..., Tk, E) -> (..., Tq, Tk)."""
        return self.queries(q) @ self.keys(k).transpose(-1, -2)

    @torch.compiler.disable
    def count_forward(self) -> None:
        """A training forward; every ``redraw_every``-th redraws ``W``. Not counted inside a
        backward (activation checkpointing's recompute must see the same ``W``). Eager: a
        compiled forward breaks its graph here, only where redraws are on."""
        if torch._C._current_graph_task_id() != -1:
            return
        self.forwards += 1
        n = int(self.forwards)
        if n % self.redraw_every == 0:
            self.projection.copy_(self.draw(n // self.redraw_every))


def check(o: object, key: str) -> None:
    """The favor options' rules (``o``: the linear mixer's options), one line each."""
    def count(x: object, least: int) -> bool:
        return isinstance(x, int) and not isinstance(x, bool) and x >= least

    require(count(o.n_features, 1), f"{key}.n_features", o.n_features,
            "must be an integer >= 1 (favor: random features per head)")
    require(isinstance(o.orthogonal, bool), f"{key}.orthogonal", o.orthogonal,
            "must be true or false (favor: block-orthogonal draws)")
    require(count(o.redraw_every, 0), f"{key}.redraw_every", o.redraw_every,
            "must be an integer >= 0 (favor: training forwards between redraws; 0 = never)")
    require(count(o.feature_seed, 0), f"{key}.feature_seed", o.feature_seed,
            "must be an integer >= 0 (favor: the random features' seed)")
