"""Norm placement: one block class per placement, whose ``forward`` is the equation in its
docstring. Norm *kind* (LayerNorm / RMSNorm) comes from norm.py; the sublayers are the same
for every placement.

A block component (``BLOCKS``) subclasses :class:`Block`, is built as ``Block(m: ModelConfig,
layer, *, cross, causal)`` and called as ``block(x, ctx)``; a placement that adds parameters of
its own overrides :meth:`Block.param_count` (``(m, layer, *, cross, causal)``)."""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor, nn

from blocklab.config import ModelConfig
from blocklab.model.attention import CrossAttention, attention_dims
from blocklab.model.cache import DecodeCache
from blocklab.model.estimate import ask, params_of
from blocklab.model.masks import Visibility
from blocklab.model.mixer import Sequence, mixer_class
from blocklab.model.softmax_options import softmax_options
from blocklab.registry import lookup


@dataclass
class Context:
    """Everything a block needs besides ``x``; built once per stack forward: the facts of the
    sequence its mixer reads (:class:`~blocklab.model.mixer.Sequence`), and for an
    encoder–decoder's decoder the encoder output and its cross-attention visibility."""

    seq: Sequence
    memory: Tensor | None = None  # encoder output (B, S, d), encoder–decoder only
    cross_visibility: Visibility | None = None

    @property
    def cache(self) -> DecodeCache | None:
        return self.seq.cache

    def state(self, layer: int):
        """Layer ``layer``'s decode state (None without a cache)."""
        cache = self.seq.cache
        return None if cache is None else cache.states[layer]

    def cross_state(self, layer: int):
        """Layer ``layer``'s cross-attention state (the source's K/V; None without a
        cache)."""
        cache = self.seq.cache
        return None if cache is None else cache.cross[layer]


def identity(x: Tensor) -> Tensor:
    """What a disabled dropout or norm slot does, without a module call."""
    return x


class Block(nn.Module):
    """Sublayers shared by every placement: the layer's sequence mixer (``attn``: softmax
    attention, or the mixer ``model.mixer`` gives this layer), optional cross-attention, FFN.
    The attribute keeps the name ``attn`` so every checkpoint's parameter names stay valid."""

    #: Whether a stack of these blocks ends with a norm (pre-norm residual streams are unnormed).
    final_norm: bool = True
    #: Norms per sublayer (sandwich norms both input and output).
    norms_per_sublayer: int = 1
    #: The init scheme (model/init.py ``INITS``) a model of these blocks gets when
    #: ``model.init`` is null.
    default_init: str = "gpt2"

    def __init__(self, m: ModelConfig, layer: int, *, cross: bool, causal: bool) -> None:
        super().__init__()
        self.layer = layer
        self.causal = causal  # which stack the block is in (with ``cross``): init asks
        self.attn = mixer_class(m, layer, causal)(m, layer, causal=causal)  # the sequence mixer
        self.cross = CrossAttention(m.attention, softmax_options(m),
                                     **attention_dims(m)) if cross else None
        self.ffn = lookup("ffn", m.ffn.name)(m.ffn, m.d_model, m.d_ff)
        make_norm = lookup("norm", m.norm.name)
        n_sub = 3 if cross else 2
        self.norms = nn.ModuleList(make_norm(m.norm, m.d_model)
                                   for _ in range(n_sub * self.norms_per_sublayer))
        # residual-branch dropout; a plain function when off (a module call per branch and
        # token step is measurable in decoding)
        self.drop = nn.Dropout(m.dropout) if m.dropout else identity

    @classmethod
    def param_count(cls, m: ModelConfig, layer: int, *, cross: bool, causal: bool) -> int:
        """Parameters of block ``layer``, from its components' own counts (each asked once per
        estimate: ``ask``)."""
        attention = ask(mixer_class(m, layer, causal), "param_count", m, layer, causal=causal)
        if cross:
            attention += params_of(CrossAttention, m.attention, **attention_dims(m))
        ffn = params_of(lookup("ffn", m.ffn.name), m.ffn, m.d_model, m.d_ff)
        norm = params_of(lookup("norm", m.norm.name), m.norm, m.d_model)
        return attention + ffn + (3 if cross else 2) * cls.norms_per_sublayer * norm

    def sublayers(self, ctx: Context) -> list:
        """The residual branches in order, each a function of its (normed) input."""
        subs = [lambda h: self.attn(h, ctx.seq, ctx.state(self.layer))]
        if self.cross is not None:
            subs.append(lambda h: self.cross(h, ctx.memory, ctx.cross_visibility,
                                             ctx.cross_state(self.layer)))
        subs.append(self.ffn)
        return subs


class PreNorm(Block):
    """``x ← x + F(N(x))`` per sublayer, then a final norm: stable without warmup.
    "On Layer Normalization in the Transformer Architecture", arXiv 2002.04745."""

    def forward(self, x: Tensor, ctx: Context) -> Tensor:
        for f, norm in zip(self.sublayers(ctx), self.norms):
            x = x + self.drop(f(norm(x)))
        return x


class PostNorm(Block):
    """``x ← N(x + F(x))`` per sublayer, no final norm: the original Transformer
    ("Attention Is All You Need", arXiv 1706.03762) and BERT."""

    final_norm = False

    def forward(self, x: Tensor, ctx: Context) -> Tensor:
        for f, norm in zip(self.sublayers(ctx), self.norms):
            x = norm(x + self.drop(f(x)))
        return x


class Sandwich(Block):
    """``x ← x + N_out(F(N_in(x)))``: pre-norm plus a norm on each branch output, which bounds
    the residual updates. "CogView", arXiv 2105.13290; also Gemma 2."""

    norms_per_sublayer = 2

    def forward(self, x: Tensor, ctx: Context) -> Tensor:
        for i, f in enumerate(self.sublayers(ctx)):
            x = x + self.drop(self.norms[2 * i + 1](f(self.norms[2 * i](x))))
        return x


class Reordered(Block):
    """``x ← x + N(F(x))`` per sublayer, then a final norm: the norm moved from the branch's
    input to its output (OLMo 2, "2 OLMo 2 Furious", arXiv 2501.00656)."""

    def forward(self, x: Tensor, ctx: Context) -> Tensor:
        for f, norm in zip(self.sublayers(ctx), self.norms):
            x = x + self.drop(norm(f(x)))
        return x


def deepnorm_constants(m: ModelConfig, *, cross: bool, causal: bool) -> tuple[float, float]:
    """DeepNorm's ``(α, β)`` for a block of the stack ``(cross, causal)`` ("DeepNet: Scaling
    Transformers to 1,000 Layers", arXiv 2203.00555, Table 1): one stack of N layers
    (decoder- or encoder-only) α = (2N)^¼, β = (8N)^-¼; an encoder of N layers under a
    decoder of M (the stack with cross-attention) α = 0.81 (N⁴M)^(1/16),
    β = 0.87 (N⁴M)^(-1/16), the decoder α = (3M)^¼, β = (12M)^-¼. The depths come from the
    family's stacks, never its name."""
    stacks = lookup("family", m.family.name).stacks(m)
    own = [n for n, c, k in stacks if c == cross and k == causal]
    if not own:
        raise ValueError(f"deepnorm_constants: family {m.family.name!r} has no stack with "
                         f"cross={cross}, causal={causal} (its stacks: {stacks})")
    decoders = [n for n, c, _ in stacks if c]  # a stack that attends to another one's output
    if not decoders:
        n = own[0]
        return (2 * n) ** 0.25, (8 * n) ** -0.25
    big_m, big_n = decoders[0], sum(n for n, c, _ in stacks if not c)
    if cross:
        return (3 * big_m) ** 0.25, (12 * big_m) ** -0.25
    return 0.81 * (big_n ** 4 * big_m) ** (1 / 16), 0.87 * (big_n ** 4 * big_m) ** (-1 / 16)


class DeepNorm(Block):
    """``x ← N(α·x + F(x))`` per sublayer, no final norm: post-norm with the residual
    up-weighted by α and the branches' weights initialised down by β (model/init.py
    ``deepnorm``), both from the depth (:func:`deepnorm_constants`). "DeepNet: Scaling
    Transformers to 1,000 Layers", arXiv 2203.00555."""

    final_norm = False
    default_init = "deepnorm"

    def __init__(self, m: ModelConfig, layer: int, *, cross: bool, causal: bool) -> None:
        super().__init__(m, layer, cross=cross, causal=causal)
        self.alpha, self.beta = deepnorm_constants(m, cross=cross, causal=causal)

    def forward(self, x: Tensor, ctx: Context) -> Tensor:
        for f, norm in zip(self.sublayers(ctx), self.norms):
            x = norm(self.alpha * x + self.drop(f(x)))
        return x


BLOCKS: dict[str, type[Block]] = {
    "pre": PreNorm,
    "post": PostNorm,
    "sandwich": Sandwich,
    "reordered": Reordered,
    "deepnorm": DeepNorm,
}
