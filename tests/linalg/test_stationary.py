"""Dense stationary kernel matrices in one autograd node (gpscale.linalg.stationary) against the
profiles' formulas, with gradcheck of the hand-written backward."""

from __future__ import annotations

import pytest
import torch
from tests.linalg._profiles import DENSE

from gpscale.linalg import stationary
from gpscale.linalg.stationary import stationary_matrix


@pytest.fixture(params=[2**22, 10], ids=["one-block", "blocks-of-2-rows"])
def row_blocks(request, monkeypatch):
    """Whole matrices, and row blocks of 2 rows of n2 = 5 (the last block ragged)."""
    monkeypatch.setattr(stationary, "ROW_BLOCK_ENTRIES", request.param)


def _inputs(generator, B=2, n1=6, n2=5, d=3):
    return (torch.randn(B, n1, d, generator=generator, dtype=torch.float64),
            torch.randn(B, n2, d, generator=generator, dtype=torch.float64),
            torch.rand(B, generator=generator, dtype=torch.float64) + 0.5)


@pytest.mark.parametrize("exact", [0, 1])
@pytest.mark.parametrize("profile", list(DENSE))
def test_values_and_gradcheck(profile, exact, generator, row_blocks):
    z1, z2, s = _inputs(generator)
    expected = s[:, None, None] * DENSE[profile](torch.cdist(z1, z2))
    K = stationary_matrix(z1, z2, s, profile, exact=exact)
    torch.testing.assert_close(K, expected, rtol=1e-12, atol=1e-12)
    inputs = tuple(t.requires_grad_() for t in (z1, z2, s))
    assert torch.autograd.gradcheck(
        lambda a, b, c: stationary_matrix(a, b, c, profile, exact=exact), inputs)


@pytest.mark.parametrize("profile", list(DENSE))
def test_symmetric_diagonal_is_the_outputscale_exactly(profile, generator, row_blocks):
    z, _, s = _inputs(generator)
    z = z * 30  # large coordinates: the expansion alone would leave rounding on the diagonal
    K = stationary_matrix(z, z, s, profile, symmetric=True)
    assert torch.equal(K.diagonal(dim1=-2, dim2=-1), s[:, None].expand(2, 6))
    if stationary.ROW_BLOCK_ENTRIES < 30:  # blocks of 1 row of n = 6: the same matrix
        expected = s[:, None, None] * DENSE[profile](torch.cdist(z, z))
        torch.testing.assert_close(K, expected, rtol=1e-10, atol=1e-10)
