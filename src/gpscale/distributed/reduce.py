r"""Collectives for data-parallel GPs: differentiable sums and gathers, gradient averaging.

Convention (the same as ``DistributedDataParallel``'s): every rank holds the same parameters θ
and the job minimises the average of the ranks' losses, L = (1/P) Σ_r L_r(θ). Two kinds of loss
fit it:

- *local* losses (minibatch methods): L_r is the per-datum loss on rank r's batch; the ranks'
  gradients are averaged with weights b_r / Σ b (their batch sizes), which is exactly the
  gradient of the per-datum loss on the union of the batches.
- *global* losses (CaGP-Opt): every rank computes the same L = f(A, θ) from sums A = Σ_r a_r(θ)
  of per-rank pieces via :func:`all_reduce_sum`. Its backward pass all-reduces the incoming
  gradient (the adjoint of "sum and hand the result to every rank"), so rank r obtains
  ∂f/∂θ + P (∂f/∂A)(∂a_r/∂θ); the plain average over ranks is then exactly
  ∂f/∂θ + Σ_r (∂f/∂A)(∂a_r/∂θ) = dL/dθ. :func:`all_gather_rows` is handled the same way.

Without a process group (one process) every function is the identity.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

import torch
import torch.distributed as dist
from torch import Tensor, nn

from gpscale.distributed.env import collective, current
from gpscale.distributed.shard import shard_range
from gpscale.distributions import Predictive

__all__ = [
    "all_gather_rows", "all_reduce_max", "all_reduce_sum", "all_reduce_sums", "barrier",
    "broadcast_module", "check_replicated", "gather_predictive", "predict_in_shards",
    "reduce_gradients",
    "rows_at", "weighted_mean",
]


def _all_reduce(t: Tensor, name: str, op=dist.ReduceOp.SUM) -> Tensor:
    with collective(name):
        dist.all_reduce(t, op=op)
    return t


class _AllReduceSum(torch.autograd.Function):
    """Σ_r t_r on every rank; backward: Σ_r of the ranks' incoming gradients."""

    @staticmethod
    def forward(ctx, t: Tensor) -> Tensor:
        return _all_reduce(t.clone(), "all_reduce (forward)")

    @staticmethod
    def backward(ctx, grad: Tensor) -> Tensor:
        return _all_reduce(grad.contiguous().clone(), "all_reduce (backward)")


def all_reduce_sum(t: Tensor) -> Tensor:
    """Σ over ranks of ``t`` (any shape), differentiable (see the module docstring). O(numel)."""
    if not current().active:
        return t
    return _AllReduceSum.apply(t)


def all_reduce_sums(*tensors: Tensor) -> tuple[Tensor, ...]:
    """:func:`all_reduce_sum` of several tensors of one dtype in a single collective."""
    if not current().active:
        return tensors
    flat = all_reduce_sum(torch.cat([t.reshape(-1) for t in tensors]))
    parts = flat.split([t.numel() for t in tensors])
    return tuple(p.view(t.shape) for p, t in zip(parts, tensors, strict=True))


class _AllGatherRows(torch.autograd.Function):
    """Concatenate the ranks' row blocks (sizes may differ); backward: Σ_r grad, own rows."""

    @staticmethod
    def forward(ctx, t: Tensor, sizes: Sequence[int]) -> Tensor:
        env = current()
        rank_start = sum(sizes[: env.rank])
        ctx.rows = (rank_start, rank_start + sizes[env.rank])
        largest = max(sizes)
        padded = t.new_zeros(largest, *t.shape[1:])
        padded[: t.shape[0]] = t
        parts = [torch.empty_like(padded) for _ in sizes]
        with collective("all_gather"):
            dist.all_gather(parts, padded.contiguous())
        return torch.cat([p[:s] for p, s in zip(parts, sizes, strict=True)])

    @staticmethod
    def backward(ctx, grad: Tensor):
        total = _all_reduce(grad.contiguous().clone(), "all_gather (backward)")
        return total[ctx.rows[0]: ctx.rows[1]], None


def all_gather_rows(t: Tensor) -> Tensor:
    """The ranks' tensors (n_r, …) stacked along rows in rank order (Σ n_r, …); differentiable.

    Row counts may differ between ranks (they are exchanged first). Memory O(P max n_r).
    """
    env = current()
    if not env.active:
        return t
    count = torch.tensor([t.shape[0]], device=t.device)
    counts = [torch.empty_like(count) for _ in range(env.world_size)]
    with collective("all_gather (row counts)"):
        dist.all_gather(counts, count)
    return _AllGatherRows.apply(t, [int(c) for c in counts])


def rows_at(t: Tensor, index: Tensor, start: int) -> Tensor:
    """Rows ``index`` (global row numbers) of a row-sharded tensor whose rows ``start`` …
    ``start + len(t) − 1`` this rank holds as ``t``: the same (len(index), …) tensor on every
    rank, from one all-reduce (each row is held by exactly one rank, the others add zeros)."""
    held = (index >= start) & (index < start + t.shape[0])
    rows = t.new_zeros((index.shape[0], *t.shape[1:]))
    rows[held] = t[index[held] - start]
    if not current().active:
        return rows
    return _all_reduce(rows, "all_reduce (rows)")


def weighted_mean(value: float | Tensor, weight: float = 1.0) -> tuple[float, float]:
    """(Σ_r w_r v_r / Σ_r w_r, Σ_r w_r) over ranks as floats (NaN/inf on any rank propagates)."""
    env = current()
    value = float(value)
    if not env.active:
        return value, weight
    buf = torch.tensor([weight * value, weight], dtype=torch.float64, device=env.device)
    if weight == 0:
        buf[0] = 0.0
    _all_reduce(buf, "all_reduce (loss)")
    return float(buf[0] / buf[1]), float(buf[1])


def all_reduce_max(value: float) -> float:
    """The largest ``value`` over ranks (e.g. an epoch's wall time)."""
    env = current()
    if not env.active:
        return float(value)
    buf = torch.tensor([float(value)], dtype=torch.float64, device=env.device)
    return float(_all_reduce(buf, "all_reduce (max)", dist.ReduceOp.MAX)[0])


def reduce_gradients(params: Iterable[Tensor], weight: float = 1.0) -> None:
    """Replace each ``p.grad`` by Σ_r w_r g_r / Σ_r w_r (one collective per dtype and device).

    A missing gradient counts as zeros (so ranks whose graphs skip a parameter stay in step).
    """
    env = current()
    if not env.active:
        return
    groups: dict[tuple[torch.dtype, torch.device], list[Tensor]] = {}
    for p in params:
        if p.requires_grad:
            groups.setdefault((p.dtype, p.device), []).append(p)
    for (dtype, device), group in sorted(groups.items(), key=lambda kv: str(kv[0])):
        grads = [torch.zeros_like(p) if p.grad is None else p.grad for p in group]
        flat = torch.cat([g.reshape(-1) * weight for g in grads]
                         + [torch.tensor([weight], dtype=dtype, device=device)])
        _all_reduce(flat, "all_reduce (gradients)")
        flat = flat[:-1] / flat[-1]
        for p, part in zip(group, flat.split([q.numel() for q in group]), strict=True):
            p.grad = part.view_as(p).clone()


def broadcast_module(module: nn.Module, src: int = 0) -> None:
    """Copy every parameter and buffer of rank ``src`` into the other ranks' ``module``."""
    if not current().active:
        return
    with torch.no_grad(), collective("broadcast (parameters)"):
        for t in [*module.parameters(), *module.buffers()]:
            dist.broadcast(t.data, src)


def check_replicated(module: nn.Module) -> float:
    """max |θ_r − θ_0| over ranks and parameters (0 when all ranks hold identical copies)."""
    if not current().active:
        return 0.0
    worst = 0.0
    with torch.no_grad():
        for p in module.parameters():
            ref = p.detach().clone()
            with collective("broadcast (check)"):
                dist.broadcast(ref, 0)
            worst = max(worst, float((p.detach() - ref).abs().max()) if p.numel() else 0.0)
    return all_reduce_max(worst)


def barrier() -> None:
    """Wait until every rank arrives (with the timeout's error)."""
    if current().active:
        with collective("barrier"):
            dist.barrier()


def gather_predictive(pred: Predictive) -> Predictive:
    """The ranks' predictives on their test shards joined in rank order (every rank gets all).

    Per-point fields (mean, variance, probs, rate, a (t,) noise) are gathered; a scalar noise
    is taken as is (it is the same on every rank). A joint covariance cannot be gathered.
    """
    if not current().active:
        return pred
    if pred.covariance is not None:
        raise ValueError("a joint predictive covariance cannot be gathered across ranks")
    t = pred.mean.shape[0]
    fields = {}
    for name in ("mean", "variance", "noise", "probs", "rate"):
        value = getattr(pred, name)
        per_point = value is not None and value.dim() >= 1 and value.shape[0] == t
        fields[name] = all_gather_rows(value) if per_point else value
    return Predictive(**fields)


def predict_in_shards(predict: Callable[[Tensor], Predictive], x_test: Tensor) -> Predictive:
    """``predict(x_test)`` with each rank predicting its shard of the test points
    (:func:`~gpscale.distributed.shard.shard_range`) and the parts gathered; every rank gets all
    of them (a collective). With fewer test points than ranks, or one process, every rank
    predicts all of them itself."""
    env = current()
    if not env.active or x_test.shape[0] < env.world_size:
        return predict(x_test)
    lo, hi = shard_range(x_test.shape[0], env.rank, env.world_size)
    return gather_predictive(predict(x_test[lo:hi]))
