r"""Block-sparse kernel products in Triton: :math:`Z = \Phi S` for CaGP-Opt's actions.

S (n2, i) has one non-zero per row: column ``b(q)`` of row q holds ``s_q``, and the rows come in
block order (:class:`~gpscale.linalg.operators.block_sparse.BlockLayout`: block j covers rows
``starts[j] : starts[j + 1]``). So :math:`Z_{pj} = \sum_{q \in \text{block } j} \Phi_{pq} s_q`.

- **Forward.** A program owns BM rows of ``z1`` and BJ consecutive blocks, and walks over the
  columns of those blocks only. Each Φ entry is computed once. The tile of S is built in
  registers (``s_q`` where ``b(q)`` is the program's block j, else 0), and one ``tl.dot``
  reduces the tile into its BJ columns. A tile costs 2d + 2BJ flops per kernel entry, against
  the dense product's 2d + 2i.
- **Backward**, with :math:`G_{pq} = \bar Z_{p b(q)} s_q` (a gather, no product) and
  :math:`H = G \odot \varphi'(D^2)`:
  - :math:`\bar z_1 = 2(\operatorname{diag}(H1) z_1 - H z_2)` by row tiles;
  - :math:`\bar z_2 = 2(\operatorname{diag}(H^\top 1) z_2 - H^\top z_1)` and
    :math:`\bar s_q = \sum_p \Phi_{pq} \bar Z_{p b(q)}` by column tiles.

Distances, profiles and precision are those of :mod:`gpscale.linalg.triton.stationary`; with
``SYMMETRIC`` (z1 and z2 the same points) a point's squared distance to itself is exactly 0,
as in :func:`~gpscale.linalg.operators.block_sparse.symmetric_kernel_product`.
"""

from __future__ import annotations

import triton
import triton.language as tl

from gpscale.linalg.triton.stationary import (
    _hz_step,
    _profile,
    _rows_tile,
    _sqdist,
    _store_input_grad,
)

__all__ = ["forward", "backward_rows", "backward_cols"]


@triton.jit
def forward(Z1, Z2, S, BIDS, STARTS, OUT, n1, n2, i, s_z1n, s_z2n, s_on,
            PROFILE: tl.constexpr, DDOT: tl.constexpr, EXACT: tl.constexpr,
            DPAD: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BJ: tl.constexpr,
            SYMMETRIC: tl.constexpr, PRECISION: tl.constexpr):
    """OUT[rows, j0 : j0 + BJ] = Φ(rows, columns of those blocks) S for one program."""
    pid_m, pid_j = tl.program_id(0), tl.program_id(1)
    rm, rd, z1, sq1 = _rows_tile(Z1, pid_m, n1, s_z1n, BM, DPAD, DDOT)
    rj = pid_j * BJ + tl.arange(0, BJ)
    first = tl.load(STARTS + pid_j * BJ)
    last = tl.load(STARTS + tl.minimum(pid_j * BJ + BJ, i))
    acc = tl.zeros((BM, BJ), dtype=OUT.dtype.element_ty)
    for start in range(first, last, BN):
        rn = start + tl.arange(0, BN)
        inside = rn < last
        D2, _ = _sqdist(z1, sq1, Z2, rn, n2, s_z2n, rd, DDOT, EXACT, Z1, rm, n1, s_z1n,
                        PRECISION)
        if SYMMETRIC:  # a point's distance to itself is exactly 0, not the expansion's rounding
            D2 = tl.where(rm[:, None] == rn[None, :], 0.0, D2)
        phi, _ = _profile(D2, PROFILE)
        bid = tl.load(BIDS + rn, mask=inside, other=-1)
        s = tl.load(S + rn, mask=inside, other=0.0)
        tile = tl.where(bid[:, None] == rj[None, :], s[:, None], 0.0)  # (BN, BJ) of S
        acc += tl.dot(phi.to(tile.dtype), tile, input_precision=PRECISION)
    tl.store(OUT + rm[:, None] * s_on + rj[None, :], acc,
             mask=(rm[:, None] < n1) & (rj[None, :] < i))


@triton.jit
def backward_rows(Z1, Z2, S, BIDS, GOUT, GZ1, n1, n2, s_z1n, s_z2n, s_gn, s_zn,
                  PROFILE: tl.constexpr, DDOT: tl.constexpr, EXACT: tl.constexpr,
                  DPAD: tl.constexpr, DFULL: tl.constexpr, BM: tl.constexpr,
                  BN: tl.constexpr, SYMMETRIC: tl.constexpr, PRECISION: tl.constexpr):
    """GZ1[rows] = 2 (diag(H 1) z1 − H z2) for one row tile, over every column."""
    pid_m = tl.program_id(0)
    rm, rd, z1, sq1 = _rows_tile(Z1, pid_m, n1, s_z1n, BM, DPAD, DDOT)
    rf = tl.arange(0, DFULL)
    dtype = GZ1.dtype.element_ty
    rowsum = tl.zeros((BM,), dtype=dtype)
    hz = tl.zeros((BM, DFULL), dtype=dtype)
    for start in range(0, n2, BN):
        rn = start + tl.arange(0, BN)
        D2, _ = _sqdist(z1, sq1, Z2, rn, n2, s_z2n, rd, DDOT, EXACT, Z1, rm, n1, s_z1n,
                        PRECISION)
        if SYMMETRIC:
            D2 = tl.where(rm[:, None] == rn[None, :], 0.0, D2)
        _, dphi = _profile(D2, PROFILE)
        bid = tl.load(BIDS + rn, mask=rn < n2, other=0)
        s = tl.load(S + rn, mask=rn < n2, other=0.0)
        g = tl.load(GOUT + rm[:, None] * s_gn + bid[None, :],
                    mask=(rm[:, None] < n1) & (rn[None, :] < n2), other=0.0)
        H = g * s[None, :] * dphi
        rowsum += tl.sum(H, axis=1)
        hz += _hz_step(H, Z2, rn, n2, s_z2n, rf, DDOT + EXACT, PRECISION)
    _store_input_grad(GZ1, Z1, rm, n1, s_z1n, s_zn, rf, rowsum, hz, DDOT + EXACT)


@triton.jit
def backward_cols(Z1, Z2, S, BIDS, GOUT, GZ2, GS, n1, n2, s_z1n, s_z2n, s_gn, s_zn,
                  PROFILE: tl.constexpr, DDOT: tl.constexpr, EXACT: tl.constexpr,
                  DPAD: tl.constexpr, DFULL: tl.constexpr, BM: tl.constexpr,
                  BN: tl.constexpr, NEED_Z: tl.constexpr, NEED_S: tl.constexpr,
                  SYMMETRIC: tl.constexpr, PRECISION: tl.constexpr):
    """For one column tile: GZ2 = 2 (diag(Hᵀ1) z2 − Hᵀ z1) (NEED_Z) and GS_q = Σ_p Φ_pq
    Z̄[p, b(q)] (NEED_S); the column tile plays the rows' part."""
    pid_n = tl.program_id(0)
    rn, rd, z2, sq2 = _rows_tile(Z2, pid_n, n2, s_z2n, BN, DPAD, DDOT)
    rf = tl.arange(0, DFULL)
    dtype = GZ2.dtype.element_ty
    bid = tl.load(BIDS + rn, mask=rn < n2, other=0)
    s = tl.load(S + rn, mask=rn < n2, other=0.0)
    colsum = tl.zeros((BN,), dtype=dtype)
    hz = tl.zeros((BN, DFULL), dtype=dtype)
    gs = tl.zeros((BN,), dtype=dtype)
    for start in range(0, n1, BM):
        rm = start + tl.arange(0, BM)
        D2, _ = _sqdist(z2, sq2, Z1, rm, n1, s_z1n, rd, DDOT, EXACT, Z2, rn, n2, s_z2n,
                        PRECISION)  # (BN, BM)
        if SYMMETRIC:
            D2 = tl.where(rn[:, None] == rm[None, :], 0.0, D2)
        phi, dphi = _profile(D2, PROFILE)
        gt = tl.load(GOUT + rm[None, :] * s_gn + bid[:, None],
                     mask=(rn[:, None] < n2) & (rm[None, :] < n1), other=0.0)  # Z̄[p, b(q)]ᵀ
        if NEED_S:
            gs += tl.sum(phi * gt, axis=1)
        if NEED_Z:
            Ht = gt * s[:, None] * dphi
            colsum += tl.sum(Ht, axis=1)
            hz += _hz_step(Ht, Z1, rm, n1, s_z1n, rf, DDOT + EXACT, PRECISION)
    if NEED_Z:
        _store_input_grad(GZ2, Z2, rn, n2, s_z2n, s_zn, rf, colsum, hz, DDOT + EXACT)
    if NEED_S:
        tl.store(GS + rn, gs, mask=rn < n2)
