"""Llama 4 text (dense layers) in and out, against Hugging Face ``transformers`` itself: tiny
random Llama4ForCausalLM models (chunked rotary layers, NoPE global layers with the attention
temperature, interleaved rotary rows) are imported, compared logit by logit at a length past
several chunks (also left-padded), decoded greedily past the chunks with the cache (dynamic
and static), and exported and reloaded by ``from_pretrained`` with the same logits. Negative
controls: the rotary rows left interleaved, the temperature's ``+ 1`` dropped and the NoPE
layer moved each fail the same check. Configs blocklab cannot express are refused by name."""

from __future__ import annotations

import json

import pytest
import torch

transformers = pytest.importorskip("transformers")

from blocklab.convert import export_model  # noqa: E402
from blocklab.convert import llama4 as llama4_arch  # noqa: E402
from blocklab.model import attention as attention_mod  # noqa: E402
from convert.test_hf_roundtrip import save_random  # noqa: E402
from convert.test_hf_windows import (  # noqa: E402
    _greedy_matches,
    _import,
    _max_diff,
    _refused,
)

TOL = 1e-5
VOCAB = 96
CHUNK = 4
T = 16  # 4 chunks; temperature steps at positions 3, 7, 11, 15 (floor_scale 4)


def _config(layers=4, **extra):
    from transformers import Llama4TextConfig

    base = {"vocab_size": VOCAB, "hidden_size": 32, "intermediate_size": 48,
            "intermediate_size_mlp": 40, "num_hidden_layers": layers, "num_attention_heads": 4,
            "num_key_value_heads": 2, "head_dim": 8, "max_position_embeddings": 64,
            "rms_norm_eps": 1e-5, "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0,
            "moe_layers": [], "use_qk_norm": False, "attention_chunk_size": CHUNK,
            "floor_scale": 4, "attn_scale": 0.5, "initializer_range": 0.2,
            "rope_parameters": {"rope_type": "default", "rope_theta": 5000.0}}
    return Llama4TextConfig(**{**base, **extra})


def _llama4(**extra):
    from transformers import Llama4ForCausalLM

    return Llama4ForCausalLM(_config(**extra))


CASES = {  # name -> (HF model, blocklab's chunked layers, its global layers' rotary)
    "every-4th-global": (lambda: _llama4(), [True, True, True, False], False),  # Scout-like
    "alternate-tied-bias": (lambda: _llama4(no_rope_layers=[1, 0, 1, 0], attention_bias=True,
                                            tie_word_embeddings=True),
                            [True, False, True, False], False),
    "irregular": (lambda: _llama4(no_rope_layers=[0, 1, 1, 0]), [False, True, True, False],
                  False),
    "no-temperature": (lambda: _llama4(attn_temperature_tuning=False),
                       [True, True, True, False], False),
    "every-layer-rotary": (lambda: _llama4(no_rope_layers=[1, 1, 1, 1]), [True] * 4, True),
    "rotary-global-layer": (lambda: _llama4(no_rope_layers=[1, 1, 1, 1], layer_types=[
        "chunked_attention"] * 3 + ["full_attention"]), [True, True, True, False], True),
    "llama3-rope": (lambda: _llama4(rope_parameters={
        "rope_type": "llama3", "rope_theta": 5000.0, "factor": 4.0, "low_freq_factor": 1.0,
        "high_freq_factor": 4.0, "original_max_position_embeddings": 16}),
        [True, True, True, False], False),
}


def _save(tmp_path, case):
    torch.manual_seed(0)
    return save_random(tmp_path, CASES[case][0](), {"pad": "<pad>", "bos": "<s>", "eos": "</s>"})


def _ids(batch=2, length=T):
    return torch.randint(3, VOCAB - 4, (batch, length), generator=torch.Generator().manual_seed(1))


def _chunked(model):
    return [getattr(b.attn.window, "chunk", None) == CHUNK for b in model.decoder.blocks]


@pytest.mark.parametrize("case", sorted(CASES))
def test_llama4_import_matches_hf_logits_greedy_and_export_reloads(tmp_path, case):
    hf, src = _save(tmp_path, case)
    target, model = _import(tmp_path, src)
    assert _chunked(model) == CASES[case][1]
    assert [b.attn.rope for b in model.decoder.blocks] == [
        c or CASES[case][2] for c in CASES[case][1]]
    ids = _ids()
    assert _max_diff(model, hf, ids) <= TOL, case

    # left padding: row 0 padded by 5 equals Hugging Face on the same tokens unpadded (its
    # chunks count real tokens too; its temperature would count the padding: the docstring)
    mask = torch.ones_like(ids)
    mask[0, :5] = 0
    with torch.no_grad():
        got = model(ids, valid=mask.bool())[0, 5:]
        want = hf(input_ids=ids[:1, 5:]).logits[0]
    assert (got - want).abs().max().item() <= TOL, case
    if not any(b.attn.temperature for b in model.decoder.blocks):  # HF's padded batch too
        assert _max_diff(model, hf, ids, mask) <= TOL, case

    _greedy_matches(model, hf, ids[:, :6])  # 6 + 10 tokens: past the window / chunks

    out = export_model(target, tmp_path / "exported", log=lambda *_: None)
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["Llama4ForCausalLM"]
    back, info = transformers.AutoModelForCausalLM.from_pretrained(out, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    back.eval()
    assert back.config.layer_types == hf.config.layer_types
    assert back.config.no_rope_layers == hf.config.no_rope_layers
    assert _max_diff(model, back, ids) <= TOL, case
    for name, t in hf.state_dict().items():  # the rotary rows go back to their order
        assert torch.equal(back.state_dict()[name], t), name


def test_rotary_rows_left_interleaved_fail_the_same_check(tmp_path, monkeypatch):
    """Negative control: without the per-head row reorder, the rotary layers rotate the
    wrong pairs of dimensions."""
    hf, src = _save(tmp_path, "every-4th-global")
    monkeypatch.setattr(llama4_arch, "unpermute_rotary_rows", lambda w, heads: w)
    _, model = _import(tmp_path, src)
    assert _max_diff(model, hf, _ids()) > 100 * TOL


def test_a_temperature_without_the_plus_one_fails_the_same_check(tmp_path, monkeypatch):
    """Negative control for the formula: ``⌊p / floor⌋`` instead of ``⌊(p + 1) / floor⌋``
    moves each step one token later."""
    hf, src = _save(tmp_path, "every-4th-global")
    _, model = _import(tmp_path, src)
    real = attention_mod.query_temperature
    assert _max_diff(model, hf, _ids()) <= TOL
    monkeypatch.setattr(attention_mod, "query_temperature",
                        lambda pos, scale, floor: real(pos - 1, scale, floor))
    assert _max_diff(model, hf, _ids()) > 100 * TOL


def test_the_global_layer_moved_fails_the_same_check(tmp_path):
    """Negative control for the pattern: the NoPE global layer one layer early."""
    hf, src = _save(tmp_path, "every-4th-global")
    _, model = _import(tmp_path, src)
    a, b = model.decoder.blocks[2].attn, model.decoder.blocks[3].attn
    for key in ("window", "rope", "temperature"):  # layer 3's global settings on layer 2
        x, y = getattr(a, key), getattr(b, key)
        setattr(a, key, y)
        setattr(b, key, x)
    assert _max_diff(model, hf, _ids()) > 100 * TOL


def _cfg(**extra) -> dict:
    c = _config().to_dict()
    c.update(model_type="llama4_text", architectures=["Llama4ForCausalLM"], **extra)
    return c


@pytest.mark.parametrize(("extra", "words"), [
    ({"moe_layers": [1, 3]}, ("moe_layers=[1, 3]", "mixture-of-experts")),
    ({"moe_layers": None, "interleave_moe_layer_step": 2}, ("moe_layers=[1, 3]",)),
    ({"use_qk_norm": True}, ("use_qk_norm=True", "weightless", "model.mixer.qk_norm")),
    ({"no_rope_layers": [0, 1, 1, 1]}, ("no_rope_layers=[0, 1, 1, 1]", "global")),
    ({"no_rope_layers": [1, 1, 1, 0], "attention_chunk_size": None,
      "layer_types": ["full_attention"] * 4}, ("no_rope_layers=[1, 1, 1, 0]", "chunked stack")),
    ({"attention_chunk_size": None}, ("layer_types", "attention_chunk_size is null")),
    ({"layer_types": ["sliding_attention"] * 4}, ("layer_types", "'chunked_attention'")),
    ({"no_rope_layers": [1, 2, 1, 0]}, ("no_rope_layers", "each 1")),
])
def test_llama4_configs_blocklab_cannot_express_are_refused_by_name(tmp_path, extra, words):
    _refused(tmp_path, _cfg(**extra), *words)
    assert not (tmp_path / "imported").exists()


def test_the_multimodal_llama4_config_is_refused_by_name(tmp_path):
    msg = _refused(tmp_path, {"model_type": "llama4", "architectures": ["X"]})
    assert "model_type='llama4'" in msg and "llama4_text" in msg, msg
