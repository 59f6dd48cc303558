"""A plain softmax stack exports however its mixers were written (issue 41): a sweep's
``model.mixer.pattern=[softmax]`` is softmax on every layer, the same model as the default
``mixer.name: softmax``; a real hybrid stack is still refused, naming the key."""

from __future__ import annotations

import pytest
import torch

from blocklab.config import ConfigError, compose, model_config
from blocklab.convert import pick_arch

pytest.importorskip("transformers")


def _model(*over: str):
    return model_config(compose("train", list(over)).model)


@pytest.mark.parametrize("preset, pattern, arch", [
    ("llama_tiny", "[softmax]", "llama"),
    ("gpt2_tiny", "[softmax,softmax]", "gpt2"),
])
def test_a_pattern_of_the_default_mixer_exports(preset, pattern, arch):
    assert pick_arch(_model(f"model={preset}", f"model.mixer.pattern={pattern}")).name == arch


def test_a_hybrid_stack_is_still_refused():
    with pytest.raises(ConfigError, match=r"model\.mixer\.pattern=\['softmax', 'linear'\]"):
        pick_arch(_model("model=llama_tiny", "model.mixer.pattern=[softmax,linear]"))


def test_a_run_trained_with_pattern_softmax_exports_with_its_logits(tmp_path, capfd):
    from transformers import AutoModelForCausalLM

    from blocklab import checkpoint as ckpt
    from blocklab.train.run import train
    from inprocess import run_cli

    run = tmp_path / "run"
    train(compose("train", [
        "experiment=smoke", "model=llama_tiny", "model.vocab_size=null", "model.n_layers=2",
        "model.d_model=32", "model.n_heads=4", "model.d_ff=64", "model.mixer.pattern=[softmax]",
        "trainer.max_steps=2", "trainer.ckpt_every_steps=2", "trainer.val_every_steps=2",
        "trainer.progress_bar=false", "probes=none", "checkpoint_probes.enabled=false",
        f"run_dir={run}"]))
    r = run_cli(capfd, "blocklab-export", f"ckpt={run}", f"out={tmp_path / 'hf'}")
    assert r.returncode == 0, r.stderr
    model, _, _ = ckpt.load_model(run)
    back = AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    ids = torch.randint(4, model.config.vocab_size, (1, 12))
    with torch.no_grad():
        assert (back(ids).logits - model(ids)).abs().max().item() <= 1e-5
