"""The ``gated_conv`` mixer (model/conv.py) against independent references — explicit sums,
token by token, never the FFT:

- ``fft_conv`` (causal and two-sided) equals the direct convolution at several T: 1, odd, a
  power of two, not a power of two, T = the filter length L, and T > L (the reach is L);
- ``packed_conv`` equals the direct convolution of each document alone (random contiguous
  documents, a padding run at the end), causal and two-sided;
- the whole mixer equals a per-row, per-document reference built from its parameters, with
  left / right / inner padding and packed documents, causal and bidirectional, long filter
  on and off;
- decoding (chunks, then single steps; left-padded rows; growing and fixed-shape caches, a
  context longer than L) equals the full forward;
- the cost model: parameters, state bytes, FLOPs by hand, the config rule;
- negative controls: a circular FFT (no zero padding), a long filter or short taps blind to
  document boundaries, and the gate removed each fail the reference they break.
"""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from variants import tiny

from blocklab.config import MixerConfig, PositionConfig
from blocklab.config.validate import validate_model
from blocklab.errors import ConfigError
from blocklab.model import conv, seqops
from blocklab.model.cache import DecodeCache
from blocklab.model.conv import GatedConv, fft_conv, packed_conv
from blocklab.model.mixer import Sequence
from blocklab.model.position import NoPosition

ATOL = 1e-5
L = 24  # the conv-level tests' filter length
LENGTHS = [1, 5, 7, 16, L, 37]  # 37 > L: the filter's reach ends at L


# ----------------------------------------------------------------------------- references

def direct(w: torch.Tensor, pos: torch.Tensor, neg: torch.Tensor | None = None) -> torch.Tensor:
    """One sequence w (n, d): ``y_t = Σ_s h(t - s) w_s``, ``h(l) = pos[:, l]`` for ``0 <= l <
    L``, ``neg[:, -l - 1]`` for ``l < 0`` (two-sided), else 0 — an explicit double sum."""
    n = w.shape[0]
    y = torch.zeros_like(w)
    for t in range(n):
        for s in range(n):
            lag = t - s
            if 0 <= lag < pos.shape[1]:
                y[t] += pos[:, lag] * w[s]
            elif lag < 0 and neg is not None and -lag - 1 < neg.shape[1]:
                y[t] += neg[:, -lag - 1] * w[s]
    return y


def _filters(d: int, two_sided: bool, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    pos = torch.randn(d, L, generator=g)
    return pos, (torch.randn(d, L - 1, generator=g) if two_sided else None)


def _docs(t: int, n_real: int, seed: int) -> torch.Tensor:
    """Contiguous document ids over the first ``n_real`` tokens (random run lengths), -1 after."""
    g = torch.Generator().manual_seed(seed)
    cuts = torch.rand(t, generator=g) < 0.25
    doc = cuts.long().cumsum(0) + 1
    doc[n_real:] = -1
    return doc


@pytest.mark.parametrize("two_sided", [False, True], ids=["causal", "two_sided"])
@pytest.mark.parametrize("t", LENGTHS)
def test_fft_convolution_equals_the_direct_sum(t, two_sided):
    pos, neg = _filters(4, two_sided)
    w = torch.randn(2, t, 4)
    got = fft_conv(w, pos, neg)
    for b in range(2):
        torch.testing.assert_close(got[b], direct(w[b], pos, neg), atol=ATOL, rtol=0)


@pytest.mark.parametrize("two_sided", [False, True], ids=["causal", "two_sided"])
@pytest.mark.parametrize("t", LENGTHS)
def test_packed_convolution_equals_each_document_alone(t, two_sided):
    pos, neg = _filters(3, two_sided, seed=t)
    w = torch.randn(2, t, 3)
    n_real = [t, max(t - 3, 0)]
    doc = torch.stack([_docs(t, n, seed=t + r) for r, n in enumerate(n_real)])
    w[1, n_real[1]:] = 0  # padding is zeroed before the filter (as the mixer does)
    got = packed_conv(w, doc, pos, neg)
    for b in range(2):
        for d in doc[b, : n_real[b]].unique():
            run = doc[b] == d
            torch.testing.assert_close(got[b, run], direct(w[b, run], pos, neg), atol=ATOL,
                                       rtol=0, msg=f"row {b} doc {int(d)}")


@pytest.mark.parametrize("two_sided", [False, True], ids=["causal", "two_sided"])
def test_packed_convolution_of_one_document_is_the_fft_convolution(two_sided):
    pos, neg = _filters(3, two_sided)
    w = torch.randn(2, 19, 3)
    torch.testing.assert_close(packed_conv(w, torch.ones(2, 19, dtype=torch.long), pos, neg),
                               fft_conv(w, pos, neg), atol=ATOL, rtol=0)


def test_a_circular_fft_fails_the_direct_reference(monkeypatch):
    """Negative control: an FFT of length T (no zero padding) wraps the row's end onto its
    start."""
    monkeypatch.setattr(conv, "fft_length", lambda t: t)
    pos, _ = _filters(4, False)
    w = torch.randn(1, 16, 4)
    with pytest.raises(AssertionError):
        torch.testing.assert_close(fft_conv(w, pos)[0], direct(w[0], pos), atol=ATOL, rtol=0)


# ------------------------------------------------------------------------- the whole mixer

def _cfg(causal_taps: int = 3, long: bool = True, max_seq_len: int = 16, family="decoder"):
    return tiny(family, PositionConfig(name="none"), d_model=8, max_seq_len=max_seq_len,
                mixer=MixerConfig(name="gated_conv", short_conv=causal_taps, long_conv=long))


def _mixer(cfg, causal: bool) -> GatedConv:
    torch.manual_seed(0)
    mixer = GatedConv(cfg, 0, causal=causal)
    with torch.no_grad():  # biases non-zero, so a bias that leaks is seen
        for p in (mixer.proj.bias, mixer.out.bias, mixer.short_bias):
            p.normal_()
    return mixer.eval()


def _seq(cfg, t: int, b: int, *, causal: bool, valid=None, segments=None, cache=None):
    pos = NoPosition(PositionConfig(), d_model=cfg.d_model, d_head=2, n_heads=4,
                     max_seq_len=cfg.max_seq_len, causal=causal)
    real = torch.ones(b, t, dtype=torch.bool) if valid is None else valid
    positions = torch.where(real, real.long().cumsum(-1) - 1, 0)
    return Sequence(positions=positions, valid=valid, segments=segments, causal=causal,
                    position=pos, cache=cache)


def reference(mixer: GatedConv, x: torch.Tensor) -> torch.Tensor:
    """One document's real tokens x (n, d), from the mixer's parameters by explicit sums:
    ``u, g = W x``; short taps (causal: tap i sees ``x_{t-i}``; centred: tap i sees
    ``x_{t-i+ahead}``, ``ahead = k - 1 - k//2``), the long filter, the gate, ``W_o``."""
    u, g = (x @ mixer.proj.weight.T + mixer.proj.bias).chunk(2, -1)
    n, k = x.shape[0], mixer.short.shape[1]
    ahead = 0 if mixer.causal else k - 1 - k // 2
    w = torch.zeros_like(u)
    for t in range(n):
        w[t] = mixer.short_bias
        for i in range(k):
            s = t - i + ahead
            if 0 <= s < n:
                w[t] += mixer.short[:, i] * u[s]
    c = w if mixer.long is None else direct(w, mixer.long, mixer.long_ahead)
    return (g * c) @ mixer.out.weight.T + mixer.out.bias


T = 13
LAYOUTS = {  # name -> (valid, segments) of 2 rows
    "plain": (None, None),
    "left": (torch.arange(T) >= torch.tensor([[4], [0]]), None),
    "right": (torch.arange(T) < torch.tensor([[9], [T]]), None),
    "holes": (torch.tensor([[1, 0, 1, 1, 0, 0, 1, 1, 1, 0, 1, 1, 1]] * 2).bool(), None),
    "packed": (None, torch.tensor([[1] * 4 + [2] * 6 + [3] * 3, [5] * 7 + [6] * 6])),
    # padding inside a document (shares its id) and between documents
    "packed_holes": (torch.tensor([[0, 1, 1, 0, 1, 1, 1, 0, 0, 1, 1, 1, 0]] * 2).bool(),
                     torch.tensor([[1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3, 3],
                                   [1, 1, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3]])),
}
MIXERS = [(3, True), (2, True), (1, False), (4, False)]


def _check_layout(mixer, cfg, layout: str) -> None:
    valid, segments = LAYOUTS[layout]
    x = torch.randn(2, T, cfg.d_model)
    with torch.no_grad():
        got = mixer(x, _seq(cfg, T, 2, causal=mixer.causal, valid=valid, segments=segments),
                    None)
        for b in range(2):
            real = torch.ones(T, dtype=torch.bool) if valid is None else valid[b]
            seg = torch.zeros(T, dtype=torch.long) if segments is None else segments[b]
            idx = real.nonzero()[:, 0]
            # documents: runs of equal segment ids among the real tokens
            cut = torch.cat((torch.tensor([True]), seg[idx][1:] != seg[idx][:-1]))
            for d in cut.long().cumsum(0).unique():
                rows = idx[cut.long().cumsum(0) == d]
                torch.testing.assert_close(got[b, rows], reference(mixer, x[b, rows]),
                                           atol=ATOL, rtol=0, msg=f"{layout} row {b}")


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "bidirectional"])
@pytest.mark.parametrize(("taps", "long"), MIXERS, ids=[f"k{k}-{'long' if lg else 'short'}"
                                                        for k, lg in MIXERS])
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_the_mixer_equals_the_reference_of_each_document_alone(layout, taps, long, causal):
    cfg = _cfg(taps, long)
    _check_layout(_mixer(cfg, causal), cfg, layout)


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "bidirectional"])
def test_a_filter_blind_to_documents_fails_the_packed_reference(monkeypatch, causal):
    """Negative control: the long filter run over the whole packed row."""
    cfg = _cfg(1, True)
    mixer = _mixer(cfg, causal)
    _check_layout(mixer, cfg, "packed")  # the base passes
    monkeypatch.setattr(conv, "packed_conv", lambda w, doc, pos, neg: fft_conv(w, pos, neg))
    with pytest.raises(AssertionError):
        _check_layout(mixer, cfg, "packed")


def test_short_taps_blind_to_documents_fail_the_packed_reference(monkeypatch):
    """Negative control: the short convolution's taps reaching into the previous document."""
    cfg = _cfg(3, False)
    mixer = _mixer(cfg, True)
    short = seqops.short_conv
    monkeypatch.setattr(seqops, "short_conv", lambda x, w, b, rows, **kw: short(
        x, w, b, dataclasses.replace(rows, docs=None), **kw))
    with pytest.raises(AssertionError):
        _check_layout(mixer, cfg, "packed")


def test_the_gate_removed_fails_the_reference_and_changes_the_output(monkeypatch):
    """Negative control: ``W_o(conv(W_u x))`` without the gate (a plain convolution)."""
    cfg = _cfg(3, True)
    mixer = _mixer(cfg, True)
    x = torch.randn(2, T, cfg.d_model)
    with torch.no_grad():
        gated = mixer(x, _seq(cfg, T, 2, causal=True), None)
        monkeypatch.setattr(conv, "gate", lambda g, c: c)
        plain = mixer(x, _seq(cfg, T, 2, causal=True), None)
    assert (gated - plain).abs().max() > 0.1
    with pytest.raises(AssertionError):
        _check_layout(mixer, cfg, "plain")


# ------------------------------------------------------------------------------- decoding

@pytest.mark.parametrize("static", [False, True], ids=["growing", "static"])
@pytest.mark.parametrize(("taps", "long"), MIXERS, ids=[f"k{k}-{'long' if lg else 'short'}"
                                                        for k, lg in MIXERS])
def test_decoding_in_chunks_and_steps_equals_the_full_forward(taps, long, static):
    """Left-padded rows (pads 3, 0, 5), chunks then steps, 17 slots through a filter of 12
    taps (the context outgrows the reach): every real token's output equals the forward of
    the whole sequence without a cache."""
    cfg = _cfg(taps, long, max_seq_len=12)
    mixer = _mixer(cfg, True)
    t, b = 17, 3
    valid = torch.arange(t) >= torch.tensor([[3], [0], [5]])
    x = torch.randn(b, t, cfg.d_model)
    state = mixer.new_state(b, 20, dtype=torch.float32, device="cpu", static=static)
    cache = DecodeCache([state], batch=b, capacity=20, device="cpu", static=static)
    whole = _seq(cfg, t, b, causal=True, valid=valid)
    outs, start = [], 0
    with torch.no_grad():
        full = mixer(x, whole, None)
        for size in (6, 1, 4, 1, 1, 3, 1):
            sl = slice(start, start + size)
            cache.begin(whole.positions[:, sl], valid[:, sl])
            seq = _seq(cfg, size, b, causal=True, valid=valid[:, sl], cache=cache)
            outs.append(mixer(x[:, sl], seq, state))
            cache.advance(size)
            start += size
    got = torch.cat(outs, 1)
    torch.testing.assert_close(got[valid], full[valid], atol=ATOL, rtol=0)


# ----------------------------------------------------------------------------- cost model

@pytest.mark.parametrize("causal", [True, False], ids=["causal", "bidirectional"])
@pytest.mark.parametrize(("taps", "long"), MIXERS)
def test_parameters_and_state_bytes_are_the_closed_forms(taps, long, causal):
    cfg = _cfg(taps, long)
    mixer = GatedConv(cfg, 0, causal=causal)
    assert sum(p.numel() for p in mixer.parameters()) == GatedConv.param_count(
        cfg, 0, causal=causal)
    if causal:
        for capacity in (5, 40):
            state = mixer.new_state(2, capacity, dtype=torch.bfloat16, device="cpu")
            assert state.nbytes == GatedConv.state_bytes(cfg, 0, batch=2, seq_len=capacity,
                                                         bytes_per_value=2)


def test_flops_and_state_by_hand():
    """d = 8, k = 3, T = 16: projections 2·(3·64 + 24) = 432, short 2·(24 + 8) = 64, gate 8,
    long 8·(10·log2(32) + 6) = 448; state 2·8·(2 + 16)·2 bytes, 2·8·2·2 without the filter."""
    cfg = _cfg(3, True)
    assert GatedConv.flops_per_token(cfg, 0, seq_len=16, causal=True) == 432 + 64 + 8 + 448
    assert GatedConv.state_bytes(cfg, 0, batch=2, seq_len=16, bytes_per_value=2) == 576
    short = _cfg(3, False)
    assert GatedConv.flops_per_token(short, 0, seq_len=16, causal=True) == 432 + 64 + 8
    assert GatedConv.state_bytes(short, 0, batch=2, seq_len=16, bytes_per_value=2) == 64
    assert math.isclose(10 * math.log2(32) + 6, 56)


def test_a_mixer_without_short_taps_is_refused_in_one_line():
    with pytest.raises(ConfigError) as err:
        validate_model(_cfg(0, True))
    assert "model.mixer.short_conv" in str(err.value) and "\n" not in str(err.value)


def test_the_bidirectional_form_builds_in_an_encoder():
    cfg = _cfg(2, True, family="encoder")
    assert validate_model(cfg) is cfg  # not refused: gated_conv has a two-sided form
