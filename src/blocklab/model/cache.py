"""The decode cache: shared token bookkeeping plus one state per layer, made by that layer's
mixer (mixer.py). Generation, objectives and probes treat it as opaque: they make it with
``model.new_cache(batch, capacity)``, pass it to forwards, and may ``select`` rows of it
(shared-prefix scoring) or ``reset`` it (compiled decoding reuses one).

What every layer shares lives here once: how many real tokens each row holds (``seen``, the
token orders a window counts), the position after each row's last real token (a caller's loop
that passes no positions continues from it), and *key books* — the positions, validity and
orders of the keys a score-based mixer attends over, one book per kind of key buffer:

- ``History``: every token so far, slots ``[0, length)`` (global softmax layers);
- ``Ring(slots)``: the last ``slots`` real tokens of each row, token order ``o`` in slot
  ``o mod slots`` (local softmax layers: ``min(window - 1, capacity)`` slots);
- ``Fixed``: ``capacity`` slots written at a tensor index, every shape fixed (compiled
  decoding); causality and windows by token order, unwritten slots invalid.

A state names the books it reads (``State.books``); the cache makes each book once and updates
it once per forward (:meth:`DecodeCache.begin`), before any layer runs.

Shape legend: B batch, C capacity, S ring slots, T new tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from blocklab.model.masks import token_order
from blocklab.model.mixer import State


@dataclass(frozen=True)
class Keys:
    """The keys one score-based layer attends over in this forward (None: not tracked)."""

    positions: Tensor  # (B, Tk)
    valid: Tensor | None  # (B, Tk) bool; None = no padding
    order: Tensor | None = None  # (B, Tk): set, causality (and windows) go by token order
    q_order: Tensor | None = None  # (B, T) the new tokens' orders (with ``order``)


class Book:
    """Bookkeeping of one kind of key buffer, shared by every layer that uses it."""

    def begin(self, cache: DecodeCache, positions: Tensor, real: Tensor | None) -> None:
        raise NotImplementedError

    def tensors(self) -> dict[str, Tensor]:
        return {k: v for k, v in vars(self).items() if isinstance(v, Tensor)}

    def select(self, rows: Tensor) -> Book:
        new = object.__new__(type(self))
        new.__dict__.update(self.__dict__)
        for name, t in self.tensors().items():
            if t.dim():  # per-row tensors; a 0-d write index is shared
                setattr(new, name, t.index_select(0, rows))
            else:
                setattr(new, name, t.clone())
        new.keys = None
        return new

    def reset(self) -> None:
        for t in self.tensors().values():
            t.zero_()


class History(Book):
    """Every token so far (slots ``[0, length)``)."""

    def __init__(self, batch: int, capacity: int, device: torch.device | str) -> None:
        self.positions = torch.zeros(batch, capacity, dtype=torch.long, device=device)
        self.valid = torch.zeros(batch, capacity, dtype=torch.bool, device=device)
        self.has_padding = False
        self.keys: Keys | None = None

    def begin(self, cache: DecodeCache, positions: Tensor, real: Tensor | None) -> None:
        start, end = cache.length, cache.length + positions.shape[1]
        self.positions[:, start:end] = positions
        self.valid[:, start:end] = True if real is None else real
        if real is not None and not self.has_padding:
            self.has_padding = not bool(real.all())
        self.keys = Keys(self.positions[:, :end], self.valid[:, :end] if self.has_padding else None)


class Ring(Book):
    """The last ``slots`` real tokens of every row, order ``o`` in slot ``o mod slots``; this
    forward's keys are the ring, then the new tokens. ``pending`` says which new token goes to
    which slot (the states write their K/V there after attending)."""

    def __init__(self, batch: int, slots: int, device: torch.device | str) -> None:
        self.slots = slots
        self.positions = torch.zeros(batch, slots, dtype=torch.long, device=device)
        self.order = torch.zeros(batch, slots, dtype=torch.long, device=device)
        self.valid = torch.zeros(batch, slots, dtype=torch.bool, device=device)
        self.keys: Keys | None = None
        self.pending: tuple[Tensor, Tensor, Tensor] | None = None

    def begin(self, cache: DecodeCache, positions: Tensor, real: Tensor | None) -> None:
        q_order = cache.q_order
        real = torch.ones_like(positions, dtype=torch.bool) if real is None else real
        self.keys = Keys(torch.cat((self.positions, positions), 1),
                         torch.cat((self.valid, real), 1),
                         torch.cat((self.order, q_order), 1), q_order)
        self.pending = None
        if self.slots:  # the last S real tokens of each row go to the ring, after attention
            keep = real & (q_order >= cache.seen[:, None] - self.slots)
            rows, cols = keep.nonzero(as_tuple=True)
            order = q_order[rows, cols]
            slots = order % self.slots
            self.pending = (rows, cols, slots)
            self.positions[rows, slots] = positions[rows, cols]
            self.order[rows, slots] = order
            self.valid[rows, slots] = True

    def select(self, rows: Tensor) -> Ring:
        new = super().select(rows)
        new.pending = None
        return new  # type: ignore[return-value]


class Fixed(Book):
    """``capacity`` slots written at the cache's write index (a 0-d tensor advanced in
    place): the same shapes at every step, for compiled decoding. Keys are the whole buffer;
    causality and windows go by token order, so unwritten (invalid) and later slots are never
    seen."""

    def __init__(self, batch: int, capacity: int, device: torch.device | str) -> None:
        self.positions = torch.zeros(batch, capacity, dtype=torch.long, device=device)
        self.valid = torch.zeros(batch, capacity, dtype=torch.bool, device=device)
        self.order = torch.zeros(batch, capacity, dtype=torch.long, device=device)
        self.slots: Tensor | None = None  # this forward's slots
        self.keys: Keys | None = None
        for t in self.tensors().values():
            torch._dynamo.mark_static_address(t)

    def begin(self, cache: DecodeCache, positions: Tensor, real: Tensor | None) -> None:
        t = positions.shape[1]
        real = torch.ones_like(positions, dtype=torch.bool) if real is None else real
        self.slots = slots = cache.index + torch.arange(t, device=positions.device)
        self.positions.index_copy_(1, slots, positions)
        self.valid.index_copy_(1, slots, real)
        self.order.index_copy_(1, slots, cache.q_order)
        self.keys = Keys(self.positions, self.valid, self.order, cache.q_order)

    def select(self, rows: Tensor) -> Fixed:
        new = super().select(rows)
        for t in new.tensors().values():
            torch._dynamo.mark_static_address(t)
        return new  # type: ignore[return-value]


def ring_slots(window: int, capacity: int) -> int:
    """Slots a local layer keeps: every key a later query's window can still reach."""
    return min(window - 1, capacity)


def make_book(key: tuple[Any, ...], batch: int, capacity: int,
              device: torch.device | str) -> Book:
    kind = key[0]
    if kind == "history":
        return History(batch, capacity, device)
    if kind == "ring":
        return Ring(batch, key[1], device)
    if kind == "fixed":
        return Fixed(batch, capacity, device)
    raise ValueError(f"unknown key book {key!r}")


class DecodeCache:
    """Shared token bookkeeping plus one decode state per layer of one (causal) stack.

    The states are written in place, so decoding runs without autograd (``torch.no_grad`` or
    ``torch.inference_mode``); a forward with gradients on is refused. Cross-attention K/V of
    an encoder–decoder are computed once per generation and kept in ``cross``."""

    def __init__(self, states: list[State | None], *, batch: int, capacity: int,
                 device: torch.device | str, static: bool = False,
                 signature: tuple[Any, ...] = ()) -> None:
        self.states = states
        self.batch, self._capacity, self.static = batch, capacity, static
        self.signature = signature  # what the stack checks it was made for
        self.books: dict[tuple[Any, ...], Book] = {}
        for s in states:
            for key in (s.books if s is not None else ()):
                if key not in self.books:
                    self.books[key] = make_book(key, batch, capacity, device)
        self._orders = any(k[0] != "history" for k in self.books)
        self.seen = torch.zeros(batch, dtype=torch.long, device=device)  # real tokens per row
        self.next_position = torch.zeros(batch, dtype=torch.long, device=device)
        self.q_order: Tensor | None = None  # this forward's token orders (when a book needs them)
        self._length = 0
        self.cross: list[tuple[Tensor, Tensor] | None] = [None] * len(states)
        if static:
            self.index = torch.zeros((), dtype=torch.long, device=device)  # next slot to write
            for t in (self.seen, self.next_position, self.index):
                torch._dynamo.mark_static_address(t)
            for s in states:
                for t in (s.static_tensors() if s is not None else ()):
                    torch._dynamo.mark_static_address(t)

    @property
    def capacity(self) -> int:
        return self._capacity

    @property
    def length(self) -> int:
        """Tokens (slots) written so far, padding included."""
        return int(self.index) if self.static else self._length

    @property
    def nbytes(self) -> int:
        """Bytes held by the layers' decode states (what the estimator's state formula
        counts; the shared bookkeeping — a few integers per slot — is not counted)."""
        return sum(s.nbytes for s in self.states if s is not None)

    def keys(self, window: int | None) -> Keys:
        """The keys a score-based layer with this ``window`` attends over in this forward."""
        if self.static:
            key: tuple[Any, ...] = ("fixed",)
        elif window is None:
            key = ("history",)
        else:
            key = ("ring", ring_slots(window, self.capacity))
        keys = self.books[key].keys
        assert keys is not None, "DecodeCache.keys() before begin()"
        return keys

    def book(self, key: tuple[Any, ...]) -> Book:
        return self.books[key]

    def begin(self, positions: Tensor, valid: Tensor | None) -> None:
        """Record this forward's new tokens (positions, validity) in the shared bookkeeping,
        before any layer runs."""
        b, t = positions.shape
        if not self.static and self._length + t > self.capacity:
            raise ValueError(f"KV cache full: {self._length + t} tokens > capacity "
                             f"{self.capacity}")
        if self.static and not torch.compiler.is_compiling() and \
                int(self.index) + t > self.capacity:
            raise ValueError(f"KV cache full: {int(self.index) + t} tokens > capacity "
                             f"{self.capacity}")
        real = None if valid is None else valid.bool()
        ends = positions + 1 if real is None else torch.where(real, positions + 1, 0)
        if self.static:
            self.next_position.copy_(torch.maximum(self.next_position, ends.amax(-1)))
        else:
            self.next_position = torch.maximum(self.next_position, ends.amax(-1))
        if self._orders or self.static:
            self.q_order = self.seen[:, None] + token_order(valid, b, t, positions.device)
        n_real = t if real is None else real.sum(-1)
        if self.static:
            self.seen.add_(n_real)
        else:
            self.seen = self.seen + n_real
        for book in self.books.values():  # they see ``seen`` with this forward's tokens
            book.begin(self, positions, real)

    def advance(self, n: int) -> None:
        """After every layer ran: ``n`` more slots are written."""
        if self.static:
            self.index.add_(n)
        else:
            self._length += n

    def next_positions(self) -> Tensor:
        """(B,) the position after each row's last real cached token."""
        return self.next_position.clone()

    def select(self, rows: Tensor) -> DecodeCache:
        """A new cache whose row ``j`` is a copy of row ``rows[j]`` of this one (rows may
        repeat), so several continuations of each prefix run from one prefill."""
        new = object.__new__(DecodeCache)
        new.__dict__.update(self.__dict__)
        new.batch = rows.shape[0]
        new.states = [None if s is None else s.select(rows) for s in self.states]
        new.books = {k: b.select(rows) for k, b in self.books.items()}
        new.seen = self.seen.index_select(0, rows)
        new.next_position = self.next_position.index_select(0, rows)
        new.q_order = None
        new.cross = [None if kv is None else tuple(t.index_select(0, rows) for t in kv)
                     for kv in self.cross]
        if self.static:
            new.index = self.index.clone()
            for t in (new.seen, new.next_position, new.index):
                torch._dynamo.mark_static_address(t)
        return new

    def reset(self) -> None:
        """Empty the cache in place (same buffers, so a compiled step keeps replaying): every
        state is zeroed too, so no stale value can reach a masked score as NaN."""
        for s in self.states:
            if s is not None:
                s.reset()
        for book in self.books.values():
            book.reset()
            if isinstance(book, History):
                book.has_padding = False
        self.seen.zero_()
        self.next_position.zero_()
        if self.static:
            self.index.zero_()
        self._length = 0
        self.cross = [None] * len(self.cross)


def check_no_grad(t: Tensor) -> None:
    """Decode states are written in place: refuse a forward that would need gradients."""
    if t.requires_grad:
        raise RuntimeError("KV cache: decoding with a cache needs gradients off; wrap the loop "
                           "in torch.no_grad() or torch.inference_mode() (generate() does); to "
                           "train, call the model without cache=")
