"""Every key of a composed config is validated before anything is written or built
(config.validate_train / validate_eval / validate_probe_spec): each bad input fails with one
line naming the dotted key, the value and the rule (exit 2 from the command line), and leaves
nothing on disk. Most cases run in-process through ``blocklab.train.run.train`` and
``blocklab.cli._eval``; a few run the commands' entry functions, one per command the real
console script (slow)."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from blocklab.config import ConfigError, compose
from inprocess import SAFETY_S, run_cli

BIN = Path(sys.executable).parent


def cli(tool: str, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / tool), *args], capture_output=True, text=True, timeout=SAFETY_S,
                          cwd=cwd)


def files_under(path: Path) -> list[Path]:
    return sorted(path.rglob("*"))


def assert_one_line(msg: str, key: str, value: str, word: str) -> None:
    assert "\n" not in msg.strip(), msg
    assert msg.startswith(f"config error: {key}="), msg
    assert value in msg and word in msg, msg


# --------------------------------------------------------------------------------- training

TRAIN_CASES = [
    # tracebacks before (often after the run directory and config.yaml were written)
    (["trainer.ckpt_every_steps=-5"], "trainer.ckpt_every_steps", "-5", ">= 1"),
    (["trainer.val_every_steps=0"], "trainer.val_every_steps", "0", ">= 1"),
    (["trainer.keep_checkpoints=-2"], "trainer.keep_checkpoints", "-2", ">= 0"),
    (["optim.betas=[1.5,0.9]"], "optim.betas", "[1.5, 0.9]", "[0, 1)"),
    (["optim.betas=[0.9]"], "optim.betas", "[0.9]", "two values"),
    (["trainer.precision=bogus"], "trainer.precision", "'bogus'", "bf16-mixed"),
    (["trainer.accelerator=gpu"], "trainer.accelerator", "'gpu'", "CUDA"),
    (["trainer.devices=0"], "trainer.devices", "0", ">= 1"),
    (["model/position=learned", "model.max_seq_len=64"], "model.max_seq_len", "64",
     "data.seq_len=128"),
    (["probes.needle.n_distractors=[-1]"], "probes.needle.n_distractors", "[-1]", ">= 0"),
    (["probes@checkpoint_probes=coarse", "checkpoint_probes.needle.n_distractors=[-1]"],
     "checkpoint_probes.needle.n_distractors", "[-1]", ">= 0"),
    (["probes.batch_size=0"], "probes.batch_size", "0", ">= 1"),
    (["probes@checkpoint_probes=coarse", "checkpoint_probes.batch_size=-3"],
     "checkpoint_probes.batch_size", "-3", ">= 1"),
    (["probes.needle.fillers=[bogus]"], "probes.needle.fillers", "bogus", "markov"),
    (["probes@checkpoint_probes=coarse", "checkpoint_probes.needle.fillers=[bogus]"],
     "checkpoint_probes.needle.fillers", "bogus", "markov"),
    (["probes.litm.n_records=[0]"], "probes.litm.n_records", "[0]", ">= 1"),
    (["probes.litm.gold=[1.5]"], "probes.litm.gold", "[1.5]", "[0, 1]"),
    # accepted silently before, with wrong results
    (["schedule.min_lr_ratio=-1"], "schedule.min_lr_ratio", "-1.0", "[0, 1]"),
    (["trainer.log_every_steps=-1"], "trainer.log_every_steps", "-1", ">= 1"),
    (["model/position=alibi", "model.position.scaling=linear"], "model.position.scaling",
     "'linear'", "rope option"),
    (["model/position=alibi", "model.position.factor=4"], "model.position.factor", "4.0",
     "rope option"),
    (["probes.needle.depths=[0,1.5]"], "probes.needle.depths", "[0.0, 1.5]", "[0, 1]"),
    (["probes.needle.depths=[-0.5]"], "probes.needle.depths", "[-0.5]", "[0, 1]"),
    (["probes.needle.n=0"], "probes.needle.n", "0", ">= 1"),
    (["probes.needle.lengths=[0,1]"], "probes.needle.lengths", "[0.0, 1.0]", "> 0"),
    (["probes.needle.lengths=[-2]"], "probes.needle.lengths", "[-2.0]", "> 0"),
    (["probes.perplexity.lengths=[0]"], "probes.perplexity.lengths", "[0.0]", "> 0"),
    (["probes.needle.n_distractors=[500]"], "probes.needle.n_distractors", "[500]",
     "data.n_keys=64"),
    (["probes.threshold=1.5"], "probes.threshold", "1.5", "(0, 1]"),
    (["data.format=csv"], "data.format", "'csv'", "parquet"),
    # refused before, but only after config.yaml was written
    (["schedule.name=bogus"], "schedule.name", "'bogus'", "unknown choice"),
    (["logger.name=bogus"], "logger.name", "'bogus'", "unknown choice"),
]


@pytest.mark.parametrize(("overrides", "key", "value", "word"), TRAIN_CASES,
                         ids=[" ".join(c[0]) for c in TRAIN_CASES])
def test_bad_training_configs_fail_in_one_line_before_anything_is_written(
        tmp_path, monkeypatch, overrides, key, value, word):
    from blocklab.train.run import train

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # the same on a GPU machine
    cfg = compose("train", ["experiment=smoke", f"out_root={tmp_path / 'out'}", *overrides])
    with pytest.raises(ConfigError) as err:
        train(cfg)
    assert_one_line(str(err.value), key, value, word)
    assert files_under(tmp_path) == []  # nothing written at all


MORE_RULES = [  # rules beyond the list, checked on the config alone (fast)
    (["model=bert_tiny", "data.packing=true"], "data.packing", "does not pack documents"),
    (["data=shakespeare"], "tokenizer.name", "synthetic data"),
    (["tokenizer=bpe"], "tokenizer.name", "tokenizer=synthetic"),
    (["trainer.strategy=deepspeed"], "trainer.strategy", "model_parallel"),
    (["trainer.num_nodes=0"], "trainer.num_nodes", ">= 1"),
    (["trainer.threads=0"], "trainer.threads", ">= 1"),
    (["trainer.strategy=fsdp"], "trainer.strategy", "model_parallel"),
    (["optim.name=sgdx"], "optim.name", "known: adafactor, adamw, lion, sgd"),
    (["optim.eps=0"], "optim.eps", "> 0"),
    (["schedule.warmup_steps=-1"], "schedule.warmup_steps", ">= 0"),
    (["logger=wandb", "logger.mode=offlien"], "logger.mode", "offline"),
    (["logger=many", "logger.loggers=[wandb]", "logger.mode=offlien"], "logger.mode", "offline"),
    (["logger=many", "logger.loggers=[]"], "logger.loggers", "logger=many needs at least one"),
    (["logger=many", "logger.loggers=[csv,none]"], "logger.loggers",
     "'none' cannot be one of several loggers"),
    (["logger=many", "logger.loggers=[many]"], "logger.loggers",
     "'many' cannot be one of several loggers"),
    (["optim=sgd", "optim.nesterov=true", "optim.momentum=0"], "optim.nesterov",
     "Nesterov momentum needs optim.momentum > 0"),
    (["data.val_batches=0"], "data.val_batches", ">= 1"),
    (["data.num_workers=-1"], "data.num_workers", ">= 0"),
    (["data.val_fraction=1.0"], "data.val_fraction", "(0, 1)"),
    (["data.mlm_probability=0"], "data.mlm_probability", "(0, 1]"),
    (["data.long_documents=drop"], "data.long_documents", "truncate"),
    (["data.utf8_errors=ignore"], "data.utf8_errors", "strict"),
    (["data.n_filler=2"], "data.n_filler", ">= 4"),
    (["data.n_distractors=[1]"], "data.n_distractors", "[min, max]"),
    (["model/position=rope", "model.position.factor=4"], "model.position.factor", "scaling"),
    (["probes.space=text"], "probes.space", "token-space"),
    (["probes.space=tokens"], "probes.space", "auto, token, text"),
    (["probes.name=a/b"], "probes.name", "folder name"),
    (["probes.train_length=0"], "probes.train_length", ">= 1"),
    (["probes.litm.n_records=[65]"], "probes.litm.n_records", "data.n_keys=64"),
    (["probes.perplexity.stride=0"], "probes.perplexity.stride", "(0, 1]"),
    (["probes.text.max_new_tokens=0"], "probes.text.max_new_tokens", ">= 1"),
    (["probes.text.needle='The number is {value} for {kye}.'"], "probes.text.needle", "key"),
    (["probes.needle.depths=[]"], "probes.needle.depths", "empty"),
]


@pytest.mark.parametrize(("overrides", "key", "word"), MORE_RULES,
                         ids=[" ".join(c[0]) for c in MORE_RULES])
def test_more_rules_name_key_value_and_rule(overrides, key, word):
    from blocklab.config import validate_train
    from blocklab.train.run import to_train_config

    with pytest.raises(ConfigError) as err:
        validate_train(to_train_config(compose("train", ["experiment=smoke", *overrides])))
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith(f"config error: {key}=") and word in msg, msg


@pytest.mark.parametrize("overrides", [
    [], ["experiment=smoke"], ["experiment=shakespeare"], ["experiment=position_extrapolation"],
    ["trainer=ddp"], ["trainer=model_parallel"], ["logger=wandb"], ["logger=none"],
    ["schedule=linear"], ["schedule=constant"], ["probes=extrapolation"], ["model=gpt2_tiny"],
    ["model=bert_tiny"], ["model=t5_tiny"], ["model=llama_tiny"], ["probes.litm.n_records=[1]"],
    ["model/position=rope", "model.position.scaling=yarn", "model.position.factor=4"],
    ["data=text_files", "data.files=[a.txt]", "tokenizer=byte", "probes=text"],
], ids=lambda o: " ".join(o) or "default")
def test_shipped_configs_validate(overrides):
    from blocklab.config import validate_train
    from blocklab.train.run import to_train_config
    from hydra_plugins.blocklab_launchers import register

    register()  # hydra/launcher=parallel (experiment=position_extrapolation), as the CLI does
    tc = to_train_config(compose("train", overrides))
    assert validate_train(tc) is tc  # raises ConfigError naming the key when a shipped config is invalid


def test_composing_a_launcher_config_from_python_says_what_to_call():
    """The config floor does not reach the launchers (layering): from Python, a config that
    picks one fails in one line saying what to call (a fresh process: registration is global)."""
    import subprocess
    import sys

    code = ("from blocklab.config import compose\n"
            "compose('train', ['experiment=position_extrapolation'])")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode != 0
    last = r.stderr.strip().splitlines()[-1]
    assert "hydra/launcher" in last and "blocklab_joblib" in last, r.stderr[-2000:]
    assert "call hydra_plugins.blocklab_launchers.register() before compose" in last


def test_the_rules_use_the_synthetic_tasks_own_facts():
    """One definition: the fillers and the shortest needle are config.py's, used by the tasks;
    the schema's task weights are the tasks."""
    from blocklab import config
    from blocklab.data import synthetic
    from blocklab.data.tasks import TASKS, needle

    assert synthetic.FILLERS is config.FILLERS
    assert needle.needle_min_length is config.needle_min_length
    assert {f.name for f in dataclasses.fields(config.TaskWeights)} == set(TASKS)


# ------------------------------------------------------------------------------- evaluation


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    """A two-step smoke run with one checkpoint (no probes), trained in process."""
    from blocklab.train.run import train

    out = tmp_path_factory.mktemp("run")
    run = train(compose("train", ["experiment=smoke", f"out_root={out}", "trainer.max_steps=2",
                                  "trainer.ckpt_every_steps=2", "trainer.val_every_steps=2",
                                  "probes=none"]))
    assert [p.name for p in (run / "checkpoints").iterdir()] == ["step-000002"]
    (only,) = (out / "smoke").iterdir()
    assert only == run
    return run


EVAL_CASES = [
    (["probes.needle.n_distractors=[-1]"], "probes.needle.n_distractors", "[-1]", ">= 0"),
    (["probes.batch_size=0"], "probes.batch_size", "0", ">= 1"),
    (["probes.batch_size=-4"], "probes.batch_size", "-4", ">= 1"),
    (["probes.needle.fillers=[bogus]"], "probes.needle.fillers", "bogus", "markov"),
    (["probes.litm.n_records=[0]"], "probes.litm.n_records", "[0]", ">= 1"),
    (["probes.litm.gold=[1.5]"], "probes.litm.gold", "[1.5]", "[0, 1]"),
    (["probes.needle.n_distractors=[500]"], "probes.needle.n_distractors", "[500]",
     "data.n_keys=64"),
    (["probes.threshold=1.5"], "probes.threshold", "1.5", "(0, 1]"),
    (["val_batches=-1"], "val_batches", "-1", ">= 1"),
    (["batch_size=0"], "batch_size", "0", ">= 1"),
    (["hf_gguf=model.gguf"], "hf_gguf", "'model.gguf'", "only with hf_model"),
    (["run_data=maybe"], "run_data", "'maybe'", "one of auto, true, false"),
]


@pytest.mark.parametrize(("overrides", "key", "value", "word"), EVAL_CASES,
                         ids=[" ".join(c[0]) for c in EVAL_CASES])
def test_bad_eval_configs_fail_in_one_line_before_anything_is_written(
        run_dir, tmp_path, monkeypatch, overrides, key, value, word):
    from blocklab.cli import _eval

    monkeypatch.chdir(tmp_path)
    before = files_under(run_dir)
    with pytest.raises(ConfigError) as err:
        _eval(compose("eval", [f"ckpt={run_dir}", *overrides]))
    assert_one_line(str(err.value), key, value, word)
    assert files_under(run_dir) == before and files_under(tmp_path) == []


def _hf_dir(tmp_path: Path, kind: str) -> Path:
    path = tmp_path / "models" / kind
    if kind != "missing":
        path.mkdir(parents=True)
    if kind == "readme_only":
        (path / "README.md").write_text("not a model\n")
    if kind == "garbage_config":
        (path / "config.json").write_text("{this is not json")
    if kind == "config_without_model_type":
        (path / "config.json").write_text('{"hidden_size": 8}')
    return path


@pytest.mark.parametrize(("kind", "word"), [
    ("missing", "no such directory"), ("empty", "empty directory"),
    ("readme_only", "no config.json"), ("garbage_config", "not valid JSON"),
    ("config_without_model_type", "model_type"),
])
def test_a_bad_hf_model_fails_in_one_line_before_loading(tmp_path, monkeypatch, kind, word):
    from blocklab.cli import _eval

    path = _hf_dir(tmp_path, kind)
    monkeypatch.chdir(tmp_path)
    before = files_under(tmp_path)
    with pytest.raises(ConfigError) as err:
        _eval(compose("eval", [f"hf_model={path}", "probes=text"]))
    assert_one_line(str(err.value), "hf_model", repr(str(path)), word)
    assert files_under(tmp_path) == before  # no outputs/


# ------------------------------------------------------------------------ the real commands


# (every rule is tested in-process above; these check the command's exit code and line: one
# case per command through its real console script, the other through the same entry
# function in process — tests/inprocess.py)
@pytest.mark.slow
@pytest.mark.parametrize(("how", "args", "line_start"), [
    ("subprocess", ["trainer.ckpt_every_steps=-5"],
     "config error: trainer.ckpt_every_steps=-5: must be >= 1"),
    ("in-process", ["schedule.name=bogus"], "config error: schedule.name='bogus': unknown choice"),
], ids=lambda a: " ".join(a) if isinstance(a, list) else a if a in ("subprocess", "in-process")
    else "")
def test_blocklab_train_exits_2_with_one_line_and_writes_nothing(tmp_path, capfd, how, args,
                                                                 line_start):
    argv = ["experiment=smoke", f"out_root={tmp_path / 'out'}", *args]
    r = (cli("blocklab-train", *argv, cwd=tmp_path) if how == "subprocess"
         else run_cli(capfd, "blocklab-train", *argv, cwd=tmp_path))
    assert r.returncode == 2, r.stderr[-3000:]
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(line_start), r.stderr[-3000:]
    assert files_under(tmp_path) == []


@pytest.mark.slow
@pytest.mark.parametrize(("how", "args", "line_start"), [
    ("in-process", ["probes.needle.n_distractors=[500]"],
     "config error: probes.needle.n_distractors=[500]: "),
    ("subprocess", ["hf_model=MISSING"], "config error: hf_model="),
], ids=lambda a: " ".join(a) if isinstance(a, list) else a if a in ("subprocess", "in-process")
    else "")
def test_blocklab_eval_exits_2_with_one_line_and_writes_nothing(run_dir, tmp_path, capfd, how,
                                                                args, line_start):
    target = [] if args[0].startswith("hf_model") else [f"ckpt={run_dir}"]
    args = [a.replace("MISSING", str(tmp_path / "no_such_model")) for a in args]
    before = files_under(run_dir)
    r = (cli("blocklab-eval", *target, *args, cwd=tmp_path) if how == "subprocess"
         else run_cli(capfd, "blocklab-eval", *target, *args, cwd=tmp_path))
    assert r.returncode == 2, r.stderr[-3000:]
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(line_start), r.stderr[-3000:]
    assert files_under(run_dir) == before and files_under(tmp_path) == []
