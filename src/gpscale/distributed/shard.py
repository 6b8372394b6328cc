"""Deterministic data shards and per-rank minibatches.

Rank r of P holds the contiguous rows ``shard_range(n, r, P)``: the first n mod P ranks get
⌈n/P⌉ rows, the others ⌊n/P⌋, so the shards tile 0 … n−1 exactly once, in order (rank 0 first).
The split of a dataset is already random (``gpscale.data.splits``), so contiguous shards are
random subsets of the training set.

Minibatches (:func:`rank_batches`): every rank draws the same ``epoch_seed`` from the shared,
identically seeded generator of ``training.fit``; rank r permutes its own shard with a generator
seeded by (epoch_seed, r) and cuts the permutation into the same number of steps on every rank,
⌈⌈n/P⌉ / b⌉ for b rows per rank, as equal as possible (sizes differ by at most one). No point is
dropped or repeated. The global batch of a step is the union of the P rank batches; the ranks
weight their gradients by their batch sizes (``DataParallel``), so the step's gradient is exactly
that of the per-datum loss on the union.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import Tensor

__all__ = [
    "batch_per_rank", "num_steps", "rank_batches", "shard_range", "shard_rows", "shard_sizes",
]


def _check(n: int, rank: int, world_size: int) -> None:
    if world_size < 1:
        raise ValueError(f"world_size must be at least 1; got {world_size}")
    if not 0 <= rank < world_size:
        raise ValueError(f"rank must lie in 0 … {world_size - 1}; got {rank}")
    if n < world_size:
        raise ValueError(f"cannot shard {n} points over {world_size} ranks: every rank needs at "
                         "least one point")


def shard_sizes(n: int, world_size: int) -> list[int]:
    """Rows per rank (P,): ⌈n/P⌉ for the first n mod P ranks, ⌊n/P⌋ for the rest."""
    _check(n, 0, world_size)
    base, extra = divmod(n, world_size)
    return [base + (r < extra) for r in range(world_size)]


def shard_range(n: int, rank: int, world_size: int) -> tuple[int, int]:
    """(start, stop): the contiguous rows of ``rank``; the ranges tile 0 … n−1 in rank order."""
    _check(n, rank, world_size)
    base, extra = divmod(n, world_size)
    start = rank * base + min(rank, extra)
    return start, start + base + (rank < extra)


def shard_rows(t: Tensor, rank: int, world_size: int) -> Tensor:
    """This rank's rows of ``t`` (n, …) as a compact copy, so the full tensor can be freed."""
    start, stop = shard_range(t.shape[0], rank, world_size)
    return t[start:stop].clone()


def batch_per_rank(batch_size: int, world_size: int) -> int:
    """Rows per rank of a global batch: ⌈batch_size / P⌉ (the global batch is P times that)."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be a positive integer; got {batch_size}")
    return -(-batch_size // world_size)


def num_steps(n: int, world_size: int, batch_size: int | None) -> int:
    """Steps per epoch on every rank: 1 for full batches, else ⌈⌈n/P⌉ / b⌉ with b rows per rank."""
    if batch_size is None:
        return 1
    largest = shard_sizes(n, world_size)[0]
    return max(1, -(-largest // batch_size))


def rank_batches(num_local: int, steps: int, epoch_seed: int, rank: int) -> Iterator[Tensor | None]:
    """Local row indices of each step of one epoch on one rank.

    Args:
        num_local: rows of this rank's shard.
        steps: steps per epoch, the same on every rank (:func:`num_steps`); 1 yields ``None``,
            the whole shard.
        epoch_seed: the same on every rank (drawn from the shared generator).
        rank: this rank (decorrelates the ranks' permutations).

    Yields:
        ``steps`` int64 index tensors into the shard, a random partition of it.
    """
    if num_local < 1 or steps < 1:
        raise ValueError(f"need at least one local row and one step; got {num_local} and {steps}")
    if steps == 1:
        yield None
        return
    if steps > num_local:
        raise ValueError(f"{steps} steps per epoch need at least {steps} rows per rank; this "
                         f"rank holds {num_local}. Use a larger batch size or fewer processes.")
    generator = torch.Generator().manual_seed((int(epoch_seed) * 1_000_003 + rank) % 2**63)
    yield from torch.randperm(num_local, generator=generator).tensor_split(steps)
