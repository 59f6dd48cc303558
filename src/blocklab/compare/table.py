"""``blocklab-compare``'s table: which columns, in which order, sorted how, and written as
markdown (stdout and ``compare.md``) or CSV (``compare.csv``, raw values).

Columns: the run name, the varied config axes, then :data:`METRIC_COLUMNS`; ``ppl_*`` only when
some run has them. Missing values read ``-`` in markdown and empty in CSV, and always sort last.
A loss or throughput from an earlier step than the run's ``step`` (a run resumed past its last
validation, a metric not logged at the last step) reads ``3.214 (step 18)`` in markdown; the
CSV has the step of each such number in its own column (``val_loss_step``, ...).
"""

from __future__ import annotations

import csv
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from blocklab.compare.runs import CompareError
from blocklab.compare.text import fmt_float, show_value
from blocklab.plotting import finite_float, finite_int

# Result columns, after the run name and the varied axes. ``ppl_*`` only when some run has them.
METRIC_COLUMNS = ("params", "status", "step", "train_loss", "val_loss", "needle_in",
                  "needle_beyond", "eff_len", "litm_gap", "ppl_L", "ppl_max", "tokens_per_s",
                  "error")
OPTIONAL_COLUMNS = ("ppl_L", "ppl_max")
#: columns whose number comes from some step's row: marked when that is not the run's last step
STEP_MARKED = ("train_loss", "val_loss", "tokens_per_s")
CSV_EXTRA = ("path", "job", "needle_variant", "ppl_max_len",
             *(f"{c}_step" for c in STEP_MARKED))
_INTEGER_COLUMNS = ("params", "step", "eff_len")

LEGEND = ("needle_in / needle_beyond: accuracy within / beyond the training length of the "
          "needle variant with the most distractors; eff_len: its effective length; "
          "litm_gap: best-worst gap of the kv_records curve with the most records; ppl_L / "
          "ppl_max: sliding-window perplexity at the training length / the largest length. "
          "A number from an earlier step than the run's step is marked with its step: "
          "3.214 (step 18).")


def table_columns(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    axes = list(rows[0]["axes"]) if rows else []
    metric = [c for c in METRIC_COLUMNS
              if c not in OPTIONAL_COLUMNS or any(r.get(c) is not None for r in rows)]
    return ["run", *axes, *metric]


def sort_rows(rows: list[dict[str, Any]], column: str) -> list[dict[str, Any]]:
    """Sort by ``column`` (a leading ``-`` sorts descending); missing values always last.
    Numbers sort numerically, anything else by its text."""
    desc = column.startswith("-")
    col = column[1:] if desc else column
    if rows and col not in table_columns(rows) and col not in rows[0]:
        raise CompareError(f"blocklab-compare: --sort {column}: unknown column (choose from: "
                           f"{', '.join(table_columns(rows))})")
    present = [r for r in rows if r.get(col) is not None and r.get(col) != ""]
    missing = [r for r in rows if r.get(col) is None or r.get(col) == ""]

    def key(r: Mapping[str, Any]) -> tuple:
        v = r.get(col)
        n = finite_float(v)
        return (0, n, "") if n is not None else (1, 0.0, show_value(v))

    present.sort(key=key, reverse=desc)
    return present + missing


def _cell_md(value: Any, column: str) -> str:
    if value is None or value == "":
        return "-"
    if column in _INTEGER_COLUMNS and finite_int(value) is not None:
        text = str(finite_int(value))
    elif isinstance(value, float):
        text = fmt_float(value)
    else:
        text = show_value(value)
    return text.replace("|", "\\|").replace("\n", " ")


def _step_mark(row: Mapping[str, Any], column: str) -> str:
    """`` (step N)`` when the number in ``column`` comes from a step other than the run's."""
    if column not in STEP_MARKED or row.get(column) is None:
        return ""
    at, step = finite_int(row.get(f"{column}_step")), finite_int(row.get("step"))
    return f" (step {at})" if at is not None and step is not None and at != step else ""


def _cell_csv(value: Any) -> Any:
    if value is None:
        return ""
    if isinstance(value, (list, tuple, Mapping, bool)):
        return show_value(value)
    return value


def markdown_table(rows: Sequence[Mapping[str, Any]], columns: Sequence[str] | None = None) -> str:
    """The table as GitHub markdown; numeric columns are right-aligned."""
    cols = list(columns or table_columns(rows))
    numeric = {c for c in cols
               if any(finite_float(r.get(c)) is not None for r in rows)
               and all(r.get(c) is None or finite_float(r.get(c)) is not None for r in rows)}
    lines = ["| " + " | ".join(cols) + " |",
             "|" + "|".join("---:" if c in numeric else "---" for c in cols) + "|"]
    lines += ["| " + " | ".join(_cell_md(r.get(c), c) + _step_mark(r, c) for c in cols) + " |"
              for r in rows]
    return "\n".join(lines)


def write_csv(rows: Sequence[Mapping[str, Any]], path: str | Path) -> Path:
    """The table's columns plus :data:`CSV_EXTRA` (path, job, ...), raw values."""
    cols = table_columns(rows)
    extra = [c for c in CSV_EXTRA if c not in cols
             and (not c.startswith("ppl") or any(r.get(c) is not None for r in rows))]
    out = Path(path)
    with out.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow([*cols, *extra])
        for r in rows:
            w.writerow([_cell_csv(r.get(c)) for c in (*cols, *extra)])
    return out


def write_markdown(rows: Sequence[Mapping[str, Any]], path: str | Path, *, sources: Sequence[str],
                   plots: Sequence[str] = ()) -> Path:
    """``compare.md``: the sources, the varied axes, the table, a legend and the plots."""
    axes = list(rows[0]["axes"]) if rows else []
    parts = ["# blocklab-compare", "",
             f"{len(rows)} runs from: " + ", ".join(f"`{s}`" for s in sources), "",
             "Varied axes: " + (", ".join(f"`{a}`" for a in axes) if axes else "none"), "",
             markdown_table(rows), "", LEGEND, ""]
    parts += [f"![{Path(p).stem}]({Path(p).name})" for p in plots]
    out = Path(path)
    out.write_text("\n".join(parts).rstrip() + "\n")
    return out
