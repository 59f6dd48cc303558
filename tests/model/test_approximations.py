"""Approximations of softmax attention against a brute-force softmax reference.

- FAVOR+ (the ``linear`` mixer's ``feature_map=favor``, model/favor.py): the error of its
  normalised output to exact softmax attention (same q, k, v), averaged over draws, falls as
  the number of random features grows, causal and bidirectional (a measured curve, not one
  point; docs/mixers.md records it); negative controls: a wrong input scale (``x / √E``
  instead of ``x / E^¼``) stalls the curve, and trigonometric (sin/cos, not positive)
  features give non-positive normalisers; the key-side stabiliser is a constant (a future key
  never changes an earlier output; performer-pytorch's maximum over the sequence does);
  draws are block-orthogonal with chi-distributed norms, redraws deterministic and resumed
  exactly from a checkpoint, eval forwards never redraw, and activation checkpointing's
  recompute uses the forward's features (control: counting the recompute changes the
  gradients).
- Nyström (model/lowrank.py): as many landmarks as tokens with the exact pseudo-inverse is
  softmax attention; the iterative pseudo-inverse converges to the exact one; padding (left,
  right, holes) and packing give the row-alone / document-alone outputs; negative control:
  landmarks that take padded keys change the outputs.
- Linformer: ``k = n`` and ``E = F = I`` is softmax attention (a different ``F`` is caught);
  padding invariance.
- Both refuse a causal stack in one line; ``blocklab-estimate`` counts the parameters of the
  built models (FAVOR+ included) and prices FLOPs and state.
"""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from variants import tiny

from blocklab.config import MixerConfig, PositionConfig
from blocklab.config.validate import validate_model
from blocklab.errors import ConfigError
from blocklab.model import build_model, favor, linear
from blocklab.model.estimate import count_params, estimate
from blocklab.model.linear import FeatureMap, identity_features
from blocklab.model.lowrank import (
    LinformerAttention,
    NystromAttention,
    iterative_pinv,
)
from blocklab.model.mixer import Sequence
from blocklab.model.position import NoPosition

FEATURES = [16, 64, 256, 1024]
DRAWS = 6


def softmax_reference(q, k, v, *, causal, valid=None):
    """Brute force: ``softmax(q kᵀ / √E)`` over the visible keys, (..., T, E) inputs."""
    t = q.shape[-2]
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    keep = torch.ones(t, t, dtype=torch.bool)
    if causal:
        keep = torch.arange(t)[:, None] >= torch.arange(t)[None, :]
    if valid is not None:
        keep = keep & valid[:, None, None, :]
    w = torch.softmax(scores.masked_fill(~keep, -1e30), -1) * keep
    return w @ v


def _qkv(seed=0, t=24, e=16, scale=0.6):
    """Queries and keys ~ N(0, 0.6²) (scores ``q·k/√E`` of std 0.36), where
    the positive features' variance (``∝ exp(|q' + k'|²)``) lets 1024 features converge."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(2, 2, 1, t, e, generator=g) * scale  # (B, Hkv, g, T, E)
    k = torch.randn(2, 2, t, e, generator=g) * scale
    v = torch.randn(2, 2, t, 8, generator=g)
    return q, k, v


def favor_map(n_features, seed, *, scale=None, orthogonal=True):
    f = favor.Favor(n_features, 16, orthogonal=orthogonal, redraw_every=0, seed=seed, layer=0)
    if scale is None:
        return FeatureMap(identity_features, f.keys, f.kernel, f.queries)

    def rescaled(fn):  # the wrong input scale: x / √E overall instead of x / E^¼
        return lambda x: fn(x * scale)
    return FeatureMap(identity_features, rescaled(f.keys),
                      lambda q, k: rescaled(f.queries)(q) @ rescaled(f.keys)(k).transpose(-1, -2),
                      rescaled(f.queries))


def favor_error(n_features, *, causal, **kw):
    """RMS error of the outputs to softmax attention's (values ~ N(0, 1)), averaged over
    draws (and inputs)."""
    errors = []
    for draw in range(DRAWS):
        q, k, v = _qkv(draw)
        ref = softmax_reference(q, k[:, :, None], v[:, :, None], causal=causal)
        ones = torch.cat((v, torch.ones_like(v[..., :1])), -1)
        y = linear.attend(q, k, ones, None, None, 5, favor_map(n_features, draw, **kw),
                          causal=causal)
        errors.append((y - ref).square().mean().sqrt().item())
    return sum(errors) / len(errors)


def assert_falls(curve):
    """Monotone decrease, the last point well below the first and small outright."""
    assert all(a > b for a, b in itertools.pairwise(curve)), curve
    assert curve[-1] < curve[0] / 2.5, curve
    assert curve[-1] < 0.05, curve


@pytest.mark.parametrize("causal", [True, False])
def test_favor_error_falls_as_the_features_grow(causal):
    curve = [favor_error(m, causal=causal) for m in FEATURES]
    assert_falls(curve)
    # negative control: the wrong scale (x / √E, an estimate of exp(q·k / E)) stalls
    wrong = [favor_error(m, causal=causal, scale=16 ** -0.25) for m in FEATURES]
    for name, c in (("favor", curve), ("wrong scale", wrong)):  # docs/mixers.md (pytest -s)
        print(f"{name} RMS error, causal={causal}:",
              ", ".join(f"m={m}: {e:.4f}" for m, e in zip(FEATURES, c)))
    with pytest.raises(AssertionError):
        assert_falls(wrong)


def test_iid_draws_converge_too_and_orthogonal_draws_are_orthogonal():
    assert_falls([favor_error(m, causal=False, orthogonal=False) for m in FEATURES])
    w = favor.draw_projection(40, 16, orthogonal=True, seed=3, layer=1, draw=0)
    for block in (w[:16], w[16:32], w[32:]):  # rows of one block: orthogonal directions
        unit = block / block.norm(dim=1, keepdim=True)
        torch.testing.assert_close(unit @ unit.T, torch.eye(len(block)), atol=1e-5, rtol=0)
    norms = torch.cat([favor.draw_projection(64, 16, orthogonal=True, seed=s, layer=0, draw=0)
                       for s in range(40)]).norm(dim=1)
    assert abs(norms.square().mean().item() - 16) < 0.8  # chi(16): E|w|² = 16
    assert norms.std() > 0.3  # rescaled, not unit rows × √E


def test_favor_features_are_positive_and_trigonometric_ones_are_caught():
    q, k, _ = _qkv(1)
    f = favor.Favor(16, 16, orthogonal=True, redraw_every=0, seed=0, layer=0)
    assert (f.kernel(q, k[:, :, None]) > 0).all()

    def trig(x):  # Performer's sin/cos features: unbiased, but not positive
        x = x * 16 ** -0.25
        p = x @ f.projection.T
        return torch.cat((p.sin(), p.cos()), -1) * torch.exp((x * x).sum(-1, keepdim=True) / 2)

    kernel = trig(q) @ trig(k[:, :, None]).transpose(-1, -2)
    assert (kernel <= 0).any()  # the check above would catch them


def test_the_key_stabiliser_never_lets_a_future_key_change_an_output():
    q, k, v = _qkv(2)
    ones = torch.cat((v, torch.ones_like(v[..., :1])), -1)
    phi = favor_map(64, 0)
    w = phi.query.__self__.projection
    big = k.clone()  # future keys at the largest feature's maximum, x' = w (exponent |w|²/2)
    big[:, :, 16:] = w[w.norm(dim=1).argmax()] * 16 ** 0.25
    a = linear.attend(q, k, ones, None, None, 5, phi, causal=True)
    b = linear.attend(q, big, ones, None, None, 5, phi, causal=True)
    torch.testing.assert_close(a[..., :16, :], b[..., :16, :], atol=1e-6, rtol=1e-5)
    # negative control: performer-pytorch's key stabiliser, the maximum over the sequence
    # (it cancels in exact arithmetic; not against the normaliser's eps, nor in underflow)

    def seq_max(x):
        e = favor._exponent(x, w)
        return torch.exp(e - e.amax((-1, -2), keepdim=True)) / 8

    leaky = FeatureMap(identity_features, seq_max, lambda q_, k_: phi.query(q_) @ seq_max(
        k_).transpose(-1, -2), phi.query)
    a = linear.attend(q, k, ones, None, None, 24, leaky, causal=True)
    b = linear.attend(q, big, ones, None, None, 24, leaky, causal=True)
    assert not torch.allclose(a[..., :16, :], b[..., :16, :], atol=1e-3)


def _favor_model(redraw_every):
    cfg = tiny("decoder", PositionConfig(name="none"), mixer=MixerConfig(
        name="linear", feature_map="favor", n_features=8, redraw_every=redraw_every,
        feature_seed=5))
    torch.manual_seed(0)
    return build_model(cfg)


def test_redraws_are_deterministic_and_resume_exactly():
    model = _favor_model(2).train()
    layer = model.decoder.blocks[1].attn
    ids = torch.randint(0, 61, (1, 6))
    first = layer.favor.projection.clone()
    model(ids)
    torch.testing.assert_close(layer.favor.projection, first)
    model(ids)  # the 2nd training forward redraws: draw 1 of (seed 5, layer 1)
    expected = favor.draw_projection(8, layer.d_key, orthogonal=True, seed=5, layer=1, draw=1)
    torch.testing.assert_close(layer.favor.projection, expected)
    model.eval()
    for _ in range(3):  # eval forwards never count
        model(ids)
    torch.testing.assert_close(layer.favor.projection, expected)
    saved = {k: v.clone() for k, v in model.state_dict().items()}
    resumed = _favor_model(2).train()
    resumed.load_state_dict(saved)
    model.train()
    for _ in range(3):
        a, b = model(ids), resumed(ids)
        torch.testing.assert_close(a, b)
    assert int(layer.favor.forwards) == 5
    never = _favor_model(0).train()
    before = never.decoder.blocks[0].attn.favor.projection.clone()
    never(ids), never(ids)
    torch.testing.assert_close(never.decoder.blocks[0].attn.favor.projection, before)


# ------------------------------------------------------------------------- low rank


def _seq(b, t, valid=None, segments=None):
    pos = NoPosition(PositionConfig(), d_model=16, d_head=4, n_heads=4, max_seq_len=64,
                     causal=False)
    return Sequence(positions=torch.arange(t).expand(b, t), valid=valid, segments=segments,
                    causal=False, position=pos)


def _lowrank(name, max_seq_len=64, attention="mha", **options):
    cfg = tiny("encoder", PositionConfig(name="none"), attention, d_model=16,
               max_seq_len=max_seq_len, mixer=MixerConfig(name=name, **options))
    torch.manual_seed(0)
    cls = NystromAttention if name == "nystrom" else LinformerAttention
    mixer = cls(cfg, 0, causal=False)
    with torch.no_grad():
        for p in mixer.qkv.parameters():
            p.copy_(torch.randn_like(p) * 0.5)
    return mixer.eval()


def _reference(mixer, x, valid=None):
    """The same projections, then brute-force softmax attention."""
    b, t, _ = x.shape
    h, hkv, dh = mixer.n_heads, mixer.n_kv_heads, mixer.d_head
    q, k, v = mixer.qkv(x).split((h * dh, hkv * dh, hkv * dh), -1)
    q = q.reshape(b, t, h, dh).transpose(1, 2)
    k = k.reshape(b, t, hkv, dh).transpose(1, 2).repeat_interleave(h // hkv, 1)
    v = v.reshape(b, t, hkv, dh).transpose(1, 2).repeat_interleave(h // hkv, 1)
    y = softmax_reference(q, k, v, causal=False, valid=valid)
    if valid is not None:
        y = y * valid[:, None, :, None]
    return mixer.out(y.transpose(1, 2).reshape(b, t, h * dh))


@pytest.mark.parametrize("attention", ["mha", "gqa"])
def test_nystrom_with_a_landmark_per_token_is_softmax_attention(attention):
    """In fp64 (the SVD pseudo-inverse of an ill-conditioned softmax matrix loses fp32's
    digits), to 1e-9."""
    torch.manual_seed(1)
    x = torch.randn(2, 12, 16, dtype=torch.float64)
    valid = torch.ones(2, 12, dtype=torch.bool)
    valid[1, :4] = False  # 8 real tokens: 4 of the 12 landmarks' runs stay empty
    for landmarks, mask in ((12, None), (12, valid), (20, valid)):
        mixer = _lowrank("nystrom", attention=attention, landmarks=landmarks,
                         pinv_iters=0).double()
        out = mixer(x, _seq(2, 12, mask), None)
        torch.testing.assert_close(out, _reference(mixer, x, mask), atol=1e-9, rtol=1e-9)
    few = _lowrank("nystrom", attention=attention, landmarks=4, pinv_iters=0).double()
    assert not torch.allclose(few(x, _seq(2, 12), None), _reference(few, x), atol=1e-3)


def test_the_iterative_pseudo_inverse_converges_to_the_exact_one():
    torch.manual_seed(2)
    a = torch.softmax(torch.randn(3, 8, 8), -1)
    exact = torch.linalg.pinv(a)
    errors = [(iterative_pinv(a, n) - exact).norm().item() for n in (2, 6, 12, 30)]
    assert errors[-1] < 1e-3 * exact.norm().item(), errors
    assert errors == sorted(errors, reverse=True), errors
    zero = torch.zeros(2, 4, 4)  # a fully padded row: no landmark, no NaN
    assert (iterative_pinv(zero, 6) == 0).all()


def _padded_cases(mixer):
    """Each of the three padded rows gives the outputs of its real tokens alone."""
    torch.manual_seed(3)
    x = torch.randn(3, 14, 16)
    valid = torch.ones(3, 14, dtype=torch.bool)
    valid[0, :5] = False  # left
    valid[1, 10:] = False  # right
    valid[2, [1, 6, 7, 12]] = False  # holes
    out = mixer(x, _seq(3, 14, valid), None)
    for row in range(3):
        real = x[row:row + 1, valid[row]]
        alone = mixer(real, _seq(1, real.shape[1]), None)
        torch.testing.assert_close(out[row:row + 1, valid[row]], alone, atol=1e-5, rtol=0)
        assert (out[row, ~valid[row]] == mixer.out.bias).all() if mixer.out.bias is not None \
            else (out[row, ~valid[row]] == 0).all()
    return x, valid


@pytest.mark.parametrize("name,options", [
    ("nystrom", {"landmarks": 3, "pinv_iters": 6}), ("nystrom", {"landmarks": 5}),
    ("linformer", {"proj_dim": 6, "share_kv": False}), ("linformer", {"proj_dim": 4})])
def test_padding_and_packing_never_change_an_output(name, options):
    mixer = _lowrank(name, **options)
    x, valid = _padded_cases(mixer)
    segments = torch.tensor([[1] * 4 + [2] * 7 + [3] * 3] * 3)
    packed = mixer(x, _seq(3, 14, valid, segments), None)
    for row in range(3):
        for s in (1, 2, 3):
            keep = valid[row] & (segments[row] == s)
            real = x[row:row + 1, keep]
            alone = mixer(real, _seq(1, real.shape[1]), None)
            torch.testing.assert_close(packed[row:row + 1, keep], alone, atol=1e-5, rtol=0)
    # negative control: padding taken into the landmarks / projections is caught
    leaky = mixer(x, _seq(3, 14), None)
    assert not torch.allclose(leaky[0:1, valid[0]], mixer(
        x[0:1, valid[0]], _seq(1, int(valid[0].sum())), None), atol=1e-3)


def test_linformer_with_identity_projections_is_softmax_attention():
    mixer = _lowrank("linformer", max_seq_len=10, proj_dim=10, share_kv=False)
    with torch.no_grad():
        mixer.e.copy_(torch.eye(10))
        mixer.f.copy_(torch.eye(10))
    torch.manual_seed(4)
    x = torch.randn(2, 10, 16)
    torch.testing.assert_close(mixer(x, _seq(2, 10), None), _reference(mixer, x), atol=1e-5,
                               rtol=1e-5)
    with torch.no_grad():  # negative control: F shifted by one token
        mixer.f.copy_(torch.eye(10).roll(1, 0))
    assert not torch.allclose(mixer(x, _seq(2, 10), None), _reference(mixer, x), atol=1e-3)
    with pytest.raises(ValueError, match=r"model\.max_seq_len=10"):
        mixer(torch.randn(1, 11, 16), _seq(1, 11), None)


@pytest.mark.parametrize("name", ["nystrom", "linformer"])
def test_a_causal_stack_is_refused_in_one_line(name):
    for cfg, key in ((tiny("decoder", PositionConfig(name="none"), mixer=MixerConfig(
            name=name)), "model.mixer.name"), (tiny("encoder_decoder", mixer=MixerConfig(
                name="softmax", pattern=[name, "softmax"])), "model.mixer.pattern")):
        with pytest.raises(ConfigError) as err:
            validate_model(cfg)
        message = str(err.value)
        assert "\n" not in message and key in message and "no causal form" in message
    validate_model(tiny("encoder_decoder", mixer=MixerConfig(name="softmax", encoder=[name])))


@pytest.mark.parametrize("family,mixer", [
    ("decoder", MixerConfig(name="linear", feature_map="favor", n_features=12)),
    ("encoder", MixerConfig(name="linear", feature_map="favor", n_features=7, short_conv=2)),
    ("encoder", MixerConfig(name="nystrom", landmarks=4)),
    ("encoder", MixerConfig(name="linformer", proj_dim=6, share_kv=False)),
    ("encoder", MixerConfig(name="linformer", proj_dim=6)),
    ("encoder_decoder", MixerConfig(name="softmax", encoder=["nystrom"])),
])
def test_the_estimator_prices_each_approximation(family, mixer):
    cfg = tiny(family, PositionConfig(name="learned"), "gqa", mixer=mixer)
    validate_model(cfg)
    model = build_model(cfg)
    assert count_params(cfg) == sum(p.numel() for p in model.parameters())
    e = estimate(cfg, seq_len=32)
    name = mixer.encoder[0] if mixer.encoder else mixer.name
    costs = [c for c in e.layers if c.mixer == name]
    assert costs and all(c.flops_per_token > 2 * c.params - 1 for c in costs)
    if mixer.get("feature_map") == "favor" and family == "decoder":  # S and z per KV head
        assert e.state_bytes == 2 * 2 * 12 * (8 + 1) * 4  # layers · Hkv · m · (V + 1) · fp32


def _grads_with_checkpointing(monkeypatch, *, guard: bool):
    from blocklab.train.module import checkpoint_blocks

    plain, ckpt = _favor_model(1).train(), _favor_model(1).train()
    checkpoint_blocks(ckpt)
    if not guard:  # negative control: the recompute in backward counts as a forward
        monkeypatch.setattr(torch._C, "_current_graph_task_id", lambda: -1)
    ids = torch.randint(0, 61, (2, 8), generator=torch.Generator().manual_seed(0))
    out = []
    for model in (plain, ckpt):
        model(ids).square().mean().backward()
        out.append([p.grad for p in model.parameters()])
    return out


def test_activation_checkpointing_recomputes_with_the_same_features(monkeypatch):
    plain, ckpt = _grads_with_checkpointing(monkeypatch, guard=True)
    for a, b in zip(plain, ckpt, strict=True):
        torch.testing.assert_close(a, b)
    plain, ckpt = _grads_with_checkpointing(monkeypatch, guard=False)
    assert any(not torch.allclose(a, b) for a, b in zip(plain, ckpt, strict=True))
