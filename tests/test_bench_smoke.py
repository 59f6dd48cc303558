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
