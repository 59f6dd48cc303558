"""Recurrent memory tokens (model/rmt.py; Bulatov et al. 2022, arXiv:2207.06881).

- A hand loop — booydar/recurrent-memory-transformer's ``MemoryCell`` recipe written here:
  ``cat([mem, emb(segment), mem])`` through the decoder stack with positions 0..T+2n-1,
  logits ``[:, n:-n]``, next memory = the last n hidden states — equals blocklab's carry over
  3 segments, logits and every parameter's gradient (control: the memory not carried).
- Memory flows: two documents equal except in segment 1 give other segment-3 logits; equal
  when the memory is replaced by the initial one before segment 3 and without memory tokens
  (a window too short to reach segment 1); ∂loss₃/∂emb(seg₁) ≠ 0 with bptt=0, = 0 with bptt=1.
- A document boundary restarts from the initial memory (control: no reset); state_dict
  round trip continues bit-exactly; every decoder mixer runs 3 segments padding-invariantly.
- A decode cache holds the read memory: cached decoding equals the plain forward for every
  decoder mixer (control: no memory tokens), and generate agrees with and without a cache.
- Pricing: the estimator's state bytes == a real carry cache's, FLOPs and params by hand.
"""

from __future__ import annotations

import dataclasses
import io

import pytest
import torch
import torch.nn.functional as F
from variants import VOCAB, mixer_variants, tiny

from blocklab.config import PositionConfig
from blocklab.model import build_model
from blocklab.model.carry import run_segments
from blocklab.model.estimate import count_params, estimate
from blocklab.objectives.segmented import segment_loss

B, T, N = 2, 8, 3


def _cfg(n: int = N, **kw):
    return dataclasses.replace(tiny(position=PositionConfig(name=kw.pop("position", "rope")),
                                    **kw), memory_tokens=n)


def _model(cfg):
    torch.manual_seed(0)
    return build_model(cfg).eval()


def _ids(seed: int = 1, length: int = 3 * T):
    return torch.randint(0, VOCAB, (B, length), generator=torch.Generator().manual_seed(seed))


def _hand_loop(model, ids, *, carry: bool = True):
    """booydar's MemoryCell, our own code: logits per segment, the memory carried."""
    n, mem, out = model.config.memory_tokens, None, []
    for s in range(0, ids.shape[1], T):
        seg = ids[:, s:s + T]
        if mem is None or not carry:
            mem = model.memory.weight.unsqueeze(0).expand(seg.shape[0], -1, -1)
        x = torch.cat((mem, model.embed(seg), mem), 1)
        pos = torch.arange(x.shape[1]).expand(seg.shape[0], -1)
        h = model.decoder(x, positions=pos)
        out.append(model.head(h[:, n:-n]))
        mem = h[:, -n:]
    return torch.cat(out, 1)


def _grads(model, logits, targets):
    model.zero_grad()
    F.cross_entropy(logits.flatten(0, 1), targets.flatten()).backward()
    return {k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("position", ["rope", "learned"])
def test_blocklab_equals_the_hand_loop(position):
    model = _model(_cfg(position=position, style=1))
    ids, targets = _ids(), _ids(2)
    ref = _hand_loop(model, ids)
    g_ref = _grads(model, ref, targets)
    got = run_segments(model, ids, seg_len=T, cache=model.new_cache(B, None, carry=True))
    g_got = _grads(model, got, targets)
    torch.testing.assert_close(got, ref, atol=1e-5, rtol=1e-5)
    assert g_got.keys() == g_ref.keys() and "memory.weight" in g_got
    for k in g_ref:
        torch.testing.assert_close(g_got[k], g_ref[k], atol=1e-5, rtol=1e-4, msg=k)
    with pytest.raises(AssertionError):  # control: the memory not carried
        torch.testing.assert_close(got, _hand_loop(model, ids, carry=False), atol=1e-5,
                                   rtol=1e-5)


def _seg3(model, ids, *, drop: bool = False):
    cache = model.new_cache(B, None, carry=True)
    for s in range(3):
        cache.enter(torch.zeros(B, dtype=torch.long))
        if drop and s == 2:
            cache.reset_rows(torch.ones(B, dtype=torch.bool))  # back to the initial memory
        out = model(ids[:, s * T:(s + 1) * T], cache=cache)
    return out


def test_memory_flows_from_segment_1_to_segment_3():
    model = _model(_cfg())
    a = _ids()
    b = a.clone()
    b[:, :T] = _ids(7, T)  # other tokens in segment 1 only
    with torch.no_grad():
        assert not torch.allclose(_seg3(model, a), _seg3(model, b), atol=1e-4)
        torch.testing.assert_close(_seg3(model, a, drop=True), _seg3(model, b, drop=True))
        # without memory tokens (a window that cannot reach segment 1): no path either
        plain = _model(dataclasses.replace(tiny(position=PositionConfig(name="rope"),
                                                window=3), memory_tokens=0))
        torch.testing.assert_close(_seg3(plain, a), _seg3(plain, b))


def _grad_of_segment_1(bptt: int) -> torch.Tensor:
    model = _model(_cfg()).train()
    ids = _ids()
    labels = _ids(3)
    labels[:, :2 * T] = -100  # the loss of segment 3 only
    seen = []

    def keep(module, inputs, out):
        out.retain_grad()
        seen.append(out)

    hook = model.embed.register_forward_hook(keep)
    batch = {"input_ids": ids, "labels": labels, "segments": torch.zeros_like(ids)}
    segment_loss(model, batch, model.new_cache(B, None, carry=True), seg_len=T,
                 bptt=bptt).loss.backward()
    hook.remove()
    assert len(seen) == 3
    return seen[0].grad


def test_bptt_cuts_the_gradient_to_earlier_segments():
    g0 = _grad_of_segment_1(0)
    assert g0 is not None and g0.abs().sum() > 0
    g1 = _grad_of_segment_1(1)
    assert g1 is None or g1.abs().sum() == 0


def test_a_new_document_restarts_from_the_initial_memory(monkeypatch):
    model = _model(_cfg())
    ids = _ids()
    docs = torch.zeros(B, 3 * T, dtype=torch.long)
    docs[0, 2 * T:] = 1  # row 0: a new document at segment 3
    with torch.no_grad():
        got = run_segments(model, ids, seg_len=T, cache=model.new_cache(B, None, carry=True),
                           segments=docs)
        alone = model(ids[:1, 2 * T:])  # the new document from its start
        torch.testing.assert_close(got[:1, 2 * T:], alone)
        with pytest.raises(AssertionError):  # control: the row not reset
            monkeypatch.setattr("blocklab.model.cache.DecodeCache.reset_rows",
                                lambda self, rows: None)
            got = run_segments(model, ids, seg_len=T,
                               cache=model.new_cache(B, None, carry=True), segments=docs)
            torch.testing.assert_close(got[:1, 2 * T:], alone)


def test_state_dict_round_trip_continues_bit_exactly():
    model = _model(_cfg())
    ids = _ids()
    with torch.no_grad():
        one = model.new_cache(B, None, carry=True)
        run_segments(model, ids[:, :T], seg_len=T, cache=one)
        buf = io.BytesIO()
        torch.save(one.state_dict(), buf)
        buf.seek(0)
        two = model.new_cache(B, None, carry=True)
        two.load_state_dict(torch.load(buf, weights_only=True))
        a = run_segments(model, ids[:, T:], seg_len=T, cache=one)
        b = run_segments(model, ids[:, T:], seg_len=T, cache=two)
    assert torch.equal(a, b)
    fresh = run_segments(model, ids[:, T:], seg_len=T, cache=model.new_cache(B, None,
                                                                             carry=True))
    assert not torch.allclose(a, fresh, atol=1e-4)  # the loaded memory is read


@pytest.mark.parametrize("label,cfg", mixer_variants("decoder"),
                         ids=[label for label, _ in mixer_variants("decoder")])
def test_every_decoder_mixer_runs_3_segments_padding_invariantly(label, cfg):
    model = _model(dataclasses.replace(cfg, memory_tokens=2))
    ids = _ids(4)
    valid = torch.ones(B, 3 * T, dtype=torch.bool)
    valid[0, :2] = False  # left padding in segment 1
    valid[0, 3 * T - 3:] = False  # right padding in segment 3
    with torch.no_grad():
        got = run_segments(model, ids, seg_len=T, cache=model.new_cache(B, None, carry=True),
                           valid=valid)
        cache = model.new_cache(1, None, carry=True)  # row 0 alone, its real tokens only
        for s in range(3):
            cut = slice(s * T, (s + 1) * T)
            cache.enter(torch.zeros(1, dtype=torch.long))
            alone = model(ids[:1, cut][valid[:1, cut]][None], cache=cache)
            torch.testing.assert_close(got[0, cut][valid[0, cut]], alone[0], atol=1e-5,
                                       rtol=1e-5)
    assert torch.isfinite(got[valid]).all()


def test_a_forward_without_a_carry_reads_the_initial_memory():
    model = _model(_cfg())
    ids = _ids()[:, :T]
    with torch.no_grad():
        torch.testing.assert_close(model(ids), _hand_loop(model, ids))
        packed = torch.zeros_like(ids)
        packed[:, 4:] = 1
        with pytest.raises(ValueError, match="packed rows are not supported"):
            model(ids, segments=packed)


@pytest.mark.parametrize("label,cfg", mixer_variants("decoder"),
                         ids=[label for label, _ in mixer_variants("decoder")])
def test_cached_decoding_equals_the_plain_forward(label, cfg):
    """A decode cache holds the read memory: a left-padded prompt prefilled, then one token a
    step (positions given by the caller for the prefill, continued by the cache after it),
    equals the plain forward over the whole row (the initial memory around it)."""
    model = _model(dataclasses.replace(cfg, memory_tokens=2))
    ids = _ids(5, T)
    valid = torch.ones(B, T, dtype=torch.bool)
    valid[1, :3] = False  # left padding
    p = 5
    with torch.no_grad():
        full = model(ids, valid=valid)
        cache = model.new_cache(B, T)
        from blocklab.model.position import positions_from_valid

        steps = [model(ids[:, :p], valid=valid[:, :p],
                       positions=positions_from_valid(valid[:, :p]), cache=cache)]
        steps += [model(ids[:, i:i + 1], cache=cache) for i in range(p, T)]
        got = torch.cat(steps, 1)
    torch.testing.assert_close(got[valid], full[valid], atol=1e-5, rtol=1e-5)
    with pytest.raises(AssertionError):  # control: a plain forward without memory tokens
        torch.testing.assert_close(got[valid], _no_memory(model, ids, valid)[valid],
                                   atol=1e-5, rtol=1e-5)


def _no_memory(model, ids, valid):
    from blocklab.model.position import positions_from_valid

    h = model.decoder(model.embed_tokens(ids), positions=positions_from_valid(valid),
                      valid=valid)
    return model.head(h)


@pytest.mark.parametrize("position", ["learned", "alibi"])
def test_generate_with_and_without_a_cache_agree(position):
    from blocklab.model.generate import generate

    model = _model(_cfg(n=2, position=position, window=3))
    ids = _ids(6, 6)
    valid = torch.ones_like(ids, dtype=torch.bool)
    valid[1, :2] = False
    kw = {"valid": valid, "max_new_tokens": 8, "temperature": 0}
    plain = generate(model, ids, use_cache=False, **kw)
    assert torch.equal(generate(model, ids, **kw), plain)
    assert torch.equal(generate(model, ids, static_cache=True, **kw), plain)


def test_pricing_matches_a_carry_cache_and_a_hand_count():
    cfg = _cfg()
    model = _model(cfg)
    assert count_params(cfg) == sum(p.numel() for p in model.parameters())
    cache = model.new_cache(B, None, carry=True)
    with torch.no_grad():
        run_segments(model, _ids(), seg_len=T, cache=cache)
    e = estimate(cfg, batch=B, seq_len=T, bytes_per_value=4)
    assert e.state_bytes == cache.nbytes == B * N * cfg.d_model * 4
    base = estimate(dataclasses.replace(cfg, memory_tokens=0), batch=B, seq_len=T + 2 * N,
                    bytes_per_value=4)
    head = 2 * cfg.vocab_size * cfg.d_model
    assert e.forward_flops_per_token == pytest.approx(
        (base.forward_flops_per_token - head) * (T + 2 * N) / T + head)
    assert e.params == base.params + N * cfg.d_model
