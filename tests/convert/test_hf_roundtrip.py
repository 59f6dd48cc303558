"""Pretrained models in and out, against Hugging Face ``transformers`` itself: tiny random HF
models of every supported architecture are saved, imported into blocklab's own modules and
compared logit by logit; the import is exported and loaded back by ``from_pretrained`` with no
missing or unexpected key and the same logits; cached greedy decoding equals HF's. A
deliberately wrong conversion fails the same checks."""

from __future__ import annotations

import json

import pytest
import torch

transformers = pytest.importorskip("transformers")

from blocklab import checkpoint as ckpt  # noqa: E402
from blocklab.convert import export_model, import_model  # noqa: E402
from blocklab.model.generate import generate  # noqa: E402

TOL = 1e-5
VOCAB = 96


def _tokenizer(directory, specials: dict[str, str]) -> None:
    """A word-level tokenizer over the model's vocabulary, with the architecture's specials
    first, saved as HF does (tokenizer.json + special_tokens_map.json)."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    names = list(dict.fromkeys(specials.values()))
    vocab = {n: i for i, n in enumerate(names)}
    for i in range(len(vocab), VOCAB - 4):
        vocab[f"w{i}"] = i
    tok = Tokenizer(models.WordLevel(vocab, unk_token=names[0]))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.add_special_tokens(names)
    tok.save(str(directory / "tokenizer.json"))
    (directory / "special_tokens_map.json").write_text(
        json.dumps({f"{role}_token": name for role, name in specials.items()}))


def _llama(heads=4, kv=4, tie=False, bias=False, rope=None):
    from transformers import LlamaConfig, LlamaForCausalLM

    params = {"rope_type": "default", "rope_theta": 5000.0, **(rope or {})}
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=48 if heads == 6 else 32,
                      intermediate_size=48, num_hidden_layers=2, num_attention_heads=heads,
                      num_key_value_heads=kv, head_dim=4 if heads == 6 else None, max_position_embeddings=64,
                      rms_norm_eps=1e-5, tie_word_embeddings=tie, attention_bias=bias,
                      mlp_bias=bias, rope_parameters=params, bos_token_id=1, eos_token_id=2,
                      pad_token_id=0)
    return LlamaForCausalLM(cfg), {"pad": "<pad>", "bos": "<s>", "eos": "</s>"}


def _gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, n_positions=64,
                     bos_token_id=1, eos_token_id=1)
    return GPT2LMHeadModel(cfg), {"bos": "<|endoftext|>", "eos": "<|endoftext|>"}


def _bert():
    from transformers import BertConfig, BertForMaskedLM

    cfg = BertConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2,
                     num_attention_heads=4, intermediate_size=48, max_position_embeddings=64)
    return BertForMaskedLM(cfg), {"pad": "[PAD]", "bos": "[CLS]", "eos": "[SEP]",
                                  "mask": "[MASK]"}


def _t5(version: str):
    from transformers import T5Config, T5ForConditionalGeneration

    cfg = T5Config(vocab_size=VOCAB, d_model=32, d_kv=8, d_ff=48, num_layers=3,
                   num_decoder_layers=2, num_heads=4, relative_attention_num_buckets=8,
                   relative_attention_max_distance=20,
                   feed_forward_proj="relu" if version == "1.0" else "gated-gelu",
                   tie_word_embeddings=version == "1.0", decoder_start_token_id=0)
    return T5ForConditionalGeneration(cfg), {"pad": "<pad>", "eos": "</s>"}


CASES = {
    **{f"llama-{name}-{'tied' if tie else 'untied'}-{'bias' if bias else 'nobias'}":
       (lambda h=h, kv=kv, tie=tie, bias=bias: _llama(h, kv, tie, bias))
       for name, h, kv in (("mha", 4, 4), ("gqa", 4, 2), ("mqa", 4, 1))
       for tie in (True, False) for bias in (False, True)},
    "llama-gqa-6heads-headdim4": lambda: _llama(6, 3),
    "llama-rope-linear": lambda: _llama(rope={"rope_type": "linear", "factor": 2.0}),
    "llama-rope-yarn": lambda: _llama(rope={"rope_type": "yarn", "factor": 4.0,
                                            "original_max_position_embeddings": 16}),
    "llama-rope-llama3": lambda: _llama(rope={"rope_type": "llama3", "factor": 8.0,
                                              "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                              "original_max_position_embeddings": 16}),
    "gpt2": _gpt2,
    "bert": _bert,
    "t5-v1.0": lambda: _t5("1.0"),
    "t5-v1.1": lambda: _t5("1.1"),
}


def save_random(tmp_path, hf, specials):
    """``hf`` with non-trivial norms and biases (so a misplaced one shows), saved with a
    tokenizer under ``tmp_path / "hf"``."""
    with torch.no_grad():
        for p in hf.parameters():
            if p.dim() == 1:
                p.add_(torch.randn_like(p) * 0.1)
    hf.eval()
    src = tmp_path / "hf"
    hf.save_pretrained(src)
    _tokenizer(src, specials)
    return hf, src


def _save(tmp_path, case):
    torch.manual_seed(0)
    return save_random(tmp_path, *CASES[case]())


def _inputs(hf):
    g = torch.Generator().manual_seed(1)
    return torch.randint(3, VOCAB - 4, (2, 12), generator=g)


def _hf_logits(hf, ids):
    with torch.no_grad():
        if hf.config.is_encoder_decoder:
            return hf(input_ids=ids, decoder_input_ids=ids[:, :7]).logits
        return hf(input_ids=ids).logits


def _bl_logits(model, ids):
    with torch.no_grad():
        if model.config.family.name == "encoder_decoder":
            return model(ids, ids[:, :7])
        return model(ids)


@pytest.mark.parametrize("case", sorted(CASES))
def test_import_matches_hf_logits_export_reloads_and_greedy_agrees(tmp_path, case):
    hf, src = _save(tmp_path, case)
    target = import_model(str(src), tmp_path / "imported", log=lambda *_: None)
    model, _, meta = ckpt.load_model(target)
    ids = _inputs(hf)
    want = _hf_logits(hf, ids)
    got = _bl_logits(model, ids)
    assert got.shape == want.shape
    assert (got - want).abs().max().item() <= TOL, case
    assert meta["imported"]["files"]["model.safetensors"]  # sha256 recorded
    assert meta["imported"]["converter_version"] >= 1

    # export, reload in HF: no missing / unexpected keys, same logits
    out = export_model(target, tmp_path / "exported", log=lambda *_: None)
    auto = getattr(transformers, {"encoder": "AutoModelForMaskedLM",
                                  "decoder": "AutoModelForCausalLM"}.get(
        model.config.family.name, "T5ForConditionalGeneration"))
    back, info = auto.from_pretrained(out, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    assert not info.get("mismatched_keys"), info
    back.eval()
    assert (_hf_logits(back, ids) - got).abs().max().item() <= TOL

    # cached greedy decoding equals HF's greedy
    if model.config.family.name == "encoder":
        return
    hf.generation_config.eos_token_id = None  # both decode all 8 tokens, eos or not
    with torch.no_grad():
        if model.config.family.name == "encoder_decoder":
            start = torch.zeros(2, 1, dtype=torch.long)
            mine = generate(model, start, source_ids=ids, max_new_tokens=8)
            theirs = hf.generate(input_ids=ids, decoder_input_ids=start, max_new_tokens=8,
                                 do_sample=False)[:, 1:]
        else:
            prompt = ids[:, :6]
            mine = generate(model, prompt, max_new_tokens=8)
            theirs = hf.generate(prompt, attention_mask=torch.ones_like(prompt),
                                 max_new_tokens=8, do_sample=False,
                                 pad_token_id=0)[:, 6:]
    assert torch.equal(mine, theirs), (mine, theirs)


@pytest.mark.parametrize("case", ["t5-v1.0", "llama-gqa-untied-nobias", "bert"])
def test_a_wrong_conversion_fails_the_same_check(tmp_path, case):
    """Negative controls: without T5's output scale; with k rows of one K/V head swapped
    (a q/k layout mistake); without BERT's embedding norm — each misses the bound by far."""
    hf, src = _save(tmp_path, case)
    model, _, _ = ckpt.load_model(import_model(str(src), tmp_path / "imp", log=lambda *_: None))
    ids = _inputs(hf)
    with torch.no_grad():
        if case.startswith("t5"):
            model.head.scale = 1.0
        elif case.startswith("llama"):
            w = model.decoder.blocks[0].attn.qkv.weight
            d = model.config.head_dim
            q = model.config.n_heads * d
            k = w[q:q + d].clone()
            w[q:q + d // 2], w[q + d // 2:q + d] = k[d // 2:], k[: d // 2]  # rotary halves swapped
        else:
            model.encoder.embed_norm = torch.nn.Identity()
    diff = (_bl_logits(model, ids) - _hf_logits(hf, ids)).abs().max().item()
    assert diff > 100 * TOL, diff
