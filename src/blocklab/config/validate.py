"""One validator per composed config, in sections by config group: every value and every
cross-field rule of the schema is checked here, before anything is built or written."""

from __future__ import annotations

import dataclasses
import re
from typing import Any

from blocklab.config.checks import _check, _fail, _finite, _name, _one_of
from blocklab.config.probes import validate_probe_spec
from blocklab.config.schema import (
    ACCELERATORS,
    ATTENTION_LAYER_KINDS,
    DATA_FORMATS,
    DOCUMENT_SPLITS,
    FILLERS,
    GELU_FORMS,
    GRAD_NORMS,
    LONG_DOCUMENTS,
    MARKOV_MIN_FILLER,
    PRECISIONS,
    PROFILERS,
    SOURCE_FINGERPRINTS,
    STRATEGIES,
    UTF8_ERRORS,
    WANDB_MODES,
    DataConfig,
    DataName,
    EvalConfig,
    GenerateConfig,
    LoggerConfig,
    ModelConfig,
    OptimConfig,
    PositionConfig,
    ProbeSpec,
    RopeScaling,
    ScheduleConfig,
    TaskWeights,
    TokenizerConfig,
    TokenizerName,
    TrainConfig,
    TrainerConfig,
    counting_min_length,
    distinct_ids,
    mqar_min_length,
    multihop_min_length,
    needle_min_length,
)
from blocklab.errors import ConfigError

MODEL_AXES = ("family", "norm", "block", "position", "ffn", "attention", "mixer")


def validate_model(m: ModelConfig, key: str = "model") -> ModelConfig:
    """Check the cross-field rules of a composed model config; return it unchanged. Component
    names are checked against their registries (which loads user plugins, see registry.py)."""
    from blocklab import registry

    for axis in MODEL_AXES:
        registry.lookup(axis, getattr(m, axis).name, f"{key}.{axis}.name")
    if m.vocab_size is None:
        raise _fail(f"{key}.vocab_size", None, "must be set here (null means 'the tokenizer's "
                    "size' and is only filled in by training)")
    for name in ("vocab_size", "d_model", "n_layers", "n_heads", "d_ff", "max_seq_len"):
        value = getattr(m, name)
        if value < 1:
            raise _fail(f"{key}.{name}", value, "must be >= 1")
    for name, value in (("dropout", m.dropout), ("attention.dropout", m.attention.dropout)):
        if not 0.0 <= value < 1.0:
            raise _fail(f"{key}.{name}", value, "must be in [0, 1)")
    if m.d_head is None and m.d_model % m.n_heads:
        raise _fail(f"{key}.n_heads", m.n_heads, f"must divide d_model={m.d_model}",
                    "or set model.d_head explicitly")
    if m.d_head is not None and m.d_head < 1:
        raise _fail(f"{key}.d_head", m.d_head, "must be >= 1")
    # the head layout states its own rule (model/attention.py HeadLayout.check)
    registry.lookup("attention", m.attention.name).check(m.attention, m.n_heads,
                                                         f"{key}.attention")
    p = m.position
    if p.name == "rope":
        if m.head_dim % 2:
            raise _fail(f"{key}.d_head", m.head_dim, "rope needs an even head dimension")
        if p.base <= 1:
            raise _fail(f"{key}.position.base", p.base, "must be > 1")
        if p.factor < 1:
            raise _fail(f"{key}.position.factor", p.factor, "must be >= 1")
    if p.name == "t5_bias" and (p.num_buckets < 4 or p.max_distance <= p.num_buckets // 2):
        raise _fail(f"{key}.position.num_buckets", p.num_buckets,
                    f"t5_bias needs num_buckets >= 4 and max_distance > num_buckets/2 "
                    f"(max_distance={p.max_distance})")
    if m.norm.eps <= 0:
        raise _fail(f"{key}.norm.eps", m.norm.eps, "must be > 0")
    if m.ffn.approximate not in GELU_FORMS:
        raise _fail(f"{key}.ffn.approximate", m.ffn.approximate, f"one of {list(GELU_FORMS)}")
    if m.attention.scale is not None and not (_finite(m.attention.scale)
                                              and m.attention.scale > 0):
        raise _fail(f"{key}.attention.scale", m.attention.scale,
                    "must be null (1/sqrt(d_head)) or a finite number > 0")
    if m.type_vocab_size < 0:
        raise _fail(f"{key}.type_vocab_size", m.type_vocab_size, "must be >= 0 (0 = none)")
    if not (_finite(m.head_scale) and m.head_scale > 0):
        raise _fail(f"{key}.head_scale", m.head_scale, "must be a finite number > 0")
    if (p.name == "rope" and p.scaling is RopeScaling.llama3
            and not 0 < p.low_freq_factor < p.high_freq_factor):
        raise _fail(f"{key}.position.low_freq_factor", p.low_freq_factor,
                        f"llama3 scaling needs 0 < low_freq_factor < high_freq_factor="
                        f"{p.high_freq_factor}")
    if m.family.n_encoder_layers is not None and m.family.n_encoder_layers < 1:
        raise _fail(f"{key}.family.n_encoder_layers", m.family.n_encoder_layers, "must be >= 1")
    family = registry.lookup("family", m.family.name, f"{key}.family.name")
    _validate_window(m, key, bidirectional=getattr(family, "has_bidirectional_stack", False),
                     stacks=family.stacks(m))
    _validate_mixers(m, key, family)
    return m


def _validate_mixers(m: ModelConfig, key: str, family: Any) -> None:
    """Every layer's mixer exists, fits its stack (encoders need a bidirectional form) and
    passes its own rules (``Mixer.check``); the position scheme and the attention window are
    used by some layer."""
    from blocklab import registry

    for field_name in ("pattern", "encoder"):
        for name in getattr(m.mixer, field_name):
            registry.lookup("mixer", name, f"{key}.mixer.{field_name}")
    used = []
    for n_layers, _, causal in family.stacks(m):
        where = key + m.mixer_key(causal).removeprefix("model")
        chosen = {"name": m.mixer.name, "pattern": list(m.mixer.pattern),
                  "encoder": list(m.mixer.encoder)}[where.rsplit(".", 1)[1]]
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
    position = registry.lookup("position", m.position.name)
    has_bias = position.score_bias is not _base_position(position).score_bias
    has_rotary = position.rotary is not _base_position(position).rotary
    _check(not has_bias or any(x.uses_score_bias for x in used), f"{key}.position.name",
           m.position.name, f"its score bias applies to score-based mixers (softmax), and no "
           f"layer has one ({where}={pattern or m.mixer.name!r})",
           "use model/position=none or a softmax layer")
    _check(not has_rotary or any(x.uses_rotary for x in used), f"{key}.position.name",
           m.position.name, f"rotary angles apply to mixers that rotate queries and keys "
           f"(softmax), and no layer does ({where}={pattern or m.mixer.name!r})",
           "use model/position=none or a softmax layer")
    _check(m.attention.window is None or any(x.uses_score_bias for x in used),
           f"{key}.attention.window", m.attention.window,
           f"only softmax layers have a window, and no layer is softmax "
           f"({where}={pattern or m.mixer.name!r})")


def _base_position(position: type) -> type:
    """The position schemes' base class (its hooks are the no-ops a scheme overrides)."""
    return next(c for c in reversed(position.__mro__) if c.__name__ == "Position")


def _validate_window(m: ModelConfig, key: str, *, bidirectional: bool,
                     stacks: list[tuple[int, bool, bool]]) -> None:
    """Local (sliding-window) attention: ``window`` keys per query (null = global), odd where the
    family has a bidirectional stack (a centred window), ``global_every`` 0 or >= 2, only with a
    window, and making at least one layer global: ``global_every`` past every stack's depth
    silently meant "all local", which is ``global_every: 0``."""
    a = m.attention
    _check(a.window is None or (isinstance(a.window, int) and a.window >= 1),
           f"{key}.attention.window", a.window,
           "must be null (global attention) or >= 1 (keys per query, the query included)")
    _check(a.window is None or not bidirectional or a.window % 2 == 1,
           f"{key}.attention.window", a.window,
           f"must be odd for family {m.family.name!r}: a bidirectional stack sees "
           "(window - 1) / 2 tokens on each side")
    _check(a.global_every == 0 or a.global_every >= 2, f"{key}.attention.global_every",
           a.global_every, "must be 0 (every layer local) or >= 2 (layers n, 2n, ... global)")
    _check(a.global_every == 0 or a.window is not None, f"{key}.attention.global_every",
           a.global_every, "needs model.attention.window (null: every layer is already global)")
    deepest = max(n for n, _, _ in stacks)  # a shallower stack may be all local; not every one
    _check(a.global_every <= deepest, f"{key}.attention.global_every", a.global_every,
           f"no layer would be global: must be <= the deepest stack's {deepest} layers "
           f"({_depths(m, key)})", "global_every: 0 makes every layer local")
    _validate_layer_kinds(m, key, deepest)


def _validate_layer_kinds(m: ModelConfig, key: str, deepest: int) -> None:
    """``attention.layers``, the explicit per-layer pattern: "global" / "local" entries, only
    with a window and instead of ``global_every`` (two patterns at once would leave one
    silently unused), no longer than the deepest stack (entries past it would never be read)
    and with a local entry (else the window changes nothing: ``window: null``)."""
    a, where = m.attention, f"{key}.attention.layers"
    if not a.layers:
        return
    bad = [x for x in a.layers if x not in ATTENTION_LAYER_KINDS]
    _check(not bad, where, a.layers, f"entries must be one of {', '.join(ATTENTION_LAYER_KINDS)}"
           f" (not {bad[0]!r})" if bad else "")
    _check(a.window is not None, where, a.layers,
           "needs model.attention.window (null: every layer is already global)")
    _check(a.global_every == 0, where, a.layers,
           f"says which layers are global, and so does model.attention.global_every="
           f"{a.global_every}", "set global_every: 0 with an explicit list")
    _check(len(a.layers) <= deepest, where, a.layers,
           f"{len(a.layers)} entries, more than the deepest stack's {deepest} layers "
           f"({_depths(m, key)}): the rest would never be read")
    _check("local" in a.layers, where, a.layers, "no layer would be local, so the window would "
           "change nothing", "window: null makes every layer global")


def _depths(m: ModelConfig, key: str) -> str:
    if m.family.n_encoder_layers is None:
        return f"{key}.n_layers={m.n_layers}"
    return f"{key}.n_layers={m.n_layers}, {key}.family.n_encoder_layers={m.encoder_layers}"


_ROPE_OPTIONS = ("base", "scaling", "factor", "original_max_seq_len", "yarn_beta_fast",
                 "yarn_beta_slow", "low_freq_factor", "high_freq_factor")
# FFNs whose activation is a GELU (model.ffn.approximate applies to them)
_GELU_FFNS = ("gelu_mlp", "geglu")
_T5_OPTIONS = ("num_buckets", "max_distance")


def _validate_position_options(m: ModelConfig, data: DataConfig, key: str = "model") -> None:
    """Options a built-in position scheme would silently ignore, and the position table against
    the training length. (Not part of validate_model: a model built directly may carry them.)"""
    from blocklab import registry

    p, default = m.position, PositionConfig()
    if p.name in registry.builtin_names("position"):
        for owner, options in (("rope", _ROPE_OPTIONS), ("t5_bias", _T5_OPTIONS)):
            if p.name == owner:
                continue
            for o in options:
                value = getattr(p, o)
                _check(_name(value) == _name(getattr(default, o)), f"{key}.position.{o}",
                       value, f"a {owner} option: model.position.name={p.name!r} ignores it",
                       f"leave it at {_name(getattr(default, o))!r} or use model/position={owner}")
    if m.ffn.name in registry.builtin_names("ffn") and m.ffn.name not in _GELU_FFNS:
        _check(m.ffn.approximate == "none", f"{key}.ffn.approximate", m.ffn.approximate,
               f"the GELU form: model.ffn.name={m.ffn.name!r} has no GELU",
               f"leave it at 'none' or use one of {list(_GELU_FFNS)}")
    if p.name == "rope":
        _check(p.scaling is not RopeScaling.none or p.factor == 1.0, f"{key}.position.factor",
               p.factor, "only used with position.scaling linear, ntk, yarn or llama3 (scaling "
               "is none)",
               "set model.position.scaling too, or leave factor at 1.0")
        _check(p.original_max_seq_len is None or p.original_max_seq_len >= 1,
               f"{key}.position.original_max_seq_len", p.original_max_seq_len,
               "must be null or >= 1")
        for o in ("yarn_beta_fast", "yarn_beta_slow"):
            _check(_finite(getattr(p, o)) and getattr(p, o) > 0, f"{key}.position.{o}",
                   getattr(p, o), "must be > 0")
    scheme = registry.lookup("position", p.name, f"{key}.position.name")
    limit = scheme.positions_limit(p, max_seq_len=m.max_seq_len)  # the scheme says its limit
    if limit is not None:
        _check(limit >= data.seq_len, f"{key}.max_seq_len", m.max_seq_len,
               f"the {p.name} position table must cover data.seq_len={data.seq_len}",
               f"raise {key}.max_seq_len or lower data.seq_len")


def validate_mixture(d: DataConfig, key: str = "data") -> DataConfig:
    """The synthetic mixture: task weights, distractors, curriculum, lengths, fillers and
    enough distinct keys and values for the longest sequence of every task used."""
    weights = d.tasks if isinstance(d.tasks, dict) else dataclasses.asdict(d.tasks)
    known = [f.name for f in dataclasses.fields(TaskWeights)]
    unknown = sorted(set(weights) - set(known))
    if unknown:
        raise ConfigError(f"config error: {key}.tasks.{unknown[0]}: unknown task; known: "
                          f"{', '.join(sorted(known))}")
    if not all(_finite(w) and w >= 0 for w in weights.values()) or sum(weights.values()) <= 0:
        raise _fail(f"{key}.tasks", weights, "weights must be >= 0 with a positive sum")
    used = {k for k, w in weights.items() if w}
    _check(len(d.n_distractors) == 2, f"{key}.n_distractors", d.n_distractors,
           "needs [min, max]")
    lo, hi = d.n_distractors
    _check(0 <= lo <= hi, f"{key}.n_distractors", d.n_distractors, "need 0 <= min <= max")
    stages = [list(st) for st in d.curriculum]
    _check(all(len(st) == 2 and st[0] >= 0 and st[1] >= d.min_len for st in stages)
           and stages == sorted(stages), f"{key}.curriculum", stages,
           f"needs [[from_step, max_len], ...] sorted by step, each max_len >= "
           f"min_len={d.min_len}")
    _check(8 <= d.min_len <= d.seq_len, f"{key}.min_len", d.min_len,
           f"need 8 <= min_len <= seq_len={d.seq_len}")
    if "needle" in used:
        _check(bool(d.fillers) and set(d.fillers) <= set(FILLERS), f"{key}.fillers", d.fillers,
               f"needs one or more of {', '.join(FILLERS)}")
        needed = needle_min_length(hi)
        _check(d.min_len >= needed, f"{key}.min_len", d.min_len,
               f"needle with {hi} distractors needs sequences of at least {needed} tokens")
    _check(d.n_filler >= MARKOV_MIN_FILLER, f"{key}.n_filler", d.n_filler,
           f"must be >= {MARKOV_MIN_FILLER} (the Markov filler gives each filler token "
           f"{MARKOV_MIN_FILLER} distinct successors)")
    for name in ("n_keys", "n_values"):
        _check(getattr(d, name) >= 1, f"{key}.{name}", getattr(d, name), "must be >= 1")
    for task, shortest in (("multihop", multihop_min_length(1, 1)),
                           ("counting", counting_min_length(2, 1))):
        _check(task not in used or d.min_len >= shortest, f"{key}.min_len", d.min_len,
               f"{task} needs sequences of at least {shortest} tokens")
    if d.mqar_pairs is not None:  # Zoology's layout: exactly mqar_pairs pairs per sequence
        _check(d.mqar_pairs >= 1, f"{key}.mqar_pairs", d.mqar_pairs,
               "must be null (as many pairs as fit) or >= 1")
        lo = d.mqar_min_pairs
        _check(lo is None or 1 <= lo <= d.mqar_pairs, f"{key}.mqar_min_pairs", lo,
               f"must be null or in 1..data.mqar_pairs={d.mqar_pairs}")
        shortest = mqar_min_length(d.mqar_pairs)
        _check("mqar" not in used or d.min_len >= shortest, f"{key}.min_len", d.min_len,
               f"mqar with data.mqar_pairs={d.mqar_pairs} needs sequences of at least "
               f"{shortest} tokens")
    _check(d.mqar_min_pairs is None or d.mqar_pairs is not None, f"{key}.mqar_min_pairs",
           d.mqar_min_pairs, "needs data.mqar_pairs (the Zoology layout) set")
    for task in sorted(used):
        n_k, n_v = ((d.mqar_pairs,) * 2 if task == "mqar" and d.mqar_pairs is not None
                    else distinct_ids(task, d.seq_len, hi))
        if d.n_keys < n_k or d.n_values < n_v:
            name = "n_keys" if d.n_keys < n_k else "n_values"
            raise _fail(f"{key}.{name}", getattr(d, name), f"{task} at seq_len={d.seq_len} "
                        f"needs {n_k} distinct keys and {n_v} distinct values",
                        "raise data.n_keys/n_values or lower data.seq_len")
    return d


def validate_data(d: DataConfig, tok: TokenizerConfig, key: str = "data") -> DataConfig:
    """Sizes, rates and choices of the data and tokenizer configs (files are read later, by
    the data package: missing or malformed data is a data error, exit 3)."""
    _check(d.batch_size >= 1, f"{key}.batch_size", d.batch_size, "must be >= 1")
    _check(d.seq_len >= 8, f"{key}.seq_len", d.seq_len, "must be >= 8")
    _check(d.val_batches >= 1, f"{key}.val_batches", d.val_batches, "must be >= 1")
    _check(d.pad_to_multiple is None or d.pad_to_multiple >= 1, f"{key}.pad_to_multiple",
           d.pad_to_multiple, "must be null (pad to the longest row) or >= 1")
    _check(d.num_workers >= 0, f"{key}.num_workers", d.num_workers,
           "must be >= 0 (0 = load in the main process)")
    _check(_finite(d.val_fraction) and 0 < d.val_fraction < 1, f"{key}.val_fraction",
           d.val_fraction, "must be in (0, 1)")
    _check(_finite(d.mlm_probability) and 0 < d.mlm_probability <= 1,
           f"{key}.mlm_probability", d.mlm_probability, "must be in (0, 1]")
    _one_of(f"{key}.format", d.format, DATA_FORMATS,
            "the reader of data.files; convert other formats to JSON lines or parquet")
    _one_of(f"{key}.long_documents", d.long_documents, LONG_DOCUMENTS)
    _one_of(f"{key}.utf8_errors", d.utf8_errors, UTF8_ERRORS)
    synthetic_tok = _name(tok.name) == TokenizerName.synthetic.value
    if _name(d.name) == DataName.synthetic.value:
        _check(synthetic_tok, "tokenizer.name", _name(tok.name),
               "synthetic data uses tokenizer=synthetic")
        validate_mixture(d, key)
    else:
        _check(not synthetic_tok, "tokenizer.name", _name(tok.name),
               "the synthetic vocabulary only tokenizes synthetic data",
               "use tokenizer=bpe, byte, char or file")
        validate_text_sources(d, key)
    if _name(tok.name) == TokenizerName.file.value:
        _check(bool(tok.path), "tokenizer.path", tok.path, "tokenizer=file needs a path to a "
               "tokenizer.json")
    if _name(tok.name) == TokenizerName.bpe.value:
        _check(tok.vocab_size >= 1, "tokenizer.vocab_size", tok.vocab_size, "must be >= 1")
    if _name(tok.name) in (TokenizerName.bpe.value, TokenizerName.char.value):
        _check(tok.sample_bytes >= 1, "tokenizer.sample_bytes", tok.sample_bytes, "must be >= 1")
    return d


def has_sources(d: DataConfig | None) -> bool:
    """Whether a data config names any text (``blocklab-eval``'s ``data``: none = no corpus)."""
    return d is not None and bool(d.files or d.val_files or d.corpus or d.hub_dataset)


#: data.val_split's choices besides a split name
VAL_SPLITS = ("auto", "none", "last")  # last: the held-out tail whatever the document count


def validate_text_sources(d: DataConfig, key: str = "data", *, evaluation: bool = False
                          ) -> DataConfig:
    """Where text comes from and how it is read: a corpus, files or a hub dataset (for an
    evaluation corpus, ``blocklab-eval data=``, validation files alone do), and the validation
    source (``val_files`` / ``val_split``) that replaces the held-out fraction."""
    if d.corpus:
        from blocklab import registry

        registry.lookup("corpus", d.corpus, f"{key}.corpus")
    else:
        _check(bool(d.files) or bool(d.hub_dataset) or (evaluation and bool(d.val_files)),
               f"{key}.files", list(d.files),
               "text data needs data.corpus, data.files or data.hub_dataset"
               + (" (or data.val_files)" if evaluation else ""))
    _check(d.format != "disk" or d.corpus or not d.files or len(d.files) == 1, f"{key}.files",
           list(d.files), "format=disk reads one dataset directory (saved with datasets' "
           "save_to_disk)")
    _check(d.format != "disk" or len(d.val_files) <= 1, f"{key}.val_files", list(d.val_files),
           "format=disk reads one dataset directory (saved with datasets' save_to_disk)")
    has_splits = bool(d.hub_dataset) or (d.format == "disk" and not d.corpus)
    _check(has_splits or d.hub_split == "train", f"{key}.hub_split", d.hub_split,
           f"only a hub dataset or a saved DatasetDict (format=disk) has splits; "
           f"{_source_words(d)} have none", "leave it at 'train'")
    named = d.val_split not in VAL_SPLITS
    _check(bool(d.val_split) and (not named or has_splits), f"{key}.val_split", d.val_split,
           f"auto, none, last or the name of a split of a hub dataset or a saved DatasetDict "
           f"(format=disk); {_source_words(d)} have no splits",
           "give validation files with data.val_files")
    _check(not ((named or d.val_split == "last") and d.val_files), f"{key}.val_split",
           d.val_split,
           f"data.val_files={list(d.val_files)} is the validation source already; give one")
    _one_of(f"{key}.documents", d.documents, DOCUMENT_SPLITS)
    _one_of(f"{key}.fingerprint", d.fingerprint, SOURCE_FINGERPRINTS)
    _check(d.num_proc is None or d.num_proc >= 1, f"{key}.num_proc", d.num_proc,
           "must be null (every core) or >= 1")
    _check(d.format == "text" or bool(d.text_key), f"{key}.text_key", d.text_key,
           f"{d.format} records need the name of their text column")
    return d


def _source_words(d: DataConfig) -> str:
    return (f"corpus {d.corpus}'s files" if d.corpus else
            f"data.files in format {d.format}")


def validate_optim(o: OptimConfig, key: str = "optim") -> OptimConfig:
    """Every optimizer key, whichever optimizer uses it (the defaults are valid for all)."""
    from blocklab import registry

    registry.lookup("optim", o.name, f"{key}.name")
    _check(_finite(o.lr) and o.lr > 0, f"{key}.lr", o.lr, "must be > 0")
    _check(len(o.betas) == 2, f"{key}.betas", o.betas, "needs two values [beta1, beta2]")
    _check(all(_finite(b) and 0 <= b < 1 for b in o.betas), f"{key}.betas", o.betas,
           "each beta must be in [0, 1)")
    _check(_finite(o.eps) and o.eps > 0, f"{key}.eps", o.eps, "must be > 0")
    _check(_finite(o.weight_decay) and o.weight_decay >= 0, f"{key}.weight_decay",
           o.weight_decay, "must be >= 0")
    _check(_finite(o.grad_clip) and o.grad_clip >= 0, f"{key}.grad_clip", o.grad_clip,
           "must be >= 0 (0 = off)")
    _check(_finite(o.momentum) and 0 <= o.momentum < 1, f"{key}.momentum", o.momentum,
           "must be in [0, 1)")
    _check(not (o.name == "sgd" and o.nesterov and o.momentum == 0), f"{key}.nesterov",
           o.nesterov, "Nesterov momentum needs optim.momentum > 0")
    return o


def validate_schedule(s: ScheduleConfig, key: str = "schedule") -> ScheduleConfig:
    from blocklab import registry

    registry.lookup("schedule", s.name, f"{key}.name")
    _check(s.warmup_steps >= 0, f"{key}.warmup_steps", s.warmup_steps, "must be >= 0")
    _check(_finite(s.min_lr_ratio) and 0 <= s.min_lr_ratio <= 1, f"{key}.min_lr_ratio",
           s.min_lr_ratio, "must be in [0, 1] (a fraction of optim.lr)")
    return s


def validate_trainer(t: TrainerConfig, key: str = "trainer") -> TrainerConfig:
    """Lightning's names and the run's cadences; a GPU accelerator only where there is one
    (torch is imported only then)."""
    _one_of(f"{key}.accelerator", t.accelerator, ACCELERATORS)
    _one_of(f"{key}.precision", t.precision, PRECISIONS)
    _one_of(f"{key}.strategy", t.strategy, STRATEGIES)
    for name in ("devices", "num_nodes", "max_steps", "accumulate", "val_every_steps",
                 "ckpt_every_steps", "log_every_steps"):
        _check(getattr(t, name) >= 1, f"{key}.{name}", getattr(t, name), "must be >= 1")
    _check(t.keep_checkpoints >= 0, f"{key}.keep_checkpoints", t.keep_checkpoints,
           "must be >= 0 (0 = keep all)")
    _check(t.skip_nonfinite >= 0, f"{key}.skip_nonfinite", t.skip_nonfinite,
           "must be >= 0 (0 = stop at the first non-finite step)")
    _check(t.threads is None or t.threads >= 1, f"{key}.threads", t.threads,
           "must be null (leave as is) or >= 1")
    _check(t.peak_flops is None or (_finite(t.peak_flops) and t.peak_flops > 0),
           f"{key}.peak_flops", t.peak_flops, "must be null (measured on CPU) or > 0")
    _validate_trainer_options(t, key)
    if t.accelerator == "cpu":
        _check(t.strategy != "fsdp", f"{key}.strategy", t.strategy,
               "Lightning's FSDP needs GPUs", "use trainer=model_parallel (FSDP2) on CPU")
        _check(not t.precision.startswith("transformer-engine"), f"{key}.precision",
               t.precision, "Transformer Engine needs a GPU")
    if t.accelerator in ("gpu", "cuda"):
        import torch

        _check(torch.cuda.is_available(), f"{key}.accelerator", t.accelerator,
               "no CUDA GPU is available here (torch.cuda.is_available() is False)",
               "use trainer=cpu")
        have = torch.cuda.device_count()
        _check(t.devices <= have, f"{key}.devices", t.devices,
               f"more than the {have} CUDA GPU(s) of this machine")
    if t.accelerator == "mps":
        import torch

        _check(torch.backends.mps.is_available(), f"{key}.accelerator", t.accelerator,
               "no Apple MPS device is available here", "use trainer=cpu")
    return t


#: Lightning's max_time format (its Timer callback's string form).
MAX_TIME = r"(\d+):(\d\d):(\d\d):(\d\d)"


def _validate_trainer_options(t: TrainerConfig, key: str) -> None:
    """The Lightning options reachable from the trainer group (train/callbacks.py)."""
    import re

    _check(t.max_time is None or (isinstance(t.max_time, str)
                                  and re.fullmatch(MAX_TIME, t.max_time.strip()) is not None),
           f"{key}.max_time", t.max_time, "must be null or DD:HH:MM:SS (e.g. 00:12:00:00)",
           "quote it on the command line: trainer.max_time='00:00:30:00'")
    _check(t.profiler is None or t.profiler in PROFILERS, f"{key}.profiler", t.profiler,
           f"must be null (off) or one of {', '.join(PROFILERS)}")
    _one_of(f"{key}.log_grad_norm", t.log_grad_norm, GRAD_NORMS,
            "none: off; global: one norm over every parameter; layer: also one per block")


def validate_logger(lg: LoggerConfig, key: str = "logger") -> LoggerConfig:
    """The logger by name; ``many`` names at least one other logger and never itself."""
    from blocklab import registry

    registry.lookup("logger", lg.name, f"{key}.name")
    chosen = list(lg.loggers) if lg.name == "many" else [lg.name]
    _check(bool(chosen), f"{key}.loggers", list(lg.loggers),
           "logger=many needs at least one logger", "e.g. logger.loggers=[tensorboard,wandb]")
    for name in chosen:
        _check(name not in ("many", "none") or name == lg.name, f"{key}.loggers", list(lg.loggers),
               f"{name!r} cannot be one of several loggers")
        registry.lookup("logger", name, f"{key}.loggers")
    if "wandb" in chosen:
        _one_of(f"{key}.mode", lg.mode, WANDB_MODES)
    if "tensorboard" in chosen:
        import importlib.util

        _check(bool(importlib.util.find_spec("tensorboard")
                    or importlib.util.find_spec("tensorboardX")), f"{key}.name", "tensorboard",
               "the tensorboard package is not installed",
               "pip install 'blocklab[tensorboard]'")
    return lg


def validate_callbacks(callbacks: dict[str, Any], key: str = "callbacks") -> dict[str, Any]:
    """Each callback by its registered name, its options a mapping; a callback with a
    ``check(options, key)`` states its own rules (train/callbacks.py)."""
    from blocklab import registry

    for name, options in callbacks.items():
        component = registry.lookup("callback", name, f"{key}.{name}")
        _check(options is None or isinstance(options, dict), f"{key}.{name}", options,
               "must be a mapping of that callback's options (or {})")
        check = getattr(component, "check", None)
        if check is not None:
            check(dict(options or {}), f"{key}.{name}")
    return callbacks


def validate_train(tc: TrainConfig) -> TrainConfig:
    """Every key of a composed training config, before any data is read, any model built or
    any file written; returns it unchanged. ``model.vocab_size`` may still be null here (the
    tokenizer decides; training checks it against the tokenizer once that is built)."""
    validate_model(dataclasses.replace(
        tc.model, vocab_size=1 if tc.model.vocab_size is None else tc.model.vocab_size))
    validate_data(tc.data, tc.tokenizer)
    _validate_position_options(tc.model, tc.data)
    if tc.data.packing:  # the family's objective says whether it packs rows
        from blocklab import registry

        objective = registry.lookup("objective", tc.model.family.name, "model.family.name")
        _check(getattr(objective, "packs", False), "data.packing", True,
               f"the {tc.model.family.name} objective does not pack documents into rows",
               "packing is for decoders (causal LM)")
    validate_optim(tc.optim)
    validate_schedule(tc.schedule)
    validate_trainer(tc.trainer)
    validate_logger(tc.logger)
    validate_callbacks(tc.callbacks)
    for key in ("probes", "checkpoint_probes"):
        validate_run_probe_spec(getattr(tc, key), tc, key)
    return tc


def validate_run_probe_spec(spec: ProbeSpec, tc: TrainConfig, key: str = "probes") -> ProbeSpec:
    """A probe spec for the model of training run ``tc`` (its config when training, the stored
    one for a checkpoint): the run's tokenizer decides the builder, a synthetic run's data how
    many distinct keys and values the probes may draw."""
    synthetic = _name(tc.tokenizer.name) == TokenizerName.synthetic.value
    data = tc.data if _name(tc.data.name) == DataName.synthetic.value else None
    return validate_probe_spec(spec, key, synthetic=synthetic, data=data)


#: blocklab-eval's run_data: which data the validation loss is computed on (eval/rundata.py).
RUN_DATA = ("auto", "true", "false")


def validate_eval(cfg: EvalConfig) -> EvalConfig:
    """``blocklab-eval``'s own keys and its probe spec (checked again, against the run's
    vocabulary, once the checkpoint is known: :func:`validate_probe_spec` with ``data``)."""
    if (cfg.ckpt is None) == (cfg.hf_model is None):
        raise ConfigError(f"config error: ckpt={cfg.ckpt!r}, hf_model={cfg.hf_model!r}: give "
                          "exactly one (a blocklab run/checkpoint, or a Hugging Face model dir)")
    _check(cfg.hf_gguf is None or cfg.hf_model is not None, "hf_gguf", cfg.hf_gguf,
           "a GGUF file inside hf_model; only with hf_model")
    for name in ("val_batches", "batch_size"):
        value = getattr(cfg, name)
        _check(value is None or value >= 1, name, value,
               "must be null (the run's data." + name + ") or >= 1")
    cfg.run_data = str(cfg.run_data).lower()  # true / false arrive as "True" / "False"
    _one_of("run_data", cfg.run_data, RUN_DATA, "auto: the run's data where that opens no "
            "file (synthetic); true: read the run's recorded text sources; false: no loss")
    if has_sources(cfg.data):
        _check(cfg.hf_model is None, "data", _name(cfg.data.name),
               "the loss on another corpus is for blocklab checkpoints (ckpt=), not hf_model")
        _check(_name(cfg.data.name) == DataName.text.value, "data.name", _name(cfg.data.name),
               "blocklab-eval data= evaluates on text (data=text_files and data.files / "
               "data.val_files)", "a synthetic run's own data is its validation loss (run_data)")
        validate_text_sources(cfg.data, evaluation=True)
        _one_of("data.format", cfg.data.format, DATA_FORMATS)
        _one_of("data.utf8_errors", cfg.data.utf8_errors, UTF8_ERRORS)
    validate_probe_spec(cfg.probes, "probes", synthetic=False if cfg.hf_model else None)
    return cfg


_DEVICE = re.compile(r"auto|cpu|mps|cuda(:\d+)?")


def validate_generate(cfg: GenerateConfig) -> GenerateConfig:
    """``blocklab-generate``'s keys, before the checkpoint is read: one source of prompts,
    sampling knobs in range (``temperature=0`` is greedy; ``top_k`` 0 / null and ``top_p`` 1 /
    null are off), a device torch can name."""
    _check(bool(cfg.ckpt), "ckpt", cfg.ckpt, "required (a run directory, a checkpoint "
           "directory or a blocklab-import output)")
    _check(cfg.prompt is None or cfg.prompt_file is None, "prompt_file", cfg.prompt_file,
           "give prompt or prompt_file, not both")
    for key in ("prompt", "prompt_file"):
        _check(not cfg.interactive or getattr(cfg, key) is None, key, getattr(cfg, key),
               f"interactive=true reads the prompts from stdin, one a line; drop {key}")
    _check(isinstance(cfg.max_new_tokens, int) and cfg.max_new_tokens >= 1, "max_new_tokens",
           cfg.max_new_tokens, "must be an int >= 1")
    _check(_finite(cfg.temperature) and cfg.temperature >= 0, "temperature", cfg.temperature,
           "must be a finite number >= 0 (0 = greedy)")
    _check(cfg.top_k is None or cfg.top_k >= 0, "top_k", cfg.top_k, "must be null or >= 0 "
           "(0 or null = off)")
    _check(cfg.top_p is None or (_finite(cfg.top_p) and 0 < cfg.top_p <= 1), "top_p", cfg.top_p,
           "must be null or in (0, 1] (1 or null = off)")
    _check(cfg.seed is None or 0 <= cfg.seed < 2**63, "seed", cfg.seed,
           "must be null (a fresh random seed) or an int >= 0")
    _check(cfg.num_samples >= 1, "num_samples", cfg.num_samples, "must be >= 1")
    _check(_DEVICE.fullmatch(str(cfg.device)) is not None, "device", cfg.device,
           "one of auto, cpu, cuda, cuda:N, mps")
    _check(cfg.threads is None or cfg.threads >= 1, "threads", cfg.threads,
           "must be null (torch's default) or >= 1")
    return cfg
