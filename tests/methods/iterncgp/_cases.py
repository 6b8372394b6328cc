"""Small problems, models and dense posteriors shared by the IterNCGP tests."""

from __future__ import annotations

import torch

import gpscale.methods.iterncgp.latent as latent
from gpscale.likelihoods import Bernoulli, Gaussian, Poisson, Softmax
from gpscale.methods.iterncgp import (
    IterNCGP,
    Stopping,
)
from gpscale.methods.iterncgp.latent import fixed_kernel
from gpscale.testing import (
    block_kernel,
)

EXACT = dict(atol=0.0, rtol=0.0)


# -- problems ------------------------------------------------------------------------------------
def make_problem(name: str, generator: torch.Generator):
    """(likelihood, x (n, d), y, x_test) of a tiny problem."""
    if name == "poisson":
        x = torch.rand(12, 1, generator=generator)
        y = torch.poisson(torch.exp(1.5 * torch.sin(6 * x[:, 0])), generator=generator)
        return Poisson(), x, y, torch.rand(5, 1, generator=generator)
    if name == "bernoulli":
        x = torch.rand(14, 2, generator=generator) * 2 - 1
        y = (torch.sin(3 * x[:, 0]) + 0.5 * torch.randn(14, generator=generator) > 0).long()
        return Bernoulli(), x, y, torch.rand(5, 2, generator=generator) * 2 - 1
    if name == "softmax":
        x = torch.rand(8, 2, generator=generator) * 2 - 1
        y = torch.bucketize(x[:, 0].contiguous(), torch.tensor([-0.3, 0.3]))
        return Softmax(3), x, y, torch.rand(4, 2, generator=generator) * 2 - 1
    if name == "gaussian":
        x = torch.rand(10, 1, generator=generator)
        y = torch.sin(6 * x[:, 0]) + 0.1 * torch.randn(10, generator=generator)
        return Gaussian(0.05), x, y, torch.rand(5, 1, generator=generator)
    raise KeyError(name)


def problem_kernel(x, lik, name="matern32", lengthscale=0.4, outputscale=2.0, shared=True):
    return fixed_kernel(name, x.shape[1], ard=False, num_latents=lik.num_latents, shared=shared,
                        lengthscale=lengthscale, outputscale=outputscale)


def small_model(lik, x, *, policy=None, recycling=None, stopping=None, prior_mean=0.0, **kw):
    return IterNCGP(problem_kernel(x, lik, **kw), lik, policy, recycling, stopping,
                    prior_mean=prior_mean)


def full_rank_stopping(lik, x) -> Stopping:
    """An exact inner solve: j_max = nL unit vectors, no tolerance stop."""
    return Stopping(max_iterations=lik.num_latents * x.shape[0], atol=0.0, rtol=0.0,
                    max_newton_steps=1)


def dense_posterior(model, x, x_test=None):
    """(K, K(X, X⋄), diag K(X⋄, X⋄)) in latent-major order."""
    L = model.likelihood.num_latents
    K = block_kernel(model.kernel, x, x, L)
    if x_test is None:
        return K
    return K, block_kernel(model.kernel, x, x_test, L), model.latent_kernel.diag(x_test).reshape(-1)


def dense_K_hat(model, x, problem) -> torch.Tensor:
    """Dense K̂ = K + W⁻¹ of a regression problem (W⁻¹ from the problem's own closure)."""
    L, n = problem.b.shape
    eye = torch.eye(L * n).reshape(L, n, L * n)
    return dense_posterior(model, x) + problem.W_inv_matmul(eye).reshape(L * n, L * n)


def flat(t):
    """(L, n) → (L n,); (L, n, k) → (L n, k)."""
    return t.reshape(-1) if t.dim() == 2 else t.reshape(t.shape[0] * t.shape[1], t.shape[-1])


class RandomPolicy:
    """Gaussian random actions (any linearly independent actions satisfy Eq. 10)."""

    def __init__(self, seed: int):
        self.generator = torch.Generator().manual_seed(seed)

    def __call__(self, step):
        return torch.randn(step.residual.shape, generator=self.generator)


class KernelCounter:
    """Counts kernel_matmul calls made by IterNCGP (monkeypatched into its module), with the
    held kernel matrix switched off so that every product with K is a kernel_matmul."""

    def __init__(self, monkeypatch):
        monkeypatch.setattr(latent, "dense_operator_limit", lambda device=None: 0)
        self.calls = 0
        original = latent.kernel_matmul

        def counted(*args, **kwargs):
            self.calls += 1
            return original(*args, **kwargs)

        monkeypatch.setattr(latent, "kernel_matmul", counted)
