"""Probe aggregates (blocklab.eval.aggregate) against independent references: Wilson bounds by
brute-force inversion of the score test, the monotone effective-length rule, lost-in-the-middle
curve shape."""

from __future__ import annotations

import math

import pytest

from blocklab.eval.aggregate import effective_length, position_curve_summary, wilson_interval


def _score_test_accepts(p0: float, k: int, n: int, z: float = 1.959964) -> bool:
    """Does the two-sided score test at level 5% accept proportion p0 given k of n?"""
    p = k / n
    return abs(p - p0) <= z * math.sqrt(p0 * (1 - p0) / n)


@pytest.mark.parametrize(("k", "n"), [(0, 10), (3, 10), (10, 10), (1, 64), (32, 64), (63, 64),
                                      (250, 256)])
def test_wilson_bounds_are_where_the_score_test_stops_accepting(k, n):
    lo, hi = wilson_interval(k, n)
    grid = [i / 20000 for i in range(20001)]
    accepted = [p0 for p0 in grid if _score_test_accepts(p0, k, n)]
    assert lo == pytest.approx(min(accepted), abs=1e-4)
    assert hi == pytest.approx(max(accepted), abs=1e-4)
    assert 0 <= lo <= k / n <= hi <= 1


def test_wilson_edge_cases():
    assert wilson_interval(0, 0) == (0.0, 1.0)
    with pytest.raises(ValueError):
        wilson_interval(5, 4)
    narrow, wide = wilson_interval(500, 1000), wilson_interval(5, 10)
    assert narrow[1] - narrow[0] < wide[1] - wide[0]


def test_effective_length_is_monotone_and_stops_at_na():
    acc = {256: 0.95, 512: 0.9, 1024: 0.7, 2048: 0.85}
    assert effective_length(acc, 0.8) == 512  # 2048 passes but 1024 already failed
    assert effective_length(acc, 0.5) == 2048
    assert effective_length(acc, 0.99) is None
    assert effective_length({128: 1.0, 256: None, 512: 1.0}, 0.8) == 128  # N/A ends the run


def test_position_curve_summary_reads_the_u_shape():
    u = {0: 0.9, 4: 0.6, 9: 0.5, 14: 0.6, 19: 0.8}
    s = position_curve_summary(u)
    assert s["best_worst_gap"] == pytest.approx(0.4)
    assert s["primacy"] == pytest.approx(0.4) and s["recency"] == pytest.approx(0.3)
    assert s["middle_drop"] == pytest.approx(0.35)
    flat = position_curve_summary({0: 0.7, 5: 0.7, 9: 0.7})
    assert all(v == pytest.approx(0) for v in flat.values())
