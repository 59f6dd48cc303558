"""The benchmark script keeps working (a smoke run of tiny shapes; nothing is timed here)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from inprocess import SAFETY_S

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_bench_quick_runs_and_checks_that_peers_do_the_same_work(tmp_path):
    out = tmp_path / "bench.json"
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench_model.py"), "--quick",
                        "--reps", "1", "--threads", "1", "--json", str(out)],
                       capture_output=True, text=True, timeout=SAFETY_S)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "greedy tokens equal: 100%" in r.stdout
    assert out.is_file() and json.loads(out.read_text())


@pytest.mark.slow
def test_bench_shakespeare_quick_runs_both_loops_on_the_same_model(tmp_path):
    """scripts/bench_shakespeare.py at tiny sizes on a small text file: blocklab's step and the
    plain nanoGPT-style loop train models of the same size, and every ratio is reported."""
    corpus = tmp_path / "input.txt"
    corpus.write_text("\n".join(f"Line {i}: to be, or not to be, that is the question."
                                for i in range(400)))
    out = tmp_path / "bench.json"
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench_shakespeare.py"),
                        "--quick", "--corpus", str(corpus), "--cache", str(tmp_path / "cache"),
                        "--reps", "2", "--steps", "2", "--warmup-steps", "1", "--peak-steps", "1",
                        "--threads", "1", "--json", str(out)],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads(out.read_text())
    assert res["params"]["blocklab"] == res["params"]["nanogpt"] > 0
    assert len(res["ratio_tokens_per_s"]) == len(res["ratio_cpu"]) == 2
    assert set(res["peak_mb"]) == {"blocklab", "nanogpt"} and res["ratio_peak_memory"] > 0
    assert "blocklab / nanogpt tokens/s min/med/max" in r.stdout
    assert "load average" in r.stdout
