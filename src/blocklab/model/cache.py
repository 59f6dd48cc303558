"""The decode cache: shared token bookkeeping plus one state per layer, made by that layer's
mixer (mixer.py). Generation, objectives and probes treat it as opaque: they make it with
``model.new_cache(batch, capacity)``, pass it to forwards, and may ``select`` rows of it
(shared-prefix scoring) or ``reset`` it (compiled decoding reuses one).

The cache knows no mixer's layout. What every layer shares lives here once — how many real
tokens each row holds (``seen``, the token orders a window counts), the position after each
row's last real token (a caller's loop that passes no positions continues from it), how many
slots are written — and each forward's new tokens are described once, as a :class:`Step`
(:meth:`DecodeCache.begin`), which a mixer passes to its state explicitly: a state never
reads the cache.

What several layers of one kind share beyond that — softmax attention's *key books*, the
positions / validity / orders of the keys (kv.py) — is a :class:`Book`: a state names the
books it relies on (``State.books``: key -> constructor), the cache makes each key once, runs
its :meth:`Book.begin` once per forward before any layer, and copies / empties it with the
states. Cross-attention's K/V of an encoder–decoder are states too (``cross``, one per layer).

Shape legend: B batch, C capacity, T new tokens.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from blocklab.model.masks import token_order
from blocklab.model.mixer import State


@dataclass(frozen=True)
class Step:
    """One forward's new tokens, as the shared bookkeeping sees them (made by
    :meth:`DecodeCache.begin`; states and books receive it as an argument)."""

    positions: Tensor  # (B, T) position ids
    real: Tensor | None  # (B, T) bool; None = no padding
    order: Tensor  # (B, T) each token's index among its row's real tokens so far
    before: Tensor  # (B,) real tokens per row before this forward
    seen: Tensor  # (B,) real tokens per row after it
    start: int | Tensor  # first slot written: an int (growing), the 0-d write index (static)
    capacity: int
    static: bool

    @property
    def length(self) -> int:
        return self.positions.shape[1]

    @property
    def end(self) -> int:
        """Slots that may hold a token after this forward: ``start + T`` (growing), the whole
        ``capacity`` (static: every shape fixed)."""
        return self.capacity if self.static else int(self.start) + self.length

    def slots(self) -> Tensor:
        """(T,) the slots this forward's tokens are written to."""
        return self.start + torch.arange(self.length, device=self.positions.device)


class Book:
    """Bookkeeping several layers' states share (made once per key, updated once per
    forward): per-row tensors (dim 0 = rows) copied by ``select`` and zeroed by ``reset``;
    the attributes named in ``transient`` hold what one forward computed and are dropped."""

    transient: tuple[str, ...] = ()

    def begin(self, step: Step) -> None:
        raise NotImplementedError

    def tensors(self) -> dict[str, Tensor]:
        return {k: v for k, v in vars(self).items()
                if isinstance(v, Tensor) and k not in self.transient}

    def forget(self) -> None:
        for name in self.transient:
            setattr(self, name, None)

    def select(self, rows: Tensor) -> Book:
        new = object.__new__(type(self))
        new.__dict__.update(self.__dict__)
        for name, t in self.tensors().items():
            setattr(new, name, t.index_select(0, rows))
        new.forget()
        return new

    def reset(self) -> None:
        for t in self.tensors().values():
            t.zero_()
        self.forget()


def _mark_static(tensors: list[Tensor]) -> None:
    for t in tensors:
        torch._dynamo.mark_static_address(t)


class DecodeCache:
    """Shared token bookkeeping plus one decode state per layer of one (causal) stack, and
    the books and cross-attention states beside them (see the module docstring).

    The states are written in place, so decoding runs without autograd (``torch.no_grad`` or
    ``torch.inference_mode``); a forward with gradients on is refused."""

    def __init__(self, states: list[State | None], *, batch: int, capacity: int,
                 device: torch.device | str, static: bool = False,
                 signature: tuple[Any, ...] = (),
                 cross: list[State | None] | None = None) -> None:
        self.states = states
        self.cross = cross if cross is not None else [None] * len(states)
        self.batch, self._capacity, self.static = batch, capacity, static
        self.signature = signature  # what the stack checks it was made for
        self.books: dict[Hashable, Book] = {}
        for s in self._all():
            for key, make in s.books.items():
                if key not in self.books:
                    self.books[key] = make(batch, capacity, device)
        self.seen = torch.zeros(batch, dtype=torch.long, device=device)  # real tokens per row
        self.next_position = torch.zeros(batch, dtype=torch.long, device=device)
        self.step: Step | None = None  # this forward's tokens (after begin)
        self._length = 0
        if static:
            self.index = torch.zeros((), dtype=torch.long, device=device)  # next slot to write
            self._mark()

    def _all(self) -> list[State]:
        return [s for s in (*self.states, *self.cross) if s is not None]

    def _mark(self) -> None:
        """Static buffers for CUDA-graph replay of a compiled step."""
        _mark_static([self.seen, self.next_position, self.index])
        for s in self._all():
            _mark_static(s.static_tensors())
        for book in self.books.values():
            _mark_static(list(book.tensors().values()))

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
        counts; the shared bookkeeping — a few integers per slot — and the cross-attention
        K/V of the source are not counted)."""
        return sum(s.nbytes for s in self.states if s is not None)

    def book(self, key: Hashable) -> Book:
        """The shared book ``key`` (a state named it in ``State.books``)."""
        return self.books[key]

    def begin(self, positions: Tensor, valid: Tensor | None) -> Step:
        """Record this forward's new tokens (positions, validity) in the shared bookkeeping
        and the books, before any layer runs; returns (and keeps, ``step``) their
        :class:`Step`."""
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
        before = self.seen.clone()
        order = before[:, None] + token_order(valid, b, t, positions.device)
        n_real = t if real is None else real.sum(-1)
        if self.static:
            self.seen.add_(n_real)
        else:
            self.seen = self.seen + n_real
        self.step = Step(positions=positions, real=real, order=order, before=before,
                         seen=self.seen, start=self.index if self.static else self._length,
                         capacity=self.capacity, static=self.static)
        for book in self.books.values():
            book.begin(self.step)
        return self.step

    def advance(self, n: int) -> None:
        """After every layer ran: ``n`` more slots are written."""
        if self.static:
            self.index.add_(n)
        else:
            self._length += n
        self.step = None

    def next_positions(self) -> Tensor:
        """(B,) the position after each row's last real cached token."""
        return self.next_position.clone()

    def select(self, rows: Tensor) -> DecodeCache:
        """A new cache whose row ``j`` is a copy of row ``rows[j]`` of this one (rows may
        repeat), so several continuations of each prefix run from one prefill. Works after
        any forward: per-forward values are not copied, and the static write index is one
        for all rows."""
        new = object.__new__(DecodeCache)
        new.__dict__.update(self.__dict__)
        new.batch = rows.shape[0]
        new.states = [None if s is None else s.select(rows) for s in self.states]
        new.cross = [None if s is None else s.select(rows) for s in self.cross]
        new.books = {k: b.select(rows) for k, b in self.books.items()}
        new.seen = self.seen.index_select(0, rows)
        new.next_position = self.next_position.index_select(0, rows)
        new.step = None
        if self.static:
            new.index = self.index.clone()
            new._mark()
        return new

    def reset(self) -> None:
        """Empty the cache in place (same buffers, so a compiled step keeps replaying): every
        state is zeroed too, so no stale value can reach a masked score as NaN."""
        for s in self._all():
            s.reset()
        for book in self.books.values():
            book.reset()
        self.seen.zero_()
        self.next_position.zero_()
        if self.static:
            self.index.zero_()
        self._length = 0
        self.step = None


def check_no_grad(t: Tensor) -> None:
    """Decode states are written in place: refuse a forward that would need gradients."""
    if t.requires_grad:
        raise RuntimeError("KV cache: decoding with a cache needs gradients off; wrap the loop "
                           "in torch.no_grad() or torch.inference_mode() (generate() does); to "
                           "train, call the model without cache=")
