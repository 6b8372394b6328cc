r"""Factorized solvers on K̃ = W K_G Wᵀ + σ²I from (K_G, WᵀW) only (notes/002 §5).

``K(V) = K_G V`` and ``B(V) = WᵀW V`` act on (m, k) blocks and A = K_G WᵀW + σ²I. Every solver
does exactly one K and one B product per iteration (batched over the k columns) and no
n-dimensional work, so an iteration costs O(m log m + m 7^d) whatever n is:

- :func:`factorized_cg`: the corrected Alg. 3 (EFCG) on K̃ x = b with x_0 = 0, in the compressed
  form x = W x̂ + c_x b, which also yields the Lanczos tridiagonal from the CG coefficients.
- :func:`span_cg`: Alg. 4, CG for right-hand sides in span(W) (posterior mean and covariance
  columns).
- :func:`span_lanczos`: Lanczos started from a vector in span(W), for low-rank (LOVE) variances.

The grid structures are in :mod:`gpscale.linalg.interpolation` (W), :mod:`gpscale.linalg.toeplitz`
(K_G) and :mod:`gpscale.linalg.stencil` (the WᵀW stencil).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

__all__ = ["FactorizedCGResult", "factorized_cg", "span_cg", "span_lanczos"]

_F64 = torch.float64


@dataclass(frozen=True)
class FactorizedCGResult:
    """Alg. 3 (EFCG) on K̃ x = b with x_0 = 0, in the compressed form x = W x̂ + c_x b.

    Attributes:
        x_hat: x̂ (m, k).  c_x: (k,).
        wt_x: Wᵀx = WᵀW x̂ + c_x Wᵀb (m, k) (tracked, no extra product).
        b_dot_x: bᵀx = x̂ᵀWᵀb + c_x bᵀb (k,).
        iterations: iterations run.  residual_norms: ‖b − K̃x‖ (k,).
        tridiagonal: Lanczos T from the CG coefficients (k, it, it), when recorded.
    """

    x_hat: Tensor
    c_x: Tensor
    wt_x: Tensor
    b_dot_x: Tensor
    iterations: int
    residual_norms: Tensor
    tridiagonal: Tensor | None


def factorized_cg(K, B, noise: float, h: Tensor, rho: Tensor, *, rtol: float, max_iters: int,
                  record_lanczos: bool = False) -> FactorizedCGResult:
    """Efficient factorized CG (notes §5.4, corrected Alg. 3), batched over columns.

    Runs CG on the n × n system K̃ x = b exactly (in exact arithmetic, Prop. 1) using only
    h = Wᵀb (m, k) and ρ = bᵀb (k,); stops a column when ‖r‖ ≤ rtol ‖b‖. One K and one B product
    per iteration, O(m) other work.
    """
    g = K(h)  # K_G Wᵀ r_0, precomputed once
    zeros = torch.zeros_like(h)
    r, p, x, s_x, u, s, z = (zeros.clone() for _ in range(7))
    c_r, c_p, c_x = torch.ones_like(rho), torch.ones_like(rho), torch.zeros_like(rho)
    eta_p = torch.zeros_like(rho)
    gamma = rho.clone()  # ‖r_k‖²
    bound = rtol**2 * rho
    done = gamma <= bound
    coeffs: list[tuple[Tensor, Tensor, Tensor]] = []
    it = 0
    for it in range(1, max_iters + 1):  # noqa: B007
        if bool(done.all()):
            it -= 1
            break
        q = z + c_p * g  # K̃ p_k = W q̂ + c_q r_0 (Claim 3)
        c_q = noise * c_p
        pi = (s * q).sum(0) + c_q * eta_p + c_p * (q * h).sum(0) + c_p * c_q * rho  # Claim 4
        alpha = torch.where(done, 0.0, gamma / torch.where(done, 1.0, pi))
        x, s_x, c_x = x + alpha * p, s_x + alpha * s, c_x + alpha * c_p
        r, c_r = r - alpha * q, c_r - alpha * c_q
        u = B(r)  # the single ℬ(r̂) call: û = WᵀW r̂, v̂ = K_G û + σ² r̂
        v = K(u) + noise * r
        eta_r = (r * h).sum(0)
        gamma_new = (u * r).sum(0) + 2 * c_r * eta_r + c_r**2 * rho
        beta = torch.where(done, 0.0, gamma_new / gamma)
        coeffs.append((alpha, beta, ~done))
        p, c_p = r + beta * p, c_r + beta * c_p
        s, z, eta_p = u + beta * s, v + beta * z, eta_r + beta * eta_p
        gamma = torch.where(done, gamma, gamma_new)
        done = done | (gamma <= bound)
    T = _tridiagonal_from_cg(coeffs, h) if record_lanczos else None
    return FactorizedCGResult(x, c_x, s_x + c_x * h, (x * h).sum(0) + c_x * rho, it,
                              gamma.clamp_min(0).sqrt(), T)


def _tridiagonal_from_cg(coeffs, h: Tensor) -> Tensor:
    """Lanczos T (k, it, it): T_jj = 1/α_j + β_{j−1}/α_{j−1}, T_{j,j+1} = √β_j/α_j (§5.9)."""
    from gpscale.linalg.solvers.lanczos import tridiagonal

    k = h.shape[1]
    if not coeffs:
        return h.new_ones(k, 1, 1)
    alpha, beta, active = (torch.stack([c[i] for c in coeffs], -1) for i in range(3))
    inv = torch.where(active, 1 / torch.where(active, alpha, 1.0), 0.0)
    diag = inv.clone()
    diag[:, 1:] += beta[:, :-1] * inv[:, :-1]
    off = beta[:, :-1].clamp_min(0).sqrt() * inv[:, :-1]
    diag = torch.where(active, diag, 1.0)  # decoupled identity once a column has stopped
    off = torch.where(active[:, 1:], off, 0.0)
    return tridiagonal(diag, off)


def span_cg(K, B, noise: float, r0: Tensor, *, rtol: float, max_iters: int,
            reference_sq: Tensor | None = None) -> tuple[Tensor, int]:
    """Simplified EFCG (notes §5.5, Alg. 4) when r_0 = W r̂_0: returns (x̂^d, iterations).

    x̂^d = Wᵀ(x − x_0) (m, k); e.g. r̂_0 = −K_G Wᵀy/σ² with x_0 = y/σ² gives
    Wᵀ K̃⁻¹ y = x̂^d + Wᵀy/σ², and r̂_0 = K_G w_* with x_0 = 0 gives Wᵀ K̃⁻¹ W K_G w_*.
    Stops a column when ‖r‖² ≤ rtol² · reference_sq (default ‖r_0‖²).
    """
    r = r0
    u = B(r)
    v = K(u) + noise * r
    z, s = v, u
    gamma = (u * r).sum(0)
    bound = rtol**2 * (gamma if reference_sq is None else reference_sq)
    done = gamma <= bound
    xd = torch.zeros_like(r0)
    it = 0
    for it in range(1, max_iters + 1):  # noqa: B007  (the loop starts at k = 0, §11.8)
        if bool(done.all()):
            it -= 1
            break
        den = (s * z).sum(0)
        alpha = torch.where(done, 0.0, gamma / torch.where(done, 1.0, den))
        xd, r = xd + alpha * s, r - alpha * z
        u = B(r)
        v = K(u) + noise * r
        gamma_new = (u * r).sum(0)
        beta = torch.where(done, 0.0, gamma_new / gamma)
        s, z = u + beta * s, v + beta * z
        gamma = torch.where(done, gamma, gamma_new)
        done = done | (gamma <= bound)
    return xd, it


def span_lanczos(K, B, noise: float, b0: Tensor, num_iters: int
                 ) -> tuple[Tensor, Tensor, Tensor]:
    """Factorized Lanczos (corrected Alg. 6/7) on K̃ from b = W b̂_0: (Q̂, P̂ = WᵀW Q̂, T).

    With the start vector in span(W) every Lanczos vector is q_i = W q̂_i (c ≡ 0), and inner
    products are ⟨W a, W b⟩ = aᵀ WᵀW b. Full re-orthogonalisation (twice) uses the cached P̂ (EFLA).
    One K and one B product per step. Stops early at breakdown.
    """
    p = B(b0)
    norm = (b0 * p).sum().sqrt()
    q, pq = b0 / norm, p / norm
    # the Lanczos vectors as rows of preallocated buffers: re-orthogonalising against the first
    # j + 1 reads a contiguous block (stacking a growing list every step cost O(k² m) copies)
    Qr = q.new_empty(num_iters, q.shape[0])
    Pr = q.new_empty(num_iters, q.shape[0])
    alphas, betas = [], []
    q_prev, b_prev, norm_est = torch.zeros_like(q), 0.0, 0.0
    k = 0
    for j in range(num_iters):
        Qr[j], Pr[j] = q, pq
        k = j + 1
        w = K(pq) + noise * q  # A q̂_i, the recurrence applies 𝒜 to q_i (§11.10)
        a = (pq * w).sum()
        alphas.append(a)
        if j == num_iters - 1:
            break
        w = w - a * q - b_prev * q_prev
        Qm, Pm = Qr[:k], Pr[:k]
        for _ in range(2):
            w = w - Qm.T @ (Pm @ w)
        pw = B(w)
        b = (w * pw).sum().clamp_min(0).sqrt()
        norm_est = max(norm_est, float(a.abs() + b + b_prev))
        if float(b) <= 1e3 * torch.finfo(w.dtype).eps * norm_est:
            break
        betas.append(b)
        q_prev, q, pq, b_prev = q, w / b, pw / b, b
    from gpscale.linalg.solvers.lanczos import tridiagonal

    T = tridiagonal(torch.stack(alphas), torch.stack(betas) if betas else alphas[0].new_zeros(0))
    return Qr[:k].T, Pr[:k].T, T
