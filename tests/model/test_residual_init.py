"""Residual-output init is declared, not guessed (issue 42): each mixer, FFN and
cross-attention names the projections that write into the residual stream
(``residual_outputs``), and only those get N(0, init_std / sqrt(2·layers)).

Oracle for the built-ins: the old rule — every matrix named ``*out.weight`` / ``*down.weight`` —
picked exactly the same weights, so their init (and every figure made with it) is unchanged.
The example plugin's ``TokenShift`` names its projections ``cur`` / ``prev``: the old rule left
it unscaled; declared, it is scaled."""

from __future__ import annotations

import math
import warnings

import pytest
import torch
from torch import nn

from blocklab import registry
from blocklab.config import MixerConfig, PositionConfig
from blocklab.model.mixer import Mixer
from blocklab.model.transformer import build_model, residual_outputs
from model.variants import grid, tiny

PLUGINS = {"token_shift", "compact_kv"}  # the example plugin's mixers (docs/examples/plugin/)


def _old_rule(model: nn.Module) -> set[str]:
    return {n for n, p in model.named_parameters()
            if p.dim() > 1 and n.endswith(("out.weight", "down.weight"))}


@pytest.mark.parametrize(("label", "cfg"), grid(), ids=[label for label, _ in grid()])
def test_the_declared_projections_are_the_ones_the_name_rule_found(label, cfg):
    model = build_model(cfg)
    mixers = {cfg.layer_mixer(i) for i in range(cfg.n_layers)}
    if mixers & PLUGINS:  # names of its own (next test): the built-ins' choices are kept
        assert residual_outputs(model) >= _old_rule(model)
    else:
        assert residual_outputs(model) == _old_rule(model)


def test_the_plugin_mixer_gets_depth_scaled_init():
    torch.manual_seed(0)
    cfg = tiny(position=PositionConfig(name="none"), mixer=MixerConfig(name="token_shift"),
               d_model=64, n_layers=8)
    model = build_model(cfg)
    scaled = residual_outputs(model)
    for layer in range(cfg.n_layers):
        for child in ("cur", "prev"):
            name = f"decoder.blocks.{layer}.attn.{child}.weight"
            assert name in scaled, sorted(scaled)
    stds = {n: p.std().item() for n, p in model.named_parameters() if n in scaled}
    want = cfg.init_std / math.sqrt(2 * cfg.n_layers)  # 0.005, against init_std 0.02
    assert all(abs(s / want - 1) < 0.1 for s in stds.values()), stds
    assert not _old_rule(model) & {n for n in scaled if ".attn." in n}  # the old rule missed them


def test_a_mixer_that_declares_nothing_gets_plain_init_and_a_warning():
    @registry.register("mixer", "undeclared_test")
    class Undeclared(Mixer):
        bidirectional = False

        def __init__(self, m, layer, *, causal):
            super().__init__(m, layer, causal=causal)
            self.proj = nn.Linear(m.d_model, m.d_model)

        def forward(self, x, seq, state):
            return self.proj(x)

    try:
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            build_model(tiny(position=PositionConfig(name="none"),
                             mixer=MixerConfig(name="undeclared_test")))
        said = [str(w.message) for w in seen if "residual_outputs" in str(w.message)]
        assert len(said) == 1 and said[0].startswith("mixer Undeclared declares no "
                                                     "residual_outputs"), said
    finally:
        registry.table("mixer").pop("undeclared_test", None)
        registry._registered.pop(("mixer", "undeclared_test"), None)


def test_a_declared_name_that_is_not_a_weight_is_refused():
    class Wrong(Mixer):
        residual_outputs = ("missing",)

    module = nn.Module()
    module.mixer = Wrong(tiny(), 0, causal=True)
    with pytest.raises(TypeError, match=r"Wrong\.residual_outputs names 'missing'"):
        residual_outputs(module)
