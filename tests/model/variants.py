"""The variant grid the model tests run over, at tiny size.

Every family × position scheme (rope once per scaling variant) × head layout is covered in
full; norm kind, placement and FFN rotate through that product so each of their values meets
every family, position and head layout's neighbours many times, and so do the options imported
models need (tanh GELU, embedding norm, token types, unscaled scores, head scale).

Local (sliding-window) attention adds one variant per family × position scheme, not a full
product: the patterns of ``LOCAL`` alternate (window 3 on every layer; window 5 with every
2nd layer global) and the head layout rotates, so every family and position scheme meets a
window shorter than the tests' sequences, in an all-local and in a mixed stack.
"""

from __future__ import annotations

import itertools

from blocklab.config import (
    AttentionConfig,
    BlockConfig,
    FamilyConfig,
    FFNConfig,
    ModelConfig,
    NormConfig,
    PositionConfig,
    RopeScaling,
)
from blocklab.registry import names

VOCAB = 61
POSITIONS = [PositionConfig(name=p) for p in names("position") if p != "rope"] + [
    PositionConfig(name="rope", scaling=s, factor=1.0 if s is RopeScaling.none else 4.0,
                   original_max_seq_len=16)
    for s in RopeScaling
]
ATTENTIONS = {name: (2 if name == "gqa" else None) for name in names("attention")}
STYLES = list(itertools.product(names("norm"), names("block"), names("ffn")))  # 2 * 3 * 4 = 24
# (window, global_every) of the local-attention variants: odd, so encoders take them too
LOCAL = [(3, 0), (5, 2)]


def tiny(family: str = "decoder", position: PositionConfig | None = None,
         attention: str = "mha", style: int = 0, window: int | None = None,
         global_every: int = 0, **sizes: object) -> ModelConfig:
    norm, block, ffn = STYLES[style % len(STYLES)]
    kw = {"vocab_size": VOCAB, "d_model": 32, "n_layers": 2, "n_heads": 4, "d_ff": 40,
          "max_seq_len": 64, **sizes}
    return ModelConfig(
        family=FamilyConfig(name=family, n_encoder_layers=3 if family == "encoder_decoder" else None),
        norm=NormConfig(name=norm, bias=style % 2 == 0),
        block=BlockConfig(name=block),
        position=position or PositionConfig(),
        ffn=FFNConfig(name=ffn, bias=style % 3 != 0,
                      approximate="tanh" if ffn in ("gelu_mlp", "geglu") and style % 2 else "none"),
        attention=AttentionConfig(name=attention, n_kv_heads=ATTENTIONS[attention],
                                  bias=style % 2 == 1, scale=1.0 if style % 6 == 3 else None,
                                  window=window, global_every=global_every),
        tie_embeddings=style % 2 == 0,
        # the options imported models need, rotating through the grid too
        embed_norm=style % 4 == 1, type_vocab_size=2 if style % 5 == 2 else 0,
        head_scale=0.5 if style % 7 == 4 else 1.0,
        **kw,
    )


def _label(family: str, pos: PositionConfig, attention: str, style: int,
           local: tuple[int, int] | None = None) -> str:
    p = pos.name if pos.name != "rope" else f"rope-{pos.scaling.value}"
    norm, block, ffn = STYLES[style % len(STYLES)]
    w = "" if local is None else f"-w{local[0]}" + (f"g{local[1]}" if local[1] else "")
    return f"{family}-{p}-{attention}-{norm}-{block}-{ffn}{w}"


def grid(*families: str) -> list[tuple[str, ModelConfig]]:
    """(id, config) for every family × position × head layout, styles rotating; then one
    local-attention variant per family × position, patterns and head layouts rotating."""
    out = []
    for i, (family, pos, attention) in enumerate(
            itertools.product(families or names("family"), POSITIONS, ATTENTIONS)):
        out.append((_label(family, pos, attention, i), tiny(family, pos, attention, style=i)))
    heads = list(ATTENTIONS)
    for i, (family, pos) in enumerate(itertools.product(families or names("family"), POSITIONS)):
        # the pattern shifts by one per family: each position scheme meets both patterns
        local = LOCAL[(i + i // len(POSITIONS)) % len(LOCAL)]
        attention, style = heads[i % len(heads)], 5 * i + 1
        out.append((_label(family, pos, attention, style, local),
                    tiny(family, pos, attention, style=style, window=local[0],
                         global_every=local[1])))
    return out


def params(*families: str):
    """pytest.mark.parametrize arguments over the grid."""
    import pytest

    return pytest.mark.parametrize("cfg", [c for _, c in grid(*families)],
                                   ids=[i for i, _ in grid(*families)])
