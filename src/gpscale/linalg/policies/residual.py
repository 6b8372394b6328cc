r"""Residual (CG) actions: s_j = r_{j−1}, the residuals of conjugate gradients (CaGP-CG).

Wenger et al. (2024), arXiv:2411.01036, Sec. 4.1 and Eq. (S21): CG on K̂ v = y − μ started at
v_0 = 0; its residuals r_0 … r_{i−1} span the Krylov space, so the CaGP mean with these actions is
the i-th CG iterate (Wenger et al. 2022, Sec. 2.1).

Choices the paper leaves open (notes/001 §9 item 6):

- **No gradient through the actions.** CG runs under ``torch.no_grad``; the returned S is a
  constant for autograd. Eq. (11) is a valid bound for *any* S, so the gradient with S held fixed
  is the exact gradient of a valid ELBO at the current actions; backpropagating through i CG
  iterations would cost another i matrix-free kernel products and is unstable in float32.
- **Re-orthonormalised.** Residuals lose orthogonality in floating point; S is replaced by Q from
  two Householder QR passes in float64 ("twice is enough"), which spans the same column space
  (Lemma S4: the posterior is unchanged) and makes SᵀS = I and SᵀK̂S well conditioned.
- **Stopping.** At most ``num_actions`` residuals; CG stops earlier when
  ‖r_j‖ ≤ ``rtol`` ‖y − μ‖ (Table S1's tolerance 1e-4, read as relative), giving fewer actions.

Cost: ``num_actions`` products with K̂ (n² kernel evaluations each) and O(n i²) for the QR.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from gpscale.linalg.ops import Matmul, upcast
from gpscale.linalg.solvers.cg import ConjugateGradient
from gpscale.typing import Float, Tensor

__all__ = ["ResidualPolicy", "orthonormalize"]


def orthonormalize(A: Float[Tensor, "n k"]) -> Float[Tensor, "n k"]:
    """Q with QᵀQ = I and colsp(Q) = colsp(A): two QR passes in float64, in A's dtype."""
    Q = torch.linalg.qr(torch.linalg.qr(upcast(A)).Q).Q  # reorthogonalise once more
    return Q.to(A.dtype)


@dataclass(frozen=True)
class ResidualPolicy:
    """Batch policy returning the first CG residuals of K̂ v = rhs, orthonormalised.

    Attributes:
        num_actions: i, the most residuals (actions) returned.
        rtol: CG stops when ‖r_j‖ ≤ rtol ‖rhs‖; the residual that meets it is not used.
        refresh_every: training steps that share one set of actions (read by
            :meth:`gpscale.methods.cagp.CaGP.training_loss`; 1 recomputes them every step).

    Example:
        >>> A = torch.diag(torch.arange(1.0, 6.0, dtype=torch.float64))
        >>> ResidualPolicy(3)(A.matmul, torch.ones(5, dtype=torch.float64)).shape
        torch.Size([5, 3])
    """

    num_actions: int
    rtol: float = 1e-4
    refresh_every: int = 1

    def __post_init__(self):
        if self.num_actions < 1:
            raise ValueError(f"num_actions must be positive; got {self.num_actions}")
        if self.refresh_every < 1:
            raise ValueError(f"refresh_every must be at least 1; got {self.refresh_every}")
        if not self.rtol >= 0:
            raise ValueError(f"rtol must be ≥ 0; got {self.rtol}")

    def __call__(self, matmul: Matmul, rhs: Float[Tensor, " n"]) -> Float[Tensor, "n j"]:
        """Actions (n, j), j ≤ ``num_actions``, for the SPD operator ``matmul`` (V ↦ K̂ V).

        Raises:
            ValueError: when n is smaller than ``num_actions``.
        """
        if rhs.shape[0] < self.num_actions:
            raise ValueError(f"{rhs.shape[0]} training points are fewer than the "
                             f"{self.num_actions} actions; use at most {rhs.shape[0]} actions "
                             "or more data")
        solver = ConjugateGradient(rtol=self.rtol, max_iters=self.num_actions)
        residuals = []
        with torch.no_grad():
            state = solver.init(matmul, size=rhs.shape[0])
            for step in solver.iterate(state, rhs.detach()[:, None]):
                if residuals and bool(step.converged.all()):
                    break
                residuals.append(step.residual[:, 0])  # r_j, Alg. S1 line 4
                if len(residuals) == self.num_actions:
                    break
            return orthonormalize(torch.stack(residuals, -1))
