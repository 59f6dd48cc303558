"""Name -> variant lookup with an error that lists the known names."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import TypeVar

from blocklab.config import ConfigError

T = TypeVar("T")


def lookup(table: Mapping[str, T], name: str | enum.Enum, key: str) -> T:
    """Return ``table[name]``; on a miss raise a one-line :class:`ConfigError` naming the
    dotted config ``key``, the value and the valid choices."""
    if isinstance(name, enum.Enum):
        name = name.value
    try:
        return table[name]
    except KeyError:
        known = ", ".join(sorted(table))
        raise ConfigError(f"config error: {key}={name!r}: unknown choice; known: {known}") from None
