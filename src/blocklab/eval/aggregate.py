"""From per-example scores to the numbers a probe report states (docs/probes.md, "Grids and
reports"): one row per cell with its Wilson interval, pooled accuracy, the effective context
length rule, accuracy by distance and by depth, a curve's shape, and the per-variant summary
of a grid kind. Each probe kind's own summary (``blocklab.eval.kinds``) is built from these.

Kept apart from the scoring (``blocklab.eval.scoring``, which needs a model and torch) so that
the statistics can be checked against independent references and reused on saved example rows
without torch.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from blocklab.eval.items import Cell

# ------------------------------------------------------------------------------- statistics


def wilson_interval(successes: int, n: int, z: float = 1.959964) -> tuple[float, float]:
    """Wilson score interval for a binomial proportion (95% by default): well behaved at 0 and
    n successes and for small n, unlike the normal approximation. Wilson (1927), "Probable
    inference, the law of succession, and statistical inference", JASA 22(158)."""
    if n <= 0:
        return (0.0, 1.0)
    if not 0 <= successes <= n:
        raise ValueError(f"successes={successes} outside [0, n={n}]")
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    lo = 0.0 if successes == 0 else max(0.0, centre - half)  # exact ends, no rounding residue
    hi = 1.0 if successes == n else min(1.0, centre + half)
    return (lo, hi)


def effective_length(accuracy_by_length: Mapping[int, float | None], threshold: float) -> int | None:
    """Largest length L with accuracy >= ``threshold`` at L and at every shorter measured length
    (the monotone rule of RULER, arXiv 2404.06654; Position Interpolation uses 0.2, YaRN 0.8).
    Lengths a scheme cannot index (accuracy ``None``, N/A) end the run. ``None`` when even the
    shortest length misses the threshold."""
    best = None
    for length in sorted(accuracy_by_length):
        acc = accuracy_by_length[length]
        if acc is None or acc < threshold:
            break
        best = length
    return best


def position_curve_summary(accuracy_by_position: Mapping[int, float]) -> dict[str, float]:
    """Lost-in-the-middle shape of accuracy over gold positions 0..m-1 (arXiv 2307.03172):
    best–worst gap, primacy (first minus middle), recency (last minus middle) and the middle
    drop (mean of the ends minus the middle)."""
    if not accuracy_by_position:
        raise ValueError("no positions")
    positions = sorted(accuracy_by_position)
    values = [accuracy_by_position[p] for p in positions]
    first, last = values[0], values[-1]
    middle = values[len(values) // 2]
    return {"best_worst_gap": max(values) - min(values), "primacy": first - middle,
            "recency": last - middle, "middle_drop": (first + last) / 2 - middle}


# ------------------------------------------------------------------------------------ cells


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
    if "partial" in rows[0]:  # RULER's "all" score: share of the required answers found
        out["partial"] = sum(r["partial"] for r in rows) / n
    if "choice" in rows[0]:  # a label set: forced choice, and the generation's interval
        for name in ("choice", "exact"):
            hits = sum(bool(r[name]) for r in rows)
            out[name] = hits / n
            out[f"{name}_low"], out[f"{name}_high"] = wilson_interval(hits, n)
    if "actual_depth" in rows[0]:
        out["actual_depth"] = sum(r["actual_depth"] for r in rows) / n
    if "winner_share" in rows[0]:  # aggregation: what copying a random occurrence scores
        out["winner_share"] = sum(r["winner_share"] for r in rows) / n
    return out


def pooled(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Accuracy pooled over cells (successes and trials summed), with its interval."""
    n = sum(r["n"] for r in rows)
    k = sum(round(r["accuracy"] * r["n"]) for r in rows if r["n"])
    lo, hi = wilson_interval(k, n)
    return {"n": n, "accuracy": k / n if n else None, "ci_low": lo if n else None,
            "ci_high": hi if n else None}


# ---------------------------------------------------------------------------------- summaries


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


# ------------------------------------------------------------------------- grid kinds


def grid_summary(cells: list[dict[str, Any]], probe: str) -> dict[str, Any]:
    """Per variant of ``probe``: accuracy (and partial credit) by length, pooled over lengths
    with its Wilson interval, and the cell's chance and copy lines."""
    out: dict[str, Any] = {}
    pc = [c for c in cells if c["probe"] == probe]
    for variant in dict.fromkeys(c["variant"] for c in pc):
        vc = [c for c in pc if c["variant"] == variant]
        ok = [c for c in vc if c["n"]]
        out[variant] = {
            "accuracy_by_length": {str(c["length"]): c["accuracy"] for c in vc},
            "partial_by_length": {str(c["length"]): c.get("partial") for c in vc},
            "pooled": pooled(ok),
            "n_not_applicable": len(vc) - len(ok),
            "copy_any_value": vc[0]["copy_any_value"], "chance": vc[0]["chance"],
        }
    return out


#: Farthest-hop depth bins of the variable-tracking summary: [0, 0.2), ..., [0.8, 1.0].
DEPTH_BINS = 5


def depth_view(examples: list[dict[str, Any]], key: str, bins: int = DEPTH_BINS
               ) -> list[dict[str, Any]]:
    """Accuracy by ``key`` (a depth in [0, 1]) in ``bins`` equal bins (1.0 in the last), each
    with its Wilson interval; empty bins are left out."""
    groups: dict[int, list[bool]] = {}
    for e in examples:
        b = min(int(float(e[key]) * bins), bins - 1)
        groups.setdefault(b, []).append(bool(e["argmax"]))
    rows = []
    for b in sorted(groups):
        hits = groups[b]
        lo, hi = wilson_interval(sum(hits), len(hits))
        rows.append({"depth_from": b / bins, "depth_to": (b + 1) / bins, "n": len(hits),
                     "accuracy": sum(hits) / len(hits), "ci_low": lo, "ci_high": hi})
    return rows
