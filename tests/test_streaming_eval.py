"""The streaming evaluator (eval/streaming.py) the ``sinks`` experiment scores with: against a
naive per-token loop and the full forward, with negative controls."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from blocklab.eval import streaming as st

N = 40  # tokens per stream


def _model(**mixer: object) -> torch.nn.Module:
    """A tiny NoPE decoder; the same weights for any ``mixer`` options (parameter-free)."""
    from blocklab.config import MixerConfig, ModelConfig, PositionConfig
    from blocklab.model import build_model

    torch.manual_seed(0)
    return build_model(ModelConfig(vocab_size=32, d_model=32, n_layers=2, n_heads=2, d_ff=64,
                                   max_seq_len=16, position=PositionConfig(name="none"),
                                   mixer=MixerConfig(**mixer))).eval()


def _ids() -> torch.Tensor:
    return torch.randint(0, 32, (2, N), generator=torch.Generator().manual_seed(1))


@torch.no_grad()
def _full(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    logits = model(ids)[:, :-1]
    return F.cross_entropy(logits.transpose(1, 2), ids[:, 1:], reduction="none")


@torch.no_grad()
def _naive_recompute(model: torch.nn.Module, ids: torch.Tensor, window: int) -> torch.Tensor:
    """Token t from a forward over ids[max(0, t - window):t] alone, one token at a time."""
    out = torch.empty(ids.shape[0], ids.shape[1] - 1)
    for t in range(1, ids.shape[1]):
        logits = model(ids[:, max(0, t - window):t])[:, -1]
        out[:, t - 1] = F.cross_entropy(logits, ids[:, t], reduction="none")
    return out


def test_a_window_covering_the_stream_makes_every_arm_the_full_forward() -> None:
    ids = _ids()
    full = _full(_model(), ids)
    torch.testing.assert_close(st.recompute_losses(_model(), ids, N), full)
    torch.testing.assert_close(st.recompute_losses(_model(), ids, N + 7, batch_size=3), full)
    for options in ({}, {"window": N}, {"window": N - 4, "sinks": 4}):
        got = st.decode_losses(_model(**options), ids)
        torch.testing.assert_close(got.losses, full, atol=1e-4, rtol=1e-4)
        assert got.seconds.shape == (N - 1,)


@pytest.mark.parametrize("window", [1, 5, 16])
def test_recompute_equals_a_fresh_forward_per_token(window) -> None:
    model, ids = _model(), _ids()
    want = _naive_recompute(model, ids, window)
    torch.testing.assert_close(st.recompute_losses(model, ids, window, batch_size=7), want,
                               atol=1e-5, rtol=1e-5)
    # negative control: one token more of context is another measurement (so the test sees
    # an off-by-one window)
    assert not torch.allclose(st.recompute_losses(model, ids, window + 1), want, atol=1e-3)


def test_recompute_is_not_the_windowed_full_forward() -> None:
    """A window mask in a full forward reaches back layers x window (each layer's keys saw
    their own window); the recomputation sees ``window`` tokens in all: different losses."""
    ids = _ids()
    assert not torch.allclose(st.recompute_losses(_model(), ids, 5), _full(_model(window=5), ids),
                              atol=1e-3)


@pytest.mark.parametrize("options", [{"window": 5}, {"window": 5, "sinks": 3}],
                         ids=["window", "sinks+window"])
def test_decode_keeps_what_the_options_say_and_a_bounded_state(options) -> None:
    ids = _ids()
    got = st.decode_losses(_model(**options), ids)
    torch.testing.assert_close(got.losses, _full(_model(**options), ids), atol=1e-4, rtol=1e-4)
    model = _model(**options)
    one = got.state_bytes // 2  # 2 rows
    assert st.state_bytes(model, 10 * N) == st.state_bytes(model, 10) == one > 0
    # negative control: the dense model's decode (nothing evicted) differs, its state grows
    dense = st.decode_losses(_model(), ids)
    assert not torch.allclose(dense.losses, got.losses, atol=1e-3)
    assert st.state_bytes(_model(), 10 * N) == 4 * st.state_bytes(_model(), 10 * N // 4)
    other = {"window": 5} if "sinks" in options else {"window": 5, "sinks": 3}
    assert not torch.allclose(st.decode_losses(_model(**other), ids).losses, got.losses,
                              atol=1e-3)


def test_binned_means() -> None:
    v = torch.tensor([[1.0, 3.0, 5.0, 7.0, 9.0], [3.0, 5.0, 7.0, 9.0, 11.0]])
    assert st.binned(v, 2) == [3.0, 7.0, 10.0]
    assert st.binned(v[0], 5) == [5.0]
