"""Init schemes: how a model's weights start (``model.init``; null = the block's
``default_init``: DeepNorm's own for ``block=deepnorm``, GPT-2's otherwise).

Every scheme shares the frame :func:`initialize` applies: norm weights 1, biases (every 1-d
parameter but a norm's weight) 0, scalars N(0, ``model.init_std``), token and token-type
embeddings N(0, ``model.embed_init_std``) (null = ``model.init_std``); every other weight is
the scheme's (:meth:`Init.fill`), in the order of ``named_parameters`` so a seed gives the
same weights run after run. A component that needs its own initialization defines
``init_weights()``; it runs after the scheme.

An init component (``INITS``) subclasses :class:`Init`, is built as ``Init(model)`` (it may
look at the whole model first) and fills one weight per call; optional rules
``check(m, key)``."""

from __future__ import annotations

import math

import torch
from torch import nn

from blocklab.config import ModelConfig
from blocklab.model.blocks import Block, deepnorm_constants
from blocklab.model.residual import residual_outputs
from blocklab.registry import lookup


def scheme_name(m: ModelConfig) -> str:
    """The init scheme a model of config ``m`` gets: ``model.init``, else its block's own."""
    return m.init if m.init is not None else lookup("block", m.block.name).default_init


def initialize(model: nn.Module) -> None:
    """Initialize ``model`` (a :class:`~blocklab.model.transformer.Model`) in place with the
    scheme its config names (:func:`scheme_name`)."""
    m = model.config
    scheme = lookup("init", scheme_name(m), "model.init")(model)
    embed_std = m.init_std if m.embed_init_std is None else m.embed_init_std
    embeddings = {id(e.weight) for e in (model.embed, model.token_type) if e is not None}
    for name, p in model.named_parameters():
        if p.dim() == 1 and "norm" in name and name.endswith("weight"):
            nn.init.ones_(p)
        elif p.dim() == 1:
            nn.init.zeros_(p)
        elif p.dim() == 0:  # a scalar (a user's norm gain): no fans, N(0, init_std) always
            nn.init.normal_(p, std=m.init_std)
        elif id(p) in embeddings:
            nn.init.normal_(p, std=embed_std)
        else:
            scheme.fill(name, p)
    for module in model.modules():
        if module is not model and callable(getattr(module, "init_weights", None)):
            module.init_weights()


def fans(p: torch.Tensor) -> tuple[int, int]:
    """``(fan_in, fan_out)`` of a weight, torch's convention: (out, in, *kernel)."""
    receptive = math.prod(p.shape[2:])
    return p.shape[1] * receptive, p.shape[0] * receptive


class Init:
    """An init scheme: built once per model, asked for each weight that is neither a norm's,
    a bias nor an embedding."""

    def __init__(self, model: nn.Module) -> None:
        self.config: ModelConfig = model.config

    def fill(self, name: str, p: nn.Parameter) -> None:
        raise NotImplementedError


class GPT2(Init):
    """N(0, ``init_std``), residual output projections N(0, ``init_std / sqrt(2·layers)``)
    ("Language Models are Unsupervised Multitask Learners", 2019): the weights each component
    names in ``residual_outputs`` (model/residual.py), never guessed from parameter names."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__(model)
        self.residual = residual_outputs(model)
        self.residual_std = self.config.init_std / math.sqrt(2 * self.config.n_layers)

    def fill(self, name: str, p: nn.Parameter) -> None:
        std = self.residual_std if name in self.residual else self.config.init_std
        nn.init.normal_(p, std=std)


class Normal(Init):
    """N(0, ``init_std``) for every weight, no depth scaling."""

    def fill(self, name: str, p: nn.Parameter) -> None:
        nn.init.normal_(p, std=self.config.init_std)


class FanIn(Init):
    """N(0, 1/sqrt(fan_in)) per weight (LeCun normal): unit-variance outputs for unit-variance
    inputs, whatever the width."""

    def fill(self, name: str, p: nn.Parameter) -> None:
        nn.init.normal_(p, std=fans(p)[0] ** -0.5)


def xavier_std(fan_in: int, fan_out: int, gain: float) -> float:
    """Xavier (Glorot) normal's std: ``gain · sqrt(2 / (fan_in + fan_out))``."""
    return gain * math.sqrt(2.0 / (fan_in + fan_out))


class DeepNormInit(Init):
    """DeepNet's init ("DeepNet: Scaling Transformers to 1,000 Layers", arXiv 2203.00555):
    Xavier normal, with gain β (of the block's stack, :func:`~blocklab.model.blocks.
    deepnorm_constants`) on every FFN weight, the output projections (``residual_outputs``)
    and the value rows of an input projection whose module says which they are
    (``value_rows()``: softmax attention's fused ``qkv``, rows ``(h + hkv)·D`` onward;
    cross-attention's ``kv``, rows ``hkv·D`` onward), gain 1 on the rest — query and key rows,
    and every input weight of the mixers that declare no ``value_rows`` (linear attention, SSM,
    gated convolution...: only their residual outputs get β). A fused projection is Xavier
    per part (q, k, v), as if they were separate matrices, as in the paper's code. Weights
    outside the blocks (an untied head, position tables) gain 1."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__(model)
        residual = residual_outputs(model)
        #: parameter name -> [(rows, gain)] of its parts (one part: the whole matrix)
        self.parts: dict[str, list[tuple[int, float]]] = {}
        for prefix, block in model.named_modules():
            if not isinstance(block, Block):
                continue
            _, beta = deepnorm_constants(self.config, cross=block.cross is not None,
                                         causal=block.causal)
            for name, p in block.named_parameters(prefix=prefix):
                if p.dim() >= 2 and (name in residual or name.startswith(f"{prefix}.ffn.")):
                    self.parts[name] = [(p.shape[0], beta)]
            for sub, module in block.named_modules(prefix=prefix):
                value_rows = getattr(module, "value_rows", None)  # a fused projection's parts
                if callable(value_rows):
                    child, sizes = value_rows()
                    self.parts[f"{sub}.{child}.weight"] = [(n, 1.0) for n in sizes[:-1]] + [
                        (sizes[-1], beta)]

    def fill(self, name: str, p: nn.Parameter) -> None:
        fan_in, fan_out = fans(p)
        parts = self.parts.get(name, [(p.shape[0], 1.0)])
        receptive = fan_out // p.shape[0]
        with torch.no_grad():
            for rows, (n, gain) in zip(p.split([n for n, _ in parts]), parts):
                rows.normal_(0.0, xavier_std(fan_in, n * receptive, gain))


INITS: dict[str, type[Init]] = {
    "gpt2": GPT2,
    "normal": Normal,
    "fan_in": FanIn,
    "deepnorm": DeepNormInit,
}
