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
from blocklab.model.mixer import Rows, State


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
    capacity: int | None  # None: a carry cache of bounded states (no "cache full")
    static: bool
    segments: Tensor | None = None  # (B, T) document ids (a carry cache's forward)

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


class Book(Rows):
    """Bookkeeping several layers' states share (made once per key, updated once per
    forward): per-row tensors (dim 0 = rows) copied by ``select``, zeroed by ``reset``, and
    written, emptied by row, detached and saved as a state's (:class:`~blocklab.model.mixer.
    Rows`); the attributes named in ``transient`` hold what one forward computed and are
    dropped."""

    def begin(self, step: Step) -> None:
        raise NotImplementedError

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
    ``torch.inference_mode``); a forward with gradients on is refused. A *carry* cache
    (``carry=True``; model/carry.py) writes them functionally instead: it carries the state
    of long documents from one training segment to the next with autograd on (see
    :meth:`enter`, :meth:`detach`, :meth:`reset_rows`, :meth:`state_dict`)."""

    def __init__(self, states: list[State | None], *, batch: int, capacity: int | None,
                 device: torch.device | str, static: bool = False,
                 signature: tuple[Any, ...] = (),
                 cross: list[State | None] | None = None, carry: bool = False,
                 mem: str = "train") -> None:
        if static and carry:
            raise ValueError("a carry cache writes its states functionally (autograd across "
                             "segments); static=True (compiled decoding) writes in place")
        if mem not in ("train", "eval"):
            raise ValueError(f"new_cache: mem={mem!r}; choose 'train' or 'eval'")
        if capacity is None and not carry:
            raise ValueError("a decode cache needs a capacity (tokens); only a carry cache "
                             "of bounded states may have none")
        self.states = states
        self.cross = cross if cross is not None else [None] * len(states)
        self.batch, self._capacity, self.static = batch, capacity, static
        #: a carry cache (functional writes, autograd on); ``mem``: "train" or "eval" sizes
        self.carry, self.mem = carry, mem
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
        #: each row's last document id (-1: none yet; a carry cache's :meth:`enter`)
        self.last_doc = torch.full((batch,), -1, dtype=torch.long, device=device)
        self.memory: Tensor | None = None  # a carried memory beside the states (RMT's tokens)
        #: what a row's memory restarts from (RMT's parameter; None while memory is None)
        self.memory_init: Tensor | None = None
        self.aux_loss: Tensor | None = None  # an auxiliary loss of the last forward
        if carry:
            for rows in (*self._all(), *self.books.values()):
                rows.functional = True
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
    def capacity(self) -> int | None:
        return self._capacity

    @property
    def length(self) -> int:
        """Tokens (slots) written so far, padding included."""
        return int(self.index) if self.static else self._length

    @property
    def nbytes(self) -> int:
        """Bytes held by the layers' decode states (what the estimator's state formula
        counts; the shared bookkeeping — a few integers per slot — and the cross-attention
        K/V of the source are not counted), plus a carried memory (RMT's tokens)."""
        mem = 0 if self.memory is None else self.memory.nelement() * self.memory.element_size()
        return sum(s.nbytes for s in self.states if s is not None) + mem

    def book(self, key: Hashable) -> Book:
        """The shared book ``key`` (a state named it in ``State.books``)."""
        return self.books[key]

    def begin(self, positions: Tensor, valid: Tensor | None,
              segments: Tensor | None = None) -> Step:
        """Record this forward's new tokens (positions, validity; a carry cache's: document
        ids) in the shared bookkeeping and the books, before any layer runs; returns (and
        keeps, ``step``) their :class:`Step`."""
        b, t = positions.shape
        if self.capacity is not None and not self.static and \
                self._length + t > self.capacity:
            raise ValueError(f"KV cache full: {self._length + t} tokens > capacity "
                             f"{self.capacity}")
        if self.static and not torch.compiler.is_compiling() and \
                int(self.index) + t > self.capacity:
            raise ValueError(f"KV cache full: {int(self.index) + t} tokens > capacity "
                             f"{self.capacity}")
        real = None if valid is None else valid.bool()
        ends = positions + 1 if real is None else torch.where(real, positions + 1, 0)
        if self.carry:  # after each row's last real token (positions restart per document)
            self._carry_begin(positions, real, segments)
        elif self.static:
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
                         capacity=self.capacity, static=self.static, segments=segments)
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
        new.last_doc = self.last_doc.index_select(0, rows)
        new.memory = None if self.memory is None else self.memory.index_select(0, rows)
        new.step = None
        if self.static:
            new.index = self.index.clone()
            new._mark()
        return new

    def reset(self) -> None:
        """Empty the cache in place (same buffers, so a compiled step keeps replaying): every
        state is zeroed too, so no stale value can reach a masked score as NaN. A carry
        cache empties every row functionally instead (:meth:`reset_rows`)."""
        if self.carry:
            self.reset_rows(torch.ones_like(self.seen, dtype=torch.bool))
            self._length, self.step = 0, None
            return
        for s in self._all():
            s.reset()
        for book in self.books.values():
            book.reset()
        self.seen.zero_()
        self.next_position.zero_()
        self.last_doc.fill_(-1)
        if self.static:
            self.index.zero_()
        self._length = 0
        self.step = None

    # ------------------------------------------------------------------ carry (model/carry.py)

    def _carry_begin(self, positions: Tensor, real: Tensor | None,
                     segments: Tensor | None) -> None:
        """A carry forward: each row's next position and last document are its last real
        token's (rows without one keep theirs)."""
        idx = torch.arange(positions.shape[1], device=positions.device).expand_as(positions)
        last = idx[:, -1] if real is None else torch.where(real, idx, -1).amax(-1)
        has = last >= 0
        at = last.clamp(min=0)[:, None]
        self.next_position = torch.where(has, positions.gather(1, at)[:, 0] + 1,
                                         self.next_position)
        doc = torch.zeros_like(last) if segments is None else segments.gather(1, at)[:, 0]
        self.last_doc = torch.where(has, doc, self.last_doc)  # no segments: one document

    def enter(self, doc_first: Tensor) -> Tensor:
        """Before a carry forward: ``doc_first`` (B,) int64, the lane-global document id of
        each row's first token in the coming segment. Rows whose id differs from the last one
        they saw (or that saw nothing yet) are emptied (:meth:`reset_rows`); returns the (B,)
        bool rows that continue."""
        continues = (doc_first.to(self.last_doc.device) == self.last_doc) & (self.seen > 0)
        self.reset_rows(~continues)
        return continues

    def reset_rows(self, rows: Tensor) -> None:
        """Empty rows ``rows`` ((B,) bool) of every state, book and the bookkeeping,
        functionally (the other rows keep their values and their autograd history)."""
        if not bool(rows.any()):
            return
        for r in (*self._all(), *self.books.values()):
            r.reset_rows(rows)
        zero = torch.zeros((), dtype=torch.long, device=self.seen.device)
        self.seen = torch.where(rows, zero, self.seen)
        self.next_position = torch.where(rows, zero, self.next_position)
        self.last_doc = torch.where(rows, zero - 1, self.last_doc)
        if self.memory is not None:  # back to the initial memory (RMT)
            init = self.memory_init.to(self.memory.dtype).expand_as(self.memory)
            self.memory = torch.where(rows[:, None, None], init, self.memory)

    def detach(self) -> None:
        """Cut autograd's graph at every carried value (truncated backpropagation through
        time: the next segment's gradient stops here)."""
        for r in (*self._all(), *self.books.values()):
            r.detach()
        if self.memory is not None:
            self.memory = self.memory.detach()

    def state_dict(self) -> dict[str, Any]:
        """Everything the carry holds — the bookkeeping, every state and book — as tensors,
        plain values, lists and dicts (a checkpoint loads it with ``weights_only``)."""
        return {"seen": self.seen, "next_position": self.next_position,
                "last_doc": self.last_doc, "length": self._length, "memory": self.memory,
                "states": [None if s is None else s.state_dict() for s in self.states],
                "books": [b.state_dict() for b in self.books.values()]}

    def load_state_dict(self, sd: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` into this cache (made for the same model and batch)."""
        dev = self.seen.device
        self.seen, self.next_position = sd["seen"].to(dev), sd["next_position"].to(dev)
        self.last_doc, self._length = sd["last_doc"].to(dev), int(sd["length"])
        self.memory = None if sd["memory"] is None else sd["memory"].to(dev)
        for s, d in zip(self.states, sd["states"], strict=True):
            if s is not None:
                s.load_state_dict(d)
        for b, d in zip(self.books.values(), sd["books"], strict=True):
            b.load_state_dict(d)
        self.step = None


def check_no_grad(t: Tensor, cache: DecodeCache | None = None) -> None:
    """Decode states are written in place: refuse a forward that would need gradients
    (a carry cache, ``cache.carry``, writes functionally: allowed)."""
    if t.requires_grad and not (cache is not None and cache.carry):
        raise RuntimeError("KV cache: decoding with a cache needs gradients off; wrap the loop "
                           "in torch.no_grad() or torch.inference_mode() (generate() does); to "
                           "train, call the model without cache=")
