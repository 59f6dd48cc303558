"""Run a probe spec on a backend: build the cells, score every item in batches, aggregate, and
write the long-form CSV, the JSON summary and the PNGs (docs/probes.md, "Grids and reports").

This module only orchestrates; each job has its own module:

- ``blocklab.eval.items`` (token space) / ``blocklab.eval.textspace`` build the cells and items
  (needles, lost in the middle, multi-key / multi-value / multi-query needles, variable
  tracking, aggregation);
- ``blocklab.eval.scoring`` scores each item (argmax accuracy, greedy exact match, log-prob,
  margin over the best other in-context answer, gold rank, the copy-any-value shortcut);
- ``blocklab.eval.aggregate`` turns the scores into cell rows with Wilson 95% intervals and the
  per-probe summaries (accuracy within / beyond the training length, effective context length
  with its threshold and rule, the lost-in-the-middle curve shape);
- ``blocklab.eval.perplexity`` measures perplexity against evaluation length;
- ``blocklab.eval.report`` writes the report folder and formats the printed table.

Nothing here draws from a global random generator: items are pure functions of the spec seed.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from blocklab.config import ProbeSpec
from blocklab.eval.aggregate import (
    aggregation_summary,
    cell_row,
    hops_summary,
    litm_summary,
    multi_needle_summary,
    needle_summary,
)
from blocklab.eval.items import Cell, lengths_of
from blocklab.eval.perplexity import perplexity_rows
from blocklab.eval.report import format_report, write
from blocklab.eval.scoring import _batches, score_items
from blocklab.progress import Progress


@dataclass
class ProbeResult:
    """Scored cells (one row each), per-example rows, the summary, and where files went."""

    cells: list[dict[str, Any]]
    examples: list[dict[str, Any]]
    summary: dict[str, Any]
    out_dir: Path | None = None
    files: dict[str, str] = field(default_factory=dict)


def _build(builder, spec: ProbeSpec, train_length: int, max_length: int | None) -> list[Cell]:
    cells: list[Cell] = []
    if spec.needle.enabled:
        cells += builder.needle_cells(spec, train_length, max_length)
    if spec.litm.enabled:
        cells += builder.litm_cells(spec, max_length)
    if spec.multi_needle.enabled:
        cells += builder.multi_needle_cells(spec, train_length, max_length)
    if spec.hops.enabled:
        cells += builder.hops_cells(spec, train_length, max_length)
    if spec.aggregation.enabled:
        cells += builder.aggregation_cells(spec, train_length, max_length)
    return cells


def _cell_rows(cells: list[Cell], scored: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One aggregated row per cell; ``scored`` holds the examples of every cell, in order."""
    rows, i = [], 0
    for c in cells:
        rows.append(cell_row(c, scored[i:i + len(c.items)]))
        i += len(c.items)
    return rows


def _perplexity(backend, spec: ProbeSpec, builder, train_length: int) -> list[dict[str, Any]]:
    """Perplexity rows (decoders only); an "n/a: ..." from the stream builder marks every row
    N/A with that reason instead of failing the run."""
    if not (spec.perplexity.enabled and backend.supports_perplexity):
        return []
    p = spec.perplexity
    lens = lengths_of(p.lengths, train_length)
    try:
        stream, bos = builder.stream(spec, p.tokens + 2 * max(lens))
        return perplexity_rows(backend, stream, bos, lens, p.tokens, p.stride,
                               batch_tokens=spec.batch_size * train_length)
    except ValueError as e:
        if not str(e).startswith("n/a"):
            raise
        return [{"probe": "perplexity", "variant": mode, "length": length, "n": 0,
                 "nll": None, "ppl": None, "status": str(e)}
                for length in lens for mode in ("nonoverlapping", "sliding")]


def _score(backend, spec: ProbeSpec, items: list, decode, progress: Progress
           ) -> list[dict[str, Any]]:
    """Score every item batch by batch (the same batches as one call over all items), counting
    the batches on ``progress``: a bar on a terminal, a line every ``progress.every`` seconds
    in a log."""
    batches = _batches(items, spec.batch_size)
    scored: list[dict[str, Any]] = []
    with progress.count(f"{spec.name}, {len(items)} items: batches", len(batches)) as tick:
        for batch in batches:
            scored += score_items(backend, batch, batch_size=spec.batch_size, decode=decode,
                                  max_new_tokens=spec.text.max_new_tokens if decode else None)
            tick()
    return scored


def run_spec(backend, spec: ProbeSpec, *, builder, train_length: int, keys: dict[str, Any],
             out_dir: Path | None = None, decode: Callable[[list[int]], str] | None = None,
             plots: bool = True, log: Callable[[str], None] | None = None,
             progress: Progress | None = None) -> ProbeResult:
    """Build (through ``builder``: token or text space), score, aggregate and write; the
    scoring's progress on stderr (``progress``: default a line at most every 10 s)."""
    t0 = time.perf_counter()
    max_length = backend.max_length()
    cells = _build(builder, spec, train_length, max_length)
    items = [it for c in cells for it in c.items]
    t_build = time.perf_counter() - t0
    progress = progress or Progress("probes")
    scored = _score(backend, spec, items, decode, progress)
    rows = _cell_rows(cells, scored)
    if spec.perplexity.enabled and backend.supports_perplexity:
        progress(f"{spec.name}: perplexity against evaluation length")
    ppl_rows = _perplexity(backend, spec, builder, train_length)
    all_rows = [{**keys, **r} for r in rows + ppl_rows]
    summary = {
        **keys, "spec": spec.name, "backend": backend.name, "family": backend.family,
        "train_length": train_length, "max_length": max_length, "space": builder.space,
        "n_examples": len(scored), "seconds": round(time.perf_counter() - t0, 2),
        "build_seconds": round(t_build, 2),
        "needle": needle_summary(rows, scored, train_length, spec.threshold),
        "litm": litm_summary(rows),
        "multi_needle": multi_needle_summary(rows),
        "hops": hops_summary(rows, scored),
        "aggregation": aggregation_summary(rows),
        "perplexity": [{k: r[k] for k in ("variant", "length", "n", "nll", "ppl", "status")}
                       for r in ppl_rows],
    }
    result = ProbeResult(all_rows, [{**keys, **e} for e in scored], summary)
    if out_dir is not None:
        write(result, out_dir, train_length=train_length, plots=plots)
    if log:
        log(format_report(summary, all_rows))
    return result
