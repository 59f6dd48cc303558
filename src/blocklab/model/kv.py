"""Softmax attention's decode states and the key books they share (attention.py uses them;
the decode cache, cache.py, knows neither).

A *key book* keeps the positions, validity and token orders of the keys a softmax layer
attends over — one book per kind of K/V buffer, made once per cache and updated once per
forward, shared by every layer with that buffer (:class:`~blocklab.model.cache.Book`):

- :class:`History`: every token so far, slots ``[0, length)`` (global layers; :class:`KVState`);
- :class:`Ring`: the last ``slots`` real tokens of each row, token order ``o`` in slot
  ``o mod slots`` (local layers: ``min(window - 1, capacity)`` slots; :class:`RingState`);
- :class:`Fixed`: ``capacity`` slots written at the cache's tensor index, every shape fixed
  (compiled decoding; :class:`FixedKVState`); causality and windows by token order, unwritten
  slots invalid.

A state names its book (``State.books``, the key in ``key``); the mixer hands the book to
:meth:`write` and its :class:`~blocklab.model.mixer.Keys` to ``Sequence.visibility``.
Cross-attention's K/V of the source, computed once per generation, are :class:`CrossKV`.

A growing cache's buffers (:class:`History`, :class:`KVState`) hold at most
:data:`FIRST_SLOTS` slots at first and double as they fill, up to the capacity asked for: memory
follows the tokens written, so a sample asked for any number of new tokens starts at once (a
cache of up to ``FIRST_SLOTS`` slots is allocated whole, as before).

Shape legend: B batch, Hkv key/value heads, C capacity, S ring slots, T new tokens, D d_head.
"""

from __future__ import annotations

from collections.abc import Hashable
from types import MappingProxyType

import torch
from torch import Tensor

from blocklab.model.cache import Book, Step
from blocklab.model.masks import Pattern
from blocklab.model.mixer import Keys, State

#: Slots a growing buffer allocates at first (at most); it doubles as it fills.
FIRST_SLOTS = 8192


def _grown(t: Tensor, dim: int, end: int, capacity: int) -> Tensor:
    """``t`` with room for ``end`` slots along ``dim``: itself when it has them, else a copy
    twice as long (at least ``end``, at most ``capacity`` slots) holding ``t`` in front."""
    have = t.shape[dim]
    if end <= have:
        return t
    shape = list(t.shape)
    shape[dim] = min(capacity, max(end, 2 * have))
    new = torch.zeros(shape, dtype=t.dtype, device=t.device)
    new.narrow(dim, 0, have).copy_(t)
    return new


def _bounded(capacity: int | None) -> int:
    """A growing buffer's capacity: a carry cache of every key needs one (one line)."""
    if capacity is None:
        raise ValueError("a softmax layer that keeps every key (no window) grows with the "
                         "context: make its carry cache with a capacity (the document length)")
    return capacity


# ------------------------------------------------------------------------------- key books


class History(Book):
    """Every token so far (slots ``[0, length)``)."""

    transient = ("keys", "start")

    def __init__(self, batch: int, capacity: int, device: torch.device | str) -> None:
        self.capacity = _bounded(capacity)
        slots = min(capacity, FIRST_SLOTS)  # grows as it fills (the module docstring)
        self.positions = torch.zeros(batch, slots, dtype=torch.long, device=device)
        self.valid = torch.zeros(batch, slots, dtype=torch.bool, device=device)
        self.segments: Tensor | None = None  # (B, C) documents, made by a carry forward
        self.has_padding = False
        self.keys: Keys | None = None
        self.start = 0  # this forward's first slot

    def begin(self, step: Step) -> None:
        start = int(step.start)
        end = start + step.length
        if step.segments is not None and self.segments is None:
            self.segments = torch.zeros_like(self.positions)
        for name, t in self.tensors().items():
            setattr(self, name, _grown(t, 1, end, self.capacity))
        self.writable("positions")[:, start:end] = step.positions
        self.writable("valid")[:, start:end] = True if step.real is None else step.real
        if step.segments is not None:  # a carry forward's documents
            self.writable("segments")[:, start:end] = step.segments
        if step.real is not None and not self.has_padding:
            self.has_padding = not bool(step.real.all())
        self.start = start
        self.keys = Keys(self.positions[:, :end], self.valid[:, :end] if self.has_padding else None,
                         segments=None if step.segments is None else self.segments[:, :end])

    def forget(self) -> None:
        self.keys, self.start = None, 0

    def reset(self) -> None:
        super().reset()
        self.has_padding = False

    def reset_rows(self, rows: Tensor) -> None:
        super().reset_rows(rows)
        self.has_padding = True  # the emptied rows' slots are invalid from now on


class Ring(Book):
    """The last ``slots`` real tokens of every row, order ``o`` in slot ``o mod slots``; this
    forward's keys are the ring, then the new tokens. ``pending`` says which new token goes to
    which slot (the states write their K/V there after attending). With ``sinks = n`` the
    first ``n`` real tokens keep slots ``[0, n)`` for good, and the ring of the later tokens
    follows (order ``o >= n`` in slot ``n + (o - n) mod slots``): StreamingLLM's cache."""

    transient = ("keys", "pending")

    def __init__(self, batch: int, capacity: int, device: torch.device | str, *,
                 slots: int, sinks: int = 0) -> None:
        self.slots, self.sinks = slots, sinks
        total = slots + sinks
        self.positions = torch.zeros(batch, total, dtype=torch.long, device=device)
        self.order = torch.zeros(batch, total, dtype=torch.long, device=device)
        self.valid = torch.zeros(batch, total, dtype=torch.bool, device=device)
        self.segments = torch.zeros(batch, total, dtype=torch.long, device=device)
        self.keys: Keys | None = None
        self.pending: tuple[Tensor, Tensor, Tensor] | None = None

    def begin(self, step: Step) -> None:
        q_order, positions = step.order, step.positions
        real = torch.ones_like(positions, dtype=torch.bool) if step.real is None else step.real
        self.keys = Keys(torch.cat((self.positions, positions), 1),
                         torch.cat((self.valid, real), 1),
                         torch.cat((self.order, q_order), 1), q_order,
                         segments=None if step.segments is None
                         else torch.cat((self.segments, step.segments), 1))
        self.pending = None
        n = self.sinks
        if self.slots or n:  # the last S real tokens (and sinks) go to the ring, after attention
            # sinks: the first n of the row, or of each document (a carry forward: positions)
            doc = q_order if step.segments is None else positions
            keep = real & ((q_order >= step.seen[:, None] - self.slots) | (doc < n))
            rows, cols = keep.nonzero(as_tuple=True)
            order, first = q_order[rows, cols], doc[rows, cols]
            slots = torch.where(first < n, first, n + (order - n) % max(self.slots, 1))
            self.pending = (rows, cols, slots)
            self.writable("positions")[rows, slots] = positions[rows, cols]
            self.writable("order")[rows, slots] = order
            self.writable("valid")[rows, slots] = True
            if step.segments is not None:
                self.writable("segments")[rows, slots] = step.segments[rows, cols]


class Fixed(Book):
    """``capacity`` slots written at the cache's write index (a 0-d tensor advanced in
    place): the same shapes at every step, for compiled decoding. Keys are the whole buffer;
    causality and windows go by token order, so unwritten (invalid) and later slots are never
    seen. ``written`` (this forward's slots) is one for all rows: not copied by ``select``."""

    transient = ("keys", "written")

    def __init__(self, batch: int, capacity: int, device: torch.device | str) -> None:
        self.positions = torch.zeros(batch, capacity, dtype=torch.long, device=device)
        self.valid = torch.zeros(batch, capacity, dtype=torch.bool, device=device)
        self.order = torch.zeros(batch, capacity, dtype=torch.long, device=device)
        self.written: Tensor | None = None  # (T,) this forward's slots
        self.keys: Keys | None = None

    def begin(self, step: Step) -> None:
        real = (torch.ones_like(step.positions, dtype=torch.bool) if step.real is None
                else step.real)
        self.written = slots = step.slots()
        self.positions.index_copy_(1, slots, step.positions)
        self.valid.index_copy_(1, slots, real)
        self.order.index_copy_(1, slots, step.order)
        self.keys = Keys(self.positions, self.valid, self.order, step.order)


def ring_slots(window: int | Pattern, capacity: int) -> int:
    """Ring slots a local layer keeps: every key a later query's window (or chunk) can still
    reach, sinks aside."""
    back = window.back() if isinstance(window, Pattern) else window - 1
    return back if capacity is None else min(back, capacity)


def sink_slots(window: int | Pattern, capacity: int) -> int:
    """Slots a local layer keeps for its attention sinks and global tokens (the first real
    tokens: decoding is causal, where global tokens see only each other)."""
    if not isinstance(window, Pattern):
        return 0
    return window.kept if capacity is None else min(window.kept, capacity)


# ---------------------------------------------------------------------------- decode states

class KVState(State):
    """Every key so far: up to ``capacity`` slots of K and V (grown as they fill), written at
    ``[length, length + T)``."""

    key: Hashable = ("history",)
    books = MappingProxyType({key: History})

    def __init__(self, batch: int, n_kv_heads: int, capacity: int, d_head: int, *,
                 dtype: torch.dtype, device: torch.device | str, marks: bool = False) -> None:
        self.capacity = _bounded(capacity)
        slots = min(capacity, FIRST_SLOTS)
        self.k = torch.zeros(batch, n_kv_heads, slots, d_head, dtype=dtype, device=device)
        self.v = torch.zeros_like(self.k)  # (B, Hkv, C, D)
        if marks:  # which keys are marked global (global_token_id): (B, C) bool
            self.marked = torch.zeros(batch, slots, dtype=torch.bool, device=device)

    def write_marks(self, book: History, marked: Tensor) -> Tensor:
        """Keep this forward's marks (B, T) beside its keys: (B, Tk) the marks of every key."""
        start, end = book.start, book.start + marked.shape[1]
        self.marked = _grown(self.marked, 1, end, self.capacity)
        self.writable("marked")[:, start:end] = marked
        return self.marked[:, :end]

    def write(self, book: History, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        start, end = book.start, book.start + k.shape[2]
        self.k = _grown(self.k, 2, end, self.capacity)
        self.v = _grown(self.v, 2, end, self.capacity)
        self.writable("k")[:, :, start:end] = k
        self.writable("v")[:, :, start:end] = v
        return self.k[:, :, :end], self.v[:, :, :end]  # (B, Hkv, Tk, D)


class RingState(State):
    """A local layer's last ``S = min(window - 1, capacity)`` keys per row (``chunk - 1`` for a
    chunked layer), after its ``sinks`` first ones (the ring book says which slot holds which
    token): memory proportional to the window, not the context."""

    def __init__(self, batch: int, n_kv_heads: int, slots: int, d_head: int, *,
                 dtype: torch.dtype, device: torch.device | str, sinks: int = 0) -> None:
        self.key = ("ring", slots, sinks) if sinks else ("ring", slots)
        self.books = MappingProxyType(
            {self.key: lambda b, c, d: Ring(b, c, d, slots=slots, sinks=sinks)})
        total = slots + sinks  # the sinks' slots first (Ring)
        self.k = torch.zeros(batch, n_kv_heads, total, d_head, dtype=dtype, device=device)
        self.v = torch.zeros_like(self.k)  # (B, Hkv, S, D)

    def write(self, book: Ring, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        keys, values = torch.cat((self.k, k), 2), torch.cat((self.v, v), 2)  # (B, Hkv, S+T, D)
        if book.pending is not None:  # after the copy above: this forward still sees the ring
            rows, cols, slots = book.pending
            self.writable("k")[rows, :, slots] = k[rows, :, cols]
            self.writable("v")[rows, :, slots] = v[rows, :, cols]
        return keys, values


class FixedKVState(State):
    """``capacity`` slots written at the cache's tensor index (compiled decoding): the whole
    buffer is attended, unwritten slots masked by the fixed book's validity and orders."""

    key: Hashable = ("fixed",)
    books = MappingProxyType({key: Fixed})

    def __init__(self, batch: int, n_kv_heads: int, capacity: int, d_head: int, *,
                 dtype: torch.dtype, device: torch.device | str, marks: bool = False) -> None:
        self.k = torch.zeros(batch, n_kv_heads, capacity, d_head, dtype=dtype, device=device)
        self.v = torch.zeros_like(self.k)
        if marks:  # as KVState's
            self.marked = torch.zeros(batch, capacity, dtype=torch.bool, device=device)

    def write_marks(self, book: Fixed, marked: Tensor) -> Tensor:
        self.marked.index_copy_(1, book.written, marked)
        return self.marked

    def write(self, book: Fixed, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        self.k.index_copy_(2, book.written, k)
        self.v.index_copy_(2, book.written, v)
        return self.k, self.v


class CrossKV(State):
    """Cross-attention's K and V of the source (B, Hkv, S, D), computed at the first forward
    of a generation and kept; ``reset`` forgets them (the next source is another)."""

    def __init__(self) -> None:
        self.k: Tensor | None = None
        self.v: Tensor | None = None

    def reset(self) -> None:
        self.k = self.v = None

    def static_tensors(self) -> list[Tensor]:
        return []  # made after the cache (at prefill), never written in place
