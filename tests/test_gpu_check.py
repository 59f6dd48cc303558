"""scripts/gpu_check.sh keeps working: its --dry mode (tiny sizes, CPU) runs every section, and
its correctness checks catch a broken mask."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from inprocess import SAFETY_S

ROOT = Path(__file__).resolve().parents[1]


def _module():
    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "scripts" / "gpu_check.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["gpu_check"] = mod  # dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.slow
def test_dry_run_runs_every_section_and_writes_json_and_table(tmp_path):
    r = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_check.sh"), "--dry", "--out",
                        str(tmp_path)], capture_output=True, text=True, timeout=SAFETY_S)
    assert r.returncode == 0, r.stderr[-3000:]
    report = json.loads((tmp_path / "gpu_check.json").read_text())
    assert report["errors"] == {}
    assert report["correctness"]["pass"] and report["correctness"]["variants"] == 21
    assert set(report["sdpa"]) == {"train_forward", "padded_forward", "static_decode_step"}
    assert all(v != "unknown" for v in report["sdpa"].values())
    assert report["train_run"]["returncode"] == 0 and report["train_run"]["tokens_per_s"] > 0
    assert report["train_speed"]["compiled_over_eager"]["median"] > 0
    decode = report["decode_speed"]["batch_1"]
    assert decode["greedy_agreement"] == {"dynamic_eager": 1.0, "static_eager": 1.0,
                                          "static_compiled": 1.0}
    assert report["fsdp"]["returncode"] == 0
    table = (tmp_path / "gpu_check.md").read_text()
    assert "| correctness grid" in table and "all pass" in table and "FAIL" not in table


def test_the_correctness_check_catches_a_mask_that_leaks_the_future(monkeypatch):
    gc = _module()
    name, cfg = next((n, c) for n, c in gc.grid(32, 2) if n.startswith("decoder-rope"))
    good = gc.check_variant(cfg, torch.device("cpu"), torch.float32)
    assert good["future"] == 0.0 and good["cache"] <= gc.TOL["float32"]

    from blocklab.model import masks

    real = masks.self_visibility

    def leaky(**kw):  # full forwards attend bidirectionally: the future leaks
        return real(**{**kw, "causal": kw["causal"] and kw.get("k_order") is not None})

    monkeypatch.setattr(masks, "self_visibility", leaky)
    bad = gc.check_variant(cfg, torch.device("cpu"), torch.float32)
    assert bad["future"] > gc.TOL["float32"], name
