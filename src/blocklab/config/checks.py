"""Building blocks of the config rules: one-line errors naming key, value and rule."""

from __future__ import annotations

import dataclasses
import enum
import math
from collections.abc import Mapping
from typing import Any

from blocklab.errors import ConfigError


def _fail(key: str, value: Any, rule: str, hint: str = "") -> ConfigError:
    if isinstance(value, enum.Enum):
        value = value.value
    elif isinstance(value, list | tuple) or type(value).__name__ == "ListConfig":
        value = list(value)
    tail = f"; {hint}" if hint else ""
    return ConfigError(f"config error: {key}={value!r}: {rule}{tail}")


def _check(ok: bool, key: str, value: Any, rule: str, hint: str = "") -> None:
    if not ok:
        raise _fail(key, value, rule, hint)


def require(ok: bool, key: str, value: Any, rule: str, hint: str = "") -> None:
    """The public form of the one-line rule, for checks that live beside the code they guard
    (e.g. what a probe builder can render): ``ConfigError`` naming key, value and rule."""
    _check(ok, key, value, rule, hint)


def finite(x: Any) -> bool:
    """A real number (an int or float, not a bool) that is finite: the test behind every
    "must be a finite number" rule, here and in the components' own rules."""
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)


_finite = finite

#: The rule every number of a config meets before any other rule is asked: a range rule
#: written ``x < 0 -> refuse`` lets NaN through (every comparison with NaN is false), and no
#: key of blocklab's means anything by NaN or an infinity.
FINITE_RULE = "must be a finite number (NaN and inf are never valid config values)"


def finite_everywhere(value: Any, key: str) -> None:
    """Refuse, in one line naming the dotted key, any NaN or infinity anywhere in a config
    (dataclasses, mappings — callback options, mixer options — and lists, as composed): the
    root of every numeric range rule, so that none of them sees a non-finite number."""
    if isinstance(value, float):
        _check(math.isfinite(value), key, value, FINITE_RULE)
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        for f in dataclasses.fields(value):
            finite_everywhere(getattr(value, f.name), f"{key}.{f.name}" if key else f.name)
    elif isinstance(value, Mapping):
        for k, v in value.items():
            finite_everywhere(v, f"{key}.{k}" if key else str(k))
    elif isinstance(value, list | tuple):
        bad = [v for v in value if isinstance(v, float) and not math.isfinite(v)]
        _check(not bad, key, value, FINITE_RULE.replace("must be", "each value must be", 1))
        for i, v in enumerate(value):
            finite_everywhere(v, f"{key}[{i}]")


def _name(x: Any) -> Any:
    return x.value if isinstance(x, enum.Enum) else x


def _one_of(key: str, value: Any, choices: tuple[str, ...], hint: str = "") -> None:
    _check(value in choices, key, value, f"one of {', '.join(choices)}", hint)


def _each(key: str, values: list, ok, rule: str, *, required: bool) -> None:
    """Every element of a list satisfies ``ok``; with ``required`` the list is not empty."""
    values = list(values)
    _check(bool(values) or not required, key, values,
           "must not be empty while this probe is enabled")
    bad = [v for v in values if not ok(v)]
    _check(not bad, key, values, f"{rule} (not {bad[0]!r})" if bad else rule)


def val_tasks_trained(key: str, val_tasks: list[str], trained: set[str] | list[str],
                      what: str) -> None:
    """``data.val_tasks``: each named once and trained on (``what`` says where the trained
    tasks are set, e.g. ``data.tasks with weight > 0``)."""
    for task in val_tasks:
        _check(task in trained, f"{key}.val_tasks", list(val_tasks),
               f"every validation task must be trained on; {task!r} is not "
               f"({what}: {', '.join(sorted(trained))})")
    _check(len(set(val_tasks)) == len(val_tasks), f"{key}.val_tasks", list(val_tasks),
           "names a task twice")
