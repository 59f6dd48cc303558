"""Configs written before each mixer owned its options, read by this blocklab.

Earlier versions kept softmax's window, layer pattern, score scale and dropout under
``model.attention`` and gave ``model.mixer`` the union of every built-in mixer's options.
Today they are the options of the mixers that read them (config/mixer_options.py):
``model.attention.window`` is ``model.mixer.window``. A stored config (a run's or a
checkpoint's ``config``, config/stored.py) and a run's recorded overrides (train/resume.py) are
migrated once, on read, with one line saying so when a value that mattered moved or was
dropped; the old union's keys of mixers not in use are dropped (silently at their old
defaults: every old config carries them). :func:`legacy_layout` is the inverse, so the
architecture and config hashes of an unchanged model stay what earlier versions recorded.
Torch-free."""

from __future__ import annotations

import copy
from typing import Any

from blocklab.config.model_schema import MIXER_CHOICE_KEYS, MIXER_FREE_KEY, ModelConfig

#: softmax's options that lived under ``model.attention``, with their old defaults
MOVED: dict[str, Any] = {"dropout": 0.0, "scale": None, "window": None, "global_every": 0,
                         "layers": []}
#: the old ``model.mixer`` union's options, with their old defaults
UNION: dict[str, Any] = {"feature_map": "elu", "feature_dim": 16, "short_conv": 0,
                         "chunk": 64, "long_conv": True, "d_state": 16, "expand": 2,
                         "d_conv": 4, "dt_rank": None, "scan": "auto", MIXER_FREE_KEY: {}}
#: options added to the mixers' yamls since the hashes were recorded, with their defaults: left
#: out of the hashed layout at their defaults, so an unchanged model keeps its hash (issue 44:
#: softmax attention's patterns, linear attention's FAVOR+ options)
ADDED: dict[str, Any] = {"sinks": 0, "learned_sink": False, "attention_chunk": None,
                         "global_tokens": 0, "random_blocks": 0, "block_size": 16,
                         "pattern_seed": 0, "global_token_id": None,
                         "global_rope": True, "global_temperature": 0.0,
                         "temperature_floor": 8192,
                         "n_features": 64, "orthogonal": True, "redraw_every": 0,
                         "feature_seed": 0,
                         "mem_len": 0, "eval_mem_len": None, "compress_ratio": 0,
                         "compress_len": None, "compress_kind": "conv", "compress_loss": 1.0,
                         "qk_norm": None, "qk_norm_scope": "head", "softcap": None}

#: data keys and task weights added since the hashes were recorded: left out at their defaults
DATA_ADDED: dict[str, Any] = {"user_tasks": {}, "listops_gap": 0, "segment_mode": "none",
                               "doc_len": None, "babilong_tasks": ["qa1"],
                               "babilong_depth": [0.0, 1.0], "babilong_facts": None,
                               "haystack": "shakespeare"}
#: trainer and (top-level) model keys added since, likewise (issue 45: memory across segments)
TRAINER_ADDED: dict[str, Any] = {"bptt": 1}
MODEL_ADDED: dict[str, Any] = {"memory_tokens": 0, "init": None, "embed_init_std": None,
                               "logit_softcap": None}
#: optimizer keys added since (issue 47: training stability)
OPTIM_ADDED: dict[str, Any] = {"weight_decay_mode": "coupled", "z_loss": 0.0}
TASKS_ADDED: dict[str, Any] = {"listops": 0.0}


def renamed(key: str) -> str | None:
    """The key an old dotted key is now (``model.attention.window`` -> ``model.mixer.window``),
    or None."""
    head, _, leaf = key.rpartition(".")
    if head in ("model.attention", "attention") and leaf in MOVED:
        return f"{head.removesuffix('attention')}mixer.{leaf}"
    return None


def is_old(model: Any) -> bool:
    """A model config in the old layout (every old one holds ``attention.window`` & co)."""
    attention = model.get("attention") if isinstance(model, dict) else None
    return isinstance(attention, dict) and any(k in attention for k in MOVED)


def move_keys(model: dict[str, Any]) -> list[str]:
    """Move softmax's options from ``attention`` to ``mixer`` in a plain model config, in
    place; return what moved away from its old default (``model.attention.window=64``)."""
    if not is_old(model):
        return []
    attention, notes = model["attention"], []
    mixer = model.setdefault("mixer", {})
    for option, default in MOVED.items():
        if option in attention:
            value = attention.pop(option)
            mixer.setdefault(option, value)
            if value != default:
                notes.append(f"model.attention.{option}={value!r} is now model.mixer.{option}")
    return notes


def drop_unread(m: ModelConfig, family: Any) -> list[str]:
    """Drop the options no mixer in use reads from a migrated model config (in place); return
    those that were away from their old defaults (the old run ignored them too)."""
    from blocklab.config.mixer_options import _reads, in_use

    reads = {o for mixer, r in in_use(m, family).values() for o in _reads(mixer, r)}
    free = any(getattr(mixer, "options", None) is None for mixer, _ in in_use(m, family).values())
    notes = []
    for option in list(m.mixer):
        if option in MIXER_CHOICE_KEYS or option in reads or (option == MIXER_FREE_KEY and free):
            continue
        value = m.mixer.pop(option)
        old = MOVED.get(option, UNION.get(option))
        if value != old:
            notes.append(f"model.mixer.{option}={value!r} dropped (no mixer in use reads it)")
    return notes


def migrate_stored(config: dict[str, Any]) -> tuple[dict[str, Any], list[str]] | None:
    """A stored training config in the old layout moved to today's (a copy) with the notes
    worth a line, or None when it is not old. Dropping unread options needs the mixers in use:
    :func:`finish` does it on the checked config."""
    if not isinstance(config, dict) or not is_old(config.get("model")):
        return None
    config = copy.deepcopy(config)
    return config, move_keys(config["model"])


def finish(m: ModelConfig) -> list[str]:
    """Drop what no mixer in use reads from a migrated model config (names checked first)."""
    from blocklab import registry

    try:
        family = registry.lookup("family", m.family.name, "model.family.name")
        return drop_unread(m, family)
    except Exception:
        return []


def migrate_override(override: str) -> str:
    """A recorded override of an old key as today's: ``model.attention.window=64`` ->
    ``++model.mixer.window=64`` (``++``: set or add, whichever mixer file was chosen)."""
    key, eq, value = override.partition("=")
    new = renamed(key.lstrip("+~"))
    if not eq or new is None or key.startswith("~"):
        return override
    return f"++{new}={value}"


def legacy_layout(model: dict[str, Any]) -> dict[str, Any]:
    """A plain model config (today's layout) in the layout earlier versions hashed: softmax's
    options back under ``attention`` and the old union's keys at their old defaults where
    unset -- so an unchanged model keeps its ``arch_hash`` / ``config_hash``."""
    out = copy.deepcopy(model)
    mixer, attention = out.setdefault("mixer", {}), out.setdefault("attention", {})
    for option, default in MOVED.items():
        attention[option] = mixer.pop(option, default)
    for option, default in UNION.items():
        mixer.setdefault(option, copy.deepcopy(default))
    for option, default in ADDED.items():
        if option in mixer and mixer[option] == default:
            del mixer[option]
    for key, default in MODEL_ADDED.items():
        if key in out and out[key] == default:
            del out[key]
    return out


def legacy_config(config: dict[str, Any]) -> dict[str, Any]:
    """A plain training config with its model in :func:`legacy_layout`, and without keys added
    since that are at their default (``data.user_tasks: {}``, ``data.listops_gap: 0``, a new
    task's weight 0, ``data.segment_mode: none``, the ``data=babilong`` keys at their defaults,
    ``trainer.bptt: 1``): an unchanged run keeps
    the config hash earlier versions recorded."""
    data = config.get("data")
    if isinstance(data, dict):
        data = {k: v for k, v in data.items() if DATA_ADDED.get(k, ...) != v}
        tasks = data.get("tasks")
        if isinstance(tasks, dict):  # task weights added since, at 0
            data["tasks"] = {k: v for k, v in tasks.items() if TASKS_ADDED.get(k, ...) != v}
        config = {**config, "data": data}
    optim = config.get("optim")
    if isinstance(optim, dict):
        config = {**config, "optim": {k: v for k, v in optim.items()
                                      if OPTIM_ADDED.get(k, ...) != v}}
    trainer = config.get("trainer")
    if isinstance(trainer, dict):
        config = {**config, "trainer": {k: v for k, v in trainer.items()
                                        if TRAINER_ADDED.get(k, ...) != v}}
    if not isinstance(config.get("model"), dict):
        return config
    return {**config, "model": legacy_layout(config["model"])}


def legacy_override(override: str) -> str:
    """An override as earlier versions spelled it (``model.mixer.window=16`` ->
    ``model.attention.window=16``): the repro experiments' run keys hash that spelling."""
    key, eq, value = override.partition("=")
    head, _, leaf = key.rpartition(".")
    if eq and head.lstrip("+") == "model.mixer" and leaf in MOVED:
        return f"model.attention.{leaf}={value}"
    return override
