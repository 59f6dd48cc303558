"""Position schemes. Each implements up to three hooks that default to no-ops, so attention code
never asks which scheme it runs:

- ``embed(x, positions)``: absolute schemes add a vector per position to the token embedding;
- ``rotary(positions)``: rotary schemes return ``(cos, sin)`` once per forward, which attention
  applies to q and k with :func:`apply_rotary`;
- ``score_bias(q_positions, k_positions)``: relative schemes return an additive score bias
  ``(B, H, Tq, Tk)``.

A position component is built as ``Scheme(cfg: PositionConfig, *, d_model, d_head, n_heads,
max_seq_len, causal)`` (one per stack) and says its size in closed form with
``param_count(cfg, *, d_model, d_head, n_heads, max_seq_len)``. It states its own config rules
too, so the validator (config/validate_model.py) asks the scheme instead of testing its name:
``check(m, key)``, ``check_options(cfg, key)``, ``options`` (the fields it reads),
``positions_limit`` and whether it has a score bias or rotary angles.

Positions are always explicit ``(B, T)`` integer tensors: KV-cache decoding continues from the
prompt's last position, left-padded rows start at 0 at their first real token, and packed rows
restart at 0 at each document (see :func:`positions_from_valid`, :func:`positions_from_segments`).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from blocklab.config import ModelConfig, PositionConfig, RopeScaling
from blocklab.config.checks import finite, require


class Position(nn.Module):
    """The base class of position schemes: every hook is a no-op."""

    #: Largest number of positions the scheme can index; ``None`` = unbounded.
    max_positions: int | None = None
    #: The ``PositionConfig`` fields the scheme reads. Declared (a tuple), the fields another
    #: scheme declares are refused away from their defaults in a training config (this scheme
    #: would silently ignore them); ``None`` = not declared, no option is refused.
    options: tuple[str, ...] | None = None

    @classmethod
    def positions_limit(cls, cfg: PositionConfig, *, max_seq_len: int) -> int | None:
        """``max_positions`` of the scheme a config builds, without building it (config
        validation asks it before training)."""
        return None

    @classmethod
    def check(cls, m: ModelConfig, key: str) -> None:
        """The scheme's rules on model config ``m`` (``key``: its dotted prefix, ``model``):
        raise a one-line ConfigError (``blocklab.config.checks.require``). Part of
        ``validate_model``."""

    @classmethod
    def check_options(cls, cfg: PositionConfig, key: str) -> None:
        """Rules on options a training config must meet (``key``: ``model.position``); not
        part of ``validate_model``, so a model built directly may carry them."""

    @classmethod
    def has_score_bias(cls) -> bool:
        """Whether the scheme adds a score bias (score-based mixers apply it)."""
        return cls.score_bias is not Position.score_bias

    @classmethod
    def has_rotary(cls) -> bool:
        """Whether the scheme gives rotary angles (mixers that rotate q and k apply them)."""
        return cls.rotary is not Position.rotary

    def __init__(self, cfg: PositionConfig, *, d_model: int, d_head: int, n_heads: int,
                 max_seq_len: int, causal: bool) -> None:
        super().__init__()

    def embed(self, x: Tensor, positions: Tensor) -> Tensor:
        return x

    def rotary(self, positions: Tensor) -> tuple[Tensor, Tensor] | None:
        return None

    def score_bias(self, q_positions: Tensor, k_positions: Tensor) -> Tensor | None:
        return None


class NoPosition(Position):
    """No position information (NoPE): causal attention alone orders the tokens.
    "The Impact of Positional Encoding on Length Generalization in Transformers",
    arXiv 2305.19466."""

    options = ()

    @staticmethod
    def param_count(cfg: PositionConfig, **dims: int) -> int:
        return 0


class Sinusoidal(Position):
    """Fixed sinusoids, PE[p, 2i] = sin(p / 10000^(2i/d)), PE[p, 2i+1] = cos(same).
    "Attention Is All You Need", arXiv 1706.03762. Computed from the positions, so any length."""

    options = ()

    def __init__(self, cfg: PositionConfig, *, d_model: int, **kw: object) -> None:
        super().__init__(cfg, d_model=d_model, **kw)
        self.d_model = d_model
        inv_freq = 10000.0 ** (-torch.arange(0, d_model, 2, dtype=torch.float64) / d_model)
        self.register_buffer("inv_freq", inv_freq.float(), persistent=False)

    def embed(self, x: Tensor, positions: Tensor) -> Tensor:
        angles = positions[..., None].float() * self.inv_freq  # (B, T, ceil(d/2))
        pe = torch.stack((angles.sin(), angles.cos()), dim=-1).flatten(-2)  # (B, T, 2*ceil(d/2))
        return x + pe[..., : self.d_model].to(x.dtype)

    @staticmethod
    def param_count(cfg: PositionConfig, **dims: int) -> int:
        return 0


class Learned(Position):
    """A trained vector per absolute position (GPT-2, BERT). Cannot index past ``max_seq_len``."""

    options = ()

    def __init__(self, cfg: PositionConfig, *, d_model: int, max_seq_len: int,
                 **kw: object) -> None:
        super().__init__(cfg, d_model=d_model, max_seq_len=max_seq_len, **kw)
        self.max_positions = max_seq_len
        self.table = nn.Embedding(max_seq_len, d_model)

    @classmethod
    def positions_limit(cls, cfg: PositionConfig, *, max_seq_len: int) -> int | None:
        return max_seq_len

    def embed(self, x: Tensor, positions: Tensor) -> Tensor:
        compiling = torch.compiler.is_compiling()
        if not compiling and positions.numel() and int(positions.max()) >= self.max_positions:
            raise IndexError(f"learned positions: position {int(positions.max())} is beyond the "
                             f"table (model.max_seq_len={self.max_positions})")
        return x + F.embedding(positions, self.table.weight)

    @staticmethod
    def param_count(cfg: PositionConfig, *, d_model: int, max_seq_len: int, **dims: int) -> int:
        return max_seq_len * d_model


def t5_bucket(relative: Tensor, *, bidirectional: bool, num_buckets: int,
              max_distance: int) -> Tensor:
    """T5's bucketing of ``relative = k_pos - q_pos``: exact buckets for small distances,
    log-spaced up to ``max_distance``, one shared bucket beyond. "Exploring the Limits of
    Transfer Learning with a Unified Text-to-Text Transformer", arXiv 1910.10683."""
    bucket = torch.zeros_like(relative)
    if bidirectional:
        num_buckets //= 2
        bucket = bucket + (relative > 0).long() * num_buckets
        distance = relative.abs()
    else:
        distance = (-relative).clamp(min=0)  # only the past has distinct buckets
    max_exact = num_buckets // 2
    is_small = distance < max_exact
    log_ratio = torch.log(distance.float().clamp(min=1) / max_exact) / math.log(max_distance / max_exact)
    large = max_exact + (log_ratio * (num_buckets - max_exact)).long()
    large = large.clamp(max=num_buckets - 1)
    return bucket + torch.where(is_small, distance, large)


class T5Bias(Position):
    """Learned scalar bias per (head, relative-distance bucket), shared by all layers of a stack.
    Bidirectional buckets in an encoder, causal buckets in a decoder. arXiv 1910.10683."""

    options = ("num_buckets", "max_distance")

    @classmethod
    def check(cls, m: ModelConfig, key: str) -> None:
        p = m.position
        require(not (p.num_buckets < 4 or p.max_distance <= p.num_buckets // 2),
                f"{key}.position.num_buckets", p.num_buckets,
                f"t5_bias needs num_buckets >= 4 and max_distance > num_buckets/2 "
                f"(max_distance={p.max_distance})")

    def __init__(self, cfg: PositionConfig, *, n_heads: int, causal: bool, **kw: object) -> None:
        super().__init__(cfg, n_heads=n_heads, causal=causal, **kw)
        self.bidirectional = not causal
        self.num_buckets, self.max_distance = cfg.num_buckets, cfg.max_distance
        self.bias = nn.Embedding(cfg.num_buckets, n_heads)

    def score_bias(self, q_positions: Tensor, k_positions: Tensor) -> Tensor:
        relative = k_positions[:, None, :] - q_positions[:, :, None]  # (B, Tq, Tk)
        buckets = t5_bucket(relative, bidirectional=self.bidirectional,
                            num_buckets=self.num_buckets, max_distance=self.max_distance)
        return self.bias(buckets).permute(0, 3, 1, 2)  # (B, H, Tq, Tk)

    @staticmethod
    def param_count(cfg: PositionConfig, *, n_heads: int, **dims: int) -> int:
        return cfg.num_buckets * n_heads


def alibi_slopes(n_heads: int) -> list[float]:
    """Head slopes of ALiBi: the geometric sequence 2^(-8/n · h), h = 1..n, for n a power of two;
    otherwise the slopes of the nearest lower power of two plus every other slope of the next.
    "Train Short, Test Long", arXiv 2108.12409."""

    def power_of_two(n: int) -> list[float]:
        start = 2.0 ** (-8.0 / n)
        return [start ** (h + 1) for h in range(n)]

    if math.log2(n_heads).is_integer():
        return power_of_two(n_heads)
    lower = 2 ** math.floor(math.log2(n_heads))
    return power_of_two(lower) + alibi_slopes(2 * lower)[0::2][: n_heads - lower]


class ALiBi(Position):
    """Linear distance penalty ``-slope_h · |k_pos - q_pos|`` on attention scores, no position
    embedding; extrapolates past the training length. arXiv 2108.12409."""

    options = ()

    def __init__(self, cfg: PositionConfig, *, n_heads: int, **kw: object) -> None:
        super().__init__(cfg, n_heads=n_heads, **kw)
        self.register_buffer("slopes", torch.tensor(alibi_slopes(n_heads)), persistent=False)

    def score_bias(self, q_positions: Tensor, k_positions: Tensor) -> Tensor:
        distance = (k_positions[:, None, :] - q_positions[:, :, None]).abs().float()  # (B,Tq,Tk)
        return -self.slopes[None, :, None, None] * distance[:, None]  # (B, H, Tq, Tk)

    @staticmethod
    def param_count(cfg: PositionConfig, **dims: int) -> int:
        return 0


def rope_inv_freq(cfg: PositionConfig, d_head: int, max_seq_len: int) -> tuple[Tensor, float]:
    """Inverse frequencies of rotary embedding and the attention factor, per scaling variant.

    - none: base^(-2i/d) ("RoFormer", arXiv 2104.09864);
    - linear: positions divided by ``factor`` ("Position Interpolation", arXiv 2306.15595),
      expressed here as inv_freq / factor;
    - ntk: base raised to base · factor^(d/(d-2)) ("NTK-aware scaled RoPE", bloc97, 2023);
    - yarn: per-frequency blend of interpolation and extrapolation with a ramp between
      ``beta_fast`` and ``beta_slow`` rotations, and attention factor 0.1·ln(factor) + 1
      ("YaRN", arXiv 2309.00071);
    - llama3: wavelengths above ``original / low_freq_factor`` interpolated by ``factor``,
      those below ``original / high_freq_factor`` kept, a linear blend in between (Llama 3.1's
      rope scaling, "The Llama 3 Herd of Models", arXiv 2407.21783).
    """
    dims = torch.arange(0, d_head, 2, dtype=torch.float64) / d_head
    base, factor = cfg.base, cfg.factor
    if cfg.scaling is RopeScaling.ntk:
        base = base * factor ** (d_head / (d_head - 2))
    inv_freq = base ** -dims
    attention_factor = 1.0
    if cfg.scaling is RopeScaling.linear:
        inv_freq = inv_freq / factor
    elif cfg.scaling is RopeScaling.yarn:
        original = cfg.original_max_seq_len or max_seq_len

        def correction_dim(rotations: float) -> float:
            return d_head * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(base))

        low = max(math.floor(correction_dim(cfg.yarn_beta_fast)), 0)
        high = min(math.ceil(correction_dim(cfg.yarn_beta_slow)), d_head - 1)
        high = high + 0.001 if low == high else high
        ramp = ((torch.arange(d_head // 2, dtype=torch.float64) - low) / (high - low)).clamp(0, 1)
        extrapolate = 1 - ramp  # 1 for high-frequency dims (kept), 0 for low-frequency ones
        inv_freq = (inv_freq / factor) * (1 - extrapolate) + inv_freq * extrapolate
        attention_factor = 0.1 * math.log(factor) + 1.0 if factor > 1 else 1.0
    elif cfg.scaling is RopeScaling.llama3:
        original = cfg.original_max_seq_len or max_seq_len
        low, high = cfg.low_freq_factor, cfg.high_freq_factor
        wavelen = 2 * math.pi / inv_freq
        smooth = ((original / wavelen - low) / (high - low)).clamp(0, 1)  # 0 long, 1 short
        inv_freq = (1 - smooth) * inv_freq / factor + smooth * inv_freq
    return inv_freq.float(), attention_factor


class RoPE(Position):
    """Rotary position embedding: rotate q and k pairwise by angle p·θ_i so that q·k depends
    only on the offset (rotate-half layout, as GPT-NeoX / Llama). Angles are computed in fp32
    from the explicit positions (bf16 positions lose integers past 256). arXiv 2104.09864."""

    options = ("base", "scaling", "factor", "original_max_seq_len", "yarn_beta_fast",
               "yarn_beta_slow", "low_freq_factor", "high_freq_factor")

    @classmethod
    def check(cls, m: ModelConfig, key: str) -> None:
        """An even head dimension (pairs rotate), ``base > 1``, ``factor >= 1``, and llama3's
        frequency band ``0 < low_freq_factor < high_freq_factor``."""
        p = m.position
        require(not m.head_dim % 2, f"{key}.d_head", m.head_dim,
                "rope needs an even head dimension")
        require(not p.base <= 1, f"{key}.position.base", p.base, "must be > 1")
        require(not p.factor < 1, f"{key}.position.factor", p.factor, "must be >= 1")
        require(p.scaling is not RopeScaling.llama3
                or 0 < p.low_freq_factor < p.high_freq_factor,
                f"{key}.position.low_freq_factor", p.low_freq_factor,
                f"llama3 scaling needs 0 < low_freq_factor < high_freq_factor="
                f"{p.high_freq_factor}")

    @classmethod
    def check_options(cls, cfg: PositionConfig, key: str) -> None:
        """``factor`` only with a scaling (else ignored), ``original_max_seq_len`` null or
        >= 1, YaRN's betas > 0."""
        require(cfg.scaling is not RopeScaling.none or cfg.factor == 1.0, f"{key}.factor",
                cfg.factor, "only used with position.scaling linear, ntk, yarn or llama3 "
                "(scaling is none)", "set model.position.scaling too, or leave factor at 1.0")
        require(cfg.original_max_seq_len is None or cfg.original_max_seq_len >= 1,
                f"{key}.original_max_seq_len", cfg.original_max_seq_len,
                "must be null or >= 1")
        for o in ("yarn_beta_fast", "yarn_beta_slow"):
            value = getattr(cfg, o)
            require(finite(value) and value > 0, f"{key}.{o}", value, "must be > 0")

    def __init__(self, cfg: PositionConfig, *, d_head: int, max_seq_len: int,
                 **kw: object) -> None:
        super().__init__(cfg, d_head=d_head, max_seq_len=max_seq_len, **kw)
        inv_freq, self.attention_factor = rope_inv_freq(cfg, d_head, max_seq_len)
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def rotary(self, positions: Tensor) -> tuple[Tensor, Tensor]:
        angles = positions[..., None].float() * self.inv_freq  # (B, T, d_head/2)
        angles = torch.cat((angles, angles), dim=-1)[:, :, None]  # (B, T, 1, d_head)
        cos, sin = angles.cos(), angles.sin()
        if self.attention_factor != 1.0:
            cos, sin = cos * self.attention_factor, sin * self.attention_factor
        return cos, sin

    @staticmethod
    def param_count(cfg: PositionConfig, **dims: int) -> int:
        return 0


def apply_rotary(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate ``x`` (B, T, H, d_head), token-major, by the angles behind ``cos``/``sin``
    (B, T, 1, d_head). Attention rotates queries and keys together, in one call, straight from
    the fused QKV projection (before the heads are moved to dim 1)."""
    if cos.dtype != x.dtype:
        cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


def positions_from_valid(valid: Tensor) -> Tensor:
    """(B, T) positions for a padded batch: 0 at each row's first real token, counting real
    tokens only (left and right padding alike); padding slots get 0."""
    return torch.where(valid.bool(), valid.long().cumsum(-1) - 1, 0)


def positions_from_segments(segments: Tensor, valid: Tensor | None = None) -> Tensor:
    """(B, T) positions for packed rows: 0 at each document's first real token, counting the
    real tokens of the document only (padding inside or around a document never advances a
    position, as :func:`positions_from_valid`); padding slots get 0."""
    from blocklab.model.masks import document_starts

    real = torch.ones_like(segments, dtype=torch.bool) if valid is None else valid.bool()
    count = real.long().cumsum(-1)  # real tokens up to and including t
    starts = document_starts(segments, valid)
    # real tokens before the current document began: the count just before its first token
    before = torch.where(starts, count - 1, torch.zeros_like(count)).cummax(-1).values
    return torch.where(real, count - 1 - before, 0)


POSITIONS: dict[str, type[Position]] = {
    "none": NoPosition,
    "sinusoidal": Sinusoidal,
    "learned": Learned,
    "t5_bias": T5Bias,
    "rope": RoPE,
    "alibi": ALiBi,
}
