r"""The exact GP's loss −log p(y)/n with a hand-written backward pass.

The value is R&W Eq. 2.30 by one Cholesky factor :math:`L L^\top = \hat K = K + σ^2 I`:

.. math:: \ell = \tfrac1{2n}\big[r^\top α + 2\textstyle\sum_i \log L_{ii} + n\log 2π\big],
   \qquad α = \hat K^{-1} r,\ r = y - m(x).

Its gradient with respect to the matrix and the residual is the textbook one (R&W Eq. 5.9):

.. math:: \frac{∂\ell}{∂\hat K} = \tfrac1{2n}(\hat K^{-1} - αα^\top), \qquad
   \frac{∂\ell}{∂r} = α / n, \qquad \frac{∂\ell}{∂σ^2} = \operatorname{tr}\frac{∂\ell}{∂\hat K}.

Autograd reaches the same numbers through the Cholesky factorisation's own backward (two
triangular solves with n right-hand sides and several n×n products, about half of an epoch's
time, BENCHMARKS "defaults"); here the backward is one ``cholesky_inverse`` (n³/3 flops)
and one rank-one update in place, so an epoch costs the kernel matrix, a Cholesky, an inverse
and the kernel's own backward. Memory: K̂'s factor and, in the backward, one n×n inverse.

A failed factorisation is retried with jitter by :func:`~gpscale.linalg.ops.safe_cholesky`
(``cholesky_jitter`` first, ×10 on each of ``max_tries`` retries, GPyTorch's rule; a warning
names it); the jitter is a constant of the loss. A matrix that stays indefinite raises
:class:`~gpscale.errors.NumericalError` naming its size, dtype and the last jitter.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from gpscale.linalg.ops import safe_cholesky

__all__ = ["cholesky_nll"]


class _CholeskyNLL(torch.autograd.Function):
    """(K, σ², r) ↦ −log N(r; 0, K + σ²I)/n with the backward of the module docstring."""

    @staticmethod
    def forward(ctx, kernel_matrix: Tensor, noise: Tensor, residual: Tensor, jitter: float,
                max_tries: int) -> Tensor:
        khat = kernel_matrix.detach().clone()
        khat.diagonal().add_(noise.detach())
        factor = safe_cholesky(khat, jitter=jitter, max_tries=max_tries,
                               name="exact GP kernel matrix K + σ²I")
        del khat
        r = residual.detach()
        alpha = torch.cholesky_solve(r.unsqueeze(-1), factor).squeeze(-1)
        n = r.shape[0]
        logdet = 2.0 * factor.diagonal().log().sum()
        ctx.save_for_backward(factor, alpha)
        return 0.5 * (r @ alpha + logdet + n * math.log(2 * math.pi)) / n

    @staticmethod
    def backward(ctx, grad: Tensor):
        factor, alpha = ctx.saved_tensors
        n = alpha.shape[0]
        scale = grad / n
        d_khat = None
        d_noise = None
        if ctx.needs_input_grad[0] or ctx.needs_input_grad[1]:
            d_khat = torch.cholesky_inverse(factor)
            d_khat.addr_(alpha, alpha, alpha=-1.0).mul_(0.5 * scale)
            if ctx.needs_input_grad[1]:
                d_noise = d_khat.diagonal().sum()
        d_residual = alpha * scale if ctx.needs_input_grad[2] else None
        return d_khat, d_noise, d_residual, None, None


def cholesky_nll(kernel_matrix: Tensor, noise: Tensor, residual: Tensor, *, jitter: float,
                 max_tries: int) -> Tensor:
    """−log N(``residual``; 0, ``kernel_matrix`` + ``noise``·I) / n, differentiable in all three.

    Args:
        kernel_matrix: (n, n) dense prior covariance K (without noise).
        noise: scalar noise variance σ².
        residual: (n,) r = y − m(x).
        jitter, max_tries: first jitter and retries of a failed factorisation.
    """
    return _CholeskyNLL.apply(kernel_matrix, noise.reshape(()), residual, jitter, max_tries)
