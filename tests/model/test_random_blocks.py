"""BigBird's random blocks (``model.mixer.random_blocks``, ``block_size``, ``pattern_seed``;
docs/mixers.md "Attention patterns") against independent references: a per-query loop in
plain Python over the keys the rule allows (document orders and the drawn table read by hand),
the dense mask of masks.py, full recompute for decoding. Negative controls: the random keys
dropped, a key listed for two query blocks of a band counted twice, a causal draw that reaches
a future block (the future then changes the past) — each caught.

The variant grid (variants.py ``PATTERNS``) adds random blocks to the family invariants
(future, padding, packing), cache == recompute, the static cache, ``select`` and compile."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from variants import VOCAB, tiny

from blocklab.config import ConfigError, MixerConfig, PositionConfig, validate_model
from blocklab.model import attention, build_model, random_blocks
from blocklab.model.attention import SoftmaxAttention
from blocklab.model.estimate import estimate, table
from blocklab.model.estimate import state_bytes as kv_cache_bytes
from blocklab.model.mixer import Sequence
from blocklab.model.position import NoPosition
from blocklab.model.transformer import default_positions

DEC, ENC = "decoder", "encoder"

CASES = [
    ("w3-r2-s4", {"window": 3, "random_blocks": 2, "block_size": 4}),
    ("w3-r1-s2-sinks2", {"window": 3, "random_blocks": 1, "block_size": 2, "sinks": 2}),
    ("chunk4-r2-s4-global1", {"attention_chunk": 4, "random_blocks": 2, "block_size": 4,
                              "global_tokens": 1, "pattern_seed": 5}),
    ("w9-r2-s2", {"window": 9, "random_blocks": 2, "block_size": 2}),  # bands of 5 blocks
]


def _case(causal: bool, options: dict, t: int = 29, layer: int = 0):
    """A layer with ``options`` (max_seq_len 32, so a bidirectional draw lands in the rows)
    and a batch: row 0 left-padded, row 1 with holes, row 2 right-padded, row 3 unpadded; the
    packed form splits row 3 into documents of 9, 12 and 8 tokens."""
    d, h = 16, 2
    cfg = validate_model(tiny(DEC if causal else ENC, PositionConfig(name="none"), d_model=d,
                              n_heads=h, max_seq_len=32,
                              mixer=MixerConfig(name="softmax", **options)))
    attn = SoftmaxAttention(cfg, layer, causal=causal).eval()
    torch.nn.init.normal_(attn.qkv.weight, std=0.5)
    x = torch.randn(4, t, d)
    valid = torch.ones(4, t, dtype=torch.bool)
    valid[0, :3] = False
    valid[1, [2, 5, 6]] = False
    valid[2, t - 4:] = False
    segments = torch.zeros(4, t, dtype=torch.long)
    segments[3, 9:] = 1
    segments[3, 21:] = 2
    scheme = NoPosition(cfg.position, d_model=d, d_head=d // h, n_heads=h, max_seq_len=32,
                        causal=causal)
    seqs = {}
    for name, seg in (("rows", None), ("packed", segments)):
        seqs[name] = Sequence(positions=default_positions(x, valid, seg), valid=valid,
                              segments=seg, causal=causal, position=scheme)
    return attn, x, valid, segments, seqs


def _naive(attn, x, valid, segments, table, *, causal, window=None, chunk=None, sinks=0,
           global_tokens=0, size=1, random=True):
    """Per query: the real keys of its document within the window (or its chunk), among its
    first ``max(sinks, global_tokens)``, every key for a global query, or in a block drawn
    for the query's block in ``table`` (rows past the table: none); causal: not after it."""
    b, t, _ = x.shape
    h, dh = attn.n_heads, attn.d_head
    q, k, v = (z.view(b, t, h, dh) for z in attn.qkv(x).split(h * dh, dim=-1))
    out = torch.zeros(b, t, h, dh)
    for r in range(b):
        order, doc, count, per_doc = [], [], 0, {}
        for j in range(t):
            s = int(segments[r, j])
            order.append(count)
            doc.append(per_doc.get(s, 0))
            if valid[r, j]:
                count += 1
                per_doc[s] = per_doc.get(s, 0) + 1
        for i in range(t):
            if not valid[r, i]:
                continue
            qb = doc[i] // size
            drawn = set(table[qb].tolist()) - {-1} if random and qb < len(table) else set()
            keys = []
            for j in range(t):
                if not valid[r, j] or segments[r, j] != segments[r, i]:
                    continue
                dist = order[i] - order[j]
                if causal and dist < 0:
                    continue
                if chunk is not None:
                    near = doc[i] // chunk == doc[j] // chunk
                else:
                    near = dist <= window - 1 if causal else abs(dist) <= (window - 1) // 2
                if (near or doc[j] < max(sinks, global_tokens) or doc[i] < global_tokens
                        or doc[j] // size in drawn):
                    keys.append(j)
            for hh in range(h):
                scores = torch.stack([(q[r, i, hh] * k[r, j, hh]).sum() * dh ** -0.5
                                      for j in keys])
                out[r, i, hh] = sum(w * v[r, j, hh] for w, j in zip(scores.softmax(-1), keys))
    return attn.out(out.flatten(2))


def _run(attn, x, seq):
    return attn(x, dataclasses.replace(seq, _memo={}), None)


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "bidirectional"])
@pytest.mark.parametrize("options", [c for _, c in CASES], ids=[i for i, _ in CASES])
def test_blocked_random_blocks_equal_the_dense_mask_and_a_per_query_loop(causal, options,
                                                                         monkeypatch):
    """Blocks of whole random blocks over their band, sink and random keys give the dense
    mask's result and the per-query loop's (padding both sides, holes; packed documents take
    the dense path); without the random keys, or counting a key listed for two query blocks
    of a band twice, the result moves off."""
    torch.manual_seed(3)
    attn, x, valid, segments, seqs = _case(causal, options)
    rules = {"causal": causal, "window": options.get("window"),
             "chunk": options.get("attention_chunk"), "sinks": options.get("sinks", 0),
             "global_tokens": options.get("global_tokens", 0), "size": options["block_size"]}
    rows = torch.zeros_like(segments)
    with torch.no_grad():
        monkeypatch.setattr(attention, "MIN_BLOCK", 10_000)
        dense = _run(attn, x, seqs["rows"])
        packed = _run(attn, x, seqs["packed"])
        for block in (1, 6):
            monkeypatch.setattr(attention, "MIN_BLOCK", block)
            assert 2 * attn.block < x.shape[1] and attn.block % options["block_size"] == 0
            torch.testing.assert_close(_run(attn, x, seqs["rows"])[valid], dense[valid],
                                       atol=1e-5, rtol=0)
            torch.testing.assert_close(_run(attn, x, seqs["packed"])[valid], packed[valid],
                                       atol=1e-5, rtol=0)
        want = _naive(attn, x, valid, rows, attn.random_table, **rules)
        want_packed = _naive(attn, x, valid, segments, attn.random_table, **rules)
        dropped = _naive(attn, x, valid, rows, attn.random_table, **rules, random=False)
        # a key listed for two query blocks of one band block, counted for each
        real = random_blocks.band_keys

        def twice(table, size, **kw):
            idx, fresh = real(table, size, **kw)
            kb = random_blocks.drawn(table, torch.arange(idx.shape[0] * kw["lay"].block // size))
            return idx, fresh | (kb.reshape(idx.shape[0], -1, 1) >= 0).expand(
                -1, -1, size).reshape(fresh.shape) & (idx >= kw["kept"])

        monkeypatch.setattr(random_blocks, "band_keys", twice)
        doubled = _run(attn, x, seqs["rows"])
    torch.testing.assert_close(dense[valid], want[valid], atol=1e-5, rtol=0)
    torch.testing.assert_close(packed[valid], want_packed[valid], atol=1e-5, rtol=0)
    assert not dense.isnan().any()
    assert not torch.allclose(dropped[valid], dense[valid], atol=1e-3)
    assert not torch.allclose(doubled[valid], dense[valid], atol=1e-3)


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "bidirectional"])
def test_each_query_block_scores_only_its_own_random_keys(causal, monkeypatch):
    """Query blocks of one random block each (``L = block_size`` when it is at least
    MIN_BLOCK) over as many neighbouring blocks as the window reaches: a query scores its
    band, its sinks and the ``r · block_size`` keys drawn for its own block — not the
    ``r · L`` of a longer band block — and the result is the dense mask's. The contrast:
    query blocks of two random blocks (each query scores the keys drawn for both, as the
    earlier layout did) equal it too, at twice the random keys."""
    torch.manual_seed(12)
    options = {"window": 9, "random_blocks": 2, "block_size": 4, "sinks": 1}
    attn, x, valid, _, seqs = _case(causal, options)
    seen, real = [], attention._sdpa
    monkeypatch.setattr(attention, "_sdpa", lambda lay, q, k, v, vis: (
        seen.append(k.shape[2]), real(lay, q, k, v, vis))[1])
    with torch.no_grad():
        monkeypatch.setattr(attention, "MIN_BLOCK", 10_000)
        dense = _run(attn, x, seqs["rows"])
        monkeypatch.setattr(attention, "MIN_BLOCK", 4)
        lay = attn.layout(packed=False)
        reach = 8 if causal else 4
        assert lay.block == 4 and lay.back == reach // 4 and lay.ahead == (0 if causal else 1)
        seen.clear()
        got = _run(attn, x, seqs["rows"])
        assert seen == [lay.width + 1 + 2 * 4]  # band, one sink key, r · block_size
        monkeypatch.setattr(attention, "MIN_BLOCK", 8)  # blocks of two random blocks
        seen.clear()
        wide = _run(attn, x, seqs["rows"])
        assert seen == [attn.layout(packed=False).width + 1 + 2 * 2 * 4]
    torch.testing.assert_close(got[valid], dense[valid], atol=1e-5, rtol=0)
    torch.testing.assert_close(wide[valid], dense[valid], atol=1e-5, rtol=0)


def test_the_draw_is_seeded_per_layer_and_causal_draws_reach_back_only():
    """The same seed and layer draw the same table; another layer or seed another; causal
    rows hold ``min(r, i)`` distinct earlier blocks, bidirectional ``r`` distinct others."""
    one = random_blocks.draw(0, 1, 20, 3, causal=True)
    assert torch.equal(one, random_blocks.draw(0, 1, 20, 3, causal=True))
    assert not torch.equal(one, random_blocks.draw(0, 2, 20, 3, causal=True))
    assert not torch.equal(one, random_blocks.draw(1, 1, 20, 3, causal=True))
    assert _reaches_back_only(one)
    both = random_blocks.draw(0, 1, 20, 3, causal=False)
    for i, row in enumerate(both.tolist()):
        assert len(set(row)) == 3 and i not in row and all(0 <= b < 20 for b in row)


def _model(options: dict, n_layers: int = 2, max_seq_len: int = 64):
    cfg = validate_model(tiny(DEC, PositionConfig(name="rope"), n_layers=n_layers,
                              max_seq_len=max_seq_len,
                              mixer=MixerConfig(name="softmax", **options)))
    return cfg, build_model(cfg).eval()


def test_the_checkpoint_holds_the_drawn_pattern():
    """The table is a buffer: in the state_dict, and loading another seed's checkpoint
    brings its pattern (the outputs follow the table, not the config's seed)."""
    torch.manual_seed(8)
    options = {"window": 3, "random_blocks": 2, "block_size": 2}
    _, a = _model(options)
    _, b = _model({**options, "pattern_seed": 9})
    tables = [k for k in a.state_dict() if k.endswith("random_table")]
    assert len(tables) == 2
    assert not torch.equal(a.state_dict()[tables[0]], b.state_dict()[tables[0]])
    ids = torch.randint(0, VOCAB, (2, 40))
    with torch.no_grad():
        before = a(ids)
        state = a.state_dict()
        for k in tables:
            state[k] = b.state_dict()[k]
        a.load_state_dict(state)
        after = a(ids)
        a.load_state_dict(b.state_dict())
        torch.testing.assert_close(a(ids), b(ids))
    assert not torch.allclose(before, after, atol=1e-4)


def test_cached_decoding_equals_the_full_forward_and_the_state_is_priced(monkeypatch):
    """A banded prefill, then tokens one at a time and in a chunk: the full forward's logits;
    the state keeps every key (a random block may be anywhere in the past), as priced."""
    monkeypatch.setattr(attention, "MIN_BLOCK", 4)
    torch.manual_seed(6)
    cfg, model = _model({"window": 3, "random_blocks": 2, "block_size": 4, "sinks": 1})
    ids = torch.randint(0, VOCAB, (2, 48))
    with torch.no_grad():
        full = model(ids)
        cache = model.new_cache(2, 48)
        start = 0
        for size in (17, 1, 1, 5, *(1,) * 24):
            pos = torch.arange(start, start + size)[None].expand(2, -1)
            logits = model.decode(ids[:, start:start + size], positions=pos, valid=None,
                                  cache=cache)
            torch.testing.assert_close(logits, full[:, start:start + size], atol=1e-5, rtol=0)
            start += size
    assert kv_cache_bytes(cfg, 2, 48, 4) == cache.nbytes
    assert kv_cache_bytes(cfg, 2, 4000, 4) > 50 * kv_cache_bytes(cfg, 2, 48, 4)
    keys = [SoftmaxAttention.score_keys(cfg, 0, seq_len=n) for n in (8, 10 ** 6)]
    assert keys == [8, 3 + 1 + 2 * 4]
    shown = table(cfg, estimate(cfg, batch=1, seq_len=64, bytes_per_value=4), batch=1,
                  seq_len=64, bytes_per_value=4)
    assert "2 random blocks of 4" in shown and "random blocks" in shown


def _reaches_back_only(table) -> bool:
    """Each causal row ``i`` holds ``min(r, i)`` distinct blocks of ``[0, i)``."""
    for i, row in enumerate(table.tolist()):
        picked = [b for b in row if b >= 0]
        if not (len(picked) == len(set(picked)) == min(len(row), i) and all(
                b < i for b in picked)):
            return False
    return True


def test_a_causal_draw_from_the_future_is_caught_and_masked_anyway(monkeypatch):
    """Negative control of the draw check: a table reaching a later block fails it. And a
    second line of defence: built into a decoder, such a table still leaks nothing (the
    causal order rule masks the future block), while the same table shows that block to the
    later query blocks (the key is used where it is allowed)."""
    real = random_blocks.draw
    assert _reaches_back_only(real(3, 0, 16, 2, causal=True))
    future = torch.cat((real(3, 0, 16, 1, causal=True), torch.full((16, 1), 7)), 1)
    assert not _reaches_back_only(future)
    torch.manual_seed(9)
    ids = torch.randint(0, VOCAB, (1, 48))
    changed = ids.clone()
    changed[0, 30] = (ids[0, 30] + 1) % VOCAB  # block 7 (tokens 28..31)
    options = {"window": 3, "random_blocks": 1, "block_size": 4}
    _, clean = _model(options, n_layers=1)
    monkeypatch.setattr(random_blocks, "draw", lambda *a, **kw: torch.cat(
        (real(*a, **kw), torch.full((a[2], 1), 7)), 1))
    _, leaky = _model(options, n_layers=1)
    leaky.load_state_dict({k: v for k, v in clean.state_dict().items()
                           if not k.endswith("random_table")}, strict=False)
    with torch.no_grad():
        assert torch.equal(leaky(ids)[0, :28], leaky(changed)[0, :28])
        assert not torch.allclose(leaky(ids)[0, 36:], clean(ids)[0, 36:], atol=1e-4)


@pytest.mark.parametrize(("options", "key", "words"), [
    ({"random_blocks": 2}, "model.mixer.random_blocks=2", "needs model.mixer.window"),
    ({"window": 3, "random_blocks": -1}, "model.mixer.random_blocks=-1", "integer >= 0"),
    ({"window": 3, "random_blocks": 1, "block_size": 0}, "model.mixer.block_size=0",
     "integer >= 1"),
])
def test_bad_random_blocks_fail_in_one_line(options, key, words):
    with pytest.raises(ConfigError) as err:
        validate_model(tiny(DEC, mixer=MixerConfig(name="softmax", **options)))
    msg = str(err.value)
    assert "\n" not in msg and key in msg and words in msg, msg


def test_first_listed_marks_the_first_of_each_value_as_a_pairwise_scan_does():
    gen = torch.Generator().manual_seed(0)
    values = torch.randint(-1, 4, (50, 9), generator=gen)
    got = random_blocks.first_listed(values)
    for row, flags in zip(values.tolist(), got.tolist()):
        assert flags == [v not in row[:i] for i, v in enumerate(row)]
    assert not random_blocks.first_listed(torch.tensor([3, 3]))[1]  # a repeat is not first
