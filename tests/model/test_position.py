"""Position schemes against independent references: plain-Python formulas from the papers, the
ALiBi authors' slope construction, and Hugging Face ``transformers`` (RoPE scaling, T5 buckets)."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from blocklab.config import (
    ConfigError,
    FamilyConfig,
    ModelConfig,
    PositionConfig,
    RopeScaling,
    validate_model,
)
from blocklab.model.position import (
    ALiBi,
    RoPE,
    Sinusoidal,
    T5Bias,
    alibi_slopes,
    apply_rotary,
    positions_from_segments,
    positions_from_valid,
    t5_bucket,
)

# ------------------------------------------------------------------------------------ helpers


def _make(cls, cfg: PositionConfig, *, d_model: int = 16, d_head: int = 8, n_heads: int = 2,
          max_seq_len: int = 16, causal: bool = True):
    return cls(cfg, d_model=d_model, d_head=d_head, n_heads=n_heads, max_seq_len=max_seq_len,
               causal=causal)


def _rope(scaling: RopeScaling, factor: float = 1.0, *, d_head: int = 32, base: float = 10000.0,
          original: int | None = None, max_seq_len: int = 512, **extra) -> RoPE:
    cfg = PositionConfig(name="rope", base=base, scaling=scaling, factor=factor,
                         original_max_seq_len=original, **extra)
    return _make(RoPE, cfg, d_model=2 * d_head, d_head=d_head, max_seq_len=max_seq_len)


def _plain_inv_freq(d_head: int, base: float) -> list[float]:
    """RoFormer: theta_i = base^(-2i/d), i = 0 .. d/2-1 (float64)."""
    return [base ** (-2 * i / d_head) for i in range(d_head // 2)]


# --------------------------------------------------------------------------------- sinusoidal


def _sinusoid_reference(positions: list[int], d: int) -> list[list[float]]:
    """"Attention Is All You Need" §3.5, one entry at a time."""
    table = []
    for p in positions:
        row = []
        for j in range(d):
            i2 = j - j % 2  # 2i
            angle = p / 10000 ** (i2 / d)
            row.append(math.sin(angle) if j % 2 == 0 else math.cos(angle))
        table.append(row)
    return table


@pytest.mark.parametrize("d_model", [8, 16, 7, 13], ids=lambda d: f"d{d}")
def test_sinusoidal_matches_paper_formula(d_model):
    pos = [[0, 1, 2, 5, 15], [16, 100, 511, 1000, 4097]]  # beyond max_seq_len=16 too
    sin = _make(Sinusoidal, PositionConfig(name="sinusoidal"), d_model=d_model,
                d_head=4, max_seq_len=16)
    x = torch.zeros(2, 5, d_model)
    got = sin.embed(x, torch.tensor(pos)).double()
    ref = torch.tensor([_sinusoid_reference(row, d_model) for row in pos], dtype=torch.float64)
    assert got.shape == (2, 5, d_model)
    # fp32 angles: error ~ p * 2^-24 rad at p = 4097
    torch.testing.assert_close(got, ref, atol=5e-4, rtol=0)
    # and it is additive on the token embedding
    x2 = torch.randn(2, 5, d_model)
    torch.testing.assert_close(sin.embed(x2, torch.tensor(pos)), x2 + got.float())


# ------------------------------------------------------------------------------------- rotary

SCALINGS = [
    pytest.param(RopeScaling.none, 1.0, id="none"),
    pytest.param(RopeScaling.linear, 4.0, id="linear4"),
    pytest.param(RopeScaling.ntk, 4.0, id="ntk4"),
    pytest.param(RopeScaling.yarn, 4.0, id="yarn4"),
    pytest.param(RopeScaling.yarn, 16.0, id="yarn16"),
]


def _scores(rope: RoPE, q: torch.Tensor, k: torch.Tensor, pairs: list[tuple[int, int]]):
    """q_m · k_n for each (m, n), with q, k of shape (d_head,)."""
    m = torch.tensor([[a for a, _ in pairs]])
    n = torch.tensor([[b for _, b in pairs]])
    t = len(pairs)
    qr = apply_rotary(q.expand(1, t, 1, -1), *rope.rotary(m))  # token-major (B, T, H, D)
    kr = apply_rotary(k.expand(1, t, 1, -1), *rope.rotary(n))
    return (qr * kr).sum(-1).flatten()


@pytest.mark.parametrize(("scaling", "factor"), SCALINGS)
def test_rope_score_depends_only_on_offset(scaling, factor):
    gen = torch.Generator().manual_seed(0)
    d_head = 32
    rope = _rope(scaling, factor, d_head=d_head, original=64, max_seq_len=256)
    q = torch.randn(d_head, generator=gen)
    k = torch.randn(d_head, generator=gen)
    q, k = q / q.norm(), k / k.norm()
    af2 = rope.attention_factor ** 2
    per_offset = []
    for offset in (0, 1, 3, -5, 17, 60):
        starts = [n for n in (0, 1, 7, 40, 100, 150) if n + offset >= 0]
        pairs = [(n + offset, n) for n in starts]
        s = _scores(rope, q, k, pairs)
        assert s.numel() >= 4
        torch.testing.assert_close(s, s[:1].expand_as(s), atol=2e-5 * af2, rtol=0,
                                   msg=f"offset {offset}: scores {s.tolist()}")
        per_offset.append(float(s[0]))
    # ... and does depend on the offset
    for i in range(len(per_offset)):
        for j in range(i + 1, len(per_offset)):
            assert abs(per_offset[i] - per_offset[j]) > 1e-4, per_offset
    # offset 0 is the plain dot product (times the attention factor squared)
    assert per_offset[0] == pytest.approx(af2 * float(q @ k), abs=1e-5)


@pytest.mark.parametrize(("scaling", "factor"), SCALINGS)
def test_rope_rotation_scales_norm_by_attention_factor(scaling, factor):
    rope = _rope(scaling, factor, d_head=16, original=64)
    x = torch.randn(2, 7, 3, 16, generator=torch.Generator().manual_seed(1))  # (B, T, H, D)
    pos = torch.tensor([[0, 1, 2, 9, 100, 300, 1000], [5, 5, 6, 7, 8, 9, 10]])
    y = apply_rotary(x, *rope.rotary(pos))
    expected = rope.attention_factor
    if scaling in (RopeScaling.none, RopeScaling.linear, RopeScaling.ntk):
        assert expected == 1.0
    torch.testing.assert_close(y.norm(dim=-1), expected * x.norm(dim=-1), atol=1e-5, rtol=1e-5)


def test_rope_rotates_half_pairs_by_position_angle():
    """Rotate-half layout (GPT-NeoX / Llama): dim i pairs with dim i + d/2, angle p·θ_i."""
    d = 8
    rope = _rope(RopeScaling.none, d_head=d)
    theta = _plain_inv_freq(d, 10000.0)
    x = torch.randn(1, 3, 1, d, generator=torch.Generator().manual_seed(2))  # (B, T, H, D)
    pos = [0, 3, 250]
    y = apply_rotary(x, *rope.rotary(torch.tensor([pos])))
    for t, p in enumerate(pos):
        for i in range(d // 2):
            a, b = float(x[0, t, 0, i]), float(x[0, t, 0, i + d // 2])
            c, s = math.cos(p * theta[i]), math.sin(p * theta[i])
            assert float(y[0, t, 0, i]) == pytest.approx(a * c - b * s, abs=1e-5)
            assert float(y[0, t, 0, i + d // 2]) == pytest.approx(a * s + b * c, abs=1e-5)


@pytest.mark.parametrize("factor", [2.0, 4.0, 8.0], ids=lambda f: f"f{f:g}")
def test_rope_linear_is_plain_rope_at_position_over_factor(factor):
    d = 16
    rope = _rope(RopeScaling.linear, factor, d_head=d)
    pos = [0, 1, 3, 10, 77, 500]
    cos, sin = rope.rotary(torch.tensor([pos]))
    theta = _plain_inv_freq(d, 10000.0)
    ref = torch.tensor([[(p / factor) * theta[i % (d // 2)] for i in range(d)] for p in pos],
                       dtype=torch.float64)
    torch.testing.assert_close(cos[0, :, 0].double(), ref.cos(), atol=1e-5, rtol=0)
    torch.testing.assert_close(sin[0, :, 0].double(), ref.sin(), atol=1e-5, rtol=0)
    assert rope.attention_factor == 1.0


@pytest.mark.parametrize(("d_head", "base", "factor"),
                         [(16, 10000.0, 2.0), (64, 10000.0, 4.0), (128, 500000.0, 8.0)],
                         ids=["d16-f2", "d64-f4", "d128-base5e5-f8"])
def test_rope_ntk_raises_base(d_head, base, factor):
    rope = _rope(RopeScaling.ntk, factor, d_head=d_head, base=base)
    new_base = base * factor ** (d_head / (d_head - 2))
    ref = torch.tensor(_plain_inv_freq(d_head, new_base), dtype=torch.float64)
    torch.testing.assert_close(rope.inv_freq.double(), ref, rtol=1e-6, atol=0)
    assert rope.attention_factor == 1.0
    # highest frequency unchanged, lowest divided by exactly `factor`
    assert float(rope.inv_freq[0]) == 1.0
    assert float(rope.inv_freq[-1]) == pytest.approx(base ** (-(d_head - 2) / d_head) / factor,
                                                     rel=1e-6)


# HF transformers reference ---------------------------------------------------------------------


def _hf_config(d_head: int, max_len: int, rope_parameters: dict):
    from transformers import LlamaConfig

    return LlamaConfig(hidden_size=4 * d_head, num_attention_heads=4,
                                    head_dim=d_head, max_position_embeddings=max_len,
                                    rope_parameters=rope_parameters)


def _hf_init(kind: str, config):
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    if kind == "default":
        return LlamaRotaryEmbedding.compute_default_rope_parameters(config)
    return ROPE_INIT_FUNCTIONS[kind](config)


HF_CASES = [
    # (scaling, hf rope_type, d_head, base, factor, original, max_seq_len, extra yarn kwargs)
    pytest.param(RopeScaling.none, "default", 64, 10000.0, 1.0, None, 2048, {}, id="default"),
    pytest.param(RopeScaling.none, "default", 128, 500000.0, 1.0, None, 2048, {},
                 id="default-base5e5"),
    pytest.param(RopeScaling.linear, "linear", 64, 10000.0, 4.0, None, 2048, {}, id="linear4"),
    pytest.param(RopeScaling.linear, "linear", 32, 1e6, 2.5, None, 2048, {}, id="linear2.5"),
    pytest.param(RopeScaling.yarn, "yarn", 64, 10000.0, 4.0, 2048, 8192, {}, id="yarn4"),
    pytest.param(RopeScaling.yarn, "yarn", 128, 10000.0, 16.0, 4096, 65536, {}, id="yarn16"),
    pytest.param(RopeScaling.yarn, "yarn", 128, 500000.0, 8.0, 8192, 65536, {},
                 id="yarn8-base5e5"),
    pytest.param(RopeScaling.yarn, "yarn", 16, 10000.0, 2.0, 256, 512, {}, id="yarn2-d16"),
    pytest.param(RopeScaling.yarn, "yarn", 64, 10000.0, 4.0, None, 1024, {},
                 id="yarn4-original-from-max_seq_len"),
    pytest.param(RopeScaling.yarn, "yarn", 64, 10000.0, 4.0, 1024, 4096,
                 {"yarn_beta_fast": 16.0, "yarn_beta_slow": 2.0}, id="yarn4-betas16-2"),
    pytest.param(RopeScaling.yarn, "yarn", 64, 10000.0, 1.0, 1024, 1024, {}, id="yarn1"),
    pytest.param(RopeScaling.llama3, "llama3", 128, 500000.0, 8.0, 8192, 131072, {},
                 id="llama3-8"),
    pytest.param(RopeScaling.llama3, "llama3", 64, 10000.0, 4.0, 512, 2048,
                 {"low_freq_factor": 2.0, "high_freq_factor": 8.0}, id="llama3-4-lf2-hf8"),
    pytest.param(RopeScaling.llama3, "llama3", 32, 10000.0, 32.0, 64, 4096, {},
                 id="llama3-32-short"),
]


@pytest.mark.parametrize(
    ("scaling", "rope_type", "d_head", "base", "factor", "original", "max_seq_len", "extra"),
    HF_CASES)
def test_rope_matches_transformers(scaling, rope_type, d_head, base, factor, original,
                                   max_seq_len, extra):
    pytest.importorskip("transformers")
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    params = {"rope_type": rope_type, "rope_theta": base}
    if rope_type != "default":
        params["factor"] = factor
    if rope_type == "yarn":
        params["original_max_position_embeddings"] = original or max_seq_len
        if extra:
            params["beta_fast"] = extra["yarn_beta_fast"]
            params["beta_slow"] = extra["yarn_beta_slow"]
    if rope_type == "llama3":
        params["original_max_position_embeddings"] = original
        params["low_freq_factor"] = extra.get("low_freq_factor", 1.0)
        params["high_freq_factor"] = extra.get("high_freq_factor", 4.0)
    config = _hf_config(d_head, max_seq_len, params)
    hf_inv, hf_factor = _hf_init(rope_type, config)

    rope = _rope(scaling, factor, d_head=d_head, base=base, original=original,
                 max_seq_len=max_seq_len, **extra)
    torch.testing.assert_close(rope.inv_freq, hf_inv.float(), rtol=1e-5, atol=0)
    assert rope.attention_factor == pytest.approx(hf_factor, rel=1e-12)

    # and the cos/sin tables the model applies, attention factor included
    pos = torch.tensor([[0, 1, 2, 17, 300, 1000], [3, 4, 5, 6, 7, 8]])
    hf_cos, hf_sin = LlamaRotaryEmbedding(config)(torch.zeros(1, dtype=torch.float32), pos)
    cos, sin = rope.rotary(pos)
    assert cos.shape == (2, 6, 1, d_head)
    # HF rounds inv_freq to fp32 before the power, we after: one ulp of θ_i moves the angle at
    # p = 1000 by ~1000 · 2^-24 rad
    torch.testing.assert_close(cos[:, :, 0], hf_cos, atol=2e-4, rtol=0)
    torch.testing.assert_close(sin[:, :, 0], hf_sin, atol=2e-4, rtol=0)


def test_yarn_keeps_high_and_interpolates_low_frequencies():
    """YaRN (arXiv 2309.00071 §3.2): dims with wavelength < L/beta_fast keep θ_i, dims with
    wavelength > L/beta_slow use θ_i / s, and the ramp is monotone in between."""
    d, base, s, original = 64, 10000.0, 8.0, 2048
    rope = _rope(RopeScaling.yarn, s, d_head=d, base=base, original=original, max_seq_len=16384)
    theta = _plain_inv_freq(d, base)
    ratio = [float(rope.inv_freq[i]) / theta[i] for i in range(d // 2)]  # in [1/s, 1]
    for i, r in enumerate(ratio):
        rotations = original * theta[i] / (2 * math.pi)  # r(d) = L / λ_d
        assert 1 / s - 1e-6 <= r <= 1 + 1e-6
        if rotations > 32:
            assert r == pytest.approx(1.0, rel=1e-6), i
        if rotations < 1:
            assert r == pytest.approx(1 / s, rel=1e-6), i
    assert all(a >= b - 1e-7 for a, b in itertools.pairwise(ratio))  # high → low frequency
    assert rope.attention_factor == pytest.approx(0.1 * math.log(s) + 1)


# -------------------------------------------------------------------------------------- ALiBi


def _official_get_slopes(n: int) -> list[float]:
    """ofirpress/attention_with_linear_biases, fairseq/models/transformer.py get_slopes."""

    def get_slopes_power_of_2(n):
        start = 2 ** (-(2 ** -(math.log2(n) - 3)))
        ratio = start
        return [start * ratio**i for i in range(n)]

    if math.log2(n).is_integer():
        return get_slopes_power_of_2(n)
    closest_power_of_2 = 2 ** math.floor(math.log2(n))
    return (get_slopes_power_of_2(closest_power_of_2)
            + _official_get_slopes(2 * closest_power_of_2)[0::2][: n - closest_power_of_2])


def test_alibi_slopes_eight_heads():
    assert alibi_slopes(8) == pytest.approx([2.0**-h for h in range(1, 9)], rel=1e-12)


@pytest.mark.parametrize("n", [1, 2, 4, 8, 16, 32, 64], ids=lambda n: f"n{n}")
def test_alibi_slopes_power_of_two(n):
    assert alibi_slopes(n) == pytest.approx([2 ** (-8 * h / n) for h in range(1, n + 1)],
                                            rel=1e-12)


@pytest.mark.parametrize("n", [3, 5, 6, 7, 12, 20, 24, 40], ids=lambda n: f"n{n}")
def test_alibi_slopes_non_power_of_two(n):
    slopes = alibi_slopes(n)
    assert len(slopes) == n
    assert slopes == pytest.approx(_official_get_slopes(n), rel=1e-12)
    assert len(set(slopes)) == n and all(0 < s < 1 for s in slopes)


@pytest.mark.parametrize("n_heads", [4, 6], ids=lambda n: f"h{n}")
def test_alibi_score_bias_is_linear_in_distance(n_heads):
    alibi = _make(ALiBi, PositionConfig(name="alibi"), n_heads=n_heads, d_model=24,
                  d_head=4)
    q_pos = torch.tensor([[5, 6], [0, 3]])
    k_pos = torch.tensor([[0, 1, 2, 3, 4, 5, 6], [0, 1, 2, 3, 9, 9, 0]])
    bias = alibi.score_bias(q_pos, k_pos)
    assert bias.shape == (2, n_heads, 2, 7)
    slopes = _official_get_slopes(n_heads)
    for b in range(2):
        for h in range(n_heads):
            for i in range(2):
                for j in range(7):
                    expected = -slopes[h] * abs(int(q_pos[b, i]) - int(k_pos[b, j]))
                    assert float(bias[b, h, i, j]) == pytest.approx(expected, rel=1e-6, abs=0)


# ---------------------------------------------------------------------------------- T5 buckets


def _t5_bucket_reference(relative: int, *, bidirectional: bool, num_buckets: int,
                         max_distance: int) -> int:
    """Scalar port of mesh_tensorflow's _relative_position_bucket (T5, arXiv 1910.10683)."""
    ret = 0
    n = -relative
    if bidirectional:
        num_buckets //= 2
        if n < 0:
            ret += num_buckets
        n = abs(n)
    else:
        n = max(n, 0)
    max_exact = num_buckets // 2
    if n < max_exact:
        return ret + n
    val = max_exact + int(math.log(n / max_exact) / math.log(max_distance / max_exact)
                          * (num_buckets - max_exact))
    return ret + min(val, num_buckets - 1)


BUCKET_SETTINGS = [(32, 128), (16, 64), (8, 20), (10, 50), (64, 256), (32, 32), (6, 7),
                   (128, 1000)]
BIDIRECTIONAL = [pytest.param(True, id="bidirectional"), pytest.param(False, id="causal")]
RELATIVE = torch.arange(-300, 301)


@pytest.mark.parametrize("bidirectional", BIDIRECTIONAL)
@pytest.mark.parametrize(("num_buckets", "max_distance"), BUCKET_SETTINGS,
                         ids=[f"b{b}-d{d}" for b, d in BUCKET_SETTINGS])
def test_t5_bucket_matches_references(bidirectional, num_buckets, max_distance):
    got = t5_bucket(RELATIVE, bidirectional=bidirectional, num_buckets=num_buckets,
                    max_distance=max_distance)
    ref = [_t5_bucket_reference(int(r), bidirectional=bidirectional, num_buckets=num_buckets,
                                max_distance=max_distance) for r in RELATIVE]
    assert got.tolist() == ref

    t5 = pytest.importorskip("transformers.models.t5.modeling_t5")
    hf = t5.T5Attention._relative_position_bucket(
        RELATIVE, bidirectional=bidirectional, num_buckets=num_buckets, max_distance=max_distance)
    assert torch.equal(got, hf)


@pytest.mark.parametrize("bidirectional", BIDIRECTIONAL)
@pytest.mark.parametrize(("num_buckets", "max_distance"), BUCKET_SETTINGS,
                         ids=[f"b{b}-d{d}" for b, d in BUCKET_SETTINGS])
def test_t5_bucket_monotone_and_in_range(bidirectional, num_buckets, max_distance):
    b = t5_bucket(RELATIVE, bidirectional=bidirectional, num_buckets=num_buckets,
                  max_distance=max_distance)
    assert int(b.min()) >= 0 and int(b.max()) < num_buckets
    zero = 300  # index of relative 0
    past = b[: zero + 1].flip(0)  # relative 0, -1, -2, ...: non-decreasing in distance
    assert bool((past[1:] >= past[:-1]).all())
    assert past[:num_buckets // (4 if bidirectional else 2)].tolist() == list(
        range(num_buckets // (4 if bidirectional else 2)))  # exact buckets near 0
    future = b[zero + 1:]  # relative 1, 2, ...
    if bidirectional:
        assert bool((future[1:] >= future[:-1]).all())
        half = num_buckets // 2
        assert int(future.min()) >= half  # the future has its own half of the buckets
        assert int(past.max()) < half
    else:
        assert bool((future == 0).all())  # all future offsets share bucket 0


EDGE_BUCKETS = [(2, 1), (2, 2), (3, 2), (4, 2), (4, 3), (6, 3), (8, 4), (8, 5), (32, 16),
                (32, 17)]


@pytest.mark.parametrize("bidirectional", BIDIRECTIONAL)
@pytest.mark.parametrize(("num_buckets", "max_distance"), EDGE_BUCKETS,
                         ids=[f"b{b}-d{d}" for b, d in EDGE_BUCKETS])
def test_t5_bucket_in_range_for_every_accepted_config(bidirectional, num_buckets, max_distance):
    """Either the config check rejects (num_buckets, max_distance), or every bucket is a valid
    row of the bias table: an encoder uses bidirectional buckets, a decoder causal ones."""
    family = "encoder" if bidirectional else "decoder"
    m = ModelConfig(family=FamilyConfig(name=family),
                    position=PositionConfig(name="t5_bias", num_buckets=num_buckets,
                                            max_distance=max_distance))
    try:
        validate_model(m)
    except ConfigError:
        return
    try:
        b = t5_bucket(RELATIVE, bidirectional=bidirectional, num_buckets=num_buckets,
                      max_distance=max_distance)
    except ArithmeticError as e:
        pytest.fail(f"accepted config, but t5_bucket raised {e!r}")
    assert int(b.min()) >= 0 and int(b.max()) < num_buckets, (int(b.min()), int(b.max()))


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "bidirectional"])
def test_t5_bias_gathers_bucket_per_head(causal):
    cfg = PositionConfig(name="t5_bias", num_buckets=8, max_distance=20)
    t5 = _make(T5Bias, cfg, n_heads=3, d_model=12, d_head=4, causal=causal)
    with torch.no_grad():
        t5.bias.weight.copy_(torch.randn(8, 3, generator=torch.Generator().manual_seed(3)))
    q_pos = torch.tensor([[0, 4, 30], [7, 8, 9]])
    k_pos = torch.tensor([[0, 1, 2, 3, 4, 30], [0, 2, 9, 9, 12, 40]])
    bias = t5.score_bias(q_pos, k_pos).detach()
    assert bias.shape == (2, 3, 3, 6)
    for b in range(2):
        for i in range(3):
            for j in range(6):
                bucket = _t5_bucket_reference(int(k_pos[b, j] - q_pos[b, i]),
                                              bidirectional=not causal, num_buckets=8,
                                              max_distance=20)
                for h in range(3):
                    assert float(bias[b, h, i, j]) == float(t5.bias.weight[bucket, h].detach())


# -------------------------------------------------------------------- positions from inputs


def _positions_from_valid_reference(valid: list[list[bool]]) -> list[list[int]]:
    out = []
    for row in valid:
        count, pos = 0, []
        for v in row:
            if v:
                pos.append(count)
                count += 1
            else:
                pos.append(0)
        out.append(pos)
    return out


VALID_CASES = {
    "no-padding": [[1, 1, 1, 1, 1]],
    "left-padding": [[0, 0, 1, 1, 1], [0, 1, 1, 1, 1], [1, 1, 1, 1, 1]],
    "right-padding": [[1, 1, 1, 0, 0], [1, 0, 0, 0, 0], [1, 1, 1, 1, 1]],
    "both-sides": [[0, 1, 1, 0, 0], [0, 0, 0, 0, 1]],
    "all-padding-row": [[0, 0, 0, 0, 0], [1, 1, 0, 0, 0]],
}


@pytest.mark.parametrize("valid", list(VALID_CASES.values()), ids=list(VALID_CASES))
def test_positions_from_valid_counts_real_tokens(valid):
    """Real tokens: 0 at each row's first real token, counting real tokens only."""
    v = torch.tensor(valid, dtype=torch.bool)
    got = positions_from_valid(v)
    ref = torch.tensor(_positions_from_valid_reference(valid))
    assert got.shape == v.shape
    assert got[v].tolist() == ref[v].tolist()


@pytest.mark.parametrize("valid", list(VALID_CASES.values()), ids=list(VALID_CASES))
def test_positions_from_valid_padding_slots_are_zero(valid):
    """The documented contract: "padding slots get 0" (left and right padding alike)."""
    v = torch.tensor(valid, dtype=torch.bool)
    assert positions_from_valid(v).tolist() == _positions_from_valid_reference(valid)


def _positions_from_segments_reference(segments: list[list[int]]) -> list[list[int]]:
    out = []
    for row in segments:
        pos, prev, count = [], None, 0
        for s in row:
            count = 0 if s != prev else count + 1
            pos.append(count)
            prev = s
        out.append(pos)
    return out


SEGMENT_CASES = {
    "one-document": [[0, 0, 0, 0, 0, 0]],
    "packed": [[0, 0, 0, 1, 1, 2], [1, 1, 2, 2, 2, 2]],
    "single-token-docs": [[0, 1, 2, 3, 4, 5]],
    "repeated-id-nonadjacent": [[0, 0, 1, 1, 0, 0], [3, 3, 3, 7, 7, 3]],
    "trailing-padding-segment": [[1, 1, 1, 2, 2, 0], [1, 2, 2, 2, 0, 0]],
}


@pytest.mark.parametrize("segments", list(SEGMENT_CASES.values()), ids=list(SEGMENT_CASES))
def test_positions_from_segments_restart_per_document(segments):
    got = positions_from_segments(torch.tensor(segments))
    assert got.tolist() == _positions_from_segments_reference(segments)
