"""scripts/bench_patterns.py keeps working: its tiny mode (``--quick``) runs every section and
writes every row and column of the report, with finite figures. Nothing is timed here: the
speed-ups and memory figures of a tiny run are not checked, only that they exist; what is
checked is what does not depend on the machine — every pattern's blocked output equals its
dense mask's, and the fractions of pairs are fractions."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from inprocess import SAFETY_S

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "bench_patterns.py"


def _load():
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_patterns", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # its dataclass looks its module up
    sys.path.insert(0, str(SCRIPT.parent))
    try:
        spec.loader.exec_module(mod)
    finally:
        sys.path.remove(str(SCRIPT.parent))
    return mod


def _positive(xs) -> bool:
    return bool(xs) and all(isinstance(x, float) and math.isfinite(x) and x > 0 for x in xs)


@pytest.mark.slow
def test_quick_run_writes_every_row_with_finite_figures(tmp_path):
    out = tmp_path / "patterns.json"
    r = subprocess.run([sys.executable, str(SCRIPT), "--quick", "--reps", "2", "--threads",
                        "1", "--json", str(out)], capture_output=True, text=True,
                       timeout=SAFETY_S)
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads(out.read_text())
    labels = [c.label for c in _load().patterns(quick=True)]
    assert len(labels) == 7 and res["threads"] == 1 and len(res["load_average"]) == 3

    assert [row["pattern"] for row in res["train"]] == labels
    for row in res["train"]:
        assert row["max_abs_diff"] < 1e-5, row  # blocked == dense mask, before any timing
        assert 0 < row["kept_of_t2"] <= row["kept_of_causal"] <= 1, row
        # each path ran: the dense one scores all T² pairs, the blocked one fewer, and at
        # least every kept pair (its band covers the pattern)
        assert row["scored_of_t2"]["dense"] == 1.0
        assert row["kept_of_t2"] <= row["scored_of_t2"]["blocked"] < 1, row
        assert _positive(row["times"]["blocked"]) and _positive(row["times"]["dense"])
        assert len(row["speedup"]) == 2 and _positive(row["speedup"])

    assert [row["pattern"] for row in res["memory"]] == labels
    for row in res["memory"]:
        assert row["T"] == [64, 128, 256]
        for path in ("blocked", "dense"):
            mb = row["peak_mb"][path]
            assert len(mb) == 3 and all(math.isfinite(x) and x >= 0 for x in mb), row

    assert [row["arm"] for row in res["decode"]] == ["sinks 4 + window 16", "chunk 16",
                                                      "global"]
    for row in res["decode"]:
        assert row["contexts"] == [64, 128, 256]
        assert all(_positive(row["ms_per_token"][str(n)]) for n in row["contexts"])
        assert set(row["ratio_to_shortest"]) == {"128", "256"}
        assert all(_positive(r) for r in row["ratio_to_shortest"].values())
    for heading in ("1. one softmax layer's training step", "2. peak memory", "3. decoding"):
        assert heading in r.stdout


def test_a_figure_that_is_not_finite_is_caught():
    """The script's last check (it exits non-zero on a NaN or an infinity anywhere)."""
    finite = _load().finite
    assert finite({"a": [1.0, 2], "b": {"c": (0.5,)}, "d": "text"})
    assert not finite({"a": [1.0, float("nan")]})
    assert not finite({"b": {"c": (float("inf"),)}})
