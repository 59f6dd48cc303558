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


@pytest.mark.slow
def test_bench_scan_times_both_scans_on_the_same_model():
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench_scan.py"), "--arm",
                        "ssm s4 64/4", "--reps", "1"], capture_output=True, text=True,
                       timeout=SAFETY_S)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "same outputs" in r.stdout and "x the chunked scan's speed" in r.stdout


def test_probe_curves_reads_checkpoint_probes_back_across_versions(tmp_path, capsys):
    """scripts/probe_curves.py: the hops probe's per-checkpoint accuracy, read from every
    metrics.csv version (a resumed run's later row wins), as a table and a plot."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("probe_curves",
                                                  ROOT / "scripts" / "probe_curves.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    run = tmp_path / "run"
    for version, rows in ((0, [(10, "", "0.3"), (1000, "0.5", "0.4"), (2000, "0.9", "")]),
                          (1, [(2000, "0.7", "0.6"), (3000, "1.0", "0.8")])):
        d = run / "logs" / f"version_{version}"
        d.mkdir(parents=True)
        (d / "metrics.csv").write_text(
            "step,train/loss,probe/hops_1_hops/accuracy,probe/hops_2_hops/accuracy\n"
            + "".join(f"{s},{loss},{a},{b}\n" for s, a, b in rows
                      for loss in ["1.0"]))
    assert mod.main([str(run), "--out", str(tmp_path / "c.png")]) == 0
    out = capsys.readouterr().out
    assert "| step | 1 hops | 2 hops |" in out
    assert "| 10 | - | 0.30 |" in out and "| 2,000 | 0.70 | 0.60 |" in out
    assert "| 3,000 | 1.00 | 0.80 |" in out and "train" not in out
    assert (tmp_path / "c.png").stat().st_size > 5_000
    assert mod.main([str(run), "--prefix", "probe/none_"]) == 3
    assert "no metric starting with 'probe/none_'" in capsys.readouterr().err


@pytest.mark.slow
def test_bench_carry_times_carried_and_plain_steps_with_equal_gradients(tmp_path):
    """scripts/bench_carry.py checks, before it times them, that the carried step's gradients
    are the plain step's (it exits non-zero otherwise)."""
    out = tmp_path / "carry.json"
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench_carry.py"), "--quick",
                        "--reps", "1", "--threads", "1", "--json", str(out)],
                       capture_output=True, text=True, timeout=SAFETY_S)
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads(out.read_text())
    assert set(res) >= {"softmax, full history", "ssm", "linear attention"}
    assert all(v["grad_difference"] < 1e-3 and v["ratio"][0] > 0 for v in res.values())
