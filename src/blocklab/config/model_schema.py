"""The model config schema: one dataclass per axis of the model (family, norm, block,
position, FFN, attention heads, sequence mixer) and :class:`ModelConfig` over them. Re-exported
by ``blocklab.config.schema`` (import from ``blocklab.config``). Rules on these live in
``validate_model.py`` and, for what one component owns, beside the component (model/)."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

# Component axes (family, norm, block, position, ffn, attention) are plain strings checked
# against their registries (registry.py), so a user module can add a choice; the file name of
# a config group option = the registry key (a test checks both sets are equal). Choices that
# are not components stay enums.


class RopeScaling(enum.Enum):
    none = "none"
    linear = "linear"
    ntk = "ntk"
    yarn = "yarn"
    llama3 = "llama3"


@dataclass
class FamilyConfig:
    name: str = "decoder"
    # encoder_decoder only: encoder depth (null = model.n_layers).
    n_encoder_layers: int | None = None


@dataclass
class NormConfig:
    name: str = "layernorm"
    eps: float = 1e-5
    bias: bool = True  # LayerNorm only; RMSNorm has no bias


@dataclass
class BlockConfig:
    name: str = "pre"


@dataclass
class PositionConfig:
    name: str = "none"
    # rope
    base: float = 10000.0
    scaling: RopeScaling = RopeScaling.none
    factor: float = 1.0  # context extension factor for linear / ntk / yarn
    original_max_seq_len: int | None = None  # yarn: training context (null = model.max_seq_len)
    yarn_beta_fast: float = 32.0
    yarn_beta_slow: float = 1.0
    # llama3: wavelengths longer than original/low_freq_factor are interpolated, shorter than
    # original/high_freq_factor kept, a smooth blend between
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    # t5_bias
    num_buckets: int = 32
    max_distance: int = 128


GELU_FORMS = ("none", "tanh")  # torch.nn.functional.gelu(approximate=...)


@dataclass
class FFNConfig:
    name: str = "gelu_mlp"
    bias: bool = True
    # GELU form of gelu_mlp / geglu (and the masked-LM head): "none" = exact erf (BERT),
    # "tanh" = the tanh approximation (GPT-2's gelu_new, T5 v1.1's gated-gelu)
    approximate: str = "none"


@dataclass
class AttentionConfig:
    name: str = "mha"
    n_kv_heads: int | None = None  # mha: null (= n_heads); gqa: required; mqa: null (= 1)
    bias: bool = True
    dropout: float = 0.0
    # attention score scale; null = 1/sqrt(d_head); T5 uses 1.0 (unscaled scores)
    scale: float | None = None
    # Local (sliding-window) self-attention: keys per query, the query itself included
    # (null = global). A causal stack sees the query and the window - 1 tokens before it; a
    # bidirectional (encoder) stack the query and (window - 1) / 2 tokens on each side (window
    # odd). Cross-attention is never windowed.
    window: int | None = None
    # Which layers are local when a window is set: 0 = every layer; n >= 2 = every n-th layer
    # (layers n, 2n, ... counting from 1) is global, the others local.
    global_every: int = 0
    # Or an explicit per-layer pattern, "global" / "local" per layer, repeated over the layers
    # of each stack ([] = global_every decides), e.g. [global, global, local, local] for a
    # Qwen2 whose first two of four layers are full attention. Needs a window and
    # global_every: 0.
    layers: list[str] = field(default_factory=list)


ATTENTION_LAYER_KINDS = ("global", "local")  # the entries of model.attention.layers

MIXER_FEATURE_MAPS = ("elu", "taylor")  # linear attention's feature maps


@dataclass
class MixerConfig:
    """The sequence mixer of every layer: how a layer mixes information along the sequence
    (model/mixers.py ``MIXERS``). ``softmax`` is attention (its heads, window and score scale
    are ``model.attention``); the others keep a decode state of their own. Each built-in mixer
    reads only its own options below; a user mixer reads ``options``."""

    name: str = "softmax"  # softmax | linear | gated_conv | ssm | a registered mixer
    # hybrid stacks: one mixer name per layer, repeated over the layers ([] = `name` on every
    # layer), e.g. [linear, linear, linear, softmax] = every 4th layer softmax
    pattern: list[str] = field(default_factory=list)
    # the mixers of a bidirectional (encoder) stack, repeated over its layers ([] = as above):
    # e.g. an encoder–decoder with softmax in the encoder and ssm in the decoder
    encoder: list[str] = field(default_factory=list)
    # linear attention ("Transformers are RNNs", arXiv 2006.16236; "Based", arXiv 2402.18668):
    # feature map elu (elu(x) + 1, d_head features) | taylor (2nd-order Taylor of exp over a
    # feature_dim projection: 1 + d + d^2 features)
    feature_map: str = "elu"
    feature_dim: int = 16  # taylor: query/key projection width per head
    # linear attention and gated_conv: a short causal depthwise convolution of this many taps
    # on the input (0 = none; gated_conv needs >= 1)
    short_conv: int = 0
    chunk: int = 64  # linear / ssm: chunk length of the chunked parallel form in training
    # gated_conv ("Hungry Hungry Hippos", arXiv 2212.14052; "Hyena", arXiv 2302.10866; Zoology's
    # BaseConv, arXiv 2312.04927): y = (W_g x) * long_conv(short_conv(W_u x)); long_conv true
    # adds a filter over the whole context, computed by FFT
    long_conv: bool = True
    # ssm ("Mamba", arXiv 2312.00752): state size per channel, expansion, conv taps, dt rank
    d_state: int = 16
    expand: int = 2
    d_conv: int = 4
    dt_rank: int | None = None  # null = ceil(d_model / 16)
    # the training scan: sequential (a step per token, hand-written backward) | chunked
    # (chunk + T / chunk steps) | auto (sequential on CPU, chunked on accelerators)
    scan: str = "auto"
    # a user mixer's own options (open on purpose: its own check() validates them)
    options: dict[str, Any] = field(default_factory=dict)


@dataclass
class ModelConfig:
    family: FamilyConfig = field(default_factory=FamilyConfig)
    norm: NormConfig = field(default_factory=NormConfig)
    block: BlockConfig = field(default_factory=BlockConfig)
    position: PositionConfig = field(default_factory=PositionConfig)
    ffn: FFNConfig = field(default_factory=FFNConfig)
    attention: AttentionConfig = field(default_factory=AttentionConfig)
    mixer: MixerConfig = field(default_factory=MixerConfig)
    vocab_size: int | None = 256  # null = the tokenizer's size (filled in by training)
    d_model: int = 64
    n_layers: int = 2
    n_heads: int = 4
    d_head: int | None = None  # null = d_model // n_heads
    d_ff: int = 256
    max_seq_len: int = 256
    dropout: float = 0.0  # embedding and residual dropout
    tie_embeddings: bool = True
    init_std: float = 0.02
    # norm (model.norm's kind) on each stack's input: token (+ type + absolute position)
    # embeddings, before the first block (BERT's embedding LayerNorm)
    embed_norm: bool = False
    # token-type ("segment A/B") embeddings added to the token embeddings; 0 = none (BERT: 2)
    type_vocab_size: int = 0
    # factor on the final hidden state before the LM head (T5 with a tied head: d_model^-0.5)
    head_scale: float = 1.0

    # Derived values: read these, never recompute them at call sites.
    @property
    def head_dim(self) -> int:
        return self.d_head if self.d_head is not None else self.d_model // self.n_heads

    @property
    def kv_heads(self) -> int:
        return resolve_kv_heads(self)

    def layer_mixer(self, layer: int, causal: bool = True) -> str:
        """The mixer name of 0-based ``layer`` of a causal or bidirectional stack
        (``mixer.encoder`` repeated in a bidirectional stack when set, else ``mixer.pattern``
        repeated, else ``mixer.name``)."""
        pattern = self.mixer.pattern if causal or not self.mixer.encoder else self.mixer.encoder
        return pattern[layer % len(pattern)] if pattern else self.mixer.name

    def mixer_key(self, causal: bool = True) -> str:
        """The config key that chose the mixers of a causal / bidirectional stack."""
        if not causal and self.mixer.encoder:
            return "model.mixer.encoder"
        return "model.mixer.pattern" if self.mixer.pattern else "model.mixer.name"

    @property
    def encoder_layers(self) -> int:
        n = self.family.n_encoder_layers
        return self.n_layers if n is None else n


def resolve_kv_heads(m: ModelConfig) -> int:
    """Number of K/V heads implied by the head layout (``attention.name``: MHA / GQA / MQA, or
    a registered one) and ``n_kv_heads``: the layout decides (model/attention.py)."""
    from blocklab.registry import lookup

    layout = lookup("attention", m.attention.name, "model.attention.name")
    return layout.kv_heads(m.attention, m.n_heads)
