"""A stored config is data, never instructions.

A checkpoint (or an imported model, or a run directory) may come from someone else. Its config
is read back as plain data: :func:`stored_config` is the one way such data becomes a
:class:`TrainConfig` — refused if it holds an interpolation or a ``_target_``
(:func:`refuse_instructions`), merged onto today's schema (unknown keys and wrong types
refused), never resolved, never instantiated. :func:`check_copies` refuses readable copies
(``config.yaml``, ``meta.json``, ``tokenizer.json``) that say something else than the state
that runs. A config written by an earlier layout is migrated here, once, on read
(config/migrate.py: softmax's options moved from ``model.attention`` to ``model.mixer``, the
options no mixer in use reads dropped), said in one line when a value that mattered moved.
Errors are :class:`CheckpointError` (exit code 4). Torch-free.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from blocklab.config import migrate
from blocklab.config.schema import TrainConfig
from blocklab.errors import CheckpointError
from blocklab.provenance import config_diff

MAX_VALUES = 1_000_000  # values a stored config may hold (a crafted one could share subtrees)
UNREAD = ("rng", "rng_ranks", "tokenizer", "carry")  # metadata meta.json leaves out (tensors)


def stored_config(config: Any, where: str) -> TrainConfig:
    """``config`` (plain data read from ``where``) as a checked :class:`TrainConfig`."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    if not isinstance(config, dict):
        raise CheckpointError(f"{where}: no stored config (refused)")
    refuse_instructions(config, where)
    old = migrate.migrate_stored(config)
    if old is not None:
        config, notes = old
    try:
        tc = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(TrainConfig), config))
    except OmegaConfBaseException as e:
        key = getattr(e, "full_key", None) or "?"
        raise CheckpointError(f"{where}: config.{key}: {str(e).splitlines()[0]} (the stored "
                              "config does not fit this blocklab's schema)") from None
    if old is not None:
        notes += migrate.finish(tc.model)
        if notes:
            print(f"note: {where}: a config written by an earlier blocklab, migrated on read: "
                  f"{'; '.join(notes)}", file=sys.stderr)
    return tc


def refuse_instructions(data: Any, where: str, prefix: str = "config") -> None:
    """Refuse an interpolation (``${...}``: OmegaConf would resolve it — read an environment
    variable or another key, call a resolver) or a ``_target_`` (what Hydra would instantiate)
    anywhere in ``data``, naming the first such dotted key. Nothing is resolved, so the value
    it would have resolved to is never read, let alone shown."""
    todo, seen = [(prefix, data)], 0
    while todo:
        key, value = todo.pop()
        seen += 1
        if seen > MAX_VALUES:
            raise CheckpointError(f"{where}: {prefix}: more than {MAX_VALUES:,} values (refused)")
        if isinstance(value, dict):
            for k in value:
                if str(k) == "_target_" or "${" in str(k):
                    raise CheckpointError(f"{where}: {key}.{k}: {_rule(str(k))}")
            todo += [(f"{key}.{k}", v) for k, v in reversed(value.items())]
        elif isinstance(value, list | tuple):
            todo += [(f"{key}[{i}]", v) for i, v in reversed(list(enumerate(value)))]
        elif isinstance(value, str) and "${" in value:
            shown = value if len(value) <= 60 else value[:57] + "..."
            raise CheckpointError(f"{where}: {key}={shown!r}: {_rule(value)}")


def _rule(what: str) -> str:
    kind = "'_target_' (an instantiation)" if what == "_target_" else "an interpolation"
    return (f"{kind} in a stored config; a stored config is data, never resolved or "
            "instantiated (refused: was it edited?)")


def check_copies(where: str, meta: dict[str, Any], texts: dict[str, str]) -> None:
    """The readable copies of a checkpoint (``texts``: file name -> content) against the
    metadata in its state (``meta``, the one that runs); refused naming the first differing
    keys when they disagree (edited, manifest re-hashed): what a user reads is what runs."""
    import yaml

    copies: dict[str, Any] = {}
    try:
        if texts.get("config.yaml") or meta.get("config_yaml"):
            copies["config.yaml"] = yaml.safe_load(texts.get("config.yaml", ""))
        readable = json.loads(texts["meta.json"]) if "meta.json" in texts else None
        if readable is not None:
            copies["meta.json"] = readable.get("config")
    except (yaml.YAMLError, ValueError, AttributeError) as e:
        raise CheckpointError(f"{where}: a readable copy is unreadable "
                              f"({str(e).splitlines()[0]})") from None
    for name, copy in copies.items():
        refuse_instructions(copy, f"{where}: {name}")
        diff = config_diff(copy if isinstance(copy, dict) else {}, meta["config"])
        if diff:
            shown = "; ".join(f"{k}: {a!r} in {name}, {b!r} in state.pt" for k, a, b in diff[:3])
            raise CheckpointError(f"{where}: {name} disagrees with the config in state.pt (the "
                                  f"one that runs) at {len(diff)} key(s): {shown} "
                                  "(refused: edited after it was saved?)")
    if readable is not None:
        keys = _differing(readable_meta(meta), readable)
        if keys:
            raise CheckpointError(f"{where}: meta.json disagrees with state.pt at "
                                  f"{', '.join(keys)} (refused: edited after it was saved?)")
    if "tokenizer.json" in texts and texts["tokenizer.json"] != meta.get("tokenizer", ""):
        raise CheckpointError(f"{where}: tokenizer.json differs from the tokenizer in state.pt "
                              "(refused: edited after it was saved?)")


def readable_meta(meta: dict[str, Any]) -> dict[str, Any]:
    """The metadata meta.json holds (the RNG state and the tokenizer are elsewhere)."""
    return {k: v for k, v in meta.items() if k not in UNREAD}


def _differing(mine: dict[str, Any], theirs: Any) -> list[str]:
    def canon(v: Any) -> str:
        return json.dumps(v, sort_keys=True, default=str)

    theirs = theirs if isinstance(theirs, dict) else {}
    return sorted(k for k in set(mine) | set(theirs) if canon(mine.get(k)) != canon(theirs.get(k)))
