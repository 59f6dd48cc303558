"""The rules of a model config. Values and cross-field rules of the schema are checked here;
every rule that belongs to one component is asked of that component through the registry
(``check`` of a position scheme, head layout, mixer, block, norm or FFN; ``options``,
``positions_limit``, ``has_score_bias`` / ``has_rotary`` of a scheme; ``uses_gelu_form`` of an
FFN; ``bidirectional`` / ``uses_score_bias`` / ``uses_rotary`` of a mixer), so no rule here
tests a component's name and a user's component brings its own rules. Components are looked up
only when a config is checked, never at import: this package stays torch-free."""

from __future__ import annotations

import dataclasses
from typing import Any

from blocklab.config.checks import _check, _fail, _finite, _name, finite_everywhere
from blocklab.config.mixer_options import validate_mixer_options
from blocklab.config.model_schema import GELU_FORMS, ModelConfig, PositionConfig
from blocklab.config.schema import DataConfig

MODEL_AXES = ("family", "norm", "block", "position", "ffn", "attention", "mixer")
#: Axes whose component may state rules on the whole model config: ``check(m, key)``, ``key``
#: the model's dotted prefix (head layouts and mixers have rules of their own shape).
RULED_AXES = ("family", "norm", "block", "position", "ffn")
#: The deepest stack a config may ask for: far beyond any trained Transformer, and small enough
#: that checking and estimating it layer by layer answers in seconds.
MAX_LAYERS = 10_000


def validate_model(m: ModelConfig, key: str = "model") -> ModelConfig:
    """Check the cross-field rules of a composed model config; return it unchanged. Component
    names are checked against their registries (which loads user plugins, see registry.py)."""
    from blocklab import registry

    finite_everywhere(m, key)
    for axis in MODEL_AXES:
        registry.lookup(axis, getattr(m, axis).name, f"{key}.{axis}.name")
    if m.vocab_size is None:
        raise _fail(f"{key}.vocab_size", None, "must be set here (null means 'the tokenizer's "
                    "size' and is only filled in by training)")
    for name in ("vocab_size", "d_model", "n_layers", "n_heads", "d_ff", "max_seq_len"):
        value = getattr(m, name)
        if value < 1:
            raise _fail(f"{key}.{name}", value, "must be >= 1")
    for name in ("n_layers", "family.n_encoder_layers"):  # every check and estimate is per layer
        value = m.n_layers if name == "n_layers" else m.family.n_encoder_layers
        _check(value is None or value <= MAX_LAYERS, f"{key}.{name}", value,
               f"must be <= {MAX_LAYERS:,} (blocklab's bound on a stack's depth)")
    if not 0.0 <= m.dropout < 1.0:
        raise _fail(f"{key}.dropout", m.dropout, "must be in [0, 1)")
    if m.d_head is None and m.d_model % m.n_heads:
        raise _fail(f"{key}.n_heads", m.n_heads, f"must divide d_model={m.d_model}",
                    "or set model.d_head explicitly")
    if m.d_head is not None and m.d_head < 1:
        raise _fail(f"{key}.d_head", m.d_head, "must be >= 1")
    # the head layout states its own rule (model/attention.py HeadLayout.check)
    registry.lookup("attention", m.attention.name).check(m.attention, m.n_heads,
                                                         f"{key}.attention")
    for axis in RULED_AXES:  # e.g. rope's even head dimension (model/position.py RoPE.check)
        rule = getattr(registry.lookup(axis, getattr(m, axis).name), "check", None)
        if rule is not None:
            rule(m, key)
    _validate_values(m, key)
    if m.init is not None:  # the scheme exists, and states its own rules (model/init.py)
        rule = getattr(registry.lookup("init", m.init, f"{key}.init"), "check", None)
        if rule is not None:
            rule(m, key)
    family = registry.lookup("family", m.family.name, f"{key}.family.name")
    _validate_mixers(m, key, family)
    return m


def _validate_values(m: ModelConfig, key: str) -> None:
    """Values of the schema whatever the components: eps, the GELU form, the score scale, the
    token-type vocabulary, the head scale, the encoder depth."""
    if m.norm.eps <= 0:
        raise _fail(f"{key}.norm.eps", m.norm.eps, "must be > 0")
    if m.ffn.approximate not in GELU_FORMS:
        raise _fail(f"{key}.ffn.approximate", m.ffn.approximate, f"one of {list(GELU_FORMS)}")
    if m.type_vocab_size < 0:
        raise _fail(f"{key}.type_vocab_size", m.type_vocab_size, "must be >= 0 (0 = none)")
    if not (_finite(m.head_scale) and m.head_scale > 0):
        raise _fail(f"{key}.head_scale", m.head_scale, "must be a finite number > 0")
    for name in ("logit_softcap", "embed_init_std"):
        value = getattr(m, name)
        _check(value is None or (_finite(value) and value > 0), f"{key}.{name}", value,
               "must be null or a finite number > 0")
    if m.family.n_encoder_layers is not None and m.family.n_encoder_layers < 1:
        raise _fail(f"{key}.family.n_encoder_layers", m.family.n_encoder_layers, "must be >= 1")


def _validate_mixers(m: ModelConfig, key: str, family: Any) -> None:
    """Every layer's mixer exists, fits its stack (encoders need a bidirectional form), is
    read its options (config/mixer_options.py) and passes its own rules (``Mixer.check``);
    the position scheme is used by some layer."""
    from blocklab import registry

    for field_name in ("pattern", "encoder"):
        for name in getattr(m.mixer, field_name):
            registry.lookup("mixer", name, f"{key}.mixer.{field_name}")
    validate_mixer_options(m, key, family)
    used = []
    stacks = family.stacks(m)
    for n_layers, _, causal in stacks:
        where = key + m.mixer_key(causal).removeprefix("model")
        chosen = {"name": m.mixer.name, "pattern": list(m.mixer.pattern),
                  "encoder": list(m.mixer.encoder)}[where.rsplit(".", 1)[1]]
        if isinstance(chosen, list):  # repeated when shorter; longer would drop its tail
            count = (f"{key}.family.n_encoder_layers" if not causal and len(stacks) > 1
                     and m.family.n_encoder_layers is not None else f"{key}.n_layers")
            _check(len(chosen) <= n_layers, where, chosen,
                   f"{len(chosen)} entries for a stack of {n_layers} layer"
                   f"{'s' * (n_layers > 1)} ({count}={n_layers}): one mixer per layer, "
                   f"repeated when shorter, so the entries past layer {n_layers - 1} would "
                   f"never be used", f"give at most {n_layers}, or raise {count}")
        for i in range(n_layers):
            name = m.layer_mixer(i, causal)
            mixer = registry.lookup("mixer", name, where)
            _check(causal or mixer.bidirectional, where, chosen,
                   f"mixer {name!r} has no bidirectional form, and family {m.family.name!r} "
                   "has a bidirectional stack", "choose its mixers with model.mixer.encoder "
                   "(e.g. [softmax]), or use a causal family")
            mixer.check(m, i, causal=causal, key=f"{key}.mixer")
            used.append(mixer)
    where = f"{key}.mixer.pattern" if m.mixer.pattern else f"{key}.mixer.name"
    pattern = list(m.mixer.pattern)
    position = registry.lookup("position", m.position.name)  # it says what it gives mixers
    _check(not position.has_score_bias() or any(x.uses_score_bias for x in used),
           f"{key}.position.name", m.position.name, f"its score bias applies to score-based "
           f"mixers (softmax), and no layer has one ({where}={pattern or m.mixer.name!r})",
           "use model/position=none or a softmax layer")
    _check(not position.has_rotary() or any(x.uses_rotary for x in used),
           f"{key}.position.name", m.position.name, f"rotary angles apply to mixers that "
           f"rotate queries and keys (softmax), and no layer does "
           f"({where}={pattern or m.mixer.name!r})", "use model/position=none or a softmax layer")


def validate_model_options(m: ModelConfig, data: DataConfig | None, key: str = "model", *,
                           seq_len: int | None = None, seq_key: str = "data.seq_len") -> None:
    """Options a component would silently ignore (each says what it reads), the position
    scheme's option rules, and its position table against the training length
    (``data.seq_len``, or ``seq_len`` named ``seq_key``: blocklab-estimate's). Part of a
    training config's check, and of an estimate's, not of :func:`validate_model`: a model
    built directly may carry them."""
    length = data.seq_len if seq_len is None else seq_len
    from blocklab import registry

    scheme = registry.lookup("position", m.position.name, f"{key}.position.name")
    _unread_position_options(m, scheme, key)
    uses_gelu = getattr(registry.lookup("ffn", m.ffn.name), "uses_gelu_form", None)
    if uses_gelu is not None and not uses_gelu():
        gelu = [n for n, c in registry.table("ffn").items()
                if getattr(c, "uses_gelu_form", lambda: False)()]
        _check(m.ffn.approximate == "none", f"{key}.ffn.approximate", m.ffn.approximate,
               f"the GELU form: model.ffn.name={m.ffn.name!r} has no GELU",
               f"leave it at 'none' or use one of {gelu}")
    scheme.check_options(m.position, f"{key}.position")
    limit = scheme.positions_limit(m.position, max_seq_len=m.max_seq_len)  # the scheme says
    if limit is not None:
        _check(limit >= length, f"{key}.max_seq_len", m.max_seq_len,
               f"the {m.position.name} position table must cover {seq_key}={length}",
               f"raise {key}.max_seq_len or lower {seq_key}")


def _unread_position_options(m: ModelConfig, scheme: Any, key: str) -> None:
    """A scheme that declares the options it reads (``Position.options``) refuses the options
    another scheme declares, away from their defaults: it would silently ignore them."""
    from blocklab import registry

    reads = getattr(scheme, "options", None)
    if reads is None:  # not declared: the scheme may read any option
        return
    owners: dict[str, str] = {}
    for name, other in registry.table("position").items():
        for option in getattr(other, "options", None) or ():
            owners.setdefault(option, name)
    p, default = m.position, PositionConfig()
    for f in dataclasses.fields(PositionConfig):  # the schema's order: rope's, then T5's
        owner = owners.get(f.name)
        if owner is None or f.name in reads:
            continue
        value, usual = getattr(p, f.name), _name(getattr(default, f.name))
        _check(_name(value) == usual, f"{key}.position.{f.name}", value,
               f"a {owner} option: model.position.name={p.name!r} ignores it",
               f"leave it at {usual!r} or use model/position={owner}")
