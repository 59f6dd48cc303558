"""The ``ssm`` mixer (model/ssm.py, "Mamba", arXiv 2312.00752) against independent references:

- the chunked scan against a plain loop over t (each packed document run alone from a zero
  state), at chunk sizes that do and don't divide T, with padding (Δ = 0) and a start state;
- the whole mixer against Hugging Face's ``MambaMixer`` (its PyTorch path) with the same
  weights, on tiny random configs;
- the mixer with holes inside rows and packed documents against each row / document alone;
- decoding in chunks of any size (and one token at a time, static or growing state) against
  the full forward;
- its cost (closed-form parameters, state bytes in any dtype, flat FLOPs and state in T), its
  initialisation after the model's default init, and its config rules.

Negative controls: Δ, B, C made constant over t fail the HF parity; the state not reset at a
document start fails the packed reference; the decay applied once too often fails the loop
reference. The grid (tests/model/variants.py) runs every invariant, cache and compile test on
the mixer too.
"""

from __future__ import annotations

import itertools
import math

import pytest
import torch
import torch.nn.functional as F
from transformers import MambaConfig
from transformers.models.mamba.modeling_mamba import MambaMixer

from blocklab.config import ConfigError, MixerConfig, ModelConfig, compose, validate_model
from blocklab.model import build_model, ssm
from blocklab.model.mixer import Sequence
from blocklab.model.ssm import SelectiveSSM, SSMState, selective_scan

ATOL = 1e-5


def _config(d_model: int = 16, **options: object) -> ModelConfig:
    return ModelConfig(d_model=d_model, n_heads=2, mixer=MixerConfig(name="ssm", **options))


def _seq(b: int, t: int, valid=None, segments=None) -> Sequence:
    return Sequence(positions=torch.arange(t).expand(b, t), valid=valid, segments=segments,
                    causal=True, position=None)  # type: ignore[arg-type]


def _mixer(d_model: int = 16, **options: object) -> SelectiveSSM:
    torch.manual_seed(0)
    mixer = SelectiveSSM(_config(d_model, **options), 0, causal=True).eval()
    with torch.no_grad():  # a less trivial A and D than the initial ones
        mixer.A_log.add_(0.5 * torch.randn_like(mixer.A_log))
        mixer.D.normal_()
    return mixer


# ------------------------------------------------------------------- scan vs a plain loop

def _loop(u, dt, A, B, C, h=None):
    """The recurrence token by token (float64): (T, E) inputs of one row -> y (T, E), h."""
    h = torch.zeros(A.shape, dtype=torch.float64) if h is None else h.double()
    ys = []
    for t in range(u.shape[0]):
        h = torch.exp(dt[t, :, None] * A) * h + (dt[t] * u[t])[:, None] * B[t]
        ys.append((h * C[t]).sum(-1))
    return torch.stack(ys), h


def _scan_inputs(b: int, t: int, e: int = 5, n: int = 3):
    g = torch.Generator().manual_seed(1)
    u, C, B = (torch.randn(b, t, k, generator=g) for k in (e, n, n))
    dt = F.softplus(torch.randn(b, t, e, generator=g))  # large decays too (up to e^-30)
    A = -torch.rand(e, n, generator=g) * 4 - 0.1
    return u, dt, A, B, C


# rows: [document starts], [padding]; packed rows restart at their starts
ROWS = [([0], []), ([0, 4, 5], []), ([2, 9], [0, 1, 6, 7]), ([0], [10, 11, 12])]


def _packed_batch(t: int = 13):
    starts = torch.zeros(len(ROWS), t, dtype=torch.bool)
    valid = torch.ones(len(ROWS), t, dtype=torch.bool)
    for r, (first, pads) in enumerate(ROWS):
        starts[r, first] = True
        valid[r, pads] = False
    return starts, valid


def _documents(r: int, t: int) -> list[list[int]]:
    """Row ``r``'s documents: the real token indices of each."""
    first, pads = ROWS[r]
    real = [i for i in range(t) if i not in pads]
    bounds = [real.index(s) for s in first] + [len(real)]
    return [real[a:b] for a, b in itertools.pairwise(bounds)]


@pytest.mark.parametrize(("method", "chunk"), [("chunked", c) for c in (1, 3, 4, 5, 13, 64)]
                         + [("sequential", 64)])
def test_the_scan_equals_each_document_run_alone_by_a_plain_loop(method, chunk):
    """Packed documents (restarts), padding (Δ = 0 there, anywhere in the row) and chunk sizes
    that do (1, 13) and don't (3, 4, 5, 64) divide T = 13; the sequential scan too."""
    t = 13
    u, dt, A, B, C = _scan_inputs(len(ROWS), t)
    starts, valid = _packed_batch(t)
    y, h = selective_scan(u, dt * valid[..., None], A, B, C, starts=starts, chunk=chunk,
                          method=method)
    for r in range(len(ROWS)):
        for doc in _documents(r, t):
            want, last = _loop(*(v[r, doc].double() for v in (u, dt)), A.double(),
                               *(v[r, doc].double() for v in (B, C)))
            torch.testing.assert_close(y[r, doc].double(), want, atol=ATOL, rtol=ATOL)
        torch.testing.assert_close(h[r].double(), last, atol=ATOL, rtol=ATOL)  # last document's


@pytest.mark.parametrize(("method", "chunk"), [("chunked", 2), ("chunked", 5), ("sequential", 5)])
def test_the_scan_continues_from_a_start_state(method, chunk):
    u, dt, A, B, C = _scan_inputs(2, 11)
    h0 = torch.randn(2, *A.shape)
    y, h = selective_scan(u, dt, A, B, C, h0=h0, chunk=chunk, method=method)
    for r in range(2):
        want, last = _loop(u[r].double(), dt[r].double(), A.double(), B[r].double(),
                           C[r].double(), h0[r])
        torch.testing.assert_close(y[r].double(), want, atol=ATOL, rtol=ATOL)
        torch.testing.assert_close(h[r].double(), last, atol=ATOL, rtol=ATOL)


def test_negative_control_the_decay_applied_once_too_often_fails_the_loop(monkeypatch):
    real = ssm.chunk_decay
    monkeypatch.setattr(ssm, "chunk_decay", lambda dt, A, starts: real(dt, A, starts)
                        * (dt[..., None] * A).exp())
    with pytest.raises(AssertionError):
        test_the_scan_equals_each_document_run_alone_by_a_plain_loop("chunked", 4)


def _scan_grads(method: str, chunk: int = 4) -> list[torch.Tensor]:
    """∂L/∂(u, Δ, A, B, C, h0) in float64 for packed, padded rows (L weighs every output and
    the last state): by the scan, or (``method="loop"``) by autograd through the plain loop,
    each document from zero (the first from h0)."""
    t = 13
    u, dt, A, B, C = (v.double() for v in _scan_inputs(len(ROWS), t))
    starts, valid = _packed_batch(t)
    starts[:, 0] = False  # each row's first document continues from h0
    dt = dt * valid[..., None]
    h0 = torch.randn(len(ROWS), *A.shape, dtype=torch.float64,
                     generator=torch.Generator().manual_seed(2))
    leaves = [v.requires_grad_() for v in (u, dt, A, B, C, h0)]
    wy = torch.randn(u.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    if method == "loop":
        loss = 0
        for r in range(len(ROWS)):
            bounds = [*sorted({0, *ROWS[r][0]}), t]  # padding stays in place: Δ = 0 there
            for j, (a, b) in enumerate(itertools.pairwise(bounds)):
                y, h = _loop(u[r, a:b], dt[r, a:b], A, B[r, a:b], C[r, a:b],
                             h0[r] if j == 0 else None)
                loss = loss + (y * wy[r, a:b]).sum()
            loss = loss + (h * h).sum()
    else:
        y, h = selective_scan(u, dt, A, B, C, starts=starts, h0=h0, chunk=chunk, method=method)
        loss = (y * wy).sum() + (h * h).sum()
    return list(torch.autograd.grad(loss, leaves))


@pytest.mark.parametrize("method", ["sequential", "chunked"])
def test_the_scan_s_gradients_equal_autograd_through_the_plain_loop(method):
    """The sequential scan's hand-written backward (and the chunked form's autograd) against
    autograd through the token-by-token loop: every input, packed documents, padding, h0."""
    names = ("u", "dt", "A", "B", "C", "h0")
    for name, got, want in zip(names, _scan_grads(method), _scan_grads("loop"), strict=True):
        torch.testing.assert_close(got, want, atol=1e-9, rtol=1e-7, msg=name)


def test_negative_control_a_backward_without_the_decay_s_term_fails_the_loop(monkeypatch):
    real = ssm.SequentialScan.backward

    def no_decay_grad(ctx, gy, gh):
        grads = list(real(ctx, gy, gh))
        grads[2] = torch.zeros_like(grads[2])  # ∂L/∂A dropped
        return tuple(grads)

    monkeypatch.setattr(ssm.SequentialScan, "backward", staticmethod(no_decay_grad))
    with pytest.raises(AssertionError):
        test_the_scan_s_gradients_equal_autograd_through_the_plain_loop("sequential")


def test_the_sequential_scan_passes_gradcheck():
    g = torch.Generator().manual_seed(4)
    u, dt, B, C = (torch.randn(2, 6, k, dtype=torch.float64, generator=g) for k in (3, 3, 2, 2))
    dt = F.softplus(dt)
    A = -torch.rand(3, 2, dtype=torch.float64, generator=g) - 0.1
    h0 = torch.randn(2, 3, 2, dtype=torch.float64, generator=g)
    keep = torch.tensor([[1, 1, 0, 1, 1, 1], [1, 1, 1, 1, 0, 1]], dtype=torch.float64)
    inputs = [v.requires_grad_() for v in (u, dt, A, B, C, h0)]
    assert torch.autograd.gradcheck(
        lambda u, dt, A, B, C, h0: ssm.SequentialScan.apply(u, dt, A, B, C, keep, h0), inputs)


def test_the_two_scans_train_the_mixer_alike():
    """``model.mixer.scan`` chunked and sequential: the same outputs and parameter gradients
    on packed, padded rows (fp32)."""
    t = 13
    starts, valid = _packed_batch(t)
    seq = _seq(len(ROWS), t, valid, starts.long().cumsum(-1))
    x = torch.randn(len(ROWS), t, 16)
    grads = []
    for scan in ("chunked", "sequential"):
        mixer = _mixer(d_state=3, d_conv=3, chunk=4, scan=scan).train()
        out = mixer(x, seq, None)
        (out * valid[..., None]).square().sum().backward()
        grads.append([out.detach()] + [p.grad for p in mixer.parameters()])
    for got, want in zip(*grads, strict=True):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)


def test_the_scan_does_not_overflow_under_strong_decays():
    """A trained model's reset tokens decay by e^-hundreds at once: only exp of non-positive
    sums is ever taken, so no inf/NaN, and the state after a full reset is the new input."""
    u, dt, A, B, C = _scan_inputs(1, 16)
    dt = dt * 300
    y, h = selective_scan(u, dt, A, B, C, chunk=16)
    assert torch.isfinite(y).all() and torch.isfinite(h).all()
    want, _ = _loop(u[0].double(), dt[0].double(), A.double(), B[0].double(), C[0].double())
    torch.testing.assert_close(y[0].double(), want, atol=1e-4, rtol=1e-5)


# ---------------------------------------------------------------- parity with Hugging Face

HF_CASES = [  # (d_model, options)
    (16, {"d_state": 4, "expand": 2, "d_conv": 3, "dt_rank": 3, "chunk": 4}),
    (16, {"d_state": 8, "expand": 1, "d_conv": 4, "chunk": 5}),  # dt_rank null = 1
    (24, {"d_state": 2, "expand": 3, "d_conv": 1, "dt_rank": 5, "chunk": 64}),
    (16, {"d_state": 4, "d_conv": 3, "chunk": 4, "scan": "chunked"}),  # on CPU, auto: sequential
]


def _hf_pair(d_model: int, options: dict) -> tuple[SelectiveSSM, MambaMixer]:
    mixer = _mixer(d_model, **options)
    e, n, r, k = ssm.ssm_dims(_config(d_model, **options))
    hf = MambaMixer(MambaConfig(hidden_size=d_model, state_size=n, expand=e // d_model,
                                conv_kernel=k, time_step_rank=r, num_hidden_layers=1,
                                use_bias=False, use_conv_bias=True, hidden_act="silu",
                                use_cache=False), 0).eval()
    names = {"conv1d.weight": "conv.weight", "conv1d.bias": "conv.bias",
             "out_proj.weight": "out.weight"}
    ours = mixer.state_dict()
    hf.load_state_dict({name: ours[names.get(name, name)] for name in hf.state_dict()})
    return mixer, hf


@pytest.mark.parametrize(("d_model", "options"), HF_CASES)
def test_the_mixer_equals_hugging_face_mamba_mixer(d_model, options):
    mixer, hf = _hf_pair(d_model, options)
    x = torch.randn(2, 13, d_model)
    with torch.no_grad():
        got, want = mixer(x, _seq(2, 13), None), hf(x)
    torch.testing.assert_close(got, want, atol=ATOL, rtol=0)


def test_negative_control_input_independent_selection_fails_hugging_face_parity(monkeypatch):
    """Δ, B and C held at their mean over t (an LTI SSM, S4-like) is not Mamba."""
    real = SelectiveSSM.selection

    def constant(self, u):
        return tuple(v.mean(1, keepdim=True).expand_as(v) for v in real(self, u))

    monkeypatch.setattr(SelectiveSSM, "selection", constant)
    with pytest.raises(AssertionError):
        test_the_mixer_equals_hugging_face_mamba_mixer(*HF_CASES[0])


# ------------------------------------------------------- padding and packing, mixer level

@pytest.mark.parametrize("options", [{"d_conv": 3, "chunk": 4}, {"d_conv": 4, "chunk": 64},
                                     {"d_conv": 3, "chunk": 4, "scan": "chunked"}])
def test_holes_and_packed_documents_equal_each_document_alone(options):
    """Padding at the left, right and inside rows, packed documents: every document's outputs
    are those of its real tokens run alone (the convolution counts real tokens only)."""
    mixer = _mixer(d_state=3, **options)
    t = 13
    starts, valid = _packed_batch(t)
    segments = starts.long().cumsum(-1)  # a document id per token (padding: its neighbour's)
    x = torch.randn(len(ROWS), t, 16)
    with torch.no_grad():
        got = mixer(x, _seq(len(ROWS), t, valid, segments), None)
        for r in range(len(ROWS)):
            for doc in _documents(r, t):
                want = mixer(x[r: r + 1, doc], _seq(1, len(doc)), None)
                torch.testing.assert_close(got[r, doc], want[0], atol=ATOL, rtol=0,
                                           msg=f"row {r}, document {doc}")


def test_negative_control_no_reset_at_a_document_start_fails_the_packed_reference(monkeypatch):
    real = ssm.selective_scan
    monkeypatch.setattr(ssm, "selective_scan",
                        lambda *a, starts=None, **k: real(*a, starts=None, **k))
    with pytest.raises(AssertionError):
        test_holes_and_packed_documents_equal_each_document_alone({"d_conv": 1, "chunk": 4})


# --------------------------------------------------------------------------------- decoding

@pytest.mark.parametrize("static", [False, True])
@pytest.mark.parametrize(("sizes", "options"), [
    ((1,) * 12, {"d_conv": 4, "chunk": 3}),  # token by token: the tail spans several steps
    ((5, 1, 4, 2), {"d_conv": 3, "chunk": 2}),
    ((7, 5), {"d_conv": 1, "chunk": 64}),
])
def test_decoding_in_chunks_equals_the_full_forward(static, sizes, options):
    """Left-padded rows (and a hole), fed in chunks of any size into one state: each row's
    outputs are its real tokens' full forward."""
    mixer = _mixer(d_state=3, **options)
    t = sum(sizes)
    valid = torch.ones(3, t, dtype=torch.bool)
    valid[0, :3] = False
    valid[2, [0, 6]] = False
    x = torch.randn(3, t, 16)
    state = mixer.new_state(3, t, dtype=torch.float32, device="cpu", static=static)
    outs, start = [], 0
    with torch.no_grad():
        for size in sizes:
            sl = slice(start, start + size)
            outs.append(mixer(x[:, sl], _seq(3, size, valid[:, sl]), state))
            start += size
        got = torch.cat(outs, 1)
        for r in range(3):
            want = mixer(x[r: r + 1, valid[r]], _seq(1, int(valid[r].sum())), None)
            torch.testing.assert_close(got[r, valid[r]], want[0], atol=ATOL, rtol=0)


def test_decoding_with_gradients_on_is_refused():
    mixer = _mixer()
    state = mixer.new_state(1, 4, dtype=torch.float32, device="cpu")
    with pytest.raises(RuntimeError, match="no_grad"):
        mixer(torch.randn(1, 2, 16), _seq(1, 2), state)


def test_a_bf16_model_keeps_its_state_in_fp32_and_stays_close_to_fp32():
    mixer = _mixer(d_state=4)
    x = torch.randn(2, 9, 16)
    state = mixer.new_state(2, 9, dtype=torch.bfloat16, device="cpu")
    with torch.no_grad():
        want = mixer(x, _seq(2, 9), None)
        half = mixer.to(torch.bfloat16)
        got = half(x[:, :5].bfloat16(), _seq(2, 5), state)
        got = torch.cat((got, half(x[:, 5:].bfloat16(), _seq(2, 4), state)), 1)
    assert state.h.dtype == torch.float32 and state.tail.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), want, atol=0.05, rtol=0.05)


# -------------------------------------------------------------------- cost, init and rules

@pytest.mark.parametrize(("d_model", "options"), HF_CASES)
def test_cost_model_matches_the_module_and_is_flat_in_t(d_model, options):
    m = _config(d_model, **options)
    mixer = SelectiveSSM(m, 0, causal=True)
    assert SelectiveSSM.param_count(m, 0, causal=True) == sum(p.numel()
                                                               for p in mixer.parameters())
    for dtype, size in ((torch.float32, 4), (torch.bfloat16, 2)):
        state = mixer.new_state(3, 10, dtype=dtype, device="cpu")
        assert isinstance(state, SSMState)
        for seq_len in (10, 100_000):
            assert state.nbytes == SelectiveSSM.state_bytes(m, 0, batch=3, seq_len=seq_len,
                                                            bytes_per_value=size)
    flops = [SelectiveSSM.flops_per_token(m, 0, seq_len=s, causal=True) for s in (16, 16384)]
    assert flops[0] == flops[1] > 2 * SelectiveSSM.param_count(m, 0, causal=True)


def test_mambas_initialisation_survives_the_models_default_init():
    model = build_model(ModelConfig(vocab_size=32, d_model=32, n_heads=2, n_layers=2,
                                    mixer=MixerConfig(name="ssm", d_state=6)))
    for block in model.decoder.blocks:
        mixer = block.attn
        assert isinstance(mixer, SelectiveSSM)
        torch.testing.assert_close(-mixer.A_log.exp(),
                                   -torch.arange(1.0, 7.0).expand(mixer.d_inner, 6))
        assert (mixer.D == 1).all()
        dt = F.softplus(mixer.dt_proj.bias)
        assert ((dt > 0.99 * ssm.DT_MIN) & (dt < 1.01 * ssm.DT_MAX)).all()
        assert mixer.dt_proj.weight.abs().max() <= mixer.dt_rank ** -0.5


@pytest.mark.parametrize(("option", "value"), [("d_state", 0), ("expand", 0), ("d_conv", 0),
                                             ("chunk", 0), ("dt_rank", 0), ("scan", "fast")])
def test_bad_options_fail_in_one_line_naming_the_option(option, value):
    with pytest.raises(ConfigError) as err:
        validate_model(_config(**{option: value}))
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith(f"config error: model.mixer.{option}={value!r}"), msg


def test_the_shipped_option_file_composes_and_validates():
    cfg = compose("train", ["experiment=smoke", "model/mixer=ssm", "model/position=none"])
    m = cfg.model.mixer
    assert (m.name, m.d_state, m.expand, m.d_conv, m.dt_rank) == ("ssm", 16, 2, 4, None)
    from blocklab.config import validate_train
    from blocklab.train.run import to_train_config

    validate_train(to_train_config(cfg))
    assert math.ceil(cfg.model.d_model / 16) == ssm.ssm_dims(to_train_config(cfg).model)[2]
