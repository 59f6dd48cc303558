"""The variant grid the model tests run over, at tiny size.

Every family × position scheme (rope once per scaling variant) × head layout is covered in
full; norm kind, placement and FFN rotate through that product so each of their values meets
every family, position and head layout's neighbours many times.
"""

from __future__ import annotations

import itertools

from blocklab.config import (
    AttentionConfig,
    AttentionName,
    BlockConfig,
    BlockName,
    FamilyConfig,
    FamilyName,
    FFNConfig,
    FFNName,
    ModelConfig,
    NormConfig,
    NormName,
    PositionConfig,
    PositionName,
    RopeScaling,
)

VOCAB = 61
POSITIONS = [PositionConfig(name=p) for p in PositionName if p is not PositionName.rope] + [
    PositionConfig(name=PositionName.rope, scaling=s, factor=1.0 if s is RopeScaling.none else 4.0,
                   original_max_seq_len=16)
    for s in RopeScaling
]
ATTENTIONS = {"mha": None, "gqa": 2, "mqa": None}
STYLES = list(itertools.product(NormName, BlockName, FFNName))  # 2 * 3 * 4 = 24


def tiny(family: FamilyName = FamilyName.decoder, position: PositionConfig | None = None,
         attention: str = "mha", style: int = 0, **sizes: object) -> ModelConfig:
    norm, block, ffn = STYLES[style % len(STYLES)]
    kw = {"vocab_size": VOCAB, "d_model": 32, "n_layers": 2, "n_heads": 4, "d_ff": 40,
          "max_seq_len": 64, **sizes}
    return ModelConfig(
        family=FamilyConfig(name=family, n_encoder_layers=3 if family is FamilyName.encoder_decoder else None),
        norm=NormConfig(name=norm, bias=style % 2 == 0),
        block=BlockConfig(name=block),
        position=position or PositionConfig(),
        ffn=FFNConfig(name=ffn, bias=style % 3 != 0),
        attention=AttentionConfig(name=AttentionName(attention), n_kv_heads=ATTENTIONS[attention],
                                  bias=style % 2 == 1),
        tie_embeddings=style % 2 == 0,
        **kw,
    )


def _label(family: FamilyName, pos: PositionConfig, attention: str, style: int) -> str:
    p = pos.name.value if pos.name is not PositionName.rope else f"rope-{pos.scaling.value}"
    norm, block, ffn = STYLES[style % len(STYLES)]
    return f"{family.value}-{p}-{attention}-{norm.value}-{block.value}-{ffn.value}"


def grid(*families: FamilyName) -> list[tuple[str, ModelConfig]]:
    """(id, config) for every family × position × head layout, styles rotating."""
    out = []
    for i, (family, pos, attention) in enumerate(
            itertools.product(families or list(FamilyName), POSITIONS, ATTENTIONS)):
        out.append((_label(family, pos, attention, i), tiny(family, pos, attention, style=i)))
    return out


def params(*families: FamilyName):
    """pytest.mark.parametrize arguments over the grid."""
    import pytest

    return pytest.mark.parametrize("cfg", [c for _, c in grid(*families)],
                                   ids=[i for i, _ in grid(*families)])
