"""Nonsense values are refused in one line naming the key, the value and the rule (exit 2),
and one that is legal but defeats its purpose is named in a warning (docs/reliability.md,
"Checkpoints from others, nonsense values"): NaN or an infinity anywhere in a config — every
float of the schema, enumerated from it, and the options in mappings (callbacks, mixers) —;
``blocklab-estimate``'s own nonsense (a negative batch or length, zero bytes per value, a
depth no check can walk in time) and a model it checked less than training does; a mixer
pattern longer than its stack; validation files that are training files."""

from __future__ import annotations

import copy
import dataclasses
import math
import os
import typing
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from blocklab.config import ConfigError, TrainConfig, compose, validate_train
from data.test_text_runs import corpus
from inprocess import run_cli

FINITE_RULE = "must be a finite number (NaN and inf are never valid config values)"
EACH = f"each value {FINITE_RULE}"
SMOKE = ["experiment=smoke", "trainer.progress_bar=false", "probes=none",
         "checkpoint_probes.enabled=false"]


def _float_keys(cls: type, prefix: str = "") -> list[tuple[str, bool | str]]:
    """(dotted key, holds a list: True, or "nested" for a list of lists) of every float of a
    schema dataclass, nested ones too."""
    hints = typing.get_type_hints(cls)
    out = []
    for f in dataclasses.fields(cls):
        kind, key = hints[f.name], prefix + f.name
        if dataclasses.is_dataclass(kind):
            out += _float_keys(kind, key + ".")
        elif "float" in str(kind) and "dict" not in str(kind):
            out.append((key, "nested" if "list[list" in str(kind) else "list" in str(kind)))
    return out


#: every float of the training schema, plus floats held in its mappings (a callback's options,
#: a mixer's options, a user task's weight)
FLOATS = [*_float_keys(TrainConfig), ("callbacks.early_stopping.min_delta", False),
          ("callbacks.early_stopping.stopping_threshold", False), ("model.mixer.scale", False),
          ("model.mixer.dropout", False), ("data.user_tasks.mine", False)]


@pytest.fixture(scope="module")
def base():
    return compose("train", [*SMOKE, "callbacks=[early_stopping]"])


def _refusal(base, key: str, value) -> str:
    cfg = copy.deepcopy(base)
    OmegaConf.update(cfg, key, value, force_add=True)
    with pytest.raises(ConfigError) as e:
        validate_train(OmegaConf.to_object(cfg))
    return str(e.value)


@pytest.mark.parametrize(("key", "listed"), FLOATS, ids=[k for k, _ in FLOATS])
def test_every_float_of_a_training_config_refuses_nan(base, key, listed):
    """A range rule written as ``x < 0 -> refuse`` let NaN through (min_delta, norm.eps, rope's
    base, init_std ...): no number reaches a rule before it is known to be finite."""
    if listed == "nested":  # a list of lists (depth bands): the inner list is named
        assert (_refusal(base, key, [[0.5, math.nan]])
                == f"config error: {key}[0]=[0.5, nan]: {EACH}")
    elif listed:
        assert _refusal(base, key, [0.5, math.nan]) == f"config error: {key}=[0.5, nan]: {EACH}"
    else:
        assert _refusal(base, key, math.nan) == f"config error: {key}=nan: {FINITE_RULE}"


@pytest.mark.parametrize("key", ["optim.lr", "model.norm.eps", "model.position.base",
                                 "callbacks.early_stopping.min_delta", "trainer.peak_flops"])
@pytest.mark.parametrize("value", [math.inf, -math.inf], ids=["inf", "-inf"])
def test_an_infinity_is_refused_like_nan(base, key, value):
    assert _refusal(base, key, value) == f"config error: {key}={value!r}: {FINITE_RULE}"


@pytest.mark.parametrize(("tool", "args", "key", "value"), [
    ("blocklab-train", [*SMOKE, "callbacks=[early_stopping]",
                        "callbacks.early_stopping.min_delta=nan"],
     "callbacks.early_stopping.min_delta", "nan"),
    ("blocklab-train", [*SMOKE, "optim.lr=nan"], "optim.lr", "nan"),
    ("blocklab-estimate", ["model.norm.eps=nan"], "model.norm.eps", "nan"),
    ("blocklab-generate", ["ckpt=some-run", "top_p=nan"], "top_p", "nan"),
    ("blocklab-generate", ["ckpt=some-run", "temperature=inf"], "temperature", "inf"),
])
def test_commands_refuse_a_non_finite_value_in_one_line(tmp_path, capfd, tool, args, key, value):
    r = run_cli(capfd, tool, *args, *([f"run_dir={tmp_path / 'run'}"] if tool.endswith("train")
                                      else []), cwd=tmp_path)
    assert r.returncode == 2, r.stderr[-2000:]
    assert r.stderr.strip().splitlines() == [f"config error: {key}={value}: {FINITE_RULE}"]
    assert list(tmp_path.iterdir()) == []  # nothing written


# ------------------------------------------------------------------------- blocklab-estimate


@pytest.mark.parametrize(("args", "line"), [
    (["batch_size=-2"], "batch_size=-2: must be an integer >= 1"),
    (["seq_len=-5"], "seq_len=-5: must be an integer >= 1"),
    (["seq_len=0"], "seq_len=0: must be an integer >= 1"),  # 0 once meant null
    (["bytes_per_value=0"], "bytes_per_value=0: must be an integer >= 1 (2 = bf16/fp16, "
                            "4 = fp32)"),
    (["model.n_layers=10001"], "model.n_layers=10001: must be <= 10,000 (blocklab's bound on "
                               "a stack's depth)"),
    (["model.n_layers=1000000"], "model.n_layers=1000000: must be <= 10,000 (blocklab's "
                                 "bound on a stack's depth)"),
    (["model=t5_tiny", "model.family.n_encoder_layers=100000"],
     "model.family.n_encoder_layers=100000: must be <= 10,000 (blocklab's bound on a stack's "
     "depth)"),
    (["seq_len=4096"], "model.max_seq_len=256: the learned position table must cover "
                       "seq_len=4096; raise model.max_seq_len or lower seq_len"),
])
def test_estimate_refuses_each_nonsense_value(capfd, args, line):
    """A negative batch or length and zero bytes per value printed negative or zero memory;
    a million layers gave no answer for minutes (every check and estimate walks the layers):
    now refused at once above a stated bound."""
    r = run_cli(capfd, "blocklab-estimate", *args)
    assert r.returncode == 2, r.stdout[-2000:] + r.stderr[-2000:]
    assert r.stderr.strip().splitlines() == [f"config error: {line}"]
    assert r.stdout == ""


@pytest.mark.parametrize("model", [
    ["model/mixer=linear", "model/position=none", "model.mixer.feature_dim=-3"],
    ["model/ffn=swiglu", "model.ffn.approximate=tanh"],
], ids=["negative-feature_dim", "unread-gelu-form"])
def test_estimate_checks_a_model_exactly_as_training_does(tmp_path, capfd, model):
    """A linear mixer's negative ``feature_dim`` (unread by the default elu map) was accepted by
    both; an option training refuses as silently ignored was estimated. Both commands now
    refuse each in the same line."""
    trained = run_cli(capfd, "blocklab-train", *SMOKE, *model, f"run_dir={tmp_path / 'run'}")
    estimated = run_cli(capfd, "blocklab-estimate", *model)
    assert (trained.returncode, estimated.returncode) == (2, 2), estimated.stdout[-1000:]
    assert estimated.stderr.strip().splitlines() == trained.stderr.strip().splitlines()
    assert len(estimated.stderr.strip().splitlines()) == 1
    assert estimated.stderr.startswith(f"config error: {model[-1].split('=')[0]}=")
    assert not (tmp_path / "run").exists()


# ------------------------------------------------------------------------- mixer patterns


@pytest.mark.parametrize(("args", "line"), [
    (["model.n_layers=2", "model.mixer.pattern=[linear,softmax,softmax]"],
     "model.mixer.pattern=['linear', 'softmax', 'softmax']: 3 entries for a stack of 2 layers "
     "(model.n_layers=2): one mixer per layer, repeated when shorter, so the entries past layer "
     "1 would never be used; give at most 2, or raise model.n_layers"),
    (["model=t5_tiny", "model.n_layers=4", "model.family.n_encoder_layers=1",
      "model.mixer.pattern=[softmax,softmax]"],
     "model.mixer.pattern=['softmax', 'softmax']: 2 entries for a stack of 1 layer "
     "(model.family.n_encoder_layers=1): one mixer per layer, repeated when shorter, so the "
     "entries past layer 0 would never be used; give at most 1, or raise "
     "model.family.n_encoder_layers"),
])
def test_a_mixer_pattern_longer_than_its_stack_is_refused(capfd, args, line):
    """Its tail was silently dropped (a hybrid's softmax layer with it)."""
    r = run_cli(capfd, "blocklab-estimate", *args)
    assert r.returncode == 2, r.stdout[-2000:]
    assert r.stderr.strip().splitlines() == [f"config error: {line}"]


def test_a_shorter_mixer_pattern_repeats_over_the_layers(capfd):
    r = run_cli(capfd, "blocklab-estimate", "model.n_layers=4",
                "model.mixer.pattern=[linear,softmax]")
    assert r.returncode == 0, r.stderr[-2000:]
    layers = [x.split(")")[0].strip() for x in r.stdout.splitlines() if x.startswith("  layer")]
    assert layers == ["layer 0 (linear", "layer 1 (softmax", "layer 2 (linear",
                      "layer 3 (softmax"]


# ---------------------------------------------------------- validation files that train


def _warning(files: str, shared: list[str], n: int | None = None) -> str:
    n = len(shared) if n is None else n
    return (f"warning: data.val_files and {files} share {n} file{'s' * (n > 1)} "
            f"({', '.join(shared)}): the validation loss on {'them' if n > 1 else 'it'} is a "
            "training loss")


def test_validation_files_that_are_training_files_are_named(tmp_path, capfd):
    """``data.val_files`` naming a training file through a symbolic link: every validation
    loss was a training loss, and nothing said so. The run goes on (a deliberate control is
    legal), with one warning line naming both keys and the file."""
    data = corpus(tmp_path, n_files=6, words=80)
    os.symlink(data / "doc003.txt", tmp_path / "val.txt")
    r = run_cli(capfd, "blocklab-train", "data=text_files", "tokenizer=byte",
                f"data.files=[{data}]", f"data.val_files=[{tmp_path / 'val.txt'}]",
                f"data.cache_dir={tmp_path / 'cache'}", "data.seq_len=16", "data.batch_size=2",
                "model=gpt2_tiny", "model.vocab_size=null", "model.n_layers=1",
                "model.d_model=16", "model.n_heads=2", "model.d_ff=32", "model.max_seq_len=16",
                "trainer.max_steps=1", "trainer.val_every_steps=1", "trainer.progress_bar=false",
                "probes=none", "checkpoint_probes.enabled=false", f"run_dir={tmp_path / 'run'}")
    assert r.returncode == 0, r.stderr[-3000:]
    warned = [x for x in r.stderr.splitlines() if x.startswith("warning: data.val_files")]
    assert warned == [_warning("data.files", [str(tmp_path / "val.txt")])]


@pytest.mark.parametrize("case", ["same-path", "another-spelling", "directory", "glob",
                                  "disjoint"])
def test_every_spelling_of_a_shared_validation_file_is_found(tmp_path, capfd, case):
    data = corpus(tmp_path, n_files=4, words=40)
    one = str(data / "doc001.txt")
    files, val = {
        "same-path": ([one, str(data / "doc002.txt")], [one]),
        "another-spelling": ([one], [f"{tmp_path}/corpus/../corpus/./doc001.txt"]),
        "directory": ([one], [str(data)]),  # the validation directory holds the training file
        "glob": ([str(data)], [f"{data}/doc00[12].txt"]),
        "disjoint": ([str(data / "doc000.txt")], [one]),
    }[case]
    cfg = compose("train", [*SMOKE, "data=text_files", "tokenizer=byte", "model.vocab_size=null",
                            f"data.files={files}", f"data.val_files={val}"])
    capfd.readouterr()
    validate_train(OmegaConf.to_object(cfg))
    err = capfd.readouterr().err.strip().splitlines()
    shared = {"same-path": [one], "another-spelling": [str(Path(val[0]))], "directory": [one],
              "glob": [str(data / "doc001.txt"), str(data / "doc002.txt")], "disjoint": []}[case]
    assert err == ([_warning("data.files", shared)] if shared else [])
