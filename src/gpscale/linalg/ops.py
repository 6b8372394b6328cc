"""Small structure-aware linear-algebra functions: matmul closures, upcasting, safe Cholesky.

``as_matmul`` dispatches on the operator's type (``functools.singledispatch``): a dense tensor, a
``LinearOperator`` or any callable ``V ↦ A V`` all become a callable. ``upcast`` is the one place
where small dense factorisations move to float64 (STYLE §4). ``safe_cholesky`` retries with growing
jitter, warns when jitter was needed and raises :class:`gpscale.errors.NumericalError` past the
bound.
"""

from __future__ import annotations

import functools
import logging
import math
import warnings
from collections.abc import Callable

import torch
from linear_operator.operators import LinearOperator

from gpscale.errors import NumericalError
from gpscale.typing import Float, Tensor

__all__ = [
    "JITTER_START",
    "Matmul",
    "add_jitter",
    "as_matmul",
    "gram64",
    "GRAM_ROWS",
    "GRAM_MIN_SPLIT",
    "permute_rows",
    "psd_sqrt",
    "rademacher",
    "cholesky_in_place",
    "safe_cholesky",
    "upcast",
]

Matmul = Callable[[Tensor], Tensor]

JITTER_START = {torch.float64: 1e-8, torch.float32: 1e-6, torch.float16: 1e-3,
                torch.bfloat16: 1e-2}
"""First jitter of :func:`safe_cholesky`, relative to the mean diagonal, per dtype."""

QUIET_JITTER = 10.0
"""A jitter of at most this many times :data:`JITTER_START` (relative to the mean diagonal:
1e-7 in float64, 1e-5 in float32) is the matrix's own rounding made explicit and changes no
result a user can see: :func:`safe_cholesky` logs it at debug level (logger
``gpscale.linalg``). A larger one is a ``RuntimeWarning``: warning about every small jitter
would bury the warnings that matter under routine ones (SoftKI adds such jitters at every
step)."""

log = logging.getLogger("gpscale.linalg")


@functools.singledispatch
def as_matmul(A) -> Matmul:
    """A callable ``V ↦ A V`` for ``A`` a tensor (n, n), a ``LinearOperator`` or a callable."""
    if callable(A):
        return A
    raise TypeError(f"expected a tensor, a LinearOperator or a callable V -> A V; got {type(A)}")


@as_matmul.register
def _(A: Tensor) -> Matmul:
    return A.matmul


@as_matmul.register
def _(A: LinearOperator) -> Matmul:
    return A.matmul


def rademacher(n: int, num_probes: int, *, dtype: torch.dtype | None = None,
               device: torch.device | str | None = None,
               generator: torch.Generator | None = None) -> Tensor:
    """(n, num_probes) independent ±1 entries with probability ½ each."""
    bits = torch.randint(0, 2, (n, num_probes), generator=generator, device=device)
    return (2 * bits - 1).to(dtype or torch.get_default_dtype())


def upcast(A: Tensor, dtype: torch.dtype = torch.float64) -> Tensor:
    """``A`` in ``dtype`` (float64 by default) for a small dense factorisation; no-op when equal.

    Args:
        A: any tensor.
        dtype: the factorisation dtype.
    """
    return A if A.dtype == dtype else A.to(dtype)


GRAM_ROWS = 2048
"""Rows per chunk of :func:`gram64`'s forward (each chunk is upcast to float64 on its own)."""
GRAM_MIN_SPLIT = 256
"""From this many columns :func:`gram64` forms only the upper triangle, in four column blocks."""


def _float64_rows(Z: Tensor, weights: Tensor | None):
    """(start, rows) over ``Z`` in chunks of :data:`GRAM_ROWS`, each chunk upcast (and
    weighted) into one reused float64 buffer: fresh buffers per chunk cost more in page faults
    than the products."""
    buffer = Z.new_empty((min(GRAM_ROWS, Z.shape[0]), Z.shape[1]), dtype=torch.float64)
    for start in range(0, Z.shape[0], GRAM_ROWS):
        rows = buffer[:min(GRAM_ROWS, Z.shape[0] - start)]
        rows.copy_(Z[start:start + rows.shape[0]])
        if weights is not None:
            rows.mul_(weights[start:start + rows.shape[0], None])
        yield start, rows


class _Gram64(torch.autograd.Function):
    @staticmethod
    def forward(ctx, Z: Tensor, weights: Tensor | None) -> Tensor:
        ctx.save_for_backward(Z, weights)
        i = Z.shape[1]
        width = -(-i // 4) if i >= GRAM_MIN_SPLIT else i
        out = Z.new_zeros((i, i), dtype=torch.float64)
        for _, rows in _float64_rows(Z, weights):
            for a in range(0, i, width):
                out[a:a + width, a:].addmm_(rows[:, a:a + width].mT, rows[:, a:])
        return out.triu() + out.triu(1).mT

    @staticmethod
    def backward(ctx, grad: Tensor):
        Z, weights = ctx.saved_tensors
        both = grad + grad.mT
        out = torch.empty_like(Z)
        product = both.new_empty((min(GRAM_ROWS, Z.shape[0]), Z.shape[1]))
        for start, rows in _float64_rows(Z, weights):  # W Z (Ḡ + Ḡᵀ), as W² = W for 0/1
            chunk = product[:rows.shape[0]]
            torch.mm(rows, both, out=chunk)
            out[start:start + rows.shape[0]] = chunk
        return out, None


def gram64(Z: Float[Tensor, "n i"], weights: Float[Tensor, " n"] | None = None
           ) -> Float[Tensor, "i i"]:
    """ZᵀWZ in float64 (W = diag(``weights``), 0/1 to leave rows out; None: the identity) from
    ``Z`` in any dtype, without a float64 copy of ``Z``: row chunks of :data:`GRAM_ROWS` are
    upcast one at a time and, from :data:`GRAM_MIN_SPLIT` columns, only the upper triangle is
    formed (in four column blocks, 5/8 of the products). The backward, Z̄ = W Z (Ḡ + Ḡᵀ), is
    float64 by row chunks too and returned in ``Z``'s dtype: Ḡ is typically G⁻¹-like (in
    tr(G⁻¹ZᵀZ)), with large entries of both signs whose product with Z cancels, so the
    product in float32 loses most digits of an ill-conditioned gradient."""
    if Z.dim() != 2:
        raise ValueError(f"gram64 takes an (n, i) matrix; got shape {tuple(Z.shape)}")
    return _Gram64.apply(Z, weights)


class _PermuteRows(torch.autograd.Function):
    @staticmethod
    def forward(ctx, t: Tensor, perm: Tensor, inverse: Tensor) -> Tensor:
        ctx.save_for_backward(inverse)
        return t.index_select(0, perm)

    @staticmethod
    def backward(ctx, grad: Tensor):
        (inverse,) = ctx.saved_tensors
        return grad.index_select(0, inverse), None, None


def permute_rows(t: Float[Tensor, "n ..."], perm: Tensor,
                 inverse: Tensor | None = None) -> Float[Tensor, "n ..."]:
    """``t[perm]`` for a permutation ``perm`` of ``t``'s rows, with the inverse permutation's
    gather as backward (``inverse``: ``argsort(perm)``, computed when not given).

    Autograd's backward of ``t[perm]`` scatters with accumulation into a zero tensor, which
    cannot know that no two rows meet: for a wide ``t`` (CaGP's n × i kernel products) it costs
    several times the gather.
    """
    if inverse is None:
        inverse = torch.argsort(perm)
    return _PermuteRows.apply(t, perm, inverse)


def psd_sqrt(A: Float[Tensor, "*b n n"]) -> Float[Tensor, "*b n n"]:
    """The symmetric square root V diag(√λ₊) Vᵀ of symmetric positive semi-definite blocks
    (negative eigenvalues from rounding count as 0), so that R Rᵀ = R² = A.

    Unlike V diag(√λ₊) it is unique: it does not depend on the signs (or, for a repeated
    eigenvalue, the basis) the eigensolver picks, which differ between devices and LAPACK
    builds. Monte Carlo draws ``mean + R ε`` with fixed ε are then the same everywhere.
    """
    evals, evecs = torch.linalg.eigh(A)
    return (evecs * evals.clamp_min(0).sqrt()[..., None, :]) @ evecs.mT


def add_jitter(A: Tensor, jitter: Tensor | float) -> Tensor:
    """``A + jitter · I`` for square (..., n, n) ``A``; ``jitter`` a scalar or (...,)."""
    jitter = torch.as_tensor(jitter, dtype=A.dtype, device=A.device)
    return A + jitter[..., None, None] * torch.eye(A.shape[-1], dtype=A.dtype, device=A.device)


def _start_jitter(A: Tensor, jitter: float | None) -> Tensor:
    if jitter is not None:
        return torch.full(A.shape[:-2], float(jitter), dtype=A.dtype, device=A.device)
    scale = A.diagonal(dim1=-2, dim2=-1).abs().mean(-1)  # (...,)
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    return JITTER_START.get(A.dtype, 1e-6) * scale


def safe_cholesky(A: Float[Tensor, "*b n n"], *, jitter: float | None = None, max_tries: int = 5,
                  name: str = "matrix", max_jitter: float | None = None
                  ) -> Float[Tensor, "*b n n"]:
    """Lower Cholesky factor of SPD ``A``, adding growing jitter when the plain factorisation fails.

    Tries ``cholesky(A)``; on failure ``cholesky(A + j I)`` for ``j = j0 · 10^t``, t = 0 …
    ``max_tries − 1``, where ``j0 = jitter`` or :data:`JITTER_START` [dtype] · mean |diag A|.
    Only the failing members of a batch get jitter.

    Args:
        A: symmetric positive (semi-)definite (..., n, n).
        jitter: absolute first jitter; default relative to the mean diagonal (see above).
        max_tries: number of jittered attempts (≥ 0).
        name: what ``A`` is, for the warning and the error message.
        max_jitter: the most jitter that leaves the factor meaningful (e.g. a fraction of the
            noise term that makes ``A`` positive definite); a larger one is not tried.

    Returns:
        L (..., n, n), lower triangular with ``L Lᵀ = A + j I`` (j = 0 when no jitter was needed).

    Warns:
        RuntimeWarning: naming the jitter that was added, where it is larger than
        :data:`QUIET_JITTER` first jitters (smaller ones are logged at debug level).

    Raises:
        NumericalError: naming ``name``, the shape, dtype and last jitter, past ``max_tries``
            or ``max_jitter``.
    """
    L, info = torch.linalg.cholesky_ex(A)
    if not bool((info > 0).any()):
        return L
    failed = info > 0  # (...,)
    jitter0 = _start_jitter(A, jitter)
    last = jitter0
    for attempt in range(max_tries):
        last = jitter0 * 10.0**attempt
        if max_jitter is not None and bool((last[failed] > max_jitter).any()):
            raise NumericalError(
                f"Cholesky of {name} {tuple(A.shape)} ({A.dtype}) failed: it needs jitter above "
                f"{max_jitter:.3g}, the most that leaves it meaningful")
        L_try, info = torch.linalg.cholesky_ex(add_jitter(A, torch.where(failed, last, 0.0)))
        if not bool((info > 0).any()):
            # The jitter is given to its order of magnitude so that a factorisation repeated
            # every step warns once (Python shows a warning text once per call site).
            message = (f"Cholesky of {name} {tuple(A.shape)} ({A.dtype}) needed jitter of "
                       f"order {_magnitude(last[failed])} on the diagonal")
            if _quiet(A, last, failed):
                log.debug("%s (within rounding of the matrix: not a warning)", message)
            else:
                warnings.warn(message, RuntimeWarning, stacklevel=2)
            return L_try
    raise NumericalError(
        f"Cholesky of {name} {tuple(A.shape)} ({A.dtype}) failed: not positive definite even "
        f"with jitter {_describe(last[failed])} after {max_tries} tries. Increase the noise or "
        f"jitter (jitter=..., max_tries=...), use float64, or check {name} for NaN/inf or "
        f"duplicated inputs.")


def cholesky_in_place(build: Callable[[], Tensor], *, jitter: float, max_tries: int,
                      name: str = "matrix") -> Tensor:
    """The lower Cholesky factor of the SPD matrix ``build()`` returns (n, n), written over it:
    no second n × n array. A failed factorisation has overwritten the matrix, so each retry
    calls ``build()`` again and adds ``jitter · 10^t`` (t = 0 … ``max_tries − 1``) to the
    diagonal; a jitter is logged or warned as by :func:`safe_cholesky`. Only the lower
    triangle of the result is meaningful.

    Raises:
        NumericalError: past ``max_tries``, naming ``name``, the shape, dtype and last jitter.
    """
    A = build()
    info = torch.empty((), dtype=torch.int32, device=A.device)
    torch.linalg.cholesky_ex(A, out=(A, info))
    added = 0.0
    for attempt in range(max_tries):
        if int(info) == 0:
            break
        added = jitter * 10.0**attempt
        A = build()
        diagonal = A.diagonal()
        scale = diagonal.abs().mean().reshape(1)
        diagonal.add_(added)
        torch.linalg.cholesky_ex(A, out=(A, info))
        if int(info) == 0:
            message = (f"Cholesky of {name} {tuple(A.shape)} ({A.dtype}) needed jitter of "
                       f"order {_magnitude(scale.new_tensor([added]))} on the diagonal")
            if _quiet_relative(added / max(scale.item(), 1e-300), A.dtype):
                log.debug("%s (within rounding of the matrix: not a warning)", message)
            else:
                warnings.warn(message, RuntimeWarning, stacklevel=2)
    if int(info) != 0:
        raise NumericalError(
            f"Cholesky of {name} {tuple(A.shape)} ({A.dtype}) failed: not positive definite "
            f"even with jitter {added:.3g} after {max_tries} tries. Increase the noise or the "
            "jitter, or use float64.")
    return A


def _quiet_relative(relative: float, dtype: torch.dtype) -> bool:
    return relative <= QUIET_JITTER * JITTER_START.get(dtype, 1e-6)


def _quiet(A: Tensor, jitter: Tensor, failed: Tensor) -> bool:
    """Whether ``jitter`` is within :data:`QUIET_JITTER` of the dtype's first jitter, relative to
    the mean diagonal of the failed members of ``A``."""
    scale = A.diagonal(dim1=-2, dim2=-1).abs().mean(-1)
    relative = (jitter / torch.where(scale > 0, scale, torch.ones_like(scale)))[failed]
    return _quiet_relative(relative.max().item(), A.dtype)


def _magnitude(values: Tensor) -> str:
    """``1e-08``-style power of ten of the largest value."""
    return f"1e{math.floor(math.log10(values.max().item())):+03d}"


def _describe(values: Tensor) -> str:
    if values.numel() == 1:
        return f"{values.item():.3g}"
    return f"up to {values.max().item():.3g}"
