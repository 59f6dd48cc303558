"""Carrying state across segments (model/carry.py): a row read segment by segment through a
carry cache, autograd on, equals the plain forward over the whole row — logits and every
parameter's gradient — for every decoder mixer of the grid, hybrids, softmax keeping every
key, local windows and attention patterns; packed rows (a document boundary inside a segment
and one exactly at a segment start) and right padding included. The reference is the
no-cache forward, which the invariant grid (test_invariants.py) proves padding- and
packing-invariant on its own. Negative controls: memory dropped, no reset at a boundary, the
short convolution's tail read as no document's, in-place writes with autograd on. Truncated
backpropagation (``detach()`` after each segment) equals a reference that runs the earlier
segments without autograd."""

from __future__ import annotations

import copy

import pytest
import torch
from variants import VOCAB, mixer_variants, tiny

from blocklab.config import MixerConfig, PositionConfig
from blocklab.model import build_model, seqops
from blocklab.model.cache import DecodeCache
from blocklab.model.carry import run_segments

B, L, SEG = 3, 32, 8
GRAD_ATOL = 1e-4  # gradients of a loss summed over 96 tokens (entries up to ~10)


def _carries_exactly(cfg) -> bool:
    """A mixer whose outputs depend on the segment cuts (a retrieval memory) is proven apart
    (tests/model/test_knn.py)."""
    from blocklab.registry import lookup

    return not any(getattr(lookup("mixer", n), "segments_change_outputs", False)
                   for n in {*cfg.mixer.pattern, cfg.mixer.name})


CASES = [
    *[(label, cfg) for label, cfg in mixer_variants("decoder") if _carries_exactly(cfg)],
    ("softmax-rope-full", tiny(position=PositionConfig(name="rope"))),
    ("softmax-t5-full", tiny(position=PositionConfig(name="t5_bias"), style=5)),
    ("softmax-alibi-w3", tiny(position=PositionConfig(name="alibi"), window=3, style=3)),
    ("softmax-rope-w5g2", tiny(position=PositionConfig(name="rope"), window=5, global_every=2,
                               attention="gqa", style=1)),
]
# attention patterns counting from a document's start (positions count a document's tokens)
PATTERNS = [
    ("sinks", tiny(position=PositionConfig(name="rope"),
                   mixer=MixerConfig(name="softmax", window=3, sinks=2))),
    ("chunk", tiny(position=PositionConfig(name="alibi"),
                   mixer=MixerConfig(name="softmax", attention_chunk=4))),
    ("chunk-global", tiny(position=PositionConfig(name="rope"), mixer=MixerConfig(
        name="softmax", attention_chunk=3, global_every=2, sinks=1))),
    ("global-tokens", tiny(position=PositionConfig(name="rope"), mixer=MixerConfig(
        name="softmax", window=3, global_tokens=1, learned_sink=True))),
    ("random-blocks", tiny(position=PositionConfig(name="rope"), mixer=MixerConfig(
        name="softmax", window=3, random_blocks=1, block_size=2, sinks=1))),
    ("marked-id", tiny(position=PositionConfig(name="rope"), mixer=MixerConfig(
        name="softmax", window=3, global_token_id=3))),
]
IDS = [label for label, _ in CASES]


def _model(cfg):
    """Global softmax layers keep every key of the document (``mem_len: null``; the default
    0 attends within each segment, test_xl_memory.py)."""
    torch.manual_seed(0)
    if {cfg.mixer.name, *cfg.mixer.pattern} & {"softmax", "memorizing"}:
        cfg = cfg.model_copy(deep=True) if hasattr(cfg, "model_copy") else copy.deepcopy(cfg)
        cfg.mixer["mem_len"] = None
    return build_model(cfg).eval()


def _batch(packed: bool):
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, VOCAB, (B, L), generator=g)
    targets = torch.randint(0, VOCAB, (B, L), generator=g)
    if not packed:
        return ids, targets, None, None
    seg = torch.zeros(B, L, dtype=torch.long)
    seg[0, 12:] = 1  # a boundary inside segment 2
    seg[1], seg[1, 16:] = 5, 6  # one exactly at the start of segment 3
    seg[2] = 9
    valid = torch.ones(B, L, dtype=torch.bool)
    valid[2, 20:] = False  # right padding (segment 4 all padding)
    return ids, targets, valid, seg


def _cache(model, batch=B):
    """A carry cache of no capacity; a layer that keeps every token needs one (the row)."""
    try:
        return model.new_cache(batch, None, carry=True)
    except ValueError as e:
        assert "capacity" in str(e) and "\n" not in str(e)
        return model.new_cache(batch, L, carry=True)


def _loss(logits, targets, valid):
    real = torch.ones_like(targets, dtype=torch.bool) if valid is None else valid
    return torch.nn.functional.cross_entropy(logits[real], targets[real], reduction="sum")


def _grads(model, loss):
    model.zero_grad()
    loss.backward()
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def _assert_same(model, packed, carried=None, **kw):
    """Carried logits and gradients == the plain forward's (``carried``: the carried run)."""
    ids, targets, valid, seg = _batch(packed)
    ref = model(ids, valid=valid, segments=seg)
    want = _grads(model, _loss(ref, targets, valid))
    run = carried or (lambda: run_segments(model, ids, seg_len=SEG, cache=_cache(model),
                                           valid=valid, segments=seg))
    out = run()
    real = torch.ones_like(ids, dtype=torch.bool) if valid is None else valid
    torch.testing.assert_close(out[real], ref[real], atol=1e-5, rtol=1e-4)
    got = _grads(model, _loss(out, targets, valid))
    assert got.keys() == want.keys()
    for name in want:
        torch.testing.assert_close(got[name], want[name], atol=GRAD_ATOL, rtol=1e-4, msg=lambda m, name=name: f"{name}: {m}")


@pytest.mark.parametrize("packed", [False, True], ids=["rows", "packed"])
@pytest.mark.parametrize("cfg", [c for _, c in CASES], ids=IDS)
def test_segments_with_carried_state_equal_the_full_forward(cfg, packed):
    _assert_same(_model(cfg), packed)


@pytest.mark.parametrize("packed", [False, True], ids=["rows", "packed"])
@pytest.mark.parametrize("cfg", [c for _, c in PATTERNS], ids=[n for n, _ in PATTERNS])
def test_attention_patterns_carry(cfg, packed):
    _assert_same(_model(cfg), packed)


@pytest.mark.parametrize("cfg", [c for _, c in CASES], ids=IDS)
def test_each_carried_document_equals_it_alone(cfg):
    """Grid invariants in carry mode: every document of the packed, padded rows equals the
    same document read alone from a fresh carry (its own segment boundaries: from its first
    token), and the logits of segments 1–3 do not change when segment 4 changes."""
    model = _model(cfg)
    ids, _, valid, seg = _batch(packed=True)
    with torch.no_grad():
        packed = run_segments(model, ids, seg_len=SEG, cache=_cache(model), valid=valid,
                              segments=seg)
        for r in range(B):
            for d in seg[r].unique():
                at = (seg[r] == d) & valid[r]
                alone = run_segments(model, ids[r][at][None], seg_len=SEG,
                                     cache=_cache(model, 1))
                torch.testing.assert_close(packed[r][at], alone[0], atol=1e-5, rtol=1e-4)
        future = ids.clone()
        future[:, 3 * SEG:] = (future[:, 3 * SEG:] + 1) % VOCAB
        changed = run_segments(model, future, seg_len=SEG, cache=_cache(model), valid=valid,
                               segments=seg)
    assert torch.equal(changed[:, :3 * SEG], packed[:, :3 * SEG])


def _dropped(model, ids, valid, seg):
    """The control: the carried memory dropped before segment 3."""
    cache, out = _cache(model), []
    for s in range(0, L, SEG):
        if s == 2 * SEG:
            cache.reset_rows(torch.ones(B, dtype=torch.bool))
        cut = slice(s, s + SEG)
        out.append(run_segments(model, ids[:, cut], seg_len=SEG, cache=cache,
                                valid=None if valid is None else valid[:, cut],
                                segments=None if seg is None else seg[:, cut]))
    return torch.cat(out, 1)


CONTROLS = [c for c in CASES if any(k in c[0] for k in ("ssm", "linear", "conv", "w3", "full"))]


@pytest.mark.parametrize("cfg", [c for _, c in CONTROLS], ids=[n for n, _ in CONTROLS])
def test_control_memory_dropped_is_caught(cfg):
    model = _model(cfg)
    ids, _, valid, seg = _batch(packed=False)
    with pytest.raises(AssertionError):
        _assert_same(model, False, carried=lambda: _dropped(model, ids, valid, seg))


RECURRENT = [c for c in CASES if any(k in c[0] for k in ("ssm", "linear", "conv"))]


@pytest.mark.parametrize("cfg", [c for _, c in RECURRENT], ids=[n for n, _ in RECURRENT])
def test_control_no_reset_at_a_boundary_is_caught(cfg, monkeypatch):
    """Row 1's document 6 starts exactly at segment 3: not emptied there, it reads 5's."""
    monkeypatch.setattr(DecodeCache, "enter", lambda self, doc_first: None)
    with pytest.raises(AssertionError):
        _assert_same(_model(cfg), packed=True)


SHORT = [c for c in CASES if c[1].mixer.get("short_conv") or c[1].mixer.get("d_conv")
         or "gated_conv" in c[0] or "ssm" in c[0]]


@pytest.mark.parametrize("cfg", [c for _, c in SHORT], ids=[n for n, _ in SHORT])
def test_control_short_conv_tail_of_no_document_is_caught(cfg, monkeypatch):
    """The tail read as no document's (-2, as outside a carry): a continuing row loses it."""
    monkeypatch.setattr(seqops, "CARRIED_TAIL_DOC", seqops.TAIL_DOC)
    with pytest.raises(AssertionError):
        _assert_same(_model(cfg), packed=True)


@pytest.mark.parametrize("name", ["ssm0", "softmax-rope-full"])
def test_control_in_place_writes_with_autograd_fail(name):
    """Functional writes off (in place, as in decoding): autograd's version check fails."""
    model = _model(dict(CASES)[next(n for n in IDS if n.endswith(name))])
    ids, targets, _, _ = _batch(packed=False)
    cache = _cache(model)
    for r in (*cache._all(), *cache.books.values()):
        r.functional = False
    with pytest.raises(RuntimeError, match=r"inplace|in-place|modified"):
        _loss(run_segments(model, ids, seg_len=SEG, cache=cache), targets, None).backward()


TBPTT = [c for c in CASES if any(k in c[0] for k in ("ssm0", "linear1", "gated_conv0",
                                                     "softmax-alibi-w3", "ssm-gated"))]


@pytest.mark.parametrize("packed", [False, True], ids=["rows", "packed"])
@pytest.mark.parametrize("cfg", [c for _, c in TBPTT], ids=[n for n, _ in TBPTT])
def test_truncated_backprop_equals_earlier_segments_run_without_autograd(cfg, packed):
    """``detach()`` after every segment: the gradient of the summed loss equals the sum over
    segments k of ∂loss_k/∂θ with segments < k run under no_grad (constants); and differs
    from the untruncated gradient (the control)."""
    model = _model(cfg)
    ids, targets, valid, seg = _batch(packed)

    def part(x, cut):
        return None if x is None else x[:, cut]

    cache, loss = _cache(model), 0
    for s in range(0, L, SEG):
        cut = slice(s, s + SEG)
        out = run_segments(model, ids[:, cut], seg_len=SEG, cache=cache, valid=part(valid, cut),
                           segments=part(seg, cut))
        loss = loss + _loss(out, targets[:, cut], part(valid, cut))
        cache.detach()
    got = _grads(model, loss)
    want: dict[str, torch.Tensor] = {}
    for k in range(0, L, SEG):
        cache = _cache(model)
        with torch.no_grad():
            if k:
                run_segments(model, ids[:, :k], seg_len=SEG, cache=cache,
                             valid=part(valid, slice(0, k)), segments=part(seg, slice(0, k)))
        cut = slice(k, k + SEG)
        out = run_segments(model, ids[:, cut], seg_len=SEG, cache=cache, valid=part(valid, cut),
                           segments=part(seg, cut))
        for n, g in _grads(model, _loss(out, targets[:, cut], part(valid, cut))).items():
            want[n] = want[n] + g if n in want else g
    assert got.keys() == want.keys()
    for name in want:
        torch.testing.assert_close(got[name], want[name], atol=GRAD_ATOL, rtol=1e-4, msg=lambda m, name=name: f"{name}: {m}")
    full = _grads(model, _loss(run_segments(model, ids, seg_len=SEG, cache=_cache(model),
                                            valid=valid, segments=seg), targets, valid))
    with pytest.raises(AssertionError):  # the control: the untruncated gradient differs
        for name in want:
            torch.testing.assert_close(full[name], want[name], atol=GRAD_ATOL, rtol=1e-4)


def test_carry_cache_state_dict_round_trip_continues_exactly():
    """Two segments, save, load into a fresh carry cache, two more == four in one go; the
    cache's own bookkeeping (positions, last documents) travels with it."""
    cfg = dict(CASES)[next(n for n in IDS if n.endswith("ssm-gated_conv-softmax"))]
    model = _model(cfg)
    ids, _, valid, seg = _batch(packed=True)
    with torch.no_grad():
        whole = run_segments(model, ids, seg_len=SEG, cache=_cache(model), valid=valid,
                             segments=seg)
        first = _cache(model)
        run_segments(model, ids[:, :16], seg_len=SEG, cache=first, valid=valid[:, :16],
                     segments=seg[:, :16])
        second = _cache(model)
        second.load_state_dict(first.state_dict())
        rest = run_segments(model, ids[:, 16:], seg_len=SEG, cache=second,
                            valid=valid[:, 16:], segments=seg[:, 16:])
    assert torch.equal(rest[valid[:, 16:]], whole[:, 16:][valid[:, 16:]])


def test_carry_cache_refusals():
    model = _model(tiny(position=PositionConfig(name="rope")))
    with pytest.raises(ValueError, match="static"):
        model.new_cache(B, 16, carry=True, static=True)
    with pytest.raises(ValueError, match="capacity"):
        model.new_cache(B, None, carry=True)
    cache = model.new_cache(1, 10, carry=True)
    with pytest.raises(ValueError, match="cache full"):
        run_segments(model, torch.zeros(1, 16, dtype=torch.long), seg_len=8, cache=cache)
    with pytest.raises(ValueError, match="segments"):  # a plain decode cache refuses packing
        model(torch.zeros(1, 4, dtype=torch.long), segments=torch.zeros(1, 4, dtype=torch.long),
              cache=model.new_cache(1, 8))
