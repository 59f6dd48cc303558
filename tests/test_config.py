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
