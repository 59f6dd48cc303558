"""Resumable batches: batch b holds the same examples whether a run starts at 0 or resumes at
b; ranks of a data-parallel run see disjoint examples that together cover the global batch."""

from __future__ import annotations

import itertools

from blocklab.data.datamodule import ResumableBatches


def _take(sampler, n):
    return list(itertools.islice(iter(sampler), n))


def test_resuming_at_batch_b_yields_what_the_straight_run_yields_from_b():
    straight = _take(ResumableBatches(4, accumulate=2), 10)
    resumed = _take(ResumableBatches(4, start=6, accumulate=2), 4)
    assert resumed == straight[6:]
    assert [b[0][1] for b in straight] == [0, 0, 1, 1, 2, 2, 3, 3, 4, 4]  # step = batch // accumulate


def test_ranks_are_disjoint_and_cover_the_global_batch():
    world, size = 3, 4
    per_rank = [_take(ResumableBatches(size, rank=r, world=world), 5) for r in range(world)]
    for b in range(5):
        indices = [i for r in range(world) for i, _ in per_rank[r][b]]
        assert sorted(indices) == list(range(b * world * size, (b + 1) * world * size))


def test_a_bounded_sampler_has_a_length_and_stops():
    s = ResumableBatches(2, stop=3)
    assert len(s) == 3 and len(list(s)) == 3
