"""Local (sliding-window) attention, ``model.mixer.window`` / ``global_every``, against
independent references: a per-query brute-force attention over exactly the allowed keys, the
receptive field of an all-local stack (n_layers × (window − 1) tokens back), full recompute for
the ring-buffer KV cache (every position scheme, left-padded batches, chunked prefill, shared
prefixes), the cache's buffer sizes and the config rules.

The variant grid (variants.py) adds local variants to the family × position invariants too
(future / padding / packing invariance, cache == recompute)."""

from __future__ import annotations

import dataclasses
import itertools

import pytest
import torch
from variants import VOCAB, tiny

from blocklab.config import ConfigError, MixerConfig, PositionConfig, validate_model
from blocklab.model import attention, bands, build_model, masks
from blocklab.model.attention import SoftmaxAttention
from blocklab.model.estimate import estimate, table
from blocklab.model.estimate import state_bytes as kv_cache_bytes
from blocklab.model.generate import generate
from blocklab.model.mixer import Sequence
from blocklab.model.position import ALiBi, NoPosition, alibi_slopes
from blocklab.model.softmax_options import SoftmaxOptions, softmax_options
from blocklab.model.transformer import default_positions

DEC, ENC, ED = "decoder", "encoder", "encoder_decoder"
SCHEMES = ["none", "sinusoidal", "learned", "t5_bias", "rope", "alibi"]


def _local(family: str = DEC, position: str = "rope", window: int = 3, global_every: int = 0,
           **kw) -> torch.nn.Module:
    cfg = tiny(family, PositionConfig(name=position), window=window, global_every=global_every,
               **kw)
    return build_model(cfg).eval()


def _ids(*shape: int) -> torch.Tensor:
    return torch.randint(0, VOCAB, shape)


# ----------------------------------------------------------------------- config and pattern


@pytest.mark.parametrize(("family", "window", "global_every", "key", "words"), [
    (DEC, 0, 0, "model.mixer.window=0", "must be null (global attention) or >= 1"),
    (DEC, -3, 0, "model.mixer.window=-3", ">= 1"),
    (ENC, 4, 0, "model.mixer.window=4", "must be odd for family 'encoder'"),
    (ED, 2, 0, "model.mixer.window=2", "must be odd for family 'encoder_decoder'"),
    (DEC, 3, 1, "model.mixer.global_every=1", "must be 0 (every layer local) or >= 2"),
    (DEC, 3, -2, "model.mixer.global_every=-2", "must be 0"),
    (DEC, None, 2, "model.mixer.global_every=2", "needs model.mixer.window"),
])
def test_bad_windows_fail_in_one_line_naming_key_value_and_rule(family, window, global_every,
                                                                key, words):
    cfg = tiny(family, window=window, global_every=global_every)
    with pytest.raises(ConfigError) as err:
        validate_model(cfg)
    msg = str(err.value)
    assert "\n" not in msg and key in msg and words in msg, msg


@pytest.mark.parametrize(("family", "window", "global_every"), [
    (DEC, 4, 0), (DEC, 1, 0), (DEC, 2, 2), (ENC, 5, 2), (ED, 1, 0), (DEC, None, 0)])
def test_good_windows_validate(family, window, global_every):
    """Accepted as given (no ConfigError), and the built model carries the pattern."""
    m = validate_model(tiny(family, window=window, global_every=global_every))
    assert (m.mixer.window, m.mixer.global_every) == (window, global_every)
    blocks = [b for name in ("encoder", "decoder") if hasattr(model := build_model(m), name)
              for b in getattr(model, name).blocks]
    assert [b.attn.window for b in blocks] == [
        masks.layer_window(softmax_options(m), b.layer) for b in blocks]


def _windows(window, global_every=0, layers=(), n=7):
    a = SoftmaxOptions(window=window, global_every=global_every, layers=list(layers))
    return [masks.layer_window(a, i) for i in range(n)]


def test_layer_pattern_global_every_n_counts_layers_from_one():
    assert _windows(4, 3) == [4, 4, None, 4, 4, None, 4]
    assert _windows(4, 0, n=3) == [4, 4, 4]
    assert _windows(None, 0, n=3) == [None] * 3
    model = _local(ED, window=5, global_every=2, n_layers=4)  # encoder: 3 layers, decoder: 4
    assert [b.attn.window for b in model.encoder.blocks] == [5, None, 5]
    assert [b.attn.window for b in model.decoder.blocks] == [5, None, 5, None]
    assert all(b.cross is not None for b in model.decoder.blocks)


# ------------------------------------------------------------ brute force: one query at a time


def _reference(attn: SoftmaxAttention, x, valid, segments, positions, window, causal, alibi):
    """Per query: attention over exactly the keys the convention allows, counted in plain
    Python — same document, real, and within ``window`` counting real tokens only."""
    b, t, _ = x.shape
    h, dh = attn.n_heads, attn.d_head
    q, k, v = attn.qkv(x).split(h * dh, dim=-1)
    q, k, v = (z.view(b, t, h, dh) for z in (q, k, v))
    scale = dh ** -0.5 if attn.scale is None else attn.scale
    slopes = alibi_slopes(h)
    out = torch.zeros(b, t, h, dh)
    for r in range(b):
        order, count = [], 0
        for j in range(t):
            order.append(count)
            count += bool(valid[r, j])
        for i in range(t):
            if not valid[r, i]:
                continue
            keys = []
            for j in range(t):
                d = order[i] - order[j]
                near = 0 <= d <= window - 1 if causal else abs(d) <= (window - 1) // 2
                if valid[r, j] and segments[r, j] == segments[r, i] and near:
                    keys.append(j)
            for hh in range(h):
                scores = torch.stack([(q[r, i, hh] * k[r, j, hh]).sum() * scale for j in keys])
                if alibi:
                    scores = scores - torch.tensor(
                        [slopes[hh] * abs(int(positions[r, i]) - int(positions[r, j]))
                         for j in keys])
                weights = scores.softmax(-1)
                out[r, i, hh] = sum(w * v[r, j, hh] for w, j in zip(weights, keys))
    return attn.out(out.flatten(2))


def _windowed_case(causal: bool, window: int, alibi: bool, t: int = 11):
    """A softmax mixer with a window, and the facts of a batch that tries every rule: row 0
    left-padded, row 1 with padding inside, row 2 packed (3 documents)."""
    d, h = 16, 2
    cfg = tiny(ENC if not causal else DEC, PositionConfig(name="alibi" if alibi else "none"),
               d_model=d, n_heads=h, window=window, max_seq_len=128)
    attn = SoftmaxAttention(cfg, 0, causal=causal).eval()
    torch.nn.init.normal_(attn.qkv.weight, std=0.5)
    x = torch.randn(3, t, d)
    valid = torch.ones(3, t, dtype=torch.bool)
    valid[0, :3] = False
    valid[1, [2, 5, 6]] = False
    segments = torch.zeros(3, t, dtype=torch.long)
    segments[2, t // 3:] = 1
    segments[2, 2 * t // 3:] = 2
    positions = default_positions(x, valid, segments)
    scheme = (ALiBi if alibi else NoPosition)(cfg.position, d_model=d, d_head=d // h,
                                              n_heads=h, max_seq_len=128, causal=causal)
    seq = Sequence(positions=positions, valid=valid, segments=segments, causal=causal,
                   position=scheme)
    return attn, x, valid, segments, positions, seq


@pytest.mark.parametrize("alibi", [False, True], ids=["plain", "alibi"])
@pytest.mark.parametrize("window", [1, 3, 5])
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "bidirectional"])
def test_windowed_attention_equals_a_per_query_brute_force(causal, window, alibi):
    """The softmax mixer's windowed attention over masks.py's dense mask equals attention
    computed one query at a time, over exactly the keys the convention allows."""
    torch.manual_seed(1)
    attn, x, valid, segments, positions, seq = _windowed_case(causal, window, alibi)
    with torch.no_grad():
        got = attn(x, seq, None)
        want = _reference(attn, x, valid, segments, positions, window, causal, alibi)
    torch.testing.assert_close(got[valid], want[valid], atol=1e-5, rtol=0)
    # the reference is not trivially the global one: a wider window gives other outputs
    attn.window = None
    with torch.no_grad():
        wide = attn(x, dataclasses.replace(seq, _memo={}), None)
    assert not torch.allclose(wide[valid], got[valid], atol=1e-3)


@pytest.mark.parametrize("alibi", [False, True], ids=["plain", "alibi"])
@pytest.mark.parametrize(("causal", "window"), [
    *(pytest.param(True, w, id=f"causal-w{w}") for w in (1, 2, 3, 5, 8)),
    *(pytest.param(False, w, id=f"bidirectional-w{w}") for w in (1, 3, 5, 9))])
def test_banded_local_attention_equals_the_dense_mask_and_the_brute_force(
        causal, window, alibi, monkeypatch):
    """Blocks of L queries over their band of keys (cost T·L) give the dense-mask result and
    the per-query reference, at block sizes from the window's reach up (blocks shorter than
    the reach would lose keys: the negative control)."""
    torch.manual_seed(2)
    attn, x, valid, segments, positions, seq = _windowed_case(causal, window, alibi, t=29)
    reach = masks.band_reach(window, causal=causal)
    with torch.no_grad():
        monkeypatch.setattr(attention, "MIN_BLOCK", 10_000)  # dense
        dense = attn(x, dataclasses.replace(seq, _memo={}), None)
        for block in sorted({max(reach, 1), reach + 3, 9}):
            monkeypatch.setattr(attention, "MIN_BLOCK", block)
            assert attn.block == max(reach, block) and 2 * attn.block < 29  # the banded path
            banded = attn(x, dataclasses.replace(seq, _memo={}), None)
            torch.testing.assert_close(banded[valid], dense[valid], atol=1e-5, rtol=0)
        want = _reference(attn, x, valid, segments, positions, window, causal, alibi)
    torch.testing.assert_close(banded[valid], want[valid], atol=1e-5, rtol=0)
    if reach >= 2:  # negative control: a band of blocks shorter than the reach drops keys
        monkeypatch.setattr(attention, "MIN_BLOCK", 1)
        monkeypatch.setattr(SoftmaxAttention, "layout", lambda self, packed: bands.Layout(
            reach - 1, 1, 0 if causal else 1))
        with torch.no_grad():
            short = attn(x, dataclasses.replace(seq, _memo={}), None)
        assert not torch.allclose(short[valid], dense[valid], atol=1e-3)


# --------------------------------------------------------------------------- receptive field


@pytest.mark.parametrize("position", ["rope", "learned", "alibi"])
def test_receptive_field_of_an_all_local_causal_stack(position):
    """n_layers × (window − 1) tokens back: a token one step farther leaves the last logits
    bit-identical, the farthest token inside the field changes them."""
    n_layers, window, t = 3, 3, 16
    field = n_layers * (window - 1)
    model = _local(DEC, position, window=window, n_layers=n_layers)
    ids = _ids(1, t)
    with torch.no_grad():
        last = model(ids)[0, -1]
        outside, inside = ids.clone(), ids.clone()
        outside[0, : t - 1 - field] = (ids[0, : t - 1 - field] + 1) % VOCAB
        inside[0, t - 1 - field] = (ids[0, t - 1 - field] + 1) % VOCAB
        assert torch.equal(model(outside)[0, -1], last)
        assert not torch.equal(model(inside)[0, -1], last)  # tiny init: a small change
        # one global layer (global_every=3) reaches back to the first token
        mixed = _local(DEC, position, window=window, global_every=3, n_layers=n_layers)
        assert not torch.equal(mixed(outside)[0, -1], mixed(ids)[0, -1])


def test_receptive_field_of_an_all_local_encoder_is_centred():
    """Bidirectional: n_layers × (window − 1) / 2 tokens on each side of the query."""
    n_layers, window, t, i = 2, 5, 21, 10
    radius = n_layers * (window - 1) // 2
    model = _local(ENC, "sinusoidal", window=window, n_layers=n_layers)
    ids = _ids(1, t)
    with torch.no_grad():
        ref = model(ids)[0, i]
        for j, seen in ((i - radius - 1, False), (i + radius + 1, False), (i - radius, True),
                        (i + radius, True)):
            changed = ids.clone()
            changed[0, j] = (ids[0, j] + 1) % VOCAB
            out = model(changed)[0, i]
            assert torch.equal(out, ref) != seen, (j, seen)


def test_cross_attention_is_never_windowed():
    """Every decoder query sees every source token: the first source token changes the last
    target logits although it is far outside the window of both stacks."""
    model = _local(ED, "none", window=3, n_layers=1)  # encoder: 3 layers, radius 3
    src, tgt = _ids(1, 15), _ids(1, 12)
    changed = src.clone()
    changed[0, 0] = (src[0, 0] + 1) % VOCAB
    with torch.no_grad():
        assert not torch.equal(model(changed, tgt)[0, -1], model(src, tgt)[0, -1])


# ---------------------------------------------------------------------- cache == recompute


def _left_padded(lengths: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Random pad ids on the left (they must not matter)."""
    width = max(lengths)
    ids = _ids(len(lengths), width)
    valid = torch.zeros_like(ids, dtype=torch.bool)
    for r, n in enumerate(lengths):
        valid[r, width - n:] = True
    return ids, valid


@pytest.mark.parametrize("pattern", [(3, 0), (4, 2)], ids=["w3", "w4g2"])
@pytest.mark.parametrize("family", [DEC, ED])
@pytest.mark.parametrize("position", SCHEMES)
def test_chunked_prefill_and_decoding_across_the_window_equal_recompute(position, family,
                                                                        pattern):
    """Left-padded prompts of 7 (with a hole of 2 pads inside), 4 and 12 tokens (longer than
    the window) prefilled in two chunks, then 7 tokens decoded one at a time: every step's
    logits equal a full forward without cache (padding never counts in the window, not even
    inside a row); greedy generation with the cache equals recompute and each prompt alone."""
    window, every = pattern
    if family == ED and window % 2 == 0:
        window += 1  # the encoder's window is centred
    model = _local(family, position, window=window, global_every=every, n_layers=3)
    src = _ids(3, 7) if family == ED else None
    ids, valid = _left_padded([9, 4, 12])
    valid[0, 4:6] = False  # a hole inside row 0, across the first chunk boundary (5)
    ids = torch.cat((ids, _ids(3, 7)), 1)
    valid = torch.cat((valid, torch.ones(3, 7, dtype=torch.bool)), 1)
    head = (src,) if src is not None else ()
    with torch.no_grad():
        full = model(*head, ids, valid=valid)
        prepared = model.prepare(source_ids=src) if src is not None else {}
        cache = model.new_cache(3, ids.shape[1])
        positions = torch.where(valid, valid.long().cumsum(-1) - 1, 0)
        cuts = [0, 5, 12, *range(13, ids.shape[1] + 1)]
        for a, b in itertools.pairwise(cuts):
            step = model.decode(ids[:, a:b], positions=positions[:, a:b],
                                valid=valid[:, a:b], cache=cache, **prepared)
            torch.testing.assert_close(step[valid[:, a:b]], full[:, a:b][valid[:, a:b]],
                                       atol=1e-5, rtol=0, msg=f"tokens {a}:{b}")
    prompt, prompt_valid = ids[:, :12], valid[:, :12]
    extra = {"source_ids": src} if src is not None else {}
    cached = generate(model, prompt, valid=prompt_valid, max_new_tokens=8, **extra)
    assert torch.equal(cached, generate(model, prompt, valid=prompt_valid, max_new_tokens=8,
                                        use_cache=False, **extra))
    for r in range(3):
        alone = {"source_ids": src[r: r + 1]} if src is not None else {}
        mine = generate(model, prompt[r: r + 1, prompt_valid[r]], max_new_tokens=8, **alone)
        assert torch.equal(cached[r], mine[0]), r


@pytest.mark.parametrize("window", [1, 2, 6])
def test_shared_prefix_continuations_from_a_selected_cache_equal_recompute(window):
    """What eval's shared-prefix scoring does (objectives.CausalLM.score_prefix): prefill
    left-padded prompts once, copy rows with ``KVCache.select``, run several multi-token
    continuations in one forward; equal to each prompt + continuation run alone."""
    model = _local(DEC, "alibi", window=window, global_every=2, n_layers=3)
    ids, valid = _left_padded([8, 5])
    conts = _ids(3, 4)
    rows = torch.tensor([0, 0, 1])
    with torch.no_grad():
        cache = model.new_cache(2, ids.shape[1] + 4)
        model(ids, valid=valid, cache=cache)
        after = valid.long().sum(-1)
        positions = after[rows][:, None] + torch.arange(4)
        got = model(conts, positions=positions, cache=cache.select(rows))
        for j, r in enumerate(rows.tolist()):
            alone = model(torch.cat((ids[r: r + 1, valid[r]], conts[j: j + 1]), 1))
            torch.testing.assert_close(got[j], alone[0, -4:], atol=1e-5, rtol=0)
        # the original cache is untouched by the copies: it keeps decoding its own rows
        nxt = model(conts[:2, :1], cache=cache)
        for r in range(2):
            alone = model(torch.cat((ids[r: r + 1, valid[r]], conts[r: r + 1, :1]), 1))
            torch.testing.assert_close(nxt[r, -1], alone[0, -1], atol=1e-5, rtol=0)


# ------------------------------------------------------------------------- cache memory


def test_local_layers_cache_memory_is_proportional_to_the_window():
    """Local layers hold a ring of window − 1 slots whatever the capacity; global layers hold
    the capacity; the estimator's bytes are the real cache's."""
    cfg = tiny(DEC, PositionConfig(name="rope"), attention="gqa", window=5, global_every=2,
               n_layers=4)
    model = build_model(cfg)
    b, hkv, dh = 3, cfg.kv_heads, cfg.head_dim
    for capacity in (40, 400):
        cache = model.new_cache(b, capacity)
        ring, full = (b, hkv, 4, dh), (b, hkv, capacity, dh)  # layers 1 and 3 (of 1..4) local
        assert [tuple(s.k.shape) for s in cache.states] == [ring, full, ring, full]
        assert [tuple(s.v.shape) for s in cache.states] == [ring, full, ring, full]
        assert cache.nbytes == 2 * b * hkv * dh * 4 * (2 * capacity + 2 * 4)
        assert kv_cache_bytes(cfg, b, capacity, 4) == cache.nbytes
        assert estimate(cfg, batch=b, seq_len=capacity, bytes_per_value=4).kv_cache_bytes \
            == cache.nbytes
    local = dataclasses.replace(cfg, mixer=MixerConfig(**{**cfg.mixer, "global_every": 0}))
    model = build_model(local)
    small, big = model.new_cache(b, 40), model.new_cache(b, 4000)
    assert small.nbytes == big.nbytes == 2 * 4 * b * hkv * dh * 4 * 4  # no capacity term
    assert list(big.books) == [("ring", 4)]  # no per-token metadata of the whole context either
    assert tuple(big.books[("ring", 4)].positions.shape) == (b, 4)
    assert kv_cache_bytes(local, b, 4000, 4) == big.nbytes
    tight = model.new_cache(b, 2)  # fewer tokens than the window: the ring shrinks to them
    assert {s.k.shape[2] for s in tight.states} == {2}
    assert kv_cache_bytes(local, b, 2, 4) == tight.nbytes


def test_an_all_local_cache_decodes_past_the_window_with_a_fixed_ring():
    """Decoding 30 tokens through a window of 4 never grows the buffers and every step equals
    recompute (also a window of 1: the query alone, an empty ring)."""
    for window in (4, 1):
        model = _local(DEC, "t5_bias", window=window, n_layers=2)
        ids = _ids(2, 30)
        with torch.no_grad():
            full = model(ids)
            cache = model.new_cache(2, 30)
            before = [t.data_ptr() for s in cache.states for t in (s.k, s.v)]
            steps = [model(ids[:, i: i + 1], cache=cache) for i in range(30)]
        torch.testing.assert_close(torch.cat(steps, 1), full, atol=1e-5, rtol=0)
        assert [t.data_ptr() for s in cache.states for t in (s.k, s.v)] == before
        assert {s.k.shape[2] for s in cache.states} == {window - 1}


def test_estimate_shows_the_window():
    cfg = tiny(DEC, PositionConfig(name="rope"), window=4096, global_every=4, n_layers=8,
               max_seq_len=8192)
    e = estimate(cfg, batch=1, seq_len=8192, bytes_per_value=2)
    text = table(cfg, e, batch=1, seq_len=8192, bytes_per_value=2)
    assert "attention window" in text and "4096 tokens (layers 4, 8, ... global)" in text
    assert "6 x softmax (local, window 4096), 2 x softmax (global)" in text
    dense = dataclasses.replace(cfg, mixer=MixerConfig())
    assert e.kv_cache_bytes * 8 * 8192 == kv_cache_bytes(dense, 1, 8192, 2) * (2 * 8192 + 6 * 4095)
    assert "attention window" not in table(dense, estimate(dense, seq_len=8192), batch=1,
                                           seq_len=8192, bytes_per_value=2)
