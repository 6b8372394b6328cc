"""Small SoftKI problems and the dense float64 references the SoftKI tests compare with."""

from __future__ import annotations

import math

import torch

from gpscale.kernels import kernel_matrix
from gpscale.methods.softki import SoftKI, build_softki

N, D, M = 60, 3, 10
HYPER = {"lengthscale": 1.1, "outputscale": 0.8, "noise": 0.05}
TOL = {"rtol": 1e-8, "atol": 1e-10}


def toy_data(n: int = N, d: int = D, seed: int = 0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=g, dtype=dtype)
    y = torch.sin(x.sum(1)) + 0.1 * torch.randn(n, generator=g, dtype=dtype)
    return x, y


def small_model(x, y, **kw) -> SoftKI:
    return build_softki(x.shape[1], init=(x, y), **{"num_inducing": M, **HYPER, **kw})


class Dense:
    """Dense float64 references for one model on (x, y): W, K_zz, Q̃, Σ = Q̃ + β²I."""

    def __init__(self, model: SoftKI, x, y):
        self.model = model
        self.z = model.inducing_points
        self.K = kernel_matrix(model.kernel, self.z, self.z)
        self.W = model.weights(x, self.z)
        self.noise = model.noise
        self.r = y - model.mean_constant
        self.n = x.shape[0]
        self.Q = self.W @ self.K @ self.W.T
        self.S = self.Q + self.noise * torch.eye(self.n)

    def nll(self):
        """−log N(r | 0, Σ) / n, differentiable in the model's parameters."""
        L = torch.linalg.cholesky(self.S)
        quad = self.r @ torch.cholesky_solve(self.r[:, None], L)[:, 0]
        return 0.5 * (quad + 2 * L.diagonal().log().sum()
                      + self.n * math.log(2 * math.pi)) / self.n

    def posterior(self, x_test):
        """Dense mean and latent variance Q̃_** − Q̃_*x Σ⁻¹ Q̃_x* (notes §2.7)."""
        Ws = self.model.weights(x_test, self.z)
        Q_sx = Ws @ self.K @ self.W.T
        mean = self.model.mean_constant + Q_sx @ torch.linalg.solve(self.S, self.r)
        var = (Ws @ self.K @ Ws.T - Q_sx @ torch.linalg.solve(self.S, Q_sx.T)).diagonal()
        return mean, var

    def capacitance(self):
        """Ĉ = K_zz + K̂_zx K̂_xz / β² (Eq. 25)."""
        Kh = self.W @ self.K
        return self.K + Kh.T @ Kh / self.noise

    def woodbury(self, x_test):
        """Mean K̂_*z Ĉ⁻¹ K̂_zx r / β² and variance K̂_*z Ĉ⁻¹ K̂_z* with Ĉ solved directly."""
        C = self.capacitance()
        Kh, Kh_s = self.W @ self.K, self.model.weights(x_test, self.z) @ self.K
        alpha = torch.linalg.solve(C, Kh.T @ self.r / self.noise)
        var = (Kh_s @ torch.linalg.solve(C, Kh_s.T)).diagonal()
        return self.model.mean_constant + Kh_s @ alpha, var


def parameter_grads(model: SoftKI, value: torch.Tensor) -> list[torch.Tensor]:
    params = [p for p in model.parameters() if p.requires_grad]
    return list(torch.autograd.grad(value, params))
