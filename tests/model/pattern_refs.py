"""The shared pieces of the softmax attention-pattern tests (test_attention_patterns.py,
test_random_blocks.py, test_marked_tokens.py): one case builder, one independent reference and
the small drivers they all use.

The reference (:func:`naive`) is a per-query loop in plain Python over every rule of
docs/mixers.md "Attention patterns" — a window or a chunk, sinks, global tokens, the random-block
table, marked tokens, causal or bidirectional — re-derived from the documented rules (document
orders counted by hand), never from ``blocklab.model.masks``; its keyword switches break one rule
at a time for the negative controls."""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import torch
from variants import tiny

from blocklab.config import ConfigError, MixerConfig, PositionConfig, validate_model
from blocklab.model import attention, build_model
from blocklab.model.attention import SoftmaxAttention
from blocklab.model.mixer import Sequence
from blocklab.model.position import NoPosition
from blocklab.model.transformer import default_positions

DEC, ENC = "decoder", "encoder"


class Case(NamedTuple):
    """A layer, its input and the batch's facts; ``packed`` carries the documents of row 3,
    ``rows`` treats every row as one document (both carry ``marked`` when the case has marks)."""

    attn: SoftmaxAttention
    x: torch.Tensor
    valid: torch.Tensor
    segments: torch.Tensor
    marked: torch.Tensor | None
    packed: Sequence
    rows: Sequence


def case(causal: bool, options: dict, *, t: int = 29, max_seq_len: int = 128,
         marks: bool = False) -> Case:
    """A softmax layer with ``options`` and a batch that tries every rule: row 0 left-padded,
    row 1 with holes, row 2 right-padded, row 3 packed (documents of 9, 12 and 8 tokens: long
    enough that a document's sinks lie before later bands, and chunks do not start at a block
    boundary). A learned sink starts at (1.5, -0.5). ``marks``: a few marked tokens per row,
    some on padding. ``max_seq_len`` sizes the random-block table (32: a bidirectional draw
    lands in the rows)."""
    d, h = 16, 2
    cfg = validate_model(tiny(DEC if causal else ENC, PositionConfig(name="none"), d_model=d,
                              n_heads=h, max_seq_len=max_seq_len,
                              mixer=MixerConfig(name="softmax", **options)))
    attn = SoftmaxAttention(cfg, 0, causal=causal).eval()
    torch.nn.init.normal_(attn.qkv.weight, std=0.5)
    if attn.sink is not None:
        attn.sink.data = torch.tensor([1.5, -0.5])
    x = torch.randn(4, t, d)
    valid = torch.ones(4, t, dtype=torch.bool)
    valid[0, :3] = False
    valid[1, [2, 5, 6]] = False
    valid[2, t - 4:] = False
    segments = torch.zeros(4, t, dtype=torch.long)
    segments[3, 9:] = 1
    segments[3, 21:] = 2
    marked = None
    if marks:
        marked = torch.zeros(4, t, dtype=torch.bool)
        marked[0, [1, 7, 20]] = True  # 1: padding
        marked[1, [5, 14]] = True  # 5: a hole
        marked[2, [10, 26]] = True  # 26: right padding
        marked[3, [4, 13, 24]] = True  # one per document
    scheme = NoPosition(cfg.position, d_model=d, d_head=d // h, n_heads=h,
                        max_seq_len=max_seq_len, causal=causal)
    seqs = [Sequence(positions=default_positions(x, valid, seg), valid=valid, segments=seg,
                     causal=causal, position=scheme, marked=marked) for seg in (segments, None)]
    return Case(attn, x, valid, segments, marked, *seqs)


def naive(attn: SoftmaxAttention, x, valid, segments=None, *, causal: bool, window=None,
          chunk=None, sinks: int = 0, global_tokens: int = 0, table=None, size: int = 1,
          marked=None, learned: bool = True, prev_chunk: bool = False,
          global_rows: bool = True, keys_marked: bool = True,
          queries_marked: bool = True) -> torch.Tensor:
    """Per query, in plain Python: attention over the real keys of its document (``segments``
    None: the row is one document) that are within the window (or its chunk of the document),
    among the document's first ``max(sinks, global_tokens)`` real tokens, in a block of
    ``size`` tokens drawn for the query's block in ``table`` (a query block past the table:
    none), or ``marked``; a global query (one of the first ``global_tokens``, or marked) sees
    every key of it; causal: never a key after it. With a learned sink, one more logit per
    head in the denominator.

    Broken rules for the negative controls: ``prev_chunk`` (a chunk also sees the previous
    one), ``learned=False`` (no sink logit), ``global_rows=False`` (the first tokens are
    global keys only), ``keys_marked=False`` / ``queries_marked=False`` (marks ignored as
    keys / as queries); drop the sinks, global tokens, table or marks by leaving them out."""
    b, t, _ = x.shape
    h, dh = attn.n_heads, attn.d_head
    q, k, v = (z.view(b, t, h, dh) for z in attn.qkv(x).split(h * dh, dim=-1))
    real = valid.tolist()
    docs = segments.tolist() if segments is not None else [[0] * t] * b
    marks = marked.tolist() if marked is not None else [[False] * t] * b
    drawn = [set(row) - {-1} for row in table.tolist()] if table is not None else []
    kept = max(sinks, global_tokens)
    out = torch.zeros(b, t, h, dh)
    for r in range(b):
        order, doc, count, per_doc = [], [], 0, {}  # row order and document order, by hand
        for j in range(t):
            s = docs[r][j]
            order.append(count)
            doc.append(per_doc.get(s, 0))
            if real[r][j]:
                count += 1
                per_doc[s] = per_doc.get(s, 0) + 1
        for i in range(t):
            if not real[r][i]:
                continue
            picked = drawn[doc[i] // size] if doc[i] // size < len(drawn) else set()
            every = ((global_rows and doc[i] < global_tokens)
                     or (queries_marked and marks[r][i]))
            keys = []
            for j in range(t):
                if not real[r][j] or docs[r][j] != docs[r][i]:
                    continue
                dist = order[i] - order[j]
                if causal and dist < 0:
                    continue
                if chunk is not None:
                    gap = doc[i] // chunk - doc[j] // chunk
                    near = gap == 0 or (prev_chunk and gap == 1)
                else:
                    near = dist <= window - 1 if causal else abs(dist) <= (window - 1) // 2
                if (near or every or doc[j] < kept or doc[j] // size in picked
                        or (keys_marked and marks[r][j])):
                    keys.append(j)
            scores = (q[r, i][None] * k[r, keys]).sum(-1) * dh ** -0.5  # keys × heads
            if attn.sink is not None and learned:
                scores = torch.cat((scores, attn.sink[None]))
            weights = scores.softmax(0)[:len(keys)]
            out[r, i] = (weights[..., None] * v[r, keys]).sum(0)
    return attn.out(out.flatten(2))


def run(attn, x, seq: Sequence) -> torch.Tensor:
    """The layer's output, computed afresh (no memo kept from an earlier call)."""
    return attn(x, dataclasses.replace(seq, _memo={}), None)


def keys_scored(monkeypatch) -> list[int]:
    """The keys each SDPA call of a softmax layer scores per query block (``k.shape[2]``),
    recorded."""
    seen, real = [], attention._sdpa
    monkeypatch.setattr(attention, "_sdpa", lambda lay, q, k, v, vis: (
        seen.append(k.shape[2]), real(lay, q, k, v, vis))[1])
    return seen


def tiny_model(options: dict, *, n_layers: int = 2, max_seq_len: int = 64, position: str = "rope",
          family: str = DEC):
    """``(config, model)``: a tiny softmax model with ``options``, in eval mode."""
    cfg = validate_model(tiny(family, PositionConfig(name=position), n_layers=n_layers,
                              max_seq_len=max_seq_len,
                              mixer=MixerConfig(name="softmax", **options)))
    return cfg, build_model(cfg).eval()


def decoded(net, ids: torch.Tensor, sizes, *, static: bool = False):
    """``(pieces, full, cache)``: the logits of ``ids`` decoded into a fresh cache (``static``:
    fixed-shape) in pieces of ``sizes`` tokens (a prefill, then single tokens and chunks),
    concatenated; the full forward's logits; the cache."""
    with torch.no_grad():
        full = net(ids)
        cache = net.new_cache(ids.shape[0], ids.shape[1], static=static)
        out, start = [], 0
        for size in sizes:
            pos = torch.arange(start, start + size)[None].expand(ids.shape[0], -1)
            out.append(net.decode(ids[:, start:start + size], positions=pos, valid=None,
                                  cache=cache))
            start += size
    assert start == ids.shape[1]
    return torch.cat(out, 1), full, cache


def refusal(options: dict, family: str = DEC) -> str:
    """The message validating a tiny model with these softmax ``options`` fails with (one
    line: a message over several lines, or an accepted config, fails the caller)."""
    try:
        validate_model(tiny(family, mixer=MixerConfig(name="softmax", **options)))
    except ConfigError as err:
        msg = str(err)
        assert "\n" not in msg, msg
        return msg
    raise AssertionError(f"{options} was accepted")
