"""Example user components for blocklab, one per kind of axis extension:

- ``model.ffn.name=squared_relu``: an FFN with a closed-form ``param_count``;
- ``model.norm.name=scalenorm``: a norm *without* ``param_count`` (the estimator counts it on
  the meta device);
- ``model.block.name=parallel``: a norm placement with its own parameter layout (it overrides
  ``Block.param_count``);
- ``model.mixer.name=token_shift``: a sequence mixer with a decode state of its own (the
  smallest one: the previous real token of each row), its own cost and its own rule;
- ``model.mixer.name=compact_kv`` (``compact_kv.py``): a score-based mixer with a key layout
  of its own (a decode buffer of real tokens only) — its state, its keys for
  ``Sequence.visibility``; nothing in blocklab edited for it;
- ``probes.kinds.first_value``: a probe kind (``first_value.py``): recall the first value of a
  row, with its own settings, rule and cells.

Importing this module registers them; blocklab's grid tests then cover them like built-ins.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from blocklab.config import ModelConfig, NormConfig
from blocklab.config.checks import require
from blocklab.model.blocks import Block, Context
from blocklab.model.estimate import params_of
from blocklab.model.ffn import MLP
from blocklab.model.mixer import Mixer, Sequence, State
from blocklab.registry import lookup, register
from blocklab_example import (
    compact_kv,  # noqa: F401  (registers the compact_kv mixer)
    first_value,  # noqa: F401  (registers the first_value probe kind)
)


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


class ShiftState(State):
    """The decode state of :class:`TokenShift`: each row's last real token (``has``: one was
    seen)."""

    def __init__(self, batch: int, d_model: int, *, dtype: torch.dtype,
                 device: torch.device | str) -> None:
        self.last = torch.zeros(batch, d_model, dtype=dtype, device=device)
        self.has = torch.zeros(batch, 1, dtype=dtype, device=device)


@register("mixer", "token_shift")
class TokenShift(Mixer):
    """``y_t = W_c x_t + W_p x_p``, ``p`` the previous real token of ``t``'s document (zero at
    a document's first token): RWKV's token shift ("RWKV", arXiv 2305.13048) as a whole mixer.
    It shows the seam: padding and packed documents arrive as ``seq.valid`` / ``seq.starts()``
    (no mask), and decoding keeps one vector per row. Causal only."""

    bidirectional = False
    residual_outputs = ("cur", "prev")  # both write into the residual: init scaled by depth

    def __init__(self, m: ModelConfig, layer: int, *, causal: bool) -> None:
        super().__init__(m, layer, causal=causal)
        self.cur = nn.Linear(m.d_model, m.d_model)
        self.prev = nn.Linear(m.d_model, m.d_model, bias=False)

    def forward(self, x: Tensor, seq: Sequence, state: State | None) -> Tensor:
        b, t, _ = x.shape
        real = seq.real()  # (B, T)
        idx = torch.arange(t, device=x.device).expand(b, t)
        last = torch.where(real, idx, -1).cummax(-1).values  # last real token <= t
        before = torch.cat((torch.full_like(last[:, :1], -1), last[:, :-1]), 1)  # < t
        prev = x.gather(1, before.clamp(min=0)[..., None].expand_as(x))  # (B, T, d)
        known = (before >= 0)[..., None].to(x.dtype)
        if state is not None:  # before this forward's first real token: the cached one
            assert isinstance(state, ShiftState)
            prev = prev * known + state.last[:, None] * (1 - known)
            known = known + state.has[:, None] * (1 - known)
            any_real = real.any(-1, keepdim=True).to(x.dtype)  # (B, 1)
            newest = x.gather(1, last[:, -1:].clamp(min=0)[..., None].expand(b, 1, x.shape[-1]))
            state.put("last", state.last * (1 - any_real) + newest[:, 0] * any_real)
            state.put("has", torch.maximum(state.has, any_real))
        starts = seq.starts()
        if starts is not None:  # a document's first token has no predecessor
            known = known * (~starts)[..., None].to(x.dtype)
        return self.cur(x) + self.prev(prev * known)

    def new_state(self, batch: int, capacity: int, *, dtype: torch.dtype,
                  device: torch.device | str, static: bool = False) -> State:
        return ShiftState(batch, self.cur.in_features, dtype=dtype, device=device)

    @classmethod
    def param_count(cls, m: ModelConfig, layer: int, *, causal: bool) -> int:
        return 2 * m.d_model * m.d_model + m.d_model

    @classmethod
    def state_bytes(cls, m: ModelConfig, layer: int, *, batch: int, seq_len: int,
                    bytes_per_value: int) -> int:
        return batch * (m.d_model + 1) * bytes_per_value  # constant in the context length

    @classmethod
    def check(cls, m: ModelConfig, layer: int, *, causal: bool, key: str) -> None:
        require(not m.mixer.options, f"{key}.options", dict(m.mixer.options),
                "token_shift takes no options")
