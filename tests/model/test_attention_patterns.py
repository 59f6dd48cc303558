"""Softmax attention patterns (``model.mixer.sinks``, ``learned_sink``, ``attention_chunk``,
``global_rope``, ``global_temperature``; docs/mixers.md "Attention patterns") against
independent references: a per-query loop in plain Python over exactly the keys the rules allow
(pattern_refs.py: document orders counted by hand), the dense mask of masks.py over all
pairs, and full recompute for the decode states (a banded prefill followed by decoding far past
the window or chunk). Each reference comes with negative controls — a pattern broken on purpose (sink keys
dropped or counted twice, a chunk that sees the previous one, no sink logit) — that the test
tells apart.

The variant grid (variants.py ``PATTERNS``) adds the patterns to the family invariants (future,
padding, packing), cache == recompute, the static cache, ``select`` and compile."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from pattern_refs import (
    DEC,
    ENC,
    case,
    decoded,
    keys_scored,
    naive,
    refusal,
    run,
    tiny_model,
)
from variants import VOCAB, tiny

from blocklab.config import ConfigError, MixerConfig, PositionConfig, validate_model
from blocklab.model import attention, bands, masks
from blocklab.model.attention import SoftmaxAttention
from blocklab.model.estimate import estimate, table
from blocklab.model.estimate import state_bytes as kv_cache_bytes
from blocklab.model.mixer import Sequence
from blocklab.model.patterns import query_temperature
from blocklab.model.transformer import default_positions

#: (id, softmax options) of the layer-level cases; windows odd, so encoders take them too
CASES = [
    ("w3-sinks2", {"window": 3, "sinks": 2}),
    ("w5-sinks4-learned", {"window": 5, "sinks": 4, "learned_sink": True}),
    ("w3-learned", {"window": 3, "learned_sink": True}),
    ("chunk4", {"attention_chunk": 4}),
    ("chunk5-sinks2", {"attention_chunk": 5, "sinks": 2}),
    ("w3-global2", {"window": 3, "global_tokens": 2}),
    ("chunk4-global1-sinks3-learned", {"attention_chunk": 4, "global_tokens": 1, "sinks": 3,
                                       "learned_sink": True}),
]


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "bidirectional"])
@pytest.mark.parametrize("options", [c for _, c in CASES], ids=[i for i, _ in CASES])
def test_blocked_pattern_equals_the_dense_mask_and_a_per_query_loop(causal, options,
                                                                    monkeypatch):
    """Blocks of L queries over their band and sink keys (cost T·(L + n)) give the dense
    mask's result and the per-query loop's, at two block sizes; left, right and inner padding,
    packed documents, an odd length."""
    torch.manual_seed(3)
    attn, x, valid, segments, _, seq, _ = case(causal, options)
    window, _, chunk = masks.unpack(attn.window)
    sinks, g = options.get("sinks", 0), options.get("global_tokens", 0)
    with torch.no_grad():
        monkeypatch.setattr(attention, "MIN_BLOCK", 10_000)
        assert 2 * attn.block > x.shape[1]  # the dense path
        dense = run(attn, x, seq)
        for block in (1, 6):
            monkeypatch.setattr(attention, "MIN_BLOCK", block)
            assert 2 * attn.block < x.shape[1]  # the banded path
            banded = run(attn, x, seq)
            torch.testing.assert_close(banded[valid], dense[valid], atol=1e-5, rtol=0)
        want = naive(attn, x, valid, segments, window=window, sinks=sinks, chunk=chunk,
                      causal=causal, global_tokens=g)
    torch.testing.assert_close(dense[valid], want[valid], atol=1e-5, rtol=0)
    assert not dense.isnan().any()  # padding queries included
    # negative controls: the loop tells a pattern from its broken forms
    with torch.no_grad():
        broken = []
        rules = {"window": window, "sinks": sinks, "chunk": chunk, "causal": causal,
                 "global_tokens": g}
        if sinks or g:  # the sinks / global keys dropped
            broken.append(naive(attn, x, valid, segments, **{**rules, "sinks": 0,
                                                               "global_tokens": 0}))
        if chunk is not None:
            broken.append(naive(attn, x, valid, segments, **rules, prev_chunk=True))
        if attn.sink is not None:
            broken.append(naive(attn, x, valid, segments, **rules, learned=False))
        if g and not causal:
            broken.append(naive(attn, x, valid, segments, **rules, global_rows=False))
    assert broken
    for wrong in broken:
        assert not torch.allclose(wrong[valid], dense[valid], atol=1e-3)


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "bidirectional"])
@pytest.mark.parametrize("fault", ["drop_sinks", "count_twice"])
def test_blocked_sinks_negative_controls_are_caught(causal, fault, monkeypatch):
    """The band's sink keys matter: dropping them, or counting a sink already inside the band
    a second time, moves the blocked result off the dense mask's."""
    torch.manual_seed(4)
    attn, x, valid, _, _, seq, _ = case(causal, {"window": 3, "sinks": 2})
    with torch.no_grad():
        monkeypatch.setattr(attention, "MIN_BLOCK", 10_000)
        dense = run(attn, x, seq)
        monkeypatch.setattr(attention, "MIN_BLOCK", 6)
        if fault == "drop_sinks":
            real_of = bands.Band.of
            monkeypatch.setattr(bands.Band, "of", staticmethod(
                lambda *a, **kw: real_of(*a, **{**kw, "sinks": 0})))
        else:
            monkeypatch.setattr(bands.Band, "valid", lambda self, real: self.keys(real, False))
        wrong = run(attn, x, seq)
    assert not torch.allclose(wrong[valid], dense[valid], atol=1e-3)


def test_blocked_global_queries_negative_control_is_caught(monkeypatch):
    """An encoder's global queries need their dense pass: without it (banded rows only) the
    blocked result leaves the dense mask's; causal global tokens are sinks, no pass needed."""
    torch.manual_seed(4)
    attn, x, valid, _, _, seq, _ = case(False, {"window": 3, "global_tokens": 2})
    with torch.no_grad():
        unpacked = dataclasses.replace(seq, segments=None)  # G = global_tokens, no count read
        monkeypatch.setattr(attention, "MIN_BLOCK", 10_000)
        dense, dense_unpacked = run(attn, x, seq), run(attn, x, unpacked)
        monkeypatch.setattr(attention, "MIN_BLOCK", 6)
        torch.testing.assert_close(run(attn, x, unpacked)[valid], dense_unpacked[valid],
                                   atol=1e-5, rtol=0)
        monkeypatch.setattr(SoftmaxAttention, "_global_rows", lambda self, o, *a: o)
        wrong = run(attn, x, seq)
    assert not torch.allclose(wrong[valid], dense[valid], atol=1e-3)
    causal = masks.Pattern(window=3, global_tokens=2)
    order = torch.arange(12)[None]
    same = masks.window_allowed(order, order, causal, causal=True)
    sinks = masks.window_allowed(order, order, masks.Pattern(window=3, sinks=2), causal=True)
    assert torch.equal(same, sinks)


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "bidirectional"])
@pytest.mark.parametrize("options", [
    {"attention_chunk": 4}, {"attention_chunk": 5, "sinks": 2},
    {"attention_chunk": 4, "global_tokens": 1, "sinks": 3}], ids=["c4", "c5-sinks2", "c4-g1-s3"])
def test_chunked_rows_of_one_document_take_blocks_aligned_with_the_chunks(causal, options,
                                                                         monkeypatch):
    """Rows of one document each (left, right and inner padding: compacted, the document
    begins at slot 0): blocks of whole chunks over their own block alone (K = L, plus the
    sink keys), equal to the dense mask and the per-query loop; packed rows whose documents
    begin off the chunk grid (slots 0-2, 3-12, 13-28; row 0 with 3 pads first, row 1 with
    holes and a document from slot 9) take the window's layout and equal them too. Negative
    control: the aligned layout forced on those packed rows leaves the dense result (a chunk
    of a misaligned document spans two blocks)."""
    torch.manual_seed(11)
    attn, x, valid, _, _, seq, _ = case(causal, options)
    chunk, kept = options["attention_chunk"], max(options.get("sinks", 0),
                                                  options.get("global_tokens", 0))
    rows = dataclasses.replace(seq, segments=None,
                               positions=default_positions(x, valid, None))
    segments = torch.zeros_like(valid, dtype=torch.long)
    segments[:, 3:], segments[:, 13:] = 1, 2  # documents of 3, 10 and 16 tokens
    segments[0, :9], segments[1, 9:] = 0, 3  # slots: row 0 3 pads, 6, 4, 16; row 1 3, 6, 20
    packed = dataclasses.replace(seq, segments=segments,
                                 positions=default_positions(x, valid, segments))
    rule = {"chunk": chunk, "sinks": options.get("sinks", 0), "causal": causal,
            "global_tokens": options.get("global_tokens", 0)}
    with torch.no_grad():
        monkeypatch.setattr(attention, "MIN_BLOCK", 10_000)
        dense_rows, dense_packed = run(attn, x, rows), run(attn, x, packed)
        scored = keys_scored(monkeypatch)
        for block in (1, 6):
            monkeypatch.setattr(attention, "MIN_BLOCK", block)
            lay = attn.layout(packed=False)
            assert (lay.back, lay.ahead, lay.block % chunk) == (0, 0, 0)
            assert lay.block == chunk * -(-max(block, kept) // chunk)
            assert 2 * attn.block < x.shape[1]  # the banded path
            scored.clear()
            got = run(attn, x, rows)
            assert scored[0] == lay.block + kept  # its own block and the sink keys
            torch.testing.assert_close(got[valid], dense_rows[valid], atol=1e-5, rtol=0)
            assert attn.layout(packed=True).back == 1
            torch.testing.assert_close(run(attn, x, packed)[valid], dense_packed[valid],
                                       atol=1e-5, rtol=0)
        want_rows = naive(attn, x, valid, torch.zeros_like(segments), **rule)
        want_packed = naive(attn, x, valid, segments, **rule)
        monkeypatch.setattr(attention.bands, "layout", lambda *a, **kw: attention.bands.Layout(
            chunk * -(-max(6, kept) // chunk), 0, 0))  # aligned, packed or not
        wrong = run(attn, x, packed)
    torch.testing.assert_close(dense_rows[valid], want_rows[valid], atol=1e-5, rtol=0)
    torch.testing.assert_close(dense_packed[valid], want_packed[valid], atol=1e-5, rtol=0)
    assert not torch.allclose(wrong[valid], dense_packed[valid], atol=1e-3)


def test_a_learned_sink_trains_and_absorbs_attention():
    """The sink logits get gradients (through the additive score column), a large logit
    draws the output towards zero (the sink's value), and padding queries stay finite."""
    torch.manual_seed(5)
    attn, x, valid, _, _, seq, _ = case(True, {"window": 3, "learned_sink": True})
    attn.train()
    run(attn, x, seq)[valid].square().sum().backward()
    assert attn.sink.grad is not None and attn.sink.grad.abs().min() > 0
    attn.eval()
    with torch.no_grad():
        attn.sink.data.fill_(30.0)
        absorbed = run(attn, x, seq)
    bias = attn.out.bias if attn.out.bias is not None else torch.zeros(1)
    torch.testing.assert_close(absorbed, bias.expand_as(absorbed), atol=1e-6, rtol=0)


# ------------------------------------------------------------------------------ decode states


@pytest.mark.parametrize("options", [
    {"window": 3, "sinks": 2}, {"window": 4, "sinks": 3, "learned_sink": True},
    {"attention_chunk": 4, "global_every": 2, "global_rope": False, "global_temperature": 0.3,
     "temperature_floor": 8},
    {"attention_chunk": 5, "sinks": 1}], ids=["w3s2", "w4s3-learned", "chunk4-nope", "c5s1"])
def test_banded_prefill_then_decoding_far_past_the_window_equals_full_recompute(
        options, monkeypatch):
    """A banded prefill (the ring keeps its sinks and last keys), then tokens one at a time
    and in a chunk, far past the window, chunk and temperature floor: the logits of the full
    sequence; the state stays as large as the window + sinks (or chunk) asks."""
    monkeypatch.setattr(attention, "MIN_BLOCK", 4)
    torch.manual_seed(6)
    cfg, model = tiny_model(options, max_seq_len=256)
    got, full, cache = decoded(model, torch.randint(0, VOCAB, (2, 40)), (17, 1, 1, 5, *(1,) * 16))
    torch.testing.assert_close(got, full, atol=1e-5, rtol=0)
    assert kv_cache_bytes(cfg, 2, 40, 4) == cache.nbytes


def test_sink_decode_state_is_bounded_and_priced():
    """Sinks + window: the ring holds ``sinks + window - 1`` slots whatever the capacity, and
    the estimator's bytes are the real cache's, constant in the context."""
    cfg, model = tiny_model({"window": 5, "sinks": 4}, max_seq_len=256)
    small, big = model.new_cache(3, 40), model.new_cache(3, 4000)
    assert small.nbytes == big.nbytes == 2 * 2 * 3 * cfg.kv_heads * cfg.head_dim * 4 * (4 + 4)
    assert list(big.books) == [("ring", 4, 4)]
    assert kv_cache_bytes(cfg, 3, 4000, 4) == big.nbytes == kv_cache_bytes(cfg, 3, 10 ** 6, 4)
    chunked, _ = tiny_model({"attention_chunk": 8, "global_every": 2}, max_seq_len=256)
    local, full = (SoftmaxAttention.state_bytes(chunked, i, batch=1, seq_len=10 ** 6,
                                                bytes_per_value=2) for i in (0, 1))
    assert local == 2 * 7 * chunked.kv_heads * chunked.head_dim * 2 and full > 1000 * local
    shown = table(cfg, estimate(cfg, batch=1, seq_len=64, bytes_per_value=4), batch=1,
                  seq_len=64, bytes_per_value=4)
    assert "first 4 tokens of each document" in shown and "window 5, 4 sinks" in shown


def test_sinks_change_what_a_decoder_decodes_past_the_window():
    """The sinks are seen: far past the window, changing the first token changes the last
    logits with sinks and leaves them bit-identical without (one local layer)."""
    torch.manual_seed(7)
    ids = torch.randint(0, VOCAB, (1, 30))
    changed = ids.clone()
    changed[0, 0] = (ids[0, 0] + 1) % VOCAB
    for sinks, seen in ((0, False), (1, True)):
        _, model = tiny_model({"window": 3, "sinks": sinks}, n_layers=1, max_seq_len=256)
        with torch.no_grad():
            same = torch.equal(model(ids)[0, -1], model(changed)[0, -1])
        assert same != seen, sinks


# ------------------------------------------------------------- global layers: rope, temperature


def test_query_temperature_is_llama4s():
    """``1 + s · log(⌊(pos + 1) / floor⌋ + 1)``: 1 below ``floor - 1``, by hand above."""
    pos = torch.tensor([[0, 6, 7, 8, 15, 23, 100]])
    got = query_temperature(pos, 0.1, 8)
    want = [1.0 + 0.1 * math.log((p + 1) // 8 + 1) for p in pos[0].tolist()]
    torch.testing.assert_close(got[0], torch.tensor(want))
    assert got[0, :2].eq(1).all() and got[0, 2] > 1


def test_no_rotary_global_layers_ignore_positions_and_chunked_layers_rotate():
    """``global_rope: false``: the global layer's output does not move when the position ids
    spread out (no rotary angles, no temperature), the chunked layer's does; with a
    temperature the global layer's does too."""
    torch.manual_seed(8)
    cfg, model = tiny_model({"attention_chunk": 4, "global_every": 2, "global_rope": False},
                            max_seq_len=256)
    local, glob = (b.attn for b in model.decoder.blocks)
    assert (local.rope, glob.rope, glob.temperature) == (True, False, 0.0)
    _, hot_model = tiny_model({"attention_chunk": 4, "global_every": 2, "global_rope": False,
                           "global_temperature": 0.5, "temperature_floor": 2}, max_seq_len=256)
    x = torch.randn(1, 12, cfg.d_model)
    for layer, moves in ((glob, False), (local, True), (hot_model.decoder.blocks[1].attn, True)):
        outs = []
        for stride in (1, 3):  # other gaps between the tokens (a shift moves no rotary score)
            pos = torch.arange(12)[None] * stride
            seq = Sequence(positions=pos, valid=None, segments=None, causal=True,
                           position=model.decoder.position, rotary=model.decoder.position
                           .rotary(pos))
            with torch.no_grad():
                outs.append(layer(x, seq, None))
        assert torch.allclose(outs[0], outs[1], atol=1e-6) != moves


# ------------------------------------------------------------------------ config and the rules


@pytest.mark.parametrize(("family", "options", "key", "words"), [
    (DEC, {"sinks": 2}, "model.mixer.sinks=2", "needs model.mixer.window or"),
    (ENC, {"global_tokens": 1}, "model.mixer.global_tokens=1", "needs model.mixer.window or"),
    (ENC, {"window": 3, "global_tokens": -2}, "model.mixer.global_tokens=-2", ">= 0"),
    (DEC, {"window": 3, "sinks": -1}, "model.mixer.sinks=-1", ">= 0"),
    (DEC, {"attention_chunk": 0}, "model.mixer.attention_chunk=0", ">= 1"),
    (DEC, {"attention_chunk": 4, "window": 3}, "model.mixer.attention_chunk=4", "set one"),
    (DEC, {"global_rope": False}, "model.mixer.global_rope=False", "needs model.mixer.window"),
    (DEC, {"window": 3, "global_every": 2, "global_temperature": 0.1},
     "model.mixer.global_temperature=0.1", "global_rope=false"),
    (DEC, {"window": 3, "global_rope": False, "global_temperature": -1.0},
     "model.mixer.global_temperature=-1.0", ">= 0"),
    (DEC, {"window": 3, "temperature_floor": 0}, "model.mixer.temperature_floor=0", ">= 1"),
    (ENC, {"attention_chunk": 4, "global_every": 5}, "model.mixer.global_every=5",
     "no layer would be global"),
])
def test_bad_patterns_fail_in_one_line_naming_key_value_and_rule(family, options, key, words):
    msg = refusal(options, family)
    assert key in msg and words in msg, msg


def test_global_rope_needs_a_rotary_scheme():
    cfg = tiny(DEC, PositionConfig(name="alibi"),
               mixer=MixerConfig(name="softmax", window=3, global_every=2, global_rope=False))
    with pytest.raises(ConfigError, match=r"model\.mixer\.global_rope=False: .*has none"):
        validate_model(cfg)


def test_layer_patterns_and_the_estimator_describe_them():
    """Chunked and global layers by ``global_every``; the estimator names each layer's
    pattern and prices a local layer's keys, constant in the context."""
    cfg, model = tiny_model({"attention_chunk": 8, "global_every": 2, "sinks": 2,
                         "global_rope": False}, n_layers=4, max_seq_len=256)
    assert [b.attn.window for b in model.decoder.blocks] == [
        masks.Pattern(sinks=2, chunk=8), None, masks.Pattern(sinks=2, chunk=8), None]
    assert SoftmaxAttention.describe(cfg, 0) == "(chunked, chunk 8, 2 sinks)"
    assert SoftmaxAttention.describe(cfg, 1) == "(global, no rotary)"
    assert [SoftmaxAttention.score_keys(cfg, i, seq_len=4096) for i in (0, 1)] == [10, 4096]
    rows = dict(SoftmaxAttention.summary_rows(cfg))
    assert rows["attention chunk"] == "8 tokens (layers 2, 4, ... global)"
    assert rows["global layers"] == "no rotary angles"
    assert estimate(cfg, batch=1, seq_len=64, bytes_per_value=4).kv_cache_bytes > 0
