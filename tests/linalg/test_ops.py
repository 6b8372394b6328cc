"""safe_cholesky, upcast, as_matmul and rademacher against torch.linalg."""

from __future__ import annotations

import logging
import math
import re
import warnings

import pytest
import torch
from linear_operator.operators import DenseLinearOperator
from tests.linalg._matrices import spd, spd_with_spectrum

from gpscale.errors import NumericalError
from gpscale.linalg.ops import (
    add_jitter,
    as_matmul,
    gram64,
    permute_rows,
    psd_sqrt,
    rademacher,
    safe_cholesky,
    upcast,
)


def test_safe_cholesky_well_conditioned_needs_no_jitter(generator):
    """A well-conditioned SPD matrix factorises exactly, without a warning."""
    A = spd(20, 1e3, generator)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        L = safe_cholesky(A)
    torch.testing.assert_close(L, torch.linalg.cholesky(A), rtol=0, atol=0)


def test_safe_cholesky_singular_adds_named_jitter(generator, caplog):
    """A rank-deficient PSD matrix gets jitter 1e-8 · mean diag (float64). That is within
    rounding of the matrix (≤ QUIET_JITTER first jitters): logged at debug level, no warning."""
    eigenvalues = torch.cat([torch.ones(3), torch.zeros(7)]).double()
    A = spd_with_spectrum(eigenvalues, generator) - 1e-12 * torch.eye(10)
    jitter = 1e-8 * A.diagonal().mean().item()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a warning fails the test
        with caplog.at_level(logging.DEBUG, logger="gpscale.linalg"):
            L = safe_cholesky(A, name="gram")
    assert re.search(f"Cholesky of gram \\(10, 10\\).*of order {_order(jitter)}", caplog.text)
    torch.testing.assert_close(L @ L.mT, add_jitter(A, jitter), rtol=0, atol=1e-12)


def test_safe_cholesky_repeated_in_a_loop_warns_once(generator):
    """The warning text carries the jitter's order of magnitude only, so a factorisation
    repeated every training step is reported once, not once per step."""
    eigenvalues = torch.cat([torch.tensor([-5e-7]), torch.ones(9)]).double()  # jitter 1e-6
    A = spd_with_spectrum(eigenvalues, generator)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")
        for scale in (1.0, 1.01, 1.02):
            safe_cholesky(A * scale, name="gram")
    assert len(caught) == 1 and "needed jitter of order" in str(caught[0].message)


def test_safe_cholesky_grows_jitter_tenfold(generator):
    """A matrix with eigenvalue −5e-7 needs the third jitter, 1e-8 · 10²."""
    eigenvalues = torch.cat([torch.tensor([-5e-7]), torch.ones(5)]).double()
    A = spd_with_spectrum(eigenvalues, generator)
    scale = A.diagonal().mean().item()
    with pytest.warns(RuntimeWarning, match=f"of order {_order(1e-6 * scale)}"):
        L = safe_cholesky(A)
    torch.testing.assert_close(L @ L.mT, add_jitter(A, 1e-6 * scale), rtol=0, atol=1e-12)


def test_safe_cholesky_stops_at_max_jitter(generator):
    """The same matrix with ``max_jitter`` below the jitter it needs (1e-6 · mean diag) raises
    instead of factorising a matrix moved further than the caller can accept."""
    eigenvalues = torch.cat([torch.tensor([-5e-7]), torch.ones(5)]).double()
    A = spd_with_spectrum(eigenvalues, generator)
    scale = A.diagonal().mean().item()
    with pytest.raises(NumericalError, match=r"needs jitter above 5e-07"):
        safe_cholesky(A, max_jitter=5e-7, name="gram")  # the third try, 1e-6 · 0.83, is above
    with pytest.warns(RuntimeWarning):
        L = safe_cholesky(A, max_jitter=2e-6 * scale)
    torch.testing.assert_close(L @ L.mT, add_jitter(A, 1e-6 * scale), rtol=0, atol=1e-12)


def test_safe_cholesky_indefinite_raises_numerical_error(generator):
    """An indefinite matrix fails past the bound; the message names what to change."""
    A = spd_with_spectrum(torch.tensor([-1.0, 1.0, 2.0], dtype=torch.float64), generator)
    with pytest.raises(NumericalError, match=r"K_zz \(3, 3\) \(torch.float64\).*jitter "
                                             r".*after 5 tries. Increase the noise or jitter"):
        safe_cholesky(A, name="K_zz")


def test_safe_cholesky_batch_jitters_only_failing_members(generator, caplog):
    """In a batch, the positive-definite member keeps its exact factor."""
    good = spd(4, 10.0, generator)
    bad = spd_with_spectrum(torch.tensor([0.0, 1.0, 1.0, 1.0], dtype=torch.float64),
                            generator) - 1e-12 * torch.eye(4)
    with caplog.at_level(logging.DEBUG, logger="gpscale.linalg"):
        L = safe_cholesky(torch.stack([good, bad]))
    assert "needed jitter" in caplog.text
    torch.testing.assert_close(L[0], torch.linalg.cholesky(good), rtol=0, atol=0)
    jitter = 1e-8 * bad.diagonal().mean().item()
    torch.testing.assert_close(L[1] @ L[1].mT, add_jitter(bad, jitter), rtol=0, atol=1e-12)


def test_safe_cholesky_float32_starts_at_1e_6(generator, caplog):
    """float32 starts the jitter at 1e-6 · mean diag (quiet: within QUIET_JITTER of it)."""
    A = spd_with_spectrum(torch.tensor([0.0, 1.0, 2.0], dtype=torch.float64), generator)
    A32 = (A - 1e-7 * torch.eye(3)).float()
    jitter = 1e-6 * A32.diagonal().mean().item()
    with caplog.at_level(logging.DEBUG, logger="gpscale.linalg"):
        L = safe_cholesky(A32)
    assert f"of order {_order(jitter)}" in caplog.text
    torch.testing.assert_close(L @ L.mT, add_jitter(A32, jitter), rtol=0, atol=1e-6)


def _order(jitter: float) -> str:
    """The power of ten the warning names for ``jitter``."""
    return f"1e{math.floor(math.log10(jitter)):+03d}"


def test_upcast_is_one_named_conversion():
    """upcast returns float64 and leaves float64 tensors untouched (same object)."""
    a = torch.ones(3, dtype=torch.float32)
    assert upcast(a).dtype == torch.float64
    b = torch.ones(3, dtype=torch.float64)
    assert upcast(b) is b


@pytest.mark.parametrize("wrap", [lambda A: A, DenseLinearOperator, lambda A: A.matmul],
                         ids=["tensor", "linear_operator", "callable"])
def test_as_matmul(wrap, generator):
    """Tensors, LinearOperators and callables all become V ↦ A V."""
    A = spd(5, 10.0, generator)
    V = torch.randn(5, 2, generator=generator)
    torch.testing.assert_close(as_matmul(wrap(A))(V), A @ V)


def test_as_matmul_rejects_other_types():
    """A non-callable, non-tensor operator is a TypeError."""
    with pytest.raises(TypeError, match="LinearOperator or a callable"):
        as_matmul(3)


def test_rademacher_entries_and_reproducibility():
    """Entries are ±1 with mean ≈ 0; the same seed gives the same probes."""
    Z = rademacher(1000, 8, generator=torch.Generator().manual_seed(1))
    assert set(Z.unique().tolist()) == {-1.0, 1.0}
    assert abs(Z.mean().item()) < 0.05  # 8000 draws: 4.5 standard deviations
    torch.testing.assert_close(Z, rademacher(1000, 8, generator=torch.Generator().manual_seed(1)))


@pytest.mark.parametrize("shape", [(7, 3), (5000, 300)])
@pytest.mark.parametrize("weighted", [False, True])
def test_gram64_value_and_gradient(generator, shape, weighted):
    """gram64(Z, w) = ZᵀWZ in float64 from a float32 Z, across several row chunks and the
    upper-triangle column blocks; its backward equals autograd's of the float64 product,
    returned in Z's dtype; gradcheck passes on a small float64 Z."""
    Z = torch.randn(*shape, generator=generator, dtype=torch.float32)
    w = (torch.rand(shape[0], generator=generator) > 0.2).float() if weighted else None
    Z64 = Z.double().requires_grad_()
    expected = (Z64 if w is None else Z64 * w.double()[:, None]).mT @ \
        (Z64 if w is None else Z64 * w.double()[:, None])
    got = gram64(Z.requires_grad_(), w)
    assert got.dtype == torch.float64
    torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-9)
    upstream = torch.randn(shape[1], shape[1], generator=generator, dtype=torch.float64)
    (grad,) = torch.autograd.grad((got * upstream).sum(), Z)
    (expected_grad,) = torch.autograd.grad((expected * upstream).sum(), Z64)
    assert grad.dtype == torch.float32
    torch.testing.assert_close(grad, expected_grad.float(), rtol=1e-5, atol=1e-4)
    small = torch.randn(9, 4, generator=generator, dtype=torch.float64, requires_grad=True)
    weights = None if w is None else torch.tensor([1.0, 0, 1, 1, 0, 1, 1, 1, 0],
                                                  dtype=torch.float64)
    assert torch.autograd.gradcheck(lambda a: gram64(a, weights), (small,))


def test_gram64_refuses_batches():
    """gram64 names the shape it takes."""
    with pytest.raises(ValueError, match=r"\(n, i\) matrix"):
        gram64(torch.zeros(2, 3, 4))


def test_permute_rows_value_and_gradient(generator):
    """permute_rows(t, perm) = t[perm] and its gather backward equals autograd's scatter one,
    with the inverse computed or given; gradcheck passes."""
    t = torch.randn(11, 4, generator=generator, dtype=torch.float64, requires_grad=True)
    perm = torch.randperm(11, generator=generator)
    W = torch.randn(11, 4, generator=generator, dtype=torch.float64)
    torch.testing.assert_close(permute_rows(t, perm), t[perm], rtol=0, atol=0)
    expected = torch.autograd.grad((t[perm] * W).sum(), t)[0]
    for inverse in (None, torch.argsort(perm)):
        got = torch.autograd.grad((permute_rows(t, perm, inverse) * W).sum(), t)[0]
        torch.testing.assert_close(got, expected, rtol=0, atol=0)
    assert torch.autograd.gradcheck(lambda a: permute_rows(a, perm), (t,))


def test_psd_sqrt_is_the_unique_symmetric_root(generator):
    """R = psd_sqrt(A) is symmetric, PSD and R² = A (which determine it), for full-rank,
    rank-deficient and repeated-eigenvalue blocks; and it does not change when the eigensolver's
    eigenvectors flip sign (the root V diag(√λ) it replaces did)."""
    B = torch.randn(4, 3, 3, generator=generator, dtype=torch.float64)
    v = torch.randn(3, 1, generator=generator, dtype=torch.float64)
    A = torch.stack([*(B @ B.mT), v @ v.mT, 2.0 * torch.eye(3, dtype=torch.float64)])
    R = psd_sqrt(A)
    torch.testing.assert_close(R, R.mT, rtol=0, atol=1e-12)
    torch.testing.assert_close(R @ R, A, rtol=1e-10, atol=1e-10)
    assert torch.linalg.eigvalsh(R).min() > -1e-7
    torch.testing.assert_close(R[-1], math.sqrt(2.0) * torch.eye(3, dtype=torch.float64))
    evals, evecs = torch.linalg.eigh(A[0])
    flipped = evecs * torch.tensor([-1.0, 1.0, -1.0], dtype=torch.float64)
    old_style = [V * evals.sqrt() for V in (evecs, flipped)]
    assert (old_style[0] - old_style[1]).abs().max() > 0.1  # the old root depends on the signs
    torch.testing.assert_close((flipped * evals.sqrt()) @ flipped.mT, R[0], rtol=1e-10,
                               atol=1e-12)
