"""``blocklab-generate``'s thread count (issue 41): one thread by default -- chosen by
``scripts/bench_threads.py`` (docs/generation.md: the default thread count sampled several
times slower than one thread on a loaded machine) -- ``threads=null`` leaves torch's own; the
benchmark keeps working (a smoke run: nothing is timed here)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from blocklab.config import compose
from inprocess import SAFETY_S

ROOT = Path(__file__).resolve().parents[1]


def test_generate_samples_on_one_thread_by_default(monkeypatch):
    from blocklab.config.validate import validate_generate
    from blocklab.sample import run

    assert OmegaConf.to_object(compose("generate", [])).threads == 1
    chosen: list[int] = []
    monkeypatch.setattr("torch.set_num_threads", chosen.append)
    monkeypatch.setattr("blocklab.sample.load_sampler", lambda *a: (_ for _ in ()).throw(
        KeyboardInterrupt))  # stop right after the threads are set, before any model
    for over, want in (([], [1]), (["threads=null"], []), (["threads=3"], [3])):
        gc = validate_generate(OmegaConf.to_object(compose("generate", ["ckpt=x", *over])))
        with pytest.raises(KeyboardInterrupt):
            run(gc)
        assert chosen == want, over
        chosen.clear()


@pytest.mark.slow
def test_the_thread_benchmark_runs():
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench_threads.py"), "--quick"],
                       capture_output=True, text=True, timeout=SAFETY_S)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "1 thread vs default" in r.stdout and "batch 8" in r.stdout
