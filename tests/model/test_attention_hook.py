"""Attention computed explicitly (model/scores.py) and the monitor's hook.

The explicit path equals PyTorch's SDPA (fp32, ~1e-6) for every argument SDPA takes — a bool
mask, a float additive mask (ALiBi / T5 biases with -inf), is_causal, rows that see no key,
GQA, the score scale, a learned sink column — and over the variant grid's attention paths:
dense, blocked local layers with global rows (sinks, global and marked tokens, random
blocks), XL memory in a carry cache, cross-attention. A layer whose ``stats`` is a list runs
it and appends its readings (largest raw score, per-head entropy), checked against a brute
force. Controls: a broken GQA head mapping and an ignored mask are caught by the same
comparison.
"""

from __future__ import annotations

import copy
import math

import pytest
import torch
import torch.nn.functional as F
from variants import VOCAB, grid, pattern_variants, tiny

from blocklab.config import PositionConfig
from blocklab.model import attention, build_model, masks
from blocklab.model.carry import run_segments
from blocklab.model.scores import explicit_attention

ED = "encoder_decoder"
B, H, HKV, TQ, TK, D = 2, 4, 2, 5, 7, 8


def _qkv(tq=TQ, tk=TK, hkv=HKV):
    g = torch.Generator().manual_seed(0)
    return (torch.randn(B, H, tq, D, generator=g), torch.randn(B, hkv, tk, D, generator=g),
            torch.randn(B, hkv, tk, D, generator=g))


def _masks():
    """(name, mask, causal): every kind of SDPA mask, with rows that see no key."""
    g = torch.Generator().manual_seed(1)
    allowed = torch.rand(B, 1, TQ, TK, generator=g) > 0.4
    allowed[0, 0, 2] = False  # a row that sees nothing
    bias = torch.randn(B, H, TQ, TK, generator=g)
    return [("none", None, False), ("causal", None, True), ("bool", allowed, False),
            ("float", bias, False), ("float-inf", bias.masked_fill(~allowed, -math.inf), False),
            ("bool-broadcast", allowed[:1, :, :, :], False)]


@pytest.mark.parametrize("name,mask,causal", _masks(), ids=[m[0] for m in _masks()])
@pytest.mark.parametrize("scale", [None, 0.3])
def test_explicit_equals_sdpa(name, mask, causal, scale):
    q, k, v = _qkv(tq=TK if causal else TQ)
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal,
                                          scale=scale, enable_gqa=True)
    got = explicit_attention(q, k, v, mask=mask, causal=causal, scale=scale, enable_gqa=True)
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)
    # controls: the other GQA head mapping, and the mask ignored, are caught
    k2, v2 = k.repeat(1, H // HKV, 1, 1), v.repeat(1, H // HKV, 1, 1)
    wrong = explicit_attention(q, k2, v2, mask=mask, causal=causal, scale=scale)
    assert not torch.allclose(wrong, want, atol=1e-3)
    if mask is not None or causal:
        assert not torch.allclose(explicit_attention(q, k, v, scale=scale, enable_gqa=True),
                                  want, atol=1e-3)


@pytest.mark.parametrize("name,mask,causal", _masks()[:4], ids=[m[0] for m in _masks()[:4]])
def test_explicit_sink_equals_the_padded_key_of_sdpa(name, mask, causal):
    """A learned sink is masks.with_sink's extra key of value zero (what _sdpa gives SDPA)."""
    q, k, v = _qkv(tq=TK if causal else TQ)
    sink = torch.tensor([0.5, -1.0, 2.0, 0.0])
    vis = masks.with_sink(masks.Visibility(allowed=mask, causal=causal), sink, q.shape[2], TK)
    want = F.scaled_dot_product_attention(q, F.pad(k, (0, 0, 0, 1)), F.pad(v, (0, 0, 0, 1)),
                                          enable_gqa=True, **vis.sdpa_kwargs())
    got = explicit_attention(q, k, v, mask=mask, causal=causal, enable_gqa=True, sink=sink)
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)


def test_stats_against_a_brute_force():
    q, k, v = _qkv()
    mask = _masks()[4][1]  # float bias with -inf, a row that sees nothing
    stats: list = []
    explicit_attention(q, k, v, mask=mask, enable_gqa=True, scale=0.3, stats=stats)
    (got,) = stats
    kk = k.repeat_interleave(H // HKV, 1)
    top, ent = -math.inf, torch.zeros(H, dtype=torch.float64)
    for h in range(H):
        rows = 0
        for b in range(B):
            for i in range(TQ):
                ok = [j for j in range(TK) if mask[b, h, i, j] > -math.inf]
                if not ok:
                    continue
                raw = [float(q[b, h, i] @ kk[b, h, j]) * 0.3 for j in ok]
                top = max(top, *raw)
                p = torch.tensor([r + float(mask[b, h, i, j]) for r, j in zip(raw, ok)],
                                 dtype=torch.float64).softmax(0)
                ent[h] += -(p * p.log()).sum()
                rows += 1
        ent[h] /= rows
    assert got["logit_max"].shape == () and got["logit_max"].dtype == torch.float32
    assert got["entropy"].shape == (H,) and got["entropy"].dtype == torch.float32
    assert math.isclose(float(got["logit_max"]), top, rel_tol=1e-5)
    torch.testing.assert_close(got["entropy"].double(), ent, atol=1e-5, rtol=1e-5)


# ------------------------------------------------------------------ the grid's attention paths

def _hook(model, on: bool) -> list[list]:
    lists = []
    for mod in model.modules():
        if hasattr(mod, "stats") and isinstance(mod, torch.nn.Module):
            mod.stats = [] if on else None
            lists.append(mod.stats)
    return lists


def _batch(cfg, length=26):
    gen = torch.Generator().manual_seed(7)
    ids = torch.randint(0, VOCAB, (3, length), generator=gen)
    ids[:, ::5] = 3  # global_token_id 3 marks a few tokens
    valid = torch.ones(3, length, dtype=torch.bool)
    valid[0, :5] = False
    valid[2, length - 6:] = False
    if cfg.family.name == ED:
        return (ids, ids.flip(-1)), {"source_valid": valid}
    return (ids,), {"valid": valid}


def _softmax_only(cfg) -> bool:
    return cfg.mixer.name == "softmax" and not cfg.mixer.pattern


DENSE = [(i, c) for i, c in grid() if _softmax_only(c) and c.mixer.get("window") is None
         and (i, c) not in pattern_variants()][::3]
LOCAL = [(i, c) for i, c in grid() if _softmax_only(c) and (i, c) not in DENSE
         and (c.mixer.get("window") is not None or c.mixer.get("attention_chunk") is not None)]


@pytest.mark.parametrize("cfg", [c for _, c in DENSE + LOCAL], ids=[i for i, _ in DENSE + LOCAL])
def test_the_hook_computes_explicitly_with_the_same_outputs(cfg, monkeypatch):
    monkeypatch.setattr(attention, "MIN_BLOCK", 4)  # local layers in blocks (and global rows)
    torch.manual_seed(0)
    model = build_model(cfg).eval()
    args, kw = _batch(cfg)
    real = kw.get("valid", torch.ones(3, 26, dtype=torch.bool))
    with torch.no_grad():
        want = model(*args, **kw)[real]
        lists = _hook(model, True)
        got = model(*args, **kw)[real]
    torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-5)
    assert lists and all(lists), "every attention module appended its readings"
    for r in (r for lst in lists for r in lst):
        assert r["logit_max"].shape == () and torch.isfinite(r["logit_max"])
        assert r["entropy"].shape == (cfg.n_heads,) and (r["entropy"] >= -1e-6).all()
        assert (r["entropy"] <= math.log(2 * 26 + 1) + 1e-5).all()
    _hook(model, False)


@pytest.mark.parametrize("position", ["rope", "alibi"])
def test_the_hook_on_xl_memory_layers(position):
    cfg = copy.deepcopy(tiny(position=PositionConfig(name=position)))
    cfg.mixer["mem_len"] = 6
    torch.manual_seed(0)
    model = build_model(cfg).eval()
    ids = torch.randint(0, VOCAB, (2, 24), generator=torch.Generator().manual_seed(3))

    def carried():
        return run_segments(model, ids, seg_len=8, cache=model.new_cache(2, None, carry=True))

    with torch.no_grad():
        want = carried()
        lists = _hook(model, True)
        got = carried()
    torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-5)
    assert [len(x) for x in lists] == [3] * cfg.n_layers  # one reading per segment and layer
