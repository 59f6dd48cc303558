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
``stacks(m)`` (layers, cross-attention and causality per stack; the causal stack is the one a
decode cache serves) and ``head_param_count(m)``, and config validation whether it has a bidirectional stack (``has_bidirectional_stack``: a local
attention window must then be odd).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from blocklab.config import ModelConfig, model_config
from blocklab.model import masks
from blocklab.model.blocks import Context, identity
from blocklab.model.cache import DecodeCache
from blocklab.model.carry import carry_positions
from blocklab.model.heads import LMHead, MLMHead
from blocklab.model.init import initialize
from blocklab.model.mixer import Sequence
from blocklab.model.position import positions_from_segments, positions_from_valid
from blocklab.model.residual import residual_outputs  # noqa: F401 (re-exported)
from blocklab.model.rmt import MemoryTokens, rmt_forward
from blocklab.registry import lookup


def default_positions(x: Tensor, valid: Tensor | None, segments: Tensor | None,
                      cache: DecodeCache | None = None) -> Tensor:
    """Positions when the caller gives none: per document for packed rows, counting real
    tokens only for padded rows (padding never advances a position, inside a document
    either), else 0..T-1 — continued from each row's next position when a cache already
    holds a prefix (a carry cache: per document, its first one continued, model/carry.py)."""
    if cache is not None and cache.carry:
        return carry_positions(x, valid, segments, cache)
    if segments is not None:
        return positions_from_segments(segments, valid)
    b, t = x.shape[:2]
    pos = (positions_from_valid(valid) if valid is not None
           else torch.arange(t, device=x.device).expand(b, t))
    if cache is not None and cache.length:
        pos = pos + cache.next_positions()[:, None]
    return pos


class Stack(nn.Module):
    """Position scheme + ``n_layers`` blocks (+ final norm for pre-norm placements).

    Each forward hands every layer's sequence mixer the same facts of the sequence
    (:class:`~blocklab.model.mixer.Sequence`: positions, valid tokens, packed documents,
    causal or not, rotary angles, the decode cache's shared bookkeeping); a score-based mixer
    asks it for its visibility, built once per window and forward."""

    def __init__(self, m: ModelConfig, n_layers: int, *, causal: bool, cross: bool) -> None:
        super().__init__()
        self.causal = causal
        self.position = lookup("position", m.position.name)(
            m.position, d_model=m.d_model, d_head=m.head_dim, n_heads=m.n_heads,
            max_seq_len=m.max_seq_len, causal=causal)
        block = lookup("block", m.block.name)
        self.blocks = nn.ModuleList(block(m, i, cross=cross, causal=causal)
                                    for i in range(n_layers))
        norm = lookup("norm", m.norm.name)
        self.final_norm = norm(m.norm, m.d_model) if block.final_norm else nn.Identity()
        self.embed_norm = norm(m.norm, m.d_model) if m.embed_norm else identity
        self.drop = nn.Dropout(m.dropout) if m.dropout else identity

    @property
    def signature(self) -> tuple:
        """What a decode cache must have been made for: each layer's mixer and window."""
        return tuple((type(b.attn).__name__, getattr(b.attn, "window", None))
                     for b in self.blocks)

    def new_cache(self, batch: int, capacity: int | None, *, dtype: torch.dtype,
                  device: torch.device | str, static: bool = False, carry: bool = False,
                  mem: str = "train") -> DecodeCache:
        if static and carry:
            raise ValueError("new_cache: carry=True writes functionally; static=True in place")
        states = [b.attn.new_carry_state(batch, capacity, dtype=dtype, device=device, mem=mem)
                  if carry and hasattr(b.attn, "new_carry_state") else  # XL memory (memory.py)
                  b.attn.new_state(batch, capacity, dtype=dtype, device=device, static=static)
                  for b in self.blocks]
        cross = [None if b.cross is None else b.cross.new_state() for b in self.blocks]
        return DecodeCache(states, batch=batch, capacity=capacity, device=device,
                           static=static, signature=self.signature, cross=cross, carry=carry,
                           mem=mem)

    def forward(self, x: Tensor, *, positions: Tensor, valid: Tensor | None = None,
                segments: Tensor | None = None, cache: DecodeCache | None = None,
                memory: Tensor | None = None, memory_valid: Tensor | None = None,
                memory_segments: Tensor | None = None, marked: Tensor | None = None) -> Tensor:
        """x: (B, T, d) token embeddings -> (B, T, d) hidden states; ``marked`` (B, T) bool:
        the tokens of ``model.mixer.global_token_id`` (:meth:`Model.marks`)."""
        x = self.drop(self.embed_norm(self.position.embed(x, positions)))
        if cache is not None:
            if segments is not None and not cache.carry:
                raise ValueError("segments (packed documents) are a training-time input; a KV "
                                 "cache decodes one document per row")
            if cache.signature != self.signature:
                raise ValueError(f"decode cache built for layers {cache.signature}, this "
                                 f"stack has {self.signature}; make it with model.new_cache()")
            cache.begin(positions, valid, segments if cache.carry else None)
        seq = Sequence(positions=positions, valid=valid, segments=segments, causal=self.causal,
                       position=self.position, rotary=self.position.rotary(positions),
                       cache=cache, marked=marked, carried=cache is not None and cache.carry)
        ctx = Context(seq=seq, memory=memory, cross_visibility=masks.cross_visibility(
            memory_valid, segments, memory_segments) if memory is not None else None)
        for block in self.blocks:
            x = block(x, ctx)
        if cache is not None:
            cache.advance(x.shape[1])
        return self.final_norm(x)


class Model(nn.Module):
    """The base of every family: token embedding, init (model/init.py), the KV cache factory."""

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
        #: softmax's global_token_id: tokens with this id are global (Longformer's marked ones)
        self.global_token_id = m.mixer.get("global_token_id")

    def marks(self, ids: Tensor) -> Tensor | None:
        """(B, T) bool: the tokens marked global by id (None without ``global_token_id``),
        computed once per forward for every softmax layer of the stack."""
        return None if self.global_token_id is None else ids == self.global_token_id

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
        """The init scheme ``model.init`` names (model/init.py; null = the block's own, GPT-2's
        for every block but DeepNorm): norms 1, biases 0, embeddings N(0, embed_init_std), the
        scheme's weights; a component that needs its own initialization defines
        ``init_weights()``, which runs after the scheme."""
        initialize(self)

    @property
    def max_positions(self) -> int | None:
        """Positions the (decoder) stack can index, ``None`` = any (a learned table has
        ``max_seq_len``); generation checks prompt + new tokens against it before it starts."""
        stack = getattr(self, "decoder", None) or self.encoder
        return stack.position.max_positions

    def new_cache(self, batch: int, capacity: int | None, *, dtype: torch.dtype | None = None,
                  device: torch.device | str | None = None, static: bool = False,
                  carry: bool = False, mem: str = "train") -> DecodeCache:
        """A decode cache for this model's (causal) decoder stack, up to ``capacity`` tokens:
        one state per layer, made by its mixer (softmax: a K/V buffer, a window ring for
        local layers; recurrent mixers: their fixed-size state), plus the shared token
        bookkeeping (model/cache.py). ``static=True``: fixed shapes and in-place updates for
        compiled decoding. ``carry=True``: the state carried across training segments with
        autograd on (model/carry.py; ``capacity`` None unless a layer keeps every token;
        ``mem``: "train" or "eval" memory sizes)."""
        ref, rmt = self.embed.weight, getattr(self, "memory", None)
        if carry and rmt is not None:  # RMT: the memory, no layer state (model/rmt.py)
            return rmt.new_cache(self.decoder, batch, device=device or ref.device, mem=mem)
        if rmt is not None and capacity is not None:  # decoding holds the read memory too
            capacity += rmt.n
        return self.decoder.new_cache(batch, capacity, dtype=dtype or ref.dtype,
                                      device=device or ref.device, static=static, carry=carry,
                                      mem=mem)

    # Shape for the estimator (model/estimate.py): stacks and head.
    @classmethod
    def stacks(cls, m: ModelConfig) -> list[tuple[int, bool, bool]]:
        """``(n_layers, cross_attention, causal)`` of every stack, in order."""
        raise NotImplementedError

    @classmethod
    def head_param_count(cls, m: ModelConfig) -> int:
        """Parameters of the output head not shared with the embedding."""
        return LMHead.param_count(m)


class DecoderModel(Model):
    """Decoder-only language model (GPT / Llama): causal stack + LM head."""

    def __init__(self, m: ModelConfig) -> None:
        super().__init__(m)
        self.decoder = Stack(m, m.n_layers, causal=True, cross=False)
        self.head = LMHead(m, self.embed)
        #: RMT's memory tokens (model/rmt.py), None without ``model.memory_tokens``
        self.memory = MemoryTokens(m.memory_tokens, m.d_model) if m.memory_tokens else None
        self.init_weights()

    def forward(self, input_ids: Tensor, *, valid: Tensor | None = None,
                positions: Tensor | None = None, segments: Tensor | None = None,
                cache: DecodeCache | None = None, select: Tensor | None = None,
                token_types: Tensor | None = None) -> Tensor:
        """(B, T) token ids -> (B, T, V) next-token logits; with ``select`` (B, T) bool, only
        the (N, V) logits of the selected positions, in row-major order (probes score a few
        answer positions of long sequences without materialising every vocabulary row). With a
        ``cache`` and no ``positions``, positions continue after what the cache holds."""
        if self.memory is not None:  # RMT: the segment between memory tokens
            h = rmt_forward(self, input_ids, valid=valid, positions=positions,
                            segments=segments, cache=cache, token_types=token_types)
            return self.head(h if select is None else h[select])
        if positions is None:
            positions = default_positions(input_ids, valid, segments, cache)
        h = self.decoder(self.embed_tokens(input_ids, token_types), positions=positions,
                         valid=valid, segments=segments, cache=cache,
                         marked=self.marks(input_ids))
        return self.head(h if select is None else h[select])

    def prepare(self, *, source_ids: Tensor | None = None,
                source_valid: Tensor | None = None) -> dict[str, Tensor | None]:
        """Per-generation inputs computed once: none for a decoder-only model."""
        if source_ids is not None or source_valid is not None:
            raise TypeError("a decoder-only model takes no source_ids / source_valid; put the "
                            "whole prompt in input_ids")
        return {}

    def decode(self, input_ids: Tensor, *, positions: Tensor, valid: Tensor | None,
               cache: DecodeCache | None) -> Tensor:
        return self(input_ids, positions=positions, valid=valid, cache=cache)

    @classmethod
    def stacks(cls, m: ModelConfig) -> list[tuple[int, bool, bool]]:
        return [(m.n_layers, False, True)]


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
                         valid=valid, segments=segments, marked=self.marks(input_ids))
        return self.head(h if select is None else h[select])

    def new_cache(self, *a: object, **kw: object) -> DecodeCache:
        raise TypeError("an encoder-only model is bidirectional: it has no KV cache and cannot "
                        "generate left to right; predict masked slots with model(input_ids)")

    @classmethod
    def stacks(cls, m: ModelConfig) -> list[tuple[int, bool, bool]]:
        return [(m.n_layers, False, False)]

    @classmethod
    def head_param_count(cls, m: ModelConfig) -> int:
        return MLMHead.param_count(m)


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
                            valid=source_valid, segments=source_segments,
                            marked=self.marks(source_ids))

    def forward(self, source_ids: Tensor | None, target_ids: Tensor, *,
                source_valid: Tensor | None = None, valid: Tensor | None = None,
                source_positions: Tensor | None = None, positions: Tensor | None = None,
                source_segments: Tensor | None = None, segments: Tensor | None = None,
                cache: DecodeCache | None = None, memory: Tensor | None = None,
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
                         memory_valid=source_valid, memory_segments=source_segments,
                         marked=self.marks(target_ids))
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
               cache: DecodeCache | None, memory: Tensor, source_valid: Tensor | None) -> Tensor:
        return self(None, input_ids, source_valid=source_valid, valid=valid,
                    positions=positions, cache=cache, memory=memory)

    @classmethod
    def stacks(cls, m: ModelConfig) -> list[tuple[int, bool, bool]]:
        return [(m.encoder_layers, False, False), (m.n_layers, True, True)]


FAMILIES: dict[str, type[Model]] = {
    "encoder": EncoderModel,
    "decoder": DecoderModel,
    "encoder_decoder": EncoderDecoderModel,
}


def build_model(cfg: ModelConfig | dict) -> Model:
    """Build the model a (composed) ``cfg.model`` describes; validates it first."""
    m = model_config(cfg)
    return lookup("family", m.family.name)(m)
