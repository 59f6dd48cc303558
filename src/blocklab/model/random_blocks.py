"""BigBird's random blocks ("Big Bird: Transformers for Longer Sequences", arXiv 2007.14062)
on a local layer (``model.mixer.random_blocks``, ``block_size``, ``pattern_seed``): each query
block of a document also sees ``r`` key blocks of it drawn at random — causal: strictly earlier
blocks only. The rule itself is masks.py's (:class:`~blocklab.model.masks.Pattern`, on document
orders ``d``: key ``j`` visible to query ``i`` iff ``d_j // s`` is among the blocks drawn for
``d_i // s``, ``s = block_size``); this module draws the blocks and lays them out for the
blocked computation of bands.py.

The draw: a table (M, r) of key-block indices, ``M = ceil(max_seq_len / s)`` query blocks,
from a generator seeded with ``pattern_seed`` and the layer index, so every layer draws its
own pattern and the same config draws the same one; the mixer keeps it as a buffer, so a
checkpoint holds the pattern it was trained with. Row ``i``: ``min(r, i)`` distinct blocks of
``[0, i)`` (causal) or ``r`` distinct blocks of ``[0, M)`` other than ``i`` (bidirectional; a
block past the end of a shorter document holds no key); -1 marks no block. A query block past
``M`` (a document longer than ``max_seq_len``) sees no random block.

The blocked computation (bands.py ``layout``) makes its query blocks of whole random blocks,
``L = s`` where ``s >= MIN_BLOCK``, so each query scores the ``r · s`` keys drawn for its own
random block (plus its band), not those drawn for its neighbours.

Shapes: B batch, Tq queries, Tk keys, M query blocks, r random blocks, nb blocks of L queries,
E = (L / s) · r · s random keys per query block.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import Tensor

if TYPE_CHECKING:
    from blocklab.model.bands import Layout


def draw(seed: int, layer: int, blocks: int, r: int, *, causal: bool) -> Tensor:
    """(blocks, r) long: the random key blocks of each query block (the module docstring),
    drawn on the CPU from ``seed`` and ``layer`` alone."""
    gen = torch.Generator(device="cpu")
    gen.manual_seed(seed * 1_000_003 + layer)
    table = torch.full((blocks, r), -1, dtype=torch.long, device="cpu")
    for i in range(blocks):
        if causal:
            pick = torch.randperm(i, generator=gen, device="cpu")[:r]
        else:
            pick = torch.randperm(blocks - 1, generator=gen, device="cpu")[:r]
            pick = pick + (pick >= i).long()  # every block but the query's own
        table[i, :pick.numel()] = pick
    return table


def drawn(table: Tensor, query_block: Tensor) -> Tensor:
    """(..., r) the key blocks drawn for ``query_block`` (...); -1 past the table's rows."""
    m = table.shape[0]
    rows = table[query_block.clamp(0, m - 1)]
    return torch.where((query_block < m)[..., None], rows, -1)


def member(table: Tensor, block_size: int, q_doc: Tensor, k_doc: Tensor) -> Tensor:
    """(B, 1, Tq, Tk) bool: key ``j``'s block of its document is among those drawn for query
    ``i``'s (document orders ``q_doc`` (B, Tq), ``k_doc`` (B, Tk))."""
    rows = drawn(table, q_doc // block_size)  # (B, Tq, r)
    kb = k_doc // block_size
    return (rows[:, :, None, :] == kb[:, None, :, None]).any(-1)[:, None]


def first_listed(values: Tensor) -> Tensor:
    """(..., n) bool: ``values[..., i]`` is the first of its equals along the last dim (a
    stable sort puts equals in listing order; the first of each run is the one listed first)."""
    ordered, order = values.sort(dim=-1, stable=True)
    new = torch.ones_like(ordered, dtype=torch.bool)
    new[..., 1:] = ordered[..., 1:] != ordered[..., :-1]
    return torch.empty_like(new).scatter_(-1, order, new)


def band_keys(table: Tensor, block_size: int, *, length: int, lay: Layout,
              kept: int) -> tuple[Tensor, Tensor]:
    """The random keys of every query block of rows of ``length = nb·L`` slots that hold one
    document each, real tokens first (slot = document order), in the layout ``lay``
    (bands.py; ``L = lay.block`` a multiple of ``block_size``): (nb, E) indices into the row
    and (nb, E) ``fresh`` — a key neither in the block's band (which already holds it), nor
    among the first ``kept`` tokens (the band's sink keys), nor listed before for another
    random block of the same query block (the rule, not the listing, says which queries see
    it), nor past the row. Every query of a block scores its ``E = (L / s) · r · s`` keys:
    ``r · s`` for blocks of one random block (``L = s``)."""
    s, device = block_size, table.device
    nb, per = length // lay.block, lay.block // s
    qb = torch.arange(nb * per, device=device).view(nb, per)  # random blocks of each block
    kb = drawn(table, qb).reshape(nb, -1)  # (nb, per·r)
    first = (kb >= 0) & first_listed(kb)
    idx = kb[..., None] * s + torch.arange(s, device=device)  # (nb, per·r, s)
    lo, hi = (z[:, None, None] for z in lay.bounds(nb, device))  # the band of each block
    fresh = first[..., None] & ((idx < lo) | (idx >= hi)) & (idx >= kept) & (idx < length)
    return idx.reshape(nb, -1).clamp(0, length - 1), fresh.reshape(nb, -1)
