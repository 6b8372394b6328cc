"""Softmax likelihood: the explicit pseudo-inverse of Lemma A.7 (notes §7.4, §15.12)."""

from __future__ import annotations

import torch

from gpscale.likelihoods import Softmax
from gpscale.testing import dense_W, dense_W_inv

C, N = 4, 5


def _f(generator):
    return 2 * torch.randn(C, N, generator=generator, dtype=torch.float64)


def test_pseudo_inverse_equals_pinv(generator):
    """Lemma A.7: the O(NC) W† product equals torch.linalg.pinv of the dense W."""
    f = _f(generator)
    lik = Softmax(C)
    torch.testing.assert_close(dense_W_inv(lik, f), torch.linalg.pinv(dense_W(lik, f)),
                               rtol=1e-9, atol=1e-10)


def test_W_times_pseudo_inverse_is_centring(generator):
    """W W† = W† W = blockdiag_n(I − 11ᵀ/C): centring over the classes of each point."""
    f = _f(generator)
    lik = Softmax(C)
    V = torch.randn(C, N, 3, generator=generator)
    centred = V - V.mean(0, keepdim=True)
    torch.testing.assert_close(lik.W_matmul(f, lik.W_inv_matmul(f, V)), centred, rtol=1e-11,
                               atol=1e-11)
    torch.testing.assert_close(lik.W_inv_matmul(f, lik.W_matmul(f, V)), centred, rtol=1e-11,
                               atol=1e-11)


def test_pseudo_inverse_annihilates_class_sums(generator):
    """W† 1_C = 0 block-wise (each block's null vector), and W has rank N(C − 1)."""
    f = _f(generator)
    lik = Softmax(C)
    ones = torch.ones(C, N)
    torch.testing.assert_close(lik.W_inv_matmul(f, ones), torch.zeros(C, N), rtol=0, atol=1e-12)
    assert int(torch.linalg.matrix_rank(dense_W(lik, f))) == N * (C - 1)


def test_W_is_block_diagonal_in_cn_ordering(generator):
    """W is block-diagonal with C×C blocks diag(π_n) − π_nπ_nᵀ after NC → CN reordering."""
    f = _f(generator)
    W = dense_W(Softmax(C), f)
    perm = torch.arange(C * N).reshape(C, N).T.reshape(-1)  # CN index → NC index
    W_cn = W[perm][:, perm]
    pi = torch.softmax(f, 0)
    blocks = [torch.diag(pi[:, n]) - torch.outer(pi[:, n], pi[:, n]) for n in range(N)]
    torch.testing.assert_close(W_cn, torch.block_diag(*blocks), rtol=1e-13, atol=1e-15)

