"""Run a probe spec on a backend: build the cells, score every item in batches, aggregate, and
write the long-form CSV, the JSON summary and the PNGs (PROBES.md, "Grids and reports").

Per example: argmax accuracy (every answer token the argmax under teacher forcing), greedy exact
match of the whole answer through the KV cache (text space: normalized substring match of the
generation), log-prob of the gold answer, its margin over the best other in-context answer, the
rank of the gold first token in the vocabulary, and whether the prediction is *any* in-context
answer (the copy-any-value shortcut). Per cell: Wilson 95% intervals. Per probe: accuracy within
and beyond the training length, effective context length (threshold and rule stated), the
lost-in-the-middle curve shape, perplexity vs evaluation length.

Nothing here draws from a global random generator: items are pure functions of the spec seed.
"""

from __future__ import annotations

import csv
import json
import math
import os
import re
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from blocklab.config import ProbeSpec
from blocklab.eval.items import Cell, ProbeItem, lengths_of
from blocklab.eval.scoring import effective_length, position_curve_summary, wilson_interval

EFFECTIVE_RULE = ("effective length = the largest evaluated length L whose accuracy (pooled over "
                  "depths) is >= {t} at L and at every shorter evaluated length (RULER rule; N/A "
                  "lengths end the run)")


@dataclass
class ProbeResult:
    """Scored cells (one row each), per-example rows, the summary, and where files went."""

    cells: list[dict[str, Any]]
    examples: list[dict[str, Any]]
    summary: dict[str, Any]
    out_dir: Path | None = None
    files: dict[str, str] = field(default_factory=dict)


def normalize(text: str) -> str:
    return " ".join(re.sub(r"[^0-9a-z]+", " ", text.lower()).split())


@torch.no_grad()
def score_items(backend, items: list[ProbeItem], *, batch_size: int,
                decode: Callable[[list[int]], str] | None = None,
                max_new_tokens: int | None = None) -> list[dict[str, Any]]:
    """Per-example scores, batched (no per-example Python in the model's hot path)."""
    out: list[dict[str, Any]] = []
    for start in range(0, len(items), batch_size):
        out += _score_batch(backend, items[start:start + batch_size], decode, max_new_tokens)
    return out


def _score_batch(backend, items: list[ProbeItem], decode, max_new_tokens) -> list[dict[str, Any]]:
    prompts, answers = [it.prompt for it in items], [it.answer for it in items]
    logp, mask = backend.answer_logprobs(prompts, answers)
    b, a = mask.shape
    gold = torch.zeros((b, a), dtype=torch.long)
    for i, ans in enumerate(answers):
        gold[i, : len(ans)] = torch.tensor(ans)
    tok_lp = logp.gather(-1, gold[..., None]).squeeze(-1).masked_fill(~mask, 0.0)
    gold_lp = tok_lp.sum(-1)
    pred = logp.argmax(-1)
    argmax_ok = ((pred == gold) | ~mask).all(-1)
    first = logp[:, 0]
    rank = (first > first.gather(-1, gold[:, :1])).sum(-1) + 1
    # Other in-context answers: margins and the copy-any-value diagnostic.
    n_c = max(len(it.candidates) for it in items)
    cand_first = torch.full((b, max(n_c, 1)), -1, dtype=torch.long)
    for i, it in enumerate(items):
        for c, cand in enumerate(it.candidates):
            cand_first[i, c] = cand[0]
    any_value = (cand_first == pred[:, :1]).any(-1)
    best_other = _best_other(backend, items, first)
    margin = gold_lp - best_other
    if decode is None and a == 1:
        # One-token answers: the first greedy token *is* the argmax of this distribution (the
        # KV-cached generation path is checked to agree in tests), so no second pass.
        exact, generated = argmax_ok.tolist(), None
    else:
        n_new = max_new_tokens or a
        generated = backend.greedy(prompts, n_new)
        exact = []
        for it, g in zip(items, generated):
            if decode is not None and it.answer_text is not None:
                exact.append(normalize(it.answer_text) in normalize(decode(g)))
            else:
                exact.append(g[: len(it.answer)] == it.answer)
    rows = []
    for i, it in enumerate(items):
        row = {**it.cell, "argmax": bool(argmax_ok[i]), "exact": bool(exact[i]),
               "logprob": float(gold_lp[i]), "margin": float(margin[i]), "rank": int(rank[i]),
               "any_value": bool(any_value[i]), **it.meta}
        if generated is not None and decode is not None:
            row["generated"] = decode(generated[i])
        rows.append(row)
    return rows


def _best_other(backend, items: list[ProbeItem], first: torch.Tensor) -> torch.Tensor:
    """Best log-prob among the other in-context answers (-inf when there are none). One-token
    candidates are read off the same distribution; longer ones are scored jointly with the
    prompt, batched."""
    b = len(items)
    best = torch.full((b,), -math.inf)
    if all(len(c) == 1 for it in items for c in it.candidates) and all(
            len(it.answer) == 1 for it in items):
        for i, it in enumerate(items):
            others = [c[0] for j, c in enumerate(it.candidates) if j != it.gold]
            if others:
                best[i] = first[i, others].max()
        return best
    pairs = [(i, c) for i, it in enumerate(items) for j, c in enumerate(it.candidates) if j != it.gold]
    if not pairs:
        return best
    lp, mask = backend.answer_logprobs([items[i].prompt for i, _ in pairs], [c for _, c in pairs])
    ids = torch.zeros(mask.shape, dtype=torch.long)
    for r, (_, c) in enumerate(pairs):
        ids[r, : len(c)] = torch.tensor(c)
    total = lp.gather(-1, ids[..., None]).squeeze(-1).masked_fill(~mask, 0.0).sum(-1)
    for r, (i, _) in enumerate(pairs):
        best[i] = max(best[i], total[r])
    return best


# ------------------------------------------------------------------------------ aggregation


def cell_row(cell: Cell, rows: list[dict[str, Any]]) -> dict[str, Any]:
    """One long-form CSV row: n, accuracy with its Wilson interval, exact match, mean log-prob,
    margin, median rank, any-value rate, baselines; N/A cells keep their reason."""
    base = {**cell.key, "copy_any_value": cell.copy_any_value, "chance": cell.chance}
    if cell.na is not None or not rows:
        return {**base, "n": 0, "accuracy": None, "ci_low": None, "ci_high": None,
                "status": cell.na or "n/a: no items"}
    n = len(rows)
    k = sum(r["argmax"] for r in rows)
    lo, hi = wilson_interval(k, n)
    margins = [r["margin"] for r in rows if math.isfinite(r["margin"])]
    ranks = sorted(r["rank"] for r in rows)
    out = {**base, "n": n, "accuracy": k / n, "ci_low": lo, "ci_high": hi,
           "exact": sum(r["exact"] for r in rows) / n,
           "logprob": sum(r["logprob"] for r in rows) / n,
           "margin": sum(margins) / len(margins) if margins else None,
           "rank_median": ranks[n // 2], "any_value": sum(r["any_value"] for r in rows) / n,
           "status": "ok"}
    if "actual_depth" in rows[0]:
        out["actual_depth"] = sum(r["actual_depth"] for r in rows) / n
    return out


def pooled(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Accuracy pooled over cells (successes and trials summed), with its interval."""
    n = sum(r["n"] for r in rows)
    k = sum(round(r["accuracy"] * r["n"]) for r in rows if r["n"])
    lo, hi = wilson_interval(k, n)
    return {"n": n, "accuracy": k / n if n else None, "ci_low": lo if n else None,
            "ci_high": hi if n else None}


def needle_summary(cells: list[dict[str, Any]], examples: list[dict[str, Any]],
                   train_length: int, threshold: float) -> dict[str, Any]:
    out = {}
    for variant in dict.fromkeys(c["variant"] for c in cells if c["probe"] == "needle"):
        vc = [c for c in cells if c["probe"] == "needle" and c["variant"] == variant]
        by_len: dict[int, float | None] = {}
        for length in sorted({c["length"] for c in vc}):
            lc = [c for c in vc if c["length"] == length]
            by_len[length] = None if any(c["n"] == 0 for c in lc) else pooled(lc)["accuracy"]
        ok = [c for c in vc if c["n"]]
        ex = [e for e in examples if e["probe"] == "needle" and e["variant"] == variant]
        out[variant] = {
            "accuracy_by_length": {str(k): v for k, v in by_len.items()},
            "within_train_length": pooled([c for c in ok if c["length"] <= train_length]),
            "beyond_train_length": pooled([c for c in ok if c["length"] > train_length]),
            "effective_length": effective_length(by_len, threshold),
            "threshold": threshold, "rule": EFFECTIVE_RULE.format(t=threshold),
            "n_not_applicable": sum(1 for c in vc if not c["n"]),
            "copy_any_value": vc[0]["copy_any_value"], "chance": vc[0]["chance"],
            "by_distance": distance_view(ex),
        }
    return out


def distance_view(examples: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Accuracy by tokens between the needle and the query, in power-of-two bins (relative
    position schemes fail by distance, not by depth %)."""
    bins: dict[int, list[bool]] = {}
    for e in examples:
        d = max(int(e.get("distance", 1)), 1)
        bins.setdefault(1 << (d.bit_length() - 1), []).append(e["argmax"])
    rows = []
    for lo in sorted(bins):
        hits = bins[lo]
        ci = wilson_interval(sum(hits), len(hits))
        rows.append({"distance_from": lo, "distance_to": 2 * lo - 1, "n": len(hits),
                     "accuracy": sum(hits) / len(hits), "ci_low": ci[0], "ci_high": ci[1]})
    return rows


def litm_summary(cells: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    lc = [c for c in cells if c["probe"] == "litm"]
    for variant in ("kv_records", "query_aware"):
        for m in sorted({c["n_records"] for c in lc if c["variant"] == variant}):
            curve = {c["gold_position"]: c["accuracy"] for c in lc
                     if c["variant"] == variant and c["n_records"] == m and c["n"]}
            if curve:
                out[f"{variant}/m={m}"] = {"accuracy_by_gold_position": {str(k): v for k, v in
                                                                        sorted(curve.items())},
                                           **position_curve_summary(curve),
                                           "copy_any_value": 1 / m}
    for variant in ("closed_book", "oracle"):
        for c in lc:
            if c["variant"] == variant and c["n"]:
                out[variant] = {k: c[k] for k in ("n", "accuracy", "ci_low", "ci_high", "chance")}
    return out


# ------------------------------------------------------------------------------- perplexity


def window_plan(n_stream: int, body: int, mode: str, stride: float, n_tokens: int
                ) -> list[tuple[int, int]]:
    """(start, first scored offset) of each window of ``body`` stream tokens, until at least
    ``n_tokens`` are scored: non-overlapping windows score everything; sliding windows advance
    by ``stride·body`` and score only the tokens no earlier window scored."""
    step = body if mode == "nonoverlapping" else max(1, round(stride * body))
    plan: list[tuple[int, int]] = []
    pos = scored = 0
    while scored < n_tokens and pos + body <= n_stream:
        first = 0 if (mode == "nonoverlapping" or pos == 0) else body - step
        plan.append((pos, first))
        scored += body - first
        pos += step
    return plan


@torch.no_grad()
def perplexity_rows(backend, stream: list[int], bos: int | None, lengths: list[int],
                    n_tokens: int, stride: float, batch_tokens: int) -> list[dict[str, Any]]:
    """Perplexity at each evaluation length: non-overlapping windows, and a sliding window that
    scores only its last ``stride`` fraction (every scored token then has at least
    (1 - stride)·L tokens of context). Each window starts with ``bos`` when given (as every
    training sequence does)."""
    rows = []
    head = [bos] if bos is not None else []
    limit = backend.max_length()
    for length in lengths:
        body = length - len(head)
        for mode in ("nonoverlapping", "sliding"):
            key = {"probe": "perplexity", "variant": mode, "length": length}
            if limit is not None and length > limit:
                rows.append({**key, "n": 0, "nll": None, "ppl": None,
                             "status": f"n/a: length {length} > {limit} positions the model "
                                       "can index"})
                continue
            plan = window_plan(len(stream), body, mode, stride, n_tokens)
            starts, scored_from = [p[0] for p in plan], [p[1] for p in plan]
            if not starts:
                rows.append({**key, "n": 0, "nll": None, "ppl": None,
                             "status": f"n/a: stream of {len(stream)} tokens < length {length}"})
                continue
            total, count = 0.0, 0
            per_batch = max(1, batch_tokens // length)
            for i in range(0, len(starts), per_batch):
                chunk = starts[i:i + per_batch]
                windows = torch.tensor([head + stream[s:s + body] for s in chunk])
                nll = backend.token_nll(windows)  # (B, length-1): predicts tokens 1..length-1
                for r, s in enumerate(scored_from[i:i + per_batch]):
                    part = nll[r, len(head) - 1 + s:] if head else nll[r, max(s - 1, 0):]
                    total, count = total + float(part.sum()), count + part.numel()
            rows.append({**key, "n": count, "nll": total / count, "ppl": math.exp(total / count),
                         "status": "ok"})
    return rows


# ----------------------------------------------------------------------------------- runner


def run_spec(backend, spec: ProbeSpec, *, builder, train_length: int, keys: dict[str, Any],
             out_dir: Path | None = None, decode: Callable[[list[int]], str] | None = None,
             plots: bool = True, log: Callable[[str], None] | None = None) -> ProbeResult:
    """Build (through ``builder``: token or text space), score, aggregate and write."""
    t0 = time.perf_counter()
    max_length = backend.max_length()
    cells: list[Cell] = []
    if spec.needle.enabled:
        cells += builder.needle_cells(spec, train_length, max_length)
    if spec.litm.enabled:
        cells += builder.litm_cells(spec, max_length)
    items = [it for c in cells for it in c.items]
    t_build = time.perf_counter() - t0
    scored = score_items(backend, items, batch_size=spec.batch_size, decode=decode,
                         max_new_tokens=spec.text.max_new_tokens if decode else None)
    by_cell: dict[int, list[dict[str, Any]]] = {}
    i = 0
    for ci, c in enumerate(cells):
        by_cell[ci] = scored[i:i + len(c.items)]
        i += len(c.items)
    rows = [cell_row(c, by_cell[ci]) for ci, c in enumerate(cells)]
    ppl_rows: list[dict[str, Any]] = []
    if spec.perplexity.enabled and backend.family == "decoder":
        p = spec.perplexity
        lens = lengths_of(p.lengths, train_length)
        try:
            stream, bos = builder.stream(spec, p.tokens + 2 * max(lens))
            ppl_rows = perplexity_rows(backend, stream, bos, lens, p.tokens, p.stride,
                                       batch_tokens=spec.batch_size * train_length)
        except ValueError as e:
            if not str(e).startswith("n/a"):
                raise
            ppl_rows = [{"probe": "perplexity", "variant": mode, "length": length, "n": 0,
                         "nll": None, "ppl": None, "status": str(e)}
                        for length in lens for mode in ("nonoverlapping", "sliding")]
    all_rows = [{**keys, **r} for r in rows + ppl_rows]
    summary = {
        **keys, "spec": spec.name, "backend": backend.name, "family": backend.family,
        "train_length": train_length, "max_length": max_length, "space": builder.space,
        "n_examples": len(scored), "seconds": round(time.perf_counter() - t0, 2),
        "build_seconds": round(t_build, 2),
        "needle": needle_summary(rows, scored, train_length, spec.threshold),
        "litm": litm_summary(rows),
        "perplexity": [{k: r[k] for k in ("variant", "length", "n", "nll", "ppl", "status")}
                       for r in ppl_rows],
    }
    result = ProbeResult(all_rows, [{**keys, **e} for e in scored], summary)
    if out_dir is not None:
        write(result, out_dir, train_length=train_length, plots=plots)
    if log:
        log(format_report(summary, all_rows))
    return result


# ---------------------------------------------------------------------------------- outputs


def _csv(path: Path, rows: list[dict[str, Any]]) -> None:
    fields = list(dict.fromkeys(k for r in rows for k in r))
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        for r in rows:
            w.writerow({k: ("" if r.get(k) is None else r.get(k)) for k in fields})


def write(result: ProbeResult, out_dir: Path, *, train_length: int, plots: bool = True) -> None:
    """Write into a temporary sibling, then swap it in: a crash never leaves half a report."""
    out_dir = Path(out_dir)
    tmp = out_dir.with_name(out_dir.name + f".tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    files = {"cells": "cells.csv", "examples": "examples.csv", "summary": "summary.json"}
    _csv(tmp / files["cells"], result.cells)
    _csv(tmp / files["examples"], result.examples)
    if plots:
        files.update(_plots(result, tmp, train_length))
    result.summary["files"] = files
    (tmp / files["summary"]).write_text(json.dumps(result.summary, indent=2, default=str))
    if out_dir.exists():
        old = out_dir.with_name(out_dir.name + f".old-{os.getpid()}")
        out_dir.rename(old)
        tmp.rename(out_dir)
        shutil.rmtree(old, ignore_errors=True)
    else:
        tmp.rename(out_dir)
    result.out_dir = out_dir
    result.files = {k: str(out_dir / v) for k, v in files.items()}


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
    if any(c["probe"] == "perplexity" and c.get("ppl") is not None for c in result.cells):
        out["perplexity_png"] = plots.plot_perplexity(
            result.cells, folder / "perplexity.png", train_length=train_length, title=title).name
    return out


def _fmt(x: float | None, spec: str = ".3f") -> str:
    return "N/A" if x is None else format(x, spec)


def format_report(summary: dict[str, Any], rows: list[dict[str, Any]]) -> str:
    """The probe table printed at the end of training and by blocklab-eval."""
    lines = []
    for variant, s in summary["needle"].items():
        lengths = list(s["accuracy_by_length"])
        lines.append(f"needle, {variant} (argmax accuracy pooled over depths; copy-any-value "
                     f"{_fmt(s['copy_any_value'])}, chance {_fmt(s['chance'])}):")
        lines.append("  length    " + "".join(f"{x:>8}" for x in lengths))
        lines.append("  accuracy  " + "".join(f"{_fmt(s['accuracy_by_length'][x]):>8}"
                                              for x in lengths))
        w, b = s["within_train_length"], s["beyond_train_length"]
        lines.append(f"  within training length {_fmt(w['accuracy'])} "
                     f"[{_fmt(w['ci_low'])}, {_fmt(w['ci_high'])}] n={w['n']}; beyond "
                     f"{_fmt(b['accuracy'])} [{_fmt(b['ci_low'])}, {_fmt(b['ci_high'])}] "
                     f"n={b['n']}")
        eff = s["effective_length"]
        lines.append(f"  effective length {eff if eff is not None else 'none'} "
                     f"(threshold {s['threshold']}: {s['rule'].split(' = ', 1)[1]})")
    litm = summary["litm"]
    if litm:
        lines.append("lost in the middle (accuracy by gold record position):")
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
    na = {r["status"] for r in summary["perplexity"] if r["ppl"] is None}
    if summary["perplexity"] and len(na) == 1 and all(r["ppl"] is None
                                                       for r in summary["perplexity"]):
        lines.append(f"perplexity vs evaluation length: {na.pop()}")
    elif summary["perplexity"]:
        lines.append("perplexity vs evaluation length:")
        for r in summary["perplexity"]:
            lines.append(f"  {r['variant']:<15} L={r['length']:<6} "
                         f"{_fmt(r['ppl'], '.3f') if r['ppl'] is not None else r['status']}")
    lines.append(f"({summary['n_examples']} examples in {summary['seconds']:.1f} s)")
    return "\n".join(lines)
