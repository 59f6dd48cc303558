"""Transformer-XL memory of the global softmax layers in a carry cache (model/memory.py,
``model.mixer.mem_len`` / ``eval_mem_len``).

The reference is an own einsum implementation of kimiyoung/transformer-xl
(``pytorch/mem_transformer.py``: ``MemTransformerLM._update_mems``, ``dec_attn_mask``) run
with the model's weights: per layer ``cat = [mem.detach(); x]``, K and V from ``cat``, Q from
``x``, mask ``triu(ones(T, M + T), 1 + M)``, relative positions (rotary by each key's own
position, ALiBi by the distance), ``new_mem = cat[-mem_len:].detach()``. Over 3 segments the
carried model equals it — logits and every parameter's gradient — with a memory shorter and
longer than a segment. Controls (each caught): the oracle without the stop-gradient has other
gradients, and so does the model with its stop-gradient removed; a packed row read without its
document ids lets one document's memory reach the next.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from variants import VOCAB, tiny

from blocklab.config import PositionConfig
from blocklab.model import build_model, memory
from blocklab.model.carry import run_segments

B, T, NSEG = 2, 8, 3
L = T * NSEG
GRAD_ATOL = 1e-4


def _cfg(position: str, mem_len, eval_mem_len=None):
    cfg = tiny(position=PositionConfig(name=position))
    cfg = copy.deepcopy(cfg)
    cfg.mixer["mem_len"] = mem_len
    cfg.mixer["eval_mem_len"] = eval_mem_len
    return cfg


def _model(cfg):
    torch.manual_seed(0)
    return build_model(cfg).eval()


def _data():
    g = torch.Generator().manual_seed(3)
    return (torch.randint(0, VOCAB, (B, L), generator=g),
            torch.randint(0, VOCAB, (B, L), generator=g))


def _rotate(x, pos, inv_freq):
    """Rotary angles of ``pos`` (N,) on x (B, H, N, D): the rotate-half form."""
    ang = pos[:, None].float() * inv_freq
    ang = torch.cat((ang, ang), -1)
    x1, x2 = x.chunk(2, -1)
    return x * ang.cos() + torch.cat((-x2, x1), -1) * ang.sin()


def _oracle_attention(layer, mems, i, mem_len, position, stop=True):
    kind = type(position).__name__.lower()
    """Layer i's attention over [mem; x] (kimiyoung's formulation), own einsum code."""
    def forward(x, seq, state):
        b, t, _ = x.shape
        mem = mems[i] if mems[i] is not None else x[:, :0]
        m = mem.shape[1]
        cat = torch.cat((mem.detach() if stop else mem, x), 1)
        h, d = layer.n_heads, layer.d_head
        q, k, v = F.linear(cat, layer.qkv.weight, layer.qkv.bias).view(
            b, m + t, 3, h, d).permute(2, 0, 3, 1, 4)  # (B, H, M + T, D) each
        pos = torch.arange(-m, t)  # relative: the segment's first token at 0
        if kind == "rope":
            q = _rotate(q, pos, position.inv_freq)
            k = _rotate(k, pos, position.inv_freq)
        q = q[:, :, m:]
        s = torch.einsum("bhqd,bhkd->bhqk", q, k) * d ** -0.5
        if kind == "alibi":
            s = s - position.slopes[:, None, None] * (pos[m:, None] - pos[None, :]).abs()
        mask = torch.triu(torch.ones(t, m + t, dtype=torch.bool), 1 + m)
        p = s.masked_fill(mask, float("-inf")).softmax(-1)
        o = torch.einsum("bhqk,bhkd->bhqd", p, v).transpose(1, 2).reshape(b, t, h * d)
        new = cat[:, max(0, m + t - mem_len):]
        mems[i] = new.detach() if stop else new
        return layer.out(o)
    return forward


def _oracle(model, ids, mem_len, stop=True):
    """Segment by segment through the model with every attention replaced by the oracle."""
    blocks = model.decoder.blocks
    mems = [None] * len(blocks)
    position = model.decoder.position
    saved = [b.attn.forward for b in blocks]
    try:
        for i, b in enumerate(blocks):
            b.attn.forward = _oracle_attention(b.attn, mems, i, mem_len, position, stop)
        return torch.cat([model(ids[:, s:s + T]) for s in range(0, L, T)], 1)
    finally:
        for b, f in zip(blocks, saved, strict=True):
            b.attn.forward = f


def _carried(model, ids, mem="train", **kw):
    return run_segments(model, ids, seg_len=T, cache=model.new_cache(
        ids.shape[0], None, carry=True, mem=mem), **kw)


def _grads(model, logits, targets):
    model.zero_grad()
    F.cross_entropy(logits.flatten(0, 1), targets.flatten(), reduction="sum").backward()
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def _assert_equal(model, got, want, targets):
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)
    g, w = _grads(model, got, targets), _grads(model, want, targets)
    assert g.keys() == w.keys()
    for n in w:
        torch.testing.assert_close(g[n], w[n], atol=GRAD_ATOL, rtol=1e-4,
                                   msg=lambda m, n=n: f"{n}: {m}")


CASES = [("rope", 6), ("rope", 12), ("alibi", 6), ("alibi", 12)]


@pytest.mark.parametrize(("position", "mem_len"), CASES)
def test_xl_memory_equals_the_transformer_xl_oracle(position, mem_len):
    model = _model(_cfg(position, mem_len))
    ids, targets = _data()
    _assert_equal(model, _carried(model, ids), _oracle(model, ids, mem_len), targets)


def test_control_gradient_not_stopped_is_caught(monkeypatch):
    model = _model(_cfg("rope", 12))
    ids, targets = _data()
    want = _oracle(model, ids, 12)
    # the oracle without the stop-gradient: same logits, other gradients
    loose = _oracle(model, ids, 12, stop=False)
    torch.testing.assert_close(loose, want, atol=1e-5, rtol=1e-4)
    with pytest.raises(AssertionError):
        _assert_equal(model, loose, want, targets)
    monkeypatch.setattr(memory, "stop_gradient", lambda t: t.detach())  # the check works
    _assert_equal(model, _carried(model, ids), _oracle(model, ids, 12), targets)
    # blocklab with its stop-gradient removed fails the equality
    monkeypatch.setattr(memory, "stop_gradient", lambda t: t)
    with pytest.raises(AssertionError):
        _assert_equal(model, _carried(model, ids), _oracle(model, ids, 12), targets)


def test_memory_is_detached_and_sized_by_mem_len():
    model = _model(_cfg("rope", 12, eval_mem_len=20))
    ids, _ = _data()
    cache = model.new_cache(B, None, carry=True)
    run_segments(model, ids, seg_len=T, cache=cache)
    states = [s for s in cache.states if isinstance(s, memory.MemoryState)]
    assert len(states) == 2 and all(s.x.shape == (B, 12, 32) for s in states)
    assert not any(s.x.requires_grad for s in states)
    ev = model.new_cache(B, None, carry=True, mem="eval")
    assert all(s.x.shape == (B, 20, 32) for s in ev.states)


def test_eval_mem_len_zero_is_each_segment_alone_and_longer_memory_is_read():
    model = _model(_cfg("alibi", 8, eval_mem_len=0))
    ids, _ = _data()
    with torch.no_grad():
        alone = torch.cat([model(ids[:, s:s + T]) for s in range(0, L, T)], 1)
        torch.testing.assert_close(_carried(model, ids, mem="eval"), alone)
        with pytest.raises(AssertionError):  # the training memory (8) is read
            torch.testing.assert_close(_carried(model, ids), alone)
        longer = _model(_cfg("alibi", 8, eval_mem_len=2 * T))
        one, two = _carried(longer, ids), _carried(longer, ids, mem="eval")
        torch.testing.assert_close(one[:, :2 * T], two[:, :2 * T])  # both see all so far
        assert (one[:, 2 * T:] - two[:, 2 * T:]).abs().max() > 1e-4  # 2T keys back are read


def test_memory_default_zero_is_each_segment_alone():
    model = _model(_cfg("rope", 0))
    ids, _ = _data()
    with torch.no_grad():
        alone = torch.cat([model(ids[:, s:s + T]) for s in range(0, L, T)], 1)
        torch.testing.assert_close(_carried(model, ids), alone)


@pytest.mark.parametrize("start", [12, 16], ids=["inside-a-segment", "at-a-segment-start"])
def test_memory_never_crosses_documents_and_padding_is_not_kept(start):
    """Document B (from ``start``) of a packed row == B alone, left-padded so that the cuts
    fall at the same places (padding never enters the memory). Control: the packed row read
    without its document ids lets A's memory reach B."""
    model = _model(_cfg("rope", 12))
    ids, _ = _data()
    seg = torch.zeros(B, L, dtype=torch.long)
    seg[:, start:] = 1
    valid = torch.ones(B, L, dtype=torch.bool)
    valid[1, L - 3:] = False  # right padding too
    pad = torch.ones(B, L, dtype=torch.bool)
    pad[:, :start] = False  # B alone: its tokens where they were, padding before them
    pad &= valid
    with torch.no_grad():
        packed = _carried(model, ids, valid=valid, segments=seg)
        alone = _carried(model, ids, valid=pad)
        real = pad
        torch.testing.assert_close(packed[real], alone[real], atol=1e-5, rtol=1e-4)
        with pytest.raises(AssertionError):
            mixed = _carried(model, ids, valid=valid)
            torch.testing.assert_close(mixed[real], alone[real], atol=1e-5, rtol=1e-4)


def test_pricing_matches_a_carry_cache():
    from blocklab.model.attention import SoftmaxAttention

    cfg = _cfg("rope", 12)
    model = _model(cfg)
    ids, _ = _data()
    cache = model.new_cache(B, None, carry=True)
    with torch.no_grad():
        run_segments(model, ids, seg_len=T, cache=cache)
    priced = sum(SoftmaxAttention.state_bytes(cfg, i, batch=B, seq_len=T, bytes_per_value=4)
                 for i in range(cfg.n_layers))
    assert priced == cache.nbytes == 2 * B * 12 * 32 * 4
    assert SoftmaxAttention.score_keys(cfg, 0, seq_len=T) == T + 12
    assert SoftmaxAttention.describe(cfg, 0) == "(global, memory 12)"
    base = _cfg("rope", 0)
    extra = (SoftmaxAttention.flops_per_token(cfg, 0, seq_len=T, causal=True)
             - SoftmaxAttention.flops_per_token(base, 0, seq_len=T, causal=True))
    assert extra == 4 * 12 * 4 * 8 + 2 * 3 * 32 * 32 * 12 / T  # scores + memory projections


# ------------------------------------------------------ compressed memory (model/compress.py)
def _compressive(position, mem_len, ratio, kind="conv", compress_len=None):
    cfg = _cfg(position, mem_len)
    cfg.mixer["compress_ratio"] = ratio
    cfg.mixer["compress_kind"] = kind
    cfg.mixer["compress_len"] = compress_len
    return cfg


@pytest.mark.parametrize("position", ["rope", "alibi"])
def test_ratio_one_mean_pooling_equals_an_uncompressed_memory_of_the_same_length(position):
    """Compression at ratio 1 by mean pooling keeps each evicted token as it was, at its
    position: memory 4 + 8 compressed == memory 12 (logits; 3 segments, packed)."""
    plain = _model(_cfg(position, 12))
    model = _model(_compressive(position, 4, 2, kind="mean", compress_len=8))
    model.load_state_dict(plain.state_dict())
    for b in model.decoder.blocks:
        b.attn.compressor.ratio = 1  # below the config's floor of 2: the identity
    ids, _ = _data()
    seg = torch.zeros(B, L, dtype=torch.long)
    seg[1, 13:] = 1
    with torch.no_grad():
        want = _carried(plain, ids, segments=seg)
        torch.testing.assert_close(_carried(model, ids, segments=seg), want, atol=1e-5,
                                   rtol=1e-4)
        for b in model.decoder.blocks:  # control: ratio 2 pools pairs, other keys
            b.attn.compressor.ratio = 2
        with pytest.raises(AssertionError):
            torch.testing.assert_close(_carried(model, ids, segments=seg), want, atol=1e-5,
                                       rtol=1e-4)


def _aux_grads(model, ids):
    cache = model.new_cache(B, None, carry=True)
    run_segments(model, ids, seg_len=T, cache=cache)
    assert cache.aux_loss is not None and cache.aux_loss.item() > 0
    model.zero_grad()
    cache.aux_loss.backward()
    return {n: p.grad for n, p in model.named_parameters()}


def test_reconstruction_loss_trains_only_the_compressor(monkeypatch):
    from blocklab.model import compress

    model = _model(_compressive("rope", 6, 2))
    ids, _ = _data()
    grads = _aux_grads(model, ids)
    conv = [n for n in grads if "compressor" in n]
    assert conv and all(grads[n] is not None and grads[n].abs().sum() > 0 for n in conv)
    others = [n for n in grads if "compressor" not in n]
    assert all(grads[n] is None or not grads[n].any() for n in others)
    # control: the key/value weights not detached give the projection a gradient
    monkeypatch.setattr(compress, "kv_weights", lambda layer: (layer.qkv.weight,
                                                               layer.qkv.bias))
    grads = _aux_grads(model, ids)
    with pytest.raises(AssertionError):
        assert all(grads[n] is None or not grads[n].any() for n in others)


def test_compressed_memory_is_priced_and_kept_per_document():
    from blocklab.model.attention import SoftmaxAttention

    cfg = _compressive("rope", 8, 4)
    model = _model(cfg)
    ids, _ = _data()
    cache = model.new_cache(B, None, carry=True)
    with torch.no_grad():
        run_segments(model, ids, seg_len=T, cache=cache)
    states = cache.states
    assert all(s.c_valid.all() for s in states)  # 16 evicted by segment 3: 4 groups, 2 kept
    assert not any(s.c.requires_grad for s in states)
    priced = sum(SoftmaxAttention.state_bytes(cfg, i, batch=B, seq_len=T, bytes_per_value=4)
                 for i in range(cfg.n_layers))
    assert priced == cache.nbytes == 2 * B * (8 + 2) * 32 * 4
    assert SoftmaxAttention.describe(cfg, 0) == "(global, memory 8 (+2 compressed))"
    assert SoftmaxAttention.score_keys(cfg, 0, seq_len=T) == T + 8 + 2
    n = sum(p.numel() for p in model.parameters())
    base = sum(p.numel() for p in _model(_cfg("rope", 8)).parameters())
    assert n - base == 2 * (32 * 32 * 4 + 32)
    assert SoftmaxAttention.param_count(cfg, 0, causal=True) - SoftmaxAttention.param_count(
        _cfg("rope", 8), 0, causal=True) == 32 * 32 * 4 + 32
