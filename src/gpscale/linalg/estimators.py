r"""Stochastic trace and log-determinant estimators from matrix-vector products.

Hutchinson (1989): for probes z with :math:`E[z z^\top] = I` (Rademacher here),
:math:`\operatorname{tr} A = E[z^\top A z]`.

Stochastic Lanczos quadrature (Ubaru, Chen & Saad 2017, Alg. 1):
:math:`\log\det A = \operatorname{tr}\log A \approx \frac{1}{p}\sum_{i=1}^{p}
\lVert z_i\rVert^2\, e_1^\top \log(T_i)\, e_1` with T_i from ``num_iters`` Lanczos steps started
at :math:`z_i`; for Rademacher probes :math:`\lVert z_i\rVert^2 = n`. With m = n steps each
term equals :math:`z_i^\top \log(A)\, z_i` exactly. With a preconditioner P (which must offer
``logdet`` and ``inv_sqrt_matmul``), :math:`\log\det A = \log\det P +
\operatorname{tr}\log(P^{-1/2} A P^{-1/2})` and the trace is estimated the same way on the
better-conditioned operator.

Both return a :class:`StochasticEstimate` with the per-probe samples and the standard error
:math:`s/\sqrt{p}`. Neither is meant to be differentiated through (Lanczos is not).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from gpscale.linalg.ops import as_matmul, rademacher
from gpscale.linalg.solvers.lanczos import lanczos, lanczos_quadrature

__all__ = ["StochasticEstimate", "hutchinson_trace", "stochastic_logdet"]


@dataclass(frozen=True)
class StochasticEstimate:
    """A Monte-Carlo estimate.

    Attributes:
        estimate: the mean of the samples (scalar).
        std_error: sample standard deviation / √(num_probes) (scalar; NaN for one probe).
        samples: one unbiased estimate per probe (num_probes,).
    """

    estimate: Tensor
    std_error: Tensor
    samples: Tensor

    @classmethod
    def from_samples(cls, samples: Tensor) -> StochasticEstimate:
        p = samples.shape[0]
        std = samples.std() if p > 1 else torch.full_like(samples[0], float("nan"))
        return cls(estimate=samples.mean(), std_error=std / p**0.5, samples=samples)


def _probe_kind(A, dtype: torch.dtype | None, generator: torch.Generator | None):
    """Probe dtype and device: from ``A`` when it is a tensor, else the arguments."""
    if hasattr(A, "dtype") and hasattr(A, "device"):
        return A.dtype, A.device
    device = generator.device if generator is not None else None
    return dtype or torch.get_default_dtype(), device


def hutchinson_trace(matmul, n: int, num_probes: int,
                     generator: torch.Generator | None = None, *,
                     dtype: torch.dtype | None = None) -> StochasticEstimate:
    """Hutchinson's estimate of ``tr A`` with Rademacher probes: samples ``zᵢᵀ A zᵢ``.

    Args:
        matmul: ``V ↦ A V`` for V (n, k), or a tensor / ``LinearOperator`` (n, n).
        n: size of A.
        num_probes: number of probes p.
        generator: for the probes.
        dtype: probe dtype for a closure (a tensor's own dtype and device are used otherwise;
            a closure's probes live on the generator's device).

    Returns:
        The estimate, its standard error and the p samples.
    """
    dtype, device = _probe_kind(matmul, dtype, generator)
    Z = rademacher(n, num_probes, dtype=dtype, device=device, generator=generator)  # (n, p)
    return StochasticEstimate.from_samples((Z * as_matmul(matmul)(Z)).sum(0))


def stochastic_logdet(matmul, n: int, *, num_probes: int, num_iters: int, preconditioner=None,
                      generator: torch.Generator | None = None,
                      dtype: torch.dtype | None = None) -> StochasticEstimate:
    """``log det A`` for SPD A by stochastic Lanczos quadrature with Rademacher probes.

    Args:
        matmul: ``V ↦ A V`` for V (n, k), or a tensor / ``LinearOperator`` (n, n).
        n: size of A.
        num_probes: number of probes p.
        num_iters: Lanczos steps per probe (m ≤ n; m = n is exact per probe).
        preconditioner: optional P ≈ A with ``logdet()`` and ``inv_sqrt_matmul(V)``, e.g.
            :class:`gpscale.linalg.preconditioners.PivotedCholeskyPreconditioner`.
        generator: for the probes.
        dtype: probe dtype for a closure (see :func:`hutchinson_trace`).

    Returns:
        The estimate, its standard error and the p samples ``n · e₁ᵀ log(Tᵢ) e₁ (+ log det P)``.
    """
    A = as_matmul(matmul)
    dtype, device = _probe_kind(getattr(preconditioner, "L", matmul), dtype, generator)
    Z = rademacher(n, num_probes, dtype=dtype, device=device, generator=generator)  # (n, p)
    offset = 0.0
    if preconditioner is not None:
        A = _preconditioned(A, preconditioner.inv_sqrt_matmul)
        offset = preconditioner.logdet()
    with torch.no_grad():
        _, T = lanczos(A, Z, num_iters)  # (p, m, m)
        samples = n * lanczos_quadrature(T) + offset  # Ubaru et al. Alg. 1, line 6
    return StochasticEstimate.from_samples(samples)


def _preconditioned(A, inv_sqrt):
    """``V ↦ P^{-1/2} A P^{-1/2} V``."""
    return lambda V: inv_sqrt(A(inv_sqrt(V)))
