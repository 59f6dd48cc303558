"""Sliding-window models in and out, against Hugging Face ``transformers`` itself: tiny random
MistralForCausalLM (one window on every layer) and Qwen2ForCausalLM (a window on the layers
``layer_types`` names; absent, ``use_sliding_window`` windows layers ``i >= max_window_layers``
— transformers#35896 had it backwards) are imported, compared logit by logit at a length past
the window (also left-padded), decoded greedily past the window with the cache (the ring), and
exported and reloaded by ``from_pretrained`` with the same logits. A model whose windows sit on
the wrong layers fails the same check; configs blocklab cannot express are refused by name."""

from __future__ import annotations

import json

import pytest
import torch

transformers = pytest.importorskip("transformers")

from blocklab import checkpoint as ckpt  # noqa: E402
from blocklab.convert import export_model, import_model  # noqa: E402
from blocklab.convert.windows import pattern_in  # noqa: E402
from blocklab.errors import ConfigError  # noqa: E402
from blocklab.model import masks  # noqa: E402
from blocklab.model.generate import generate  # noqa: E402
from blocklab.model.softmax_options import SoftmaxOptions  # noqa: E402
from convert.test_hf_roundtrip import save_random  # noqa: E402

TOL = 1e-5
VOCAB = 96
WINDOW = 4
T = 16  # > 3 windows: far keys must be masked
FULL, SLIDE = "full_attention", "sliding_attention"


def _common(layers: int) -> dict:
    return {"vocab_size": VOCAB, "hidden_size": 32, "intermediate_size": 48,
            "num_hidden_layers": layers, "num_attention_heads": 4, "num_key_value_heads": 2,
            "max_position_embeddings": 64, "rms_norm_eps": 1e-5, "bos_token_id": 1,
            "eos_token_id": 2, "pad_token_id": 0,
            "rope_parameters": {"rope_type": "default", "rope_theta": 5000.0}}


def _mistral(window=WINDOW, layers=2, **extra):
    from transformers import MistralConfig, MistralForCausalLM

    return MistralForCausalLM(MistralConfig(**_common(layers), sliding_window=window, **extra))


def _qwen2(layers=4, use=True, first=2, types=None, window=WINDOW, tie=False):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    cfg = Qwen2Config(**_common(layers), use_sliding_window=use, sliding_window=window,
                      max_window_layers=first, layer_types=types, tie_word_embeddings=tie)
    return Qwen2ForCausalLM(cfg)


CASES = {  # name -> (HF model, the windows blocklab must give its layers)
    "mistral-window": (lambda: _mistral(), [WINDOW] * 2),
    "mistral-no-window": (lambda: _mistral(window=None), [None] * 2),
    "qwen2-mwl-middle": (lambda: _qwen2(first=2), [None, None, WINDOW, WINDOW]),
    "qwen2-mwl-1-of-3": (lambda: _qwen2(layers=3, first=1), [None, WINDOW, WINDOW]),
    "qwen2-mwl-0-all": (lambda: _qwen2(first=0, tie=True), [WINDOW] * 4),
    "qwen2-mwl-past-depth": (lambda: _qwen2(first=28), [None] * 4),
    "qwen2-off": (lambda: _qwen2(use=False, first=0), [None] * 4),
    "qwen2-types-alternate": (lambda: _qwen2(types=[SLIDE, FULL, SLIDE, FULL]),
                              [WINDOW, None, WINDOW, None]),
    "qwen2-types-irregular": (lambda: _qwen2(types=[FULL, SLIDE, SLIDE, FULL]),
                              [None, WINDOW, WINDOW, None]),
}


def _save(tmp_path, case):
    torch.manual_seed(0)
    return save_random(tmp_path, CASES[case][0](), {"pad": "<pad>", "bos": "<s>", "eos": "</s>"})


def _ids(batch=2, length=T):
    return torch.randint(3, VOCAB - 4, (batch, length), generator=torch.Generator().manual_seed(1))


def _import(tmp_path, src):
    target = import_model(str(src), tmp_path / "imported", log=lambda *_: None)
    return target, ckpt.load_model(target)[0]


def _max_diff(model, hf, ids, mask=None):
    with torch.no_grad():
        want = hf(input_ids=ids, attention_mask=mask).logits
        got = model(ids, valid=None if mask is None else mask.bool())
    if mask is not None:  # HF's logits at padded positions mean nothing
        keep = mask.bool()
        want, got = want[keep], got[keep]
    return (got - want).abs().max().item()


def _greedy_matches(model, hf, prompt, new: int = 10) -> None:
    """Greedy decoding through blocklab's growing and fixed-shape caches gives HF's tokens
    (``new`` tokens after ``prompt``: the tests' prompts and windows make it wrap the ring,
    cross chunk boundaries and temperature steps)."""
    hf.generation_config.eos_token_id = None
    with torch.no_grad():
        mine = generate(model, prompt, max_new_tokens=new)
        theirs = hf.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=new,
                             do_sample=False, pad_token_id=0)[:, prompt.shape[1]:]
        fixed = generate(model, prompt, max_new_tokens=new, static_cache=True)
    assert torch.equal(mine, theirs), (mine, theirs)
    assert torch.equal(fixed, theirs), (fixed, theirs)  # the fixed-shape cache too


@pytest.mark.parametrize("case", sorted(CASES))
def test_window_import_matches_hf_logits_greedy_and_export_reloads(tmp_path, case):
    hf, src = _save(tmp_path, case)
    target, model = _import(tmp_path, src)
    got_windows = [b.attn.window for b in model.decoder.blocks]
    assert got_windows == CASES[case][1], got_windows
    assert got_windows == [None if t == FULL else WINDOW for t in hf.config.layer_types] \
        if hasattr(hf.config, "layer_types") else True
    ids = _ids()
    assert _max_diff(model, hf, ids) <= TOL, case

    mask = torch.ones_like(ids)
    mask[0, :5] = 0  # row 0 left-padded: the window counts real tokens, as HF's does here
    assert _max_diff(model, hf, ids, mask) <= TOL, case

    _greedy_matches(model, hf, ids[:, :6])  # 6 + 10 tokens: past the window / chunks

    out = export_model(target, tmp_path / "exported", log=lambda *_: None)
    arch = json.loads((out / "config.json").read_text())["architectures"][0]
    # of the architectures expressing it exactly, the first: a window-free one is a Llama
    # (Qwen2's missing o_proj bias is Llama's attention_bias with a zero output bias)
    windowless = all(w is None for w in got_windows)
    assert arch == ("LlamaForCausalLM" if windowless else type(hf).__name__), arch
    back, info = transformers.AutoModelForCausalLM.from_pretrained(out, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    back.eval()
    assert _max_diff(model, back, ids) <= TOL, case
    if not windowless and hasattr(hf.config, "layer_types"):
        assert back.config.layer_types == hf.config.layer_types


def test_windows_on_the_wrong_layers_fail_the_same_check(tmp_path, monkeypatch):
    """Negative control, the mistake of transformers#35896: window the first
    ``max_window_layers`` layers instead of the rest, and the logits part by far."""
    hf, src = _save(tmp_path, "qwen2-mwl-middle")
    real = masks.layer_window

    def flipped(attention, layer):
        w = real(attention, 3 - layer)  # the pattern reversed over the 4 layers
        return w

    monkeypatch.setattr(masks, "layer_window", flipped)
    _, model = _import(tmp_path, src)
    assert [b.attn.window for b in model.decoder.blocks] == [WINDOW, WINDOW, None, None]
    assert _max_diff(model, hf, _ids()) > 100 * TOL


def test_a_window_off_by_one_fails_the_same_check(tmp_path):
    """Negative control for the convention (W keys, the query included, on both sides)."""
    hf, src = _save(tmp_path, "mistral-window")
    _, model = _import(tmp_path, src)
    for b in model.decoder.blocks:
        b.attn.window = WINDOW + 1
    assert _max_diff(model, hf, _ids()) > 100 * TOL


@pytest.mark.parametrize(("types", "n"), [
    ([SLIDE] * 4, 0), ([FULL] * 4, None), ([SLIDE, FULL] * 2, 2), ([SLIDE, SLIDE, FULL] * 2, 3),
    ([FULL, FULL, SLIDE, SLIDE], None), ([FULL, SLIDE, SLIDE, FULL, SLIDE], None)])
def test_layer_types_become_the_shortest_pattern_with_the_same_windows(types, n):
    keys = pattern_in(types, WINDOW)
    if all(t == FULL for t in types):
        assert keys == {"window": None}
        return
    a = SoftmaxOptions(**keys)
    assert [masks.layer_window(a, i) for i in range(len(types))] == [
        None if t == FULL else WINDOW for t in types]
    assert a.global_every == (n or 0)
    assert bool(a.layers) == (n is None)


def _refused(tmp_path, config: dict, *words: str) -> str:
    src = tmp_path / "hf"
    src.mkdir()
    (src / "config.json").write_text(json.dumps(config))
    from safetensors.torch import save_file

    save_file({"x": torch.zeros(1)}, str(src / "model.safetensors"))
    with pytest.raises(ConfigError) as e:
        import_model(str(src), tmp_path / "imported", log=lambda *_: None)
    msg = str(e.value)
    assert "\n" not in msg
    for w in words:
        assert w in msg, msg
    assert not (tmp_path / "imported").exists()  # nothing written by a refused import
    return msg


def _cfg(model_type: str, **extra) -> dict:
    c = _common(4)
    return {"model_type": model_type, "architectures": ["X"], **c,
            "hidden_act": "silu", **extra}


@pytest.mark.parametrize(("model_type", "extra", "words"), [
    ("mistral", {"layer_types": [FULL, SLIDE, SLIDE, SLIDE]}, ("layer_types", "Ministral")),
    ("qwen2", {"use_sliding_window": False, "layer_types": [FULL, SLIDE, FULL, FULL]},
     ("layer_types", "no window", "use_sliding_window=False")),
    ("qwen2", {"layer_types": [FULL, FULL]}, ("layer_types", "4 entries")),
    ("qwen2", {"layer_types": [FULL, "chunked_attention", FULL, FULL]},
     ("layer_types", "'chunked_attention'")),
    ("mistral", {"sliding_window": 0}, ("window", "0")),
])
def test_windows_blocklab_cannot_express_are_refused_by_name(tmp_path, model_type, extra, words):
    msg = _refused(tmp_path, _cfg(model_type, **extra), *words)
    assert not (tmp_path / "imported").exists(), msg  # nothing written


def test_exports_blocklab_cannot_write_are_refused_by_name(tmp_path):
    """A bias-free mixed pattern has no Hugging Face class (Mistral windows every layer,
    Qwen2 has q/k/v biases); a Qwen2 import whose output bias training moved off zero has
    no Qwen2 place for it."""
    import dataclasses

    from blocklab.config import MixerConfig
    from blocklab.convert.export import pick_arch
    from blocklab.convert.table import ARCHITECTURES

    _, src = _save(tmp_path, "mistral-window")
    m = _import(tmp_path, src)[1].config
    mixed = dataclasses.replace(m, mixer=MixerConfig(**{**m.mixer, "layers": ["global", "local"]}))
    with pytest.raises(ConfigError, match=r"model\.mixer\.layers=\['global', 'local'\]"):
        pick_arch(mixed)

    _, src = _save(tmp_path / "q", "qwen2-mwl-middle")
    model = _import(tmp_path / "q", src)[1]
    assert pick_arch(model.config).name == "qwen2"
    state = model.state_dict()
    state["decoder.blocks.1.attn.out.bias"] = torch.full_like(
        state["decoder.blocks.1.attn.out.bias"], 0.5)
    with pytest.raises(ConfigError, match=r"decoder\.blocks\.1\.attn\.out\.bias is not zero"):
        ARCHITECTURES["qwen2"].weights_out(state, model.config)
