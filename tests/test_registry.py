"""User components: ``register(axis, name)`` adds a component to any axis, selectable by name
from a composed config, counted by the estimator, refused with one line when misnamed or
duplicated; plugin modules load from ``$BLOCKLAB_PLUGINS``; registered components are in the
variant grid the model tests run over."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest
import torch

from blocklab import registry
from blocklab.config import ConfigError, DataConfig, compose, model_config
from blocklab.model import build_model
from blocklab.model.blocks import PreNorm
from blocklab.model.estimate import count_params
from blocklab.model.ffn import GeluMLP
from blocklab.model.norm import LayerNorm
from blocklab.model.position import NoPosition
from blocklab.model.transformer import DecoderModel
from blocklab.objectives import CausalLM, build_objective


@pytest.fixture
def scratch():
    """Register components for one test and remove them afterwards."""
    added: list[tuple[str, str]] = []

    def add(axis: str, name: str, component, **kw):
        registry.register(axis, name, **kw)(component)
        added.append((axis, name))
        return component

    yield add
    for axis, name in added:
        registry.table(axis).pop(name, None)
        registry._registered.pop((axis, name), None)


class Decoder2(DecoderModel):
    """A 'new family' for the test: the decoder under another name."""


class PreNorm2(PreNorm):
    pass


def _model(*overrides: str, **names: str):
    chosen = [f"model.{axis}.name={name}" for axis, name in names.items()]
    return model_config(compose("estimate", ["model=gpt2_tiny", "model.n_layers=1",
                                             "model.d_model=32", *chosen, *overrides]).model)


def test_every_model_axis_takes_a_registered_component_by_name(scratch):
    scratch("family", "decoder2", Decoder2)
    scratch("objective", "decoder2", CausalLM)
    scratch("norm", "layernorm2", type("LayerNorm2", (LayerNorm,), {}))
    scratch("block", "pre2", PreNorm2)
    scratch("position", "nope2", type("NoPe2", (NoPosition,), {}))
    scratch("ffn", "gelu2", type("Gelu2", (GeluMLP,), {}))
    from blocklab.model.attention import SoftmaxAttention
    from blocklab.model.head_layouts import HeadLayout

    scratch("attention", "mha2", type("MHA2", (HeadLayout,), {}))
    scratch("mixer", "softmax2", type("Softmax2", (SoftmaxAttention,), {}))
    m = _model(family="decoder2", norm="layernorm2", block="pre2", position="nope2",
               ffn="gelu2", attention="mha2", mixer="softmax2")
    model = build_model(m)
    assert type(model) is Decoder2 and type(model.decoder.blocks[0]) is PreNorm2
    assert type(model.decoder.blocks[0].ffn).__name__ == "Gelu2"
    assert type(model.decoder.blocks[0].attn).__name__ == "Softmax2"
    assert m.kv_heads == m.n_heads  # a registered head layout defaults to one K/V head per head
    assert count_params(m) == sum(p.numel() for p in model.parameters())
    assert type(build_objective("decoder2", DataConfig())) is CausalLM
    out = model(torch.randint(0, m.vocab_size, (2, 5)))
    assert out.shape == (2, 5, m.vocab_size)
    assert {("ffn", "gelu2"), ("family", "decoder2")} <= set(registry.registered())


def test_other_axes_take_registered_components(scratch, tmp_path):
    scratch("schedule", "flat", lambda step, cfg, max_steps: 1.0)
    scratch("logger", "quiet", lambda cfg, run_dir: [])
    text = tmp_path / "tiny.txt"
    text.write_text("hello world\n")
    scratch("corpus", "tiny", lambda: [text])
    assert registry.lookup("schedule", "flat")(5, None, 10) == 1.0
    assert registry.lookup("logger", "quiet")(None, tmp_path) == []
    from blocklab.data.sources import resolve_files

    assert resolve_files(DataConfig(corpus="tiny")) == [text]


def test_a_component_without_param_count_is_counted_on_the_meta_device(scratch):
    class Bare(torch.nn.Module):  # no param_count: the estimator builds it on meta
        def __init__(self, cfg, d_model, d_ff):
            super().__init__()
            self.w = torch.nn.Linear(d_model, 3 * d_ff)
            self.v = torch.nn.Linear(3 * d_ff, d_model, bias=False)

        def forward(self, x):
            return self.v(torch.tanh(self.w(x)))

    scratch("ffn", "bare", Bare)
    m = _model(ffn="bare")
    assert count_params(m) == sum(p.numel() for p in build_model(m).parameters())


def test_unknown_names_list_builtin_and_registered_choices(scratch):
    scratch("ffn", "gelu2", type("Gelu2", (GeluMLP,), {}))
    with pytest.raises(ConfigError) as err:
        _model(ffn="gelu3")
    msg = str(err.value)
    assert "\n" not in msg and "model.ffn.name='gelu3': unknown choice" in msg
    assert "gelu2" in msg and "swiglu" in msg and "docs/extending.md" in msg


def test_bad_registrations_are_refused(scratch):
    scratch("ffn", "gelu2", type("Gelu2", (GeluMLP,), {}))
    with pytest.raises(ValueError, match="exists already"):
        registry.register("ffn", "gelu2")(type("Other", (GeluMLP,), {}))
    with pytest.raises(ValueError, match="exists already"):
        registry.register("ffn", "swiglu")(type("Mine", (GeluMLP,), {}))  # built-ins too
    with pytest.raises(ValueError, match="lower-case identifiers"):
        registry.register("ffn", "My-FFN")
    with pytest.raises(ValueError, match="unknown axis 'ffns'"):
        registry.register("ffns", "x")
    replacement = type("Gelu2b", (GeluMLP,), {})
    scratch("ffn", "gelu2", replacement, replace=True)  # deliberate override
    assert registry.lookup("ffn", "gelu2") is replacement


def test_plugin_modules_load_from_the_environment(monkeypatch, tmp_path):
    (tmp_path / "my_blocklab_components.py").write_text(
        "from blocklab.model.ffn import GeluMLP\n"
        "from blocklab.registry import register\n"
        "@register('ffn', 'env_ffn')\n"
        "class EnvFFN(GeluMLP):\n    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv(registry.PLUGIN_ENV, " my_blocklab_components , ")
    monkeypatch.setattr(registry, "_plugins_loaded", False)
    try:
        assert "my_blocklab_components" in registry.load_plugins()
        assert registry.lookup("ffn", "env_ffn").__name__ == "EnvFFN"
        assert registry.load_plugins() == []  # once per process
    finally:
        registry.table("ffn").pop("env_ffn", None)
        registry._registered.pop(("ffn", "env_ffn"), None)
        sys.modules.pop("my_blocklab_components", None)


def test_a_plugin_that_fails_to_import_is_named_in_one_line(monkeypatch):
    monkeypatch.setenv(registry.PLUGIN_ENV, "no_such_blocklab_plugin")
    monkeypatch.setattr(registry, "_plugins_loaded", False)
    with pytest.raises(ConfigError) as err:
        registry.load_plugins()
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith("plugin error: BLOCKLAB_PLUGINS=no_such_blocklab_plugin")
    assert "ModuleNotFoundError" in msg
    monkeypatch.setattr(registry, "_plugins_loaded", True)


def test_the_example_components_are_in_the_model_test_grid():
    variants = importlib.import_module("model.variants")
    ids = " ".join(i for i, _ in variants.grid())
    for name in ("squared_relu", "scalenorm", "parallel"):
        assert name in ids, name
    assert Path(registry.registered()[("ffn", "squared_relu")].replace(".", "/")).name == \
        "blocklab_example"


def _train(*overrides: str):
    """A composed training config (every rule of validate_train applies to it)."""
    from blocklab.train.run import to_train_config

    return to_train_config(compose("train", ["experiment=smoke", *overrides]))


def test_a_registered_component_brings_its_own_rules(scratch):
    """Validation asks the component (config/validate_model.py): a user position scheme's
    ``check`` refuses a value in one line naming the key, and the ``options`` it declares make
    another scheme's options refused in a training config, as for a built-in."""
    from blocklab.config import validate_train
    from blocklab.config.checks import require

    class Bounded(NoPosition):
        options = ("max_distance",)  # it reads this field, and no other

        @classmethod
        def check(cls, m, key):
            d = m.position.max_distance
            require(d <= 128, f"{key}.position.max_distance", d, "bounded sees at most 128 tokens",
                    "lower it")

    scratch("position", "bounded", Bounded)
    with pytest.raises(ConfigError) as err:
        validate_train(_train("model.position.name=bounded", "model.position.max_distance=200"))
    assert str(err.value) == ("config error: model.position.max_distance=200: bounded sees at "
                              "most 128 tokens; lower it")
    with pytest.raises(ConfigError) as err:
        validate_train(_train("model.position.name=bounded", "model.position.base=500.0"))
    assert str(err.value) == ("config error: model.position.base=500.0: a rope option: "
                              "model.position.name='bounded' ignores it; leave it at 10000.0 "
                              "or use model/position=rope")
    tc = _train("model.position.name=bounded", "model.position.max_distance=100")
    assert validate_train(tc) is tc

    class Unbiased(GeluMLP):  # a norm, block, FFN or family may state rules the same way
        @classmethod
        def check(cls, m, key):
            require(not m.ffn.bias, f"{key}.ffn.bias", m.ffn.bias, "unbiased has no biases")

    scratch("ffn", "unbiased", Unbiased)
    with pytest.raises(ConfigError) as err:
        _model("model.ffn.bias=true", ffn="unbiased")
    assert str(err.value) == "config error: model.ffn.bias=True: unbiased has no biases"
    assert _model("model.ffn.bias=false", ffn="unbiased").ffn.bias is False


def test_a_builtin_under_another_name_keeps_its_rules(scratch):
    """The rules belong to the component, not to its name: rope registered again as 'rope2'
    still needs an even head dimension (tested by name, 'rope2' escaped the rule and failed
    only when the model was built), and T5's buckets their bound."""
    from blocklab.model.position import RoPE, T5Bias

    scratch("position", "rope2", type("RoPE2", (RoPE,), {}))
    scratch("position", "t5_bias2", type("T5Bias2", (T5Bias,), {}))
    with pytest.raises(ConfigError) as err:
        _model("model.d_head=7", position="rope2")
    assert str(err.value) == "config error: model.d_head=7: rope needs an even head dimension"
    with pytest.raises(ConfigError) as err:
        _model("model.position.num_buckets=2", position="t5_bias2")
    assert str(err.value).startswith("config error: model.position.num_buckets=2: t5_bias needs")


def test_the_estimator_asks_each_component_once(scratch):
    """One estimate asks each component each question once (a mixer once per layer): the
    parameter count, the FLOPs and the activation estimate share the answers. It used to count
    the parameters twice, asking every component again (and the mixers a third time)."""
    import collections

    from blocklab.model.estimate import estimate
    from blocklab.model.mixer import Mixer

    calls: collections.Counter = collections.Counter()

    class CountedMixer(Mixer):
        @classmethod
        def param_count(cls, m, layer, *, causal):
            calls["mixer.param_count", layer] += 1
            return 10

        @classmethod
        def flops_per_token(cls, m, layer, *, seq_len, causal):
            calls["mixer.flops_per_token", layer] += 1
            return 100.0

        @classmethod
        def state_bytes(cls, m, layer, *, batch, seq_len, bytes_per_value):
            calls["mixer.state_bytes", layer] += 1
            return 1000

        @classmethod
        def score_keys(cls, m, layer, *, seq_len):
            calls["mixer.score_keys", layer] += 1
            return 0

    class CountedFFN(GeluMLP):
        @staticmethod
        def param_count(cfg, d_model, d_ff):
            calls["ffn.param_count"] += 1
            return 7

    class BareNorm(LayerNorm):  # no closed form: built on the meta device, once
        param_count = None

        def __init__(self, *args, **kwargs):
            calls["norm built"] += 1
            super().__init__(*args, **kwargs)

    class CountedFamily(DecoderModel):
        @classmethod
        def stacks(cls, m):
            calls["family.stacks"] += 1
            return super().stacks(m)

        @classmethod
        def head_param_count(cls, m):
            calls["family.head_param_count"] += 1
            return 0

    class CountedPosition(NoPosition):
        @staticmethod
        def param_count(cfg, **dims):
            calls["position.param_count"] += 1
            return 3

    for axis, name, component in [("mixer", "counted", CountedMixer),
                                  ("ffn", "counted", CountedFFN), ("norm", "bare", BareNorm),
                                  ("family", "counted", CountedFamily),
                                  ("objective", "counted", CausalLM),
                                  ("position", "counted", CountedPosition)]:
        scratch(axis, name, component)
    m = _model("model.n_layers=3", mixer="counted", ffn="counted", norm="bare", family="counted",
               position="counted")
    calls.clear()  # validation asked the family for its stacks
    e = estimate(m, seq_len=16)
    per_layer = [f"mixer.{q}" for q in ("param_count", "flops_per_token", "state_bytes",
                                        "score_keys")]
    assert calls == collections.Counter(
        {**{(q, i): 1 for q in per_layer for i in range(3)}, "ffn.param_count": 1,
         "norm built": 1, "family.stacks": 1, "family.head_param_count": 1,
         "position.param_count": 1})
    norm = 2 * m.d_model  # LayerNorm with a bias
    assert e.params == (m.vocab_size * m.d_model + 3 + 3 * (10 + 7 + 2 * norm) + norm)
    assert e.state_bytes == 3 * 1000


def test_optimizers_and_loggers_bring_their_own_rules(scratch):
    """SGD's rule (Nesterov needs momentum) and wandb's (its mode) belong to the components
    (train/optim.py, train/loggers.py): registered under another name they keep them (tested
    by name, 'sgd2' and 'wandb2' escaped them), and a user's combining logger is refused a
    standalone one like ``many``."""
    from blocklab.config import validate_train
    from blocklab.train.loggers import many, wandb
    from blocklab.train.optim import sgd

    scratch("optim", "sgd2", sgd)
    scratch("logger", "wandb2", wandb)
    scratch("logger", "many2", many)
    with pytest.raises(ConfigError) as err:
        validate_train(_train("optim.name=sgd2", "optim.nesterov=true", "optim.momentum=0"))
    assert str(err.value) == ("config error: optim.nesterov=True: Nesterov momentum needs "
                              "optim.momentum > 0")
    with pytest.raises(ConfigError) as err:
        validate_train(_train("logger.name=wandb2", "logger.mode=offlien"))
    assert str(err.value) == "config error: logger.mode='offlien': one of offline, online, disabled"
    with pytest.raises(ConfigError) as err:
        validate_train(_train("logger.name=many2", "logger.loggers=[csv,none]"))
    assert str(err.value) == ("config error: logger.loggers=['csv', 'none']: 'none' cannot be "
                              "one of several loggers")
