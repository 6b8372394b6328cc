r"""Preconditioned m-dimensional solves for K̃ = W K_G Wᵀ + σ²I with a Kronecker K_G.

The factorized CG of :mod:`gpscale.linalg.factorized` runs CG on the n × n K̃ itself, so its
iteration count follows K̃'s conditioning, which worsens as n grows (the largest eigenvalues of
W K_G Wᵀ scale with n): at small noise and many points it needs hundreds of iterations, more
as n grows. This module solves the same model in m dimensions instead, where a
cheap and accurate preconditioner exists.

With K_G = L² (L = √s ⊗_j L_j, L_j the symmetric square root of the j-th Toeplitz factor; dense,
so each m_j must be moderate) and B = WᵀW, Woodbury gives, for any b ∈ ℝⁿ with h = Wᵀb,

.. math::
    a := K_G Wᵀ K̃^{-1} b = L Â^{-1} L h, \qquad Â = σ² I_m + L B L \;(\text{SPD}),

    Wᵀ K̃^{-1} b = (h − B a)/σ², \qquad bᵀ K̃^{-1} b = (bᵀb − hᵀa)/σ²,

    \log\det K̃ = \log\det Â + (n − m)\log σ².

With a = L x, bᵀK̃⁻¹b is computed as (bᵀb − 2hᵀa + aᵀBa)/σ² + xᵀx, equal at the solution and
off by the squared Â-norm of the solve's error elsewhere (the form above loses its digits to
cancellation when the noise is small against the signal).

Â is solved by preconditioned CG with P = σ² I + L B̄ L, where B̄ = ⊗_j B_j / n^{d−1} and B_j is
WᵀW summed over all other dimensions (the 1-D Gram of the j-th coordinates, exact because the
interpolation weights of each dimension sum to one). B̄ = B when d = 1 and E[B̄] = E[B] when the
data density is a product over dimensions, so P⁻¹Â is close to I. P is diagonalised by the
per-dimension eigenvectors V_j of L_j B_j L_j: P = V (σ² + s ∏_j μ_j / n^{d−1}) Vᵀ with V = ⊗_j V_j,
so P⁻¹, P^{±1/2}, log det P and draws from N(0, P) cost O(m Σ_j m_j). log det Â comes from
stochastic Lanczos quadrature on the preconditioned system (the CG coefficients, probes from
N(0, P)). One B product and two L products per iteration; nothing n-dimensional.

Stopping: a column stops when ‖r‖_{P⁻¹} ≤ rtol ‖Lh‖_{P⁻¹}. Â's eigenvalues span σ² to ~n/m times
K_G's, so a small plain residual can leave a large error; with P ≈ Â the P⁻¹-norm of the residual
tracks the Â-norm of the error instead: a loose rtol gives an error of about its own size
in a handful of iterations, where CG on the factorized system needs orders of magnitude more.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from gpscale.linalg.solvers.cg import ConjugateGradient
from gpscale.linalg.stencil import GramStencil
from gpscale.linalg.toeplitz import GridKernel

__all__ = ["KroneckerPreconditioner", "WhitenedResult", "WhitenedSystem", "kron_matmul",
           "kron_sqrt_factors", "marginal_grams", "preconditioned_applies", "whitened_solve",
           "MAX_FACTOR_SIZE"]

_F64 = torch.float64
# Largest per-dimension grid size whose dense factors (eigendecompositions) we build.
MAX_FACTOR_SIZE = 4096


def kron_matmul(factors: list[Tensor], V: Tensor) -> Tensor:
    """(⊗_j F_j) V for V (m, k), m = ∏ m_j, row-major grid order; O(m k Σ m_j)."""
    sizes = [F.shape[1] for F in factors]
    k = V.shape[1]
    X = V.T.reshape(k, *sizes)
    for j, F in enumerate(factors):
        X = torch.tensordot(X, F, dims=([j + 1], [1])).movedim(-1, j + 1)
    return X.reshape(k, -1).T


def _toeplitz(t: Tensor) -> Tensor:
    idx = torch.arange(t.shape[0], device=t.device)
    return t[(idx[:, None] - idx[None, :]).abs()]


def preconditioned_applies(GK: GridKernel) -> bool:
    """Whether :func:`whitened_solve` can run on ``GK`` (Kronecker, factors ≤ MAX_FACTOR_SIZE)."""
    return GK.structure == "kron" and max(GK.sizes) <= MAX_FACTOR_SIZE


def kron_sqrt_factors(GK: GridKernel) -> list[Tensor]:
    """Symmetric square roots L_j of K_G's Toeplitz factors (K_G = s ⊗_j L_j²), float64.

    Raises:
        ValueError: K_G is not a Kronecker product, or a factor is larger than
            :data:`MAX_FACTOR_SIZE`.
    """
    if GK.structure != "kron":
        raise ValueError("the preconditioned solver needs a Kronecker K_G (an RBF kernel, or "
                         "any kernel in one dimension); use solver='iterative'")
    if max(GK.sizes) > MAX_FACTOR_SIZE:
        raise ValueError(f"the preconditioned solver builds dense per-dimension factors; grid "
                         f"sizes {GK.sizes} exceed {MAX_FACTOR_SIZE}: use solver='iterative'")
    out = []
    for spectrum, m_j in zip(GK.spectra, GK.sizes, strict=True):
        t = torch.fft.irfft(spectrum.to(_F64), n=2 * m_j)[:m_j]
        lam, U = torch.linalg.eigh(_toeplitz(t))
        out.append((U * lam.clamp_min(0).sqrt()) @ U.T)
    return out


def marginal_grams(gram: GramStencil) -> list[Tensor]:
    """B_j (m_j, m_j): WᵀW summed over every dimension but j (the 1-D Gram of coordinate j)."""
    d, s = len(gram.sizes), gram.support
    q = 2 * s - 1
    coef = gram.coef.to(_F64).reshape(*([q] * (d - 1)), *gram.sizes, q)
    out = []
    for j, m_j in enumerate(gram.sizes):
        off_axis = j if j < d - 1 else coef.dim() - 1
        node_axis = d - 1 + j
        keep = (node_axis, off_axis)
        rest = [a for a in range(coef.dim()) if a not in keep]
        M = coef.sum(dim=rest) if rest else coef  # (sum over dim=[] would sum everything)
        if node_axis > off_axis:
            M = M.T  # (m_j, q): node, offset
        rows = torch.arange(m_j, device=M.device)[:, None].expand(m_j, q)
        cols = rows + torch.arange(q, device=M.device)[None, :] - (s - 1)
        ok = (cols >= 0) & (cols < m_j)
        B_j = torch.zeros(m_j, m_j, dtype=_F64, device=M.device)
        B_j.index_put_((rows[ok], cols[ok]), M[ok], accumulate=True)
        out.append(0.5 * (B_j + B_j.T))
    return out


@dataclass(frozen=True)
class KroneckerPreconditioner:
    """P = V diag(λ) Vᵀ with V = ⊗_j V_j orthogonal (see the module docstring).

    Implements the :class:`gpscale.linalg.preconditioners.Preconditioner` protocol.

    Attributes:
        vectors: V_j (m_j, m_j).  eigenvalues: λ (m,), all ≥ σ² > 0.
    """

    vectors: list[Tensor]
    eigenvalues: Tensor

    @classmethod
    def build(cls, sqrt_factors: list[Tensor], outputscale: float, grams: list[Tensor],
              noise: float, n: int) -> KroneckerPreconditioner:
        """P = σ² I + s (⊗_j L_j)(⊗_j B_j)(⊗_j L_j) / n^{d−1}."""
        d = len(grams)
        vecs, vals = [], []
        for L_j, B_j in zip(sqrt_factors, grams, strict=True):
            H = L_j @ B_j @ L_j
            mu, V = torch.linalg.eigh(0.5 * (H + H.T))
            vecs.append(V)
            vals.append(mu.clamp_min(0))
        prod = vals[0]
        for mu in vals[1:]:
            prod = torch.outer(prod, mu).reshape(-1)
        lam = noise + outputscale * prod / float(n) ** (d - 1)
        return cls(vecs, lam)

    def _apply(self, R: Tensor, power: float) -> Tensor:
        X = kron_matmul([V.T for V in self.vectors], R)
        return kron_matmul(self.vectors, X * self.eigenvalues[:, None] ** power)

    def solve(self, R: Tensor) -> Tensor:
        """P⁻¹ R for R (m, k)."""
        return self._apply(R, -1.0)

    def inv_sqrt_matmul(self, V: Tensor) -> Tensor:
        """P^{-1/2} V."""
        return self._apply(V, -0.5)

    def logdet(self) -> Tensor:
        """log det P."""
        return self.eigenvalues.log().sum()

    def sample(self, num_samples: int, generator: torch.Generator | None = None) -> Tensor:
        """(m, num_samples) draws V λ^{1/2} ε ~ N(0, P)."""
        eps = torch.randn(self.eigenvalues.shape[0], num_samples, dtype=_F64,
                          generator=generator).to(self.eigenvalues.device)
        return kron_matmul(self.vectors, eps * self.eigenvalues[:, None].sqrt())


@dataclass(frozen=True)
class WhitenedResult:
    """What :func:`whitened_solve` returns for columns b given as (h = Wᵀb, ρ = ‖b‖²).

    Attributes:
        a: K_G Wᵀ K̃⁻¹ b (m, k).  wt_x: Wᵀ K̃⁻¹ b (m, k).  b_dot_x: bᵀ K̃⁻¹ b (k,).
        logdet_samples: per-probe SLQ estimates of log det K̃ (p,), empty when p = 0.
        iterations: preconditioned CG iterations.  residual_norms: of Â's system, per column.
    """

    a: Tensor
    wt_x: Tensor
    b_dot_x: Tensor
    logdet_samples: Tensor
    iterations: int
    residual_norms: Tensor


@dataclass(frozen=True)
class WhitenedSystem:
    """Â = σ²I + L B L with its preconditioner P and the whitening L (module docstring).

    Attributes:
        sqrt_factors: L_j.  root: √s (L = √s ⊗_j L_j).  B: ``V ↦ WᵀW V``.
        noise: σ².  preconditioner: P.
    """

    sqrt_factors: list[Tensor]
    root: float
    B: object
    noise: float
    preconditioner: KroneckerPreconditioner

    @classmethod
    def build(cls, GK: GridKernel, B, grams: list[Tensor], noise: float, n: int
              ) -> WhitenedSystem:
        """From a Kronecker K_G, ``V ↦ WᵀW V``, :func:`marginal_grams`, σ² and n."""
        factors = kron_sqrt_factors(GK)
        scale = float(GK.outputscale)
        P = KroneckerPreconditioner.build(factors, scale, grams, noise, n)
        return cls(factors, math.sqrt(scale), B, noise, P)

    def L(self, V: Tensor) -> Tensor:
        """L V = K_G^{1/2} V for V (m, k)."""
        return self.root * kron_matmul(self.sqrt_factors, V)

    def matmul(self, V: Tensor) -> Tensor:
        """Â V."""
        return self.noise * V + self.L(self.B(self.L(V)))

    def run(self, rhs: Tensor, *, rtol: float, max_iters: int, record_lanczos: bool = False):
        """Preconditioned CG on Â X = rhs (stopping in the P⁻¹-norm); a :class:`CGResult`."""
        cg = ConjugateGradient(rtol=rtol, max_iters=max_iters, record_lanczos=record_lanczos,
                               stop_on="preconditioned")
        return cg.run(cg.init(self.matmul, self.preconditioner, size=rhs.shape[0]), rhs)

    def posterior_quad(self, C: Tensor, *, rtol: float, max_iters: int) -> Tensor:
        """cᵀ(K_G − K_G Wᵀ K̃⁻¹ W K_G)c = σ² (Lc)ᵀ Â⁻¹ (Lc) per column c of C (m, k).

        The Woodbury form of the posterior covariance on the grid: no difference of two large
        terms, so a loose solve still gives an accurate variance.
        """
        U = self.L(C.to(_F64))
        return self.noise * (U * self.run(U, rtol=rtol, max_iters=max_iters).solution).sum(0)


def whitened_solve(GK: GridKernel, B, grams: list[Tensor], noise: float, n: int, h: Tensor,
                   rho: Tensor, *, num_logdet_probes: int, rtol: float, max_iters: int,
                   seed: int = 0, system: WhitenedSystem | None = None) -> WhitenedResult:
    """Preconditioned CG on Â = σ²I + L B L (module docstring), batched over columns.

    Args:
        GK: Kronecker K_G.  B: ``V ↦ WᵀW V`` on (m, k).  grams: :func:`marginal_grams` of WᵀW.
        noise: σ².  n: number of data points.  h: (m, k) Wᵀb per column.  rho: (k,) ‖b‖².
        num_logdet_probes: SLQ probes (drawn from N(0, P) with ``seed``) for log det K̃.
        rtol: relative tolerance on Â's system, in the P⁻¹-norm.  max_iters: CG cap.
        system: Â already built (another whitening or preconditioner: the additive model's
            blocks, :mod:`gpscale.linalg.additive`); ``GK`` and ``grams`` then only give m.
    """
    m = GK.num_grid
    system = system or WhitenedSystem.build(GK, B, grams, noise, n)
    P = system.preconditioner
    probes = P.sample(num_logdet_probes, torch.Generator().manual_seed(seed)) \
        if num_logdet_probes else h.new_zeros(m, 0)
    k = h.shape[1]
    rhs = torch.cat([system.L(h.to(_F64)), probes], 1)
    res = system.run(rhs, rtol=rtol, max_iters=max_iters, record_lanczos=num_logdet_probes > 0)
    x = res.solution[:, :k]
    a = system.L(x)
    Ba = B(a)
    wt_x = (h - Ba) / noise
    # bᵀK̃⁻¹b in its variational form (ρ − 2hᵀa + aᵀWᵀWa)/σ² + ‖x‖²: exact at x = Â⁻¹Lh and
    # off by (x − x*)ᵀÂ(x − x*)/σ² elsewhere, second order in the solve's error, where
    # (ρ − hᵀa)/σ² is off to first order: at a high signal-to-noise ratio ρ and hᵀa nearly
    # cancel, and a loose solve's error in the likelihood misled training
    b_dot_x = (rho - 2 * (h * a).sum(0) + (a * Ba).sum(0)) / noise + (x * x).sum(0)
    if num_logdet_probes:
        from gpscale.linalg.solvers.lanczos import lanczos_quadrature

        T = res.tridiagonal[k:]
        samples = (res.lanczos_weights[k:] * lanczos_quadrature(T) + P.logdet()
                   + (n - m) * math.log(noise))
    else:
        samples = h.new_zeros(0)
    return WhitenedResult(a, wt_x, b_dot_x, samples, res.iterations, res.residual_norms[:k])
