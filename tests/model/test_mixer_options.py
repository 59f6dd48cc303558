"""Each mixer owns its options (config/mixer_options.py): another mixer's option or a typo is
refused in one line naming the key and its owner (or the closest key), hybrids take the options
of all their mixers, old configs and recorded overrides are migrated on read, and the hashes of
an unchanged model stay what earlier versions recorded."""

from __future__ import annotations

import dataclasses

import pytest
from variants import tiny

from blocklab import registry
from blocklab.config import ConfigError, MixerConfig, PositionConfig, validate_model
from blocklab.config.compose import compose, model_config, model_to_dict
from blocklab.config.migrate import legacy_config, legacy_layout, migrate_override
from blocklab.config.mixer_options import option_names
from blocklab.config.stored import stored_config
from blocklab.provenance import arch_hash, config_hash
from inprocess import run_cli


@pytest.mark.parametrize("args", [
    ("model/mixer=softmax", "model.mixer.d_state=8"),
    ("model/mixer=ssm", "model.mixer.feature_map=taylor"),
    ("model/mixer=linear", "model.attention.scale=2.0"),
])
def test_another_mixers_option_exits_2_in_one_line(tmp_path, capfd, args):
    r = run_cli(capfd, "blocklab-train", "experiment=smoke", f"out_root={tmp_path}", *args,
                cwd=tmp_path)
    lines = r.stderr.strip().splitlines()
    key = args[1].split("=")[0]
    assert r.returncode == 2 and len(lines) == 1 and key in lines[0], r.stderr
    owner = {"d_state": "ssm", "feature_map": "linear", "scale": "softmax"}[key.split(".")[-1]]
    assert owner in lines[0]


NOT_DEFAULT = {int: 7, float: 0.5, str: "other", bool: False, list: ["local"],
               type(None): 5}


def _cases():
    table = registry.table("mixer")
    for owner, cls in table.items():
        for option in option_names(cls):
            for other, other_cls in table.items():
                if other != owner and option not in option_names(other_cls):
                    yield owner, option, other


@pytest.mark.parametrize(("owner", "option", "other"), list(_cases()))
def test_every_option_is_refused_on_every_other_mixer(owner, option, other):
    """Over the registry: a future mixer's options are covered without a new test."""
    cfg = tiny("decoder", PositionConfig(name="none"), mixer=MixerConfig(name=other))
    default = getattr(registry.lookup("mixer", owner).options(), option)
    # a default changes nothing (a bool's other value: either may be the default)
    cfg.mixer[option] = not default if isinstance(default, bool) else NOT_DEFAULT[type(default)]
    with pytest.raises(ConfigError) as err:
        validate_model(cfg)
    msg = str(err.value)
    assert "\n" not in msg and f"model.mixer.{option}=" in msg and owner in msg, msg


def test_an_unread_option_at_its_owners_default_is_dropped():
    """``model.mixer.name=ssm`` over softmax.yaml's listing: window=None changes nothing."""
    cfg = compose("train", ["experiment=smoke", "model.vocab_size=64", "model.mixer.name=ssm",
                            "model/position=none"])
    m = model_config(cfg.model)
    assert "window" not in m.mixer and m.mixer.d_state == 16


def test_a_typo_names_the_closest_key():
    cfg = tiny("decoder", PositionConfig(name="none"), mixer=MixerConfig(name="ssm", d_stat=8))
    with pytest.raises(ConfigError, match=r"model\.mixer\.d_stat=8: .*did you mean "
                                          r"model\.mixer\.d_state\?"):
        validate_model(cfg)
    with pytest.raises(ConfigError, match=r"did you mean model\.mixer\.window\?"):
        compose("train", ["experiment=smoke", "model.mixer.windw=3"])


def test_hybrids_take_the_options_of_all_their_mixers():
    cfg = compose("train", ["experiment=smoke", "model.vocab_size=64", "model/mixer=linear",
                            "model.mixer.pattern=[linear,softmax,ssm]", "+model.mixer.window=4",
                            "+model.mixer.d_state=4", "model.mixer.chunk=16",
                            "model.n_layers=3", "model/position=none"])
    m = model_config(cfg.model)
    assert (m.mixer.window, m.mixer.d_state, m.mixer.chunk, m.mixer.feature_map) == (
        4, 4, 16, "elu")
    assert m.mixer.expand == 2  # ssm's default filled in


def test_cross_attention_reads_softmax_scale_and_dropout():
    ed = dataclasses.replace(tiny("encoder_decoder", PositionConfig(name="none")),
                             mixer=MixerConfig(name="linear", scale=1.0))
    assert validate_model(ed).mixer.scale == 1.0
    ed.mixer["window"] = 3  # cross-attention is never windowed, and no layer is softmax
    with pytest.raises(ConfigError, match=r"model\.mixer\.window=3: an option of mixer softmax"):
        validate_model(ed)


def test_an_old_stored_config_migrates_once_and_says_so(capsys):
    cfg = compose("train", ["experiment=smoke", "model.vocab_size=256", "model/mixer=linear"])
    from omegaconf import OmegaConf

    plain = OmegaConf.to_container(cfg, resolve=True, enum_to_str=True)
    old = legacy_config(plain)  # what an earlier blocklab stored: the union, attention.*
    old["model"]["attention"]["window"] = None
    assert "d_state" in old["model"]["mixer"] and "window" in old["model"]["attention"]
    tc = stored_config(old, "checkpoint x")
    assert capsys.readouterr().err == ""  # unread keys at their old defaults: silent
    assert "d_state" not in tc.model.mixer and "window" not in tc.model.mixer
    softmax = legacy_config(OmegaConf.to_container(compose(
        "train", ["experiment=smoke", "model.vocab_size=256"]), resolve=True, enum_to_str=True))
    softmax["model"]["attention"]["window"] = 64
    tc = stored_config(softmax, "checkpoint y")
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "migrated" in err[0] and "model.attention.window=64" in err[0]
    assert tc.model.mixer.window == 64


def test_old_recorded_overrides_resume_as_todays():
    assert migrate_override("model.attention.window=64") == "++model.mixer.window=64"
    assert migrate_override("model.mixer.d_state=8") == "model.mixer.d_state=8"
    cfg = compose("train", ["experiment=smoke", migrate_override("model.attention.window=64")])
    assert cfg.model.mixer.window == 64


# (overrides, arch_hash, config_hash) recorded by the blocklab before this change
HASHES = [
    ([], "6c6caf993dcfa120", "66e6ece67ac97ad3"),
    (["model/mixer=ssm", "model/position=none"], "6168d71555fe2e25", "b30fde83c1275df4"),
    (["model.mixer.window=8"], "3f1c701381915942", "39ef830ad038a04a"),
    (["model=t5_tiny"], "9ec096f73509c287", "9782207886f78865"),
    (["model/mixer=linear", "model.mixer.pattern=[linear,softmax]", "+model.mixer.window=16"],
     "b7056df313a95e0d", "a6cfc2a12d6d5da9"),
]


@pytest.mark.parametrize(("overrides", "arch", "config"), HASHES)
def test_an_unchanged_model_keeps_its_hashes(overrides, arch, config):
    from omegaconf import OmegaConf

    cfg = compose("train", ["experiment=smoke", "model.vocab_size=256", *overrides])
    m = model_config(cfg.model)
    plain = OmegaConf.to_container(cfg, resolve=True, enum_to_str=True)
    assert arch_hash(legacy_layout(model_to_dict(m))) == arch
    assert config_hash(legacy_config(plain)) == config
