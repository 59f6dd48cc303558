"""How config values and runs read in ``blocklab-compare``'s table, CSV and plot legends:
YAML-ish values (``null``, ``true``, ``[a, b]``), 4 significant digits, short axis names, and a
run's label from its varied axes (``n_layers=2, position=alibi``).

One module for the table and the plots, so a run is called the same everywhere.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any


def fmt_float(x: float) -> str:
    """4 significant digits; large magnitudes as whole numbers rather than 1.501e+04."""
    if math.isfinite(x) and 1e4 <= abs(x) < 1e12:
        return f"{x:.0f}"
    return f"{x:.4g}"


def show_value(value: Any) -> str:
    """How a config value reads in a table / legend (YAML-ish: null, true, [a, b])."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(show_value(v) for v in value) + "]"
    if isinstance(value, Mapping):
        return "{" + ", ".join(f"{k}: {show_value(v)}" for k, v in value.items()) + "}"
    if isinstance(value, float):
        return fmt_float(value)
    return str(value)


def short_key(key: str) -> str:
    """``model.position.name`` -> ``position``; ``model.d_model`` -> ``d_model``."""
    parts = key.split(".")
    if len(parts) > 1 and parts[-1] == "name":
        parts = parts[:-1]
    return parts[-1]


def run_label(row: Mapping[str, Any], keys: Sequence[str], sep: str = ", ") -> str:
    """``short=value`` for each varied axis (full dotted keys when short names collide), or the
    run's name when there are no axes or the run has no config."""
    if not keys or not row.get("has_config"):
        return str(row["run"])
    shorts = [short_key(k) for k in keys]
    if len(set(shorts)) < len(shorts):  # ambiguous short names: keep the full keys
        shorts = list(keys)
    return sep.join(f"{s}={show_value(row['config'].get(k))}" if k in row["config"]
                    else f"{s}=-" for s, k in zip(shorts, keys))


def unique_labels(rows: Sequence[Mapping[str, Any]], sep: str = ", ") -> list[str]:
    """:func:`run_label` of each row, with the run name appended where two labels coincide."""
    labels = [run_label(r, r.get("axes") or [], sep) for r in rows]
    return [f"{lab} ({r['run']})" if labels.count(lab) > 1 else lab
            for lab, r in zip(labels, rows)]
