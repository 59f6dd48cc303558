"""The variant grid the model tests run over, at tiny size.

Every family × position scheme (rope once per scaling variant) × head layout is covered in
full; norm kind, placement and FFN rotate through that product so each of their values meets
every family, position and head layout's neighbours many times, and so do the options imported
models need (tanh GELU, embedding norm, token types, unscaled scores, head scale).

Local (sliding-window) attention adds one variant per family × position scheme, not a full
product: the patterns of ``LOCAL`` alternate (window 3 on every layer; window 5 with every
2nd layer global) and the head layout rotates, so every family and position scheme meets a
window shorter than the tests' sequences, in an all-local and in a mixed stack.

Attention patterns (``PATTERNS``: sinks, a learned sink, chunks with no-rotary global layers)
add one variant per pattern × family.

Stability knobs (``STABILITY``: QK-norm of each kind × scope, attention softcaps, the
final-logit softcap) add one variant per option set × family.

Sequence mixers other than softmax (every registered one, the example plugin's included) add
one variant per family that allows them × option set (``MIXER_OPTIONS``: each mixer's own
options, rotating), with the position schemes that need no score-based layer rotating; hybrid
stacks (``HYBRIDS``: a mixer pattern per layer) add one variant per family that allows every
mixer of the pattern, with rotary or ALiBi positions (their softmax layers use them).
"""

from __future__ import annotations

import itertools

from blocklab.config import (
    AttentionConfig,
    BlockConfig,
    FamilyConfig,
    FFNConfig,
    MixerConfig,
    ModelConfig,
    NormConfig,
    PositionConfig,
    RopeScaling,
)
from blocklab.model.softmax_options import SoftmaxOptions
from blocklab.registry import lookup, names

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
# softmax's attention patterns (docs/mixers.md "Attention patterns"), one variant per family ×
# pattern: sinks beside a window (shorter than the tests' sequences, sinks before the band), a
# learned sink, chunks (all chunked; chunked + no-rotary global layers with temperature),
# global tokens beside a window, BigBird's random blocks beside a window and a sink, tokens
# marked global by id (3: frequent in the tests' random ids)
PATTERNS: list[dict[str, object]] = [
    {"window": 3, "sinks": 2},
    {"window": 5, "global_every": 2, "sinks": 1, "learned_sink": True},
    {"attention_chunk": 4},
    {"attention_chunk": 3, "global_every": 2, "sinks": 1, "global_rope": False,
     "global_temperature": 0.5, "temperature_floor": 4},
    {"window": 3, "global_tokens": 1, "learned_sink": True},
    {"window": 3, "random_blocks": 1, "block_size": 2, "sinks": 1},
    {"window": 3, "global_token_id": 3},
]

# stability knobs (docs/mixers.md "Stability knobs"), one variant per option set × family:
# QK-norm of each norm kind × scope, attention softcaps small enough to bend the scores QK-norm
# makes O(1) (one on a local stack: its blocked path; one beside a learned sink), and the
# final-logit softcap (``logit_softcap``: model.logit_softcap, the rest model.mixer options)
STABILITY: list[dict[str, object]] = [
    {"qk_norm": "layernorm", "qk_norm_scope": "head", "softcap": 0.5},
    {"qk_norm": "rmsnorm", "qk_norm_scope": "all", "logit_softcap": 0.3},
    {"qk_norm": "rmsnorm", "qk_norm_scope": "head", "softcap": 1.0, "window": 3,
     "logit_softcap": 2.0},
    {"qk_norm": "layernorm", "qk_norm_scope": "all", "softcap": 0.7, "learned_sink": True},
]

# Each mixer's own options, one dict per grid variant (a mixer not listed: its defaults). The
# sizes keep every recurrent state small and the chunked forms spanning several chunks.
MIXER_OPTIONS: dict[str, list[dict[str, object]]] = {
    "linear": [{"feature_map": "elu", "chunk": 4}, {"feature_map": "taylor", "feature_dim": 4,
                                                    "short_conv": 3, "chunk": 5},
               {"feature_map": "favor", "n_features": 24, "chunk": 4},  # FAVOR+
               {"feature_map": "favor", "n_features": 8, "orthogonal": False, "chunk": 5,
                "short_conv": 2}],
    "gated_conv": [{"short_conv": 3, "long_conv": True}, {"short_conv": 2, "long_conv": False}],
    "ssm": [{"d_state": 4, "expand": 2, "d_conv": 3, "chunk": 4},
            {"d_state": 2, "expand": 1, "d_conv": 2, "chunk": 7, "dt_rank": 3}],
    "nystrom": [{"landmarks": 4, "pinv_iters": 6}, {"landmarks": 16, "pinv_iters": 0}],
    "linformer": [{"proj_dim": 8, "share_kv": False}, {"proj_dim": 5}],
    # a global layer with a small memory; a local one (window 3) whose memory wraps soon
    "memorizing": [{"knn_top_k": 3, "knn_memory": 8}, {"knn_top_k": 2, "knn_memory": 4,
                                                       "window": 3}],
}
# Hybrid stacks: per-layer mixer patterns (repeated over the layers)
HYBRIDS = [["linear", "softmax"], ["ssm", "gated_conv", "softmax"], ["softmax", "token_shift"],
           ["softmax", "memorizing"]]
# position schemes a stack without score-based layers takes
PLAIN_POSITIONS = ["none", "sinusoidal", "learned"]


def tiny(family: str = "decoder", position: PositionConfig | None = None,
         attention: str = "mha", style: int = 0, window: int | None = None,
         global_every: int = 0, mixer: MixerConfig | None = None,
         **sizes: object) -> ModelConfig:
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
                                  bias=style % 2 == 1),
        mixer=_with_softmax(family, mixer or MixerConfig(), scale=1.0 if style % 6 == 3 else None,
                            window=window, global_every=global_every),
        tie_embeddings=style % 2 == 0,
        # the options imported models need, rotating through the grid too
        embed_norm=style % 4 == 1, type_vocab_size=2 if style % 5 == 2 else 0,
        head_scale=0.5 if style % 7 == 4 else 1.0,
        **kw,
    )


def _with_softmax(family: str, mixer: MixerConfig, **options: object) -> MixerConfig:
    """``mixer`` with softmax's options (score scale, window pattern) where softmax is in use:
    a softmax layer, or (the scale) an encoder–decoder's cross-attention; set only when they
    differ from softmax's defaults."""
    layers = {*(mixer.pattern or [mixer.name]), *mixer.encoder}
    if family == "encoder_decoder" and not mixer.encoder:
        layers.add(mixer.pattern[0] if mixer.pattern else mixer.name)
    reads = ("scale", "window", "global_every") if "softmax" in layers else (
        ("scale",) if family == "encoder_decoder" else ())
    out = MixerConfig(**mixer)
    for k, v in options.items():
        if k in reads and v != getattr(SoftmaxOptions(), k):
            out[k] = v
    return out


def _label(family: str, pos: PositionConfig, attention: str, style: int,
           local: tuple[int, int] | None = None, mixer: str = "") -> str:
    p = pos.name if pos.name != "rope" else f"rope-{pos.scaling.value}"
    norm, block, ffn = STYLES[style % len(STYLES)]
    w = "" if local is None else f"-w{local[0]}" + (f"g{local[1]}" if local[1] else "")
    return f"{family}-{p}-{attention}-{norm}-{block}-{ffn}{w}{mixer and '-' + mixer}"


def _encoder_mixers(family: str, mixers: list[str]) -> list[str] | None:
    """``model.mixer.encoder`` for ``mixers`` in ``family``: [] when every mixer also has a
    bidirectional form (or the family has no bidirectional stack), [softmax] for the encoder
    of an encoder–decoder whose decoder takes causal-only mixers, None when the family cannot
    take them (an encoder-only family)."""
    f = lookup("family", family)
    if not f.has_bidirectional_stack or all(lookup("mixer", n).bidirectional for n in mixers):
        return []
    return ["softmax"] if f.can_generate else None


def mixer_variants(*families: str) -> list[tuple[str, ModelConfig]]:
    """One variant per non-softmax mixer × option set × family that allows it, and one per
    hybrid pattern × family; styles, head layouts and positions rotating."""
    out = []
    heads = list(ATTENTIONS)
    i = 0
    for name in names("mixer"):
        if name == "softmax":
            continue
        for k, options in enumerate(MIXER_OPTIONS.get(name, [{}])):
            for family in families or names("family"):
                encoder, main = _encoder_mixers(family, [name]), name
                if not getattr(lookup("mixer", name), "causal_form", True):  # encoders only
                    f = lookup("family", family)
                    if not f.has_bidirectional_stack:
                        continue
                    encoder, main = ([name], "softmax") if f.can_generate else ([], name)
                if encoder is None:
                    continue
                # a softmax encoder uses any position scheme; else one no score mixer needs
                plain = PLAIN_POSITIONS if not encoder else [p.name for p in POSITIONS]
                pos = next(p for p in POSITIONS if p.name == plain[i % len(plain)])
                attention, style = heads[i % len(heads)], 7 * i + 2
                label = (f"{name}{k}" + ("-favor" if options.get("feature_map") == "favor" else "")
                         + (f"-{encoder[0]}_encoder" if encoder else ""))
                out.append((_label(family, pos, attention, style, mixer=label),
                            tiny(family, pos, attention, style=style,
                                 mixer=MixerConfig(name=main, encoder=encoder, **options))))
                i += 1
    registered = set(names("mixer"))
    for pattern in HYBRIDS:
        if not set(pattern) <= registered:
            continue
        options = {k: v for n in pattern for k, v in MIXER_OPTIONS.get(n, [{}])[0].items()}
        for family in families or names("family"):
            encoder = _encoder_mixers(family, pattern)
            if encoder is None:
                continue
            pos = PositionConfig(name="rope" if i % 2 else "alibi")
            attention, style = heads[i % len(heads)], 7 * i + 2
            out.append((_label(family, pos, attention, style, mixer="-".join(pattern)),
                        tiny(family, pos, attention, style=style, n_layers=len(pattern),
                             mixer=MixerConfig(pattern=list(pattern), encoder=encoder,
                                               **options))))
            i += 1
    return out


def grid(*families: str) -> list[tuple[str, ModelConfig]]:
    """(id, config) for every family × position × head layout, styles rotating; then one
    local-attention variant per family × position, patterns and head layouts rotating; then
    the mixer and hybrid variants (:func:`mixer_variants`)."""
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
    return (out + pattern_variants(*families) + stability_variants(*families)
            + mixer_variants(*families))


def pattern_variants(*families: str) -> list[tuple[str, ModelConfig]]:
    """One variant per attention pattern (``PATTERNS``) × family; positions (rotary where
    the pattern drops it on global layers), head layouts and styles rotating."""
    out = []
    heads = list(ATTENTIONS)
    for i, (k, family) in enumerate(itertools.product(range(len(PATTERNS)),
                                                      families or names("family"))):
        options = PATTERNS[k]
        pos = POSITIONS[(3 * i + 1) % len(POSITIONS)]
        if options.get("global_rope") is False:
            pos = PositionConfig(name="rope")
        attention, style = heads[i % len(heads)], 3 * i + 2
        out.append((_label(family, pos, attention, style, mixer=f"pattern{k}"),
                    tiny(family, pos, attention, style=style, n_layers=2,
                         mixer=MixerConfig(name="softmax", **options))))
    return out


def stability_variants(*families: str) -> list[tuple[str, ModelConfig]]:
    """One variant per stability option set (``STABILITY``) × family; positions, head
    layouts and styles rotating."""
    out = []
    heads = list(ATTENTIONS)
    for i, (k, family) in enumerate(itertools.product(range(len(STABILITY)),
                                                      families or names("family"))):
        options = dict(STABILITY[k])
        cap = options.pop("logit_softcap", None)
        pos = POSITIONS[(3 * i + 4) % len(POSITIONS)]  # ALiBi beside both softcaps
        attention, style = heads[(i + 1) % len(heads)], 5 * i + 3
        out.append((_label(family, pos, attention, style, mixer=f"stability{k}"),
                    tiny(family, pos, attention, style=style, logit_softcap=cap,
                         mixer=MixerConfig(name="softmax", **options))))
    return out


def params(*families: str):
    """pytest.mark.parametrize arguments over the grid."""
    import pytest

    return pytest.mark.parametrize("cfg", [c for _, c in grid(*families)],
                                   ids=[i for i, _ in grid(*families)])
