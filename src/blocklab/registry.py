"""Name -> component, per axis, and the public :func:`register` for user components.

Each axis's variants are a literal dict at the bottom of the file that defines them
(``POSITIONS`` in model/position.py, ``FFNS`` in model/ffn.py, ...); :data:`AXES` says where.
blocklab's own components are never registered by decorator or import side effect. A user
module adds its own with :func:`register`::

    from blocklab.registry import register
    from blocklab.model.ffn import MLP

    @register("ffn", "squared_relu")
    class SquaredReLU(MLP):
        ...

and selects it by name like any built-in (``model.ffn.name=squared_relu``, or
``model/ffn=squared_relu`` with a YAML file in a user config directory). The command-line tools
import user modules before composing a config: every installed distribution's
``blocklab.plugins`` entry points, and the comma-separated module names in the environment
variable ``BLOCKLAB_PLUGINS`` (docs/extending.md).
"""

from __future__ import annotations

import enum
import importlib
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from blocklab.errors import ConfigError

T = TypeVar("T")

PLUGIN_ENV = "BLOCKLAB_PLUGINS"
ENTRY_POINT_GROUP = "blocklab.plugins"


@dataclass(frozen=True)
class Axis:
    module: str  # where the literal dict lives
    table: str  # its name
    key: str  # the config key that chooses a variant
    group: str | None = None  # the config group folder under configs/, when there is one


AXES: dict[str, Axis] = {
    "family": Axis("blocklab.model.transformer", "FAMILIES", "model.family.name", "model/family"),
    "norm": Axis("blocklab.model.norm", "NORMS", "model.norm.name", "model/norm"),
    "block": Axis("blocklab.model.blocks", "BLOCKS", "model.block.name", "model/block"),
    "position": Axis("blocklab.model.position", "POSITIONS", "model.position.name",
                     "model/position"),
    "ffn": Axis("blocklab.model.ffn", "FFNS", "model.ffn.name", "model/ffn"),
    "attention": Axis("blocklab.model.head_layouts", "ATTENTIONS", "model.attention.name",
                      "model/attention"),
    "mixer": Axis("blocklab.model.mixers", "MIXERS", "model.mixer.name", "model/mixer"),
    "init": Axis("blocklab.model.init", "INITS", "model.init"),
    "objective": Axis("blocklab.objectives", "OBJECTIVES", "model.family.name"),
    "corpus": Axis("blocklab.data.sources", "CORPORA", "data.corpus"),
    # synthetic tasks: blocklab's are weighted under data.tasks.<name>, a user's under
    # data.user_tasks.<name> (docs/extending.md)
    "task": Axis("blocklab.data.tasks", "TASKS", "data.user_tasks"),
    "schedule": Axis("blocklab.train.optim", "SCHEDULES", "schedule.name", "schedule"),
    "logger": Axis("blocklab.train.loggers", "LOGGERS", "logger.name", "logger"),
    "optim": Axis("blocklab.train.optim", "OPTIMIZERS", "optim.name", "optim"),
    "callback": Axis("blocklab.train.callbacks", "CALLBACKS", "callbacks", "callbacks"),
    # probe kinds: blocklab's own are fields of the probe spec (probes.<kind>), a user's are
    # set under probes.kinds.<name> (docs/extending.md)
    "probe": Axis("blocklab.eval.kinds", "PROBE_KINDS", "probes.kinds"),
    # reference experiments (blocklab-repro <name>): make(size) -> Experiment
    "experiment": Axis("blocklab.repro.experiments", "EXPERIMENTS", "blocklab-repro NAME"),
}

_NAME = re.compile(r"[a-z][a-z0-9_]*")
_registered: dict[tuple[str, str], str] = {}  # (axis, name) -> module that registered it
_plugins_loaded = False


def _axis(axis: str) -> Axis:
    try:
        return AXES[axis]
    except KeyError:
        raise ValueError(f"unknown axis {axis!r}; axes: {', '.join(AXES)}") from None


def table(axis: str) -> dict[str, Any]:
    """The live name -> component dict of ``axis`` (user plugins loaded first)."""
    a = _axis(axis)
    load_plugins()
    return getattr(importlib.import_module(a.module), a.table)


def names(axis: str) -> list[str]:
    """Every name of ``axis``: blocklab's own in their table's order, then registered ones."""
    return list(table(axis))


def builtin_names(axis: str) -> list[str]:
    """The names blocklab itself ships (those with a config file), without registered ones."""
    return [n for n in table(axis) if (axis, n) not in _registered]


def registered() -> dict[tuple[str, str], str]:
    """``(axis, name) -> registering module`` of every user component."""
    return dict(_registered)


def lookup(axis: str, name: str | enum.Enum, key: str | None = None) -> Any:
    """The component ``name`` of ``axis``; on a miss a one-line :class:`ConfigError` naming
    the dotted config ``key``, the value and the known names."""
    if isinstance(name, enum.Enum):
        name = name.value
    components = table(axis)
    try:
        return components[name]
    except (KeyError, TypeError):
        known = ", ".join(sorted(components))
        raise ConfigError(f"config error: {key or _axis(axis).key}={name!r}: unknown choice; "
                          f"known: {known} (user components: register them, see "
                          f"docs/extending.md)") from None


def register(axis: str, name: str, *, replace: bool = False) -> Callable[[T], T]:
    """Decorator adding a component to ``axis`` under ``name`` (lower-case identifier). A name
    that exists already is refused unless ``replace=True``. See docs/extending.md for what
    each axis expects of a component."""
    a = _axis(axis)
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise ValueError(f"register({axis!r}, {name!r}): names are lower-case identifiers "
                         "([a-z][a-z0-9_]*), as they are also config file names")

    def add(component: T) -> T:
        components = getattr(importlib.import_module(a.module), a.table)
        if name in components and not replace and components[name] is not component:
            raise ValueError(f"register({axis!r}, {name!r}): {a.key}={name!r} exists already "
                             "(pass replace=True to override it deliberately)")
        components[name] = component
        _registered[(axis, name)] = getattr(component, "__module__", "?")
        return component

    return add


def load_plugins() -> list[str]:
    """Import user component modules once: ``blocklab.plugins`` entry points of installed
    distributions, then the modules named in ``$BLOCKLAB_PLUGINS`` (comma-separated). Returns
    the module names imported by this call. Any failure while a module is imported — an
    exception or ``sys.exit`` — is one :class:`ConfigError` line naming the plugin."""
    global _plugins_loaded
    if _plugins_loaded:
        return []
    _plugins_loaded = True
    from importlib.metadata import entry_points

    targets = [(f"entry point {ep.name!r} ({ep.value})", ep.value.split(":")[0])
               for ep in entry_points(group=ENTRY_POINT_GROUP)]
    targets += [(f"{PLUGIN_ENV}={m.strip()}", m.strip())
                for m in os.environ.get(PLUGIN_ENV, "").split(",") if m.strip()]
    loaded: list[str] = []
    for where, module in targets:
        if module in loaded:
            continue
        try:
            importlib.import_module(module)
        except BaseException as e:
            _plugins_loaded = False  # let a fixed environment retry
            if isinstance(e, KeyboardInterrupt):
                raise  # Ctrl-C aborts the command, as anywhere else
            raise ConfigError(f"plugin error: {where}: importing {module!r} failed: "
                              f"{_why(e)}") from None
        loaded.append(module)
    return loaded


def _why(e: BaseException) -> str:
    """One line for what a plugin raised. ``sys.exit()`` in a plugin is a failure too: were it
    let through, a command would end with the plugin's exit status (0 for ``sys.exit(0)``)
    having done nothing."""
    if isinstance(e, SystemExit):
        return (f"it called sys.exit({e.code!r}) while being imported (a plugin module only "
                "defines and registers components)")
    lines = str(e).strip().splitlines()
    return f"{type(e).__name__}: {lines[0]}" if lines else type(e).__name__
