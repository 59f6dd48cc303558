"""BigBird's random blocks (``model.mixer.random_blocks``, ``block_size``, ``pattern_seed``;
docs/mixers.md "Attention patterns") against independent references: a per-query loop in
plain Python over the keys the rule allows (pattern_refs.py: document orders and the drawn
table read by hand), the dense mask of masks.py, full recompute for decoding. Negative
controls: the random keys dropped, a key listed for two query blocks of a band counted twice, a
causal draw that reaches a future block (the future then changes the past) — each caught.

The variant grid (variants.py ``PATTERNS``) adds random blocks to the family invariants
(future, padding, packing), cache == recompute, the static cache, ``select`` and compile."""

from __future__ import annotations

import pytest
import torch
from pattern_refs import case, decoded, keys_scored, naive, refusal, run, tiny_model
from variants import VOCAB

from blocklab.model import attention, random_blocks
from blocklab.model.attention import SoftmaxAttention
from blocklab.model.estimate import estimate, table
from blocklab.model.estimate import state_bytes as kv_cache_bytes

CASES = [
    ("w3-r2-s4", {"window": 3, "random_blocks": 2, "block_size": 4}),
    ("w3-r1-s2-sinks2", {"window": 3, "random_blocks": 1, "block_size": 2, "sinks": 2}),
    ("chunk4-r2-s4-global1", {"attention_chunk": 4, "random_blocks": 2, "block_size": 4,
                              "global_tokens": 1, "pattern_seed": 5}),
    ("w9-r2-s2", {"window": 9, "random_blocks": 2, "block_size": 2}),  # bands of 5 blocks
]


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "bidirectional"])
@pytest.mark.parametrize("options", [c for _, c in CASES], ids=[i for i, _ in CASES])
def test_blocked_random_blocks_equal_the_dense_mask_and_a_per_query_loop(causal, options,
                                                                         monkeypatch):
    """Blocks of whole random blocks over their band, sink and random keys give the dense
    mask's result and the per-query loop's (padding both sides, holes; packed documents take
    the dense path); without the random keys, or counting a key listed for two query blocks
    of a band twice, the result moves off."""
    torch.manual_seed(3)
    attn, x, valid, segments, _, seq_packed, seq_rows = case(causal, options, max_seq_len=32)
    rules = {"causal": causal, "window": options.get("window"),
             "chunk": options.get("attention_chunk"), "sinks": options.get("sinks", 0),
             "global_tokens": options.get("global_tokens", 0), "size": options["block_size"]}
    with torch.no_grad():
        monkeypatch.setattr(attention, "MIN_BLOCK", 10_000)
        dense = run(attn, x, seq_rows)
        packed = run(attn, x, seq_packed)
        for block in (1, 6):
            monkeypatch.setattr(attention, "MIN_BLOCK", block)
            assert 2 * attn.block < x.shape[1] and attn.block % options["block_size"] == 0
            torch.testing.assert_close(run(attn, x, seq_rows)[valid], dense[valid],
                                       atol=1e-5, rtol=0)
            torch.testing.assert_close(run(attn, x, seq_packed)[valid], packed[valid],
                                       atol=1e-5, rtol=0)
        want = naive(attn, x, valid, table=attn.random_table, **rules)
        want_packed = naive(attn, x, valid, segments, table=attn.random_table, **rules)
        dropped = naive(attn, x, valid, **rules)  # the random keys left out
        # a key listed for two query blocks of one band block, counted for each
        real = random_blocks.band_keys

        def twice(table, size, **kw):
            idx, fresh = real(table, size, **kw)
            kb = random_blocks.drawn(table, torch.arange(idx.shape[0] * kw["lay"].block // size))
            return idx, fresh | (kb.reshape(idx.shape[0], -1, 1) >= 0).expand(
                -1, -1, size).reshape(fresh.shape) & (idx >= kw["kept"])

        monkeypatch.setattr(random_blocks, "band_keys", twice)
        doubled = run(attn, x, seq_rows)
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
    attn, x, valid, _, _, _, seq_rows = case(causal, options, max_seq_len=32)
    seen = keys_scored(monkeypatch)
    with torch.no_grad():
        monkeypatch.setattr(attention, "MIN_BLOCK", 10_000)
        dense = run(attn, x, seq_rows)
        monkeypatch.setattr(attention, "MIN_BLOCK", 4)
        lay = attn.layout(packed=False)
        reach = 8 if causal else 4
        assert lay.block == 4 and lay.back == reach // 4 and lay.ahead == (0 if causal else 1)
        seen.clear()
        got = run(attn, x, seq_rows)
        assert seen == [lay.width + 1 + 2 * 4]  # band, one sink key, r · block_size
        monkeypatch.setattr(attention, "MIN_BLOCK", 8)  # blocks of two random blocks
        seen.clear()
        wide = run(attn, x, seq_rows)
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


def test_the_checkpoint_holds_the_drawn_pattern():
    """The table is a buffer: in the state_dict, and loading another seed's checkpoint
    brings its pattern (the outputs follow the table, not the config's seed)."""
    torch.manual_seed(8)
    options = {"window": 3, "random_blocks": 2, "block_size": 2}
    _, a = tiny_model(options)
    _, b = tiny_model({**options, "pattern_seed": 9})
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
    cfg, model = tiny_model({"window": 3, "random_blocks": 2, "block_size": 4, "sinks": 1})
    got, full, cache = decoded(model, torch.randint(0, VOCAB, (2, 48)), (17, 1, 1, 5, *(1,) * 24))
    torch.testing.assert_close(got, full, atol=1e-5, rtol=0)
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
    _, clean = tiny_model(options, n_layers=1)
    monkeypatch.setattr(random_blocks, "draw", lambda *a, **kw: torch.cat(
        (real(*a, **kw), torch.full((a[2], 1), 7)), 1))
    _, leaky = tiny_model(options, n_layers=1)
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
    msg = refusal(options)
    assert key in msg and words in msg, msg


def test_first_listed_marks_the_first_of_each_value_as_a_pairwise_scan_does():
    gen = torch.Generator().manual_seed(0)
    values = torch.randint(-1, 4, (50, 9), generator=gen)
    got = random_blocks.first_listed(values)
    for row, flags in zip(values.tolist(), got.tolist()):
        assert flags == [v not in row[:i] for i, v in enumerate(row)]
    assert not random_blocks.first_listed(torch.tensor([3, 3]))[1]  # a repeat is not first
