"""Dense float64 references for the baseline tests, written out by hand (no GPyTorch)."""

from __future__ import annotations

import math

import torch
from torch import Tensor

SQRT3 = math.sqrt(3.0)


def matern32(x1: Tensor, x2: Tensor, lengthscale: Tensor | float, outputscale: float) -> Tensor:
    """s² (1 + √3 r) exp(−√3 r), r = ‖(x1 − x2) / ℓ‖, as a dense (n1, n2) matrix."""
    diff = (x1[:, None, :] - x2[None, :, :]) / lengthscale
    r = diff.pow(2).sum(-1).clamp_min(1e-300).sqrt()  # clamp: finite gradient at r = 0
    return outputscale * (1 + SQRT3 * r) * torch.exp(-SQRT3 * r)


def gaussian_logpdf(y: Tensor, mean: Tensor, cov: Tensor) -> Tensor:
    """log N(y | mean, cov) through a Cholesky factor."""
    L = torch.linalg.cholesky(cov)
    r = y - mean
    alpha = torch.cholesky_solve(r[:, None], L)[:, 0]
    n = y.shape[0]
    return -0.5 * (r @ alpha) - L.diagonal().log().sum() - 0.5 * n * math.log(2 * math.pi)


def exact_posterior(K: Tensor, K_sx: Tensor, k_ss: Tensor, y: Tensor, mean: float,
                    noise: float) -> tuple[Tensor, Tensor]:
    """R&W Alg. 2.1: latent predictive mean and variance at the test points."""
    L = torch.linalg.cholesky(K + noise * torch.eye(K.shape[0], dtype=K.dtype))
    alpha = torch.cholesky_solve((y - mean)[:, None], L)[:, 0]
    V = torch.linalg.solve_triangular(L, K_sx.T, upper=False)
    return mean + K_sx @ alpha, k_ss - V.pow(2).sum(0)


def nystrom(K_xz: Tensor, K_zz: Tensor) -> Tensor:
    """Q = K_xz K_zz⁻¹ K_zx."""
    L = torch.linalg.cholesky(K_zz)
    A = torch.linalg.solve_triangular(L, K_xz.T, upper=False)
    return A.T @ A


def titsias_bound(K_diag: Tensor, K_xz: Tensor, K_zz: Tensor, y: Tensor, mean: float,
                  noise: float) -> Tensor:
    """Titsias (2009) Eq. 9: log N(y | m, Q + σ²I) − tr(K − Q) / (2σ²)."""
    Q = nystrom(K_xz, K_zz)
    n = y.shape[0]
    fit = gaussian_logpdf(y, mean + torch.zeros_like(y), Q + noise * torch.eye(n, dtype=y.dtype))
    return fit - 0.5 * (K_diag.sum() - Q.diagonal().sum()) / noise


def optimal_whitened_q(K_xz: Tensor, K_zz: Tensor, y: Tensor, mean: float,
                       noise: float) -> tuple[Tensor, Tensor]:
    """The Gaussian-likelihood optimum of q(v), v = L⁻¹u, L = chol(K_zz).

    With A = L⁻¹K_zx: S = (I + AAᵀ/σ²)⁻¹ and μ = S A (y − m) / σ² (Titsias 2009, Eq. 10 whitened).
    """
    L = torch.linalg.cholesky(K_zz)
    A = torch.linalg.solve_triangular(L, K_xz.T, upper=False)  # (m, n)
    m = K_zz.shape[0]
    S = torch.linalg.inv(torch.eye(m, dtype=y.dtype) + A @ A.T / noise)
    S = 0.5 * (S + S.T)
    return S @ A @ (y - mean) / noise, S


def whitened_marginals(K_diag: Tensor, K_xz: Tensor, K_zz: Tensor, mean: float, mu: Tensor,
                       S: Tensor) -> tuple[Tensor, Tensor]:
    """Marginals of q(f) = ∫ p(f | v) q(v) dv for whitened q(v) = N(mu, S)."""
    L = torch.linalg.cholesky(K_zz)
    A = torch.linalg.solve_triangular(L, K_xz.T, upper=False)  # (m, n)
    f_mean = mean + A.T @ mu
    f_var = K_diag - A.pow(2).sum(0) + ((S @ A) * A).sum(0)
    return f_mean, f_var


def kl_to_standard_normal(mu: Tensor, S: Tensor) -> Tensor:
    """KL[N(mu, S) ‖ N(0, I)] = ½[tr S + μᵀμ − m − log|S|]."""
    return 0.5 * (S.trace() + mu @ mu - mu.shape[0] - torch.logdet(S))
