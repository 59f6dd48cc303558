"""The model config schema: one dataclass per axis of the model (family, norm, block,
position, FFN, attention heads, sequence mixer) and :class:`ModelConfig` over them. Re-exported
by ``blocklab.config.schema`` (import from ``blocklab.config``). Rules on these live in
``validate_model.py`` and, for what one component owns, beside the component (model/)."""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass, field
from typing import Any, TypeVar

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
    """The head layout shared by every mixer with heads (softmax, linear attention) and by
    cross-attention. Softmax's own options (window, layer pattern, score scale, dropout) are
    ``model.mixer``'s (model/softmax_options.py ``SoftmaxOptions``)."""

    name: str = "mha"
    n_kv_heads: int | None = None  # mha: null (= n_heads); gqa: required; mqa: null (= 1)
    bias: bool = True


#: ``model.mixer``'s keys that choose mixers; every other key is an option of a mixer in use.
MIXER_CHOICE_KEYS = ("name", "pattern", "encoder")
#: a plugin mixer without an options dataclass reads its options from ``model.mixer.options``
MIXER_FREE_KEY = "options"


class MixerConfig(dict):
    """``model.mixer``: the sequence mixer of every layer (model/mixers.py ``MIXERS``) and the
    options of the mixers in use, in one flat mapping -- ``MixerConfig(name="ssm",
    d_state=8)`` is ``model/mixer=ssm model.mixer.d_state=8``. ``name`` (every layer),
    ``pattern`` (hybrid stacks: one mixer per layer, repeated; [] = ``name``) and ``encoder``
    (the mixers of a bidirectional stack, repeated; [] = as above) choose the mixers; every
    other key is an option that a mixer in use declares in its options dataclass (``options``
    on the mixer class, e.g. model/ssm.py ``SSMOptions``), read with :meth:`read`; an option
    two mixers in use both declare (``chunk``) takes one value. Validation refuses a key no
    mixer in use declares, naming its owner or the closest key, and fills in the defaults of
    the mixers in use. A plugin mixer without an options dataclass reads
    ``options`` (a free-form dict, checked by its own ``check``).

    A dict (not a dataclass) so that Hydra holds it as an open node: each
    ``configs/model/mixer/<name>.yaml`` lists its own options (the mixer config module
    docstring, model/mixer.py, says why)."""

    def __init__(self, name: str = "softmax", pattern: list[str] | tuple[str, ...] = (),
                 encoder: list[str] | tuple[str, ...] = (), **options: Any) -> None:
        super().__init__(name=name, pattern=list(pattern), encoder=list(encoder), **options)

    @property
    def name(self) -> str:
        return self["name"]

    @name.setter
    def name(self, value: str) -> None:
        self["name"] = value

    @property
    def pattern(self) -> list[str]:
        return self.setdefault("pattern", [])

    @pattern.setter
    def pattern(self, value: list[str]) -> None:
        self["pattern"] = list(value)

    @property
    def encoder(self) -> list[str]:
        return self.setdefault("encoder", [])

    @encoder.setter
    def encoder(self, value: list[str]) -> None:
        self["encoder"] = list(value)

    @property
    def options(self) -> dict[str, Any]:
        """The free-form options of a plugin mixer without an options dataclass."""
        return self.get(MIXER_FREE_KEY) or {}

    def __getattr__(self, option: str) -> Any:  # m.mixer.d_state: an option that is set
        try:
            return self[option]
        except KeyError:
            raise AttributeError(f"model.mixer has no {option!r} (not set; read a mixer's "
                                 "options with m.mixer.read(Options))") from None

    def settings(self) -> dict[str, Any]:
        """The flat options (every key but the mixer choice and the free-form ``options``)."""
        return {k: v for k, v in self.items()
                if k not in MIXER_CHOICE_KEYS and k != MIXER_FREE_KEY}

    def read(self, options: type[T]) -> T:
        """The options dataclass ``options`` of a mixer, from the flat keys it declares (its
        defaults for the others)."""
        names = {f.name for f in dataclasses.fields(options)}  # type: ignore[arg-type]
        return options(**{k: v for k, v in self.items() if k in names})

    def __repr__(self) -> str:
        return f"MixerConfig({', '.join(f'{k}={v!r}' for k, v in self.items())})"

    def __deepcopy__(self, memo: dict[int, Any]) -> MixerConfig:
        import copy

        return MixerConfig(**copy.deepcopy(dict(self), memo))

    def __reduce__(self):  # pickles as itself (checkpoints hold plain dicts, never this)
        return (_mixer_config, (dict(self),))


def _mixer_config(items: dict[str, Any]) -> MixerConfig:
    return MixerConfig(**items)


T = TypeVar("T")


@dataclass
class ModelConfig:
    family: FamilyConfig = field(default_factory=FamilyConfig)
    norm: NormConfig = field(default_factory=NormConfig)
    block: BlockConfig = field(default_factory=BlockConfig)
    position: PositionConfig = field(default_factory=PositionConfig)
    ffn: FFNConfig = field(default_factory=FFNConfig)
    attention: AttentionConfig = field(default_factory=AttentionConfig)
    # an open node for Hydra (each mixer's YAML lists its options), a MixerConfig in Python
    mixer: dict[str, Any] = field(default_factory=MixerConfig)
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
    # init scheme (model/init.py INITS: gpt2 | normal | fan_in | deepnorm, or a registered
    # one); null = the block's own (DeepNorm's for block=deepnorm, GPT-2's otherwise)
    init: str | None = None
    embed_init_std: float | None = None  # token (and type) embeddings' std; null = init_std
    # final-logit softcap c: logits <- c * tanh(logits / c) (Gemma 2: 30); null = none
    logit_softcap: float | None = None
    # norm (model.norm's kind) on each stack's input: token (+ type + absolute position)
    # embeddings, before the first block (BERT's embedding LayerNorm)
    embed_norm: bool = False
    # token-type ("segment A/B") embeddings added to the token embeddings; 0 = none (BERT: 2)
    type_vocab_size: int = 0
    # factor on the final hidden state before the LM head (T5 with a tied head: d_model^-0.5)
    head_scale: float = 1.0
    # RMT memory tokens (arXiv 2207.06881): n learned embeddings read and written around each
    # segment, carried to the next one (data.segment_mode=split); 0 = none
    memory_tokens: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.mixer, MixerConfig):  # from OmegaConf or a plain dict
            self.mixer = MixerConfig(**dict(self.mixer))

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
