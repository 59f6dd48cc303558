"""Run a probe spec on a backend: build the cells, score every item in batches, aggregate, and
write the long-form CSV, the JSON summary and the PNGs (docs/probes.md, "Grids and reports").

This module only orchestrates, iterating over the probe kinds (``blocklab.eval.kinds``: one
component per kind, blocklab's and registered ones) without naming any; each job has its own
module:

- each kind builds its cells and items on the token-space builder (``blocklab.eval.items``) or
  the text-space one (``blocklab.eval.textspace``), and makes its summary;
- ``blocklab.eval.scoring`` scores each item (argmax accuracy, greedy exact match, log-prob,
  margin over the best other in-context answer, gold rank, the copy-any-value shortcut);
- ``blocklab.eval.aggregate`` turns the scores into cell rows with Wilson 95% intervals and
  holds the statistics the kinds' summaries use;
- ``blocklab.eval.perplexity`` measures perplexity against evaluation length;
- ``blocklab.eval.report`` writes the report folder and formats the printed table.

Nothing here draws from a global random generator: items are pure functions of the spec seed.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from blocklab.config import ProbeSpec
from blocklab.eval.aggregate import cell_row
from blocklab.eval.items import Cell, NotApplicable, ProbeResult, lengths_of
from blocklab.eval.kinds import kinds
from blocklab.eval.perplexity import perplexity_rows
from blocklab.eval.report import format_report, write
from blocklab.eval.scoring import _batches, score_items
from blocklab.progress import Progress

__all__ = ["ProbeResult", "run_spec"]


def _build(builder, spec: ProbeSpec, train_length: int, max_length: int | None) -> list[Cell]:
    """The cells of every enabled kind, kind by kind in the registry's order."""
    cells: list[Cell] = []
    for kind in kinds():
        if kind.configured(spec) and kind.settings(spec).enabled:
            cells += kind.cells(builder, spec, train_length, max_length)
    return cells


def _cell_rows(cells: list[Cell], scored: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One aggregated row per cell; ``scored`` holds the examples of every cell, in order."""
    rows, i = [], 0
    for c in cells:
        rows.append(cell_row(c, scored[i:i + len(c.items)]))
        i += len(c.items)
    return rows


def _perplexity(backend, spec: ProbeSpec, builder, train_length: int) -> list[dict[str, Any]]:
    """Perplexity rows (decoders only); :class:`NotApplicable` from the stream builder marks
    every row N/A with its reason instead of failing the run."""
    if not (spec.perplexity.enabled and backend.supports_perplexity):
        return []
    p = spec.perplexity
    lens = lengths_of(p.lengths, train_length)
    try:
        stream, bos = builder.stream(spec, p.tokens + 2 * max(lens))
        return perplexity_rows(backend, stream, bos, lens, p.tokens, p.stride,
                               batch_tokens=spec.batch_size * train_length)
    except NotApplicable as e:
        return [{"probe": "perplexity", "variant": mode, "length": length, "n": 0,
                 "nll": None, "ppl": None, "status": e.status}
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
        **{kind.name: kind.summary(rows, scored, train_length=train_length,
                                   threshold=spec.threshold)
           for kind in kinds() if kind.configured(spec)},
        "perplexity": [{k: r[k] for k in ("variant", "length", "n", "nll", "ppl", "status")}
                       for r in ppl_rows],
    }
    result = ProbeResult(all_rows, [{**keys, **e} for e in scored], summary)
    if out_dir is not None:
        write(result, out_dir, train_length=train_length, plots=plots)
    if log:
        log(format_report(summary, all_rows))
    return result
