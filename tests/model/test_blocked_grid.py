"""The blocked path over the variant grid: at the grid's usual lengths a local layer attends
through the dense mask (its sequences span fewer than three blocks of ``MIN_BLOCK``), so here
``MIN_BLOCK`` is lowered until every local and pattern variant of the grid (windows, global
layers, sinks, learned sinks, chunks with no-rotary global layers, global tokens, random
blocks, marked tokens) computes in blocks, and the whole model must give the dense path's
logits and gradients on padded (both sides) and packed batches, and capture one graph under
``torch.compile`` (padded batches: packed ones read a count from the data, docs/mixers.md).

Negative control: a blocked layout that drops the previous block of every band (a window
that no longer reaches back across a block edge) is caught by the same comparison."""

from __future__ import annotations

import pytest
import torch
import torch._dynamo as dynamo
from torch._dynamo.testing import CompileCounterWithBackend
from variants import VOCAB, grid, pattern_variants

from blocklab.model import attention, bands, build_model

ED = "encoder_decoder"
LENGTH = 26  # with blocks of 4: 7 blocks, the last one partial


def _local(cfg) -> bool:
    mixer = cfg.mixer
    return mixer.name == "softmax" and not mixer.pattern and (
        mixer.get("window") is not None or mixer.get("attention_chunk") is not None)


LOCAL = [(i, c) for i, c in grid() if _local(c) and (i, c) not in pattern_variants()]
LOCAL += pattern_variants()


def _batch(cfg, packed: bool) -> tuple[tuple, dict]:
    gen = torch.Generator().manual_seed(7)
    ids = torch.randint(0, VOCAB, (3, LENGTH), generator=gen)
    ids[:, ::5] = 3  # global_token_id 3 marks a few tokens of every row
    valid = torch.ones(3, LENGTH, dtype=torch.bool)
    valid[0, :5] = False  # left padding
    valid[2, LENGTH - 6:] = False  # right padding
    kw: dict = {}
    if packed:
        segments = torch.zeros(3, LENGTH, dtype=torch.long)
        segments[1, 9:], segments[1, 17:] = 1, 2
        key = "source_segments" if cfg.family.name == ED else "segments"
        kw[key] = segments
        if cfg.family.name == ED:
            kw["segments"] = segments
    else:
        kw["source_valid" if cfg.family.name == ED else "valid"] = valid
    if cfg.family.name == ED:
        return (ids, ids.flip(-1)), kw
    return (ids,), kw


def _run(model, args, kw):
    """Logits at the real tokens and the gradients of a loss over them (what a padding
    slot's output is, no rule says: it is never compared)."""
    model.zero_grad()
    out = model(*args, **kw)
    real = kw.get("valid", torch.ones(out.shape[:2], dtype=torch.bool))
    out = out[real]
    out.float().pow(2).mean().backward()
    return out.detach(), [p.grad.clone() for p in model.parameters() if p.grad is not None]


def _blocked_equals_dense(cfg, monkeypatch, packed: bool) -> int:
    """Assert the blocked path gives the dense path's logits at the real tokens and every
    gradient; returns the number of gradients compared."""
    torch.manual_seed(0)
    model = build_model(cfg).train()
    args, kw = _batch(cfg, packed)
    monkeypatch.setattr(attention, "MIN_BLOCK", 10_000)
    dense, dense_grads = _run(model, args, kw)
    monkeypatch.setattr(attention, "MIN_BLOCK", 4)
    blocked, blocked_grads = _run(model, args, kw)
    torch.testing.assert_close(blocked, dense, atol=2e-5, rtol=0)
    assert len(blocked_grads) == len(dense_grads)
    for got, want in zip(blocked_grads, dense_grads):
        torch.testing.assert_close(got, want, atol=2e-5, rtol=0)
    return len(blocked_grads)


@pytest.mark.parametrize("packed", [False, True], ids=["padded", "packed"])
@pytest.mark.parametrize("cfg", [c for _, c in LOCAL], ids=[i for i, _ in LOCAL])
def test_the_blocked_path_gives_the_dense_logits_and_gradients(cfg, packed, monkeypatch):
    assert _blocked_equals_dense(cfg, monkeypatch, packed) > 0  # gradients compared too


def test_the_blocked_path_is_taken_and_a_broken_band_is_caught(monkeypatch):
    """The premise (the banded layout runs at MIN_BLOCK 4) and the negative control."""
    cfg = next(c for _, c in LOCAL if c.mixer.get("window") == 3 and not c.mixer.get("sinks"))
    calls = []
    banded = attention.SoftmaxAttention._banded

    def counted(self, *a, **k):
        calls.append(1)
        return banded(self, *a, **k)

    monkeypatch.setattr(attention.SoftmaxAttention, "_banded", counted)
    _blocked_equals_dense(cfg, monkeypatch, packed=False)
    assert calls  # the comparison above went through the blocked layout

    real = bands.band_blocks

    def no_previous_block(x, lay, fill=0):
        out = real(x, lay, fill)
        gone = lay.back * lay.block  # the earlier blocks of every band read as beyond the row
        return torch.cat((torch.full_like(out[:, :, :gone], fill), out[:, :, gone:]), 2)

    monkeypatch.setattr(bands, "band_blocks", no_previous_block)
    with pytest.raises(AssertionError):
        _blocked_equals_dense(cfg, monkeypatch, packed=False)


# every local and pattern variant of the decoder and encoder families, and one of the
# encoder-decoder's (its stacks are the same layers: tracing it is three times as slow)
COMPILED = [(i, c) for i, c in LOCAL if not c.mixer.get("global_token_id")
            and c.family.name != ED]
COMPILED += [next((i, c) for i, c in LOCAL if c.family.name == ED and c.mixer.get("sinks"))]


@pytest.fixture
def fresh_dynamo():
    """Each capture from a clean dynamo: earlier tests' guards and recompile counts would
    otherwise decide what this one compiles."""
    dynamo.reset()
    yield
    dynamo.reset()


@pytest.mark.parametrize("cfg", [c for _, c in COMPILED], ids=[i for i, _ in COMPILED])
def test_the_blocked_path_compiles_to_one_graph(cfg, monkeypatch, fresh_dynamo):
    """Padded batches: one graph, no break (fullgraph would raise), the eager logits. Marked
    tokens (``global_token_id``) read their count from the data: one break, documented."""
    monkeypatch.setattr(attention, "MIN_BLOCK", 4)
    model = build_model(cfg).eval()
    args, kw = _batch(cfg, packed=False)
    with torch.no_grad():
        eager = model(*args, **kw)
        counter = CompileCounterWithBackend("eager")
        out = torch.compile(model, backend=counter, fullgraph=True)(*args, **kw)
    assert counter.frame_count == 1
    real = kw.get("valid", torch.ones(out.shape[:2], dtype=torch.bool))
    torch.testing.assert_close(out[real], eager[real], atol=1e-6, rtol=0)
