r"""Learned block-sparse actions (CaGP-Opt): one trainable block of ≈ n/i entries per action.

Wenger et al. (2024), arXiv:2411.01036, Sec. 4.2, Eq. (13)–(14). The paper leaves the block
assignment, the case i ∤ n and the initialisation open (notes/001 §4.3); here:

- **Assignment.** A permutation of 0 … n−1 is cut into contiguous ranges: ρ = n mod i
  blocks of k + 1 points, then i − ρ blocks of k = ⌊n/i⌋ points (see
  :class:`~gpscale.linalg.operators.block_sparse.BlockLayout`). Every point is used. The
  permutation is local (:func:`local_assignment`, CaGP-Opt's default, beyond the paper:
  recursive median bisection of the inputs, so each block is a compact cell and its action a
  local feature, like an inducing point's) or seeded and random (:func:`block_assignment`, the
  authors' code: each action mixes points from all over the input space). Local blocks train
  faster in a fixed budget (evidence: BENCHMARKS.md, "defaults").
- **Growing** (:func:`grow_blocks`): actions learned on n rows carried to n + m rows, as
  ``auto``'s race hands CaGP-Opt's trained actions to its final run on every row. Each block
  keeps its rows and entries and takes new rows near it (by the distance to its rows'
  centroid) until the blocks again have the sizes :class:`BlockLayout` (n + m, i) gives; a new
  row's entry starts at zero, so the grown actions span what the learned ones did and the
  posterior starts where the learned one was.
- **Initialisation** (:func:`initial_values`, the options of the authors' code): ``'random'``
  entries N(0, 1)/√(block size); ``'targets'`` the block's targets; ``'eigen'`` the top eigenvector
  of each diagonal kernel block K(X_Ij, X_Ij). CaGP-Opt's default ``'auto'`` (beyond the paper,
  :func:`resolve_action_init`) takes ``'eigen'`` where the kernel's hyperparameters are known
  when the actions are made (pre-fitted, or given) and ``'random'`` where they are defaults:
  the eigenvector of a block is the block's best single action for the kernel it was computed
  with, and of an arbitrary kernel an arbitrary direction.
- **Held positions** (:meth:`LearnedBlockSparsePolicy.hold`): entries fixed at zero, so the
  rows there enter neither the actions nor (through CaGP's ELBO, which skips them) the
  training. CaGP-Opt calibrates its intervals on those rows
  (:mod:`gpscale.methods.cagp.calibration`): rows the trained actions never saw.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import nn

from gpscale.linalg.operators.block_sparse import BlockLayout, BlockSparseActions
from gpscale.typing import Float, Int, Tensor

__all__ = ["ACTION_INITS", "BLOCK_ASSIGNMENTS", "LearnedBlockSparsePolicy", "block_assignment",
           "grow_blocks", "initial_values", "local_assignment", "resolve_action_init"]

ACTION_INITS = ("auto", "random", "targets", "eigen")
EIGEN_CHUNK_ENTRIES = 1 << 24
"""Most kernel-block entries ``'eigen'`` holds at once (a few blocks at a time where they are
large: 512 blocks of 2,000 points at once would be 16 GB in float64)."""
BLOCK_ASSIGNMENTS = ("random", "local")


def block_assignment(num_points: int, seed: int) -> Int[Tensor, " n"]:
    """(n,) a random permutation from ``torch.Generator().manual_seed(seed)``: the block order."""
    return torch.randperm(num_points, generator=torch.Generator().manual_seed(seed))


def local_assignment(x: Float[Tensor, "n d"], layout: BlockLayout) -> Int[Tensor, " n"]:
    """(n,) a block order in which every block of ``layout`` is a compact cell of the inputs.

    Recursive bisection: the blocks are split into two halves (by count), the points into two
    sets of the halves' total sizes at the median of the coordinate with the largest variance,
    and each half recurses — a balanced k-d tree whose leaves are the blocks. O(n log n log i).
    """
    if x.shape[0] != layout.num_points:
        raise ValueError(f"local block assignment needs {layout.num_points} input rows; got "
                         f"{x.shape[0]}")
    x = x.detach().to("cpu", torch.float64)
    sizes = layout.sizes()
    order = torch.empty(layout.num_points, dtype=torch.long)
    # (points, first block, number of blocks, first output position): an explicit stack
    stack = [(torch.arange(layout.num_points), 0, len(sizes), 0)]
    while stack:
        points, first, count, start = stack.pop()
        if count == 1:
            order[start:start + points.numel()] = points
            continue
        half = count // 2
        left = sum(sizes[first:first + half])
        coords = x[points]
        dim = int(coords.var(0).argmax()) if points.numel() > 1 else 0
        ranked = points[torch.argsort(coords[:, dim], stable=True)]
        stack.append((ranked[:left], first, half, start))
        stack.append((ranked[left:], first + half, count - half, start + left))
    return order


def resolve_action_init(how: str, kernel_known: bool) -> str:
    """``how``, with ``'auto'`` resolved: ``'eigen'`` where the kernel's hyperparameters are
    known (``kernel_known``: pre-fitted or given), else ``'random'`` (module docstring)."""
    if how != "auto":
        return how
    return "eigen" if kernel_known else "random"


def initial_values(how: str, layout: BlockLayout, index: Int[Tensor, " n"], *,
                   y: Float[Tensor, " n"] | None = None,
                   block_kernel: Callable[[Tensor], Tensor] | None = None,
                   generator: torch.Generator | None = None) -> Float[Tensor, " n"]:
    """Initial action entries (n,) in block order.

    Args:
        how: one of :data:`ACTION_INITS` other than ``'auto'`` (:func:`resolve_action_init`).
        layout: the block layout.
        index: (n,) the data points in block order.
        y: (n,) targets in data order (for ``'targets'``).
        block_kernel: maps data indices (b, k) to kernel blocks (b, k, k) (for ``'eigen'``).
        generator: for ``'random'``.

    Raises:
        ValueError: an unknown ``how`` or a missing argument it needs.
    """
    if how not in ACTION_INITS or how == "auto":
        raise ValueError(f"unknown action init {how!r}; valid: {', '.join(ACTION_INITS)}")
    sizes = torch.tensor(layout.sizes())
    if how == "random":
        scale = torch.repeat_interleave(sizes, sizes).rsqrt()  # 1/√k per entry
        return torch.randn(layout.num_points, generator=generator) * scale
    if how == "targets":
        if y is None:
            raise ValueError("action init 'targets' needs the training targets")
        return y[index.to(y.device)]
    if block_kernel is None:
        raise ValueError("action init 'eigen' needs the kernel blocks")
    parts = []
    for span in layout.spans(layout.num_points):  # one span per block size
        blocks = index[span.rows].view(span.count, span.size)
        step = max(1, EIGEN_CHUNK_ENTRIES // span.size ** 2)  # kernel blocks held at once
        for chunk in blocks.split(step):
            _, vectors = torch.linalg.eigh(block_kernel(chunk))  # ascending eigenvalues
            parts.append(vectors[..., -1].flatten())  # (chunk · size,) top eigenvectors
    return torch.cat(parts)


class LearnedBlockSparsePolicy(nn.Module):
    """A batch policy whose parameters are the non-zero entries of S (n, i).

    Args:
        num_points: n.
        num_actions: i (1 ≤ i ≤ n).
        seed: seeds the block assignment (:func:`block_assignment`).
        values: (n,) initial entries in block order; zeros (to be loaded) when ``None``.
        index: (n,) the block order (e.g. :func:`local_assignment`'s); the seeded random
            permutation when ``None``. A buffer: saved and loaded with the state dict.

    Example:
        >>> policy = LearnedBlockSparsePolicy(10, 3)
        >>> policy().shape, policy.layout.sizes()
        (torch.Size([10, 3]), [4, 3, 3])
    """

    def __init__(self, num_points: int, num_actions: int, *, seed: int = 0,
                 values: Tensor | None = None, index: Tensor | None = None):
        super().__init__()
        self.layout = BlockLayout(num_points, num_actions)
        if index is None:
            index = block_assignment(num_points, seed)
        elif index.shape != (num_points,):
            raise ValueError(f"index must have shape ({num_points},); got {tuple(index.shape)}")
        self.register_buffer("index", index)
        self.register_buffer("held", torch.zeros(num_points, dtype=torch.bool))
        self.values = nn.Parameter(torch.zeros(num_points) if values is None else values)
        self.register_load_state_dict_pre_hook(_none_held_if_absent)

    def hold(self, positions: Int[Tensor, " h"]) -> None:
        """Fix the entries at ``positions`` (block order) at zero: their rows leave the actions
        and, in CaGP's ELBO, the training (module docstring)."""
        self.held.zero_()
        self.held[positions.to(self.held.device)] = True

    def held_rows(self) -> Int[Tensor, " h"]:
        """The data rows at the held positions (block order)."""
        return self.index[self.held]

    def fitted_rows(self) -> Tensor | None:
        """(n,) bool in data order, the rows not held; ``None`` where none is held."""
        if not bool(self.held.any()):
            return None
        return torch.ones_like(self.held).index_fill(0, self.held_rows(), False)

    def forward(self, matmul: Callable[[Tensor], Tensor] | None = None,
                rhs: Tensor | None = None) -> BlockSparseActions:
        """The actions S (n, i); ``matmul`` and ``rhs`` are not needed by a learned policy."""
        if rhs is not None and rhs.shape[0] != self.layout.num_points:
            raise ValueError(f"the actions were learned for {self.layout.num_points} training "
                             f"points; got {rhs.shape[0]}. CaGP-Opt conditions on the data it "
                             "was trained on.")
        values = self.values.masked_fill(self.held, 0.0)  # no gradient reaches held entries
        return BlockSparseActions(values, self.index, num_blocks=self.layout.num_blocks)


def _none_held_if_absent(module: nn.Module, state_dict: dict, prefix: str, *args) -> None:
    """A load-state-dict pre-hook: a state saved before positions could be held holds none."""
    if prefix + "values" in state_dict:
        state_dict.setdefault(prefix + "held", torch.zeros(
            state_dict[prefix + "values"].shape, dtype=torch.bool))


def grow_blocks(x: Float[Tensor, "n d"], index: Int[Tensor, " n"], values: Float[Tensor, " n"],
                num_blocks: int, new: Float[Tensor, "m d"]
                ) -> tuple[Int[Tensor, " N"], Float[Tensor, " N"]]:
    """Block order and entries for the rows [x; new] (N = n + m, the new rows numbered n …
    N − 1) that keep every learned block of ``index``, ``values`` (``num_blocks`` blocks on x).

    The grown layout is ``BlockLayout(N, num_blocks)``: k = ⌊N/i⌋. Every block first takes new
    rows until it has k (nearest centroid first, a block at most as many as it lacks), then
    the N mod i rows left go one each to the blocks nearest them; blocks of k + 1 come first.
    A block keeps its rows in their order and entries, then its new rows (entry 0).

    Raises:
        ValueError: ``index`` or ``values`` not of x's length, or inputs of other widths.
    """
    n, m = x.shape[0], new.shape[0]
    if index.shape != (n,) or values.shape != (n,) or new.shape[1:] != x.shape[1:]:
        raise ValueError(f"grow_blocks needs index and values of shape ({n},) and new rows of "
                         f"width {x.shape[1]}; got {tuple(index.shape)}, {tuple(values.shape)}, "
                         f"{tuple(new.shape)}")
    layout, grown = BlockLayout(n, num_blocks), BlockLayout(n + m, num_blocks)
    cpu = torch.device("cpu")
    index = index.to(cpu)
    x, new = x.detach().to(cpu, torch.float64), new.detach().to(cpu, torch.float64)
    block_of = layout.block_ids()  # (n,) the block of each position
    sizes = torch.tensor(layout.sizes())
    centroids = torch.zeros(num_blocks, x.shape[1], dtype=torch.float64)
    centroids.index_add_(0, block_of, x[index]).div_(sizes[:, None])
    distance = torch.cdist(new, centroids)  # (m, i)
    k = grown.size
    assigned = torch.full((m,), -1, dtype=torch.long)
    _fill_nearest(distance, (k - sizes).clamp_min(0), assigned)  # every block up to k
    counts = torch.bincount(assigned[assigned >= 0], minlength=num_blocks)
    _fill_nearest(distance, (sizes + counts == k).long(), assigned)  # the rest, one per block
    final = sizes + torch.bincount(assigned, minlength=num_blocks)
    rank = torch.empty(num_blocks, dtype=torch.long)  # blocks of k + 1 first, stably
    rank[torch.argsort((final != k + 1).long(), stable=True)] = torch.arange(num_blocks)
    # sort key: the block's rank, then its old rows (in their order) before its new ones
    span = n + m
    key = torch.cat([rank[block_of] * 2 * span + torch.arange(n),
                     rank[assigned] * 2 * span + span + torch.arange(m)])
    order = torch.argsort(key)
    rows = torch.cat([index, n + torch.arange(m)])[order]
    grown_values = torch.cat([values.detach().to(cpu), values.new_zeros(m, device=cpu)])[order]
    return rows, grown_values


def _fill_nearest(distance: Tensor, capacity: Tensor, assigned: Tensor) -> None:
    """Assign the unassigned rows (``assigned`` −1) to blocks with capacity left, nearest
    first: each round every such row asks for its nearest open block, and a block takes the
    nearest of those asking up to its capacity; in place, until no row or no capacity is
    left (each round places at least one row)."""
    capacity = capacity.clone()
    while True:
        rows = (assigned < 0).nonzero()[:, 0]
        if rows.numel() == 0 or int(capacity.sum()) == 0:
            return
        d = distance[rows].masked_fill(capacity[None, :] <= 0, math.inf)
        best_d, best = d.min(1)
        by_distance = torch.argsort(best_d, stable=True)
        by_block = by_distance[torch.argsort(best[by_distance], stable=True)]
        blocks = best[by_block]
        first = torch.searchsorted(blocks, blocks, right=False)
        taken = by_block[torch.arange(blocks.numel()) - first < capacity[blocks]]
        assigned[rows[taken]] = best[taken]
        capacity -= torch.bincount(best[taken], minlength=capacity.numel())
