"""The stability knobs real models carry, in and out, against Hugging Face ``transformers``
itself: tiny random Gemma 2 models with softcaps (the released 50 / 30, and 2 / 3 so that the
caps bite on a tiny random model), Qwen3 (per-head QK-norm, with and without windows), OLMo-2
(QK-norm over the whole projections, the reordered norm) and Gemma 3 text (per-head QK-norm on
Gemma 2's layout) are imported, compared logit by logit (also on a left-padded batch), decoded
greedily with the cache (growing and fixed-shape), and exported and reloaded by
``from_pretrained`` with the same logits and the same knob values in config.json.

Negative controls: the caps dropped from the Hugging Face model (same weights) move its logits
far past the bound, so the parity shows blocklab applies them; the q / k norms replaced by the
identity in the Hugging Face model, and OLMo-2's two output norms swapped in the import, each
fail the same check. What blocklab cannot express is refused in one line naming the key."""

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
T = 16
FULL, SLIDE = "full_attention", "sliding_attention"
ROPE = {"rope_type": "default", "rope_theta": 5000.0}
SPECIALS = {"pad": "<pad>", "bos": "<s>", "eos": "</s>"}


def _common(**extra) -> dict:
    return {"vocab_size": VOCAB, "hidden_size": 32, "intermediate_size": 48,
            "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2,
            "max_position_embeddings": 64, "rms_norm_eps": 1e-5, "bos_token_id": 1,
            "eos_token_id": 2, "pad_token_id": 0, "initializer_range": 0.2, **extra}


def _gemma2(attn=None, final=None, **extra):
    from transformers import Gemma2Config, Gemma2ForCausalLM

    cfg = Gemma2Config(**_common(head_dim=8, query_pre_attn_scalar=12, sliding_window=WINDOW,
                                 attn_logit_softcapping=attn, final_logit_softcapping=final,
                                 rope_parameters=ROPE, **extra))
    cfg._attn_implementation = "eager"  # Hugging Face's SDPA path refuses a softcap
    return Gemma2ForCausalLM(cfg)


def _qwen3(**extra):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    return Qwen3ForCausalLM(Qwen3Config(**_common(head_dim=8, rope_parameters=ROPE, **extra)))


def _olmo2(**extra):
    from transformers import Olmo2Config, Olmo2ForCausalLM

    return Olmo2ForCausalLM(Olmo2Config(**_common(rope_parameters=ROPE, **extra)))


def _gemma3(**extra):
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    rope = {FULL: dict(ROPE), SLIDE: dict(ROPE)}
    cfg = Gemma3TextConfig(**_common(head_dim=8, query_pre_attn_scalar=12, sliding_window=WINDOW,
                                     rope_parameters=rope, **extra))
    cfg._attn_implementation = "eager"
    return Gemma3ForCausalLM(cfg)


CASES = {  # name -> (HF model, blocklab model keys the import must set)
    "gemma2-caps-released": (lambda: _gemma2(50.0, 30.0),
                             {"mixer.softcap": 50.0, "logit_softcap": 30.0}),
    "gemma2-caps-small": (lambda: _gemma2(2.0, 3.0, tie_word_embeddings=False),
                          {"mixer.softcap": 2.0, "logit_softcap": 3.0}),
    "qwen3": (lambda: _qwen3(), {"mixer.qk_norm": "rmsnorm", "mixer.qk_norm_scope": "head",
                                 "block.name": "pre"}),
    "qwen3-windows-bias-tied": (
        lambda: _qwen3(use_sliding_window=True, sliding_window=WINDOW, max_window_layers=2,
                       attention_bias=True, tie_word_embeddings=True),
        {"mixer.qk_norm": "rmsnorm", "mixer.window": WINDOW, "attention.bias": True}),
    "olmo2": (lambda: _olmo2(), {"mixer.qk_norm": "rmsnorm", "mixer.qk_norm_scope": "all",
                                 "block.name": "reordered"}),
    "olmo2-bias-tied": (lambda: _olmo2(attention_bias=True, tie_word_embeddings=True),
                        {"mixer.qk_norm_scope": "all", "attention.bias": True}),
    "gemma3": (lambda: _gemma3(layer_types=[SLIDE, SLIDE, SLIDE, FULL]),
               {"mixer.qk_norm": "rmsnorm", "mixer.qk_norm_scope": "head",
                "block.name": "sandwich", "mixer.softcap": None}),
    "gemma3-final-cap": (lambda: _gemma3(final_logit_softcapping=3.0),  # every layer sliding
                         {"logit_softcap": 3.0, "mixer.softcap": None}),
}


def _save(tmp_path, case):
    torch.manual_seed(0)
    return save_random(tmp_path, CASES[case][0](), SPECIALS)


def _ids(batch=2, length=T):
    return torch.randint(3, VOCAB - 4, (batch, length), generator=torch.Generator().manual_seed(1))


def _key(model, dotted: str):
    node = model.config
    for part in dotted.split("."):
        node = node.get(part) if isinstance(node, dict) else getattr(node, part)
    return getattr(node, "value", node)


def _option(model, dotted: str):
    """A model key, softmax options read through ``model.mixer`` (an options mapping)."""
    if dotted.startswith("mixer."):
        from blocklab.model.softmax_options import softmax_options

        return getattr(softmax_options(model.config), dotted.split(".", 1)[1])
    return _key(model, dotted)


@pytest.mark.parametrize("case", sorted(CASES))
def test_import_matches_hf_logits_greedy_and_export_reloads(tmp_path, case):
    hf, src = _save(tmp_path, case)
    target, model = _import(tmp_path, src)
    for key, want in CASES[case][1].items():
        assert _option(model, key) == want, (case, key)
    ids = _ids()
    assert _max_diff(model, hf, ids) <= TOL, case
    mask = torch.ones_like(ids)
    mask[0, :5] = 0  # row 0 left-padded
    assert _max_diff(model, hf, ids, mask) <= TOL, case
    _greedy_matches(model, hf, ids[:, :6])

    out = export_model(target, tmp_path / "exported", log=lambda *_: None)
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == [type(hf).__name__]
    for key in ("attn_logit_softcapping", "final_logit_softcapping", "layer_types",
                "attention_bias", "sliding_window"):
        if hasattr(hf.config, key):
            assert config[key] == getattr(hf.config, key), key
    back, info = transformers.AutoModelForCausalLM.from_pretrained(
        out, output_loading_info=True, attn_implementation="eager")
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    assert not info.get("mismatched_keys"), info
    back.eval()
    assert _max_diff(model, back, ids) <= TOL, case
    for name, t in hf.state_dict().items():  # every weight back where it came from
        torch.testing.assert_close(back.state_dict()[name], t, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("case", ["gemma2-caps-small", "gemma3-final-cap"])
def test_small_caps_bite_so_parity_shows_blocklab_applies_them(tmp_path, case):
    """Negative control: the same Hugging Face weights without the caps give logits far from
    the capped ones (which blocklab's import matches) — each cap on its own."""
    hf, src = _save(tmp_path, case)
    _, model = _import(tmp_path, src)
    ids = _ids()
    assert _max_diff(model, hf, ids) <= TOL
    for key in ("attn_logit_softcapping", "final_logit_softcapping"):
        cap = getattr(hf.config, key)
        if cap is None:
            continue
        setattr(hf.config, key, None)
        for layer in hf.model.layers:  # the attention layers keep their own copy
            layer.self_attn.attn_logit_softcapping = hf.config.attn_logit_softcapping
        assert _max_diff(model, hf, ids) > 100 * TOL, (case, key)
        setattr(hf.config, key, cap)
        for layer in hf.model.layers:
            layer.self_attn.attn_logit_softcapping = hf.config.attn_logit_softcapping
    assert _max_diff(model, hf, ids) <= TOL


@pytest.mark.parametrize("case", ["qwen3", "olmo2", "gemma3"])
def test_qk_norm_left_out_fails_the_same_check(tmp_path, case):
    """Negative control: the Hugging Face model with its q / k norms replaced by the identity
    parts from the import by far (so the parity above is the norms', at their scope)."""
    hf, src = _save(tmp_path, case)
    _, model = _import(tmp_path, src)
    ids = _ids()
    assert _max_diff(model, hf, ids) <= TOL
    for layer in hf.model.layers:
        layer.self_attn.q_norm = torch.nn.Identity()
        layer.self_attn.k_norm = torch.nn.Identity()
    assert _max_diff(model, hf, ids) > 100 * TOL, case


def test_olmo2_output_norms_swapped_fail_the_same_check(tmp_path):
    """Negative control: OLMo-2's norms on the attention and MLP outputs exchanged."""
    hf, src = _save(tmp_path, "olmo2")
    _, model = _import(tmp_path, src)
    assert _max_diff(model, hf, _ids()) <= TOL
    with torch.no_grad():
        for b in model.decoder.blocks:
            n0, n1 = b.norms[0].weight.clone(), b.norms[1].weight.clone()
            b.norms[0].weight.copy_(n1)
            b.norms[1].weight.copy_(n0)
    assert _max_diff(model, hf, _ids()) > 100 * TOL


def _cfg(model, **extra) -> dict:
    c = json.loads(model.config.to_json_string(use_diff=True))  # as save_pretrained writes it
    c.update(architectures=[type(model).__name__], **extra)
    return c


@pytest.mark.parametrize(("make", "words"), [
    (lambda: _cfg(_gemma3(), rope_parameters={FULL: dict(ROPE), SLIDE: {
        "rope_type": "default", "rope_theta": 10000.0}}),
     ("rope_parameters.sliding_attention", "10000.0", "one rotary setting")),
    (lambda: {**{k: v for k, v in _cfg(_gemma3()).items() if k != "rope_parameters"},
              "rope_theta": 1_000_000.0, "rope_local_base_freq": 10_000.0},  # released form
     ("rope_parameters.sliding_attention", "rope_local_base_freq")),
    (lambda: _cfg(_gemma3(), attn_logit_softcapping=50.0),  # stored, never applied by HF
     ("attn_logit_softcapping=50.0", "never caps")),
    (lambda: _cfg(_gemma3(), use_bidirectional_attention=True),
     ("use_bidirectional_attention=True",)),
    (lambda: _cfg(_qwen3(), rope_parameters={**ROPE, "partial_rotary_factor": 0.5}),
     ("partial_rotary_factor",)),
    (lambda: {"model_type": "qwen3_moe", "architectures": ["X"]},
     ("model_type='qwen3_moe'", "mixture-of-experts")),
    (lambda: {"model_type": "gemma3", "architectures": ["X"]},
     ("model_type='gemma3'", "gemma3_text")),
])
def test_what_blocklab_cannot_express_is_refused_by_name(tmp_path, make, words):
    _refused(tmp_path, make(), *words)


def test_llama4_qk_norm_is_refused_by_name(tmp_path):
    from transformers import Llama4TextConfig

    c = Llama4TextConfig(**_common(head_dim=8, moe_layers=[], use_qk_norm=True,
                                   rope_parameters=ROPE))
    c = {**json.loads(c.to_json_string(use_diff=True)), "architectures": ["Llama4ForCausalLM"]}
    _refused(tmp_path, c, "use_qk_norm=True", "weightless", "model.mixer.qk_norm")


def test_gemma2_caps_absent_from_the_config_are_hf_defaults():
    """A Gemma 2 config.json without the softcap keys means Gemma2Config's 50 and 30."""
    from blocklab.convert.fields import Fields
    from blocklab.convert.table import ARCHITECTURES

    c = _cfg(_gemma2())
    for key in ("attn_logit_softcapping", "final_logit_softcapping"):
        c.pop(key, None)
    plain = ARCHITECTURES["gemma2"].config_in(Fields(c, "<test>"), {})
    assert (plain["mixer"]["softcap"], plain["logit_softcap"]) == (50.0, 30.0)


@pytest.mark.parametrize(("change", "words"), [
    ({"mixer": {"softcap": 5.0}}, ("model.mixer.softcap=5.0",)),
    ({"logit_softcap": 5.0}, ("model.logit_softcap=5.0",)),
    ({"mixer": {"qk_norm": "layernorm"}}, ("model.mixer.qk_norm='layernorm'",)),
    ({"mixer": {"qk_norm": "rmsnorm", "qk_norm_scope": "all"}, "block": {"name": "pre"}},
     ("model.mixer.qk_norm",)),
])
def test_export_refuses_knobs_no_hf_architecture_carries(change, words):
    """A Llama-layout model with a knob no Hugging Face architecture here has (an attention
    cap without Gemma's layout, LayerNorm QK-norm, OLMo-2's scope without its norm order) is
    refused by name, not written as a model that computes something else."""
    from blocklab.config import model_config
    from blocklab.convert.export import pick_arch
    from blocklab.errors import ConfigError

    base = {"family": {"name": "decoder"}, "norm": {"name": "rmsnorm", "eps": 1e-5},
            "block": {"name": "pre"}, "position": {"name": "rope"},
            "ffn": {"name": "swiglu", "bias": False}, "attention": {"name": "mha", "bias": False},
            "mixer": {"name": "softmax"}, "vocab_size": VOCAB, "d_model": 32, "n_layers": 2,
            "n_heads": 4, "d_ff": 48, "max_seq_len": 64, "dropout": 0.0}
    assert pick_arch(model_config(base)).name == "llama"
    plain = {**base, **change, "mixer": {**base["mixer"], **change.get("mixer", {})}}
    with pytest.raises(ConfigError) as e:
        pick_arch(model_config(plain))
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("export refused"), msg
    for w in words:
        assert w in msg, msg
