"""The ``linear`` mixer (model/linear.py) against independent references.

- the explicit O(T²) kernel form ``out_i = Σ_j A_ij κ(q_i, k_j) v_j / (Σ_j A_ij κ(q_i, k_j) +
  eps)``, ``A`` = causal & same segment & real key, with the kernel written directly
  (``(elu(q)+1)·(elu(k)+1)``; Taylor's ``1 + s + s²/2``, ``s = q·k/√D``) and the short
  convolution as ``F.conv1d`` over each document's real tokens alone: both feature maps,
  causal and bidirectional, every head layout, left / right / inner padding and packed
  documents, at chunk sizes that do and don't divide T;
- the recurrent decode (prefill chunks and single steps into the state, left-padded rows)
  against the same;
- Taylor's ``φ(q)·φ(k) = 1 + s + s²/2`` directly;
- negative controls: the Taylor map replaced by the identity fails the kernel identity; the
  state not restarted at a document start fails the packed reference; the convolution not
  skipping padding fails the padded reference.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from variants import tiny

from blocklab.config import MixerConfig, PositionConfig
from blocklab.config.validate import validate_model
from blocklab.errors import ConfigError
from blocklab.model import linear, masks, seqops
from blocklab.model.linear import EPS, LinearAttention
from blocklab.model.mixer import Sequence
from blocklab.model.position import NoPosition

T = 13
HEADS = {"mha": None, "gqa": 2, "mqa": 1}
VARIANTS = [("elu", 0), ("elu", 2), ("taylor", 0), ("taylor", 3)]


def _mixer(feature_map: str, short_conv: int, chunk: int, attention: str = "mha", *,
           causal: bool = True, feature_dim: int = 4) -> LinearAttention:
    cfg = tiny("decoder", PositionConfig(name="none"), attention, d_model=16, mixer=MixerConfig(
        name="linear", feature_map=feature_map, feature_dim=feature_dim,
        short_conv=short_conv, chunk=chunk))
    torch.manual_seed(0)
    mixer = LinearAttention(cfg, 0, causal=causal)
    with torch.no_grad():  # weights large enough that every token matters
        for p in mixer.parameters():
            p.copy_(torch.randn_like(p) * 0.4)
    return mixer.eval()


def _seq(x, valid, segments, causal: bool) -> Sequence:
    b, t, d = x.shape
    pos = NoPosition(PositionConfig(), d_model=d, d_head=4, n_heads=4, max_seq_len=64,
                     causal=causal)
    return Sequence(positions=torch.arange(t).expand(b, t), valid=valid, segments=segments,
                    causal=causal, position=pos)


def _batch(packed: bool, padded: bool = True):
    """4 rows of 13 tokens: left padding, right padding, holes, none (or no padding at all:
    ``valid`` None); packed documents (with boundaries inside and at the edges of chunks,
    documents longer than a chunk) or not. Padding takes segment id 0 or a neighbour's."""
    torch.manual_seed(1)
    x = torch.randn(4, T, 16)
    valid = torch.ones(4, T, dtype=torch.bool)
    valid[0, :3] = False
    valid[1, -2:] = False
    valid[2, [2, 5, 6, 11]] = False
    valid = valid if padded else None
    if not packed:
        return x, valid, None
    segments = torch.tensor([
        [0, 0, 0, 1, 1, 1, 1, 1, 2, 2, 3, 3, 3],
        [1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 0, 0],
        [1, 1, 1, 2, 2, 2, 2, 2, 3, 3, 3, 3, 4],
        [5, 6, 6, 6, 6, 6, 6, 7, 7, 7, 7, 7, 7],
    ])
    return x, valid, segments


def reference_conv(mixer: LinearAttention, x, valid, segments):
    """Each document's real tokens alone through ``F.conv1d`` (zeros at padding)."""
    out = torch.zeros_like(x)
    k = mixer.conv.kernel_size[0]
    for r in range(x.shape[0]):
        idx = valid[r].nonzero()[:, 0]
        seg = torch.zeros_like(idx) if segments is None else segments[r, idx]
        runs = torch.unique_consecutive(seg, return_counts=True)[1].tolist()
        for part in idx.split(runs):
            xs = x[r, part].T[None]  # (1, d, L)
            y = F.conv1d(xs, mixer.conv.weight, mixer.conv.bias, padding=k - 1,
                         groups=x.shape[-1])[..., : len(part)]
            out[r, part] = y[0].T
    return out


def kernel(feature_map: str, q, k):
    """κ(q_i, k_j) for every pair, written directly (no feature map): (B, H, T, T)."""
    if feature_map == "elu":
        return (F.elu(q) + 1) @ (F.elu(k) + 1).transpose(-1, -2)
    s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    return 1 + s + s * s / 2


def reference(mixer: LinearAttention, feature_map: str, x, valid, segments, causal: bool):
    """The explicit O(T²) masked kernel form."""
    b, t, _ = x.shape
    valid = torch.ones(b, t, dtype=torch.bool) if valid is None else valid
    u = x if mixer.conv is None else reference_conv(mixer, x, valid, segments)
    h, hkv, e, dv = mixer.n_heads, mixer.n_kv_heads, mixer.d_key, mixer.d_value
    q, k, v = mixer.qkv(u).split((h * e, hkv * e, hkv * dv), -1)
    q = q.reshape(b, t, h, e).transpose(1, 2)
    k = k.reshape(b, t, hkv, e).transpose(1, 2).repeat_interleave(h // hkv, 1)
    v = v.reshape(b, t, hkv, dv).transpose(1, 2).repeat_interleave(h // hkv, 1)
    seg = torch.zeros(b, t, dtype=torch.long) if segments is None else segments
    allowed = (seg[:, :, None] == seg[:, None, :]) & valid[:, None, :]  # (B, Tq, Tk)
    if causal:
        allowed = allowed & torch.ones(t, t, dtype=torch.bool).tril()
    w = kernel(feature_map, q, k) * allowed[:, None]  # (B, H, T, T)
    o = (w @ v) / (w.sum(-1, keepdim=True) + EPS)
    return mixer.out(o.transpose(1, 2).reshape(b, t, h * dv))


def _assert_matches(feature_map, short_conv, chunk, attention, *, causal, packed,
                    padded=True, atol=2e-5):
    mixer = _mixer(feature_map, short_conv, chunk, attention, causal=causal)
    x, valid, segments = _batch(packed, padded)
    with torch.no_grad():
        got = mixer(x, _seq(x, valid, segments, causal), None)
        want = reference(mixer, feature_map, x, valid, segments, causal)
    real = torch.ones(x.shape[:2], dtype=torch.bool) if valid is None else valid
    torch.testing.assert_close(got[real], want[real], atol=atol, rtol=1e-4)


@pytest.mark.parametrize("attention", list(HEADS))
@pytest.mark.parametrize(("feature_map", "short_conv"), VARIANTS)
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "bidirectional"])
@pytest.mark.parametrize(("packed", "padded"), [(False, False), (False, True), (True, False),
                                                (True, True)],
                         ids=["rows", "padded", "packed", "packed-padded"])
def test_the_chunked_form_equals_the_quadratic_kernel_form(feature_map, short_conv, attention,
                                                           causal, packed, padded):
    for chunk in (1, 4, 5, T, 64):  # chunks that divide T, that don't, one, bigger than T
        _assert_matches(feature_map, short_conv, chunk, attention, causal=causal,
                        packed=packed, padded=padded)


@pytest.mark.parametrize("attention", list(HEADS))
@pytest.mark.parametrize(("feature_map", "short_conv"), VARIANTS)
def test_recurrent_decoding_equals_the_quadratic_kernel_form(feature_map, short_conv,
                                                             attention):
    """Left-padded rows fed as a prefill chunk, then single steps and more chunks, into one
    state updated in place: every real output equals the reference over the whole prefix."""
    mixer = _mixer(feature_map, short_conv, 5, attention)
    x, _, _ = _batch(False)
    valid = torch.ones(4, T, dtype=torch.bool)
    for r, pad in enumerate((3, 0, 1, 6)):  # row 3: padding beyond the first chunk
        valid[r, :pad] = False
    state = mixer.new_state(4, T, dtype=torch.float32, device="cpu", static=True)
    buffers = [t.data_ptr() for t in state.tensors().values()]
    outs, start = [], 0
    with torch.no_grad():
        for size in (7, 1, 1, 3, 1):
            sl = slice(start, start + size)
            outs.append(mixer(x[:, sl], _seq(x[:, sl], valid[:, sl], None, True), state))
            start += size
        want = reference(mixer, feature_map, x, valid, None, True)
    torch.testing.assert_close(torch.cat(outs, 1)[valid], want[valid], atol=2e-5, rtol=1e-4)
    assert [t.data_ptr() for t in state.tensors().values()] == buffers  # in place


def taylor_kernel_error(dim: int) -> float:
    """max |φ(q)·φ(k) - (1 + s + s²/2)|, s = q·k/√D, over random q, k."""
    torch.manual_seed(dim)
    q, k = torch.randn(2, 50, dim, dtype=torch.float64).unbind(0)
    got = (linear.taylor_features(q) * linear.taylor_features(k)).sum(-1)
    s = (q * k).sum(-1) / math.sqrt(dim)
    return float((got - (1 + s + s * s / 2)).abs().max())


@pytest.mark.parametrize("dim", [1, 4, 16])
def test_taylor_features_give_the_second_order_expansion_of_exp(dim):
    assert taylor_kernel_error(dim) < 1e-10
    assert linear.taylor_features(torch.zeros(3, dim)).shape[-1] == 1 + dim + dim * dim


def test_elu_features_are_elu_plus_one_with_finite_gradients():
    x = torch.tensor([-200.0, -3.0, -0.5, 0.0, 0.5, 200.0], requires_grad=True)
    y = linear.elu_features(x)
    torch.testing.assert_close(y, F.elu(x) + 1)
    y.sum().backward()
    assert torch.isfinite(x.grad).all()


def test_cost_is_constant_in_the_context_and_counts_the_built_parameters():
    for fm, conv in VARIANTS:
        mixer = _mixer(fm, conv, 4, "gqa")
        cfg = tiny("decoder", PositionConfig(name="none"), "gqa", d_model=16, mixer=MixerConfig(
            name="linear", feature_map=fm, feature_dim=4, short_conv=conv, chunk=4))
        assert LinearAttention.param_count(cfg, 0, causal=True) == sum(
            p.numel() for p in mixer.parameters())
        flops = [LinearAttention.flops_per_token(cfg, 0, seq_len=n, causal=True)
                 for n in (8, 4096)]
        assert flops[0] == flops[1] > 2 * LinearAttention.param_count(cfg, 0, causal=True)
        state = mixer.new_state(3, 10, dtype=torch.float32, device="cpu")
        for n in (8, 4096):
            assert LinearAttention.state_bytes(cfg, 0, batch=3, seq_len=n,
                                               bytes_per_value=4) == state.nbytes


@pytest.mark.parametrize(("option", "value", "rule"), [
    ("feature_map", "relu", "one of elu, taylor"),
    ("feature_dim", 0, "must be an integer >= 1"),
    ("short_conv", -1, "must be an integer >= 0"),
    ("chunk", 0, "must be an integer >= 1"),
])
def test_option_rules_are_one_line_errors_naming_the_key(option, value, rule):
    mixer = MixerConfig(name="linear", **{"feature_map": "taylor", option: value})
    cfg = tiny("decoder", PositionConfig(name="none"), mixer=mixer)
    with pytest.raises(ConfigError) as err:
        validate_model(cfg)
    message = str(err.value)
    assert f"model.mixer.{option}={value!r}" in message and rule in message
    assert "\n" not in message


def test_feature_dim_is_free_with_the_elu_map():
    cfg = tiny("decoder", PositionConfig(name="none"), mixer=MixerConfig(
        name="linear", feature_map="elu", feature_dim=0))
    assert validate_model(cfg) is cfg  # not refused: elu ignores feature_dim


# ---------------------------------------------------------------------- negative controls

def test_identity_in_place_of_the_taylor_map_fails_the_kernel_identity(monkeypatch):
    monkeypatch.setattr(linear, "taylor_features", lambda x: x)
    assert taylor_kernel_error(4) > 1e-3


def test_a_state_not_restarted_at_a_document_start_fails_the_packed_reference(monkeypatch):
    real_rule = masks.chunk_visibility

    def leaky(docs, valid, chunk, *, strict=False, device=None):  # documents flow into others
        vis = real_rule(docs, valid, chunk, strict=strict, device=device)
        b, n, length = vis.carried.shape
        return masks.ChunkVisibility(within=vis.within, carried=torch.ones_like(vis.carried),
                                     kept=valid.reshape(b, n, length))

    monkeypatch.setattr(masks, "chunk_visibility", leaky)
    _assert_matches("elu", 0, 4, "mha", causal=True, packed=False)  # one document: unharmed
    with pytest.raises(AssertionError):
        _assert_matches("elu", 0, 4, "mha", causal=True, packed=True)


def test_a_convolution_that_reads_padding_fails_the_padded_reference(monkeypatch):
    def blind(seq):  # rows not compacted: taps count padding as tokens
        return seqops.compact_rows(None, seq.starts())

    monkeypatch.setattr(seqops, "compact", blind)
    with pytest.raises(AssertionError):
        _assert_matches("taylor", 3, 4, "mha", causal=True, packed=False)
