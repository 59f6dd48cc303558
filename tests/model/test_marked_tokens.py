"""Tokens marked global by id (``model.mixer.global_token_id``; docs/mixers.md "Attention
patterns"): Longformer's global attention on tokens marked in the data, beside a window or
chunk. Against independent references: a per-query loop in plain Python (pattern_refs.py; the
marks read by hand), full recompute for decoding (dynamic and fixed-shape caches). Negative
controls: the marks ignored, marked queries seeing only their window, a decode state that
forgets the marks of earlier keys — each caught.

The variant grid (variants.py ``PATTERNS``) adds a marked id to the family invariants (future,
padding, packing), cache == recompute, the static cache, ``select`` and compile."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from pattern_refs import case, decoded, naive, refusal, run, tiny_model
from variants import VOCAB

from blocklab.model import attention, bands, kv
from blocklab.model.attention import SoftmaxAttention
from blocklab.model.estimate import estimate, table
from blocklab.model.estimate import state_bytes as kv_cache_bytes


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "bidirectional"])
@pytest.mark.parametrize("options", [{"window": 3}, {"attention_chunk": 4}],
                         ids=["w3", "chunk4"])
def test_marked_tokens_equal_a_per_query_loop(causal, options, monkeypatch):
    """Marked keys seen by every query of their document, marked queries seeing all of it
    (causal: its past), padding on both sides and packing; marks on padding count for
    nothing. Blocked (marked keys as each block's extra keys, marked queries in a dense pass)
    == dense == the loop. Without the marks as keys, or as queries, the loop moves off; the
    blocked result without the extra keys, or without the dense pass, moves off the dense."""
    torch.manual_seed(3)
    attn, x, valid, segments, marked, seq, _ = case(
        causal, {**options, "global_token_id": 7}, max_seq_len=64, marks=True)
    rules = {"causal": causal, "window": options.get("window"),
             "chunk": options.get("attention_chunk"), "marked": marked}
    with torch.no_grad():
        monkeypatch.setattr(attention, "MIN_BLOCK", 10_000)
        got = run(attn, x, seq)
        for block in (1, 6):
            monkeypatch.setattr(attention, "MIN_BLOCK", block)
            assert 2 * attn.block < x.shape[1]  # the banded path
            torch.testing.assert_close(run(attn, x, seq)[valid], got[valid], atol=1e-5, rtol=0)
        keys = bands.marked_keys
        monkeypatch.setattr(bands, "marked_keys", lambda *a, **kw: (
            keys(*a, **kw)[0], keys(*a, **kw)[1] & False))
        no_extra = run(attn, x, seq)
        monkeypatch.setattr(bands, "marked_keys", keys)
        monkeypatch.setattr(SoftmaxAttention, "_global_rows", lambda self, o, *a: o)
        no_pass = run(attn, x, seq)
        want = naive(attn, x, valid, segments, **rules)
        no_keys = naive(attn, x, valid, segments, **rules, keys_marked=False)
        no_queries = naive(attn, x, valid, segments, **rules, queries_marked=False)
        unmarked = run(attn, x, dataclasses.replace(seq, marked=None))
    torch.testing.assert_close(got[valid], want[valid], atol=1e-5, rtol=0)
    assert not got.isnan().any()
    for wrong in (no_keys, no_queries, unmarked, no_extra, no_pass):
        assert not torch.allclose(wrong[valid], got[valid], atol=1e-3)


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "bidirectional"])
def test_marked_tokens_beside_random_blocks_blocked_equals_dense(causal, monkeypatch):
    """A marked key that is also a drawn random key is counted once (blocked == dense)."""
    torch.manual_seed(4)
    attn, x, valid, _, _, _, rows = case(causal, {
        "window": 3, "global_token_id": 7, "random_blocks": 2, "block_size": 2}, max_seq_len=64,
        marks=True)
    with torch.no_grad():
        monkeypatch.setattr(attention, "MIN_BLOCK", 10_000)
        dense = run(attn, x, rows)
        monkeypatch.setattr(attention, "MIN_BLOCK", 4)
        blocked = run(attn, x, rows)
    torch.testing.assert_close(blocked[valid], dense[valid], atol=1e-5, rtol=0)


def test_the_model_marks_tokens_by_id_far_past_the_window():
    """A marked token far before the window is seen by the last query (its id changed to the
    marked one moves the last logits); an unmarked change there does not."""
    torch.manual_seed(7)
    _, model = tiny_model({"window": 3, "global_token_id": 5})
    ids = torch.randint(6, VOCAB, (1, 30))  # no 5 in the row
    marked, other = ids.clone(), ids.clone()
    marked[0, 2], other[0, 2] = 5, 6 if ids[0, 2] != 6 else 7
    with torch.no_grad():
        base = model(ids)[0, -1]
        assert not torch.allclose(model(marked)[0, -1], base, atol=1e-5)
        assert torch.equal(model(other)[0, -1], base)


@pytest.mark.parametrize("static", [False, True], ids=["dynamic", "static"])
def test_cached_decoding_equals_the_full_forward(static, monkeypatch):
    """Prefill, then tokens one at a time and in a chunk, marked tokens among them: the full
    forward's logits; the state (every key and its mark) is priced; a state that forgets the
    marks of earlier keys is caught. The dynamic cache's prefill is banded."""
    monkeypatch.setattr(attention, "MIN_BLOCK", 2)
    torch.manual_seed(6)
    cfg, model = tiny_model({"window": 3, "global_token_id": 5})
    ids = torch.randint(6, VOCAB, (2, 40))
    ids[0, [3, 19, 27]] = 5
    ids[1, [8, 22]] = 5
    sizes = (9, 1, 1, 5, *(1,) * 24)
    got, full, cache = decoded(model, ids, sizes, static=static)
    torch.testing.assert_close(got, full, atol=1e-5, rtol=0)
    if not static:
        assert kv_cache_bytes(cfg, 2, 40, 4) == cache.nbytes
    state = kv.FixedKVState if static else kv.KVState
    forget = state.write_marks
    monkeypatch.setattr(state, "write_marks", lambda self, book, m: forget(self, book, m) & False)
    wrong, _, _ = decoded(model, ids, sizes, static=static)
    assert not torch.allclose(wrong, full, atol=1e-3)


def test_the_estimator_prices_and_names_marked_tokens():
    cfg, _ = tiny_model({"window": 3, "global_token_id": 5})
    assert SoftmaxAttention.score_keys(cfg, 0, seq_len=50) == 3  # marked keys: the data's
    small, big = (kv_cache_bytes(cfg, 1, n, 4) for n in (64, 6400))
    assert big == 100 * small
    shown = table(cfg, estimate(cfg, batch=1, seq_len=64, bytes_per_value=4), batch=1,
                  seq_len=64, bytes_per_value=4)
    assert "every token of id 5" in shown and "token 5 global" in shown


@pytest.mark.parametrize(("options", "key", "words"), [
    ({"global_token_id": 3}, "model.mixer.global_token_id=3", "needs model.mixer.window"),
    ({"window": 3, "global_token_id": -1}, "model.mixer.global_token_id=-1", "token id >= 0"),
    ({"window": 3, "global_token_id": VOCAB}, f"model.mixer.global_token_id={VOCAB}",
     f"< model.vocab_size={VOCAB}"),
])
def test_bad_marked_ids_fail_in_one_line(options, key, words):
    msg = refusal(options)
    assert key in msg and words in msg, msg
