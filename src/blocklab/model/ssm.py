"""The ``ssm`` sequence mixer: a selective state space — Mamba's mixer, in pure PyTorch.

"Mamba: Linear-Time Sequence Modeling with Selective State Spaces", Gu & Dao 2023, arXiv
2312.00752. Per token, ``in_proj`` gives the x branch and the gate z (``E = expand·d``); x runs
through a depthwise causal convolution of ``d_conv`` taps and SiLU; ``x_proj`` reads from it the
*input-dependent* step ``Δ = softplus(dt_proj(Δ_low))`` and the state maps B, C (the selection
that makes it content-aware); with ``A = -exp(A_log)`` (E, N) each channel keeps an N-wide
state, ``h_t = exp(Δ_t A) ⊙ h_{t-1} + Δ_t B_t u_t``, read out as ``y_t = C_t · h_t + D ⊙ u_t``,
gated by SiLU(z) and projected back by ``out``. The layout and the initialisation are Hugging
Face's ``MambaMixer`` (tests/model/test_ssm.py checks the outputs against it).

Exactness, as the seam asks (model/mixer.py): padding has ``Δ = 0`` (``exp(0) = 1``, ``Δ B u =
0``: the state passes through untouched) and the convolution counts real tokens only (real
tokens moved to the front, convolved, scattered back: seqops.py, shared with the other
mixers), so left, right and inner padding give the row-alone outputs; at a packed
document's first token (``seq.starts()``) the state and the convolution restart.

Decoding keeps, per row, the last ``d_conv - 1`` real convolution inputs and the state h (fp32):
constant in the context length, O(1) per token.

Shape legend: B batch, T tokens, d d_model, E d_inner, N d_state, R dt_rank, K d_conv taps,
nc chunks of L tokens.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from blocklab.config import ModelConfig
from blocklab.config.checks import require
from blocklab.model import seqops
from blocklab.model.cache import check_no_grad
from blocklab.model.mixer import Mixer, Sequence, State

#: Hugging Face's / the paper's initial range of Δ (dt_min, dt_max) and its floor
DT_MIN, DT_MAX, DT_FLOOR = 1e-3, 1e-1, 1e-4


@dataclass
class SSMOptions:
    """The ``ssm`` mixer's options (``model.mixer.<option>``)."""

    d_state: int = 16  # state size per channel
    expand: int = 2  # d_inner = expand * d_model
    d_conv: int = 4  # causal depthwise convolution taps
    dt_rank: int | None = None  # null = ceil(d_model / 16)
    # the training scan: sequential (a step per token, hand-written backward) | chunked
    # (chunk + T / chunk steps) | auto (sequential on CPU, chunked on accelerators)
    scan: str = "auto"
    chunk: int = 32  # tokens per chunk of the chunked scan


def ssm_dims(m: ModelConfig) -> tuple[int, int, int, int]:
    """(E, N, R, K): d_inner, d_state, dt_rank (null = ceil(d_model / 16)), d_conv."""
    o = m.mixer.read(SSMOptions)
    rank = math.ceil(m.d_model / 16) if o.dt_rank is None else o.dt_rank
    return o.expand * m.d_model, o.d_state, rank, o.d_conv


class SSMState(State):
    """One layer's decode state: the last ``K - 1`` real convolution inputs of each row (in
    the cache's dtype; zeros before a row has that many) and the state h, in fp32."""

    def __init__(self, batch: int, d_inner: int, d_state: int, d_conv: int, *,
                 dtype: torch.dtype, device: torch.device | str) -> None:
        self.tail = torch.zeros(batch, d_conv - 1, d_inner, dtype=dtype, device=device)
        self.h = torch.zeros(batch, d_inner, d_state, dtype=torch.float32, device=device)


# --------------------------------------------------------------------------- the scan

#: ``model.mixer.scan``: how the training scan runs (``auto``: sequential on CPU)
SCANS = ("auto", "sequential", "chunked")


def selective_scan(u: Tensor, dt: Tensor, A: Tensor, B: Tensor, C: Tensor, *,
                   starts: Tensor | None = None, h0: Tensor | None = None,
                   chunk: int = 64, method: str = "chunked") -> tuple[Tensor, Tensor]:
    """``h_t = exp(Δ_t A) ⊙ h_{t-1} + Δ_t B_t u_t`` (h restarting where ``starts``), ``y_t =
    C_t · h_t``: u, dt (B, T, E), A (E, N), B and C (B, T, N), h0 (B, E, N) or None (zeros) ->
    y (B, T, E) and the last state (B, E, N), all fp32.

    ``method="sequential"``: :class:`SequentialScan`, one step per token. ``"chunked"``, linear
    in T: within each chunk of L tokens the recurrence runs from zero for all
    chunks at once (L steps), the state entering a chunk is carried from chunk to chunk (T/L
    steps) and reaches each of its tokens with the decay ``exp(cumulative log-decay)``, in
    parallel (:func:`chunk_decay`). Mamba's decay differs per channel *and* state (E, N), so
    the quadratic intra-chunk form of linear attention would cost L·T·E·N memory, and its
    factorised form ``exp(cum_t)·exp(-cum_s)`` overflows once a chunk decays by more than
    e^88 (trained models do, at a reset token); this split only ever takes ``exp`` of sums
    of non-positive log-decays, so it cannot overflow."""
    if method == "sequential":
        keep = None if starts is None else (~starts).to(u.dtype)
        h = u.new_zeros(u.shape[0], *A.shape) if h0 is None else h0.to(u.dtype)
        return SequentialScan.apply(u, dt, A, B, C, keep, h)
    b, t, e = u.shape
    n = A.shape[1]
    size = min(chunk, t)
    nc = -(-t // size)
    pad = nc * size - t
    if pad:  # Δ = 0 past the end: the state passes through unchanged
        u, dt, B, C = (F.pad(v, (0, 0, 0, pad)) for v in (u, dt, B, C))
        starts = None if starts is None else F.pad(starts, (0, pad), value=False)
    log_decay = dt[..., None] * A  # (B, T', E, N), <= 0
    x = (dt * u)[..., None] * B[:, :, None, :]  # (B, T', E, N): Δ B u
    decay = log_decay.exp()
    if starts is not None:  # a document's first token forgets what came before
        decay = decay * (~starts)[..., None, None]
    shape = (b, nc, size, e, n)
    local = _local_states(decay.view(shape), x.view(shape))  # (B, nc, L, E, N)
    into = chunk_decay(dt.view(b, nc, size, e), A,
                       None if starts is None else starts.view(b, nc, size))
    h = torch.zeros(b, e, n, dtype=u.dtype, device=u.device) if h0 is None else h0.to(u.dtype)
    entering = []
    # unbind, not t[:, c]: one backward for all slices (each select's would fill a full grad)
    for keep, add in zip(into[:, :, -1].unbind(1), local[:, :, -1].unbind(1), strict=True):
        entering.append(h)  # sequential across chunks
        h = keep * h + add  # (B, E, N)
    states = local + into * torch.stack(entering, 1)[:, :, None]  # (B, nc, L, E, N)
    y = torch.einsum("bclen,bcln->bcle", states, C.view(b, nc, size, n))
    return y.reshape(b, nc * size, e)[:, :t], h


class SequentialScan(torch.autograd.Function):
    """The scan one token at a time with a hand-written backward (a reverse scan): every step
    works on one (B, E, N) state that stays in cache, and only the states h_t are kept for the
    backward — on CPU 4-5x faster than the chunked form, whose (B, T, E, N) intermediates and
    their autograd dominate its time (docs/mixers.md). ``keep`` (B, T) is 0 at a document's
    first token (its decay is zeroed), or None.

    With ``d_t = exp(Δ_t A)·keep_t`` and ``g_t = ∂L/∂h_t = g_{t+1} d_{t+1} + gy_t ⊗ C_t``:
    ``∂L/∂(Δ_t u_t) = Σ_n g_t B_t``, ``∂L/∂B_t = Σ_e g_t Δ_t u_t``, ``∂L/∂C_t = Σ_e gy_t h_t``
    and, through the decay, ``ℓ_t = g_t ⊙ h_{t-1} ⊙ d_t`` gives ``∂L/∂Δ_t += Σ_n ℓ_t A`` and
    ``∂L/∂A = Σ_{b,t} ℓ_t Δ_t``; ``∂L/∂h0 = g_0 d_0``."""

    @staticmethod
    def forward(ctx: Any, u: Tensor, dt: Tensor, A: Tensor, B: Tensor, C: Tensor,
                keep: Tensor | None, h0: Tensor) -> tuple[Tensor, Tensor]:
        dts, xs, Bs, Cs = (v.transpose(0, 1) for v in (dt, dt * u, B, C))  # token-major views
        hs, ys, h = [], [], h0
        for i in range(u.shape[1]):
            h = torch.addcmul(_decay(dts[i], A, keep, i).mul_(h), xs[i, :, :, None],
                              Bs[i, :, None, :])
            hs.append(h)
            ys.append((h * Cs[i, :, None, :]).sum(-1))
        ctx.save_for_backward(u, dt, A, B, C, keep, h0, torch.stack(hs))  # every state
        return torch.stack(ys, 1), h.clone()

    @staticmethod
    def backward(ctx: Any, gy: Tensor | None, gh: Tensor | None) -> tuple:
        u, dt, A, B, C, keep, h0, H = ctx.saved_tensors
        t = u.shape[1]
        gy = torch.zeros_like(u) if gy is None else gy
        dts, xs, Bs, Cs, gys = (v.transpose(0, 1) for v in (dt, dt * u, B, C, gy))
        gx, ddt, dB, dC = [], [], [], []  # per token, last first
        dA = torch.zeros_like(h0)  # Σ over t of ℓ_t Δ_t, summed over rows at the end
        g = torch.zeros_like(h0) if gh is None else gh
        d = None
        for i in range(t - 1, -1, -1):
            if d is not None:
                g = g * d  # d_{i+1}
            g = torch.addcmul(g, gys[i, :, :, None], Cs[i, :, None, :])  # ∂L/∂h_i
            dC.append((gys[i, :, :, None] * H[i]).sum(1))
            gx.append((g * Bs[i, :, None, :]).sum(-1))
            dB.append((g * xs[i, :, :, None]).sum(1))
            d = _decay(dts[i], A, keep, i)
            ell = (g * (H[i - 1] if i else h0)).mul_(d)
            ddt.append((ell * A).sum(-1))
            dA = dA.addcmul(ell, dts[i, :, :, None])
        gx_, ddt_, dB_, dC_ = (torch.stack(v[::-1], 1) for v in (gx, ddt, dB, dC))
        return gx_ * dt, ddt_ + gx_ * u, dA.sum(0), dB_, dC_, None, g * d


def _decay(dt: Tensor, A: Tensor, keep: Tensor | None, i: int) -> Tensor:
    """Token i's decay ``exp(Δ_i A)`` (B, E, N), zero at a document's first token."""
    d = torch.exp(dt[:, :, None] * A)
    return d if keep is None else d.mul_(keep[:, i, None, None])


def _local_states(decay: Tensor, x: Tensor) -> Tensor:
    """The recurrence inside every chunk at once, each from a zero state: (B, nc, L, E, N)."""
    h = torch.zeros_like(x[:, :, 0])  # (B, nc, E, N)
    out = []
    for keep, add in zip(decay.unbind(2), x.unbind(2), strict=True):
        h = keep * h + add
        out.append(h)
    return torch.stack(out, 2)


def chunk_decay(dt: Tensor, A: Tensor, starts: Tensor | None) -> Tensor:
    """(B, nc, L, E, N): how much of the state entering a chunk survives to each of its tokens
    — ``exp`` of the cumulative log-decay since the chunk began (``A · Σ Δ``: A is the same at
    every token, so the sum runs over the (B, nc, L, E) steps, N times smaller than the
    log-decays; a cumulative sum along a middle dimension was a quarter of the scan's time),
    zero from a document start on. dt (B, nc, L, E), A (E, N)."""
    into = (dt.cumsum(2)[..., None] * A).exp()
    if starts is not None:
        alive = starts.cumsum(2) == 0  # (B, nc, L): no document began in the chunk so far
        into = into * alive[..., None, None]
    return into


# ------------------------------------------------------------------------------- mixer

class SelectiveSSM(Mixer):
    """Mamba's selective state-space mixer (arXiv 2312.00752; see the module docstring).
    Causal only: the state runs left to right (an encoder–decoder keeps softmax in its encoder,
    ``model.mixer.encoder``). No rotary angles and no score bias: position comes from the
    recurrence and the convolution."""

    bidirectional = False
    residual_outputs = ("out",)
    options = SSMOptions

    def __init__(self, m: ModelConfig, layer: int, *, causal: bool) -> None:
        super().__init__(m, layer, causal=causal)
        e, n, r, k = ssm_dims(m)
        self.d_inner, self.d_state, self.dt_rank, self.d_conv = e, n, r, k
        opts = m.mixer.read(SSMOptions)
        self.chunk, self.scan = opts.chunk, opts.scan
        self.in_proj = nn.Linear(m.d_model, 2 * e, bias=False)
        self.conv = nn.Conv1d(e, e, k, groups=e)  # weight (E, 1, K): applied tap by tap
        self.x_proj = nn.Linear(e, r + 2 * n, bias=False)
        self.dt_proj = nn.Linear(r, e)
        self.A_log = nn.Parameter(torch.empty(e, n))
        self.D = nn.Parameter(torch.empty(e))
        self.out = nn.Linear(e, m.d_model, bias=False)
        self.init_weights()

    @torch.no_grad()
    def init_weights(self) -> None:
        """Mamba's initialisation (after the model's GPT-2 default, which would zero D and
        draw A_log and the Δ bias from N(0, σ)): ``A = -(1..N)`` per channel (S4D-real),
        ``D = 1``, Δ log-uniform in [1e-3, 0.1] through the inverse softplus of the dt bias,
        dt weights uniform in ±R^-1/2, the convolution as PyTorch's with a zero bias."""
        a = torch.arange(1, self.d_state + 1, dtype=torch.float32, device=self.A_log.device)
        self.A_log.copy_(a.log().expand_as(self.A_log))
        self.D.fill_(1.0)
        bound = self.dt_rank ** -0.5
        nn.init.uniform_(self.dt_proj.weight, -bound, bound)
        dt = torch.exp(torch.rand(self.d_inner, device=self.D.device)
                       * (math.log(DT_MAX) - math.log(DT_MIN)) + math.log(DT_MIN))
        dt = dt.clamp(min=DT_FLOOR)
        self.dt_proj.bias.copy_(dt + torch.log(-torch.expm1(-dt)))  # softplus⁻¹(dt)
        nn.init.kaiming_uniform_(self.conv.weight, a=math.sqrt(5))
        nn.init.zeros_(self.conv.bias)

    def forward(self, x: Tensor, seq: Sequence, state: State | None) -> Tensor:
        if state is not None:
            assert isinstance(state, SSMState)
        u, z = self.in_proj(x).chunk(2, dim=-1)  # (B, T, E) each
        if state is not None:
            check_no_grad(u, seq.cache)
        u = F.silu(self._conv(u, seq, state))
        dt, B, C = self.selection(u)
        if seq.valid is not None:  # padding: Δ = 0, the state passes through
            dt = dt * seq.valid[..., None]
        A = -torch.exp(self.A_log.float())  # (E, N)
        y, h = selective_scan(u.float(), dt, A, B.float(), C.float(), starts=seq.starts(),
                              h0=None if state is None else state.h, chunk=self.chunk,
                              method=self._method(u))
        if state is not None:
            state.put("h", h)
        y = (y + u.float() * self.D.float()) * F.silu(z.float())  # (B, T, E)
        return self.out(y.to(x.dtype))

    def _method(self, u: Tensor) -> str:
        """``model.mixer.scan``; ``auto``: the sequential scan on CPU, the chunked one (fewer,
        larger steps) on accelerators."""
        if self.scan != "auto":
            return self.scan
        return "sequential" if u.device.type == "cpu" else "chunked"

    def selection(self, u: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """The input-dependent parameters: Δ (B, T, E) fp32, B and C (B, T, N)."""
        low, B, C = self.x_proj(u).split([self.dt_rank, self.d_state, self.d_state], dim=-1)
        return F.softplus(self.dt_proj(low).float()), B, C

    def _conv(self, u: Tensor, seq: Sequence, state: SSMState | None) -> Tensor:
        """The depthwise causal convolution over each row's real tokens, restarting at each
        document (seqops): (B, T, E) -> (B, T, E); with a state, its taps reach the cached
        inputs and it keeps the newest ``K - 1``."""
        rows = seqops.compact(seq)
        out, tail = seqops.short_conv(rows.gather(u), self.conv.weight[:, 0], self.conv.bias,
                                      rows, tail=None if state is None else state.tail)
        if state is not None:
            state.put("tail", tail)
        return rows.scatter(out)

    def new_state(self, batch: int, capacity: int, *, dtype: torch.dtype,
                  device: torch.device | str, static: bool = False) -> State:
        """The same fixed-size state for growing and static caches (updates are in place)."""
        return SSMState(batch, self.d_inner, self.d_state, self.d_conv, dtype=dtype,
                        device=device)

    @classmethod
    def param_count(cls, m: ModelConfig, layer: int, *, causal: bool) -> int:
        """in_proj ``2dE``, out ``Ed``, conv ``E(K+1)``, x_proj ``E(R+2N)``, dt_proj ``E(R+1)``,
        A_log ``EN``, D ``E``: ``3dE + E(K + 2R + 3N + 3)``."""
        e, n, r, k = ssm_dims(m)
        return 3 * m.d_model * e + e * (k + 2 * r + 3 * n + 3)

    @classmethod
    def flops_per_token(cls, m: ModelConfig, layer: int, *, seq_len: int,
                        causal: bool) -> float:
        """Constant in T: the projections ``2(3dE + 2E(R+N))``, the convolution ``2EK``, the
        recurrence ``8EN`` (Δ·A, exp, Δ·B·u, the update's multiply-add, the read-out's) and
        ``10E`` per channel (softplus, SiLUs, skip, gate)."""
        e, n, r, k = ssm_dims(m)
        return 2.0 * (3 * m.d_model * e + 2 * e * (r + n)) + 2 * e * k + 8 * e * n + 10 * e

    @classmethod
    def state_bytes(cls, m: ModelConfig, layer: int, *, batch: int, seq_len: int,
                    bytes_per_value: int) -> int:
        """Constant in T: the convolution tail ``B·E·(K-1)`` values and h ``B·E·N`` in fp32."""
        e, n, _, k = ssm_dims(m)
        return batch * e * ((k - 1) * bytes_per_value + n * 4)

    @classmethod
    def check(cls, m: ModelConfig, layer: int, *, causal: bool, key: str) -> None:
        o = m.mixer.read(SSMOptions)
        for name in ("d_state", "expand", "d_conv", "chunk"):
            value = getattr(o, name)
            require(isinstance(value, int) and value >= 1, f"{key}.{name}", value,
                    "ssm needs an integer >= 1")
        require(o.scan in SCANS, f"{key}.scan", o.scan, f"one of {', '.join(SCANS)}")
        require(o.dt_rank is None or (isinstance(o.dt_rank, int) and o.dt_rank >= 1),
                f"{key}.dt_rank", o.dt_rank, "ssm needs null (= ceil(d_model / 16)) or an "
                "integer >= 1")
