"""Position-wise feed-forward networks. ``d_ff`` is the hidden width (of each branch for the
gated variants, so a gated FFN has 3·d_model·d_ff weights against 2·d_model·d_ff).

An FFN component is built as ``FFN(cfg: FFNConfig, d_model, d_ff)`` and maps (B, T, d) to
(B, T, d); ``param_count(cfg, d_model, d_ff)`` gives its size in closed form (the estimator
asks it; see docs/extending.md), and ``uses_gelu_form()`` whether ``ffn.approximate`` applies
(the validator asks it).
"""

from __future__ import annotations

import functools

import torch.nn.functional as F
from torch import Tensor, nn

from blocklab.config import FFNConfig


def gelu(approximate: str):
    """GELU in the form ``approximate`` names: "none" (exact erf, BERT) or "tanh" (GPT-2's
    gelu_new, T5 v1.1). "Gaussian Error Linear Units", arXiv 1606.08415."""
    return functools.partial(F.gelu, approximate=approximate)


class MLP(nn.Module):
    """``W2 · act(W1 · x)``: the original Transformer FFN (ReLU, arXiv 1706.03762) or GPT/BERT's
    GELU variant (``ffn.approximate``: exact erf or tanh form)."""

    act = staticmethod(F.gelu)
    residual_outputs = ("down",)  # the projection into the residual: init scaled by depth

    def __init__(self, cfg: FFNConfig, d_model: int, d_ff: int) -> None:
        super().__init__()
        if self.uses_gelu_form():
            self.act = gelu(cfg.approximate)
        self.up = nn.Linear(d_model, d_ff, bias=cfg.bias)
        self.down = nn.Linear(d_ff, d_model, bias=cfg.bias)

    def forward(self, x: Tensor) -> Tensor:
        return self.down(self.act(self.up(x)))

    @classmethod
    def uses_gelu_form(cls) -> bool:
        """Whether ``ffn.approximate`` applies (the activation is a GELU): the validator asks
        it, and refuses a GELU form the FFN would silently ignore."""
        return cls.act is F.gelu

    @staticmethod
    def param_count(cfg: FFNConfig, d_model: int, d_ff: int) -> int:
        return 2 * d_model * d_ff + (d_ff + d_model if cfg.bias else 0)


class GeluMLP(MLP):
    act = staticmethod(F.gelu)


class ReluMLP(MLP):
    act = staticmethod(F.relu)


class GatedMLP(nn.Module):
    """``W2 · (act(W_gate · x) ⊙ W_up · x)``: SwiGLU (SiLU gate, Llama) or GeGLU (GELU gate,
    T5 v1.1). "GLU Variants Improve Transformer", arXiv 2002.05202. Gate and up projections
    are one fused matmul."""

    act = staticmethod(F.silu)
    residual_outputs = ("down",)

    def __init__(self, cfg: FFNConfig, d_model: int, d_ff: int) -> None:
        super().__init__()
        if self.uses_gelu_form():
            self.act = gelu(cfg.approximate)
        self.gate_up = nn.Linear(d_model, 2 * d_ff, bias=cfg.bias)
        self.down = nn.Linear(d_ff, d_model, bias=cfg.bias)

    def forward(self, x: Tensor) -> Tensor:
        gate, up = self.gate_up(x).chunk(2, dim=-1)
        return self.down(self.act(gate) * up)

    @classmethod
    def uses_gelu_form(cls) -> bool:
        """Whether ``ffn.approximate`` applies (the activation is a GELU): the validator asks
        it, and refuses a GELU form the FFN would silently ignore."""
        return cls.act is F.gelu

    @staticmethod
    def param_count(cfg: FFNConfig, d_model: int, d_ff: int) -> int:
        return 3 * d_model * d_ff + (2 * d_ff + d_model if cfg.bias else 0)


class SwiGLU(GatedMLP):
    act = staticmethod(F.silu)


class GeGLU(GatedMLP):
    act = staticmethod(F.gelu)


FFNS = {
    "gelu_mlp": GeluMLP,
    "relu_mlp": ReluMLP,
    "swiglu": SwiGLU,
    "geglu": GeGLU,
}
