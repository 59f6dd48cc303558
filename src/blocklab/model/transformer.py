"""Stacks of blocks and the three families built from them.

Encoder = bidirectional stack + MLM head; decoder = causal stack + LM head; encoder–decoder =
encoder + causal stack whose blocks add cross-attention, sharing one token embedding. No
component reads the family name: ``FAMILIES`` maps it to a class, and that is all.

Inputs everywhere: ``valid`` (B, T) bool marks real tokens (None = no padding), ``positions``
(B, T) ints (None = derived from ``valid``/``segments``), ``segments`` (B, T) ints mark packed
documents (None = one document per row).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from blocklab.config import ModelConfig, model_config
from blocklab.model import masks
from blocklab.model.attention import KVCache
from blocklab.model.blocks import BLOCKS, Context
from blocklab.model.heads import LMHead, MLMHead
from blocklab.model.norm import NORMS
from blocklab.model.position import POSITIONS, positions_from_segments, positions_from_valid
from blocklab.registry import lookup


def default_positions(x: Tensor, valid: Tensor | None, segments: Tensor | None) -> Tensor:
    """Positions when the caller gives none: per document for packed rows, counting real
    tokens only for padded rows, else 0..T-1."""
    if segments is not None:
        return positions_from_segments(segments)
    if valid is not None:
        return positions_from_valid(valid)
    b, t = x.shape[:2]
    return torch.arange(t, device=x.device).expand(b, t)


class Stack(nn.Module):
    """Position scheme + ``n_layers`` blocks (+ final norm for pre-norm placements)."""

    def __init__(self, m: ModelConfig, n_layers: int, *, causal: bool, cross: bool) -> None:
        super().__init__()
        self.causal = causal
        self.position = lookup(POSITIONS, m.position.name, "model.position.name")(
            m.position, d_model=m.d_model, d_head=m.head_dim, n_heads=m.n_heads,
            max_seq_len=m.max_seq_len, causal=causal)
        block = lookup(BLOCKS, m.block.name, "model.block.name")
        self.blocks = nn.ModuleList(block(m, i, cross=cross) for i in range(n_layers))
        norm = lookup(NORMS, m.norm.name, "model.norm.name")
        self.final_norm = norm(m.norm, m.d_model) if block.final_norm else nn.Identity()
        self.drop = nn.Dropout(m.dropout) if m.dropout else nn.Identity()

    def forward(self, x: Tensor, *, positions: Tensor, valid: Tensor | None = None,
                segments: Tensor | None = None, cache: KVCache | None = None,
                memory: Tensor | None = None, memory_valid: Tensor | None = None,
                memory_segments: Tensor | None = None) -> Tensor:
        """x: (B, T, d) token embeddings -> (B, T, d) hidden states."""
        x = self.drop(self.position.embed(x, positions))
        k_positions, k_valid = positions, valid
        if cache is not None:
            assert segments is None, "packed segments are a training-time input, not for decoding"
            k_positions, k_valid = cache.begin(positions, valid)
        ctx = Context(
            visibility=masks.self_visibility(
                causal=self.causal, q_len=x.shape[1], k_len=k_positions.shape[1],
                key_valid=k_valid, q_segments=segments, k_segments=segments,
                bias=self.position.score_bias(positions, k_positions), device=x.device),
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


class _Model(nn.Module):
    def __init__(self, m: ModelConfig) -> None:
        super().__init__()
        self.config = m
        self.embed = nn.Embedding(m.vocab_size, m.d_model)

    def init_weights(self) -> None:
        """GPT-2 init: N(0, init_std) for weights, zero biases, unit norms, and residual output
        projections scaled by 1/sqrt(2·layers) ("Language Models are Unsupervised Multitask
        Learners", 2019)."""
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

    def new_cache(self, batch: int, capacity: int, *, dtype: torch.dtype | None = None,
                  device: torch.device | str | None = None) -> KVCache:
        """A preallocated KV cache for this model's (causal) decoder stack."""
        m, ref = self.config, self.embed.weight
        return KVCache(len(self.decoder.blocks), batch, m.kv_heads, m.head_dim, capacity,
                       dtype=dtype or ref.dtype, device=device or ref.device)


class DecoderModel(_Model):
    """Decoder-only language model (GPT / Llama): causal stack + LM head."""

    def __init__(self, m: ModelConfig) -> None:
        super().__init__(m)
        self.decoder = Stack(m, m.n_layers, causal=True, cross=False)
        self.head = LMHead(m, self.embed)
        self.init_weights()

    def forward(self, input_ids: Tensor, *, valid: Tensor | None = None,
                positions: Tensor | None = None, segments: Tensor | None = None,
                cache: KVCache | None = None, select: Tensor | None = None) -> Tensor:
        """(B, T) token ids -> (B, T, V) next-token logits; with ``select`` (B, T) bool, only
        the (N, V) logits of the selected positions, in row-major order (probes score a few
        answer positions of long sequences without materialising every vocabulary row)."""
        if positions is None:
            positions = default_positions(input_ids, valid, segments)
        h = self.decoder(self.embed(input_ids), positions=positions, valid=valid,
                         segments=segments, cache=cache)
        return self.head(h if select is None else h[select])

    def prepare(self, **_: Tensor | None) -> dict[str, Tensor | None]:
        """Per-generation inputs computed once (none for a decoder-only model)."""
        return {}

    def decode(self, input_ids: Tensor, *, positions: Tensor, valid: Tensor | None,
               cache: KVCache | None) -> Tensor:
        return self(input_ids, positions=positions, valid=valid, cache=cache)


class EncoderModel(_Model):
    """Encoder-only model (BERT): bidirectional stack + masked-LM head."""

    def __init__(self, m: ModelConfig) -> None:
        super().__init__(m)
        self.encoder = Stack(m, m.n_layers, causal=False, cross=False)
        self.head = MLMHead(m, self.embed)
        self.init_weights()

    def forward(self, input_ids: Tensor, *, valid: Tensor | None = None,
                positions: Tensor | None = None, segments: Tensor | None = None,
                select: Tensor | None = None) -> Tensor:
        """(B, T) token ids (some replaced by a mask token) -> (B, T, V) logits (or the (N, V)
        rows of ``select``, as for the decoder)."""
        if positions is None:
            positions = default_positions(input_ids, valid, segments)
        h = self.encoder(self.embed(input_ids), positions=positions, valid=valid,
                         segments=segments)
        return self.head(h if select is None else h[select])

    def new_cache(self, *a: object, **kw: object) -> KVCache:
        raise TypeError("an encoder-only model is bidirectional: it has no KV cache")


class EncoderDecoderModel(_Model):
    """Encoder–decoder (original Transformer, T5): the decoder's blocks add cross-attention over
    the encoder output; one embedding shared by both sides and the LM head."""

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
        return self.encoder(self.embed(source_ids), positions=source_positions,
                            valid=source_valid, segments=source_segments)

    def forward(self, source_ids: Tensor, target_ids: Tensor, *,
                source_valid: Tensor | None = None, target_valid: Tensor | None = None,
                source_positions: Tensor | None = None, target_positions: Tensor | None = None,
                source_segments: Tensor | None = None, target_segments: Tensor | None = None,
                cache: KVCache | None = None, memory: Tensor | None = None,
                select: Tensor | None = None) -> Tensor:
        """Teacher-forced: (B, S) source, (B, T) decoder input -> (B, T, V) logits (or the
        (N, V) rows of ``select``). Packed rows pair target segment k with source segment k."""
        if memory is None:
            memory = self.encode(source_ids, source_valid=source_valid,
                                 source_positions=source_positions,
                                 source_segments=source_segments)
        if target_positions is None:
            target_positions = default_positions(target_ids, target_valid, target_segments)
        h = self.decoder(self.embed(target_ids), positions=target_positions, valid=target_valid,
                         segments=target_segments, cache=cache, memory=memory,
                         memory_valid=source_valid, memory_segments=source_segments)
        return self.head(h if select is None else h[select])

    def prepare(self, *, source_ids: Tensor, source_valid: Tensor | None = None,
                **_: Tensor | None) -> dict[str, Tensor | None]:
        """Encode the source once per generation."""
        return {"memory": self.encode(source_ids, source_valid=source_valid),
                "source_valid": source_valid}

    def decode(self, input_ids: Tensor, *, positions: Tensor, valid: Tensor | None,
               cache: KVCache | None, memory: Tensor, source_valid: Tensor | None) -> Tensor:
        return self(None, input_ids, source_valid=source_valid, target_valid=valid,
                    target_positions=positions, cache=cache, memory=memory)


FAMILIES: dict[str, type[_Model]] = {
    "encoder": EncoderModel,
    "decoder": DecoderModel,
    "encoder_decoder": EncoderDecoderModel,
}


def build_model(cfg: ModelConfig | dict) -> _Model:
    """Build the model a (composed) ``cfg.model`` describes; validates it first."""
    m = model_config(cfg)
    return lookup(FAMILIES, m.family.name, "model.family.name")(m)
