"""Aggregate statistics shared by every probe (PROBES.md, "Grids and reports")."""

from __future__ import annotations

import math
from collections.abc import Mapping


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
