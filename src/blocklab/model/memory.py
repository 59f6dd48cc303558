"""Transformer-XL memory of a global softmax layer in a carry cache ("Transformer-XL:
Attentive Language Models Beyond a Fixed-Length Context", arXiv 1901.02860;
kimiyoung/transformer-xl ``pytorch/mem_transformer.py``).

A global (no window) softmax layer of a carry cache (model/carry.py) keeps, per row, the
*inputs* it received (what the mixer is given, after the block's norm) of the last ``M =
model.mixer.mem_len`` real tokens, **detached** (the gradient stopped, as kimiyoung's
``_update_mems`` does). Each segment the layer projects ``[memory; segment]`` in one ``qkv``
call (the segment last): keys and values of the memory are recomputed with the current
weights, queries come from the segment only. Causality goes by token order (the memory is
earlier), documents are kept apart by the key book's document ids (memory of one document is
never seen by the next), and positions continue across the boundary: rotary keys of the memory
are rotated by their own positions, ALiBi / T5 biases follow the position difference.

The memory's slots, positions, orders, validity and documents are the shared
:class:`~blocklab.model.kv.Ring` book of ``M`` slots (the last ``M`` real tokens of each row:
the same book a local layer of window ``M + 1`` keeps); this state holds only the inputs ``x``
of those slots. ``mem="eval"`` carries size the memory with ``model.mixer.eval_mem_len`` (null
= ``mem_len``), with the same weights: a longer memory at evaluation than in training.

``mem_len: 0`` (the default) carries nothing for these layers: each segment attends within
itself (the vanilla Transformer); ``mem_len: null`` keeps every key of the document with its
graph (:class:`~blocklab.model.kv.KVState`, split mode: exact, the whole document).

Shape legend: B batch, M memory slots, T segment tokens, d d_model, H query heads, Hkv
key/value heads, D d_head.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Hashable
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from blocklab.model import compress, qknorm
from blocklab.model.compress import Compressor
from blocklab.model.kv import Ring
from blocklab.model.mixer import State

if TYPE_CHECKING:
    from blocklab.model.mixer import Sequence


def stop_gradient(t: Tensor) -> Tensor:
    """The memory's gradient is stopped (kimiyoung's ``_update_mems``: ``cat.detach()``); a
    function of its own so a test can prove the stop matters."""
    return t.detach()


def memory_slots(opts: object, mem: str) -> int | None:
    """Slots of a carry cache's memory (``opts``: the options or the layer): ``mem_len``
    (``mem="train"``) or ``eval_mem_len`` (``mem="eval"``; null = ``mem_len``); None = every
    key of the document."""
    mem_len = getattr(opts, "mem_len", 0)
    eval_len = getattr(opts, "eval_mem_len", None)
    return eval_len if mem == "eval" and eval_len is not None else mem_len


def carry_state(layer: object, batch: int, *, dtype: torch.dtype, device: torch.device | str,
                mem: str) -> MemoryState | None:
    """A global softmax layer's state in a carry cache: its XL memory (0 slots: the segment
    alone), or None for ``mem_len: null`` (the caller keeps every key)."""
    slots = memory_slots(layer, mem)
    if slots is None:
        return None
    return MemoryState(batch, slots, layer.qkv.in_features, dtype=dtype, device=device,
                       compressed=layer.compress_len if slots else 0)


def setup(layer: Any, opts: Any, d_model: int) -> None:
    """A softmax layer's memory options (``opts``: its SoftmaxOptions) and, on a global
    layer with compression, its compressor (compress.py)."""
    layer.mem_len, layer.eval_mem_len = opts.mem_len, opts.eval_mem_len
    ratio = opts.compress_ratio if layer.window is None and opts.mem_len else 0
    layer.compress_len = compressed_slots(opts) if ratio else 0
    layer.compress_loss = opts.compress_loss
    layer.compressor = Compressor(d_model, ratio, opts.compress_kind) if ratio else None


def compressed_slots(opts: Any) -> int:
    """``compress_len`` (null: ``mem_len // compress_ratio``)."""
    if not getattr(opts, "compress_ratio", 0) or not opts.mem_len:
        return 0
    return opts.compress_len if opts.compress_len is not None else max(
        1, opts.mem_len // opts.compress_ratio)


class MemoryState(State):
    """The inputs ``x`` (B, M, d) of a global softmax layer's last ``M`` real tokens per row,
    detached, in the slots of the shared ring book ``("ring", M)``."""

    def __init__(self, batch: int, slots: int, d_model: int, *, dtype: torch.dtype,
                 device: torch.device | str, compressed: int = 0) -> None:
        self.key: Hashable = ("ring", slots)
        self.books = MappingProxyType(
            {self.key: lambda b, c, d: Ring(b, c, d, slots=slots)})
        self.x = torch.zeros(batch, slots, d_model, dtype=dtype, device=device)
        if compressed:  # compress.py: a FIFO of compressed slots and their keys' books
            self.c = torch.zeros(batch, compressed, d_model, dtype=dtype, device=device)
            self.c_valid = torch.zeros(batch, compressed, dtype=torch.bool, device=device)
            for name in ("c_order", "c_positions", "c_segments"):
                setattr(self, name, torch.zeros(batch, compressed, dtype=torch.long,
                                                device=device))

    @property
    def nbytes(self) -> int:
        """The inputs kept (memory and compressed slots; their bookkeeping not counted)."""
        return self.x.nbytes + (self.c.nbytes if hasattr(self, "c") else 0)


def attend_with_memory(layer: object, x: Tensor, seq: Sequence, state: MemoryState,
                       sdpa: object, merge: object) -> Tensor:
    """Layer ``layer`` (a global :class:`~blocklab.model.attention.SoftmaxAttention`) over
    ``[memory; segment]``: (B, T, d) -> (B, T, d); the segment's inputs of the tokens the ring
    keeps are then written to the memory (detached)."""
    from blocklab.model.patterns import query_temperature
    from blocklab.model.position import apply_rotary

    b, t, _ = x.shape
    h, hkv = layer.n_heads, layer.n_kv_heads
    book = seq.cache.book(state.key)
    m = state.x.shape[1]
    c = state.c.shape[1] if hasattr(state, "c") else 0
    keys = book.keys
    front = (state.c.to(x.dtype), state.x.to(x.dtype)) if c else (state.x.to(x.dtype),)
    cat = torch.cat((*front, x), 1)  # (B, C + M + T, d): the segment last
    if c:  # the compressed slots are the earliest keys
        keys = dataclasses.replace(
            keys, positions=torch.cat((state.c_positions, keys.positions), 1),
            valid=torch.cat((state.c_valid, keys.valid), 1),
            order=torch.cat((state.c_order, keys.order), 1),
            segments=None if keys.segments is None else torch.cat(
                (state.c_segments, keys.segments), 1))
    n = c + m + t
    qk, v = layer.qkv(cat).view(b, n, h + 2 * hkv, -1).split((h + hkv, hkv), dim=2)
    qk = qknorm.fused(layer, qk)  # QK-norm before rotary (qknorm.py)
    raw = qk[:, n - t:, :h]  # unrotated queries (the reconstruction loss's)
    if seq.rotary is not None and layer.rope:  # every key by its own position
        qk = apply_rotary(qk, *seq.position.rotary(keys.positions))
    q, k = qk[:, n - t:, :h], qk[:, :, h:]  # queries of the segment only: (B, T, H, D)
    if layer.temperature:
        q = q * query_temperature(seq.positions, layer.temperature,
                                  layer.temperature_floor).to(q.dtype)[..., None, None]
    vis = seq.visibility(None, keys, share=None if c else state.key)
    o = sdpa(layer, q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), vis)
    if c:  # what leaves [memory; segment] is compressed (compress.py), before the ring moves
        _compress(layer, state, seq, cat[:, c:], book.keys, raw)
    if book.pending is not None:  # the ring's new slots take this segment's inputs
        rows, cols, slots = book.pending
        state.writable("x")[rows, slots] = stop_gradient(x[rows, cols]).to(state.x.dtype)
    return layer.out(merge(o))


def _compress(layer: Any, state: MemoryState, seq: Sequence, cat: Tensor, keys: Any,
              q: Tensor) -> None:
    """Group and compress the entries leaving the memory; in a training forward, add the
    reconstruction loss to the cache's ``aux_loss``."""
    m = state.x.shape[1]
    new = compress.evicted_groups(stop_gradient(cat), keys.order, keys.valid, keys.segments,
                                  keys.positions, keep_from=seq.cache.step.seen - m,
                                  ratio=layer.compressor.ratio)
    if new["x"].shape[1] == 0:
        return
    slots = layer.compressor(new["x"])  # (B, G, d)
    if torch.is_grad_enabled() and layer.compress_loss:
        g, r, d = new["x"].shape[1:]
        aux = layer.compress_loss * compress.reconstruction_loss(
            layer, q, new["x"].reshape(-1, g * r, d), new["valid"].repeat_interleave(r, 1),
            slots, new["valid"])
        cache = seq.cache
        cache.aux_loss = aux if cache.aux_loss is None else cache.aux_loss + aux
    compress.append(state, new, stop_gradient(slots))
