"""The ``memorizing`` mixer (model/knn.py; "Memorizing Transformers", arXiv 2203.08913) against
independent references, each with a negative control that the check catches:

1. ``knn_top_k = knn_memory``: segment 2's output is ``g·(softmax attention over every stored
   (k, v) of segment 1, unrotated, own einsum) + (1-g)·local`` (control: the gate on local,
   lucidrains' sign; and the test tells rotated from unrotated keys);
2. ``top-k < M`` over a FIFO that wrapped equals a per-query loop over the last M keys picking
   the k largest scores (control: the k oldest slots instead);
3. ``knn_index=faiss`` (IndexFlatIP) equals exact search: indices and output (control: an L2
   index);
4. memory is per document: a query of document B never retrieves document A's pairs (control:
   the document test removed);
5. stored keys and values are detached: no gradient reaches an earlier segment through the
   memory (control: stored with their graph);
6. padding is never stored nor retrieved: a left-padded batch equals each row alone (control:
   padding stored).
Plus: a plain forward and an ordinary cache equal softmax attention exactly; the estimate is the
real state's bytes, the FLOPs and parameters by hand; the one-line config errors.

The layer-level tests run one memorizing layer with its output projection set to the identity,
so its output is the per-head mixture ``g·retrieved + (1-g)·local`` itself.
"""

from __future__ import annotations

import importlib.util

import pytest
import torch
from variants import VOCAB, tiny

from blocklab.config import ConfigError, MixerConfig, PositionConfig, validate_model
from blocklab.model import build_model, knn
from blocklab.model.cache import DecodeCache
from blocklab.model.estimate import estimate
from blocklab.model.mixer import Sequence
from blocklab.model.position import apply_rotary

ATOL = 1e-5
H, HKV, D = 4, 2, 8  # tiny(): d_model 32 = 4 heads of 8; gqa: 2 key/value heads


def _cfg(**options):
    return tiny(position=PositionConfig(name="rope"), attention="gqa", style=1,
                mixer=MixerConfig(name="memorizing", **options))


def _layer(top_k, memory, **options):
    """(model, its first memorizing layer): out projection = identity, gates b ~ N(0, 1)."""
    torch.manual_seed(0)
    model = build_model(_cfg(knn_top_k=top_k, knn_memory=memory, **options)).eval()
    layer = model.decoder.blocks[0].attn
    with torch.no_grad():
        layer.out.weight.copy_(torch.eye(H * D))
        if layer.out.bias is not None:
            layer.out.bias.zero_()
        layer.gate.normal_()
    return model, layer


def _run(model, layer, xs, *, remember=True, valid=None, segments=None):
    """The layer over segments ``xs`` (B, T_i, d) through one decode cache: outputs, state."""
    b = xs[0].shape[0]
    state = layer.new_state(b, 64, dtype=torch.float32, device="cpu")
    cache = DecodeCache([state], batch=b, capacity=64, device="cpu")
    if remember:
        knn.remember(cache)
    outs, start = [], 0
    with torch.no_grad():
        for i, x in enumerate(xs):
            t = x.shape[1]
            v = None if valid is None else valid[:, start:start + t]
            pos = (start + torch.arange(t)).expand(b, t)
            cache.begin(pos, v)
            seq = Sequence(positions=pos, valid=v, causal=True, position=model.decoder.position,
                           segments=None if segments is None else segments[i],
                           rotary=model.decoder.position.rotary(pos), cache=cache)
            outs.append(layer(x, seq, state))
            cache.advance(t)
            start += t
    return outs, state


def _qkv(layer, x):
    """Unrotated q (B, H, T, D), k, v (B, Hkv, T, D) of the layer's projection."""
    b, t, _ = x.shape
    q, k, v = layer.qkv(x).view(b, t, H + 2 * HKV, D).split((H, HKV, HKV), 2)
    return q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)


def _gate(layer):
    return torch.sigmoid(layer.gate)[None, None, :, None]  # (1, 1, H, 1)


def _mix(layer, retrieved, local):
    """g·retrieved + (1-g)·local: retrieved (B, H, T, D), local (B, T, H·D)."""
    b, t, _ = local.shape
    g = _gate(layer)
    return (g * retrieved.transpose(1, 2) + (1 - g) * local.view(b, t, H, D)).reshape(b, t, -1)


# ------------------------------------------------------------------------------ 1. k = M

def _full_memory_oracle(layer, x1, x2, *, rotate=None):
    """softmax(q2 k1ᵀ / √D) v1 per head (head h reads key/value head h // 2)."""
    q, _, _ = _qkv(layer, x2)
    _, k, v = _qkv(layer, x1)
    if rotate is not None:
        q, k = rotate(q, x2.shape[1], x1.shape[1]), rotate(k, 0, x1.shape[1])
    k, v = k.repeat_interleave(H // HKV, 1), v.repeat_interleave(H // HKV, 1)
    p = torch.softmax(torch.einsum("bhtd,bhsd->bhts", q, k) / D ** 0.5, -1)
    return torch.einsum("bhts,bhsd->bhtd", p, v)


def _check_full_memory(model, layer):
    torch.manual_seed(1)
    x1, x2 = torch.randn(2, 8, 32), torch.randn(2, 5, 32)
    (a1, a2), state = _run(model, layer, [x1, x2])
    (l1, l2), _ = _run(model, layer, [x1, x2], remember=False)
    torch.testing.assert_close(a1, l1, atol=0, rtol=0)  # nothing stored yet: local exactly
    assert int(state.memory_valid.sum()) == 2 * 13  # both segments' pairs, after attending
    with torch.no_grad():
        want = _mix(layer, _full_memory_oracle(layer, x1, x2), l2)
    torch.testing.assert_close(a2, want, atol=ATOL, rtol=0)
    return x1, x2, a2, l2


def test_full_memory_equals_softmax_attention_over_the_stored_pairs(monkeypatch):
    model, layer = _layer(top_k=16, memory=16)
    x1, x2, a2, l2 = _check_full_memory(model, layer)

    def rotate(t, start, n):  # the rotary angles of positions start.. (the stored would-be)
        pos = (start + torch.arange(t.shape[2]))[None]
        return apply_rotary(t.transpose(1, 2), *model.decoder.position.rotary(pos)).transpose(1, 2)

    with torch.no_grad():  # the test tells rotated keys and queries from the unrotated ones
        rotated = _mix(layer, _full_memory_oracle(layer, x1, x2, rotate=rotate), l2)
    with pytest.raises(AssertionError):
        torch.testing.assert_close(a2, rotated, atol=ATOL, rtol=0)
    # control: the gate on local (lucidrains' sign) is caught
    monkeypatch.setattr(knn, "gate", lambda b: 1 - torch.sigmoid(b))
    with pytest.raises(AssertionError):
        _check_full_memory(model, layer)


# ------------------------------------------------------------------- 2. top-k, FIFO wrapped

def _brute_force(layer, xs, top_k, memory):
    """Per query: the last ``memory`` pairs of the earlier segments, the ``top_k`` largest
    q·k among them by a sort, their softmax-weighted values (B, H, T, D)."""
    ks, vs = zip(*(_qkv(layer, x)[1:] for x in xs[:-1]))
    k, v = torch.cat(ks, 2)[:, :, -memory:], torch.cat(vs, 2)[:, :, -memory:]
    q = _qkv(layer, xs[-1])[0]
    b, _, t, _ = q.shape
    out = torch.zeros_like(q)
    for r in range(b):
        for h in range(H):
            for i in range(t):
                scores = [(float(q[r, h, i] @ k[r, h // 2, j]), j) for j in range(k.shape[2])]
                best = sorted(scores, reverse=True)[:top_k]
                w = torch.softmax(torch.tensor([s for s, _ in best]) / D ** 0.5, 0)
                out[r, h, i] = sum(w[n] * v[r, h // 2, j] for n, (_, j) in enumerate(best))
    return out


def _check_top_k(model, layer):
    torch.manual_seed(2)
    xs = [torch.randn(2, 6, 32) for _ in range(3)]  # 12 stored tokens > 8 slots: wrapped
    outs, state = _run(model, layer, xs)
    (*_, local), _ = _run(model, layer, xs, remember=False)
    assert int(state.memory_valid.sum()) == 2 * 8
    with torch.no_grad():
        want = _mix(layer, _brute_force(layer, xs, 3, 8), local)
    torch.testing.assert_close(outs[-1], want, atol=ATOL, rtol=0)


def test_top_k_equals_a_per_query_loop_over_the_fifo(monkeypatch):
    model, layer = _layer(top_k=3, memory=8)
    _check_top_k(model, layer)
    exact = knn.search_exact

    def oldest(q, keys, keep, k):  # control: the first k slots, not the largest scores
        idx, ok = exact(q, keys, keep, k)
        return torch.arange(k).expand_as(idx), ok

    monkeypatch.setattr(knn, "search_exact", oldest)
    with pytest.raises(AssertionError):
        _check_top_k(model, layer)


# ------------------------------------------------------------------------------ 3. faiss

def _search_both(seed=3):
    torch.manual_seed(seed)
    q, keys = torch.randn(2, HKV, 2, 7, D), torch.randn(2, HKV, 12, D)
    doc = torch.tensor([[1] * 3 + [2] * 4, [5] * 7])
    mem_doc = torch.tensor([[1] * 6 + [2] * 3 + [1] * 3, [5] * 12])
    valid = torch.ones(2, 12, dtype=torch.bool)
    valid[0, 7:] = False  # row 0: doc 2 has two entries only (fewer than k)
    keep = knn.same_document(mem_doc, valid, doc)
    return knn.search_exact(q, keys, keep, 4), knn.search_faiss(q, keys, keep, 4)


def test_faiss_flat_index_equals_exact_search(monkeypatch):
    faiss = pytest.importorskip("faiss")
    (ie, oe), (i_f, of) = _search_both()
    assert torch.equal(oe, of) and not oe.all()  # some queries have fewer than k entries
    assert torch.equal(ie[oe], i_f[of])
    model, layer = _layer(top_k=3, memory=8)
    torch.manual_seed(4)
    xs = [torch.randn(2, 6, 32) for _ in range(3)]
    exact, _ = _run(model, layer, xs)
    layer.index = "faiss"
    found, _ = _run(model, layer, xs)
    torch.testing.assert_close(found[-1], exact[-1], atol=ATOL, rtol=0)
    monkeypatch.setattr(faiss, "IndexFlatIP", faiss.IndexFlatL2)  # control: nearest by L2
    (ie, oe), (i_f, of) = _search_both()
    with pytest.raises(AssertionError):
        assert torch.equal(ie[oe], i_f[of])


# -------------------------------------------------------------------- 4. document boundary

def _check_documents(model, layer):
    """Segment 1: document 1; segment 2 packs document 1's last 3 tokens and document 2's first
    5. Document 1's queries retrieve (differ from local), document 2's get local exactly."""
    torch.manual_seed(5)
    xs = [torch.randn(1, 8, 32), torch.randn(1, 8, 32)]
    segments = [torch.ones(1, 8, dtype=torch.long), torch.tensor([[1] * 3 + [2] * 5])]
    (_, a2), state = _run(model, layer, xs, segments=segments)
    (_, l2), _ = _run(model, layer, xs, segments=segments, remember=False)
    assert state.memory_doc[0, 8:].tolist() == [1] * 3 + [2] * 5  # ids stored per slot
    assert not torch.allclose(a2[:, :3], l2[:, :3], atol=1e-3)  # document 1 retrieves
    torch.testing.assert_close(a2[:, 3:], l2[:, 3:], atol=0, rtol=0)  # document 2 does not


def test_memory_is_never_read_by_another_document(monkeypatch):
    model, layer = _layer(top_k=4, memory=16)
    _check_documents(model, layer)
    monkeypatch.setattr(knn, "same_document", lambda doc, valid, q: valid[:, None, :].expand(
        -1, q.shape[1], -1))  # control: a memory not cleared at the boundary
    with pytest.raises(AssertionError):
        _check_documents(model, layer)


# ------------------------------------------------------------------------------- 5. grads

def _check_detached(layer, *, flags=True):
    torch.manual_seed(6)
    x1, x2 = torch.randn(1, 5, 32, requires_grad=True), torch.randn(1, 4, 32, requires_grad=True)
    state = layer.new_state(1, 16, dtype=torch.float32, device="cpu")
    _, k1, v1 = layer.qkv(x1).view(1, 5, H + 2 * HKV, D).split((H, HKV, HKV), 2)
    state.append(k1, v1, torch.zeros(1, 5, dtype=torch.long), torch.ones(1, 5, dtype=torch.bool))
    if flags:
        assert not state.memory_k.requires_grad and not state.memory_v.requires_grad
    q2 = layer.qkv(x2).view(1, 4, H + 2 * HKV, D)[:, :, :H]
    r, found = state.retrieve(q2, torch.zeros(1, 4, dtype=torch.long), top_k=3, index="exact",
                              scale=D ** -0.5)
    assert found.all()
    r.square().sum().backward()
    assert x2.grad is not None and x2.grad.abs().sum() > 0  # the queries learn
    assert x1.grad is None  # nothing flows into segment 1 through the memory


def test_the_memory_is_stored_detached(monkeypatch):
    _, layer = _layer(top_k=3, memory=8)
    _check_detached(layer)
    monkeypatch.setattr(knn, "stored", lambda t: t)  # control: stored with its graph
    for flags in (True, False):  # caught by the flags, and by the gradient alone
        with pytest.raises(AssertionError):
            _check_detached(layer, flags=flags)


# ----------------------------------------------------------------------------- 6. padding

def _check_padding(*, count=True):
    """Left-padded rows (pads 3, 0, 2) read in two segments through a remembering cache equal
    each row's real tokens alone; the memory holds the real tokens only."""
    torch.manual_seed(7)
    model = build_model(_cfg(knn_top_k=12, knn_memory=12, pattern=["softmax", "memorizing"]))
    model.eval()
    ids = torch.randint(0, VOCAB, (3, 11))
    valid = torch.ones(3, 11, dtype=torch.bool)
    for r, pad in enumerate((3, 0, 2)):
        valid[r, :pad] = False
    positions = torch.where(valid, valid.long().cumsum(-1) - 1, 0)

    def read(ids, valid, positions, cut=7):  # the same segments: tokens [0, 7), [7, 11)
        cache = model.new_cache(ids.shape[0], 16)
        knn.remember(cache)
        with torch.no_grad():
            outs = [model(ids[:, s], positions=positions[:, s],
                          valid=None if valid is None else valid[:, s], cache=cache)
                    for s in (slice(0, cut), slice(cut, None))]
        return torch.cat(outs, 1), cache.states[1]

    got, state = read(ids, valid, positions)
    if count:
        assert state.memory_valid.sum(1).tolist() == valid.sum(1).tolist()
    for r in range(3):
        pad = int((~valid[r]).sum())
        alone, _ = read(ids[r:r + 1, pad:], None, positions[r:r + 1, pad:], 7 - pad)
        torch.testing.assert_close(got[r, valid[r]], alone[0], atol=ATOL, rtol=0)


def test_padding_is_never_stored_nor_retrieved(monkeypatch):
    _check_padding()
    monkeypatch.setattr(knn, "stored_tokens", lambda real, slots: torch.ones_like(real))
    for count in (True, False):  # control: the pads stored too (caught by the outputs alone)
        with pytest.raises(AssertionError):
            _check_padding(count=count)


# ------------------------------------------------------------- without memory: softmax

def test_without_memory_the_layer_is_softmax_attention():
    """A plain forward, and an ordinary cache (no ``remember``), equal softmax attention with
    the same weights exactly; the gate starts at b = 0."""
    torch.manual_seed(8)
    cfg = _cfg(knn_top_k=2, knn_memory=4)
    mem = build_model(cfg).eval()
    assert all(not b.attn.gate.detach().any() for b in mem.decoder.blocks)
    soft = build_model(tiny(position=PositionConfig(name="rope"), attention="gqa", style=1))
    missing = soft.eval().load_state_dict(mem.state_dict(), strict=False).unexpected_keys
    assert sorted(missing) == ["decoder.blocks.0.attn.gate", "decoder.blocks.1.attn.gate"]
    ids = torch.randint(0, VOCAB, (2, 12))
    assert torch.equal(mem(ids), soft(ids))
    cache = mem.new_cache(2, 12)
    with torch.no_grad():
        parts = [mem(ids[:, s], positions=torch.arange(12)[None, s].expand(2, -1), cache=cache)
                 for s in (slice(0, 5), slice(5, 12))]
    torch.testing.assert_close(torch.cat(parts, 1), soft(ids), atol=ATOL, rtol=0)
    assert not cache.states[0].memory_valid.any()
    with pytest.raises(ValueError, match="static"):
        knn.remember(mem.new_cache(1, 8, static=True))


# ---------------------------------------------------------------------------- the estimate

def test_the_estimate_prices_the_memory():
    cfg = _cfg(knn_top_k=3, knn_memory=8, pattern=["softmax", "memorizing"])
    model = build_model(cfg)
    soft = tiny(position=PositionConfig(name="rope"), attention="gqa", style=1)
    e, base = estimate(cfg, batch=2, seq_len=16, bytes_per_value=4), estimate(
        soft, batch=2, seq_len=16, bytes_per_value=4)
    assert e.params == sum(p.numel() for p in model.parameters()) == base.params + H
    gates, search = 2 * H, 2 * H * D * 8 + 4 * 3 * H * D  # the gate's parameters; M = 8, k = 3
    assert e.forward_flops_per_token == base.forward_flops_per_token + gates + search
    cache = model.new_cache(2, 16, dtype=torch.float32)
    memory = 2 * 2 * HKV * D * 8 * 4 + 9 * 2 * 8 + 8 * 2  # k, v fp32; ids, validity; FIFO
    assert cache.nbytes == e.state_bytes == base.state_bytes + memory
    assert knn.Memorizing.describe(cfg, 1) == "(memorizing, top 3 of 8)"
    local = _cfg(knn_top_k=3, knn_memory=8, window=5)
    assert knn.Memorizing.describe(local, 0) == "(memorizing, top 3 of 8, local, window 5)"


# ------------------------------------------------------------------------- config errors

@pytest.mark.parametrize(("options", "key", "words"), [
    ({"knn_top_k": 9, "knn_memory": 8}, "knn_top_k", "[1, model.mixer.knn_memory=8]"),
    ({"knn_top_k": 0}, "knn_top_k", "must be an integer in [1"),
    ({"knn_memory": 0, "knn_top_k": 1}, "knn_memory", "must be an integer >= 1"),
    ({"knn_index": "annoy"}, "knn_index", "exact, faiss"),
])
def test_bad_options_are_one_line_errors(options, key, words):
    with pytest.raises(ConfigError) as err:
        validate_model(_cfg(**options))
    msg = str(err.value)
    assert len(msg.splitlines()) == 1 and f"model.mixer.{key}" in msg and words in msg, msg


def test_faiss_missing_names_the_extra(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "faiss" else real(name, *a))
    with pytest.raises(ConfigError) as err:
        validate_model(_cfg(knn_index="faiss"))
    msg = str(err.value)
    assert "model.mixer.knn_index" in msg and "pip install 'blocklab[memory]'" in msg, msg


def test_a_bidirectional_stack_is_refused():
    cfg = tiny("encoder", PositionConfig(name="rope"), mixer=MixerConfig(name="memorizing"))
    with pytest.raises(ConfigError) as err:
        validate_model(cfg)
    assert "memorizing" in str(err.value) and len(str(err.value).splitlines()) == 1
    with pytest.raises(ConfigError, match="past"):
        knn.Memorizing.check(cfg, 0, causal=False, key="model.mixer")


def test_selected_rows_keep_their_memory():
    """``cache.select(rows)`` copies each row's memory: rows [1, 0, 0] of a remembering
    prefill continue like rows 1, 0, 0 read alone (the memory changes the output)."""
    torch.manual_seed(9)
    model = build_model(_cfg(knn_top_k=4, knn_memory=8, pattern=["softmax", "memorizing"]))
    model.eval()
    ids, cont = torch.randint(0, VOCAB, (2, 6)), torch.randint(0, VOCAB, (3, 3))
    rows = torch.tensor([1, 0, 0])

    def read(first, then, chosen=None, on=True):
        cache = model.new_cache(first.shape[0], 12)
        if on:
            knn.remember(cache)
        with torch.no_grad():
            model(first, positions=torch.arange(6).expand(first.shape[0], -1), cache=cache)
            if chosen is not None:
                cache = cache.select(chosen)
            return model(then, positions=(6 + torch.arange(3)).expand(then.shape[0], -1),
                         cache=cache)

    got = read(ids, cont, rows)
    for j, r in enumerate(rows.tolist()):
        alone = read(ids[r:r + 1], cont[j:j + 1])
        torch.testing.assert_close(got[j], alone[0], atol=ATOL, rtol=0)
    assert not torch.allclose(got, read(ids, cont, rows, on=False), atol=ATOL)


# ------------------------------------------------------------------ with the carry core

CARRY = hasattr(DecodeCache, "enter")  # issue 45's carry cache (model/carry.py)


@pytest.mark.skipif(not CARRY, reason="the carry core (model/carry.py) is not on this branch")
def test_a_carry_cache_fills_the_memory_per_document_with_autograd_on(monkeypatch):
    """A carry cache remembers by itself, autograd on: the gate learns, the memory holds no
    graph, and a document starting inside a segment reads only its own entries — its logits
    equal the document read alone with the same cuts (the memory depends on them). Control:
    without the document test, document 2 reads document 1's entries."""
    _check_carry()
    monkeypatch.setattr(knn, "same_document", lambda doc, valid, q: valid[:, None, :].expand(
        -1, q.shape[1], -1))
    with pytest.raises(AssertionError):
        _check_carry()


def _check_carry():
    from blocklab.model.carry import first_documents, run_segments

    torch.manual_seed(10)
    model = build_model(_cfg(knn_top_k=4, knn_memory=16, pattern=["softmax", "memorizing"]))
    ids = torch.randint(0, VOCAB, (2, 18))
    seg = torch.tensor([[1] * 7 + [2] * 11, [4] * 18])
    cache = model.new_cache(2, 18, carry=True)  # global layers keep every key: a capacity
    logits = run_segments(model, ids, seg_len=6, cache=cache, segments=seg)
    logits.square().mean().backward()
    gate = model.decoder.blocks[1].attn.gate
    assert gate.grad is not None and gate.grad.abs().sum() > 0
    state = cache.states[1]
    assert not state.memory_k.requires_grad and int(state.memory_valid.sum()) == 2 * 16
    alone = model.new_cache(1, 18, carry=True)
    parts = []
    for cut in (slice(7, 12), slice(12, 18)):  # doc 2's tokens of segments 2 and 3
        sg = seg[:1, cut]
        alone.enter(first_documents(sg, None, alone))
        parts.append(model(ids[:1, cut], segments=sg, cache=alone))
    torch.testing.assert_close(logits[0, 7:], torch.cat(parts, 1)[0], atol=ATOL, rtol=0)
