"""Normalization kinds. Placement (pre / post / sandwich) is a separate axis: see blocks.py.

A norm component is built as ``Norm(cfg: NormConfig, d_model)``; ``param_count(cfg, d_model)``
gives its size in closed form.
"""

from __future__ import annotations

from torch import nn

from blocklab.config import NormConfig


class LayerNorm(nn.LayerNorm):
    """Centre and scale. "Layer Normalization", arXiv 1607.06450."""

    def __init__(self, cfg: NormConfig, d_model: int) -> None:
        super().__init__(d_model, eps=cfg.eps, bias=cfg.bias)

    @staticmethod
    def param_count(cfg: NormConfig, d_model: int) -> int:
        return 2 * d_model if cfg.bias else d_model


class RMSNorm(nn.RMSNorm):
    """Scale only, no centring and no bias; cheaper, used by T5 and Llama.
    "Root Mean Square Layer Normalization", arXiv 1910.07467."""

    def __init__(self, cfg: NormConfig, d_model: int) -> None:
        super().__init__(d_model, eps=cfg.eps)

    @staticmethod
    def param_count(cfg: NormConfig, d_model: int) -> int:
        return d_model


NORMS = {
    "layernorm": LayerNorm,
    "rmsnorm": RMSNorm,
}
