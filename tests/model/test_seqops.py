"""seqops.py, the mechanics mixers share, against a naive per-document loop:

- ``compact``: real tokens first in their order, padding behind, document ids per compacted
  slot, and ``scatter`` undoing ``gather``; built once per forward;
- ``short_conv``: every output equals a plain loop over each document's real tokens alone
  (causal and centred taps, 1 to 4 taps; left, right and inner padding; packed documents,
  padding sharing a document's id or between documents); decoding in chunks through the tail
  equals the whole row, for every tap count (1 tap: an empty tail);
- negative controls: taps blind to documents or to padding fail the reference.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from blocklab.config import PositionConfig
from blocklab.model import masks, seqops
from blocklab.model.mixer import Sequence
from blocklab.model.position import NoPosition
from model.test_conv import LAYOUTS, T

D = 3  # channels; the layouts (2 rows of T tokens) are the gated convolution tests'


def _seq(valid, segments, t: int = T, b: int = 2) -> Sequence:
    pos = NoPosition(PositionConfig(), d_model=4, d_head=2, n_heads=2, max_seq_len=64,
                     causal=True)
    return Sequence(positions=torch.arange(t).expand(b, t), valid=valid, segments=segments,
                    causal=True, position=pos)


def _documents(valid, segments, b: int):
    """Each document of row ``b`` as the list of its real tokens' indices (the brute force's
    own reading: runs of equal segment ids among real tokens)."""
    real = [i for i in range(T) if valid is None or bool(valid[b, i])]
    docs: list[list[int]] = []
    for i in real:
        if docs and (segments is None or segments[b, i] == segments[b, docs[-1][-1]]):
            docs[-1].append(i)
        else:
            docs.append([i])
    return docs


def naive(x, weight, bias, ahead: int):
    """One document's tokens x (n, d) alone: ``y_t = bias + Σ_i w_i x_{t - back + i}``."""
    n, k = x.shape[0], weight.shape[1]
    back = k - 1 - ahead
    y = torch.zeros_like(x) + bias
    for t in range(n):
        for i in range(k):
            s = t - back + i
            if 0 <= s < n:
                y[t] += weight[:, i] * x[s]
    return y


def _conv(x, weight, bias, seq, ahead):
    rows = seqops.compact(seq)
    y, _ = seqops.short_conv(rows.gather(x), weight, bias, rows, ahead=ahead)
    return rows.scatter(y)


def _check(layout: str, k: int, ahead: int) -> int:
    """Convolve the layout's rows at once; assert each document equals it convolved alone.
    Returns the number of real tokens compared (padding is never compared)."""
    valid, segments = LAYOUTS[layout]
    torch.manual_seed(k)
    x, weight, bias = torch.randn(2, T, D), torch.randn(D, k), torch.randn(D)
    got = _conv(x, weight, bias, _seq(valid, segments), ahead)
    compared = 0
    for b in range(2):
        for doc in _documents(valid, segments, b):
            torch.testing.assert_close(got[b, doc], naive(x[b, doc], weight, bias, ahead),
                                       atol=1e-6, rtol=0, msg=f"{layout} row {b} {doc}")
            compared += len(doc)
    return compared


def test_compact_puts_real_tokens_first_in_order_and_scatter_undoes_it():
    valid, segments = LAYOUTS["packed_holes"]
    seq = _seq(valid, segments)
    rows = seqops.compact(seq)
    assert rows is seqops.compact(seq)  # once per forward
    idx = torch.arange(T).expand(2, T)
    x = torch.randn(2, T, D)
    for b in range(2):
        real = valid[b].nonzero()[:, 0]
        n = len(real)
        assert rows.order[b, :n].tolist() == real.tolist() and int(rows.count[b]) == n
        assert rows.real[b].tolist() == [True] * n + [False] * (T - n)
        docs = [d for d in _documents(valid, segments, b) for _ in d]
        ids = rows.docs[b, :n].tolist()  # one id per document, in order; padding -1
        assert [ids.index(i) for i in ids] == [docs.index(d) for d in docs]
        assert (rows.docs[b, n:] == -1).all()
    torch.testing.assert_close(rows.scatter(rows.gather(x)), x, atol=0, rtol=0)
    assert torch.equal(rows.gather(idx), rows.order)
    starts = masks.document_starts(segments, valid)
    assert torch.equal(rows.docs >= 0, rows.real) and starts.sum() == 6


@pytest.mark.parametrize(("k", "ahead"), [(k, a) for k in (1, 2, 3, 4) for a in (0, 1, 2)
                                          if a < k],  # taps ahead are some of the k taps
                         ids=lambda v: str(v))
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_short_conv_equals_each_document_alone(layout, k, ahead):
    valid, _ = LAYOUTS[layout]
    real = 2 * T if valid is None else int(valid.sum())
    assert _check(layout, k, ahead) == real  # every real token compared, document by document


@pytest.mark.parametrize("k", [1, 2, 3, 4])
def test_decoding_through_the_tail_equals_the_whole_row(k):
    """Left-padded rows with holes fed in chunks (one token at a time too): each chunk's
    outputs continue from the tail, equal to the whole row's; the tail is the last ``k - 1``
    real inputs (empty with one tap)."""
    valid = torch.arange(T) >= torch.tensor([[4], [0]])
    valid[1, 5] = False
    torch.manual_seed(k)
    x, weight, bias = torch.randn(2, T, D), torch.randn(D, k), torch.randn(D)
    whole = _conv(x, weight, bias, _seq(valid, None), 0)
    tail, outs, start = torch.zeros(2, k - 1, D), [], 0
    for size in (3, 1, 1, 5, 1, 2):
        sl = slice(start, start + size)
        rows = seqops.compact(_seq(valid[:, sl], None, size))
        y, tail = seqops.short_conv(rows.gather(x[:, sl]), weight, bias, rows, tail=tail)
        outs.append(rows.scatter(y))
        assert tail.shape == (2, k - 1, D)
        start += size
    got = torch.cat(outs, 1)
    torch.testing.assert_close(got[valid], whole[valid], atol=1e-6, rtol=0)
    for b in range(2):
        last = x[b, valid[b]][len(x[b, valid[b]]) - (k - 1):] if k > 1 else x[b, :0]
        torch.testing.assert_close(tail[b], last, atol=0, rtol=0)


def test_taps_blind_to_documents_fail_the_reference(monkeypatch):
    short = seqops.short_conv
    monkeypatch.setattr(seqops, "short_conv", lambda x, w, b, rows, **kw: short(
        x, w, b, dataclasses.replace(rows, docs=None), **kw))
    _check("plain", 3, 0)  # one document: unharmed
    with pytest.raises(AssertionError):
        _check("packed", 3, 0)


def test_taps_that_read_padding_fail_the_reference(monkeypatch):
    monkeypatch.setattr(seqops, "compact", lambda seq: seqops.compact_rows(None, seq.starts()))
    _check("plain", 3, 0)
    for layout in ("left", "holes"):
        with pytest.raises(AssertionError):
            _check(layout, 3, 0)
