"""The explicit per-layer window pattern, ``model.mixer.layers`` (global / local per layer,
repeated over each stack): what Qwen2's "first ``max_window_layers`` layers full" needs and
``global_every`` cannot say. Its rules, the windows the built layers get, and the decode
cache / estimator bytes of exactly those layers."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from variants import VOCAB, tiny

from blocklab.config import ConfigError, MixerConfig, PositionConfig, validate_model
from blocklab.model import build_model, masks
from blocklab.model.estimate import estimate, table
from blocklab.model.estimate import state_bytes as kv_cache_bytes
from blocklab.model.softmax_options import SoftmaxOptions

DEC, ED = "decoder", "encoder_decoder"
G, L = "global", "local"


def _with(layers, window=4, global_every=0, family=DEC, n_layers=4, **kw):
    cfg = tiny(family, PositionConfig(name="rope"), window=window, global_every=global_every,
               n_layers=n_layers, **kw)
    return dataclasses.replace(cfg, mixer=MixerConfig(**{**cfg.mixer, "layers": list(layers)}))


def test_the_pattern_gives_each_layer_its_window_repeated_over_each_stack():
    a = SoftmaxOptions(window=4, layers=[G, L, L])
    assert [masks.layer_window(a, i) for i in range(7)] == [None, 4, 4, None, 4, 4, None]
    assert [masks.layer_window(SoftmaxOptions(layers=[G, L]), i) for i in range(2)] == [None] * 2
    model = build_model(validate_model(_with([G, G, L, L])))
    assert [b.attn.window for b in model.decoder.blocks] == [None, None, 4, 4]
    ed = build_model(validate_model(_with([L, G], window=5, family=ED)))  # encoder: 3 layers
    assert [b.attn.window for b in ed.encoder.blocks] == [5, None, 5]
    assert [b.attn.window for b in ed.decoder.blocks] == [5, None, 5, None]


def test_the_patterned_cache_and_the_estimate_hold_rings_on_the_local_layers_only():
    cfg = validate_model(_with([G, G, L, L], attention="gqa"))
    model = build_model(cfg)
    b, capacity = 2, 40
    cache = model.new_cache(b, capacity)
    assert [s.k.shape[2] for s in cache.states] == [capacity, capacity, 3, 3]
    assert kv_cache_bytes(cfg, b, capacity, 4) == cache.nbytes
    e = estimate(cfg, batch=b, seq_len=capacity, bytes_per_value=4)
    assert e.kv_cache_bytes == cache.nbytes
    text = table(cfg, e, batch=b, seq_len=capacity, bytes_per_value=4)
    assert "4 tokens (per layer: global, global, local, local)" in text
    assert "2 x softmax (global), 2 x softmax (local, window 4)" in text
    ids = torch.randint(0, VOCAB, (b, 12))
    with torch.no_grad():  # decoding through the mixed pattern equals recompute
        full = model.eval()(ids)
        cache = model.new_cache(b, 12)
        steps = torch.cat([model(ids[:, i: i + 1], cache=cache) for i in range(12)], 1)
    torch.testing.assert_close(steps, full, atol=1e-5, rtol=0)


@pytest.mark.parametrize(("layers", "window", "global_every", "words"), [
    ([G, "sliding"], 4, 0, "entries must be one of global, local (not 'sliding')"),
    ([G, L], None, 0, "needs model.mixer.window"),
    ([G, L], 4, 2, "so does model.mixer.global_every=2"),
    ([G, L, L, L, L], 4, 0, "5 entries, more than the deepest stack's 4 layers"),
    ([G, G], 4, 0, "no layer would be local"),
])
def test_bad_patterns_fail_in_one_line_naming_the_key(layers, window, global_every, words):
    with pytest.raises(ConfigError) as err:
        validate_model(_with(layers, window=window, global_every=global_every))
    msg = str(err.value)
    assert "\n" not in msg and "model.mixer.layers=" in msg and words in msg, msg


def test_the_pattern_composes_from_the_command_line():
    """An ordinary override of every preset, as Hydra writes a list."""
    from blocklab import config as C
    from blocklab.config import model_config

    m = model_config(C.compose("estimate", ["model=llama_tiny", "model.mixer.window=4",
                                            "model.mixer.layers=[global,local]"]).model)
    assert [b.attn.window for b in build_model(m).decoder.blocks] == [None, 4] * (m.n_layers // 2)
    with pytest.raises(ConfigError, match=r"model\.mixer\.layers=\['local'\]: needs model"):
        model_config(C.compose("estimate", ["model=llama_tiny",
                                            "model.mixer.layers=[local]"]).model)
