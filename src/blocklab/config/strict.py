"""Strict keys: a composed config holds only keys its schema declares.

Hydra composes YAML onto the schema dataclasses in struct mode, so neither a config file nor a
plain ``key=value`` override can add a key. A ``+key=value`` (or ``++key=value``) override can:
Hydra force-adds it, which is meant for free-form configs. Every blocklab config is schema, so
such a key would be kept and silently ignored (``+model.n_layer=3`` training the 2-layer model).
:func:`check_keys` walks a composed config against its schema and refuses the first undeclared
key in one line naming it and the closest known key. The places open on purpose are the
free-form mappings of the schema (fields typed ``dict[str, Any]`` or ``Any``: today
``model.mixer``, the options of the mixers in use, read by config/mixer_options.py at
validation), and Hydra's own ``hydra`` node; nothing below them is checked here.

:class:`SweepCheck` (a Hydra callback, ``hydra.callbacks`` in ``configs/train.yaml``) applies
the same rules, and Hydra's own rule for group options, to a sweep before its first job or
directory exists."""

from __future__ import annotations

import dataclasses
import difflib
import functools
import sys
import types
import typing
from collections.abc import Iterator, Sequence
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from blocklab.config.checks import _fail
from blocklab.errors import ConfigError

HIDDEN_OPTIONS = ("schema",)  # structured-config bases in the groups, not choices for users


# ------------------------------------------------------------------------- the schema's keys


def _unwrap(tp: Any) -> Any:
    """``X | None`` -> ``X``; other types as they are."""
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return args[0] if len(args) == 1 else Any
    return tp


@functools.cache
def _fields(schema: type) -> dict[str, Any]:
    """Field name -> resolved type of a schema dataclass."""
    hints = typing.get_type_hints(schema)
    return {f.name: _unwrap(hints[f.name]) for f in dataclasses.fields(schema)}


def _is_open(tp: Any) -> bool:
    """A free-form mapping: any key may be added below it."""
    if tp is Any:
        return True
    origin = typing.get_origin(tp) or tp
    if origin is dict:
        args = typing.get_args(tp)
        return not args or not dataclasses.is_dataclass(_unwrap(args[1]))
    return False


def _node_type(schema: type, path: str) -> Any:
    """The schema type at dotted ``path`` (None: no such key; Any: inside an open place)."""
    tp: Any = schema
    for part in path.split(".") if path else []:
        if _is_open(tp):
            return Any
        if dataclasses.is_dataclass(tp):
            tp = _fields(tp).get(part)
        elif typing.get_origin(tp) is dict:  # a mapping of schema dataclasses: any name
            tp = _unwrap(typing.get_args(tp)[1])
        else:
            return None
        if tp is None:
            return None
    return tp


@functools.cache
def known_keys(schema: type, prefix: str = "") -> tuple[str, ...]:
    """Every dotted key the schema declares (open places end the walk)."""
    out: list[str] = []
    for name, tp in _fields(schema).items():
        out.append(prefix + name)
        if dataclasses.is_dataclass(tp):
            out.extend(known_keys(tp, f"{prefix}{name}."))
    return tuple(out)


def open_keys(schema: type, prefix: str = "") -> list[str]:
    """The open places of a schema (for the docs: keys below them are the user's)."""
    out: list[str] = []
    for name, tp in _fields(schema).items():
        if _is_open(tp):
            out.append(prefix + name)
        elif dataclasses.is_dataclass(tp):
            out.extend(open_keys(tp, f"{prefix}{name}."))
    return out


# What other frameworks (nanoGPT, Hugging Face, litgpt, Lightning) call a blocklab key: no
# spelling distance finds ``lr`` from ``learning_rate``.
SYNONYMS = {"learning_rate": "lr", "n_layer": "n_layers", "num_layers": "n_layers",
            "num_hidden_layers": "n_layers", "n_head": "n_heads", "num_heads": "n_heads",
            "num_attention_heads": "n_heads", "n_embd": "d_model", "hidden_size": "d_model",
            "intermediate_size": "d_ff", "block_size": "max_seq_len",
            "max_position_embeddings": "max_seq_len", "context_length": "max_seq_len",
            "max_iters": "max_steps", "gradient_accumulation_steps": "accumulate",
            "accumulate_grad_batches": "accumulate", "warmup_iters": "warmup_steps",
            "micro_batch_size": "batch_size", "gradient_clip_val": "grad_clip"}


def closest(path: str, schema: type | None) -> str | None:
    """The known key a typo most likely meant: a close sibling (``model.n_layer`` ->
    ``model.n_layers``; other frameworks' names by :data:`SYNONYMS`), else the same name
    elsewhere (``trainer.lr`` -> ``optim.lr``), else a close dotted key."""
    if schema is None:
        return None
    parent, _, leaf = path.rpartition(".")
    if leaf in SYNONYMS:
        leaf = SYNONYMS[leaf]
        path = f"{parent}.{leaf}" if parent else leaf
    tp = _node_type(schema, parent)
    if dataclasses.is_dataclass(tp):
        near = difflib.get_close_matches(leaf, list(_fields(tp)), n=1, cutoff=0.6)
        if near:
            return f"{parent}.{near[0]}" if parent else near[0]
    every = known_keys(schema)
    same = [k for k in every if k.rpartition(".")[2] == leaf]
    if same:
        return max(same, key=lambda k: difflib.SequenceMatcher(None, k, path).ratio())
    near = difflib.get_close_matches(path, every, n=1, cutoff=0.75)
    return near[0] if near else None


def key_problem(path: str, schema: type | None) -> str | None:
    """Why ``path`` is not a key of ``schema`` (the rule and hint of the one-line error), or
    None when it is one (or lies in an open place, or no schema is known)."""
    if schema is None or path.split(".")[0] == "hydra":
        return None
    if _node_type(schema, path) is not None:
        return None
    from blocklab.config.migrate import renamed

    if new := renamed(path):
        return f"{path} is now {new} (a softmax option)"
    parts = path.split(".")
    first = next(i for i in range(1, len(parts) + 1)
                 if _node_type(schema, ".".join(parts[:i])) is None)
    unknown = ".".join(parts[:first])
    rule = "not a config key" if unknown == path else f"{unknown} is not a config key"
    hint = closest(unknown, schema)
    return f"{rule}; did you mean {hint}?" if hint else f"{rule}; --cfg job lists every key"


# ------------------------------------------------------------------------ a composed config


def _extra(node: Any, tp: Any, path: str) -> Iterator[tuple[str, Any]]:
    """(dotted key, value) of every key under ``node`` that schema type ``tp`` lacks."""
    if _is_open(tp) or tp is None:
        return
    if dataclasses.is_dataclass(tp) and isinstance(node, dict):
        fields = _fields(tp)
        for key, value in node.items():
            if key not in fields:
                yield f"{path}{key}", value
            else:
                yield from _extra(value, fields[key], f"{path}{key}.")
        return
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is dict and args and isinstance(node, dict):
        for key, value in node.items():
            yield from _extra(value, _unwrap(args[1]), f"{path}{key}.")
    elif origin is list and args and isinstance(node, list):
        for i, value in enumerate(node):
            yield from _extra(value, _unwrap(args[0]), f"{path}{i}.")


def _first_leaf(key: str, value: Any) -> tuple[str, Any]:
    """``data={'files': [...]}`` -> ``('data.files', [...])``: name what the user typed."""
    while isinstance(value, dict) and len(value) == 1:
        (k, value), = value.items()
        key = f"{key}.{k}"
    return key, value


def check_keys(cfg: DictConfig | dict, schema: type | None = None) -> None:
    """Refuse the first key of a composed config that its schema (default: the config's own
    structured type) does not declare: ``config error: model.n_layer=3: not a config key; did
    you mean model.n_layers?``."""
    if schema is None:
        schema = OmegaConf.get_type(cfg) if isinstance(cfg, DictConfig) else None
    if schema is None or not dataclasses.is_dataclass(schema):
        return
    tree = OmegaConf.to_container(cfg, resolve=False) if isinstance(cfg, DictConfig) else cfg
    tree = {k: v for k, v in tree.items() if k != "hydra"}  # Hydra's own: open on purpose
    for key, value in _extra(tree, schema, ""):
        leaf, value = _first_leaf(key, value)
        raise _fail(leaf, value, key_problem(leaf, schema) or "not a config key")


# ---------------------------------------------------------------------------------- sweeps


def option_problem(group: str, option: str, options: Sequence[str]) -> str | None:
    """Why ``option`` is not one of a config group's ``options`` (None: it is)."""
    shown = [o for o in options if o not in HIDDEN_OPTIONS]
    if option in shown:
        return None
    near = difflib.get_close_matches(option, shown, n=1, cutoff=0.6)
    hint = f"did you mean {near[0]}? " if near else ""
    return f"not an option of {group}; {hint}options: {', '.join(sorted(shown)) or '(none)'}"


class SweepCheck(Callback):
    """A sweep's keys and group options checked before its first job (or directory): every
    job of a sweep has the same keys, so one bad key would fail every job one by one. Hydra
    turns a callback's exceptions into warnings, so a refusal is printed here and ends the
    command (exit 2) -- this callback runs only under the command line's multirun."""

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        try:
            self.check(config)
        except ConfigError as e:
            print(e, file=sys.stderr)
            raise SystemExit(e.exit_code) from None

    @staticmethod
    def check(config: DictConfig) -> None:
        from hydra.core.global_hydra import GlobalHydra
        from hydra.core.override_parser.overrides_parser import OverridesParser

        schema = OmegaConf.get_type(config)
        check_keys(config, schema)  # the sweep's fixed overrides are applied already
        groups = {k.split("@")[0] for k in config.hydra.runtime.choices}
        loader = GlobalHydra.instance().config_loader()
        task = list(config.hydra.overrides.task)
        for o in OverridesParser.create().parse_overrides(task):
            if not o.is_sweep_override() or o.is_hydra_override():
                continue
            name = o.key_or_group
            if name in groups or "/" in name or o.package is not None:
                if o.is_choice_sweep():
                    options = loader.get_group_options(name)
                    for option in o.sweep_string_iterator():
                        problem = option_problem(name, option, options)
                        if problem:
                            raise ConfigError(f"config error: {o.input_line}: {option!r} is "
                                              f"{problem}")
            elif not o.is_delete():
                problem = key_problem(name, schema)
                if problem:
                    raise ConfigError(f"config error: {o.input_line}: {problem}")
