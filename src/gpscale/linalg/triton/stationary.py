r"""Fused stationary kernel products in Triton: :math:`Y = \Phi V`, :math:`\Phi_{ij} =
\varphi(\lVert z_{1i} - z_{2j}\rVert^2)`, with K never written to memory.

The kernels follow FlashAttention's plan. A program owns a tile of rows of ``z1`` (and a slice of
the right-hand sides' columns) and walks over tiles of ``z2``. It forms the tile's inner products
with one ``tl.dot``, then the squared distances, the profile in registers, and a second
``tl.dot`` with the tile of ``V`` into an accumulator of the output dtype. Profiles, clamps and the
exact-difference dimensions are those of :mod:`gpscale.linalg.fused` (the same numbers up to
rounding):

- :math:`D^2` comes from the norm expansion over the first ``d − exact`` dimensions, plus
  squared differences for the last ``exact`` (large-coordinate dimensions, see
  :func:`~gpscale.linalg.fused.exact_dims`), clamped to [0, FAR_SQDIST];
- :math:`\varphi` is RBF or Matérn ½, 3/2, 5/2 (:data:`PROFILE_CODES`).

Backward, with :math:`G = \bar Y V^\top` and :math:`H = G \odot \varphi'(D^2)`:

- :math:`\bar z_1 = 2(\operatorname{diag}(H1) z_1 - H z_2)` by row tiles;
- :math:`\bar z_2 = 2(\operatorname{diag}(H^\top 1) z_2 - H^\top z_1)` and
  :math:`\bar V = \Phi^\top \bar Y` by column tiles.

Both recompute :math:`\Phi`, so the backward costs about twice the forward.

Precision. The inner products and, in float32, the product with V use IEEE fp32 FMAs by
default (:data:`PRODUCT_PRECISION`). ``"tf32x3"``, the split-precision tensor-core scheme that
keeps float32 accuracy, is the other choice. Plain TF32 (error ~1e-3) is never used. Float64
inputs run in float64 throughout.

The same kernels run on the CPU under Triton's interpreter (``TRITON_INTERPRET=1``), which is
how ``make test`` checks them without a GPU.
"""

from __future__ import annotations

import triton
import triton.language as tl

from gpscale.linalg.reach import FAR_SQDIST

__all__ = ["PROFILE_CODES", "PRODUCT_PRECISION", "backward_cols", "backward_rows",
           "backward_symmetric", "forward"]

PROFILE_CODES = {"rbf": 0, "matern12": 1, "matern32": 2, "matern52": 3}
"""Profile name → the code the kernels branch on (at compile time)."""

PRODUCT_PRECISION = "ieee"
"""``tl.dot`` precision of float32 products: ``"ieee"`` (fp32 FMAs) or ``"tf32x3"``; two of
them, ``"ieee,tf32x3"``, set the distances' inner products and the products with V apart."""

DISTANCE = "expand"
"""How D² is formed: ``"expand"`` (the norm expansion, exact dimensions as differences) or
``"diff"`` (every dimension as a difference, for inputs of at most 16 dimensions)."""

# Globals a kernel reads must be constexpr (Triton refuses plain Python globals).
_SQRT3, _SQRT5 = tl.constexpr(1.7320508075688772), tl.constexpr(2.23606797749979)
_FAR = tl.constexpr(FAR_SQDIST)


@triton.jit
def _profile(D2, PROFILE: tl.constexpr):
    """φ(D²) and φ'(D²) (the derivative in D²; Matérn-½'s taken as 0 at D² = 0)."""
    if PROFILE == 0:
        phi = tl.exp(-0.5 * D2)
        dphi = -0.5 * phi
    elif PROFILE == 1:
        r = tl.sqrt(D2)
        phi = tl.exp(-r)
        dphi = tl.where(r > 0, -0.5 * phi / tl.where(r > 0, r, 1.0), 0.0)
    elif PROFILE == 2:
        r = _SQRT3 * tl.sqrt(D2)
        e = tl.exp(-r)
        phi = (1.0 + r) * e
        dphi = -1.5 * e
    else:
        r = _SQRT5 * tl.sqrt(D2)
        e = tl.exp(-r)
        phi = (1.0 + r + r * r / 3.0) * e
        dphi = (-5.0 / 6.0) * (1.0 + r) * e
    return phi, dphi


@triton.jit
def _sqdist(z1, sq1, Z2, rn, n2, s_z2n, rd, DDOT: tl.constexpr, EXACT: tl.constexpr,
            Z1, rm, n1, s_z1n, PRECISION: tl.constexpr):
    """D² (BM, BN) between the loaded row tile ``z1`` (norms ``sq1``) and the columns ``rn``:
    the norm expansion over the first DDOT dimensions, differences over the EXACT last ones.
    Returns D² and the column tile (BN, DPAD) with its norms' dimensions only."""
    z2 = tl.load(Z2 + rn[:, None] * s_z2n + rd[None, :],
                 mask=(rn[:, None] < n2) & (rd[None, :] < DDOT), other=0.0)
    if DDOT > 0:
        sq2 = tl.sum(z2 * z2, axis=1)
        P = tl.dot(z1, tl.trans(z2), input_precision=PRECISION)
        D2 = sq1[:, None] + sq2[None, :] - 2.0 * P
    else:  # every dimension as a difference: no inner products at all
        D2 = tl.zeros((rm.shape[0], rn.shape[0]), dtype=z1.dtype)
    for j in tl.static_range(EXACT):
        a = tl.load(Z1 + rm * s_z1n + DDOT + j, mask=rm < n1, other=0.0)
        c = tl.load(Z2 + rn * s_z2n + DDOT + j, mask=rn < n2, other=0.0)
        diff = a[:, None] - c[None, :]
        D2 += diff * diff
    return tl.minimum(tl.maximum(D2, 0.0), _FAR), z2


@triton.jit
def _kahan(total, carry, part):
    """Compensated ``total + part`` (Kahan): the new total and carry. Chunk sums enter the
    accumulators this way, so that float32 sums over 10⁵ columns keep float32 accuracy (a plain
    running sum loses ~√(n) ulps: 1.7·10⁻⁵ at n = 200,000 on an H200)."""
    y = part - carry
    t = total + y
    return t, (t - total) - y


@triton.jit
def _rows_tile(Z1, pid_m, n1, s_z1n, BM: tl.constexpr, DPAD: tl.constexpr,
               DDOT: tl.constexpr):
    rm = pid_m * BM + tl.arange(0, BM)
    rd = tl.arange(0, DPAD)
    z1 = tl.load(Z1 + rm[:, None] * s_z1n + rd[None, :],
                 mask=(rm[:, None] < n1) & (rd[None, :] < DDOT), other=0.0)
    return rm, rd, z1, tl.sum(z1 * z1, axis=1)


@triton.jit
def forward(Z1, Z2, V, OUT, n1, n2, k, s_z1b, s_z1n, s_z2b, s_z2n, s_vb, s_vn, s_ob, s_on,
            PROFILE: tl.constexpr, DDOT: tl.constexpr, EXACT: tl.constexpr,
            DPAD: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
            CHUNK: tl.constexpr, PREC_D: tl.constexpr, PREC_V: tl.constexpr,
            SYMMETRIC: tl.constexpr):
    """OUT[b, rows, cols] = Φ(rows, :) V[:, cols] for one (row tile, column slice, batch):
    CHUNK columns at a time into a partial sum, the partial sums compensated (:func:`_kahan`).
    SYMMETRIC (z2 is z1): D² = 0 exactly on the diagonal, where the norm expansion leaves
    rounding that Matérn-½ would turn into √ε."""
    pid_m, pid_k, b = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    Z1, Z2, V, OUT = Z1 + b * s_z1b, Z2 + b * s_z2b, V + b * s_vb, OUT + b * s_ob
    rm, rd, z1, sq1 = _rows_tile(Z1, pid_m, n1, s_z1n, BM, DPAD, DDOT)
    rk = pid_k * BK + tl.arange(0, BK)
    acc = tl.zeros((BM, BK), dtype=OUT.dtype.element_ty)
    carry = tl.zeros((BM, BK), dtype=OUT.dtype.element_ty)
    for c0 in range(0, n2, CHUNK):
        part = tl.zeros((BM, BK), dtype=OUT.dtype.element_ty)
        for start in range(c0, tl.minimum(c0 + CHUNK, n2), BN):
            rn = start + tl.arange(0, BN)
            D2, _ = _sqdist(z1, sq1, Z2, rn, n2, s_z2n, rd, DDOT, EXACT, Z1, rm, n1, s_z1n,
                            PREC_D)
            if SYMMETRIC:
                D2 = tl.where(rm[:, None] == rn[None, :], 0.0, D2)
            phi, _ = _profile(D2, PROFILE)
            v = tl.load(V + rn[:, None] * s_vn + rk[None, :],
                        mask=(rn[:, None] < n2) & (rk[None, :] < k), other=0.0)
            part = tl.dot(phi.to(v.dtype), v, part, input_precision=PREC_V)
        acc, carry = _kahan(acc, carry, part)
    tl.store(OUT + rm[:, None] * s_on + rk[None, :], acc,
             mask=(rm[:, None] < n1) & (rk[None, :] < k))


@triton.jit
def _hz_step(H, Z2, rn, n2, s_z2n, rf, DIM: tl.constexpr, PRECISION: tl.constexpr):
    """H (BM, BN) times the tile of all DIM input columns of Z2's rows ``rn``."""
    z2 = tl.load(Z2 + rn[:, None] * s_z2n + rf[None, :],
                 mask=(rn[:, None] < n2) & (rf[None, :] < DIM), other=0.0)
    return tl.dot(H.to(z2.dtype), z2, input_precision=PRECISION)


@triton.jit
def _store_input_grad(GZ, Z, rm, n1, s_zn_in, s_zn_out, rf, rowsum, hz, DIM: tl.constexpr):
    """GZ[rm] = 2 (diag(rowsum) Z[rm] − hz) over the DIM input columns."""
    z = tl.load(Z + rm[:, None] * s_zn_in + rf[None, :],
                mask=(rm[:, None] < n1) & (rf[None, :] < DIM), other=0.0)
    tl.store(GZ + rm[:, None] * s_zn_out + rf[None, :], 2.0 * (rowsum[:, None] * z - hz),
             mask=(rm[:, None] < n1) & (rf[None, :] < DIM))


@triton.jit
def _input_grad_sums(BM: tl.constexpr, DFULL: tl.constexpr, dtype: tl.constexpr):
    """Zeroed row sums (BM,) and H z (BM, DFULL) of an input gradient, each with its carry."""
    return (tl.zeros((BM,), dtype=dtype), tl.zeros((BM,), dtype=dtype),
            tl.zeros((BM, DFULL), dtype=dtype), tl.zeros((BM, DFULL), dtype=dtype))


@triton.jit
def _grad_v(GOUT, V, rm, rn, n1, n2, k, s_gn, s_vn, BM: tl.constexpr, BN: tl.constexpr,
            BK: tl.constexpr, PRECISION: tl.constexpr):
    """G = Ȳ[rm] V[rn]ᵀ (BM, BN), over all of k in slices of BK."""
    G = tl.zeros((BM, BN), dtype=GOUT.dtype.element_ty)
    for k0 in range(0, k, BK):
        rk = k0 + tl.arange(0, BK)
        g = tl.load(GOUT + rm[:, None] * s_gn + rk[None, :],
                    mask=(rm[:, None] < n1) & (rk[None, :] < k), other=0.0)
        v = tl.load(V + rn[:, None] * s_vn + rk[None, :],
                    mask=(rn[:, None] < n2) & (rk[None, :] < k), other=0.0)
        G = tl.dot(g, tl.trans(v), G, input_precision=PRECISION)
    return G


@triton.jit
def backward_rows(Z1, Z2, V, GOUT, GZ1, n1, n2, k, s_z1b, s_z1n, s_z2b, s_z2n, s_vb, s_vn,
                  s_gb, s_gn, s_zb, s_zn, PROFILE: tl.constexpr, DDOT: tl.constexpr,
                  EXACT: tl.constexpr, DPAD: tl.constexpr, DFULL: tl.constexpr,
                  BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, CHUNK: tl.constexpr,
                  PREC_D: tl.constexpr, PREC_V: tl.constexpr):
    """GZ1[b, rows] = 2 (diag(H 1) z1 − H z2) for one row tile (all of k in slices of BK)."""
    pid_m, b = tl.program_id(0), tl.program_id(1)
    Z1, Z2, V, GOUT = Z1 + b * s_z1b, Z2 + b * s_z2b, V + b * s_vb, GOUT + b * s_gb
    rm, rd, z1, sq1 = _rows_tile(Z1, pid_m, n1, s_z1n, BM, DPAD, DDOT)
    rf = tl.arange(0, DFULL)
    dtype = GZ1.dtype.element_ty
    rowsum, rowsum_c, hz, hz_c = _input_grad_sums(BM, DFULL, dtype)
    for c0 in range(0, n2, CHUNK):
        rowsum_p, _zero1, hz_p, _zero2 = _input_grad_sums(BM, DFULL, dtype)
        for start in range(c0, tl.minimum(c0 + CHUNK, n2), BN):
            rn = start + tl.arange(0, BN)
            D2, _ = _sqdist(z1, sq1, Z2, rn, n2, s_z2n, rd, DDOT, EXACT, Z1, rm, n1, s_z1n,
                            PREC_D)
            _, dphi = _profile(D2, PROFILE)
            G = _grad_v(GOUT, V, rm, rn, n1, n2, k, s_gn, s_vn, BM, BN, BK, PREC_V)
            H = tl.where(rn[None, :] < n2, G * dphi, 0.0)
            rowsum_p += tl.sum(H, axis=1)
            hz_p += _hz_step(H, Z2, rn, n2, s_z2n, rf, DDOT + EXACT, PREC_V)
        rowsum, rowsum_c = _kahan(rowsum, rowsum_c, rowsum_p)
        hz, hz_c = _kahan(hz, hz_c, hz_p)
    _store_input_grad(GZ1 + b * s_zb, Z1, rm, n1, s_z1n, s_zn, rf, rowsum, hz, DDOT + EXACT)


@triton.jit
def backward_cols(Z1, Z2, V, GOUT, GZ2, GV, n1, n2, k, s_z1b, s_z1n, s_z2b, s_z2n, s_vb, s_vn,
                  s_gb, s_gn, s_zb, s_zn, s_gvb, s_gvn, PROFILE: tl.constexpr,
                  DDOT: tl.constexpr, EXACT: tl.constexpr, DPAD: tl.constexpr,
                  DFULL: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                  KPAD: tl.constexpr, NEED_Z: tl.constexpr, NEED_V: tl.constexpr,
                  CHUNK: tl.constexpr, PREC_D: tl.constexpr, PREC_V: tl.constexpr):
    """For one column tile: GZ2 = 2 (diag(Hᵀ1) z2 − Hᵀ z1) (NEED_Z) and GV = Φᵀ Ȳ (NEED_V,
    k ≤ KPAD). The roles of the two point sets swap, so rows here are z2's."""
    pid_n, b = tl.program_id(0), tl.program_id(1)
    Z1, Z2, V, GOUT = Z1 + b * s_z1b, Z2 + b * s_z2b, V + b * s_vb, GOUT + b * s_gb
    rn, rd, z2, sq2 = _rows_tile(Z2, pid_n, n2, s_z2n, BN, DPAD, DDOT)
    rf = tl.arange(0, DFULL)
    rkp = tl.arange(0, KPAD)
    dtype = GZ2.dtype.element_ty
    colsum, colsum_c = tl.zeros((BN,), dtype=dtype), tl.zeros((BN,), dtype=dtype)
    hz, hz_c = tl.zeros((BN, DFULL), dtype=dtype), tl.zeros((BN, DFULL), dtype=dtype)
    gv, gv_c = tl.zeros((BN, KPAD), dtype=dtype), tl.zeros((BN, KPAD), dtype=dtype)
    for c0 in range(0, n1, CHUNK):
        colsum_p = tl.zeros((BN,), dtype=dtype)
        hz_p = tl.zeros((BN, DFULL), dtype=dtype)
        gv_p = tl.zeros((BN, KPAD), dtype=dtype)
        for start in range(c0, tl.minimum(c0 + CHUNK, n1), BM):
            rm = start + tl.arange(0, BM)
            # D² with the column tile as "rows": distances are symmetric in the two sets
            D2, _ = _sqdist(z2, sq2, Z1, rm, n1, s_z1n, rd, DDOT, EXACT, Z2, rn, n2, s_z2n,
                            PREC_D)  # (BN, BM)
            phi, dphi = _profile(D2, PROFILE)
            if NEED_V:
                g = tl.load(GOUT + rm[:, None] * s_gn + rkp[None, :],
                            mask=(rm[:, None] < n1) & (rkp[None, :] < k), other=0.0)
                phi_t = tl.where(rm[None, :] < n1, phi, 0.0)
                gv_p = tl.dot(phi_t.to(g.dtype), g, gv_p, input_precision=PREC_V)
            if NEED_Z:
                Gt = tl.trans(_grad_v(GOUT, V, rm, rn, n1, n2, k, s_gn, s_vn, BM, BN, BK,
                                      PREC_V))
                Ht = tl.where(rm[None, :] < n1, Gt * dphi, 0.0)  # (BN, BM)
                colsum_p += tl.sum(Ht, axis=1)
                hz_p += _hz_step(Ht, Z1, rm, n1, s_z1n, rf, DDOT + EXACT, PREC_V)
        colsum, colsum_c = _kahan(colsum, colsum_c, colsum_p)
        hz, hz_c = _kahan(hz, hz_c, hz_p)
        gv, gv_c = _kahan(gv, gv_c, gv_p)
    if NEED_Z:
        _store_input_grad(GZ2 + b * s_zb, Z2, rn, n2, s_z2n, s_zn, rf, colsum, hz,
                          DDOT + EXACT)
    if NEED_V:
        tl.store(GV + b * s_gvb + rn[:, None] * s_gvn + rkp[None, :], gv,
                 mask=(rn[:, None] < n2) & (rkp[None, :] < k))


@triton.jit
def _pair_load(A, B, r, n, s_a, s_b, rc, k):
    """(len(r), K2) rows ``r`` of [A, B] (each k wide; zero past 2k and past n)."""
    inside = r[:, None] < n
    first = tl.load(A + r[:, None] * s_a + rc[None, :], mask=inside & (rc[None, :] < k),
                    other=0.0)
    second = tl.load(B + r[:, None] * s_b + (rc[None, :] - k),
                     mask=inside & (rc[None, :] >= k) & (rc[None, :] < 2 * k), other=0.0)
    return first + second


@triton.jit
def backward_symmetric(Z, V, GOUT, GZ, n, k, s_zb, s_zn, s_vb, s_vn, s_gb, s_gn, s_ob, s_on,
                       PROFILE: tl.constexpr, DDOT: tl.constexpr, EXACT: tl.constexpr,
                       DPAD: tl.constexpr, DFULL: tl.constexpr, BM: tl.constexpr,
                       BN: tl.constexpr, K2PAD: tl.constexpr, CHUNK: tl.constexpr,
                       PREC_D: tl.constexpr, PREC_V: tl.constexpr):
    """The gradient of Y = Φ(z, z) V for z, one row tile, in one pass over the columns.

    z enters as rows and as columns, so its gradient at p is
    2 Σ_j S_pj φ'(D²_pj) (z_p − z_j) with S_pj = ȳ_p·v_j + v_p·ȳ_j = [ȳ_p, v_p]·[v_j, ȳ_j]:
    one product over 2k (≤ K2PAD) instead of a row pass and a column pass. (V's gradient,
    Φ Ȳ, is the forward with Ȳ for V.)"""
    pid_m, b = tl.program_id(0), tl.program_id(1)
    Z, V, GOUT = Z + b * s_zb, V + b * s_vb, GOUT + b * s_gb
    rm, rd, z1, sq1 = _rows_tile(Z, pid_m, n, s_zn, BM, DPAD, DDOT)
    rf = tl.arange(0, DFULL)
    rc = tl.arange(0, K2PAD)
    rows_pair = _pair_load(GOUT, V, rm, n, s_gn, s_vn, rc, k)  # [ȳ_p, v_p]
    dtype = GZ.dtype.element_ty
    rowsum, rowsum_c, hz, hz_c = _input_grad_sums(BM, DFULL, dtype)
    for c0 in range(0, n, CHUNK):
        rowsum_p, _zero1, hz_p, _zero2 = _input_grad_sums(BM, DFULL, dtype)
        for start in range(c0, tl.minimum(c0 + CHUNK, n), BN):
            rn = start + tl.arange(0, BN)
            D2, _ = _sqdist(z1, sq1, Z, rn, n, s_zn, rd, DDOT, EXACT, Z, rm, n, s_zn, PREC_D)
            _, dphi = _profile(tl.where(rm[:, None] == rn[None, :], 0.0, D2), PROFILE)
            cols_pair = _pair_load(V, GOUT, rn, n, s_vn, s_gn, rc, k)  # [v_j, ȳ_j]
            S = tl.dot(rows_pair, tl.trans(cols_pair), input_precision=PREC_V)
            # the self-pairs add nothing (z_p − z_p = 0); left in, a rounded D² ≠ 0 there
            # (Matérn-½'s φ' ~ 1/r) would leave rounding of the size of φ' in the sums
            H = tl.where((rn[None, :] < n) & (rn[None, :] != rm[:, None]), S * dphi, 0.0)
            rowsum_p += tl.sum(H, axis=1)
            hz_p = tl.dot(H.to(z1.dtype), tl.load(Z + rn[:, None] * s_zn + rf[None, :],
                                                  mask=(rn[:, None] < n)
                                                  & (rf[None, :] < DDOT + EXACT), other=0.0),
                          hz_p, input_precision=PREC_V)
        rowsum, rowsum_c = _kahan(rowsum, rowsum_c, rowsum_p)
        hz, hz_c = _kahan(hz, hz_c, hz_p)
    _store_input_grad(GZ + b * s_ob, Z, rm, n, s_zn, s_on, rf, rowsum, hz, DDOT + EXACT)
