"""Writing a probe result (docs/probes.md, "Grids and reports"): the long-form ``cells.csv``
(one row per cell), ``examples.csv`` (one row per scored item), ``summary.json`` and the PNGs
(each probe kind's figures, and perplexity), all into one report folder; and the plain-text
table printed at the end of training and by ``blocklab-eval`` (each kind's block, then
perplexity). The kinds (``blocklab.eval.kinds``) say what they draw and print; nothing here
names one.

The folder is written as a temporary sibling and swapped in whole, so a crash (or a
pre-empted job) never leaves half a report next to a complete-looking ``summary.json``.
Nothing here needs torch.
"""

from __future__ import annotations

import csv
import json
import math
import numbers
from pathlib import Path
from typing import TYPE_CHECKING, Any

from blocklab.eval.kinds.base import fmt
from blocklab.files import write_dir_atomic

if TYPE_CHECKING:
    from blocklab.eval.items import ProbeResult


def strict_json(value: Any, **kw: Any) -> str:
    """``value`` as strict JSON, what ``jq`` and ``JSON.parse`` read: every non-finite number
    (NaN, inf: Python's ``json`` would write the bare tokens ``NaN`` / ``Infinity``, which are
    not JSON) written as ``null``, and listed — dotted path -> ``"nan"``, ``"inf"`` or
    ``"-inf"`` — under a top-level ``"non_finite"`` key, so a null that was a NaN says so.
    Every JSON file blocklab writes of a run, an evaluation or a probe goes through here."""
    found: dict[str, str] = {}
    clean = _finite(value, "", found)
    if found and isinstance(clean, dict):
        clean = {**clean, "non_finite": found}
    return json.dumps(clean, allow_nan=False, **kw)


def _finite(value: Any, path: str, found: dict[str, str]) -> Any:
    if isinstance(value, numbers.Real) and not math.isfinite(value):  # numpy's floats too
        found[path] = "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
        return None
    if isinstance(value, dict):
        return {k: _finite(v, f"{path}.{k}" if path else str(k), found) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v, f"{path}[{i}]", found) for i, v in enumerate(value)]
    return value


def _csv(path: Path, rows: list[dict[str, Any]]) -> None:
    fields = list(dict.fromkeys(k for r in rows for k in r))
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        for r in rows:
            w.writerow({k: ("" if r.get(k) is None else r.get(k)) for k in fields})


def write(result: ProbeResult, out_dir: Path, *, train_length: int, plots: bool = True) -> None:
    """Write into a temporary sibling, then swap it in (files.write_dir_atomic): a crash never
    leaves half a report. A failed write (disk full) removes the sibling and is one
    :class:`StorageError` line (exit 6); a report already at ``out_dir`` stays as it was."""
    out_dir = Path(out_dir)
    files: dict[str, str] = {}

    def fill(tmp: Path) -> None:
        files.update(_write_files(result, tmp, train_length, plots))

    write_dir_atomic(out_dir, fill, what=f"probe results {out_dir}", key=None, overwrite=True,
                     full="nothing of this report was kept (an earlier report there is intact)")
    result.out_dir = out_dir
    result.files = {k: str(out_dir / v) for k, v in files.items()}


def _write_files(result: ProbeResult, tmp: Path, train_length: int, plots: bool
                 ) -> dict[str, str]:
    files = {"cells": "cells.csv", "examples": "examples.csv", "summary": "summary.json"}
    _csv(tmp / files["cells"], result.cells)
    _csv(tmp / files["examples"], result.examples)
    if plots:
        files.update(_plots(result, tmp, train_length))
    result.summary["files"] = files
    (tmp / files["summary"]).write_text(strict_json(result.summary, indent=2, default=str))
    return files


def _plots(result: ProbeResult, folder: Path, train_length: int) -> dict[str, str]:
    """Each kind's figures of the kinds that have cells, then perplexity: saved as
    ``<stem>.png``, listed as ``<stem>_png``."""
    try:
        from blocklab.eval import plots
    except ImportError:  # pragma: no cover - matplotlib is a dependency
        return {}
    from blocklab.eval.kinds import kinds
    from blocklab.plotting import save_png

    summary = result.summary
    step = summary.get("step")
    title = " · ".join(x for x in (summary.get("title") or summary.get("backend"),
                                   f"step {step}" if step is not None else None) if x)
    probes = {c["probe"] for c in result.cells}
    figures = {}
    for kind in kinds():
        if kind.name in probes:
            figures.update(kind.figures(result.cells, train_length=train_length, title=title))
    if any(c["probe"] == "perplexity" and c.get("ppl") is not None for c in result.cells):
        figures["perplexity"] = plots.perplexity_figure(
            result.cells, train_length=train_length, title=title,
            text=(summary.get("perplexity_text") or {}).get("name", ""))
    return {f"{stem}_png": save_png(fig, folder / f"{stem}.png").name
            for stem, fig in figures.items()}


# ------------------------------------------------------------------------------ printed table


def _perplexity_lines(rows: list[dict[str, Any]], text: dict[str, Any] | None,
                      train_length: int | None) -> list[str]:
    na = {r["status"] for r in rows if r["ppl"] is None}
    if rows and len(na) == 1 and all(r["ppl"] is None for r in rows):
        return [f"perplexity vs evaluation length: {na.pop()}"]
    if not rows:
        return []
    lines = ["perplexity vs evaluation length"
             + (f" on {text['name']}:" if text else ":")]
    if text and text.get("note"):
        lines.append(f"  note: {text['note']}")
    for r in rows:
        mark = " (beyond the training length)" if (
            train_length and r["ppl"] is not None and r["length"] > train_length) else ""
        lines.append(f"  {r['variant']:<15} L={r['length']:<6} "
                     f"{fmt(r['ppl'], '.3f') if r['ppl'] is not None else r['status']}{mark}")
    return lines


def _na_lines(rows: list[dict[str, Any]]) -> list[str]:
    """Why each N/A length is N/A: one line per (kind, variant, length) with the first cell's
    reason (cells of one length differ only in their drawn items' sizes), so the table's "N/A"
    never stands without its reason."""
    first: dict[tuple[str, str, Any], tuple[str, int]] = {}
    for r in rows:
        status = str(r.get("status") or "")
        if not status.startswith("n/a") or r.get("probe") == "perplexity":
            continue
        key = (str(r.get("probe")), str(r.get("variant", "")), r.get("length"))
        reason, count = first.get(key, (status.removeprefix("n/a: "), 0))
        first[key] = (reason, count + 1)
    if not first:
        return []
    lines = ["not applicable (N/A above):"]
    for (probe, variant, length), (reason, count) in first.items():
        cells = f"{count} cells" if count > 1 else "1 cell"
        lines.append(f"  {probe}, {variant} at {length}: {reason} ({cells})")
    return lines


def _beyond_lines(rows: list[dict[str, Any]], train_length: int | None) -> list[str]:
    """Which measured cells' prompts are longer than the model's training length (a length
    generalisation result, not a within-context one)."""
    beyond: dict[str, list[Any]] = {}
    for r in rows:
        if r.get("beyond_train_length") and r.get("n") and r.get("probe") != "perplexity":
            lengths = beyond.setdefault(str(r.get("probe")), [])
            if r.get("length") not in lengths:
                lengths.append(r.get("length"))
    if not beyond:
        return []
    return [f"beyond the training length {train_length:,} (prompts longer than the model "
            "trained on): " + "; ".join(f"{p} at {', '.join(str(x) for x in sorted(ls))}"
                                        for p, ls in beyond.items())]


def format_report(summary: dict[str, Any], rows: list[dict[str, Any]]) -> str:
    """The probe table printed at the end of training and by blocklab-eval: each kind's block
    (in the registry's order), the reasons of N/A cells, the cells beyond the training length,
    perplexity, the count and time."""
    from blocklab.eval.kinds import kinds

    lines = []
    for kind in kinds():
        lines += kind.report_lines(summary.get(kind.name) or {})
    train_length = summary.get("train_length")
    lines += _na_lines(rows)
    lines += _beyond_lines(rows, train_length)
    lines += _perplexity_lines(summary["perplexity"], summary.get("perplexity_text"),
                               train_length)
    items_s = summary.get("item_seconds", summary["seconds"])
    scored = sum(r["n"] or 0 for r in summary["perplexity"])
    lines.append(f"({summary['n_examples']:,} items in {items_s:.1f} s"
                 + (f"; perplexity over {scored:,} tokens in "
                    f"{summary['seconds'] - items_s:.1f} s" if scored else "")
                 + f"; {summary['seconds']:.1f} s in all)")
    return "\n".join(lines)
