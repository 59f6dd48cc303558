"""What ``init_from`` says (issue 41): reading a pretrained source reports its stages on stderr
(a GGUF is dequantized for tens of seconds: no silent phase), and one line says which weights
the run starts from, how many tensors and parameters."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("transformers")

from blocklab import checkpoint as ckpt
from blocklab.model.estimate import count_params
from convert.test_hf_roundtrip import _save
from convert.test_import_cli import _train_args
from inprocess import run_cli

pytestmark = pytest.mark.slow


def _loaded(stderr: str) -> list[str]:
    return [x for x in stderr.splitlines()
            if x.startswith("init_from: pretrained weights loaded from ")]


def test_init_from_a_hf_directory_reports_its_stages_and_one_loaded_line(tmp_path, capfd):
    _, src = _save(tmp_path, "llama-mha-tied-nobias")
    r = run_cli(capfd, "blocklab-train", *_train_args(tmp_path, src, "trainer.max_steps=1",
                                                      f"run_dir={tmp_path / 'run'}"))
    assert r.returncode == 0, r.stderr[-3000:]
    stages = [x.split()[1] for x in r.stderr.splitlines() if x.startswith("init_from: ")]
    assert stages[:2] == ["reading", "mapping"] and "tokenizer" in stages, stages
    (line,) = _loaded(r.stderr)
    model, _, meta = ckpt.load_model(tmp_path / "run")
    n_tensors = len(model.state_dict())
    params = count_params(model.config)
    assert line == (f"init_from: pretrained weights loaded from {src} (llama, safetensors): "
                    f"{n_tensors} "
                    f"tensors, {params:,} parameters (the model starts from them; the "
                    "optimizer starts fresh)")
    assert meta["init_from"]["kind"] == "hf"

    # from a blocklab checkpoint: where and which step
    first = ckpt.list_checkpoints(tmp_path / "run")[-1]
    r = run_cli(capfd, "blocklab-train", *_train_args(tmp_path, first, "trainer.max_steps=1",
                                                      f"run_dir={tmp_path / 'again'}"))
    assert r.returncode == 0, r.stderr[-3000:]
    (line,) = _loaded(r.stderr)
    step = json.loads((first / "meta.json").read_text())["step"]
    assert line.startswith(f"init_from: pretrained weights loaded from blocklab checkpoint "
                           f"{first} (step {step}): {n_tensors} tensors, {params:,} parameters")
