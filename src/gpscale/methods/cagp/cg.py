r"""What makes CaGP-CG affordable on a CPU: a cached kernel matrix for CG, and recycled actions.

A CaGP-CG step (Alg. S1) runs up to i = 512 conjugate-gradient iterations, each one product
K̂ v with a single vector, and then the ELBO's K S with all i actions. Matrix-free, a single-vector
product recomputes all n² kernel entries for one column of output, so it costs about as much as
a product with many columns: at a few ten thousand points one step's CG took minutes and the
default budget held only a few steps (BENCHMARKS.md, defaults). Two changes, both leaving the
method's objective a valid bound:

1. :class:`KernelOperator` — the V ↦ K̂ V the CG policy calls. CG runs without gradients, so when
   n² entries fit in :func:`~gpscale.methods._common.dense_operator_limit` the operator builds
   K(X, X) once per CG run (:func:`gpscale.kernels.dense_kernel_matrix`, about the cost of three
   matrix-free products) and every iteration is a dense mat-vec (memory bound, several times
   faster). Larger n, or a product that needs gradients, stays matrix-free.
2. :func:`recycling_loss` — the training loss ``training.fit`` uses for full-data steps. Eq. (11)
   is a lower bound on the log evidence for *any* actions S (notes/001 §5), so the CG actions
   computed at one step's hyperparameters remain valid ones at the next: they are recomputed
   every ``refresh_every`` steps (the policy's attribute; 1 = the paper's every step) and the
   steps between cost only the ELBO's K S. The gradient with S fixed is then the exact gradient
   of the bound at those actions — what the paper's CaGP-CG does within a step anyway (no
   gradient through CG, :mod:`gpscale.linalg.policies.residual`). Conditioning outside
   training (``posterior``, prediction) always runs CG afresh at the final hyperparameters.

Also here: :func:`iterative_posterior`, Alg. S1 one action at a time (the reference the batch
form is tested against; re-exported by :mod:`gpscale.methods.cagp`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from gpscale.kernels import dense_kernel_matrix, kernel_matmul
from gpscale.linalg.ops import Matmul
from gpscale.methods._common import dense_operator_limit

__all__ = ["CG_ENTRY_BUDGET", "IterativePosterior", "KernelOperator", "cg_action_cap",
           "iterative_posterior", "recycling_loss"]

CG_ENTRY_BUDGET = 2**37
"""The default number of CaGP-CG actions keeps i · n² ≤ this (:func:`cg_action_cap`): one CG
run multiplies at most ~1.4·10¹¹ kernel entries — 512 actions up to n = 16,384, fewer as
1/n² beyond. A CG iteration cannot use more than one column, so its cost grows as n² whatever
the hardware; without the cap one CG run at a few ten thousand points takes minutes even with
the cached matrix (far longer matrix-free), beyond the default training budget on its own."""


def cg_action_cap(n: int | None) -> int:
    """The default most CG actions for n training points: min(512, ⌊2³⁷ / n²⌋), at least 1."""
    if n is None:
        return 512
    return max(1, min(512, CG_ENTRY_BUDGET // max(1, n * n)))


class KernelOperator:
    """V ↦ (K(X, X) + σ² I) V for the CG policy, dense when it fits and no gradient is needed.

    Args:
        kernel: the GPyTorch kernel K.
        x: training inputs X (n, d).
        noise: σ² (a scalar tensor).
        chunk_size, backend: of the matrix-free products (:func:`gpscale.kernels.kernel_matmul`).
        max_bytes: cache K when n² entries of x's dtype take at most this many bytes
            (default :func:`~gpscale.methods._common.dense_operator_limit`).
    """

    def __init__(self, kernel: nn.Module, x: Tensor, noise: Tensor, *,
                 chunk_size: int | None = None, backend: str = "auto",
                 max_bytes: int | None = None):
        self.kernel, self.x, self.noise = kernel, x, noise
        self.chunk_size, self.backend = chunk_size, backend
        limit = dense_operator_limit(x.device) if max_bytes is None else max_bytes
        self.cacheable = x.shape[0] ** 2 * x.element_size() <= limit
        self.dense: Tensor | None = None

    def __call__(self, V: Tensor) -> Tensor:
        if self.cacheable and not torch.is_grad_enabled():
            if self.dense is None:
                self.dense = dense_kernel_matrix(self.kernel, self.x)
            return torch.addmm(V, self.dense, V.to(self.dense.dtype), beta=self.noise.item())
        return kernel_matmul(self.kernel, self.x, self.x, V, chunk_size=self.chunk_size,
                             backend=self.backend) + self.noise * V


def recycling_loss(model: nn.Module, x: Tensor, y: Tensor,
                   refresh_every: int) -> Callable[[nn.Module, Tensor, Tensor], Tensor]:
    """The full-data loss with the policy's actions recomputed every ``refresh_every`` calls.

    ``model`` is a :class:`gpscale.methods.cagp.CaGP` (``actions_for`` and ``condition(...,
    actions=)``). Calls on other data than (x, y) (a minibatch) condition from scratch.
    """
    if refresh_every < 1:
        raise ValueError(f"refresh_every must be at least 1; got {refresh_every}")
    held: dict[str, object] = {"actions": None, "age": 0}

    def loss(m: nn.Module, xb: Tensor, yb: Tensor) -> Tensor:
        if xb is not x or yb is not y:
            return m.loss(m.condition(xb, yb))
        if held["actions"] is None or held["age"] >= refresh_every:
            held["actions"], held["age"] = m.actions_for(x, y), 0
        held["age"] += 1
        return m.loss(m.condition(x, y, actions=held["actions"]))

    return loss


@dataclass(frozen=True)
class IterativePosterior:
    """Alg. S1's output: C_i = D̃ D̃ᵀ ≈ K̂⁻¹ and v_i ≈ K̂⁻¹ r.

    Attributes:
        directions: D̃ (n, i), columns d_j / √η_j.
        repr_weights: v_i (n,).
        actions: the actions s_1 … s_i taken (n, i).
    """

    directions: Tensor
    repr_weights: Tensor
    actions: Tensor


def iterative_posterior(matmul: Matmul, rhs: Tensor, policy: Callable[[int, Tensor], Tensor],
                        num_actions: int) -> IterativePosterior:
    """CaGP with actions chosen one at a time (Alg. S1; Wenger et al. 2022's IterGP).

    Args:
        matmul: V ↦ K̂ V for V (n, k).
        rhs: r = y − μ(X) (n,).
        policy: ``(j, r_{j−1}) -> s_j`` (n,), e.g. ``lambda j, res: res`` for CG residuals.
        num_actions: i.

    Returns:
        The low-rank factor of C_i and the representer weights v_i (the CaGP posterior is
        μ + K(·, X) v_i and K − K(·, X) C_i K(X, ·)).
    """
    n = rhs.shape[0]
    C = rhs.new_zeros(n, 0)  # D̃, C_0 = 0
    v = torch.zeros_like(rhs)  # v_0 = 0
    actions = []
    for j in range(num_actions):
        res = rhs - matmul(v[:, None])[:, 0]  # line 4, r_{j−1}
        s = policy(j, res)  # line 3
        alpha = s @ res  # line 5
        z = matmul(s[:, None])[:, 0]  # line 6, K̂ s
        d = s - C @ (C.mT @ z)  # line 7, Σ_{j−1} K̂ s
        eta = z @ d  # line 8
        C = torch.cat([C, (d / eta.sqrt())[:, None]], -1)  # line 9
        v = v + alpha / eta * d  # line 10
        actions.append(s)
    return IterativePosterior(C, v, torch.stack(actions, -1))
