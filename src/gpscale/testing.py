"""Helpers the test suite shares (and that users testing their own methods may reuse).

- :data:`SMALL_OPTIONS`: per method key, options small enough that the method builds on a few
  dozen points in well under a second (the Laplace methods get a fixed kernel so no SVGP
  pre-fit runs): a read-only view of what each family declares (``MethodSpec.test_options``),
  every registered key included.
- :func:`toy_problem`: a seeded 2-D problem for any task (regression, classification, counts).
- Dense float64 references (small n only: they form n × n matrices): Gaussian densities and KL
  divergences, the Laplace approximation's Newton iteration and mode, GP regression with a given
  K̂, IterGP/CG in exact arithmetic, and the (L n × L n) matrices of the likelihoods' W and of
  matrix-free operators (latent-major ordering throughout).
"""

from __future__ import annotations

import torch
from torch import Tensor

from gpscale.kernels import kernel_matrix
from gpscale.methods.registry import DeclaredTable

__all__ = ["SMALL_OPTIONS", "toy_problem", "gaussian_kl", "gaussian_logpdf", "dense_operator",
           "block_kernel", "dense_W", "dense_W_inv", "newton_step", "laplace_mode",
           "gp_regression", "projected_precision", "dense_itergp_cg"]

SMALL_OPTIONS = DeclaredTable("test_options", every=True)
"""``{key: small options}`` for every registered key (module docstring)."""


def toy_problem(task: str = "regression", n: int = 60, *, seed: int = 3
                ) -> tuple[Tensor, Tensor, Tensor]:
    """``(x, y, x_test)`` in float64: x uniform on [-1, 1]², f = sin 3x₁ · cos 2x₂, and y = f
    plus 0.1 noise (regression), 1{f > 0} (classification) or Poisson(exp f) (counts)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(n, 2, generator=g, dtype=torch.float64) * 2 - 1
    f = torch.sin(3 * x[:, 0]) * torch.cos(2 * x[:, 1])
    if task == "classification":
        y = (f > 0).long()
    elif task == "counts":
        y = torch.poisson(torch.exp(f), generator=g)
    else:
        y = f + 0.1 * torch.randn(n, generator=g, dtype=torch.float64)
    x_test = torch.rand(9, 2, generator=g, dtype=torch.float64) * 2 - 1
    return x, y, x_test


def gaussian_kl(m0: Tensor, S0: Tensor, m1: Tensor, S1: Tensor) -> Tensor:
    """KL(N(m0, S0) ‖ N(m1, S1))."""
    diff = m1 - m0
    return 0.5 * (torch.trace(torch.linalg.solve(S1, S0)) + diff @ torch.linalg.solve(S1, diff)
                  - S0.shape[0] + torch.linalg.slogdet(S1)[1] - torch.linalg.slogdet(S0)[1])


def gaussian_logpdf(y: Tensor, mean: Tensor, cov: Tensor) -> Tensor:
    """log N(y; mean, cov)."""
    return torch.distributions.MultivariateNormal(mean, cov).log_prob(y)


def dense_operator(matmul, num_latents: int, n: int, dtype=torch.float64) -> Tensor:
    """The (L n, L n) matrix of a closure V ↦ A V on (L, n, k) tensors."""
    eye = torch.eye(num_latents * n, dtype=dtype).reshape(num_latents, n, num_latents * n)
    return matmul(eye).reshape(num_latents * n, num_latents * n)


def block_kernel(kernel, x1: Tensor, x2: Tensor, num_latents: int) -> Tensor:
    """blockdiag_l K_l(x1, x2) as (L n1, L n2)."""
    K = kernel_matrix(kernel, x1, x2)
    K = K.expand(num_latents, *K.shape[-2:])
    return torch.block_diag(*K)


def dense_W(lik, f: Tensor) -> Tensor:
    return dense_operator(lambda V: lik.W_matmul(f, V), *f.shape)


def dense_W_inv(lik, f: Tensor) -> Tensor:
    return dense_operator(lambda V: lik.W_inv_matmul(f, V), *f.shape)


def newton_step(K: Tensor, lik, f: Tensor, y: Tensor, m: float) -> Tensor:
    """Exact Newton step on Ψ (R&W Eq. 3.18): f' − m = K (I + W K)⁻¹ (W (f − m) + ∇log p)."""
    W = dense_W(lik, f)
    g = (f - m).reshape(-1)
    rhs = W @ g + lik.gradient(f, y).reshape(-1)
    eye = torch.eye(K.shape[0], dtype=K.dtype)
    return m + (K @ torch.linalg.solve(eye + W @ K, rhs)).reshape(f.shape)


def laplace_mode(K: Tensor, lik, y: Tensor, m: float, shape, max_steps: int = 60) -> Tensor:
    """f_MAP by exact Newton iterations from f_0 = m (until the step is below 1e-13)."""
    f = torch.full(shape, m, dtype=K.dtype)
    for _ in range(max_steps):
        f_next = newton_step(K, lik, f, y, m)
        done = float((f_next - f).norm()) <= 1e-13 * max(1.0, float(f_next.norm()))
        f = f_next
        if done:
            break
    return f


def gp_regression(K_hat: Tensor, K_xs: Tensor, K_ss_diag: Tensor, b: Tensor, m: float
                  ) -> tuple[Tensor, Tensor]:
    """Exact GP regression posterior: m + K_sxᵀ K̂⁻¹ b and diag(K_ss − K_xsᵀ K̂⁻¹ K_xs)."""
    mean = m + K_xs.T @ torch.linalg.solve(K_hat, b)
    var = K_ss_diag - (K_xs * torch.linalg.solve(K_hat, K_xs)).sum(0)
    return mean, var


def projected_precision(K_hat: Tensor, S: Tensor) -> Tensor:
    """Eq. 10: C = S (Sᵀ K̂ S)⁻¹ Sᵀ for S (N, j)."""
    return S @ torch.linalg.solve(S.T @ K_hat @ S, S.T)


def dense_itergp_cg(K_hat: Tensor, b: Tensor, num_iterations: int) -> Tensor:
    """IterGP with residual actions from C_0 = 0, densely: returns C_j (N, N)."""
    S = b.new_zeros(b.shape[0], 0)
    C = torch.zeros_like(K_hat)
    for _ in range(num_iterations):
        r = b - K_hat @ (C @ b)
        S = torch.cat([S, r[:, None] / r.norm()], 1)
        C = projected_precision(K_hat, S)
    return C
