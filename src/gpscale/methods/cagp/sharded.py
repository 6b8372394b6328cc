r"""Data-parallel CaGP-Opt: the ELBO of Eq. (11) from per-rank pieces (notes/001 §4, §8).

Rank r holds its rows X_r, y_r (n_r points, :func:`~gpscale.distributed.shard.shard_range`),
plus two small replicated things: all inputs X (n × d, gathered once) and the action entries
(the n-vector of parameters of the learned block-sparse S, replicated like every parameter).
Every term of the loss is a sum over data points or an i × i matrix, so with
Z_r = K(X_r, X) S (n_r × i, the only O(n i)-sized object, now O(n_r i)), r_r = y_r − μ(X_r) and
S_r the rows of S that belong to X_r:

=====================  ==========================================  ====================
quantity               per-rank piece                              reduction
=====================  ==========================================  ====================
G_K = SᵀKS             S_rᵀ Z_r (i × i)                            all-reduce sum
ỹ = Sᵀr                S_rᵀ r_r (i,)                               all-reduce sum
ZᵀZ                    Z_rᵀ Z_r (i × i)                            all-reduce sum
Σ_j K(x_j, x_j)        Σ_{j ∈ r} K(x_j, x_j)                       all-reduce sum
‖r − Zṽ‖²              ‖r_r − Z_r ṽ‖²                              all-reduce sum
SᵀS, L, ṽ, KL terms    from the reduced i × i matrices             replicated
=====================  ==========================================  ====================

so two collectives per loss: one packed all-reduce of G_K, ỹ, ZᵀZ and the kernel diagonal, then
(after every rank solves for ṽ = G⁻¹ỹ) one of the squared error. The loss is identical on every
rank; :func:`~gpscale.distributed.reduce.all_reduce_sum` makes its backward pass exact once the
ranks average their gradients (module docstring of :mod:`gpscale.distributed.reduce`), so loss
and gradients equal the single-process ``CaGP.loss(CaGP.condition(X, y))`` up to rounding.

Z_r comes from :func:`~gpscale.kernels.kernel_block_sparse_rect_matmul`: the fused tile kernels
of :mod:`gpscale.linalg.fused` on (row chunk × block span) tiles, each reduced against its
blocks and recomputed in backward, so no n_r × n matrix exists (a kernel the fused path does not
know takes GPyTorch row chunks); with one rank (all rows) it is the single-process symmetric
product. Cost per rank and loss: n_r · n kernel evaluations, forward and
again in backward, + O(n_r i² + i³); memory O(n_r i + tile). The single-process path evaluates
only n²/2 kernel entries (the symmetric product); P ranks together evaluate n², so P = 2 breaks
even on kernel work and wins on memory per rank. Prediction needs only X, S, ṽ and the Cholesky
factor, all replicated: each rank predicts a shard of the test points and the shards are gathered.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from gpscale.distributed.reduce import all_gather_rows, all_reduce_sums, predict_in_shards
from gpscale.distributions import Predictive
from gpscale.errors import NumericalError
from gpscale.kernels import (
    kernel_block_sparse_matmul,
    kernel_block_sparse_rect_matmul,
    kernel_diag,
)
from gpscale.linalg.operators.block_sparse import BlockSparseActions
from gpscale.linalg.ops import gram64, upcast
from gpscale.linalg.policies.block_sparse import LearnedBlockSparsePolicy
from gpscale.methods.base import Method, ShardPlan, as_dtype
from gpscale.methods.cagp.actions import action_gram, upcast_actions
from gpscale.methods.cagp.state import CaGPState, gram_cholesky, trace_solve, warn_float64_fallback
from gpscale.validation import check_x, check_xy

__all__ = [
    "ShardedCaGPLoss", "ShardedCaGPState", "condition", "expected_log_lik", "kl", "loss",
    "predict", "projected_nll", "sharded_plan",
]


@dataclass(frozen=True)
class ShardedCaGPState:
    """CaGP's conditioned state on one rank: local rows plus all-reduced i × i pieces.

    Attributes:
        x: (n, d) all training inputs (replicated).
        actions: S (n, i), block-sparse (replicated).
        start: first global row of this rank's shard.
        residual: r_r = y_r − μ(X_r) (n_r,).
        K_S: Z_r = K(X_r, X) S (n_r, i).
        gram_K: G_K = SᵀKS (i, i), float64, reduced.
        gram_actions: SᵀS (i, i), float64.
        logdet_actions: log det SᵀS, float64.
        cholesky: L with L Lᵀ = SᵀK̂S, float64.
        y_proj: ỹ = Sᵀr (i,), float64, reduced.
        repr_weights_proj: ṽ = G⁻¹ỹ (i,), float64.
        noise: σ².
        prior_var_sum: Σ_j K(x_j, x_j) over all n, float64, reduced.
        gram_Z: ZᵀZ (i, i), float64, reduced.
        sq_error: ‖r − Zṽ‖² over all n, float64, reduced.
    """

    x: Tensor
    actions: BlockSparseActions
    start: int
    residual: Tensor
    K_S: Tensor
    gram_K: Tensor
    gram_actions: Tensor
    logdet_actions: Tensor
    cholesky: Tensor
    y_proj: Tensor
    repr_weights_proj: Tensor
    noise: Tensor
    prior_var_sum: Tensor
    gram_Z: Tensor
    sq_error: Tensor

    @property
    def num_points(self) -> int:
        """n, all training points."""
        return self.x.shape[0]

    @property
    def num_actions(self) -> int:
        """i."""
        return self.K_S.shape[-1]


def _check_model(model: Method) -> None:
    if not isinstance(getattr(model, "policy", None), LearnedBlockSparsePolicy):
        raise ValueError("data-parallel CaGP needs a cagp-opt model (learned block-sparse "
                         f"actions); got {type(model).__name__} with "
                         f"{type(getattr(model, 'policy', None)).__name__}")


def _local_rows(S: BlockSparseActions, start: int, stop: int) -> tuple[Tensor, Tensor]:
    """(block, value) of the non-zero entry of each row start … stop − 1 of S (data order)."""
    pos = S.inverse_index()[start:stop]
    return S.layout.block_ids(S.values.device)[pos], S.values[pos]


def _project(blocks: Tensor, values: Tensor, M: Tensor, num_blocks: int) -> Tensor:
    """S_rᵀ M (i, k) for M (n_r, k) in float64: segment sums of s_p M[p] into block(p)."""
    rows = upcast(values)[:, None] * upcast(M)
    return rows.new_zeros(num_blocks, M.shape[-1]).index_add(0, blocks, rows)


def _kernel_rows_times_actions(model: Method, x_all: Tensor, S: BlockSparseActions, start: int,
                               stop: int) -> Tensor:
    """Z_r = K(X_r, X) S (n_r, i): the fused rectangular product, or the symmetric one when
    this rank holds every row (P = 1), which evaluates half the kernel entries."""
    if start == 0 and stop == x_all.shape[0]:
        return kernel_block_sparse_matmul(model.kernel, x_all, S, chunk_size=model.chunk_size,
                                          backend=model.backend)
    rows = torch.arange(start, stop, device=x_all.device)
    return kernel_block_sparse_rect_matmul(model.kernel, x_all, S, rows=rows,
                                           chunk_size=model.chunk_size, backend=model.backend)

def condition(model: Method, x_all: Tensor, x: Tensor, y: Tensor, start: int) -> ShardedCaGPState:
    """This rank's part of ``model.condition(X, y)`` (Alg. S2 lines 1–5); a collective.

    Args:
        model: a ``cagp-opt`` model, identical on every rank.
        x_all: (n, d) all training inputs, in the order the actions were built for.
        x, y: (n_r, d), (n_r,) this rank's rows ``x_all[start : start + n_r]`` and targets.
        start: the first row of this rank's shard.

    Returns:
        The state; every rank must call this with its own shard at the same time.

    Raises:
        ValueError: not a cagp-opt model, invalid data, or a shard outside 0 … n − 1.
    """
    _check_model(model)
    check_x(x_all, num_dims=model.num_dims, name="x_all")
    check_x(x, num_dims=model.num_dims)
    check_xy(x, y)
    n, stop = x_all.shape[0], start + x.shape[0]
    if not 0 <= start <= stop <= n:
        raise ValueError(f"the shard rows {start} … {stop - 1} lie outside 0 … {n - 1}")
    S = model.policy()
    if S.layout.num_points != n:
        raise ValueError(f"the actions were learned for {S.layout.num_points} training points; "
                         f"x_all has {n}")
    try:
        return _condition(model, x_all, x, y, start, S)
    except NumericalError:  # G_K is all-reduced, so every rank takes this branch together
        if x.dtype == torch.float64:
            raise
        warn_float64_fallback(x.dtype)
        return _condition(model, upcast(x_all), upcast(x), y, start, upcast_actions(S))


def _condition(model: Method, x_all: Tensor, x: Tensor, y: Tensor, start: int,
               S: BlockSparseActions) -> ShardedCaGPState:
    r = y.to(x.dtype) - model.mean(x)  # r_r
    noise, i, stop = model.noise, S.layout.num_blocks, start + x.shape[0]
    Z = _kernel_rows_times_actions(model, x_all, S, start, stop)  # K(X_r, X) S (n_r, i)
    blocks, values = _local_rows(S, start, stop)
    G_K, y_proj, gram_Z, prior_var = all_reduce_sums(
        _project(blocks, values, Z, i), _project(blocks, values, r[:, None], i)[:, 0],
        gram64(Z), upcast(kernel_diag(model.kernel, x)).sum())
    G_K = 0.5 * (G_K + G_K.mT)
    D, logdet_D = action_gram(S)
    L = gram_cholesky(G_K, noise, D, x.dtype)  # float32: jitter capped, else NumericalError
    v = torch.cholesky_solve(y_proj[:, None], L)[:, 0]
    error = r - Z @ as_dtype(v, Z)
    (sq,) = all_reduce_sums(upcast(error.square().sum()))
    return ShardedCaGPState(x_all, S, start, r, Z, G_K, D, logdet_D, L, y_proj, v, noise,
                            prior_var, gram_Z, sq)


def expected_log_lik(state: ShardedCaGPState) -> Tensor:
    """E_q[log p(y | f)] / n from the reduced sums (``CaGP.expected_log_lik``)."""
    n = state.num_points
    var_sum = state.prior_var_sum - trace_solve(state.cholesky, state.gram_Z)
    noise = upcast(state.noise)
    return -0.5 * ((state.sq_error + var_sum) / noise + n * torch.log(2 * math.pi * noise)) / n


def kl(state: ShardedCaGPState) -> Tensor:
    """KL(q_i ‖ p) / n (``CaGP.kl``); i × i work only."""
    n, i, v = state.num_points, state.num_actions, state.repr_weights_proj
    logdet_G = 2 * state.cholesky.diagonal().log().sum()
    value = (v @ state.gram_K @ v - trace_solve(state.cholesky, state.gram_K) + logdet_G
             - i * torch.log(upcast(state.noise)) - state.logdet_actions)
    return 0.5 * value / n


def projected_nll(state: ShardedCaGPState) -> Tensor:
    """Eq. (9) / n (``CaGP.projected_nll``)."""
    n, i = state.num_points, state.num_actions
    logdet_G = 2 * state.cholesky.diagonal().log().sum()
    value = (state.y_proj @ state.repr_weights_proj + logdet_G - state.logdet_actions
             + i * math.log(2 * math.pi))
    return 0.5 * value / n


def loss(model: Method, state: ShardedCaGPState) -> Tensor:
    """The model's objective per datum (``model.objective``), the same value on every rank."""
    value = kl(state) - expected_log_lik(state) if model.objective == "elbo" else \
        projected_nll(state)
    return as_dtype(value, state.K_S)


class ShardedCaGPLoss:
    """``loss_fn(model, x_r, y_r)`` for ``training.fit`` on one rank's full shard.

    Args:
        x_all: (n, d) all training inputs.
        start: the first row of this rank's shard.
    """

    def __init__(self, x_all: Tensor, start: int):
        self.x_all, self.start = x_all, start

    def __call__(self, model: Method, x: Tensor, y: Tensor) -> Tensor:
        if x.shape[0] + self.start > self.x_all.shape[0]:
            raise ValueError("data-parallel CaGP-Opt trains on the full shard (batch_size=None)")
        return loss(model, condition(model, self.x_all, x, y, self.start))


def predict(model: Method, state: ShardedCaGPState, x_test: Tensor,
            chunk_size: int = 4096) -> Predictive:
    """μ_i, K_i and σ² at ``x_test`` (t, d), the same on every rank (a collective when P > 1).

    Each rank predicts rows ``shard_range(t, rank, P)`` with ``model.predict`` and the parts are
    gathered; with fewer test points than ranks every rank predicts all of them.
    """
    full = CaGPState(state.x, state.actions, state.residual, state.K_S, state.gram_K,
                     state.gram_actions, state.logdet_actions, state.cholesky, state.y_proj,
                     state.repr_weights_proj, state.noise, state.prior_var_sum)
    # ``full`` carries only this rank's rows of r and K S; CaGP.predict reads neither.
    return predict_in_shards(lambda part: model.predict(full, part, chunk_size), x_test)


def sharded_plan(model: Method, x: Tensor, y: Tensor, start: int) -> ShardPlan:
    """CaGP-Opt's :class:`~gpscale.methods.base.ShardPlan`: every rank gathers all inputs X
    once, trains on the full-data ELBO (:class:`ShardedCaGPLoss`) and predicts a shard of the
    test points from the reduced state."""
    _check_model(model)
    x_all = all_gather_rows(x)

    def predict_all(x_test: Tensor) -> Predictive:
        with torch.no_grad():
            return predict(model, condition(model, x_all, x, y, start), x_test)

    return ShardPlan("global", predict_all, ShardedCaGPLoss(x_all, start), full_batch=True,
                     inputs=x_all)
