"""The stability knobs of softmax attention and the heads (docs/mixers.md "Stability knobs").

QK-norm (``model.mixer.qk_norm`` / ``qk_norm_scope``) against torch's functional layer_norm /
rms_norm on the reshaped q and k, then rotary and attention by hand; the order (norm, then
rotary) and a norm silently not applied are caught. The attention softcap against
``c·tanh(s/c)`` by hand on one layer (scores far beyond c), the identity up to ``s³/(3c²)``
for small scores; the final-logit softcap (``model.logit_softcap``) in every head and the
``select`` path. Controls: the cap removed, QK-norm skipped, a query projection scaled up
(scores bounded with QK-norm, growing without). Parameter counts, the one-line refusals, the
estimator's rows. Mask, padding, packing and cache invariants with these knobs run over the
variant grid (tests/model/variants.py ``STABILITY``); the explicit attention path and the
monitor's hook: tests/model/test_attention_hook.py.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from variants import VOCAB, tiny

from blocklab.config import ConfigError, MixerConfig, PositionConfig, validate_model
from blocklab.model import build_model, qknorm
from blocklab.model.attention import SoftmaxAttention
from blocklab.model.estimate import count_params
from blocklab.model.scores import softcap

ED = "encoder_decoder"
IDS = torch.randint(0, VOCAB, (2, 11), generator=torch.Generator().manual_seed(5))


def _model(family="decoder", position="rope", logit_softcap=None, seed=0, **options):
    cfg = validate_model(tiny(family, PositionConfig(name=position), "gqa",
                              logit_softcap=logit_softcap,
                              mixer=MixerConfig(name="softmax", **options)))
    torch.manual_seed(seed)
    model = build_model(cfg).eval()
    with torch.no_grad():  # norms away from their unit init, so that their order matters
        for name, p in model.named_parameters():
            if "q_norm" in name or "k_norm" in name:
                p.copy_(torch.rand(p.shape) + 0.5 if name.endswith("weight") else
                        torch.randn(p.shape) * 0.3)
    return model


def _first_layer(model, ids):
    """The first decoder layer's attention, its input and its output."""
    attn, seen = model.decoder.blocks[0].attn, {}
    hook = attn.register_forward_hook(lambda mod, args, out: seen.update(x=args[0], y=out))
    with torch.no_grad():
        model(ids)
    hook.remove()
    return attn, seen["x"], seen["y"]


def _norm_by_hand(x, norm, scope, kind):
    """torch's functional norm on (B, T, n, D) per head or over all heads."""
    flat = x.flatten(-2) if scope == "all" else x
    shape = (flat.shape[-1],)
    if kind == "rmsnorm":
        y = F.rms_norm(flat, shape, norm.weight, norm.eps)
    else:
        y = F.layer_norm(flat, shape, norm.weight, norm.bias, norm.eps)
    return y.view_as(x)


def _rotate(x, inv_freq):
    """Rotary angles of positions 0..T-1 on x (B, T, n, D): the rotate-half form."""
    ang = torch.arange(x.shape[1])[:, None].float() * inv_freq
    ang = torch.cat((ang, ang), -1)[None, :, None]
    x1, x2 = x.chunk(2, -1)
    return x * ang.cos() + torch.cat((-x2, x1), -1) * ang.sin()


def _attention_by_hand(attn, x, inv_freq, *, qk=None, cap=None, norm_last=False):
    """Causal attention of ``attn`` on ``x``, own code: projections, the QK-norm ``qk`` =
    (scope, kind), rotary (``norm_last``: the wrong order, the norm after it), scores (capped
    by ``cap``), softmax, values, output projection."""
    b, t, _ = x.shape
    h, hkv, d = attn.n_heads, attn.n_kv_heads, attn.d_head
    q, k, v = F.linear(x, attn.qkv.weight, attn.qkv.bias).view(b, t, h + 2 * hkv, d).split(
        (h, hkv, hkv), 2)
    if norm_last:
        q, k = _rotate(q, inv_freq), _rotate(k, inv_freq)
    if qk is not None:
        q, k = (_norm_by_hand(q, attn.q_norm, *qk), _norm_by_hand(k, attn.k_norm, *qk))
    if not norm_last:
        q, k = _rotate(q, inv_freq), _rotate(k, inv_freq)
    q, k, v = (y.transpose(1, 2) for y in (q, k, v))
    k, v = k.repeat_interleave(h // hkv, 1), v.repeat_interleave(h // hkv, 1)
    s = q @ k.transpose(-1, -2) / math.sqrt(d)
    if cap is not None:
        s = cap * torch.tanh(s / cap)
    s = s.masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), -math.inf)
    o = (s.softmax(-1) @ v).transpose(1, 2).reshape(b, t, h * d)
    return attn.out(o), s


@pytest.mark.parametrize("scope", ["head", "all"])
@pytest.mark.parametrize("kind", ["layernorm", "rmsnorm"])
def test_qk_norm_is_torchs_norm_on_q_and_k_before_rotary(kind, scope, monkeypatch):
    model = _model(qk_norm=kind, qk_norm_scope=scope)
    attn, x, y = _first_layer(model, IDS)
    width = attn.d_head if scope == "head" else attn.n_heads * attn.d_head
    assert attn.q_norm.weight.shape == (width,)
    inv_freq = model.decoder.position.inv_freq
    with torch.no_grad():
        want, _ = _attention_by_hand(attn, x, inv_freq, qk=(scope, kind))
        after, _ = _attention_by_hand(attn, x, inv_freq, qk=(scope, kind), norm_last=True)
    torch.testing.assert_close(y, want, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(want, after, atol=1e-3)  # the order matters with these weights
    # control: a QK-norm silently not applied is caught
    monkeypatch.setattr(qknorm, "fused", lambda layer, qk: qk)
    assert not torch.allclose(_first_layer(model, IDS)[2], want, atol=1e-3)


@pytest.mark.parametrize("qk_norm", [None, "rmsnorm"])
def test_qk_norm_keeps_scores_bounded_as_q_grows(qk_norm):
    """The largest raw score (the monitor's logit_max) of a layer whose query projection is
    scaled up 100x: unchanged with QK-norm, 100x larger without (the control)."""
    readings = []
    for gain in (1.0, 100.0):
        model = _model(qk_norm=qk_norm)
        attn = model.decoder.blocks[0].attn
        with torch.no_grad():
            attn.qkv.weight[:attn.n_heads * attn.d_head] *= gain
        attn.stats = []
        with torch.no_grad():
            model(IDS)
        readings.append(float(attn.stats[0]["logit_max"]))
    ratio = readings[1] / readings[0]
    assert (ratio < 1.01) if qk_norm else (ratio > 50), readings


def test_softcap_is_the_identity_for_small_scores_and_bounded_by_c():
    c = 5.0
    s = torch.linspace(-0.5, 0.5, 101, dtype=torch.float64)
    err = (softcap(s, c) - s).abs()
    assert (err <= s.abs() ** 3 / (3 * c ** 2) + 1e-15).all()  # tanh(x) = x - x³/3 + ...
    assert err.max() > 1e-4  # it does bend them (a softcap not applied: 0)
    big = torch.tensor([-1e6, -80.0, 80.0, 1e6], dtype=torch.float64)
    assert (softcap(big, c).abs() <= c).all() and softcap(big, c).abs().min() > 0.999 * c
    assert softcap(s, None) is s


def test_softcap_on_one_layer_against_the_formula(monkeypatch):
    """Scores c·tanh(s/c) after the scale, before the causal mask: the layer equals the
    formula by hand with scores far beyond c; without the cap it does not (control)."""
    cap = 0.3
    model = _model(softcap=cap)
    attn = model.decoder.blocks[0].attn
    with torch.no_grad():
        attn.qkv.weight[:attn.n_heads * attn.d_head] *= 300  # scores >> c
    _, x, y = _first_layer(model, IDS)
    inv_freq = model.decoder.position.inv_freq
    with torch.no_grad():
        want, s = _attention_by_hand(attn, x, inv_freq, cap=cap)
        _, raw = _attention_by_hand(attn, x, inv_freq)
    assert raw[raw.isfinite()].abs().max() > 10 * cap
    assert s[s.isfinite()].abs().max() <= cap
    torch.testing.assert_close(y, want, atol=1e-5, rtol=1e-5)
    monkeypatch.setattr(attn, "softcap", None)
    assert not torch.allclose(_first_layer(model, IDS)[2], want, atol=1e-3)


@pytest.mark.parametrize("family", ["decoder", "encoder", ED])
def test_a_large_softcap_changes_the_model_by_c_to_the_minus_2(family):
    args = (IDS, IDS.flip(-1)) if family == ED else (IDS,)
    with torch.no_grad():
        plain = _model(family, seed=1, qk_norm="rmsnorm")(*args)
        capped = _model(family, seed=1, qk_norm="rmsnorm", softcap=1e3)(*args)
        bent = _model(family, seed=1, qk_norm="rmsnorm", softcap=0.5)(*args)
    torch.testing.assert_close(capped, plain, atol=1e-5, rtol=0)
    assert not torch.allclose(bent, plain, atol=1e-3)  # cross-attention and all: applied


@pytest.mark.parametrize("family", ["decoder", "encoder", ED])
def test_logit_softcap_caps_every_head_after_the_head_scale(family):
    args = (IDS, IDS.flip(-1)) if family == ED else (IDS,)
    with torch.no_grad():
        plain = _model(family, seed=2)(*args)
        c = 0.5 * float(plain.abs().max())
        model = _model(family, seed=2, logit_softcap=c)
        capped = model(*args)
        select = IDS % 3 == 0
        picked = model(*args, select=select)
    torch.testing.assert_close(capped, c * torch.tanh(plain / c), atol=1e-6, rtol=1e-5)
    assert capped.abs().max() <= c and plain.abs().max() > c  # bounded, and it bent them
    torch.testing.assert_close(picked, capped[select], atol=1e-6, rtol=1e-5)


def test_encoder_decoder_cross_attention_has_qk_norm_and_the_hook():
    model = _model(ED, qk_norm="layernorm", qk_norm_scope="all")
    cross = model.decoder.blocks[0].cross
    assert cross.q_norm.weight.shape == (cross.n_heads * cross.d_head,)
    assert cross.k_norm.weight.shape == (cross.n_kv_heads * cross.d_head,)
    cross.stats = []
    with torch.no_grad():
        model(IDS, IDS.flip(-1))
    assert len(cross.stats) == 1 and cross.stats[0]["entropy"].shape == (cross.n_heads,)


@pytest.mark.parametrize("family", ["decoder", "encoder", ED])
@pytest.mark.parametrize("options", [{"qk_norm": "layernorm"},
                                     {"qk_norm": "rmsnorm", "qk_norm_scope": "all"}])
def test_parameter_counts_include_the_qk_norms(family, options):
    cfg = validate_model(tiny(family, attention="gqa",
                              mixer=MixerConfig(name="softmax", **options)))
    model = build_model(cfg)
    assert count_params(cfg) == sum(p.numel() for p in model.parameters())
    norms = sum(p.numel() for n, p in model.named_parameters() if "q_norm" in n or "k_norm" in n)
    d, h, hkv = cfg.head_dim, cfg.n_heads, cfg.kv_heads
    per_param = 2 if options["qk_norm"] == "layernorm" and cfg.norm.bias else 1
    width = 2 * d if options.get("qk_norm_scope", "head") == "head" else (h + hkv) * d
    layers = {"decoder": 2, "encoder": 2, ED: 3 + 2 * 2}[family]  # ED: its decoder's cross too
    assert norms == layers * width * per_param > 0


@pytest.mark.parametrize("key,value,rule", [
    ("qk_norm", "batchnorm", "must be null (none) or a norm kind: layernorm, rmsnorm"),
    ("qk_norm_scope", "heads", "must be one of head, all"),
    ("softcap", 0.0, "must be null (no softcap) or a finite number > 0"),
    ("softcap", -3.0, "must be null"),
    ("softcap", float("inf"), "must be a finite number"),
    ("softcap", float("nan"), "must be a finite number"),
])
@pytest.mark.parametrize("family", ["decoder", ED])
def test_bad_values_are_refused_in_one_line(key, value, rule, family):
    # an encoder-decoder of linear attention: its cross-attention alone reads them
    mixer = MixerConfig(name="linear" if family == ED else "softmax", **{key: value})
    with pytest.raises(ConfigError) as e:
        validate_model(tiny(family, mixer=mixer))
    msg = str(e.value)
    assert f"model.mixer.{key}=" in msg and rule in msg and "\n" not in msg.strip()


def test_summary_and_describe_show_the_knobs():
    cfg = validate_model(tiny(mixer=MixerConfig(name="softmax", qk_norm="rmsnorm",
                                                qk_norm_scope="all", softcap=50.0)))
    rows = dict(SoftmaxAttention.summary_rows(cfg))
    assert rows["QK-norm"] == "rmsnorm on q and k, over all heads"
    assert rows["attention softcap"] == "c·tanh(s/c), c = 50"
    assert SoftmaxAttention.describe(cfg, 0) == "(global, qk-norm rmsnorm/all, softcap 50)"
    plain = validate_model(tiny())
    assert "QK-norm" not in dict(SoftmaxAttention.summary_rows(plain))
    assert SoftmaxAttention.describe(plain, 0) == "(global)"


def test_cross_attention_of_a_linear_encoder_decoder_reads_the_knobs():
    cfg = validate_model(tiny(ED, mixer=MixerConfig(name="linear", qk_norm="rmsnorm",
                                                    softcap=2.0)))
    cross = build_model(cfg).decoder.blocks[0].cross
    assert cross.softcap == 2.0 and cross.q_norm.weight.shape == (cfg.head_dim,)
