"""QK-norm of softmax attention (``model.mixer.qk_norm`` / ``qk_norm_scope``): a norm of the
"norm" registry (built with ``model.norm``'s eps and bias) on the queries and on the keys,
after their projections and before rotary angles — as Qwen3, OLMo-2 and Gemma 3 do ("Scaling
Vision Transformers to 22 Billion Parameters", arXiv 2302.05442, on the growth of attention
logits it prevents).

Scopes: ``head`` — one norm of width ``d_head`` for q and one for k, shared by every head
(Qwen3's ``q_norm`` / ``k_norm``); ``all`` — one norm over the whole query projection
(``n_heads · d_head``) and one over the keys (``n_kv_heads · d_head``: OLMo-2). The modules are
the layer's ``q_norm`` and ``k_norm`` (the names HF checkpoints use). Every path that builds q
or k for a softmax score calls :func:`queries` / :func:`keys` on token-major ``(..., heads,
D)`` tensors: self-attention (attention.py), its XL memory (memory.py), cross-attention, the
retrieval memory (knn.py) and the compressed memory's reconstruction loss (compress.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn
from torch.func import functional_call

from blocklab.config import ModelConfig, NormConfig
from blocklab.registry import lookup


@dataclass(frozen=True)
class QKNorm:
    """What a layer's QK-norm is: the norm (kind, eps, bias) and its scope."""

    norm: NormConfig
    scope: str = "head"

    def widths(self, n_heads: int, n_kv_heads: int, d_head: int) -> tuple[int, int]:
        """The widths of the q and k norms."""
        if self.scope == "all":
            return n_heads * d_head, n_kv_heads * d_head
        return d_head, d_head


def spec(m: ModelConfig, opts: object) -> QKNorm | None:
    """The QK-norm of softmax options ``opts`` in model ``m`` (None: off)."""
    kind = getattr(opts, "qk_norm", None)
    if kind is None:
        return None
    return QKNorm(NormConfig(name=kind, eps=m.norm.eps, bias=m.norm.bias),
                  getattr(opts, "qk_norm_scope", "head"))


def build(layer: nn.Module, qk: QKNorm | None, *, n_heads: int, n_kv_heads: int,
          d_head: int) -> None:
    """Give ``layer`` its ``q_norm`` and ``k_norm`` (None without QK-norm) and their scope."""
    layer.qk_scope = None if qk is None else qk.scope
    if qk is None:
        layer.q_norm = layer.k_norm = None
        return
    make = lookup("norm", qk.norm.name)
    wq, wk = qk.widths(n_heads, n_kv_heads, d_head)
    layer.q_norm, layer.k_norm = make(qk.norm, wq), make(qk.norm, wk)


def params(qk: QKNorm | None, *, n_heads: int, n_kv_heads: int, d_head: int) -> int:
    """Parameters of the two norms (0 without QK-norm)."""
    if qk is None:
        return 0
    norm = lookup("norm", qk.norm.name)
    return sum(norm.param_count(qk.norm, w) for w in qk.widths(n_heads, n_kv_heads, d_head))


def _apply(layer: nn.Module, norm: nn.Module | None, x: Tensor, *,
           detach: bool = False) -> Tensor:
    """``norm`` over ``x`` (..., heads, D): per head, or over the heads together (scope
    ``all``); ``detach``: its parameters' gradient stopped."""
    if norm is None:
        return x
    flat = x.flatten(-2) if layer.qk_scope == "all" else x
    if detach:
        y = functional_call(norm, {n: p.detach() for n, p in norm.named_parameters()}, (flat,))
    else:
        y = norm(flat)
    return y.view_as(x)


def queries(layer: nn.Module, q: Tensor) -> Tensor:
    """``layer``'s q norm on token-major queries (..., H, D); the identity without one."""
    return _apply(layer, getattr(layer, "q_norm", None), q)


def keys(layer: nn.Module, k: Tensor, *, detach: bool = False) -> Tensor:
    """``layer``'s k norm on token-major keys (..., Hkv, D); the identity without one."""
    return _apply(layer, getattr(layer, "k_norm", None), k, detach=detach)


def fused(layer: nn.Module, qk: Tensor) -> Tensor:
    """``layer``'s QK-norm on fused token-major queries and keys (..., H + Hkv, D), the
    queries first; the input itself without QK-norm."""
    if getattr(layer, "q_norm", None) is None:
        return qk
    q, k = qk.split((layer.n_heads, layer.n_kv_heads), dim=-2)
    return torch.cat((queries(layer, q), keys(layer, k)), -2)
