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


def _perplexity(backend, spec: ProbeSpec, builder, unit: int, progress: Progress
                ) -> tuple[list[dict[str, Any]], dict[str, Any] | None]:
    """Perplexity rows (decoders only) and what text they read; :class:`NotApplicable` from
    the text (none for this model, or a text that repeats) marks every row N/A with its
    reason instead of failing the run."""
    if not (spec.perplexity.enabled and backend.supports_perplexity):
        return [], None
    p = spec.perplexity
    lens = lengths_of(p.lengths, unit)
    progress(f"{spec.name}: perplexity against evaluation length: reading the text")
    try:
        text = builder.perplexity_text(spec, 2 * p.tokens + 2 * max(lens))
    except NotApplicable as e:
        return [{"probe": "perplexity", "variant": mode, "length": length, "n": 0,
                 "nll": None, "ppl": None, "status": e.status}
                for length in lens for mode in ("nonoverlapping", "sliding")], None
    rows = perplexity_rows(backend, text.documents, builder.bos, lens, p.tokens, p.stride,
                           batch_tokens=spec.batch_size * unit, progress=progress,
                           text=text.name)
    return rows, {"name": text.name, "note": text.note,
                  "tokens": sum(len(d) for d in text.documents)}


def _score(backend, spec: ProbeSpec, items: list, decode, progress: Progress
           ) -> list[dict[str, Any]]:
    """Score every item batch by batch (the same batches as one call over all items), counting
    the batches on ``progress``: a bar on a terminal, a line every ``progress.every`` seconds
    in a log."""
    # Items of one answer length batch together (a batch never mixes them: _batches), so they
    # are scored in order of answer length — text answers tokenize to a few different lengths,
    # and in grid order nearly every batch would hold one item — and put back in grid order.
    order = sorted(range(len(items)), key=lambda i: len(items[i].answer))
    batches = _batches([items[i] for i in order], spec.batch_size)
    scored: list[dict[str, Any]] = []
    with progress.count(f"{spec.name}, {len(items)} items: batches", len(batches)) as tick:
        for batch in batches:
            scored += score_items(backend, batch, batch_size=spec.batch_size, decode=decode,
                                  max_new_tokens=spec.text.max_new_tokens if decode else None)
            tick()
    out: list[dict[str, Any]] = [{}] * len(items)
    for i, row in zip(order, scored):
        out[i] = row
    return out


def plan_line(spec: ProbeSpec, cells: list[Cell], unit: int, train_length: int,
              perplexity: bool) -> str:
    """What the grid will do, said before it runs: items per kind, the tokens they hold, N/A
    cells, cells beyond the training length, and the perplexity work."""
    kinds_n: dict[str, int] = {}
    for c in cells:
        kinds_n[c.key["probe"]] = kinds_n.get(c.key["probe"], 0) + len(c.items)
    tokens = sum(len(it.prompt) + len(it.answer) for c in cells for it in c.items)
    na = sum(1 for c in cells if c.na is not None)
    beyond = sum(1 for c in cells if c.na is None and c.key.get("length", 0) > train_length)
    parts = [f"{sum(kinds_n.values()):,} items ("
             + ", ".join(f"{k} {n:,}" for k, n in kinds_n.items()) + f") holding {tokens:,} "
             f"tokens in {len(cells)} cells"]
    if na:
        parts.append(f"{na} cells N/A")
    if beyond:
        parts.append(f"{beyond} cells beyond the training length {train_length:,}")
    if perplexity:
        p = spec.perplexity
        lens = lengths_of(p.lengths, unit)
        parts.append(f"perplexity at {len(lens)} lengths ({min(lens):,}-{max(lens):,}) over "
                     f"{p.tokens:,} tokens each, two window layouts")
    return f"{spec.name}: " + "; ".join(parts)


def _flag_beyond(rows: list[dict[str, Any]], train_length: int) -> None:
    """Mark each row whose prompts run past the model's training length."""
    for r in rows:
        if isinstance(r.get("length"), int) and r["length"] > 0:
            r["beyond_train_length"] = r["length"] > train_length


def run_spec(backend, spec: ProbeSpec, *, builder, train_length: int, keys: dict[str, Any],
             out_dir: Path | None = None, decode: Callable[[list[int]], str] | None = None,
             plots: bool = True, log: Callable[[str], None] | None = None,
             progress: Progress | None = None, context: int | None = None,
             title: str | None = None) -> ProbeResult:
    """Build (through ``builder``: token or text space), score, aggregate and write. Lengths
    are multiples of ``train_length``; ``context`` is the length the model was trained at
    (default: ``train_length``) — what "within / beyond the training length" and the plots'
    "train L" mean. Progress — the plan first, then counted batches — on stderr
    (``progress``: default a line at most every 10 s); ``title`` heads every plot."""
    t0 = time.perf_counter()
    unit, context = train_length, context or train_length
    max_length = backend.max_length()
    cells = _build(builder, spec, unit, max_length)
    items = [it for c in cells for it in c.items]
    t_build = time.perf_counter() - t0
    progress = progress or Progress("probes")
    perplexity = spec.perplexity.enabled and backend.supports_perplexity
    progress(plan_line(spec, cells, unit, context, perplexity))
    scored = _score(backend, spec, items, decode, progress)
    t_items = time.perf_counter() - t0
    rows = _cell_rows(cells, scored)
    ppl_rows, ppl_text = _perplexity(backend, spec, builder, unit, progress)
    all_rows = [{**keys, **r} for r in rows + ppl_rows]
    _flag_beyond(all_rows, context)
    summary = {
        **keys, "spec": spec.name, "backend": backend.name, "family": backend.family,
        "train_length": context, "length_unit": unit, "max_length": max_length,
        "space": builder.space, "title": title,
        "n_examples": len(scored), "seconds": round(time.perf_counter() - t0, 2),
        "build_seconds": round(t_build, 2), "item_seconds": round(t_items, 2),
        **{kind.name: kind.summary(rows, scored, train_length=context,
                                   threshold=spec.threshold)
           for kind in kinds() if kind.configured(spec)},
        "perplexity": [{k: r[k] for k in ("variant", "length", "n", "nll", "ppl", "status")}
                       for r in ppl_rows],
        "perplexity_text": ppl_text,
    }
    result = ProbeResult(all_rows, [{**keys, **e} for e in scored], summary)
    if out_dir is not None:
        write(result, out_dir, train_length=context, plots=plots)
    if log:
        log(format_report(summary, all_rows))
    return result
