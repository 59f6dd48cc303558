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

    def __init__(self, m: ModelConfig, layer: int, *, cross: bool, causal: bool) -> None:
        super().__init__()
        self.layer = layer
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


BLOCKS: dict[str, type[Block]] = {
    "pre": PreNorm,
    "post": PostNorm,
    "sandwich": Sandwich,
}
