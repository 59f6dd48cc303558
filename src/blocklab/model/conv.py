"""Gated convolutions: the ``gated_conv`` sequence mixer, the gated-convolution family that
"Zoology: Measuring and Improving Recall in Efficient Language Models" (arXiv 2312.04927)
uses as its BaseConv baseline — the operator of "Hungry Hungry Hippos" (H3, arXiv 2212.14052)
and "Hyena" (arXiv 2302.10866) reduced to one gate: ``y = W_o((W_g x) ⊙ long(short(W_u x)))``.
It is in blocklab because it is the reference point that fails associative recall: a fixed
(input-independent) filter cannot look a key up, the gate only modulates what it passes.

- ``short``: a depthwise convolution of ``model.mixer.short_conv`` taps (causal: the token and
  the ``k - 1`` before it; bidirectional: centred, ``k // 2`` back and ``k - 1 - k // 2``
  ahead), as Zoology's ShortConvolution;
- ``long`` (``model.mixer.long_conv``): a depthwise convolution with an explicit per-channel
  filter of ``L = model.max_seq_len`` taps (bidirectional: ``L`` taps back, ``L - 1`` ahead),
  Zoology's LongConvolution, initialised decaying (channel ``c`` decays over ``τ_c`` tokens,
  ``τ`` log-spaced over ``[1, L]``, as Hyena's exponential modulation). Its reach is ``L``: a
  token further than ``L - 1`` real tokens away contributes nothing, in training and decoding
  alike (a sequence longer than ``L`` is not refused; the filter just stops there).

Exactness: every convolution counts *real tokens* — a row's real tokens move to the front
before convolving and back after (seqops.py's compacted rows, shared with the other mixers),
so left, right and inner padding give the row-alone outputs — and packed documents never mix:
the short taps never cross a document boundary (seqops.short_conv), and the long filter restarts at each
document by :func:`packed_conv` (a divide-and-conquer over power-of-two blocks, exact and
shape-static; cost ``O(T · log² T · d)``). Without packing the long convolution is one FFT of
length ``2T`` (:func:`fft_conv`, ``O(T log T · d)``).

Decoding (causal stacks) keeps the last ``k - 1`` real inputs of the short convolution and,
with the long one, every earlier input of the long filter: a buffer of ``capacity`` slots
whose slot ``o`` holds the row's ``o``-th real token, so the state grows with the context
(``state_bytes = B · d · (k - 1 + T) · bytes``) and a decode step costs ``O(T · d)``.

Shape legend: B batch, T tokens, d d_model, k short taps, L long taps (model.max_seq_len),
C cache capacity (buffer slots), N FFT length, nb blocks of 2m tokens.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from blocklab.config import ModelConfig
from blocklab.config.checks import require
from blocklab.model import seqops
from blocklab.model.cache import Step, check_no_grad
from blocklab.model.mixer import Mixer, Sequence, State

# ------------------------------------------------------------------------- the convolutions


def fft_length(t: int) -> int:
    """The FFT length of a linear convolution of ``t`` tokens: ``2t`` (>= 2t - 1, so no lag
    wraps around; a circular convolution of length ``t`` would mix a row's end into its
    start)."""
    return 2 * t


def _taps(kern: Tensor, use: int, n: int) -> Tensor:
    """(d, L) filter -> (n, d) fp32: its first ``use`` taps, time-major, zeros after (the
    filter's reach is its length)."""
    taps = kern[:, :use].t().float()
    return F.pad(taps, (0, 0, 0, n - taps.shape[0]))


def fft_conv(w: Tensor, pos: Tensor, neg: Tensor | None = None) -> Tensor:
    """``y_t = Σ_{s<=t} pos[t-s] w_s`` (+ ``Σ_{s>t} neg[s-t-1] w_s``: two-sided) over the
    whole row, by FFT in fp32: w (B, T, d), pos (d, L), neg (d, L - 1) -> (B, T, d)."""
    t = w.shape[1]
    n = fft_length(t)
    k = _taps(pos, t, n)  # (N, d) lags 0 .. T-1
    if neg is not None and t > 1:  # lags -1 .. -(T-1) at N-1 .. N-T+1 (circular indices)
        k = k + F.pad(_taps(neg, t - 1, t - 1).flip(0), (0, 0, n - (t - 1), 0))
    kf = torch.fft.rfft(k, n=n, dim=0)  # (N/2+1, d)
    wf = torch.fft.rfft(w.float(), n=n, dim=1)  # (B, N/2+1, d)
    return torch.fft.irfft(wf * kf, n=n, dim=1)[:, :t]  # (B, T, d)


def _cross(w: Tensor, doc: Tensor, kern: Tensor, m: int) -> Tensor:
    """One level of :func:`packed_conv`: in every block of ``2m`` tokens, what its left half
    gives its right half through the causal filter ``kern`` (d, L) (lags 1 .. 2m-1). A pair
    (s left, t right) is in one document iff both are in the document that crosses the
    middle (documents are contiguous runs): the mask is a product of an input and an output
    mask, so the pair sum is one FFT of length 2m per block (2m >= 3m - 1 - m: no output
    wraps)."""
    b, tp, d = w.shape
    wb = w.view(b, tp // (2 * m), 2, m, d)  # (B, nb, 2, m, d)
    db = doc.view(b, tp // (2 * m), 2, m)
    enter = (db[:, :, 0] == db[:, :, 1, :1])[..., None]  # (B, nb, m, 1) in the middle's doc
    reach = (db[:, :, 1] == db[:, :, 0, -1:])[..., None]
    kf = torch.fft.rfft(_taps(kern, 2 * m, 2 * m), dim=0)  # (m+1, d)
    xf = torch.fft.rfft(wb[:, :, 0] * enter, n=2 * m, dim=2)  # (B, nb, m+1, d)
    right = torch.fft.irfft(xf * kf, n=2 * m, dim=2)[:, :, m:] * reach  # (B, nb, m, d)
    return torch.stack((torch.zeros_like(right), right), 2).reshape(b, tp, d)


def packed_conv(w: Tensor, doc: Tensor, pos: Tensor, neg: Tensor | None = None) -> Tensor:
    """:func:`fft_conv` within each packed document only: w (B, T, d), doc (B, T) ids whose
    equal values are contiguous runs (real tokens first, padding one run of its own).

    Exact and shape-static: the row is padded to ``2^K >= T`` and every pair of distinct
    tokens meets at exactly one level ``m = 1, 2, .., 2^(K-1)`` — the block of ``2m`` where
    they sit in different halves — which :func:`_cross` sums by FFT; lag 0 is a product. The
    anti-causal half of a two-sided filter is the same sum on the flipped row. Cost: ``K``
    levels of FFTs of length ``2m`` over the row, ``O(T · log² T · d)``, against
    ``O(T² · d)`` for a masked direct (Toeplitz) form."""
    t = w.shape[1]
    tp = 1 << (t - 1).bit_length()  # a power of two >= T
    w = F.pad(w.float(), (0, 0, 0, tp - t))  # (B, 2^K, d)
    doc = F.pad(doc, (0, tp - t), value=-1)
    y = w * pos[:, 0].float()
    anti = None if neg is None else F.pad(neg, (1, 0))  # lag l ahead -> neg[l - 1]
    m = 1
    while m < tp:
        y = y + _cross(w, doc, pos, m)
        if anti is not None:
            y = y + _cross(w.flip(1), doc.flip(1), anti, m).flip(1)
        m *= 2
    return y[:, :t]


def gate(g: Tensor, c: Tensor) -> Tensor:
    """The one multiplicative interaction of the operator (BaseConv's ``⊙``, H3's and Hyena's
    gates): the convolution's output modulated per token and channel by ``W_g x``."""
    return g * c


# ----------------------------------------------------------------------------- decode state

class ConvState(State):
    """Per row: ``tail``, the last ``k - 1`` real inputs of the short convolution (zeros
    before the first), and with the long one ``inputs``, its input at every real token so far
    (slot ``o`` = the row's ``o``-th real token)."""

    def __init__(self, batch: int, taps: int, slots: int | None, d_model: int, *,
                 dtype: torch.dtype, device: torch.device | str) -> None:
        self.tail = torch.zeros(batch, taps - 1, d_model, dtype=dtype, device=device)
        if slots is not None:
            self.inputs = torch.zeros(batch, slots, d_model, dtype=dtype, device=device)
        self.docs: Tensor | None = None  # (B, C) each slot's document (carry forwards)

    @property
    def nbytes(self) -> int:
        """The values (the slots' document ids are bookkeeping, as the books' are)."""
        return sum(t.nbytes for k, t in self.tensors().items() if k != "docs")


# ------------------------------------------------------------------------------------ mixer

@dataclass
class ConvOptions:
    """The ``gated_conv`` mixer's options (``model.mixer.<option>``)."""

    short_conv: int = 3  # taps of the depthwise short convolution (>= 1)
    # a filter of model.max_seq_len taps (its reach), by FFT in training; the decode state
    # then grows with the context, like a KV cache
    long_conv: bool = True


class GatedConv(Mixer):
    """``y = W_o((W_g x) ⊙ long(short(W_u x)))`` (see the module docstring: Zoology's BaseConv,
    arXiv 2312.04927; H3, arXiv 2212.14052; Hyena, arXiv 2302.10866). No rotary angles, no
    score bias: positions enter only as the convolutions' token distances."""

    residual_outputs = ("out",)
    options = ConvOptions

    def __init__(self, m: ModelConfig, layer: int, *, causal: bool) -> None:
        super().__init__(m, layer, causal=causal)
        o = m.mixer.read(ConvOptions)
        d, k, n = m.d_model, o.short_conv, m.max_seq_len
        self.proj = nn.Linear(d, 2 * d)  # u and the gate g
        self.out = nn.Linear(d, d)
        #: taps after the token (bidirectional: centred); tap i of ``short`` sees x_{t-i+ahead}
        self.ahead = 0 if causal else k - 1 - k // 2
        self.short = nn.Parameter(torch.empty(d, k))
        self.short_bias = nn.Parameter(torch.zeros(d))
        self.long = nn.Parameter(torch.empty(d, n)) if o.long_conv else None
        self.long_ahead = (nn.Parameter(torch.empty(d, n - 1))
                           if o.long_conv and not causal else None)
        self.init_weights()

    def init_weights(self) -> None:
        """After the model's default init: the short taps as torch's Conv1d (±1/sqrt(k)); the
        long filter decaying, unit energy per channel (halved per side when two-sided)."""
        with torch.no_grad():
            k = self.short.shape[1]
            self.short.uniform_(-k ** -0.5, k ** -0.5)
            sides = [f for f in (self.long, self.long_ahead) if f is not None]
            for f in sides:
                _decaying_(f, len(sides) ** -0.5)

    def forward(self, x: Tensor, seq: Sequence, state: State | None) -> Tensor:
        u, g = self.proj(x).chunk(2, dim=-1)  # (B, T, d) each
        rows = seqops.compact(seq)  # real tokens first, in order, padding behind them
        u = rows.gather(u).float()
        if state is None:
            c = self._convolve(u, rows)
        else:
            assert isinstance(state, ConvState) and seq.cache is not None
            check_no_grad(u, seq.cache)
            c = self._decode(u, seq.cache.step, state, rows)
        c = rows.scatter(c)  # back to the caller's token order
        return self.out(gate(g, c.to(g.dtype)))

    def _short(self, u: Tensor, rows: seqops.Compact,
               tail: Tensor | None = None) -> tuple[Tensor, Tensor | None]:
        """The short convolution (seqops.short_conv, ``short`` flipped to conv1d's
        orientation), padding's outputs zeroed: padding never enters the long filter."""
        w, tail = seqops.short_conv(u, self.short.flip(1), self.short_bias, rows,
                                    ahead=self.ahead, tail=tail)
        return (w if rows.real is None else w * rows.real[..., None]), tail

    def _convolve(self, u: Tensor, rows: seqops.Compact) -> Tensor:
        """Training / encoder forward over compacted rows: (B, T, d) fp32."""
        w, _ = self._short(u, rows)
        if self.long is None:
            return w
        if rows.docs is None:
            return fft_conv(w, self.long, self.long_ahead)
        return packed_conv(w, rows.docs, self.long, self.long_ahead)

    def _decode(self, u: Tensor, step: Step, state: ConvState, rows: seqops.Compact) -> Tensor:
        """A forward of T new tokens continuing the state (prefill chunk or step)."""
        w, tail = self._short(u, rows, state.tail)
        state.put("tail", tail)  # the last k - 1 real inputs
        if self.long is None:
            return w
        return self._decode_long(w, step, state, rows)

    def _decode_long(self, w: Tensor, step: Step, state: ConvState,
                     rows: seqops.Compact) -> Tensor:
        """Write this forward's real long-filter inputs at their orders (fixed shapes, in
        place; rebound in a carry cache), then convolve the buffer: directly for one token
        (O(C · d)), else by FFT — or directly, each token over its own document's slots,
        when a carry cache holds two documents in a row (packed rows)."""
        b, t, d = w.shape
        seen, n_real = step.before, step.seen - step.before  # (B,) real tokens before, new
        end = step.end  # slots that may be used
        slot = torch.arange(end, device=w.device) - seen[:, None]  # (B, end) index in w
        written = ((slot >= 0) & (slot < n_real[:, None]))[..., None]
        new = w.gather(1, slot.clamp(0, t - 1)[..., None].expand(b, end, d))
        inputs = state.inputs[:, :end]  # (B, end, d), a view: written in place
        if state.functional:
            inputs = torch.where(written, new.to(inputs.dtype), inputs)
            state.inputs = torch.cat((inputs, state.inputs[:, end:]), 1)
        else:
            inputs.copy_(torch.where(written, new.to(inputs.dtype), inputs))
        orders = seen[:, None] + torch.arange(t, device=w.device)  # (B, T)
        if step.segments is not None:  # a carry forward: each slot's document id
            if state.docs is None:
                state.docs = torch.zeros(state.inputs.shape[:2], dtype=torch.long,
                                         device=w.device)
            seg = rows.gather(step.segments[..., None])[..., 0]  # (B, T) compacted
            docs = torch.where(written[..., 0], seg.gather(1, slot.clamp(0, t - 1)),
                               state.docs[:, :end])
            state.docs = torch.cat((docs, state.docs[:, end:]), 1)
            held = torch.arange(end, device=w.device) < step.seen[:, None]  # (B, end)
            if bool(((docs != docs[:, :1]) & held).any()):  # the slots hold two documents
                return _packed_decode(self.long, state.inputs[:, :end], seg, docs, orders)
        if t > 1:
            y = fft_conv(inputs, self.long)  # (B, end, d)
            return y.gather(1, orders.clamp(max=end - 1)[..., None].expand(b, t, d))
        n = self.long.shape[1]
        lag = orders[:, :, None] - torch.arange(end, device=w.device)  # (B, 1, end)
        taps = self.long.float().t()[lag.clamp(0, n - 1)]  # (B, 1, end, d)
        taps = taps * ((lag >= 0) & (lag < n))[..., None]
        return torch.einsum("btsd,bsd->btd", taps, inputs.float())

    def new_state(self, batch: int, capacity: int, *, dtype: torch.dtype,
                  device: torch.device | str, static: bool = False) -> State:
        if self.long is not None and capacity is None:
            raise ValueError("gated_conv with long_conv keeps every input (it grows with the "
                             "context): make its carry cache with a capacity (the document "
                             "length)")
        return ConvState(batch, self.short.shape[1], None if self.long is None else capacity,
                         self.short.shape[0], dtype=dtype, device=device)

    @classmethod
    def param_count(cls, m: ModelConfig, layer: int, *, causal: bool) -> int:
        """``W_u, W_g, W_o`` with biases (``3d² + 3d``), the short taps and bias (``d·k +
        d``), the long filter (``d·L`` causal, ``d·(2L - 1)`` two-sided)."""
        o = m.mixer.read(ConvOptions)
        d, k, n = m.d_model, o.short_conv, m.max_seq_len
        long = (n if causal else 2 * n - 1) * d if o.long_conv else 0
        return 3 * d * d + 3 * d + d * k + d + long

    @classmethod
    def flops_per_token(cls, m: ModelConfig, layer: int, *, seq_len: int,
                        causal: bool) -> float:
        """The training forward: ``2·`` the projections' parameters, ``2·(d·k + d)`` for the
        short convolution, ``d`` for the gate, and the long one's FFT: a real FFT of length
        ``N = 2T`` and its inverse per channel (``2.5·N·log2 N`` each, the ``5·N·log2 N``
        complex convention halved) plus ``6`` per frequency bin, per token ``d·(10·log2(2T)
        + 6)`` (the filter's own FFT, shared by the batch, not counted). Packed documents
        cost ``~log2 T`` times that (:func:`packed_conv`); a decode step costs ``2·T·d``."""
        o = m.mixer.read(ConvOptions)
        d, k = m.d_model, o.short_conv
        flops = 2.0 * (3 * d * d + 3 * d) + 2 * (d * k + d) + d
        if o.long_conv:
            flops += d * (10 * math.log2(2 * seq_len) + 6)
        return flops

    @classmethod
    def state_bytes(cls, m: ModelConfig, layer: int, *, batch: int, seq_len: int,
                    bytes_per_value: int) -> int:
        """The short tail (``k - 1`` inputs) and, with the long filter, one input per token:
        ``B · d · (k - 1 + T) · bytes`` — it grows with the context, like a KV cache."""
        o = m.mixer.read(ConvOptions)
        slots = o.short_conv - 1 + (seq_len if o.long_conv else 0)
        return batch * m.d_model * slots * bytes_per_value

    @classmethod
    def growing_carry(cls, m: ModelConfig) -> str | None:
        return "model.mixer.long_conv=true" if m.mixer.read(ConvOptions).long_conv else None

    @classmethod
    def check(cls, m: ModelConfig, layer: int, *, causal: bool, key: str) -> None:
        o = m.mixer.read(ConvOptions)
        require(o.short_conv >= 1, f"{key}.short_conv", o.short_conv,
                "gated_conv needs a short convolution of >= 1 taps",
                f"e.g. {key}.short_conv=3")


def _decaying_(f: Tensor, scale: float) -> None:
    """``f[c, j] ~ N(0, 1) · exp(-j / τ_c)``, ``τ`` log-spaced over ``[1, L]``, each channel
    rescaled to norm ``scale`` (Hyena's exponentially modulated filters, arXiv 2302.10866)."""
    d, n = f.shape
    tau = torch.logspace(0, math.log10(max(n, 1)), d, device=f.device)  # (d,)
    f.normal_().mul_(torch.exp(-torch.arange(n, device=f.device) / tau[:, None]))
    f.mul_(scale / f.norm(dim=1, keepdim=True).clamp(min=1e-6))


def _packed_decode(long: Tensor, inputs: Tensor, seg: Tensor, docs: Tensor,
                   orders: Tensor) -> Tensor:
    """A carry forward in which a document starts: each token (its document ``seg`` (B, T),
    its order) convolves the slots ``inputs`` (B, C, d) of its own document (``docs`` (B, C))
    directly, O(T · C · d)."""
    n, end = long.shape[1], inputs.shape[1]
    lag = orders[:, :, None] - torch.arange(end, device=inputs.device)  # (B, T, C)
    ok = (lag >= 0) & (lag < n) & (seg[:, :, None] == docs[:, None, :])
    taps = long.float().t()[lag.clamp(0, n - 1)] * ok[..., None]  # (B, T, C, d)
    return torch.einsum("btsd,bsd->btd", taps, inputs.float())
