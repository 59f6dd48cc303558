"""Gemma 2 in and out, against Hugging Face ``transformers`` itself: tiny random
Gemma2ForCausalLM models (sliding and global layers, sandwich norms with Gemma's ``1 + w``,
the ``sqrt(hidden_size)`` input scale, ``query_pre_attn_scalar``, tanh GeGLU; softcaps null)
are imported, compared logit by logit at a length past the window (also left-padded), decoded
greedily past the window with the cache (dynamic and static), and exported and reloaded by
``from_pretrained`` with the same logits. Negative controls: the embedding scale left out, the
two middle sandwich norms swapped (Llama's ``post_attention_layernorm`` is its pre-FFN norm,
Gemma's is not), the ``+ 1`` left off and the default score scale each fail the same check.
Configs blocklab cannot express are refused by name (the softcaps and Gemma 3 text:
test_hf_stability.py)."""

from __future__ import annotations

import json

import pytest
import torch

transformers = pytest.importorskip("transformers")

from blocklab.convert import export_model  # noqa: E402
from convert.test_hf_roundtrip import save_random  # noqa: E402
from convert.test_hf_windows import (  # noqa: E402
    _greedy_matches,
    _import,
    _max_diff,
    _refused,
)

TOL = 1e-5
VOCAB = 96
WINDOW = 4
T = 16  # 4 windows
FULL, SLIDE = "full_attention", "sliding_attention"


def _config(**extra):
    from transformers import Gemma2Config

    base = {"vocab_size": VOCAB, "hidden_size": 32, "intermediate_size": 48,
            "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2,
            "head_dim": 8, "max_position_embeddings": 64, "query_pre_attn_scalar": 12,
            "sliding_window": WINDOW, "final_logit_softcapping": None,
            "attn_logit_softcapping": None, "initializer_range": 0.2,
            "rope_parameters": {"rope_type": "default", "rope_theta": 5000.0}}
    return Gemma2Config(**{**base, **extra})


def _gemma2(**extra):
    from transformers import Gemma2ForCausalLM

    return Gemma2ForCausalLM(_config(**extra))


CASES = {  # name -> (HF model, the windows blocklab must give its layers)
    "alternate-tied": (lambda: _gemma2(), [WINDOW, None] * 2),
    "irregular-untied-bias": (lambda: _gemma2(layer_types=[FULL, SLIDE, SLIDE, FULL],
                                              tie_word_embeddings=False, attention_bias=True),
                              [None, WINDOW, WINDOW, None]),
    "head-dim-scale-exact-gelu": (lambda: _gemma2(query_pre_attn_scalar=8,
                                                  hidden_activation="gelu",
                                                  cache_implementation="hybrid"),
                                  [WINDOW, None] * 2),
}


def _save(tmp_path, case):
    torch.manual_seed(0)
    return save_random(tmp_path, CASES[case][0](), {"pad": "<pad>", "bos": "<s>", "eos": "</s>"})


def _ids(batch=2, length=T):
    return torch.randint(3, VOCAB - 4, (batch, length), generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("case", sorted(CASES))
def test_gemma2_import_matches_hf_logits_greedy_and_export_reloads(tmp_path, case):
    hf, src = _save(tmp_path, case)
    target, model = _import(tmp_path, src)
    assert [b.attn.window for b in model.decoder.blocks] == CASES[case][1]
    assert model.config.block.name == "sandwich"
    ids = _ids()
    assert _max_diff(model, hf, ids) <= TOL, case
    mask = torch.ones_like(ids)
    mask[0, :5] = 0  # row 0 left-padded
    assert _max_diff(model, hf, ids, mask) <= TOL, case

    _greedy_matches(model, hf, ids[:, :6])  # 6 + 10 tokens: past the window / chunks

    out = export_model(target, tmp_path / "exported", log=lambda *_: None)
    assert json.loads((out / "config.json").read_text())["architectures"] == ["Gemma2ForCausalLM"]
    back, info = transformers.AutoModelForCausalLM.from_pretrained(out, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    back.eval()
    assert back.config.layer_types == hf.config.layer_types
    assert back.config.query_pre_attn_scalar == hf.config.query_pre_attn_scalar
    assert _max_diff(model, back, ids) <= TOL, case
    for name, t in hf.state_dict().items():  # the folds undone, to rounding
        torch.testing.assert_close(back.state_dict()[name], t, rtol=1e-6, atol=1e-6)


def _broken(model, how: str) -> None:
    blocks = model.decoder.blocks
    with torch.no_grad():
        if how == "no-embed-scale":  # Gemma's sqrt(d) input scale forgotten (tied head)
            s = model.config.d_model ** 0.5
            model.embed.weight /= s
            model.decoder.final_norm.weight *= s
        elif how == "llama-norm-order":
            for b in blocks:
                n1, n2 = b.norms[1].weight.clone(), b.norms[2].weight.clone()
                b.norms[1].weight.copy_(n2)
                b.norms[2].weight.copy_(n1)
        elif how == "no-plus-one":
            for b in blocks:
                for n in b.norms:
                    n.weight -= 1.0
        elif how == "default-scale":
            for b in blocks:
                b.attn.scale = None


@pytest.mark.parametrize("how", ["no-embed-scale", "llama-norm-order", "no-plus-one",
                                 "default-scale"])
def test_each_gemma_mapping_broken_fails_the_same_check(tmp_path, how):
    hf, src = _save(tmp_path, "alternate-tied")
    _, model = _import(tmp_path, src)
    assert _max_diff(model, hf, _ids()) <= TOL
    _broken(model, how)
    assert _max_diff(model, hf, _ids()) > 100 * TOL, how


def _cfg(**extra) -> dict:
    c = _config().to_dict()
    c.update(model_type="gemma2", architectures=["Gemma2ForCausalLM"], **extra)
    return c


@pytest.mark.parametrize(("config", "words"), [
    (_cfg(use_bidirectional_attention=True), ("use_bidirectional_attention=True", "causal")),
    (_cfg(layer_types=[FULL, "chunked_attention", FULL, FULL]), ("layer_types", "each")),
    (_cfg(sliding_window=None), ("layer_types", "sliding_window is null")),
    (_cfg(hidden_activation="silu_fast"), ("hidden_activation='silu_fast'",)),
    ({"model_type": "gemma3", "architectures": ["X"]}, ("model_type='gemma3'", "gemma3_text")),
])
def test_gemma_configs_blocklab_cannot_express_are_refused_by_name(tmp_path, config, words):
    _refused(tmp_path, config, *words)
    assert not (tmp_path / "imported").exists()
