"""Writing a probe result (docs/probes.md, "Grids and reports"): the long-form ``cells.csv``
(one row per cell), ``examples.csv`` (one row per scored item), ``summary.json`` and the PNGs
(needle and lost-in-the-middle, one heatmap per new probe kind, perplexity),
all into one report folder; and the plain-text table printed at the end of training and by
``blocklab-eval``.

The folder is written as a temporary sibling and swapped in whole, so a crash (or a
pre-empted job) never leaves half a report next to a complete-looking ``summary.json``.
Nothing here needs torch.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from blocklab.files import write_dir_atomic

if TYPE_CHECKING:
    from blocklab.eval.probes import ProbeResult


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
        tmp.rmdir()  # _write_files makes its folder itself
        files.update(_write_files(result, tmp, train_length, plots))

    write_dir_atomic(out_dir, fill, what=f"probe results {out_dir}", key=None, overwrite=True,
                     full="nothing of this report was kept (an earlier report there is intact)")
    result.out_dir = out_dir
    result.files = {k: str(out_dir / v) for k, v in files.items()}


def _write_files(result: ProbeResult, tmp: Path, train_length: int, plots: bool
                 ) -> dict[str, str]:
    tmp.mkdir(parents=True)
    files = {"cells": "cells.csv", "examples": "examples.csv", "summary": "summary.json"}
    _csv(tmp / files["cells"], result.cells)
    _csv(tmp / files["examples"], result.examples)
    if plots:
        files.update(_plots(result, tmp, train_length))
    result.summary["files"] = files
    (tmp / files["summary"]).write_text(json.dumps(result.summary, indent=2, default=str))
    return files


def _plots(result: ProbeResult, folder: Path, train_length: int) -> dict[str, str]:
    try:
        from blocklab.eval import plots
    except ImportError:  # pragma: no cover - matplotlib is a dependency
        return {}
    out = {}
    title = f"step {result.summary.get('step')} · {result.summary.get('backend')}"
    probes = {c["probe"] for c in result.cells}
    if "needle" in probes:
        out["niah_png"] = plots.plot_niah(result.cells, folder / "niah.png",
                                          train_length=train_length, title=title).name
    if "litm" in probes:
        out["litm_png"] = plots.plot_litm(result.cells, folder / "litm.png", title=title).name
    for probe, name, row_key in (("multi_needle", "multi_needle_png", "variant"),
                                 ("hops", "hops_png", "hops"),
                                 ("aggregation", "aggregation_png", "count_margin")):
        if probe in probes:
            out[name] = plots.plot_grid(result.cells, folder / f"{probe}.png", probe=probe,
                                        row_key=row_key, train_length=train_length,
                                        title=title).name
    if any(c["probe"] == "perplexity" and c.get("ppl") is not None for c in result.cells):
        out["perplexity_png"] = plots.plot_perplexity(
            result.cells, folder / "perplexity.png", train_length=train_length, title=title).name
    return out


# ------------------------------------------------------------------------------ printed table


def _fmt(x: float | None, spec: str = ".3f") -> str:
    return "N/A" if x is None else format(x, spec)


def _needle_lines(variant: str, s: dict[str, Any]) -> list[str]:
    lengths = list(s["accuracy_by_length"])
    w, b = s["within_train_length"], s["beyond_train_length"]
    eff = s["effective_length"]
    return [
        f"needle, {variant} (argmax accuracy pooled over depths; copy-any-value "
        f"{_fmt(s['copy_any_value'])}, chance {_fmt(s['chance'])}):",
        "  length    " + "".join(f"{x:>8}" for x in lengths),
        "  accuracy  " + "".join(f"{_fmt(s['accuracy_by_length'][x]):>8}" for x in lengths),
        f"  within training length {_fmt(w['accuracy'])} "
        f"[{_fmt(w['ci_low'])}, {_fmt(w['ci_high'])}] n={w['n']}; beyond "
        f"{_fmt(b['accuracy'])} [{_fmt(b['ci_low'])}, {_fmt(b['ci_high'])}] n={b['n']}",
        f"  effective length {eff if eff is not None else 'none'} "
        f"(threshold {s['threshold']}: {s['rule'].split(' = ', 1)[1]})",
    ]


def _litm_lines(litm: dict[str, Any]) -> list[str]:
    if not litm:
        return []
    lines = ["lost in the middle (accuracy by gold record position):"]
    for k, s in litm.items():
        if "accuracy_by_gold_position" in s:
            curve = " ".join(f"{p}:{_fmt(v, '.2f')}" for p, v in
                             s["accuracy_by_gold_position"].items())
            lines.append(f"  {k:<20} {curve}  gap {s['best_worst_gap']:.2f} middle drop "
                         f"{s['middle_drop']:+.2f} primacy {s['primacy']:+.2f} recency "
                         f"{s['recency']:+.2f} (copy-any-value {s['copy_any_value']:.3f})")
        else:
            lines.append(f"  {k:<20} {_fmt(s['accuracy'])} [{_fmt(s['ci_low'])}, "
                         f"{_fmt(s['ci_high'])}] n={s['n']} (chance {_fmt(s['chance'])})")
    return lines


_KIND_TITLES = {
    "multi_needle": ("multi-needle", "all answers right; partial = share of answers found"),
    "hops": ("variable tracking", "root value of the queried chain"),
    "aggregation": ("aggregation", "the most frequent candidate"),
}


def _grid_lines(probe: str, per: dict[str, Any]) -> list[str]:
    """One block per probe kind: a length header, then accuracy (and partial credit when it
    differs) per variant, with the pooled interval and the chance / copy lines."""
    if not per:
        return []
    title, what = _KIND_TITLES[probe]
    lengths = list(dict.fromkeys(x for s in per.values() for x in s["accuracy_by_length"]))
    lines = [f"{title} (argmax accuracy: {what}):",
             "  " + f"{'length':<14}" + "".join(f"{x:>8}" for x in lengths)]
    for variant, s in per.items():
        acc = s["accuracy_by_length"]
        lines.append("  " + f"{variant:<14}" + "".join(f"{_fmt(acc.get(x)):>8}" for x in lengths))
        part = s["partial_by_length"]
        if any(part.get(x) is not None and part.get(x) != acc.get(x) for x in lengths):
            lines.append("  " + f"{'  partial':<14}"
                         + "".join(f"{_fmt(part.get(x)):>8}" for x in lengths))
        p = s["pooled"]
        extra = (f", occurrence line {_fmt(s['winner_share'])}"
                 if s.get("winner_share") is not None else "")
        lines.append(f"    pooled {_fmt(p['accuracy'])} [{_fmt(p['ci_low'])}, "
                     f"{_fmt(p['ci_high'])}] n={p['n']} (copy-any-value "
                     f"{_fmt(s['copy_any_value'])}, chance {_fmt(s['chance'], '.2g')}{extra})")
    return lines


def _hops_depth_lines(hops: dict[str, Any]) -> list[str]:
    rows = hops.get("by_farthest_depth") or []
    if not rows:
        return []
    return ["  by farthest-hop depth (all hop counts): " + " ".join(
        f"[{r['depth_from']:.1f},{r['depth_to']:.1f}):{r['accuracy']:.2f}" for r in rows)]


def _perplexity_lines(rows: list[dict[str, Any]]) -> list[str]:
    na = {r["status"] for r in rows if r["ppl"] is None}
    if rows and len(na) == 1 and all(r["ppl"] is None for r in rows):
        return [f"perplexity vs evaluation length: {na.pop()}"]
    if not rows:
        return []
    return ["perplexity vs evaluation length:"] + [
        f"  {r['variant']:<15} L={r['length']:<6} "
        f"{_fmt(r['ppl'], '.3f') if r['ppl'] is not None else r['status']}" for r in rows]


def format_report(summary: dict[str, Any], rows: list[dict[str, Any]]) -> str:
    """The probe table printed at the end of training and by blocklab-eval."""
    lines = []
    for variant, s in summary["needle"].items():
        lines += _needle_lines(variant, s)
    lines += _litm_lines(summary["litm"])
    lines += _grid_lines("multi_needle", summary.get("multi_needle") or {})
    hops = summary.get("hops") or {}
    lines += _grid_lines("hops", hops.get("by_hops") or {})
    lines += _hops_depth_lines(hops)
    lines += _grid_lines("aggregation", summary.get("aggregation") or {})
    lines += _perplexity_lines(summary["perplexity"])
    lines.append(f"({summary['n_examples']} examples in {summary['seconds']:.1f} s)")
    return "\n".join(lines)
