"""Dense float64 references for the IterNCGP tests (latent-major / NC ordering throughout)."""

from __future__ import annotations

import torch
from torch import Tensor

from gpscale.kernels import kernel_matrix


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
