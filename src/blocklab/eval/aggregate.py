"""From per-example scores to the numbers a probe report states (docs/probes.md, "Grids and
reports"): one row per cell with its Wilson interval, accuracy pooled within and beyond the
training length, the effective context length, accuracy by needle distance, and the
lost-in-the-middle curve shape.

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

EFFECTIVE_RULE = ("effective length = the largest evaluated length L whose accuracy (pooled over "
                  "depths) is >= {t} at L and at every shorter evaluated length (RULER rule; N/A "
                  "lengths end the run)")


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


def needle_summary(cells: list[dict[str, Any]], examples: list[dict[str, Any]],
                   train_length: int, threshold: float) -> dict[str, Any]:
    """Per needle variant: accuracy by length (pooled over depths), within / beyond the
    training length, the effective length under :data:`EFFECTIVE_RULE`, the baselines and the
    accuracy by needle distance."""
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
    """Per lost-in-the-middle curve (``<variant>/m=<records>``): accuracy by gold position and
    its shape (:func:`position_curve_summary`); the closed-book and oracle baselines as is."""
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


# ------------------------------------------------- multi-needle, variable tracking, aggregation


def _grid_summary(cells: list[dict[str, Any]], probe: str) -> dict[str, Any]:
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


def multi_needle_summary(cells: list[dict[str, Any]]) -> dict[str, Any]:
    """Multi-key / multi-value / multi-query needles: per variant, accuracy (all answers
    right) and partial credit by length, and pooled."""
    return _grid_summary(cells, "multi_needle")


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


def hops_summary(cells: list[dict[str, Any]], examples: list[dict[str, Any]]
                 ) -> dict[str, Any]:
    """Variable tracking: per hop count, accuracy by length and pooled; accuracy by hops
    (pooled over lengths) and, per hop count, by the depth of the farthest hop (the root
    statement) in :data:`DEPTH_BINS` bins."""
    per = _grid_summary(cells, "hops")
    hc = [c for c in cells if c["probe"] == "hops"]
    ex = [e for e in examples if e["probe"] == "hops"]
    for variant, s in per.items():
        s["hops"] = next(c["hops"] for c in hc if c["variant"] == variant)
        s["by_farthest_depth"] = depth_view([e for e in ex if e["variant"] == variant],
                                            "farthest_depth")
    return {"by_hops": per,
            "accuracy_by_hops": {str(s["hops"]): s["pooled"]["accuracy"] for s in per.values()},
            "by_farthest_depth": depth_view(ex, "farthest_depth")} if per else {}


def aggregation_summary(cells: list[dict[str, Any]]) -> dict[str, Any]:
    """Aggregation: per margin, accuracy by length and pooled, beside the copy line (1 /
    candidates) and the occurrence line (mean share of the winner among all occurrences)."""
    per = _grid_summary(cells, "aggregation")
    ac = [c for c in cells if c["probe"] == "aggregation"]
    for variant, s in per.items():
        vc = [c for c in ac if c["variant"] == variant and c["n"]]
        s["count_margin"] = next(c["count_margin"] for c in ac if c["variant"] == variant)
        s["winner_share"] = (sum(c["winner_share"] * c["n"] for c in vc)
                             / sum(c["n"] for c in vc)) if vc else None
    return per
