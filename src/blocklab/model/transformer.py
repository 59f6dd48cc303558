"""Stacks of blocks and the three families built from them.

Encoder = bidirectional stack + MLM head; decoder = causal stack + LM head; encoder–decoder =
encoder + causal stack whose blocks add cross-attention, sharing one token embedding. No
component reads the family name: ``FAMILIES`` maps it to a class, and that is all.

One input vocabulary everywhere: ``valid`` (B, T) bool marks real tokens (None = no padding),
``positions`` (B, T) ints (None = derived from ``valid``/``segments``, or continued from the KV
cache), ``segments`` (B, T) ints mark packed documents (None = one document per row). These
describe the sequence a model predicts over; an encoder–decoder's source side takes the same
names with a ``source_`` prefix.

A family component (``FAMILIES``) subclasses :class:`Model` and tells the estimator its shape:
``stacks(m)`` (layers and cross-attention per stack), ``head_param_count(m)`` and
``cached_layers(m)`` (layers with a self-attention KV cache), and config validation whether
it has a bidirectional stack (``has_bidirectional_stack``: a local attention window must then
be odd).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from blocklab.config import ModelConfig, model_config
from blocklab.model import masks
from blocklab.model.attention import KVCache, StaticKVCache
from blocklab.model.blocks import Context, identity
from blocklab.model.heads import LMHead, MLMHead
from blocklab.model.position import positions_from_segments, positions_from_valid
from blocklab.registry import lookup


def default_positions(x: Tensor, valid: Tensor | None, segments: Tensor | None,
                      cache: KVCache | None = None) -> Tensor:
    """Positions when the caller gives none: per document for packed rows, counting real
    tokens only for padded rows, else 0..T-1 — continued from each row's next position when a
    KV cache already holds a prefix."""
    if segments is not None:
        return positions_from_segments(segments)
    b, t = x.shape[:2]
    pos = (positions_from_valid(valid) if valid is not None
           else torch.arange(t, device=x.device).expand(b, t))
    if cache is not None and cache.length:
        pos = pos + cache.next_positions()[:, None]
    return pos


class Stack(nn.Module):
    """Position scheme + ``n_layers`` blocks (+ final norm for pre-norm placements).

    Local (sliding-window) attention, ``model.attention.window``/``global_every``: each block
    knows its window (``Block.window``, None = global); the stack builds the global and the
    local visibility once per forward, as the layers need them (causal window in a causal
    stack, centred window in a bidirectional one; cross-attention is never windowed)."""

    def __init__(self, m: ModelConfig, n_layers: int, *, causal: bool, cross: bool) -> None:
        super().__init__()
        self.causal = causal
        self.window = m.attention.window  # of the local layers (Block.window), None = none
        self.position = lookup("position", m.position.name)(
            m.position, d_model=m.d_model, d_head=m.head_dim, n_heads=m.n_heads,
            max_seq_len=m.max_seq_len, causal=causal)
        block = lookup("block", m.block.name)
        self.blocks = nn.ModuleList(block(m, i, cross=cross) for i in range(n_layers))
        self.windows = [b.window for b in self.blocks]  # per layer, None = global
        self.has_global = None in self.windows
        self.has_local = any(w is not None for w in self.windows)
        norm = lookup("norm", m.norm.name)
        self.final_norm = norm(m.norm, m.d_model) if block.final_norm else nn.Identity()
        self.embed_norm = norm(m.norm, m.d_model) if m.embed_norm else identity
        self.drop = nn.Dropout(m.dropout) if m.dropout else identity

    def forward(self, x: Tensor, *, positions: Tensor, valid: Tensor | None = None,
                segments: Tensor | None = None, cache: KVCache | None = None,
                memory: Tensor | None = None, memory_valid: Tensor | None = None,
                memory_segments: Tensor | None = None) -> Tensor:
        """x: (B, T, d) token embeddings -> (B, T, d) hidden states."""
        x = self.drop(self.embed_norm(self.position.embed(x, positions)))
        t = x.shape[1]
        common = {"causal": self.causal, "q_len": t, "device": x.device}
        global_vis = local_vis = None
        if cache is None:
            bias = self.position.score_bias(positions, positions)
            common.update(k_len=t, key_valid=valid, q_segments=segments, k_segments=segments,
                          bias=bias)
            if self.has_global:
                global_vis = masks.self_visibility(**common)
            if self.has_local:
                local_vis = masks.self_visibility(**common, window=self.window)
        else:
            if segments is not None:
                raise ValueError("segments (packed documents) are a training-time input; a KV "
                                 "cache decodes one document per row")
            if cache.layer_windows != self.windows:
                raise ValueError(f"KV cache built for layer windows {cache.layer_windows}, this "
                                 f"stack has {self.windows}; make it with model.new_cache()")
            keys = cache.begin(positions, valid)
            if keys.positions is not None:
                global_vis = masks.self_visibility(
                    **common, k_len=keys.positions.shape[1], key_valid=keys.valid,
                    bias=self.position.score_bias(positions, keys.positions),
                    q_order=keys.q_order if keys.order is not None else None,
                    k_order=keys.order)
            if keys.local_positions is not None:
                local_vis = masks.self_visibility(
                    **common, k_len=keys.local_positions.shape[1], key_valid=keys.local_valid,
                    bias=self.position.score_bias(positions, keys.local_positions),
                    window=self.window, q_order=keys.q_order, k_order=keys.local_order)
        ctx = Context(
            visibility=global_vis,
            local_visibility=local_vis,
            rotary=self.position.rotary(positions),
            cache=cache,
            memory=memory,
            cross_visibility=masks.cross_visibility(memory_valid, segments, memory_segments),
        )
        for block in self.blocks:
            x = block(x, ctx)
        if cache is not None:
            cache.advance(x.shape[1])
        return self.final_norm(x)


class Model(nn.Module):
    """The base of every family: token embedding, GPT-2 init, the KV cache factory."""

    #: Whether :func:`blocklab.model.generate.generate` can continue a prompt with this family.
    can_generate: bool = True
    #: Whether a stack of this family is bidirectional (config validation: a local attention
    #: window must then be odd, centred on the query).
    has_bidirectional_stack: bool = False

    def __init__(self, m: ModelConfig) -> None:
        super().__init__()
        self.config = m
        self.embed = nn.Embedding(m.vocab_size, m.d_model)
        # token-type ("segment A/B") embeddings, BERT; type 0 when the caller gives none
        self.token_type = nn.Embedding(m.type_vocab_size, m.d_model) if m.type_vocab_size else None

    def embed_tokens(self, ids: Tensor, token_types: Tensor | None = None) -> Tensor:
        """(B, T) ids -> (B, T, d): token embeddings plus token-type embeddings when the model
        has them (``token_types`` (B, T) ints; None = type 0 everywhere)."""
        x = self.embed(ids)
        if self.token_type is not None:
            x = x + (self.token_type(token_types) if token_types is not None
                     else self.token_type.weight[0])
        elif token_types is not None:
            raise TypeError("token_types given, but this model has no token-type embeddings "
                            "(model.type_vocab_size=0)")
        return x

    def init_weights(self) -> None:
        """GPT-2 init: N(0, init_std) for weights, zero biases, unit norms, and residual output
        projections scaled by 1/sqrt(2·layers) ("Language Models are Unsupervised Multitask
        Learners", 2019). A component that needs its own initialization defines
        ``init_weights()``; it runs after this default."""
        m = self.config
        residual_std = m.init_std / math.sqrt(2 * m.n_layers)
        for name, p in self.named_parameters():
            if p.dim() == 1 and "norm" in name and name.endswith("weight"):
                nn.init.ones_(p)
            elif p.dim() == 1:
                nn.init.zeros_(p)
            elif name.endswith(("out.weight", "down.weight")):
                nn.init.normal_(p, std=residual_std)
            else:
                nn.init.normal_(p, std=m.init_std)
        for module in self.modules():
            if module is not self and callable(getattr(module, "init_weights", None)):
                module.init_weights()

    @property
    def max_positions(self) -> int | None:
        """Positions the (decoder) stack can index, ``None`` = any (a learned table has
        ``max_seq_len``); generation checks prompt + new tokens against it before it starts."""
        stack = getattr(self, "decoder", None) or self.encoder
        return stack.position.max_positions

    def new_cache(self, batch: int, capacity: int, *, dtype: torch.dtype | None = None,
                  device: torch.device | str | None = None, static: bool = False) -> KVCache:
        """A preallocated KV cache for this model's (causal) decoder stack: ``capacity``
        tokens for global layers, a ring of ``min(window - 1, capacity)`` slots for local ones;
        ``static=True``: the fixed-shape cache of compiled decoding (``capacity`` slots for
        every layer, :class:`~blocklab.model.attention.StaticKVCache`)."""
        m, ref = self.config, self.embed.weight
        kind = StaticKVCache if static else KVCache
        return kind(len(self.decoder.blocks), batch, m.kv_heads, m.head_dim, capacity,
                    dtype=dtype or ref.dtype, device=device or ref.device,
                    window=m.attention.window, global_every=m.attention.global_every)

    # Shape for the estimator (model/estimate.py): stacks, head, cached layers.
    @classmethod
    def stacks(cls, m: ModelConfig) -> list[tuple[int, bool]]:
        """``(n_layers, cross_attention)`` of every stack, in order."""
        raise NotImplementedError

    @classmethod
    def head_param_count(cls, m: ModelConfig) -> int:
        """Parameters of the output head not shared with the embedding."""
        return LMHead.param_count(m)

    @classmethod
    def cached_layers(cls, m: ModelConfig) -> int:
        """Layers that keep a self-attention KV cache when decoding."""
        return m.n_layers


class DecoderModel(Model):
    """Decoder-only language model (GPT / Llama): causal stack + LM head."""

    def __init__(self, m: ModelConfig) -> None:
        super().__init__(m)
        self.decoder = Stack(m, m.n_layers, causal=True, cross=False)
        self.head = LMHead(m, self.embed)
        self.init_weights()

    def forward(self, input_ids: Tensor, *, valid: Tensor | None = None,
                positions: Tensor | None = None, segments: Tensor | None = None,
                cache: KVCache | None = None, select: Tensor | None = None,
                token_types: Tensor | None = None) -> Tensor:
        """(B, T) token ids -> (B, T, V) next-token logits; with ``select`` (B, T) bool, only
        the (N, V) logits of the selected positions, in row-major order (probes score a few
        answer positions of long sequences without materialising every vocabulary row). With a
        ``cache`` and no ``positions``, positions continue after what the cache holds."""
        if positions is None:
            positions = default_positions(input_ids, valid, segments, cache)
        h = self.decoder(self.embed_tokens(input_ids, token_types), positions=positions,
                         valid=valid, segments=segments, cache=cache)
        return self.head(h if select is None else h[select])

    def prepare(self, *, source_ids: Tensor | None = None,
                source_valid: Tensor | None = None) -> dict[str, Tensor | None]:
        """Per-generation inputs computed once: none for a decoder-only model."""
        if source_ids is not None or source_valid is not None:
            raise TypeError("a decoder-only model takes no source_ids / source_valid; put the "
                            "whole prompt in input_ids")
        return {}

    def decode(self, input_ids: Tensor, *, positions: Tensor, valid: Tensor | None,
               cache: KVCache | None) -> Tensor:
        return self(input_ids, positions=positions, valid=valid, cache=cache)

    @classmethod
    def stacks(cls, m: ModelConfig) -> list[tuple[int, bool]]:
        return [(m.n_layers, False)]


class EncoderModel(Model):
    """Encoder-only model (BERT): bidirectional stack + masked-LM head."""

    can_generate = False
    has_bidirectional_stack = True

    def __init__(self, m: ModelConfig) -> None:
        super().__init__(m)
        self.encoder = Stack(m, m.n_layers, causal=False, cross=False)
        self.head = MLMHead(m, self.embed)
        self.init_weights()

    def forward(self, input_ids: Tensor, *, valid: Tensor | None = None,
                positions: Tensor | None = None, segments: Tensor | None = None,
                select: Tensor | None = None, token_types: Tensor | None = None) -> Tensor:
        """(B, T) token ids (some replaced by a mask token) -> (B, T, V) logits (or the (N, V)
        rows of ``select``, as for the decoder)."""
        if positions is None:
            positions = default_positions(input_ids, valid, segments)
        h = self.encoder(self.embed_tokens(input_ids, token_types), positions=positions,
                         valid=valid, segments=segments)
        return self.head(h if select is None else h[select])

    def new_cache(self, *a: object, **kw: object) -> KVCache:
        raise TypeError("an encoder-only model is bidirectional: it has no KV cache and cannot "
                        "generate left to right; predict masked slots with model(input_ids)")

    @classmethod
    def stacks(cls, m: ModelConfig) -> list[tuple[int, bool]]:
        return [(m.n_layers, False)]

    @classmethod
    def head_param_count(cls, m: ModelConfig) -> int:
        return MLMHead.param_count(m)

    @classmethod
    def cached_layers(cls, m: ModelConfig) -> int:
        return 0


class EncoderDecoderModel(Model):
    """Encoder–decoder (original Transformer, T5): the decoder's blocks add cross-attention over
    the encoder output; one embedding shared by both sides and the LM head."""

    has_bidirectional_stack = True

    def __init__(self, m: ModelConfig) -> None:
        super().__init__(m)
        self.encoder = Stack(m, m.encoder_layers, causal=False, cross=False)
        self.decoder = Stack(m, m.n_layers, causal=True, cross=True)
        self.head = LMHead(m, self.embed)
        self.init_weights()

    def encode(self, source_ids: Tensor, *, source_valid: Tensor | None = None,
               source_positions: Tensor | None = None,
               source_segments: Tensor | None = None) -> Tensor:
        if source_positions is None:
            source_positions = default_positions(source_ids, source_valid, source_segments)
        return self.encoder(self.embed_tokens(source_ids), positions=source_positions,
                            valid=source_valid, segments=source_segments)

    def forward(self, source_ids: Tensor | None, target_ids: Tensor, *,
                source_valid: Tensor | None = None, valid: Tensor | None = None,
                source_positions: Tensor | None = None, positions: Tensor | None = None,
                source_segments: Tensor | None = None, segments: Tensor | None = None,
                cache: KVCache | None = None, memory: Tensor | None = None,
                select: Tensor | None = None) -> Tensor:
        """Teacher-forced: (B, S) source, (B, T) decoder input -> (B, T, V) logits (or the
        (N, V) rows of ``select``). ``valid``/``positions``/``segments`` describe the decoder
        input, ``source_*`` the source. Packed rows pair target segment k with source segment
        k. ``memory`` (an earlier :meth:`encode`) replaces ``source_ids``."""
        if memory is None:
            if source_ids is None:
                raise TypeError("encoder-decoder forward needs source_ids (or memory=)")
            memory = self.encode(source_ids, source_valid=source_valid,
                                 source_positions=source_positions,
                                 source_segments=source_segments)
        if positions is None:
            positions = default_positions(target_ids, valid, segments, cache)
        h = self.decoder(self.embed_tokens(target_ids), positions=positions, valid=valid,
                         segments=segments, cache=cache, memory=memory,
                         memory_valid=source_valid, memory_segments=source_segments)
        return self.head(h if select is None else h[select])

    @property
    def max_source_positions(self) -> int | None:
        return self.encoder.position.max_positions

    def prepare(self, *, source_ids: Tensor | None = None,
                source_valid: Tensor | None = None) -> dict[str, Tensor | None]:
        """Encode the source once per generation."""
        if source_ids is None:
            raise TypeError("an encoder-decoder model generates from source_ids (the decoder "
                            "prompt is the start of the target)")
        return {"memory": self.encode(source_ids, source_valid=source_valid),
                "source_valid": source_valid}

    def decode(self, input_ids: Tensor, *, positions: Tensor, valid: Tensor | None,
               cache: KVCache | None, memory: Tensor, source_valid: Tensor | None) -> Tensor:
        return self(None, input_ids, source_valid=source_valid, valid=valid,
                    positions=positions, cache=cache, memory=memory)

    @classmethod
    def stacks(cls, m: ModelConfig) -> list[tuple[int, bool]]:
        return [(m.encoder_layers, False), (m.n_layers, True)]


FAMILIES: dict[str, type[Model]] = {
    "encoder": EncoderModel,
    "decoder": DecoderModel,
    "encoder_decoder": EncoderDecoderModel,
}


def build_model(cfg: ModelConfig | dict) -> Model:
    """Build the model a (composed) ``cfg.model`` describes; validates it first."""
    m = model_config(cfg)
    return lookup("family", m.family.name)(m)
