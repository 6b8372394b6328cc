"""Dense float64 references and small problems for the SOLVE-GP tests (notes/004 §6)."""

from __future__ import annotations

import math

import torch

from gpscale.kernels import kernel_matrix
from gpscale.methods.solvegp import build_solvegp
from gpscale.testing import gaussian_logpdf

N, D = 48, 2
HYPER = {"lengthscale": 0.6, "outputscale": 1.3, "noise": 0.05, "mean_constant": 0.2}
JITTER = 1e-10  # tiny, so that the bounds compare with exact (unjittered) dense quantities
TOL = {"rtol": 1e-7, "atol": 1e-9}



def toy_data(n: int = N, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(n, D, generator=g) * 4 - 2
    y = torch.sin(2 * x[:, 0]) + 0.5 * torch.cos(x[:, 1]) + 0.1 * torch.randn(n, generator=g)
    return x, y


def small_model(x, y, M=6, M2=5, **kw):
    return build_solvegp(D, init=(x, y), num_inducing=M, num_orthogonal=M2,
                         **{"jitter": JITTER, **HYPER, **kw})


def randomise_q(model, seed: int = 1):
    """Random q(u), q(v⊥): means N(0, 1), Cholesky factors with entries ~0.3 and diag ≥ 0.5."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in (model.q_mean_u, model.q_mean_v):
            p.copy_(torch.randn(p.shape, generator=g))
        for p in (model.q_chol_u, model.q_chol_v):
            if p is not None:
                L = torch.tril(torch.randn(p.shape, generator=g)) * 0.3
                L.diagonal(dim1=-2, dim2=-1).copy_(L.diagonal(dim1=-2, dim2=-1).abs() + 0.5)
                p.copy_(L)
    return model


class Dense:
    """Eqs. (31)–(38), (3), (9), (28)–(30) densely for one model's prior on inputs x."""

    def __init__(self, model, x):
        with torch.no_grad():
            def k(a, b):
                return kernel_matrix(model.kernel, a, b)
            z, o = model.inducing_points[0], model.orthogonal_points[0]
            J = model._jitter()
            self.Kuu = k(z, z) + J * torch.eye(z.shape[0])
            Kuv, Kvv = k(z, o), k(o, o)
            self.Kuf, self.Kff = k(z, x), k(x, x)
            solve = torch.linalg.solve
            self.Cvv = Kvv - Kuv.T @ solve(self.Kuu, Kuv) + J * torch.eye(o.shape[0])
            self.Cvf = k(o, x) - Kuv.T @ solve(self.Kuu, self.Kuf)
            self.Qff = self.Kuf.T @ solve(self.Kuu, self.Kuf)
            self.Cff = self.Kff - self.Qff
            w = torch.cat([z, o])
            Kwf = k(w, x)
            self.Qff_union = Kwf.T @ solve(k(w, w) + J * torch.eye(w.shape[0]), Kwf)
            self.mu0 = float(model.mean.constant)
            self.noise = float(model.noise) if model.task == "regression" else None
        self.n = x.shape[0]

    def q(self, model):
        """The model's (m_u, S_u, m_v, S_v) in unwhitened coordinates."""
        with torch.no_grad():
            m_u, L_u = model.q_mean_u[0], torch.tril(model.q_chol_u[0])
            m_v = model.q_mean_v[0]
            L_v = (torch.tril(model.q_chol_v[0]) if model.q_chol_v is not None
                   else torch.linalg.cholesky(self.Cvv))
            if model.whiten:
                L0u, L0v = torch.linalg.cholesky(self.Kuu), torch.linalg.cholesky(self.Cvv)
                m_u, L_u, m_v = L0u @ m_u, L0u @ L_u, L0v @ m_v
                if model.q_chol_v is not None:
                    L_v = L0v @ L_v
        return m_u, L_u @ L_u.T, m_v, L_v @ L_v.T

    def marginals(self, m_u, S_u, m_v, S_v):
        """Eqs. (33)–(34) / (37)–(38): mean and full covariance."""
        Au = torch.linalg.solve(self.Kuu, self.Kuf)
        Bv = torch.linalg.solve(self.Cvv, self.Cvf)
        mean = self.mu0 + Au.T @ m_u + Bv.T @ m_v
        return mean, Au.T @ S_u @ Au + self.Cff + Bv.T @ (S_v - self.Cvv) @ Bv

    @staticmethod
    def kl(m, S, K):
        """KL[N(m, S) ‖ N(0, K)], Eqs. (35)–(36)."""
        return 0.5 * (torch.logdet(K) - torch.logdet(S) - m.shape[0]
                      + torch.trace(torch.linalg.solve(K, S)) + m @ torch.linalg.solve(K, m))

    def elbo(self, y, m_u, S_u, m_v, S_v):
        """Eq. (31) with the Gaussian closed form."""
        mean, cov = self.marginals(m_u, S_u, m_v, S_v)
        s2 = self.noise
        ell = (-0.5 * math.log(2 * math.pi * s2) - 0.5 * ((y - mean) ** 2 + cov.diagonal()) / s2)
        return ell.sum() - self.kl(m_u, S_u, self.Kuu) - self.kl(m_v, S_v, self.Cvv)

    def svgp_elbo(self, y, m_u, S_u):
        """Hensman et al.'s SVGP ELBO, Eq. (2)."""
        Au = torch.linalg.solve(self.Kuu, self.Kuf)
        mean = self.mu0 + Au.T @ m_u
        var = (Au.T @ S_u @ Au + self.Cff).diagonal()
        s2 = self.noise
        ell = -0.5 * math.log(2 * math.pi * s2) - 0.5 * ((y - mean) ** 2 + var) / s2
        return ell.sum() - self.kl(m_u, S_u, self.Kuu)

    def titsias(self, y, Q=None):
        """Eq. (3) for the Nyström matrix Q (default Q_ff on Z)."""
        Q = self.Qff if Q is None else Q
        eye = torch.eye(self.n)
        return (gaussian_logpdf(y, torch.full_like(y, self.mu0), Q + self.noise * eye)
                - 0.5 / self.noise * torch.trace(self.Kff - Q))

    def collapsed(self, y, m_v, S_v):
        """Eq. (9)."""
        Bv = torch.linalg.solve(self.Cvv, self.Cvf)
        S_f = self.Cff + Bv.T @ (S_v - self.Cvv) @ Bv
        cov = self.Qff + self.noise * torch.eye(self.n)
        return (gaussian_logpdf(y, self.mu0 + Bv.T @ m_v, cov)
                - 0.5 / self.noise * torch.trace(S_f) - self.kl(m_v, S_v, self.Cvv))

    def optimal_q_v(self, y):
        """Eqs. (28)–(29)."""
        A = self.Qff + self.noise * torch.eye(self.n)
        r = y - self.mu0
        CAi = torch.linalg.solve(A, self.Cvf.T).T  # C_vf A⁻¹
        m_v = self.Cvv @ torch.linalg.solve(self.Cvv + CAi @ self.Cvf.T, CAi @ r)
        S_v = self.Cvv @ torch.linalg.solve(self.Cvv + self.Cvf @ self.Cvf.T / self.noise,
                                            self.Cvv)
        return m_v, S_v

    def log_marginal(self, y):
        return gaussian_logpdf(y, torch.full_like(y, self.mu0),
                                self.Kff + self.noise * torch.eye(self.n))


def state_terms(model, x, y):
    state = model.condition(x, y)
    return state, model.projections(state.factors, x)
