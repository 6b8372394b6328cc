/* Row kernels of the block-sparse kernel product Φ S and its adjoint (gpscale.linalg.native).
 *
 * Φ_pq = φ(D²_pq), D²_pq = ‖z_p − z_q‖² formed from differences (exact: D²_pp = 0), φ one of
 * the stationary profiles below. S is block-sparse: column b of S holds the action entries
 * s_q of the points q of block b, blocks are contiguous ranges of points (block order).
 *
 * Every function handles a tile, the rows [r0, r1) against the columns [c0, c1), and writes
 * only those rows' outputs; with ``mirror`` set (a tile off the diagonal of the symmetric
 * product) it also accumulates the mirror image into the columns' outputs, so each unordered
 * pair is evaluated once. Callers run tiles that share no row or column range in parallel
 * threads without locks (gpscale.linalg.native.symmetric_rounds). Columns are processed in chunks of CH points whose inputs (stored transposed, d × n) stay in cache
 * while the rows pass over them; the loops over a chunk are simple enough for the compiler to
 * vectorise (-O3 with reassociation but not -ffast-math, whose start-up code would flush
 * subnormals process-wide; exp is our own inlined polynomial).
 *
 * This file is compiled twice, with REAL = float (suffix f32) and REAL = double (f64).
 */
#ifndef GPSCALE_NATIVE_COMMON
#define GPSCALE_NATIVE_COMMON
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#define CH 512
#define CAT2(a, b) a##_##b
#define CAT(a, b) CAT2(a, b)
#define FN(name) CAT(name, SFX)

enum { RBF = 0, MATERN12 = 1, MATERN32 = 2, MATERN52 = 3 };

/* e^x for x ≤ 0 in float32, inlined so that the loops calling it vectorise without a call:
 * x = k ln 2 + r, |r| ≤ ln 2 / 2, e^r by its degree-6 Taylor polynomial (relative error below
 * 2e-7, about 1.5 float32 ulp), 2^k assembled in the exponent bits. x < −87 gives e^−87. */
static inline float exp_nonpositive_f32(float x) {
    x = x < -87.0f ? -87.0f : x;
    const float k = __builtin_roundf(x * 1.44269504088896341f);
    const float r = (x - k * 0.693359375f) + k * 2.12194440e-4f;
    float p = 1.0f / 720;
    p = p * r + 1.0f / 120;
    p = p * r + 1.0f / 24;
    p = p * r + 1.0f / 6;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    union { float f; int32_t i; } scale = {.i = ((int32_t)k + 127) << 23};
    return p * scale.f;
}

/* The same in float64: degree-12 Taylor polynomial (relative error below 2e-16), x < −708 gives
 * e^−708. */
static inline double exp_nonpositive_f64(double x) {
    x = x < -708.0 ? -708.0 : x;
    const double k = __builtin_round(x * 1.4426950408889634);
    const double r = (x - k * 0.693145751953125) - k * 1.42860682030941723212e-6;
    double p = 1.0 / 479001600;
    const double inverse[11] = {39916800, 3628800, 362880, 40320, 5040, 720, 120, 24, 6, 2, 1};
    for (int j = 0; j < 11; ++j) p = p * r + 1.0 / inverse[j];
    p = p * r + 1.0;
    union { double f; int64_t i; } scale = {.i = ((int64_t)k + 1023) << 52};
    return p * scale.f;
}

#endif

/* D2[q] = ‖zp − z_{c0+q}‖², q < m, for a compile-time d (the loop over d unrolls, the loop
 * over q vectorises with D2 in registers); ``sqdist`` dispatches on d. */
static inline __attribute__((always_inline)) void FN(sqdist_d)(
        int64_t m, const int64_t d, const REAL *zp, const REAL *zT, int64_t n, int64_t c0,
        REAL *D2) {
    const REAL *cols = zT + c0;
    for (int64_t q = 0; q < m; ++q) {
        REAL acc = 0;
        for (int64_t k = 0; k < d; ++k) {
            const REAL diff = zp[k] - cols[k * n + q];
            acc += diff * diff;
        }
        D2[q] = acc;
    }
}

/* out[k] = Σ_q w[q] z_{c0+q, k}, k < d, one pass over q for a compile-time d. */
static inline __attribute__((always_inline)) void FN(weighted_sums_d)(
        int64_t m, const int64_t d, const REAL *w, const REAL *zT, int64_t n, int64_t c0,
        REAL *out) {
    REAL acc[16] = {0};
    const REAL *cols = zT + c0;
    for (int64_t q = 0; q < m; ++q)
        for (int64_t k = 0; k < d; ++k) acc[k] += w[q] * cols[k * n + q];
    for (int64_t k = 0; k < d; ++k) out[k] = acc[k];
}

/* Unrolled up to d = 9 only: at d = 10-12 the unrolled loops ran 3x slower than the generic
 * ones (registers spill; measured forward 0.39-0.49 s against 0.19 s at d = 13, n = 16,000). */
#define DISPATCH_D(call)                                                                     \
    switch (d) {                                                                             \
    case 1: call(1); break; case 2: call(2); break; case 3: call(3); break;                  \
    case 4: call(4); break; case 5: call(5); break; case 6: call(6); break;                  \
    case 7: call(7); break; case 8: call(8); break; case 9: call(9); break;                  \
    default: generic;                                                                        \
    }

static void FN(sqdist)(int64_t m, int64_t d, const REAL *zp, const REAL *zT, int64_t n,
                        int64_t c0, REAL *D2) {
#define CALL(D) FN(sqdist_d)(m, D, zp, zT, n, c0, D2)
#define generic                                                                              \
    do {                                                                                     \
        for (int64_t q = 0; q < m; ++q) D2[q] = 0;                                           \
        for (int64_t k = 0; k < d; ++k) {                                                    \
            const REAL a = zp[k], *col = zT + k * n + c0;                                    \
            for (int64_t q = 0; q < m; ++q) D2[q] += (a - col[q]) * (a - col[q]);            \
        }                                                                                    \
    } while (0)
    DISPATCH_D(CALL)
#undef CALL
#undef generic
}

static void FN(weighted_sums)(int64_t m, int64_t d, const REAL *w, const REAL *zT, int64_t n,
                               int64_t c0, REAL *out) {
#define CALL(D) FN(weighted_sums_d)(m, D, w, zT, n, c0, out)
#define generic                                                                              \
    do {                                                                                     \
        for (int64_t k = 0; k < d; ++k) {                                                    \
            const REAL *col = zT + k * n + c0;                                               \
            REAL dot = 0;                                                                    \
            for (int64_t q = 0; q < m; ++q) dot += w[q] * col[q];                            \
            out[k] = dot;                                                                    \
        }                                                                                    \
    } while (0)
    DISPATCH_D(CALL)
#undef CALL
#undef generic
}

/* phi[q] = φ(D2[q]); with dphi != NULL also dphi[q] = dφ/dD²(D2[q]) (0 where undefined). */
static void FN(profile)(int profile, int64_t m, const REAL *D2, REAL *phi, REAL *dphi) {
    const REAL sqrt3 = (REAL)1.7320508075688772, sqrt5 = (REAL)2.23606797749979;
    switch (profile) {
    case RBF:
        for (int64_t q = 0; q < m; ++q) phi[q] = EXP((REAL)-0.5 * D2[q]);
        if (dphi)
            for (int64_t q = 0; q < m; ++q) dphi[q] = (REAL)-0.5 * phi[q];
        break;
    case MATERN12:
        for (int64_t q = 0; q < m; ++q) {
            const REAL r = SQRT(D2[q]);
            phi[q] = EXP(-r);
            if (dphi) dphi[q] = r > 0 ? (REAL)-0.5 * phi[q] / r : (REAL)0;
        }
        break;
    case MATERN32:
        for (int64_t q = 0; q < m; ++q) {
            const REAL r = sqrt3 * SQRT(D2[q]);
            const REAL e = EXP(-r);
            phi[q] = (1 + r) * e;
            if (dphi) dphi[q] = (REAL)-1.5 * e;
        }
        break;
    default: /* MATERN52 */
        for (int64_t q = 0; q < m; ++q) {
            const REAL r = sqrt5 * SQRT(D2[q]);
            const REAL e = EXP(-r);
            phi[q] = (1 + r + r * r / 3) * e;
            if (dphi) dphi[q] = ((REAL)-5.0 / 6) * (1 + r) * e;
        }
    }
}

/* Block sums over the chunk's columns: for each block b meeting [c0, c0 + m), the range
 * [lo, hi) of chunk positions it covers. */
#define FOR_BLOCKS_IN_CHUNK(b, lo, hi)                                                       \
    for (int64_t b = block_of[c0], lo, hi; b <= block_of[c0 + m - 1]                         \
         && (lo = (block_start[b] > c0 ? block_start[b] : c0) - c0,                           \
             hi = (block_start[b + 1] < c0 + m ? block_start[b + 1] : c0 + m) - c0, 1);       \
         ++b)

/* Rows p ∈ [r0, r1) against the columns [cb, ce) (block order):
 *   out[p, b] += Σ_{q ∈ block b ∩ [cb, ce)} Φ(x_p, z_q) s_q,
 * and with ``mirror`` (a tile of the symmetric product off its diagonal: row and column points
 * are the same n points, the two ranges disjoint) also the transposed tile
 *   out[q, b(p)] += Φ_pq s_p  for q ∈ [cb, ce).
 * zr (t × d): the row points; zT (d × n): the column points; s (n); block_start (nb + 1);
 * block_of (n); out (t × nb) (n × nb with ``mirror``). */
void FN(block_sparse_forward)(int profile, int64_t n, int64_t d, const REAL *zr,
                              const REAL *zT, const REAL *s, const int64_t *block_start,
                              const int64_t *block_of, int64_t nb, REAL *out, int64_t r0,
                              int64_t r1, int64_t cb, int64_t ce, int mirror) {
    REAL D2[CH], phi[CH], col[CH];
    for (int64_t c0 = cb; c0 < ce; c0 += CH) {
        const int64_t m = ce - c0 < CH ? ce - c0 : CH;
        const REAL *sc = s + c0;
        int64_t current = block_of[r0];
        for (int64_t q = 0; q < m; ++q) col[q] = 0;
        for (int64_t p = r0; p < r1; ++p) {
            if (mirror && block_of[p] != current) { /* flush the transposed block sums */
                for (int64_t q = 0; q < m; ++q) {
                    out[(c0 + q) * nb + current] += col[q];
                    col[q] = 0;
                }
                current = block_of[p];
            }
            FN(sqdist)(m, d, zr + p * d, zT, n, c0, D2);
            FN(profile)(profile, m, D2, phi, NULL);
            FOR_BLOCKS_IN_CHUNK(b, lo, hi) {
                REAL acc = 0;
                for (int64_t q = lo; q < hi; ++q) acc += phi[q] * sc[q];
                out[p * nb + b] += acc;
            }
            if (mirror) {
                const REAL sp = s[p];
                for (int64_t q = 0; q < m; ++q) col[q] += phi[q] * sp;
            }
        }
        if (mirror)
            for (int64_t q = 0; q < m; ++q) out[(c0 + q) * nb + current] += col[q];
    }
}

/* The adjoint of the symmetric product Z = Φ S (rows and columns the same n points), given
 * Z̄ = gout (n × nb) and its transpose goutT (nb × n), for the rows p ∈ [r0, r1) against the
 * columns [cb, ce):
 *   s̄_p += Σ_q Φ_pq Z̄[q, b(p)],
 *   z̄_p += 2 Σ_q Ḡ_pq φ'(D²_pq) (z_p − z_q),  Ḡ_pq = Z̄[p, b(q)] s_q + Z̄[q, b(p)] s_p
 * (z̄ only with want_z), and with ``mirror`` (disjoint ranges, an off-diagonal tile) the
 * transposed tile's share as well: s̄_q += Φ_pq Z̄[p, b(q)], z̄_q += 2 Ḡ_pq φ' (z_q − z_p).
 * z (n × d) row-major, zT its transpose; gs (n), gz (n × d). */
void FN(block_sparse_adjoint)(int profile, int64_t n, int64_t d, const REAL *z,
                              const REAL *zT, const REAL *s, const int64_t *block_start,
                              const int64_t *block_of, int64_t nb, const REAL *gout,
                              const REAL *goutT, int want_z, int64_t r0, int64_t r1,
                              int64_t cb, int64_t ce, int mirror, REAL *gs, REAL *gz) {
    REAL D2[CH], phi[CH], dphi[CH], w[CH];
    REAL *dots = malloc((size_t)d * sizeof(REAL));
    REAL *col = mirror && want_z ? malloc((size_t)d * CH * sizeof(REAL)) : NULL;
    for (int64_t c0 = cb; c0 < ce; c0 += CH) {
        const int64_t m = ce - c0 < CH ? ce - c0 : CH;
        const REAL *sc = s + c0;
        if (col)
            for (int64_t j = 0; j < d * CH; ++j) col[j] = 0;
        for (int64_t p = r0; p < r1; ++p) {
            const REAL *zp = z + p * d;
            FN(sqdist)(m, d, zp, zT, n, c0, D2);
            FN(profile)(profile, m, D2, phi, want_z ? dphi : NULL);
            const REAL *a = goutT + block_of[p] * n + c0; /* Z̄[q, b(p)] */
            REAL acc = 0;
            for (int64_t q = 0; q < m; ++q) acc += phi[q] * a[q];
            gs[p] += acc;
            const REAL sp = s[p];
            FOR_BLOCKS_IN_CHUNK(b, lo, hi) {
                const REAL g = gout[p * nb + b]; /* Z̄[p, b(q)] */
                if (mirror)
                    for (int64_t q = lo; q < hi; ++q) gs[c0 + q] += phi[q] * g;
                if (want_z)
                    for (int64_t q = lo; q < hi; ++q) w[q] = (g * sc[q] + a[q] * sp) * dphi[q];
            }
            if (!want_z) continue;
            REAL sw = 0;
            for (int64_t q = 0; q < m; ++q) sw += w[q];
            FN(weighted_sums)(m, d, w, zT, n, c0, dots);
            for (int64_t k = 0; k < d; ++k) gz[p * d + k] += 2 * (zp[k] * sw - dots[k]);
            if (col)
                for (int64_t k = 0; k < d; ++k) {
                    const REAL zk = zp[k], *zc = zT + k * n + c0;
                    REAL *ck = col + k * CH;
                    for (int64_t q = 0; q < m; ++q) ck[q] += w[q] * (zc[q] - zk);
                }
        }
        if (col)
            for (int64_t q = 0; q < m; ++q)
                for (int64_t k = 0; k < d; ++k) gz[(c0 + q) * d + k] += 2 * col[k * CH + q];
    }
    free(col);
    free(dots);
}

/* Dense tile of kernel values: out[(p − r0) · ld + (q − cb)] = φ(‖z_p − z_q‖²) for the rows
 * p ∈ [r0, r1) against the columns q ∈ [cb, ce). zr (t × d): the row points; zT (d × n): the
 * column points, transposed. The caller multiplies the tile into its right-hand sides (a GEMM).
 * About 1 ns per float32 entry on one EPYC core; 4 × 8 register blocks in AVX2 intrinsics
 * (the columns' inputs loaded once for four rows, a vector exponential, rsqrt with a Newton
 * step) were no faster. */
void FN(kernel_tile)(int profile, int64_t n, int64_t d, const REAL *zr, const REAL *zT,
                     int64_t r0, int64_t r1, int64_t cb, int64_t ce, REAL *out, int64_t ld) {
    REAL D2[CH];
    for (int64_t p = r0; p < r1; ++p)
        for (int64_t c0 = cb; c0 < ce; c0 += CH) {
            const int64_t m = ce - c0 < CH ? ce - c0 : CH;
            FN(sqdist)(m, d, zr + p * d, zT, n, c0, D2);
            FN(profile)(profile, m, D2, out + (p - r0) * ld + (c0 - cb), NULL);
        }
}
