"""Tokens marked global by id (``model.mixer.global_token_id``; docs/mixers.md "Attention
patterns"): Longformer's global attention on tokens marked in the data, beside a window or
chunk. Against independent references: a per-query loop in plain Python (the marks read from
the ids by hand), full recompute for decoding (dynamic and fixed-shape caches). Negative
controls: the marks ignored, marked queries seeing only their window, a decode state that
forgets the marks of earlier keys — each caught.

The variant grid (variants.py ``PATTERNS``) adds a marked id to the family invariants (future,
padding, packing), cache == recompute, the static cache, ``select`` and compile."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from variants import VOCAB, tiny

from blocklab.config import ConfigError, MixerConfig, PositionConfig, validate_model
from blocklab.model import attention, bands, build_model, kv
from blocklab.model.attention import SoftmaxAttention
from blocklab.model.estimate import estimate, table
from blocklab.model.estimate import state_bytes as kv_cache_bytes
from blocklab.model.mixer import Sequence
from blocklab.model.position import NoPosition
from blocklab.model.transformer import default_positions

DEC, ENC = "decoder", "encoder"


def _case(causal: bool, options: dict, t: int = 29):
    """A layer and a batch: row 0 left-padded, row 1 with holes, row 2 right-padded, row 3
    packed (documents of 9, 12 and 8 tokens); a few marked tokens per row, some on padding."""
    d, h = 16, 2
    cfg = validate_model(tiny(DEC if causal else ENC, PositionConfig(name="none"), d_model=d,
                              n_heads=h, mixer=MixerConfig(name="softmax", **options)))
    attn = SoftmaxAttention(cfg, 0, causal=causal).eval()
    torch.nn.init.normal_(attn.qkv.weight, std=0.5)
    x = torch.randn(4, t, d)
    valid = torch.ones(4, t, dtype=torch.bool)
    valid[0, :3] = False
    valid[1, [2, 5, 6]] = False
    valid[2, t - 4:] = False
    segments = torch.zeros(4, t, dtype=torch.long)
    segments[3, 9:] = 1
    segments[3, 21:] = 2
    marked = torch.zeros(4, t, dtype=torch.bool)
    marked[0, [1, 7, 20]] = True  # 1: padding
    marked[1, [5, 14]] = True  # 5: a hole
    marked[2, [10, 26]] = True  # 26: right padding
    marked[3, [4, 13, 24]] = True  # one per document
    scheme = NoPosition(cfg.position, d_model=d, d_head=d // h, n_heads=h, max_seq_len=64,
                        causal=causal)
    seq = Sequence(positions=default_positions(x, valid, segments), valid=valid,
                   segments=segments, causal=causal, position=scheme, marked=marked)
    return attn, x, valid, segments, marked, seq


def _naive(attn, x, valid, segments, marked, *, causal, window=None, chunk=None,
           keys_marked=True, queries_marked=True):
    """Per query: the real keys of its document within its window (or chunk), the marked keys
    of it, every key of it for a marked query; causal: not after it."""
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
                if (near or (keys_marked and bool(marked[r, j]))
                        or (queries_marked and bool(marked[r, i]))):
                    keys.append(j)
            for hh in range(h):
                scores = torch.stack([(q[r, i, hh] * k[r, j, hh]).sum() * dh ** -0.5
                                      for j in keys])
                out[r, i, hh] = sum(w * v[r, j, hh] for w, j in zip(scores.softmax(-1), keys))
    return attn.out(out.flatten(2))


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
    attn, x, valid, segments, marked, seq = _case(causal, {**options, "global_token_id": 7})
    rules = {"causal": causal, "window": options.get("window"),
             "chunk": options.get("attention_chunk")}
    run = SoftmaxAttention.forward
    with torch.no_grad():
        monkeypatch.setattr(attention, "MIN_BLOCK", 10_000)
        got = run(attn, x, dataclasses.replace(seq, _memo={}), None)
        for block in (1, 6):
            monkeypatch.setattr(attention, "MIN_BLOCK", block)
            assert 2 * attn.block < x.shape[1]  # the banded path
            blocked = run(attn, x, dataclasses.replace(seq, _memo={}), None)
            torch.testing.assert_close(blocked[valid], got[valid], atol=1e-5, rtol=0)
        keys = bands.marked_keys
        monkeypatch.setattr(bands, "marked_keys", lambda *a, **kw: (
            keys(*a, **kw)[0], keys(*a, **kw)[1] & False))
        no_extra = run(attn, x, dataclasses.replace(seq, _memo={}), None)
        monkeypatch.setattr(bands, "marked_keys", keys)
        monkeypatch.setattr(SoftmaxAttention, "_global_rows", lambda self, o, *a: o)
        no_pass = run(attn, x, dataclasses.replace(seq, _memo={}), None)
        want = _naive(attn, x, valid, segments, marked, **rules)
        no_keys = _naive(attn, x, valid, segments, marked, **rules, keys_marked=False)
        no_queries = _naive(attn, x, valid, segments, marked, **rules, queries_marked=False)
        unmarked = attn(x, dataclasses.replace(seq, marked=None, _memo={}), None)
    torch.testing.assert_close(got[valid], want[valid], atol=1e-5, rtol=0)
    assert not got.isnan().any()
    for wrong in (no_keys, no_queries, unmarked, no_extra, no_pass):
        assert not torch.allclose(wrong[valid], got[valid], atol=1e-3)


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "bidirectional"])
def test_marked_tokens_beside_random_blocks_blocked_equals_dense(causal, monkeypatch):
    """A marked key that is also a drawn random key is counted once (blocked == dense)."""
    torch.manual_seed(4)
    attn, x, valid, _, _, seq = _case(causal, {
        "window": 3, "global_token_id": 7, "random_blocks": 2, "block_size": 2})
    rows = dataclasses.replace(seq, segments=None,
                               positions=default_positions(x, valid, None))
    with torch.no_grad():
        monkeypatch.setattr(attention, "MIN_BLOCK", 10_000)
        dense = attn(x, dataclasses.replace(rows, _memo={}), None)
        monkeypatch.setattr(attention, "MIN_BLOCK", 4)
        blocked = attn(x, dataclasses.replace(rows, _memo={}), None)
    torch.testing.assert_close(blocked[valid], dense[valid], atol=1e-5, rtol=0)


def _model(options: dict, family: str = DEC):
    cfg = validate_model(tiny(family, PositionConfig(name="rope"), n_layers=2, max_seq_len=64,
                              mixer=MixerConfig(name="softmax", **options)))
    return cfg, build_model(cfg).eval()


def test_the_model_marks_tokens_by_id_far_past_the_window():
    """A marked token far before the window is seen by the last query (its id changed to the
    marked one moves the last logits); an unmarked change there does not."""
    torch.manual_seed(7)
    _, model = _model({"window": 3, "global_token_id": 5})
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
    cfg, model = _model({"window": 3, "global_token_id": 5})
    ids = torch.randint(6, VOCAB, (2, 40))
    ids[0, [3, 19, 27]] = 5
    ids[1, [8, 22]] = 5

    def run():
        cache = model.new_cache(2, 40, static=static)
        out, start = [], 0
        for size in (9, 1, 1, 5, *(1,) * 24):
            pos = torch.arange(start, start + size)[None].expand(2, -1)
            out.append(model.decode(ids[:, start:start + size], positions=pos, valid=None,
                                    cache=cache))
            start += size
        return torch.cat(out, 1), cache

    with torch.no_grad():
        full = model(ids)
        got, cache = run()
        torch.testing.assert_close(got, full, atol=1e-5, rtol=0)
        if not static:
            assert kv_cache_bytes(cfg, 2, 40, 4) == cache.nbytes
        state = kv.FixedKVState if static else kv.KVState
        forget = state.write_marks
        monkeypatch.setattr(state, "write_marks",
                            lambda self, book, m: forget(self, book, m) & False)
        wrong, _ = run()
    assert not torch.allclose(wrong, full, atol=1e-3)


def test_the_estimator_prices_and_names_marked_tokens():
    cfg, _ = _model({"window": 3, "global_token_id": 5})
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
    with pytest.raises(ConfigError) as err:
        validate_model(tiny(DEC, mixer=MixerConfig(name="softmax", **options)))
    msg = str(err.value)
    assert "\n" not in msg and key in msg and words in msg, msg
