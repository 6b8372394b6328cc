r"""The exact GP's loss −log p(y)/n with a hand-written backward pass.

The value is R&W Eq. 2.30 by one Cholesky factor :math:`L L^\top = \hat K = K + σ^2 I`:

.. math:: \ell = \tfrac1{2n}\big[r^\top α + 2\textstyle\sum_i \log L_{ii} + n\log 2π\big],
   \qquad α = \hat K^{-1} r,\ r = y - m(x).

Its gradient with respect to the matrix and the residual is the textbook one (R&W Eq. 5.9):

.. math:: \frac{∂\ell}{∂\hat K} = \tfrac1{2n}(\hat K^{-1} - αα^\top), \qquad
   \frac{∂\ell}{∂r} = α / n, \qquad \frac{∂\ell}{∂σ^2} = \operatorname{tr}\frac{∂\ell}{∂\hat K}.

Autograd reaches the same numbers through the Cholesky factorisation's own backward (two
triangular solves with n right-hand sides and several n×n products: ~10 s of a 22 s epoch at
n = 5,287, BENCHMARKS "defaults"); here the backward is one ``cholesky_inverse`` (n³/3 flops)
and one rank-one update in place, so an epoch costs the kernel matrix, a Cholesky, an inverse
and the kernel's own backward. Memory: K̂'s factor and, in the backward, one n×n inverse.

Jitter follows GPyTorch's rule for a failed factorisation (``cholesky_jitter`` first, ×10 on each
of ``max_tries`` retries); the jitter is a constant of the loss. A matrix that stays indefinite
raises :class:`~gpscale.errors.NumericalError` naming its size, dtype and the last jitter.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from gpscale.errors import NumericalError

__all__ = ["cholesky_factor", "cholesky_nll"]


def cholesky_factor(khat: Tensor, jitter: float, max_tries: int, what: str = "kernel matrix"
                    ) -> Tensor:
    """Lower Cholesky factor of ``khat``, adding ``jitter``·10^k on retry k = 0 … max_tries − 1.

    ``khat`` is not modified. Raises :class:`NumericalError` when every try fails.
    """
    factor, info = torch.linalg.cholesky_ex(khat)
    if not bool(info.any()):
        return factor
    added = 0.0
    for k in range(max_tries):
        step = jitter * 10.0**k
        shifted = khat.clone()
        shifted.diagonal().add_(step)
        factor, info = torch.linalg.cholesky_ex(shifted)
        added = step
        del shifted
        if not bool(info.any()):
            return factor
    raise NumericalError(
        f"the {what} ({khat.shape[0]} × {khat.shape[1]}, {khat.dtype}) is not positive definite "
        f"after {max_tries} jittered tries (last jitter {added:.1e}). Increase "
        "cholesky_jitter_double (or _float), train in float64, or start from a larger noise.")


class _CholeskyNLL(torch.autograd.Function):
    """(K, σ², r) ↦ −log N(r; 0, K + σ²I)/n with the backward of the module docstring."""

    @staticmethod
    def forward(ctx, kernel_matrix: Tensor, noise: Tensor, residual: Tensor, jitter: float,
                max_tries: int) -> Tensor:
        khat = kernel_matrix.detach().clone()
        khat.diagonal().add_(noise.detach())
        factor = cholesky_factor(khat, jitter, max_tries)
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
        jitter, max_tries: the retry rule of :func:`cholesky_factor`.
    """
    return _CholeskyNLL.apply(kernel_matrix, noise.reshape(()), residual, jitter, max_tries)
