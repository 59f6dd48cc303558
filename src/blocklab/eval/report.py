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
from pathlib import Path
from typing import TYPE_CHECKING, Any

from blocklab.eval.kinds.base import fmt
from blocklab.files import write_dir_atomic

if TYPE_CHECKING:
    from blocklab.eval.items import ProbeResult


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
    (tmp / files["summary"]).write_text(json.dumps(result.summary, indent=2, default=str))
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

    title = f"step {result.summary.get('step')} · {result.summary.get('backend')}"
    probes = {c["probe"] for c in result.cells}
    figures = {}
    for kind in kinds():
        if kind.name in probes:
            figures.update(kind.figures(result.cells, train_length=train_length, title=title))
    if any(c["probe"] == "perplexity" and c.get("ppl") is not None for c in result.cells):
        figures["perplexity"] = plots.perplexity_figure(result.cells,
                                                        train_length=train_length, title=title)
    return {f"{stem}_png": save_png(fig, folder / f"{stem}.png").name
            for stem, fig in figures.items()}


# ------------------------------------------------------------------------------ printed table


def _perplexity_lines(rows: list[dict[str, Any]]) -> list[str]:
    na = {r["status"] for r in rows if r["ppl"] is None}
    if rows and len(na) == 1 and all(r["ppl"] is None for r in rows):
        return [f"perplexity vs evaluation length: {na.pop()}"]
    if not rows:
        return []
    return ["perplexity vs evaluation length:"] + [
        f"  {r['variant']:<15} L={r['length']:<6} "
        f"{fmt(r['ppl'], '.3f') if r['ppl'] is not None else r['status']}" for r in rows]


def format_report(summary: dict[str, Any], rows: list[dict[str, Any]]) -> str:
    """The probe table printed at the end of training and by blocklab-eval: each kind's block
    (in the registry's order), perplexity, the count and time."""
    from blocklab.eval.kinds import kinds

    lines = []
    for kind in kinds():
        lines += kind.report_lines(summary.get(kind.name) or {})
    lines += _perplexity_lines(summary["perplexity"])
    lines.append(f"({summary['n_examples']} examples in {summary['seconds']:.1f} s)")
    return "\n".join(lines)
