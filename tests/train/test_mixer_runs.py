"""Everything downstream of the model works on every sequence mixer: a training run with
checkpoint probes, its exact resume, evaluation of the checkpoint on its own (validation loss
equal to the run's, probes through the mixer's decode state and shared-prefix ``select``), and
export refused by name where Hugging Face has no equivalent. The commands run in process
(tests/inprocess.py) at the smoke experiment's size."""

from __future__ import annotations

import json
import shutil

import pytest

from inprocess import run_cli
from train.test_train_cli import losses

MIXERS = {  # label -> overrides (recurrent stacks take no rotary positions)
    "linear": ["model/mixer=linear", "model/position=none", "model.mixer.chunk=8"],
    "gated_conv": ["model/mixer=gated_conv", "model/position=none"],
    "ssm": ["model/mixer=ssm", "model/position=none", "model.mixer.chunk=8"],
    "hybrid": ["model/mixer=ssm", "'model.mixer.pattern=[ssm,softmax]'", "model.mixer.chunk=8"],
}
FAST = ["experiment=smoke", "trainer.max_steps=8", "trainer.ckpt_every_steps=4",
        "trainer.val_every_steps=4", "trainer.log_every_steps=1", "probes=none",
        "probes@checkpoint_probes=coarse", "checkpoint_probes.needle.n=4",
        "checkpoint_probes.litm.n=4", "checkpoint_probes.perplexity.enabled=false"]


def _args(label: str) -> list[str]:
    return [a.strip("'") for a in MIXERS[label]]


@pytest.mark.slow
@pytest.mark.parametrize("label", list(MIXERS))
def test_a_mixer_trains_probes_resumes_exactly_and_evaluates_on_its_own(label, tmp_path, capfd):
    run = tmp_path / "run"
    r = run_cli(capfd, "blocklab-train", *FAST, *_args(label), f"run_dir={run}")
    assert r.returncode == 0, r.stderr[-3000:]
    cells = list((run / "probes").glob("step-*/*/cells.csv"))
    assert cells, "checkpoint probes ran through the mixer's decode state"
    straight = losses(run)
    assert len(straight) == 8
    # exact resume from the middle: drop the newer checkpoint as if killed after step 4
    cut = tmp_path / "cut"
    shutil.copytree(run, cut)
    shutil.rmtree(cut / "checkpoints" / "step-000008")
    shutil.rmtree(cut / "logs")
    r = run_cli(capfd, "blocklab-train", *FAST, *_args(label), f"resume={cut}")
    assert r.returncode == 0, r.stderr[-3000:]
    resumed = losses(cut)
    # a row's step is the steps done (the checkpoints' numbers): steps 5.. ran after the resume
    assert {s: v for s, v in resumed.items() if s > 4} == \
        {s: v for s, v in straight.items() if s > 4}
    # evaluation on its own: the run's validation loss, probes (shared-prefix scoring)
    out = tmp_path / "eval"
    e = run_cli(capfd, "blocklab-eval", f"ckpt={run}", "probes=coarse", "probes.needle.n=4",
                "probes.litm.n=4", "probes.perplexity.enabled=false", f"out={out}")
    assert e.returncode == 0, e.stderr[-3000:]
    logged = json.loads((run / "summary.json").read_text())["metrics"]["val/loss"]
    measured = json.loads((out / "val.json").read_text())["val_loss"]
    assert abs(measured - logged) < 1e-5
    assert list(out.glob("*/cells.csv"))


@pytest.mark.parametrize("label", ["linear", "ssm"])
def test_export_of_a_model_without_a_hugging_face_equivalent_is_refused_by_name(
        label, tmp_path, capfd):
    run = tmp_path / "run"
    r = run_cli(capfd, "blocklab-train", "experiment=smoke", "trainer.max_steps=2",
                "trainer.ckpt_every_steps=2", "trainer.val_every_steps=2", "probes=none",
                *_args(label), f"run_dir={run}")
    assert r.returncode == 0, r.stderr[-3000:]
    e = run_cli(capfd, "blocklab-export", f"ckpt={run}", f"out={tmp_path / 'hf'}")
    assert e.returncode == 2, e.stderr[-2000:]
    refusal = e.stderr.strip().splitlines()[-1]  # after the export's progress lines
    assert refusal.startswith("export refused") and f"model.mixer.name='{label}'" in refusal
    assert not (tmp_path / "hf").exists()
