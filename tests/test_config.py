"""Configs: every preset × every option of every model axis composes, validates and builds;
config files and built-in registry keys are the same sets; bad values fail with one line
naming the key, the value and the rule."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from blocklab import config as C
from blocklab import registry
from blocklab.config import ConfigError, model_config, register_configs
from blocklab.model.estimate import count_params
from blocklab.model.transformer import build_model
from inprocess import SAFETY_S

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "configs"
AXES = ("family", "norm", "block", "position", "ffn", "attention")
PRESETS = sorted(p.stem for p in (CONFIGS / "model").glob("*.yaml"))

register_configs()


def _compose(*overrides: str):
    return C.compose("estimate", overrides)  # the documented Python entry point


def _options(group: str) -> set[str]:
    return {p.stem for p in (CONFIGS / "model" / group).glob("*.yaml")}


def test_a_second_compose_stores_no_schema_again(monkeypatch):
    """The schemas go into Hydra's ConfigStore once per process: storing them at every compose
    was a third of each one (every Python compose and every in-process command of the suite)."""
    from hydra.core.config_store import ConfigStore

    _compose()
    stored: list[str] = []
    monkeypatch.setattr(ConfigStore, "store", lambda self, **kw: stored.append(kw["name"]))
    assert OmegaConf.select(_compose("model.n_layers=3"), "model.n_layers") == 3
    assert stored == []


@pytest.mark.parametrize("group", (*AXES, "mixer"))  # mixers: every preset × mixer in test_mixers
def test_config_files_and_builtin_registry_keys_are_the_same_set(group):
    assert _options(group) == set(registry.builtin_names(group))
    assert registry.AXES[group].group == f"model/{group}"


def test_presets_exist():
    assert {"gpt2_tiny", "llama_tiny", "bert_tiny", "t5_tiny"} <= set(PRESETS)


@pytest.mark.parametrize("preset", PRESETS)
def test_every_option_of_every_axis_composes_validates_and_builds(preset):
    with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):
        # vocab_size=null presets take the tokenizer's size in training; give one here
        composed = {(g, o): compose("estimate", overrides=[f"model={preset}", f"model/{g}={o}",
                                                            "model.vocab_size=199"])
                    for g in sorted(AXES) for o in sorted(_options(g))}
    for (group, option), cfg in composed.items():
        assert OmegaConf.select(cfg, f"model.{group}.name") == option
        m = model_config(cfg.model)
        with torch.device("meta"):
            model = build_model(m)
        assert sum(p.numel() for p in model.parameters()) == count_params(m)


def test_preset_values_reach_the_model():
    m = model_config(_compose("model=llama_tiny").model)
    assert (m.norm.name, m.position.name, m.ffn.name, m.kv_heads) == (
        "rmsnorm", "rope", "swiglu", 2)
    assert not m.attention.bias and not m.tie_embeddings
    m = model_config(_compose("model=t5_tiny", "model.family.n_encoder_layers=2").model)
    model = build_model(m)
    assert len(model.encoder.blocks) == 2 and len(model.decoder.blocks) == 4


@pytest.mark.parametrize(("overrides", "key", "words"), [
    (["model.n_heads=3"], "model.n_heads=3", "must divide d_model=256"),
    (["model/attention=gqa", "model.attention.n_kv_heads=3"], "model.attention.n_kv_heads=3", "divide n_heads"),
    (["model/attention=gqa", "model.attention.n_kv_heads=8"], "model.attention.n_kv_heads=8", "[1, n_heads=4]"),
    (["model/attention=mha", "model.attention.n_kv_heads=2"], "model.attention.n_kv_heads=2", "mha needs"),
    (["model/attention=gqa", "model.attention.n_kv_heads=4"], "model.attention.n_kv_heads=4", "gqa needs 1 < n_kv_heads"),
    (["model/attention=gqa", "model.attention.n_kv_heads=null"], "model.attention.n_kv_heads=None", "gqa needs n_kv_heads"),
    (["model/position=rope", "model.d_head=7"], "model.d_head=7", "even head dimension"),
    (["model/position=rope", "model.position.factor=0.5"], "model.position.factor=0.5", ">= 1"),
    (["model.d_model=0"], "model.d_model=0", ">= 1"),
    (["model.vocab_size=-5"], "model.vocab_size=-5", ">= 1"),
    (["model.dropout=1.5"], "model.dropout=1.5", "[0, 1)"),
    (["model.norm.eps=0"], "model.norm.eps=0.0", "> 0"),
    (["model/position=t5_bias", "model.position.num_buckets=1"], "model.position.num_buckets=1", "num_buckets >= 4"),
])
def test_invalid_values_fail_with_one_line_naming_key_value_and_rule(overrides, key, words):
    cfg = _compose(*overrides)
    with pytest.raises(ConfigError) as err:
        model_config(cfg.model)
    msg = str(err.value)
    assert "\n" not in msg and key in msg and words in msg, msg


def test_typos_and_wrong_types_fail_at_compose_time():
    """``compose`` reports like the command line: one-line ConfigErrors (config/strict.py,
    config/hydra_errors.py), never Hydra's multi-line composition exceptions."""
    with pytest.raises(ConfigError, match=r"model\.n_layer=3: not a config key; did you mean "
                                          r"model\.n_layers\?"):
        _compose("model.n_layer=3")
    with pytest.raises(ConfigError, match=r"model/position=ropee: 'ropee' is not an option of "
                                          r"model/position; did you mean rope\?"):
        _compose("model/position=ropee")
    with pytest.raises(ConfigError, match=r"model\.position\.name='ropee': unknown choice; known: "
                                          r"alibi, learned"):
        model_config(_compose("model.position.name=ropee").model)
    with pytest.raises(ConfigError, match=r"model\.d_model=big: .*big"):
        _compose("model.d_model=big")
    with pytest.raises(ConfigError, match="scaling"):
        _compose("model/position=rope", "model.position.scaling=yarnn")


def test_plain_dict_configs_are_checked_like_composed_ones():
    good = C.model_to_dict(model_config(_compose("model=t5_tiny").model))
    assert model_config(good) == model_config(_compose("model=t5_tiny").model)
    with pytest.raises(ConfigError, match="n_layer"):
        model_config({**good, "n_layer": 3})
    with pytest.raises(ConfigError, match="d_model"):
        model_config({**good, "d_model": "big"})
    with pytest.raises(ConfigError, match="_target_"):
        model_config({**good, "ffn": {"_target_": "os.system"}})


def _cli(*args: str) -> subprocess.CompletedProcess:
    exe = Path(sys.executable).parent / "blocklab-estimate"
    return subprocess.run([str(exe), *args], capture_output=True, text=True, timeout=SAFETY_S)


def test_estimate_prints_the_table_and_the_command_reports_errors_in_one_line():
    from blocklab.model.estimate import estimate, table

    m = model_config(_compose("model=llama_tiny", "model.n_layers=32", "model.d_model=4096",
                              "model.n_heads=32", "model.attention.n_kv_heads=8").model)
    e = estimate(m, batch=1, seq_len=8192, bytes_per_value=2)
    text = table(m, e, batch=1, seq_len=8192, bytes_per_value=2)
    assert "1,073,741,824 B (1.000 GiB)" in text  # 2·B·L·T·H_kv·d_head·bytes
    bad = _cli("model.n_heads=3")
    assert bad.returncode == 2
    assert bad.stderr.strip().splitlines() == [
        "config error: model.n_heads=3: must divide d_model=256; or set model.d_head explicitly"]


def test_a_null_vocab_size_is_only_for_training():
    with pytest.raises(ConfigError, match=r"model\.vocab_size=None: must be set here"):
        model_config(_compose("model=retrieval_tiny").model)


def test_compose_searches_user_config_dirs(tmp_path):
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "my_tiny.yaml").write_text(
        "defaults:\n  - llama_tiny\n  - _self_\nd_model: 96\nvocab_size: 101\n")
    m = model_config(C.compose("estimate", ["model=my_tiny"], config_dirs=[str(tmp_path)]).model)
    assert (m.d_model, m.vocab_size, m.position.name) == (96, 101, "rope")
    with pytest.raises(ConfigError, match=r"model=my_tiny: 'my_tiny' is not an option of model"):
        C.compose("estimate", ["model=my_tiny"])  # not found without the directory


def test_local_attention_window_composes_from_the_command_line_and_is_checked():
    """``model.mixer.window`` / ``global_every`` are ordinary overrides of every preset;
    the rules (odd window for bidirectional stacks, global_every only with a window) fail in
    one line naming key, value and rule."""
    m = model_config(_compose("model=llama_tiny", "model.mixer.window=4",
                              "model.mixer.global_every=2").model)
    model = build_model(m)
    assert [b.attn.window for b in model.decoder.blocks] == [4, None] * (m.n_layers // 2)
    for overrides, words in (
            (("model=bert_tiny", "model.mixer.window=4"),
             "model.mixer.window=4: must be odd for family 'encoder'"),
            (("model=t5_tiny", "model.mixer.window=0"),
             "model.mixer.window=0: must be null (global attention) or >= 1"),
            (("model=gpt2_tiny", "model.mixer.global_every=3"),
             "model.mixer.global_every=3: needs model.mixer.window")):
        with pytest.raises(ConfigError) as err:
            model_config(_compose(*overrides).model)
        assert "\n" not in str(err.value) and words in str(err.value), str(err.value)


# ------------------------------------------------- memory across segments (issue 45): data keys
SEG = ["experiment=smoke", "trainer.progress_bar=false", "probes=none",
       "checkpoint_probes.enabled=false"]
#: the composed bases the rules are tried on (composing is slow: once each, then keys set)
BASES = {"synthetic": [], "text": ["data=shakespeare", "tokenizer=char"],
         "encoder": ["model=bert_tiny"], "learned": ["model/position=learned"]}


@pytest.fixture(scope="module")
def bases():
    return {name: C.compose("train", [*SEG, *extra]) for name, extra in BASES.items()}


def _train(bases, base: str = "synthetic", **keys):
    import copy

    from blocklab.train.run import to_train_config

    cfg = copy.deepcopy(bases[base])
    for key, value in keys.items():
        OmegaConf.update(cfg, key.replace("__", "."), value, force_add=True)
    return C.validate_train(to_train_config(cfg))


STREAM = {"data__segment_mode": "stream", "data__seq_len": 32}
SPLIT = {"data__segment_mode": "split", "data__seq_len": 32}


@pytest.mark.parametrize(("base", "keys", "line"), [
    ("synthetic", {"data__segment_mode": "carry"},
     "data.segment_mode='carry': one of none, split, stream"),
    ("synthetic", {"data__segment_mode": "stream"},
     "data.segment_mode='stream': stream reads a text corpus as lanes; synthetic data uses "
     "split"),
    ("text", {**SPLIT, "data__packing": True},
     "data.packing=True: segment modes lay documents out themselves (data.segment_mode=split); "
     "set data.packing=false"),
    ("encoder", SPLIT, "data.segment_mode='split': carried state needs a causal decoder "
                       "(model.family.name=decoder, not encoder)"),
    ("text", {**STREAM, "trainer__devices": 2, "trainer__strategy": "ddp"},
     "data.segment_mode='stream': stream runs on one process for now (trainer.devices=2"),
    ("text", {**STREAM, "trainer__num_nodes": 2},
     "data.segment_mode='stream': stream runs on one process for now (trainer.devices=1, "
     "trainer.num_nodes=2)"),
    ("synthetic", {**SPLIT, "data__doc_len": 100},
     "data.doc_len=100: a whole number of segments of data.seq_len=32"),
    ("synthetic", {**SPLIT, "data__doc_len": 16},
     "data.doc_len=16: a whole number of segments of data.seq_len=32"),
    ("synthetic", {"data__seq_len": 32, "data__doc_len": 64},
     "data.doc_len=64: the longest document of data.segment_mode=split (not none)"),
    ("synthetic", {**SPLIT, "data__doc_len": 64, "data__curriculum": [[0, 32], [10, 96]]},
     "data.curriculum=[[0, 32], [10, 96]]: each max_len must be <= the document length 64"),
    ("synthetic", {"trainer__bptt": -1}, "trainer.bptt=-1: must be >= 0"),
    ("text", {**STREAM, "trainer__bptt": 0},
     "trainer.bptt=0: stream mode reads rows of trainer.bptt segments: must be >= 1"),
    ("synthetic", {**SPLIT, "trainer__compile": True},
     "trainer.compile=True: would trace forwards that write carried state"),
    ("synthetic", {**SPLIT, "trainer__activation_checkpointing": True},
     "trainer.activation_checkpointing=True: would re-run forwards that write carried state"),
    ("synthetic", {"model__memory_tokens": -1}, "model.memory_tokens=-1: must be >= 0"),
    ("synthetic", {"model__memory_tokens": 8},
     "model.memory_tokens=8: memory tokens travel with one document: data.segment_mode=split"),
    ("learned", {**SPLIT, "model__memory_tokens": 8, "model__max_seq_len": 40},
     "model.max_seq_len=40: the learned position table must cover a segment and its memory "
     "tokens: data.seq_len + 2 x model.memory_tokens = 48"),
    ("learned", {**SPLIT, "data__doc_len": 128, "model__max_seq_len": 64},
     "model.max_seq_len=64: positions continue across a document's segments: the learned "
     "position table must cover data.doc_len=128"),
    ("text", {**STREAM, "model__position__name": "learned", "model__max_seq_len": 4096},
     "model.position.name='learned': positions continue across segments and a stream's never "
     "end; a position table cannot follow them"),
    ("text", {**STREAM, "model__mixer__name": "gated_conv", "model__position__name": "none"},
     "data.segment_mode='stream': model.mixer.long_conv=true keeps every token of a document "
     "and a stream's documents never end: use data.segment_mode=split"),
])
def test_segment_mode_rules_fail_in_one_line(bases, base, keys, line):
    with pytest.raises(ConfigError) as err:
        _train(bases, base, **keys)
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith("config error: ") and line in msg, msg


def test_memory_tokens_and_an_xl_memory_are_refused_together(bases):
    """(``model.mixer.mem_len`` is softmax's option once the XL memory lands: set here on the
    checked config's mixer options directly.)"""
    from blocklab.config.validate import validate_segment_run

    tc = _train(bases, **SPLIT, model__memory_tokens=4)
    tc.model.mixer["mem_len"] = 16
    with pytest.raises(ConfigError, match=r"^config error: model\.memory_tokens=4: memory tokens "
                                          r"and model\.mixer\.mem_len=16 are two memories"):
        validate_segment_run(tc)
    tc.model.mixer["mem_len"] = 0
    validate_segment_run(tc)


def test_segment_modes_that_keep_the_rules_validate(bases):
    tc = _train(bases, "text", **STREAM, trainer__bptt=2)
    assert (tc.data.segment_mode, tc.trainer.bptt) == ("stream", 2)
    tc = _train(bases, "learned", **SPLIT, data__doc_len=128, trainer__bptt=0,
                data__curriculum=[[0, 64], [10, 128]], model__memory_tokens=4,
                model__max_seq_len=40)
    assert (tc.data.doc_len, tc.model.memory_tokens) == (128, 4)
    plain = _train(bases)  # the defaults change nothing
    assert (plain.data.segment_mode, plain.data.doc_len, plain.trainer.bptt,
            plain.model.memory_tokens) == ("none", None, 1, 0)


def test_new_segment_keys_at_their_defaults_vanish_from_the_hashed_config(bases):
    from blocklab.config.migrate import legacy_config, legacy_layout

    plain = OmegaConf.to_container(bases["synthetic"])
    old = legacy_config(plain)
    assert "segment_mode" not in old["data"] and "doc_len" not in old["data"]
    assert "bptt" not in old["trainer"] and "memory_tokens" not in old["model"]
    assert "memory_tokens" not in legacy_layout(plain["model"])
    changed = {**plain, "trainer": {**plain["trainer"], "bptt": 2},
               "model": {**plain["model"], "memory_tokens": 4}}
    new = legacy_config(changed)
    assert new["trainer"]["bptt"] == 2 and new["model"]["memory_tokens"] == 4


def test_the_cli_refuses_a_segment_rule_with_exit_2(tmp_path, capfd):
    from inprocess import run_cli

    r = run_cli(capfd, "blocklab-train", *SEG, "data.segment_mode=stream",
                f"run_dir={tmp_path / 'run'}", cwd=tmp_path)
    assert r.returncode == 2, r.stderr[-2000:]
    assert r.stderr.strip().splitlines() == [
        "config error: data.segment_mode='stream': stream reads a text corpus as lanes; "
        "synthetic data uses split"]


# --------------------------------------- XL memory (issue 45): model.mixer.mem_len's rules
@pytest.mark.parametrize(("base", "keys", "line"), [
    ("synthetic", {"model__mixer__mem_len": 16},
     "model.mixer.mem_len=16: memory across segments needs data.segment_mode=split or stream"),
    ("text", {**STREAM, "model__mixer__mem_len": None},
     "model.mixer.mem_len=None: null keeps every key of the document: needs "
     "data.segment_mode=split (not stream)"),
    ("learned", {**SPLIT, "model__mixer__mem_len": 16},
     "model.mixer.mem_len=16: memory across segments needs relative positions (rotary, a "
     "score bias or none); model.position.name=learned embeds absolute ones"),
    ("synthetic", {**SPLIT, "model__mixer__mem_len": -1},
     "model.mixer.mem_len=-1: must be null or an integer >= 0"),
    ("synthetic", {**SPLIT, "model__mixer__eval_mem_len": -2},
     "model.mixer.eval_mem_len=-2: must be null or an integer >= 0"),
])
def test_xl_memory_rules_fail_in_one_line(bases, base, keys, line):
    with pytest.raises(ConfigError) as err:
        _train(bases, base, **keys)
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith("config error: ") and line in msg, msg


def test_xl_memory_that_keeps_the_rules_validates_and_vanishes_at_its_default(bases):
    from blocklab.config.migrate import legacy_layout

    tc = _train(bases, "text", **STREAM, model__mixer__mem_len=32, model__mixer__eval_mem_len=64)
    assert (tc.model.mixer["mem_len"], tc.model.mixer["eval_mem_len"]) == (32, 64)
    tc = _train(bases, **SPLIT, model__mixer__mem_len=None)
    assert tc.model.mixer["mem_len"] is None
    plain = OmegaConf.to_container(bases["synthetic"])
    assert plain["model"]["mixer"]["mem_len"] == 0
    layout = legacy_layout(plain["model"])
    assert "mem_len" not in layout["mixer"] and "eval_mem_len" not in layout["mixer"]
    changed = {**plain["model"], "mixer": {**plain["model"]["mixer"], "mem_len": 8}}
    assert legacy_layout(changed)["mixer"]["mem_len"] == 8


@pytest.mark.parametrize(("keys", "line"), [
    ({"model__mixer__compress_ratio": 4},
     "model.mixer.compress_ratio=4: compresses evicted memory: set model.mixer.mem_len > 0"),
    ({"model__mixer__mem_len": 8, "model__mixer__compress_ratio": 1},
     "model.mixer.compress_ratio=1: must be 0 (evicted memory dropped) or >= 2"),
    ({"model__mixer__mem_len": 8, "model__mixer__compress_ratio": 2,
      "model__mixer__compress_kind": "max"}, "model.mixer.compress_kind='max': one of mean, conv"),
    ({"model__mixer__mem_len": 8, "model__mixer__compress_ratio": 2,
      "model__mixer__compress_len": 0}, "model.mixer.compress_len=0: must be null"),
    ({"model__mixer__mem_len": 8, "model__mixer__compress_ratio": 2,
      "model__mixer__compress_loss": -1.0}, "model.mixer.compress_loss=-1.0: must be >= 0"),
])
def test_compressed_memory_rules_fail_in_one_line(bases, keys, line):
    with pytest.raises(ConfigError) as err:
        _train(bases, **SPLIT, **keys)
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith("config error: ") and line in msg, msg
