"""Shards and minibatches: every index exactly once, equal step counts, determinism."""

from __future__ import annotations

import pytest
import torch

from gpscale.distributed.shard import (
    batch_per_rank,
    num_steps,
    rank_batches,
    shard_range,
    shard_rows,
    shard_sizes,
)


@pytest.mark.parametrize("world_size", [1, 2, 3, 7])
@pytest.mark.parametrize("n", [7, 8, 100, 101, 499])
def test_shards_cover_every_index_once_in_order(n, world_size):
    ranges = [shard_range(n, r, world_size) for r in range(world_size)]
    covered = torch.cat([torch.arange(a, b) for a, b in ranges])
    assert torch.equal(covered, torch.arange(n))  # contiguous, in rank order, no overlap
    sizes = [b - a for a, b in ranges]
    assert sizes == shard_sizes(n, world_size) and max(sizes) - min(sizes) <= 1
    x = torch.arange(2 * n).view(n, 2)
    assert torch.equal(torch.cat([shard_rows(x, r, world_size) for r in range(world_size)]), x)


@pytest.mark.parametrize("bad", [(3, 0, 4), (10, 2, 2), (10, -1, 2), (10, 0, 0)])
def test_bad_shards_are_refused(bad):
    with pytest.raises(ValueError, match="rank|world_size|shard"):
        shard_range(*bad)


@pytest.mark.parametrize("n,world_size,batch", [(201, 2, 40), (100, 3, 7), (50, 2, 100)])
def test_rank_batches_partition_each_shard_in_equal_step_counts(n, world_size, batch):
    per_rank = batch_per_rank(batch, world_size)
    steps = num_steps(n, world_size, per_rank)
    seen = []
    for r in range(world_size):
        start, stop = shard_range(n, r, world_size)
        batches = list(rank_batches(stop - start, steps, epoch_seed=11, rank=r))
        assert len(batches) == steps  # the same on every rank: collectives stay in step
        if steps == 1:
            assert batches == [None]
            seen.append(torch.arange(start, stop))
            continue
        assert max(b.numel() for b in batches) <= per_rank
        idx = torch.cat(batches)
        assert torch.equal(idx.sort().values, torch.arange(stop - start))  # a partition
        again = torch.cat(list(rank_batches(stop - start, steps, epoch_seed=11, rank=r)))
        assert torch.equal(idx, again)  # deterministic
        seen.append(idx + start)
    assert torch.equal(torch.cat(seen).sort().values, torch.arange(n))  # the epoch sees all


def test_rank_batches_differ_between_ranks_and_epochs():
    a = torch.cat(list(rank_batches(60, 4, epoch_seed=1, rank=0)))
    assert not torch.equal(a, torch.cat(list(rank_batches(60, 4, epoch_seed=1, rank=1))))
    assert not torch.equal(a, torch.cat(list(rank_batches(60, 4, epoch_seed=2, rank=0))))


def test_rank_batches_refuse_more_steps_than_rows():
    with pytest.raises(ValueError, match="larger batch size or fewer processes"):
        list(rank_batches(3, 5, epoch_seed=0, rank=0))
    with pytest.raises(ValueError, match="batch_size"):
        batch_per_rank(0, 2)
