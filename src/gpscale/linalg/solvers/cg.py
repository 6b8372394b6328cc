r"""Batched preconditioned conjugate gradients on a matmul closure (Hestenes & Stiefel 1952).

Solves :math:`A X = B` for SPD ``A`` given as ``V ↦ A V`` (or a tensor / ``LinearOperator``), all
k columns of B at once, each with its own stopping rule
:math:`\lVert r_j\rVert \le \max(\text{rtol}\,\lVert b_j\rVert, \text{atol})`; converged columns
are frozen. Preconditioned CG (Saad 2003, Alg. 9.1), per column:

.. math::
    r_0 = b - A x_0,\; z_0 = P^{-1} r_0,\; d_0 = z_0,\;
    \alpha_i = \frac{r_i^\top z_i}{d_i^\top A d_i},\;
    x_{i+1} = x_i + \alpha_i d_i,\; r_{i+1} = r_i - \alpha_i A d_i,\;
    \beta_i = \frac{r_{i+1}^\top z_{i+1}}{r_i^\top z_i},\; d_{i+1} = z_{i+1} + \beta_i d_i.

With ``record_lanczos=True`` the coefficients give the Lanczos tridiagonal of
:math:`P^{-1/2} A P^{-1/2}` started at :math:`P^{-1/2} r_0` (Saad 2003, §6.7.3; GPyTorch's mBCG,
Gardner et al. 2018): :math:`T_{00} = 1/\alpha_0`,
:math:`T_{jj} = 1/\alpha_j + \beta_{j-1}/\alpha_{j-1}`,
:math:`T_{j-1,j} = \sqrt{\beta_{j-1}}/\alpha_{j-1}`. ``logdet`` reuses them (probes from N(0, P)).

Cost per iteration: one matmul with A (n × k), one preconditioner solve, O(n k).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch import Tensor

from gpscale.linalg.ops import Matmul, as_matmul, rademacher
from gpscale.linalg.preconditioners import Preconditioner
from gpscale.linalg.solvers.base import SolverStep
from gpscale.linalg.solvers.lanczos import lanczos_quadrature, tridiagonal

__all__ = ["CGResult", "CGState", "ConjugateGradient"]


@dataclass(frozen=True)
class CGState:
    """The operator and preconditioner CG runs on.

    Attributes:
        matmul: ``V ↦ A V`` for V (n, k).
        preconditioner: P ≈ A, or None.
        size: n when known (from a tensor A or the preconditioner), else None.
        dtype: dtype of A (or of the preconditioner; the default dtype for a bare callable).
        device: device of A (likewise).
    """

    matmul: Matmul
    preconditioner: Preconditioner | None
    size: int | None
    dtype: torch.dtype
    device: torch.device


@dataclass(frozen=True)
class CGResult:
    """The outcome of :meth:`ConjugateGradient.run`.

    Attributes:
        solution: X (n, k), or (n,) for a vector right-hand side.
        iterations: iterations performed (the largest over columns).
        residual_norms: final ‖b_j − A x_j‖ per column (k,).
        converged: per column (k,).
        tridiagonal: Lanczos T per column (k, m, m) when recorded, else None; a column that
            stopped after m_j < m iterations continues with a decoupled identity block.
        lanczos_weights: ``r₀ᵀ P⁻¹ r₀`` per column (k,), the quadrature weight of ``T``.
    """

    solution: Tensor
    iterations: int
    residual_norms: Tensor
    converged: Tensor
    tridiagonal: Tensor | None = None
    lanczos_weights: Tensor | None = None


def _safe_div(num: Tensor, den: Tensor, mask: Tensor) -> Tensor:
    """``num / den`` where ``mask`` and ``den ≠ 0``, else 0 (frozen or exactly solved columns)."""
    mask = mask & (den != 0)
    return torch.where(mask, num / torch.where(mask, den, torch.ones_like(den)), 0.0)


@dataclass(frozen=True)
class ConjugateGradient:
    """Preconditioned CG solver (options only).

    Args:
        rtol: relative residual tolerance per column.
        atol: absolute residual tolerance per column.
        max_iters: iteration cap; default 10 n (rounding can make CG need more than n).
        record_lanczos: keep the Lanczos tridiagonal in :meth:`run`'s result.
        logdet_probes: probes for :meth:`logdet` (stochastic Lanczos quadrature).
        logdet_iters: CG iterations per probe for :meth:`logdet`.
        stop_on: ``'residual'`` (‖r_j‖ against rtol ‖b_j‖) or ``'preconditioned'``
            (‖r_j‖_{P⁻¹} = √(r_jᵀP⁻¹r_j) against rtol ‖b_j‖_{P⁻¹}; with a good P it bounds the
            A-norm error, which the residual does not when A is badly conditioned).

    Example:
        >>> A = torch.tensor([[4.0, 1.0], [1.0, 3.0]], dtype=torch.float64)
        >>> cg = ConjugateGradient(rtol=1e-10)
        >>> cg.solve(cg.init(A), torch.tensor([1.0, 2.0], dtype=torch.float64))
        tensor([0.0909, 0.6364], dtype=torch.float64)
    """

    rtol: float = 1e-6
    atol: float = 0.0
    max_iters: int | None = None
    record_lanczos: bool = False
    logdet_probes: int = 16
    logdet_iters: int = 50
    stop_on: str = "residual"

    def __post_init__(self):
        if self.stop_on not in ("residual", "preconditioned"):
            raise ValueError(f"unknown stop_on {self.stop_on!r}; valid: residual, preconditioned")

    def init(self, A, preconditioner: Preconditioner | None = None, *,
             size: int | None = None) -> CGState:
        """Wrap ``A`` (tensor, ``LinearOperator`` or ``V ↦ A V``) and an optional preconditioner.

        Args:
            A: SPD operator (n, n) or its matmul closure.
            preconditioner: P ≈ A (e.g. a pivoted-Cholesky preconditioner), or None.
            size: n, needed only by :meth:`logdet` for a bare closure without preconditioner.
        """
        like = A if hasattr(A, "shape") else getattr(preconditioner, "L", None)
        if size is None and like is not None:
            size = like.shape[-2]
        dtype = like.dtype if like is not None else torch.get_default_dtype()
        device = like.device if like is not None else torch.device("cpu")
        return CGState(as_matmul(A), preconditioner, size, dtype, device)

    def _steps(self, state: CGState, B: Tensor, x0: Tensor | None):
        """Yield ``(SolverStep, (alpha, beta, active) or None, gamma0)`` (Alg. 9.1)."""
        precond = state.preconditioner.solve if state.preconditioner is not None else None
        X = torch.zeros_like(B) if x0 is None else x0.clone()
        R = B - state.matmul(X) if x0 is not None else B.clone()  # (n, k)
        Z = precond(R) if precond else R
        D, gamma = Z, (R * Z).sum(0)  # (n, k), (k,)
        gamma0 = gamma
        precond_norm = self.stop_on == "preconditioned"
        if precond_norm:  # ‖r‖_{P⁻¹} ≤ rtol ‖r₀‖_{P⁻¹}: ≈ the A-norm error when P ≈ A
            bound = torch.clamp_min(self.rtol * gamma0.clamp_min(0).sqrt(), self.atol)
        else:
            bound = torch.clamp_min(self.rtol * B.norm(dim=0), self.atol)  # (k,)
        norms = R.norm(dim=0)
        done = (gamma.clamp_min(0).sqrt() if precond_norm else norms) <= bound
        yield SolverStep(0, X, R, norms, D, None, done), None, gamma0
        for i in range(1, (self.max_iters or 10 * B.shape[0]) + 1):
            if bool(done.all()):
                return
            AD = state.matmul(D)  # (n, k)
            alpha = _safe_div(gamma, (D * AD).sum(0), ~done)  # (k,), 0 when frozen
            X, R = X + alpha * D, R - alpha * AD
            Z = precond(R) if precond else R
            gamma_new = (R * Z).sum(0)
            beta = _safe_div(gamma_new, gamma, ~done)
            D, gamma = Z + beta * D, torch.where(done, gamma, gamma_new)
            norms = R.norm(dim=0)
            active = ~done
            done = done | ((gamma.clamp_min(0).sqrt() if precond_norm else norms) <= bound)
            yield SolverStep(i, X, R, norms, D, AD, done), (alpha, beta, active), gamma0

    def iterate(self, state: CGState, B: Tensor, x0: Tensor | None = None) -> Iterator[SolverStep]:
        """Frozen :class:`SolverStep` per iteration, starting with iteration 0 (x0).

        Args:
            state: from :meth:`init`.
            B: right-hand sides (n, k).
            x0: initial guess (n, k); zeros by default.
        """
        for step, *_ in self._steps(state, B, x0):
            yield step

    def run(self, state: CGState, B: Tensor, x0: Tensor | None = None) -> CGResult:
        """Run to convergence or ``max_iters``; B (n,) or (n, k), x0 like B."""
        vector = B.dim() == 1
        B2 = B.unsqueeze(-1) if vector else B
        x02 = x0.unsqueeze(-1) if (x0 is not None and vector) else x0
        coefficients: list[tuple[Tensor, Tensor, Tensor]] = []
        for last, coeff, gamma0 in self._steps(state, B2, x02):  # noqa: B007 (last is used)
            if coeff is not None and self.record_lanczos:
                coefficients.append(coeff)
        T = _lanczos_from_cg(coefficients, B2) if self.record_lanczos else None
        X = last.solution.squeeze(-1) if vector else last.solution
        return CGResult(X, last.iteration, last.residual_norm, last.converged, T,
                        gamma0 if self.record_lanczos else None)

    def solve(self, state: CGState, B: Tensor) -> Tensor:
        """``A⁻¹ B`` for B (n,) or (n, k) (up to the tolerance)."""
        return self.run(state, B).solution

    def inv_quad(self, state: CGState, b: Tensor) -> Tensor:
        """``bᵀ A⁻¹ b``; column-wise (k,) for b (n, k)."""
        return (b * self.solve(state, b)).sum(0)

    def inv_congruence(self, state: CGState, B: Tensor) -> Tensor:
        """``Bᵀ A⁻¹ B`` (k, k)."""
        return B.mT @ self.solve(state, B)

    def logdet(self, state: CGState, generator: torch.Generator | None = None) -> Tensor:
        """Stochastic estimate of ``log det A`` from CG's Lanczos coefficients (mBCG).

        ``log det A = log det P + tr log(P^{-1/2} A P^{-1/2})``; the trace is estimated with
        ``logdet_probes`` probes z ~ N(0, P) (Rademacher without P), each solved by
        ``logdet_iters`` CG iterations: ``zᵀ P⁻¹ z · e₁ᵀ log(T) e₁``.

        Args:
            state: from :meth:`init` (with ``size`` known).
            generator: for the probes.
        """
        P, n = state.preconditioner, state.size
        if n is None:
            raise ValueError("CG logdet needs the matrix size: pass size=n to init()")
        if P is not None:
            Z = P.sample(self.logdet_probes, generator)  # (n, p)
        else:
            Z = rademacher(n, self.logdet_probes, dtype=state.dtype, device=state.device,
                           generator=generator)
        solver = ConjugateGradient(rtol=0.0, max_iters=min(self.logdet_iters, n),
                                   record_lanczos=True)
        result = solver.run(state, Z)
        trace = (result.lanczos_weights * lanczos_quadrature(result.tridiagonal)).mean()
        return trace + P.logdet() if P is not None else trace


def _lanczos_from_cg(coefficients: list[tuple[Tensor, Tensor, Tensor]], B: Tensor) -> Tensor:
    """Lanczos tridiagonal (k, m, m) from CG's (alpha, beta, active) per iteration."""
    k, m = B.shape[-1], len(coefficients)
    if m == 0:
        return B.new_ones(k, 1, 1)
    alpha = torch.stack([c[0] for c in coefficients], -1)  # (k, m)
    beta = torch.stack([c[1] for c in coefficients], -1)  # (k, m)
    active = torch.stack([c[2] for c in coefficients], -1)  # (k, m)
    inv_alpha = _safe_div(torch.ones_like(alpha), alpha, active)
    diag = inv_alpha.clone()
    diag[:, 1:] += beta[:, :-1] * inv_alpha[:, :-1]
    off = beta[:, :-1].clamp_min(0).sqrt() * inv_alpha[:, :-1]  # (k, m-1)
    diag = torch.where(active, diag, 1.0)  # decoupled identity after a column stops
    off = torch.where(active[:, 1:], off, 0.0)
    return tridiagonal(diag, off)
