"""Example user components for blocklab, one per kind of axis extension:

- ``model.ffn.name=squared_relu``: an FFN with a closed-form ``param_count``;
- ``model.norm.name=scalenorm``: a norm *without* ``param_count`` (the estimator counts it on
  the meta device);
- ``model.block.name=parallel``: a norm placement with its own parameter layout (it overrides
  ``Block.param_count``).

Importing this module registers them; blocklab's grid tests then cover them like built-ins.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from blocklab.config import ModelConfig, NormConfig
from blocklab.model.blocks import Block, Context
from blocklab.model.estimate import params_of
from blocklab.model.ffn import MLP
from blocklab.registry import lookup, register


@register("ffn", "squared_relu")
class SquaredReLU(MLP):
    """``W2 · relu(W1 · x)²``. "Primer: Searching for Efficient Transformers for Language
    Modeling", arXiv 2109.08668. Same parameters as the MLP it subclasses, so it inherits
    ``param_count``."""

    @staticmethod
    def act(x: Tensor) -> Tensor:
        return torch.relu(x).square()


@register("norm", "scalenorm")
class ScaleNorm(nn.Module):
    """``g · x / ||x||`` with one learned scalar g (initialised to sqrt(d)). "Transformers
    without Tears", arXiv 1910.05895. Deliberately no ``param_count``."""

    def __init__(self, cfg: NormConfig, d_model: int) -> None:
        super().__init__()
        self.eps, self.d_model = cfg.eps, d_model
        self.norm_weight = nn.Parameter(torch.tensor(float(d_model) ** 0.5))

    def init_weights(self) -> None:
        """Runs after the model's default init (which would draw this scalar from N(0, σ))."""
        with torch.no_grad():
            self.norm_weight.fill_(self.d_model ** 0.5)

    def forward(self, x: Tensor) -> Tensor:
        return self.norm_weight * x / x.norm(dim=-1, keepdim=True).clamp(min=self.eps)


@register("block", "parallel")
class Parallel(Block):
    """``x ← x + Σ_f F(N(x))``: every sublayer reads one shared norm of the block input and
    their outputs are summed (GPT-J, PaLM — "PaLM", arXiv 2204.02311), then a final norm."""

    def __init__(self, m: ModelConfig, layer: int, *, cross: bool, causal: bool) -> None:
        super().__init__(m, layer, cross=cross, causal=causal)
        self.norms = nn.ModuleList(self.norms[:1])  # one norm per block, not one per sublayer

    def forward(self, x: Tensor, ctx: Context) -> Tensor:
        h = self.norms[0](x)
        return x + self.drop(sum(f(h) for f in self.sublayers(ctx)))

    @classmethod
    def param_count(cls, m: ModelConfig, layer: int, *, cross: bool, causal: bool) -> int:
        per_sublayer_norms = super().param_count(m, layer, cross=cross, causal=causal)
        norm = params_of(lookup("norm", m.norm.name), m.norm, m.d_model)
        return per_sublayer_norms - ((3 if cross else 2) - 1) * norm
