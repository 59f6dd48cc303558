"""Normalization kinds. Placement (pre / post / sandwich) is a separate axis: see blocks.py."""

from __future__ import annotations

from torch import nn

from blocklab.config import NormConfig


def layernorm(cfg: NormConfig, d_model: int) -> nn.Module:
    """LayerNorm: centre and scale. "Layer Normalization", arXiv 1607.06450."""
    return nn.LayerNorm(d_model, eps=cfg.eps, bias=cfg.bias)


def rmsnorm(cfg: NormConfig, d_model: int) -> nn.Module:
    """RMSNorm: scale only, no centring and no bias; cheaper, used by T5 and Llama.
    "Root Mean Square Layer Normalization", arXiv 1910.07467."""
    return nn.RMSNorm(d_model, eps=cfg.eps)


NORMS = {
    "layernorm": layernorm,
    "rmsnorm": rmsnorm,
}
