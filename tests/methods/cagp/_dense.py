"""Dense float64 references and small problems for the CaGP tests (notes/001 §10)."""

from __future__ import annotations

import math

import torch

from gpscale.kernels import kernel_matrix
from gpscale.methods import cagp
from gpscale.testing import gaussian_kl  # noqa: F401  (re-exported to the CaGP tests)

N, D = 48, 2
HYPER = {"lengthscale": 0.5, "outputscale": 1.3, "noise": 0.05, "mean_constant": 0.2}
TOL = {"rtol": 1e-8, "atol": 1e-10}


def toy_data(n: int = N, seed: int = 0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(n, D, generator=g, dtype=dtype) * 2
    y = torch.sin(3 * x[:, 0]) + torch.cos(2 * x[:, 1]) + 0.1 * torch.randn(n, generator=g,
                                                                            dtype=dtype)
    return x, y


def opt_model(x, y, num_actions, **kw):
    return cagp.build_cagp_opt(x.shape[1], init=(x, y), num_actions=num_actions,
                               **{**HYPER, **kw})


def fixed_actions(model, S):
    """The same prior and noise, with the fixed actions S (n, i)."""
    return cagp.CaGP(model.mean, model.kernel, model.likelihood, lambda matmul, r: S,
                     num_dims=D)


class Dense:
    """Dense float64 references for one model's prior (K, K̂, μ, σ²) on (x, y)."""

    def __init__(self, model, x, y, x_test=None):
        with torch.no_grad():
            self.K = kernel_matrix(model.kernel, x, x)
            self.mu = model.mean(x)
            self.noise = float(model.noise)
            if x_test is not None:
                self.K_tx = kernel_matrix(model.kernel, x_test, x)
                self.k_tt = kernel_matrix(model.kernel, x_test, x_test).diagonal()
                self.mu_t = model.mean(x_test)
        self.n = x.shape[0]
        self.Kh = self.K + self.noise * torch.eye(self.n)
        self.r = y - self.mu
        self.y = y

    def C(self, S):
        """S (SᵀK̂S)⁻¹ Sᵀ, Eq. (5)."""
        return S @ torch.linalg.solve(S.T @ self.Kh @ S, S.T)

    def posterior(self, C):
        """Mean and variance at the test points for C ≈ K̂⁻¹ (C = K̂⁻¹: the exact GP)."""
        return self.mu_t + self.K_tx @ C @ self.r, self.k_tt - (self.K_tx @ C * self.K_tx).sum(1)

    def exact(self):
        return self.posterior(torch.linalg.inv(self.Kh))

    def q(self, S):
        """q_i(f(X)) = N(μ_i(X), K_i(X, X))."""
        C = self.C(S)
        return self.mu + self.K @ C @ self.r, self.K - self.K @ C @ self.K

    def nll(self):
        """−log p(y) / n."""
        L = torch.linalg.cholesky(self.Kh)
        quad = self.r @ torch.cholesky_solve(self.r[:, None], L)[:, 0]
        return 0.5 * (quad + 2 * L.diagonal().log().sum() + self.n * math.log(2 * math.pi)) / self.n


def predict_dense(model, x, y, x_test):
    with torch.no_grad():
        return model.predict(model.condition(x, y), x_test)
