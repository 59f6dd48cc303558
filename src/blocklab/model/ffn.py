"""Position-wise feed-forward networks. ``d_ff`` is the hidden width (of each branch for the
gated variants, so a gated FFN has 3·d_model·d_ff weights against 2·d_model·d_ff)."""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn

from blocklab.config import FFNConfig


class MLP(nn.Module):
    """``W2 · act(W1 · x)``, the original Transformer FFN (ReLU, arXiv 1706.03762) or GPT/BERT's
    GELU variant ("Gaussian Error Linear Units", arXiv 1606.08415; exact erf form)."""

    def __init__(self, cfg: FFNConfig, d_model: int, d_ff: int, activation: str) -> None:
        super().__init__()
        self.up = nn.Linear(d_model, d_ff, bias=cfg.bias)
        self.down = nn.Linear(d_ff, d_model, bias=cfg.bias)
        self.act = {"gelu": F.gelu, "relu": F.relu}[activation]

    def forward(self, x: Tensor) -> Tensor:
        return self.down(self.act(self.up(x)))


class GatedMLP(nn.Module):
    """``W2 · (act(W_gate · x) ⊙ W_up · x)``: SwiGLU (SiLU gate, Llama) or GeGLU (GELU gate,
    T5 v1.1). "GLU Variants Improve Transformer", arXiv 2002.05202. Gate and up projections
    are one fused matmul."""

    def __init__(self, cfg: FFNConfig, d_model: int, d_ff: int, activation: str) -> None:
        super().__init__()
        self.gate_up = nn.Linear(d_model, 2 * d_ff, bias=cfg.bias)
        self.down = nn.Linear(d_ff, d_model, bias=cfg.bias)
        self.act = {"silu": F.silu, "gelu": F.gelu}[activation]

    def forward(self, x: Tensor) -> Tensor:
        gate, up = self.gate_up(x).chunk(2, dim=-1)
        return self.down(self.act(gate) * up)


def gelu_mlp(cfg: FFNConfig, d_model: int, d_ff: int) -> nn.Module:
    return MLP(cfg, d_model, d_ff, "gelu")


def relu_mlp(cfg: FFNConfig, d_model: int, d_ff: int) -> nn.Module:
    return MLP(cfg, d_model, d_ff, "relu")


def swiglu(cfg: FFNConfig, d_model: int, d_ff: int) -> nn.Module:
    return GatedMLP(cfg, d_model, d_ff, "silu")


def geglu(cfg: FFNConfig, d_model: int, d_ff: int) -> nn.Module:
    return GatedMLP(cfg, d_model, d_ff, "gelu")


FFNS = {
    "gelu_mlp": gelu_mlp,
    "relu_mlp": relu_mlp,
    "swiglu": swiglu,
    "geglu": geglu,
}
