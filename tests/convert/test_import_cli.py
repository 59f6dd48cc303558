"""The import / export / init_from commands as users run them: a tiny random HF Llama imported
with ``blocklab-import``, fine-tuned with ``blocklab-train init_from=...`` (weights, tokenizer
and architecture from the source, compatible changes on top, incompatible ones refused listing
every key), resumed exactly, evaluated with text probes and exported again; bad inputs refused
in one line naming the key and value."""

from __future__ import annotations

import json

import pytest
import torch

pytest.importorskip("transformers")

from blocklab import checkpoint as ckpt
from convert.test_hf_roundtrip import VOCAB, _save
from data.test_text_runs import cli
from inprocess import run_cli
from train.test_train_cli import losses

pytestmark = pytest.mark.slow


def _corpus(tmp_path):
    import random

    rng = random.Random(0)
    d = tmp_path / "corpus"
    d.mkdir()
    for i in range(12):
        (d / f"doc{i}.txt").write_text(" ".join(f"w{rng.randint(5, VOCAB - 6)}"
                                                for _ in range(200)) + "\n")
    return d


def _train_args(tmp_path, source, *extra):
    return [f"init_from={source}", "data=text_files", f"data.files=[{_corpus_dir(tmp_path)}]",
            f"data.cache_dir={tmp_path / 'cache'}", "data.seq_len=32", "data.batch_size=4",
            "trainer.max_steps=6", "trainer.ckpt_every_steps=3", "trainer.val_every_steps=3",
            "trainer.log_every_steps=1", "trainer.progress_bar=false", "probes=none",
            "checkpoint_probes.enabled=false", "model.dropout=0.1", *extra]


def _corpus_dir(tmp_path):
    d = tmp_path / "corpus"
    return d if d.is_dir() else _corpus(tmp_path)


def test_import_finetune_resume_eval_export(tmp_path, capfd):
    """The import and the evaluation run in process (tests/inprocess.py; the real
    blocklab-import runs below, blocklab-eval elsewhere); the reference run, the crash, the
    exact resume and the export are real subprocesses."""
    _, src = _save(tmp_path, "llama-gqa-untied-nobias")
    r = run_cli(capfd, "blocklab-import", f"from_hf={src}", f"out={tmp_path / 'imported'}")
    assert r.returncode == 0, r.stderr[-3000:]
    imported = tmp_path / "imported"
    assert "imported checkpoint" in r.stdout and ckpt.list_checkpoints(imported)

    # fine-tune from the import: the architecture is the source's (no model preset given),
    # dropout on top; weights start equal to the source's
    args = _train_args(tmp_path, imported)
    straight = cli(*args, f"run_dir={tmp_path / 'straight'}")
    assert straight.returncode == 0, straight.stderr[-3000:]
    run = tmp_path / "run"
    first = cli(*args, f"run_dir={run}", env={"BLOCKLAB_FAULT": "SIGKILL@step:5"})
    assert first.returncode == -9
    again = cli(*args, f"resume={run}")
    assert again.returncode == 0, again.stderr[-3000:]
    assert losses(run) == losses(tmp_path / "straight") and len(losses(run)) == 6

    meta = json.loads((ckpt.list_checkpoints(run)[-1] / "meta.json").read_text())
    assert meta["init_from"]["kind"] == "blocklab"
    assert meta["init_from"]["imported"]["architecture"] == "llama"
    assert meta["config"]["model"]["n_layers"] == 2 and meta["config"]["model"]["dropout"] == 0.1
    # the first loss is the pretrained model's: the source's weights were loaded
    source_model, _, _ = ckpt.load_model(imported)
    tuned, _, _ = ckpt.load_model(run)
    assert tuned.config.attention.n_kv_heads == source_model.config.attention.n_kv_heads
    diff = max((a - b).abs().max().item() for a, b in
               zip(tuned.state_dict().values(), source_model.state_dict().values()))
    assert 0 < diff < 0.1  # moved by six small steps, not re-initialized

    # text probes on the fine-tuned run and on the import itself
    probe = run_cli(capfd, "blocklab-eval", f"ckpt={imported}", "probes=text",
                    "probes.needle.lengths=[1.0]", "probes.train_length=48", "probes.needle.n=1",
                    "probes.needle.depths=[0.5]", "probes.litm.enabled=false",
                    "probes.perplexity.lengths=[1.0]", f"out={tmp_path / 'probe'}")
    assert probe.returncode == 0, probe.stderr[-3000:]
    assert (tmp_path / "probe").is_dir()

    # export the fine-tuned run; HF loads it with its logits
    out = cli(f"ckpt={run}", f"out={tmp_path / 'hf_out'}", tool="blocklab-export")
    assert out.returncode == 0, out.stderr[-3000:]
    from transformers import AutoModelForCausalLM

    back = AutoModelForCausalLM.from_pretrained(tmp_path / "hf_out").eval()
    ids = torch.randint(5, VOCAB - 6, (1, 10))
    with torch.no_grad():
        assert (back(ids).logits - tuned(ids)).abs().max().item() <= 1e-5


def test_init_from_refuses_incompatible_overrides_listing_every_key(tmp_path, capfd):
    _, src = _save(tmp_path, "llama-mha-tied-nobias")
    r = run_cli(capfd, "blocklab-train", *_train_args(
        tmp_path, src, "model.n_layers=3", "model.ffn.name=gelu_mlp",
        "model.position.scaling=yarn", "model.position.factor=4"))
    assert r.returncode == 2
    line = r.stderr.strip().splitlines()[-1]
    assert line.startswith("init_from refused") and "(2 keys)" in line, line
    assert "model.n_layers: 2 -> 3" in line and "model.ffn.name: 'swiglu' -> 'gelu_mlp'" in line
    preset = run_cli(capfd, "blocklab-train", *_train_args(tmp_path, src, "model=gpt2_tiny"))
    assert preset.returncode == 2 and "drop the model preset" in preset.stderr


def test_init_from_a_hf_directory_with_context_extension(tmp_path, capfd):
    """Straight from the HF directory, rope scaling applied on top (a compatible change)."""
    _, src = _save(tmp_path, "llama-mqa-tied-bias")
    r = run_cli(capfd, "blocklab-train", *_train_args(
        tmp_path, src, "model.position.scaling=yarn", "model.position.factor=2",
        "model.max_seq_len=128", "trainer.max_steps=2", f"run_dir={tmp_path / 'ext'}"))
    assert r.returncode == 0, r.stderr[-3000:]
    meta = json.loads((ckpt.list_checkpoints(tmp_path / "ext")[-1] / "meta.json").read_text())
    assert meta["init_from"]["kind"] == "hf"
    assert meta["config"]["model"]["position"]["scaling"] == "yarn"
    assert meta["config"]["tokenizer"]["name"] == "file"


def test_import_and_export_refuse_what_blocklab_cannot_express(tmp_path):
    _, src = _save(tmp_path, "llama-mha-tied-nobias")
    config = json.loads((src / "config.json").read_text())
    config["rope_parameters"] = {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 5000.0}
    (src / "config.json").write_text(json.dumps(config))
    r = cli(f"from_hf={src}", f"out={tmp_path / 'x'}", tool="blocklab-import")
    assert r.returncode == 2
    assert r.stderr.strip().splitlines()[-1].endswith(
        "rope_parameters.rope_type='dynamic': blocklab's rope scalings are ['default', "
        "'linear', 'llama3', 'yarn'] (ntk is blocklab's static form)")
    assert not (tmp_path / "x").exists()

    # the same rules in process (the CLI's one-line reporting is shown above)
    from blocklab.convert import import_model, read_pretrained
    from blocklab.errors import ConfigError

    config["rope_parameters"] = {"rope_type": "default", "rope_theta": 5000.0}
    config["sliding_window"] = 4
    (src / "config.json").write_text(json.dumps(config))
    with pytest.raises(ConfigError, match="sliding_window=4: blocklab cannot express it"):
        read_pretrained(str(src))
    target = import_model(str(src), tmp_path / "x", ignore_fields=("sliding_window",),
                          log=lambda *_: None)
    meta = json.loads((target / "meta.json").read_text())
    assert meta["imported"]["ignored_fields"] == ["sliding_window"]

    # a hub id with no network (the suite runs offline), and a directory without config.json
    with pytest.raises(ConfigError, match="not a local directory, and the hub download failed"):
        read_pretrained("nobody-here/no-such-model")
    with pytest.raises(ConfigError, match=r"no config\.json there"):
        read_pretrained(str(tmp_path))

    # a blocklab-only variant: ALiBi + sandwich norm in a decoder has no HF equivalent; the
    # refusal names every differing axis (the CLI's own export path is exercised above)
    from blocklab.config import ModelConfig
    from blocklab.convert import pick_arch

    m = ModelConfig(vocab_size=64, d_model=32, n_heads=4, d_ff=48)
    m.position.name, m.block.name, m.norm.name, m.ffn.name = "alibi", "sandwich", "rmsnorm", "swiglu"
    m.ffn.bias = m.attention.bias = False
    with pytest.raises(ConfigError) as e:
        pick_arch(m)
    line = str(e.value)
    assert line.startswith("export refused: no Hugging Face equivalent as llama")
    assert "model.block.name='sandwich'" in line and "model.position.name='alibi'" in line
    m.block.name, m.position.name = "pre", "rope"
    assert pick_arch(m).name == "llama"
