"""``resume=<run or checkpoint>``: the resumed run's config is the run's own.

The base is the checkpoint's stored config, read once through the one stored-config reader
(``checkpoint.read`` -> ``config.stored``: plain data merged onto the schema, interpolations and
``_target_`` refused, nothing resolved or instantiated). The command line's overrides go on top
as a *difference*: the training config is composed twice, once with the run's own overrides
(``overrides`` in the checkpoint's metadata) and once with those plus the new ones, and only the
keys that differ between the two are set on the stored config. So ``resume=<run>`` alone
continues the run exactly as it was configured (whatever the shipped config files or the
default experiment say today), a key override changes that key, and a group override
(``trainer=ddp``) changes what the group changes *in the run's own composition*. A run without
recorded overrides (an older run, or one trained from Python) is resumed the same way with an
empty list: its stored config is still the base. From Python, ``train(compose("train",
["resume=...", ...]))`` passes no command line: its difference is taken from the defaults.

The result is then checked against the checkpoint as always (:func:`check_resume`):
architecture changes refused listing every key, bookkeeping changes allowed, anything else
warned that the run is no longer exactly the uninterrupted one; a changed data or tokenizer
fingerprint is refused, saying what changed and how to continue on the run's own data.
"""

from __future__ import annotations

import contextlib
import functools
import re
import sys
from typing import Any

from omegaconf import DictConfig, OmegaConf, open_dict

from blocklab import checkpoint as ckpt
from blocklab.config import ConfigError
from blocklab.config.migrate import migrate_override
from blocklab.config.stored import refuse_instructions
from blocklab.provenance import config_diff, is_bookkeeping
from blocklab.runlock import run_lock, writable_dir

#: Keys that say where the data is read or kept, not what it is: a change that leaves the data
#: and tokenizer fingerprints equal (the same files named another way) changes nothing.
DATA_PATHS = ("data.files", "data.val_files", "data.cache_dir", "tokenizer.path")
ABSENT = "<absent>"  # what config_diff reports for a key missing on one side
NOT_COMPOSED = ("resume",)  # never carried over from the run's overrides


def open_target(resume: str, owner: contextlib.ExitStack, *, child: bool) -> ckpt.Loaded:
    """The checkpoint ``resume`` names, read once. A resume owns its run directory first (a DDP
    child process: rank 0 does), then puts back what a save killed between its renames moved
    aside — and only then chooses the checkpoint, so the newest intact state is resumed. The
    whole state is kept (``Loaded.take_state``): the training restores from it, not from a
    second read."""
    run_dir = ckpt.run_dir_of(resume)
    if not run_dir.is_dir():
        raise ckpt.CheckpointError(f"checkpoint {resume}: no such file or directory")
    if not child:
        owner.enter_context(run_lock(writable_dir(run_dir, "run directory"), "resume"))
        ckpt.clean_partial(run_dir)
    # verified, its stored config checked as data; its whole state kept for Lightning's restore
    return ckpt.read(resume, full=True)


def resumed_config(cfg: DictConfig, overrides: list[str] | None, loaded: ckpt.Loaded
                   ) -> tuple[DictConfig, list[str]]:
    """(the config the resumed run trains with, the overrides it records): the checkpoint's
    stored config with the command line's difference on top (see the module docstring).
    ``cfg`` is what the command line composed; ``overrides`` its overrides (None from Python:
    the difference is then ``cfg``'s from the defaults)."""
    where = f"checkpoint {loaded.path}"
    orig = stored_overrides(loaded.meta, where)
    if overrides is None:
        delta = config_diff(_composed([], where), _plain(cfg))
        recorded = orig
    else:
        new = [o for o in overrides if _key(o)[0] not in NOT_COMPOSED]
        recorded = merge_overrides(orig, new)
        delta = _delta(orig, new, where)
    relocate_stored(loaded, {k for k, _, _ in delta})
    base = OmegaConf.structured(loaded.config)  # plain stored data: nothing to resolve
    apply_delta(base, [d for d in delta if d[0] not in NOT_COMPOSED])
    with open_dict(base):
        base.resume = str(cfg.resume)
    return base, recorded


def relocate_stored(loaded: ckpt.Loaded, command_line: set[str]) -> None:
    """The run's stored relative data and tokenizer paths that are missing from this working
    directory, resolved against the directory the run was started in (data/relocate.py; each
    said on stderr) -- in ``loaded.config`` itself, so the stored config and the resumed one
    agree: the same files, no change to warn about. Keys the command line sets are its own; a
    stored source found nowhere is refused naming the override that fixes it."""
    from blocklab.data.relocate import relocate, run_origin

    c = loaded.config
    r = relocate(c.data, c.tokenizer, run_origin(loaded.meta, loaded.run_dir), "resume",
                 frozenset(command_line))
    c.data, c.tokenizer = r.data, r.tokenizer
    for note in r.notes:
        print(note, file=sys.stderr)


def stored_overrides(meta: dict[str, Any], where: str) -> list[str]:
    """The overrides the checkpoint's config was composed with (none recorded: ``[]``),
    checked as data: no interpolation, no ``_target_``, no Hydra setting (they are composed
    again, and composing must not read the environment or another config directory)."""
    orig = meta.get("overrides") or []
    if not isinstance(orig, list) or not all(isinstance(o, str) for o in orig):
        raise ckpt.CheckpointError(f"{where}: overrides: not a list of strings (refused)")
    refuse_instructions(orig, where, "overrides")
    for i, o in enumerate(orig):
        if "_target_" in o or _key(o)[0].startswith(("hydra.", "hydra/")):
            raise ckpt.CheckpointError(f"{where}: overrides[{i}]={o!r}: an instantiation or a "
                                       "Hydra setting in a stored override (refused: edited?)")
        if _names_a_file(o):
            raise ckpt.CheckpointError(f"{where}: overrides[{i}]={o!r}: a stored override may "
                                       "name a config group's option, never a file by its path "
                                       "(no '..', no absolute path; refused: edited?)")
    moved = [migrate_override(o) for o in orig]
    changed = [f"{o} -> {n}" for o, n in zip(orig, moved, strict=True) if o != n]
    if changed:
        print(f"note: {where}: overrides recorded by an earlier blocklab, migrated on read: "
              f"{'; '.join(changed)}", file=sys.stderr)
    return [o for o in moved if _key(o)[0] not in NOT_COMPOSED]


def _names_a_file(override: str) -> bool:
    """Whether ``override`` sets a config group (``model=...``, ``+experiment=...``,
    ``model/position=...``, ``callbacks=[...]``: a key that is not a dotted one nor one of the
    config's own values such as ``run_dir``) to a path — absolute, or climbing with ``..`` —
    which Hydra would open as a YAML file wherever it points."""
    key = _key(override)[0]
    if "." in key or key in _value_keys():
        return False
    value = override.split("=", 1)[1] if "=" in override else ""
    for token in re.split(r"[\[\],\s'\"]+", value):
        parts = re.split(r"[/\\]", token)
        if (token.startswith(("/", "\\", "~")) or "\\" in token or ".." in parts
                or re.match(r"[A-Za-z]:", token) or "://" in token):
            return True
    return False


@functools.cache
def _value_keys() -> frozenset[str]:
    """The training config's top-level keys that hold a value (``seed``, ``run_dir``, ...), not
    a config group."""
    import dataclasses

    from blocklab.config import TrainConfig

    return frozenset(f.name for f in dataclasses.fields(TrainConfig)
                     if isinstance(f.default, str | int | float | bool | None))


def merge_overrides(orig: list[str], new: list[str]) -> list[str]:
    """``orig`` with every override whose key (or group) ``new`` sets again replaced: what the
    resumed run is composed of, recorded in its metadata for the next resume."""
    again = {_key(o) for o in new}
    return [o for o in orig if _key(o) not in again] + list(new)


def _key(override: str) -> tuple[str, str | None]:
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    try:
        (parsed,) = OverridesParser.create().parse_overrides([override])
    except HydraException:  # not an override Hydra reads: compared as written
        return override.lstrip("+~").split("=", 1)[0], None
    return parsed.key_or_group, parsed.package


def _delta(orig: list[str], new: list[str], where: str) -> list[tuple[str, Any, Any]]:
    """What the ``new`` overrides change in the run's own composition. If the run's overrides
    no longer compose (a renamed preset, a config directory not given this time), the
    difference is taken from the defaults instead, said once."""
    from hydra.errors import HydraException

    try:
        before, merged = _composed(orig, where, quiet=True), merge_overrides(orig, new)
    except (HydraException, ConfigError) as e:
        print(f"warning: resume: the run's own overrides {orig} no longer compose "
              f"({str(e).splitlines()[0]}); the command line's changes are taken relative to "
              "the defaults", file=sys.stderr)
        before, merged = _composed([], where), new
    return config_diff(before, _composed(merged, where))


def _composed(overrides: list[str], where: str, *, quiet: bool = False) -> dict[str, Any]:
    """The training config ``overrides`` compose to, resolved to plain data. Inside
    ``blocklab-train`` Hydra's own search path (``--config-dir``) and config name are used."""
    from hydra.core.global_hydra import GlobalHydra
    from hydra.errors import HydraException

    try:
        if GlobalHydra.instance().is_initialized():
            from hydra import compose
            from hydra.core.hydra_config import HydraConfig

            name = HydraConfig.get().job.config_name if HydraConfig.initialized() else "train"
            return _plain(compose(name or "train", overrides))
        from blocklab.config import compose as blocklab_compose

        return _plain(blocklab_compose("train", overrides))
    except HydraException as e:
        if quiet:
            raise
        raise ConfigError(f"config error: resume={where.removeprefix('checkpoint ')}: "
                          f"overrides {overrides} do not compose on the run's config: "
                          f"{str(e).splitlines()[0]}") from None


def _plain(cfg: DictConfig) -> dict[str, Any]:
    return OmegaConf.to_container(cfg, resolve=True, enum_to_str=True)


def apply_delta(cfg: DictConfig, delta: list[tuple[str, Any, Any]]) -> None:
    """Set each ``(key, old, new)`` of a :func:`config_diff` on ``cfg``; a key the new side
    lacks is removed (only an open mapping such as ``model.mixer.options`` can lack one),
    unless a key under it is set."""
    set_keys = [k for k, _, b in delta if b != ABSENT]
    for key, _, value in delta:
        if value != ABSENT:
            OmegaConf.update(cfg, key, value, merge=False)
        elif not any(k.startswith(key + ".") for k in set_keys):
            parent, _, leaf = key.rpartition(".")
            node = OmegaConf.select(cfg, parent) if parent else cfg
            if isinstance(node, DictConfig) and leaf in node:
                with open_dict(node):
                    del node[leaf]


#: Keys whose change means other data or another tokenizer whatever else is equal: a resume
#: changing one is refused from the configs alone (unless ``allow_data_change``), before any
#: data is read or prepared.
DATA_KINDS = ("data.name", "data.corpus", "data.hub_dataset", "data.format", "tokenizer.name")
#: Changed keys a resume cannot apply over the checkpoint's state (the optimizer's state is
#: that optimizer's), with why.
STATEFUL = {"optim.name": "the checkpoint's optimizer state is {old}'s, not {new}'s; to train "
                          "with {new} from these weights start a new run with init_from="}


def changes(meta: dict[str, Any], new: dict[str, Any]) -> list[tuple[str, Any, Any]]:
    """``(key, checkpoint's value, resumed run's value)`` of every key the resumed run's
    resolved config ``new`` changes (``resume`` and ``run_dir`` aside: every resume sets
    them)."""
    return [d for d in config_diff(meta["config"], new) if d[0] not in ("resume", "run_dir")]


def refuse_before_data(meta: dict[str, Any], new: dict[str, Any], *, allow_data_change: bool,
                       target: str) -> None:
    """What the configs alone show a resume cannot do, refused (exit 4) before anything is
    read or prepared: another architecture (``model.vocab_size=null`` is sized from the
    tokenizer later, and checked then), other data or another tokenizer by kind
    (:data:`DATA_KINDS`), another optimizer. The one line lists every other changed key too:
    ``experiment=<another>`` changes many."""
    diff = changes(meta, new)
    arch = [d for d in diff if d[0].startswith("model.")
            and not (d[0] == "model.vocab_size" and d[2] is None)]
    if arch:
        raise ckpt.CheckpointError(_refusal(arch, diff))
    kinds = [d for d in diff if d[0] in DATA_KINDS]
    if kinds and not allow_data_change:
        raise ckpt.CheckpointError(
            f"resume refused: the data differs from the checkpoint's: {_data_keys(diff)}; to "
            "continue on the new data instead (no longer the uninterrupted run) pass "
            "allow_data_change=true")
    for key, a, b in diff:
        if key in STATEFUL:
            why = STATEFUL[key].format(old=a, new=b)
            raise ckpt.CheckpointError(f"resume refused: {key} changed {a!r} -> {b!r}: {why}"
                                       f"{ckpt.run_dir_of(target)}")


def _refusal(arch: list[tuple[str, Any, Any]], diff: list[tuple[str, Any, Any]]) -> str:
    """The one-line refusal of another architecture: its keys, then every other changed key
    that is not bookkeeping."""
    lines = "; ".join(f"{k}: {a!r} -> {b!r}" for k, a, b in arch)
    rest = [d for d in diff if d not in arch and not is_bookkeeping(d[0])
            and not d[0].startswith("model.")]
    also = "; ".join(f"{k}: {a!r} -> {b!r}" for k, a, b in rest)
    return (f"resume refused: the architecture differs from the checkpoint's ({len(arch)} "
            f"keys): {lines}" + (f"; besides, {len(rest)} other keys change: {also}"
                                 if rest else ""))


def check_resume(meta: dict[str, Any], new: dict[str, Any], *, allow_data_change: bool,
                 fingerprints: dict[str, str], changed: str | None = None
                 ) -> tuple[list[str], list[str]]:
    """Check the resumed run's resolved config ``new`` against the checkpoint's metadata
    (``meta["config"]`` read through the schema, so a key added since reads its default).
    Refuse architecture changes (every differing key listed) and data/tokenizer changes unless
    allowed (``changed``: which recorded source files changed); return (the bookkeeping
    changes, allowed; warnings for the rest: the run is no longer exactly the uninterrupted
    one)."""
    diff = changes(meta, new)
    arch = [d for d in diff if d[0].startswith("model.")]
    if arch:
        raise ckpt.CheckpointError(_refusal(arch, diff))
    refuse_data_change(meta, diff, allow_data_change=allow_data_change,
                       fingerprints=fingerprints, changed=changed)
    same_data = all(meta.get(name) == value for name, value in fingerprints.items())
    moved = [d for d in diff if d[0] in DATA_PATHS and same_data]
    allowed = [f"resume: {k} changed {a!r} -> {b!r} (allowed)" for k, a, b in diff
               if is_bookkeeping(k)]
    allowed += [f"resume: {k} changed {a!r} -> {b!r}: the same data (fingerprints equal; "
                "allowed)" for k, a, b in moved]
    warned = [f"resume: {k} changed {a!r} -> {b!r}: the run is no longer exactly the "
              "uninterrupted one" for k, a, b in diff
              if not is_bookkeeping(k) and (k, a, b) not in moved]
    return allowed, warned


def refuse_data_change(meta: dict[str, Any], diff: list[tuple[str, Any, Any]], *,
                       allow_data_change: bool, fingerprints: dict[str, str],
                       changed: str | None = None) -> None:
    """A changed data or tokenizer fingerprint refused (exit 4) unless allowed, saying what
    changed and how to continue on the run's data (``diff``: :func:`changes`)."""
    for name, value in fingerprints.items():
        if meta.get(name) != value and not allow_data_change:
            raise ckpt.CheckpointError(data_change(name, meta.get(name), value, diff, changed))


def recorded_changes(meta: dict[str, Any], new: dict[str, Any]) -> list[dict[str, Any]]:
    """The run's record of what its resumes changed: the checkpoint's own record (the resumes
    that led to it), then each key this resume changes, with the first step trained with the
    new value (``from_step``: the checkpoint's step + 1, the row that step logs)."""
    before = meta.get("resume_changes")
    before = [c for c in before if isinstance(c, dict)] if isinstance(before, list) else []
    step = int(meta["step"]) + 1
    return [*before, *({"key": k, "old": a, "new": b, "from_step": step}
                       for k, a, b in changes(meta, new))]


def data_change(name: str, old: Any, now: str, diff: list[tuple[str, Any, Any]],
                changed: str | None) -> str:
    """The one-line refusal of a resume whose data (or tokenizer) fingerprint differs: what
    changed — data keys, source files, or neither — and how to continue on the run's data."""
    prefixes = ("tokenizer.",) if name == "tokenizer_hash" else ("data.", "tokenizer.")
    keys = [(k, a, b) for k, a, b in diff if k.startswith(prefixes)]
    what = f"resume refused: {name} differs (checkpoint {old}, now {now})"
    if keys:
        how = _data_keys(keys)
    elif changed and name == "data_fingerprint":
        how = (f"the run's source files changed: {changed}; to continue on the run's data "
               "restore them as they were")
    else:
        how = ("no data key and no recorded source file changed, so the same config reads "
               "other data now (a hub dataset or a tokenizer file that changed, or another "
               "blocklab version); to continue on the run's data restore what it read")
    return (f"{what}: {how}; to continue on the new data instead (no longer the uninterrupted "
            "run) pass allow_data_change=true")


def _data_keys(diff: list[tuple[str, Any, Any]]) -> str:
    """The data and tokenizer keys of ``diff``, and the way back to the run's values."""
    keys = [(k, a, b) for k, a, b in diff if k.startswith(("data.", "tokenizer."))]
    shown = "; ".join(f"{k}: {a!r} -> {b!r}" for k, a, b in keys)
    back = " ".join(f"{k}={_value(a)}" for k, a, _ in keys)
    return (f"the command line changes {shown}; to continue on the run's data drop those "
            f"overrides (the run's values: {back})")


def _value(v: Any) -> str:
    """A value as a command-line override writes it."""
    if v is None:
        return "null"
    if isinstance(v, bool):
        return str(v).lower()
    if isinstance(v, list | dict):
        import json

        return json.dumps(v).replace(" ", "")
    return str(v)

