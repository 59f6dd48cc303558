"""The golden curve: the first 20 per-step losses of a fixed tiny run are stored in the repo.
A change that alters them (data stream, init, objective, optimizer, schedule) must update
tests/golden/smoke_losses.json deliberately:

    BLOCKLAB_UPDATE_GOLDEN=1 .venv/bin/python -m pytest tests/train/test_golden.py
"""

from __future__ import annotations

import csv
import json
import os
from pathlib import Path

import pytest

from blocklab.config import compose
from blocklab.train.run import train

GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "smoke_losses.json"


@pytest.mark.slow
def test_first_losses_match_the_stored_golden_curve(tmp_path):
    cfg = compose("train", ["experiment=smoke", f"out_root={tmp_path}", "trainer.log_every_steps=1",
                            "trainer.threads=1"])
    run = train(cfg)
    rows = [r for f in sorted((run / "logs").glob("version_*/metrics.csv"))
            for r in csv.DictReader(f.open()) if r.get("train/loss")]
    losses = [float(r["train/loss"]) for r in rows]
    assert len(losses) == 20
    if os.environ.get("BLOCKLAB_UPDATE_GOLDEN"):
        GOLDEN.write_text(json.dumps({"config": "experiment=smoke", "losses": losses}, indent=1))
    golden = json.loads(GOLDEN.read_text())["losses"]
    # Same machine: bit-identical; other CPUs may round matmuls differently in the last bits.
    assert losses == pytest.approx(golden, rel=1e-4, abs=1e-5)
