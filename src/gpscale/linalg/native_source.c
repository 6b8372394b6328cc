/* Row kernels of the block-sparse kernel product Φ S and its adjoint, and the fused dense products
 * Φ V and K V, K a composed kernel (sum of scaled products of profiles on column groups)
 * (gpscale.linalg.native).
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
 * subnormals process-wide; each call flushes them for its own length instead, SUBNORMALS_OFF;
 * exp is our own inlined polynomial).
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

/* Subnormals off for the length of one call: results below the smallest normal number are
 * flushed to zero and such inputs read as zero (x86: MXCSR FTZ | DAZ; AArch64: FPCR.FZ), the
 * caller's mode restored on return. Far pairs under short lengthscales give kernel values and
 * derivatives near e^-87, whose products with the adjoint's entries are subnormal, and
 * arithmetic on subnormals takes a slow microcode path on x86 (the adjoint ran 6x slower).
 * What is flushed is below 1.2e-38 (float32) in sums whose diagonal terms are the outputscale. */
#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>
#define SUBNORMALS_OFF                                                                       \
    const unsigned int saved_mode_ = _mm_getcsr();                                           \
    _mm_setcsr(saved_mode_ | 0x8040u)
#define SUBNORMALS_RESTORE _mm_setcsr(saved_mode_)
#elif defined(__aarch64__)
#define SUBNORMALS_OFF                                                                       \
    uint64_t saved_mode_;                                                                    \
    __asm__ volatile("mrs %0, fpcr" : "=r"(saved_mode_));                                    \
    __asm__ volatile("msr fpcr, %0" ::"r"(saved_mode_ | (1ull << 24)))
#define SUBNORMALS_RESTORE __asm__ volatile("msr fpcr, %0" ::"r"(saved_mode_))
#else
#define SUBNORMALS_OFF (void)0
#define SUBNORMALS_RESTORE (void)0
#endif

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
    SUBNORMALS_OFF;
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
    SUBNORMALS_RESTORE;
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
    SUBNORMALS_OFF;
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
    SUBNORMALS_RESTORE;
}

/* Rows of the kernel matrix: out[(p − r0) · ld + q] = φ(‖z_p − z_q‖²) for p ∈ [r0, r1), q < n.
 * zr (t × d): the row points; zT (d × n): the column points, transposed. */
void FN(kernel_rows)(int profile, int64_t n, int64_t d, const REAL *zr, const REAL *zT,
                     int64_t r0, int64_t r1, REAL *out, int64_t ld) {
    SUBNORMALS_OFF;
    REAL D2[CH];
    for (int64_t p = r0; p < r1; ++p)
        for (int64_t c0 = 0; c0 < n; c0 += CH) {
            const int64_t m = n - c0 < CH ? n - c0 : CH;
            FN(sqdist)(m, d, zr + p * d, zT, n, c0, D2);
            FN(profile)(profile, m, D2, out + (p - r0) * ld + c0, NULL);
        }
    SUBNORMALS_RESTORE;
}

/* ---- The dense product K(z_rows, z_cols) V, fused -------------------------------------------
 * Rows are taken MR at a time against chunks of KC columns: the MR × KC kernel values are filled
 * into a panel that stays in L1, and register-blocked micro-kernels multiply it at once into the
 * right-hand sides (MR rows × NV vectors of accumulators held in registers), so no tile is stored
 * beyond L1 and no GEMM library packs one. Vectors are GCC's generic vector types (AVX-512,
 * AVX2 or SSE/NEON as -march=native allows), the vector count per pass sized to the register
 * file. The right-hand sides are padded by the caller to a multiple of the vector width (k = 1
 * takes scalar-column loops instead). On a 2-core EPYC this ran at 0.98 of the fp32 GEMM
 * roofline where MKL on C-filled 2048 × 256 tiles ran at 0.84 (n = 20,000, d = 8, k = 64). */
#ifndef GPSCALE_NATIVE_VEC
#define GPSCALE_NATIVE_VEC
#if defined(__AVX512F__)
#define VBYTES 64
#define NVMAX 4 /* 32 registers: 6 × 4 accumulators, 4 loads, 1 broadcast */
#elif defined(__AVX__)
#define VBYTES 32
#define NVMAX 2 /* 16 registers: 6 × 2 accumulators */
#elif defined(__aarch64__)
#define VBYTES 16
#define NVMAX 4
#else
#define VBYTES 16
#define NVMAX 2
#endif
#define MR 6
#define KC 256
#endif

typedef REAL FN(vec) __attribute__((vector_size(VBYTES)));
#define VEC FN(vec)
#define W ((int64_t)(VBYTES / sizeof(REAL)))

static inline __attribute__((always_inline)) VEC FN(vload)(const REAL *p) {
    VEC v;
    __builtin_memcpy(&v, p, sizeof v); /* unaligned load */
    return v;
}

static inline __attribute__((always_inline)) void FN(vstore)(REAL *p, VEC v) {
    __builtin_memcpy(p, &v, sizeof v);
}

/* C[i, :nv·W] += Σ_k A[i, k] B[k, :nv·W] for the panel's rows i < mr (A: MR × KC, rows past mr
 * zero); the MR × nv accumulators stay in registers over the kc steps. */
static inline __attribute__((always_inline)) void FN(panel_rows)(
        const int nv, int64_t kc, const REAL *A, const REAL *B, int64_t ldb, REAL *C,
        int64_t ldc, int mr) {
    VEC acc[MR][4];
    for (int i = 0; i < MR; ++i)
        for (int v = 0; v < nv; ++v) acc[i][v] = (VEC){0};
    for (int64_t k = 0; k < kc; ++k) {
        VEC b[4];
        for (int v = 0; v < nv; ++v) b[v] = FN(vload)(B + k * ldb + v * W);
        for (int i = 0; i < MR; ++i) {
            const VEC a = (VEC){0} + A[i * KC + k];
            for (int v = 0; v < nv; ++v) acc[i][v] += a * b[v];
        }
    }
    for (int i = 0; i < mr; ++i)
        for (int v = 0; v < nv; ++v) {
            REAL *c = C + i * ldc + v * W;
            FN(vstore)(c, FN(vload)(c) + acc[i][v]);
        }
}

/* The mirror image: C[k, :nv·W] += Σ_{i<mr} A[i, k] Br[i, :nv·W] for k < kc, the panel rows'
 * right-hand sides Br held in registers. */
static inline __attribute__((always_inline)) void FN(panel_cols)(
        const int nv, int64_t kc, const REAL *A, const REAL *Br, int64_t ldb, int mr, REAL *C,
        int64_t ldc) {
    VEC b[MR][4];
    for (int i = 0; i < MR; ++i)
        for (int v = 0; v < nv; ++v) b[i][v] = i < mr ? FN(vload)(Br + i * ldb + v * W) : (VEC){0};
    for (int64_t k = 0; k < kc; ++k) {
        REAL *c = C + k * ldc;
        VEC acc[4];
        for (int v = 0; v < nv; ++v) acc[v] = FN(vload)(c + v * W);
        for (int i = 0; i < MR; ++i) {
            const VEC a = (VEC){0} + A[i * KC + k];
            for (int v = 0; v < nv; ++v) acc[v] += a * b[i][v];
        }
        for (int v = 0; v < nv; ++v) FN(vstore)(c + v * W, acc[v]);
    }
}

/* Elements per vector: the caller pads the right-hand sides' columns to a multiple of it. */
int FN(vector_width)(void) { return (int)W; }

/* A kernel for the dense products: a sum of terms, each a scale times a product of leaves, each
 * leaf a profile on a contiguous span of the inputs' coordinates (inputs already divided by
 * the leaf's lengthscales):
 *   K(z_p, z_q) = Σ_t scale[t] Π_{l ∈ t} φ_l(‖z_{p, span l} − z_{q, span l}‖²).
 * Leaf l is leaf[3 l : 3 l + 3] = (profile, first coordinate, width); term t holds the leaves
 * [term_end[t − 1], term_end[t]) (term_end[−1] = 0). One term of one leaf spanning all d
 * coordinates with scale 1 is the single profile of dense_product. */
struct FN(kernel) {
    int64_t num_terms;
    const int64_t *term_end;
    const REAL *scale;
    const int64_t *leaf;
};

/* row[q] = K(z_p, z_{c0+q}) for q < kc (kc ≤ KC); zp: the row point's d coordinates, zT (d × n)
 * the column points, transposed. A single leaf with scale 1 writes φ straight into the row. */
static inline __attribute__((always_inline)) void FN(kernel_row)(
        const struct FN(kernel) *K, int64_t kc, const REAL *zp, const REAL *zT, int64_t n,
        int64_t c0, REAL *row) {
    REAL D2[KC], part[KC], phi[KC];
    if (K->num_terms == 1 && K->term_end[0] == 1 && K->scale[0] == 1) {
        const int64_t *leaf = K->leaf;
        FN(sqdist)(kc, leaf[2], zp + leaf[1], zT + leaf[1] * n, n, c0, D2);
        FN(profile)((int)leaf[0], kc, D2, row, NULL);
        return;
    }
    for (int64_t t = 0, l = 0; t < K->num_terms; ++t) {
        for (const int64_t first = l; l < K->term_end[t]; ++l) {
            const int64_t *leaf = K->leaf + 3 * l;
            FN(sqdist)(kc, leaf[2], zp + leaf[1], zT + leaf[1] * n, n, c0, D2);
            FN(profile)((int)leaf[0], kc, D2, l == first ? part : phi, NULL);
            if (l != first)
                for (int64_t q = 0; q < kc; ++q) part[q] *= phi[q];
        }
        const REAL s = K->scale[t];
        if (t == 0)
            for (int64_t q = 0; q < kc; ++q) row[q] = s * part[q];
        else
            for (int64_t q = 0; q < kc; ++q) row[q] += s * part[q];
    }
}

/* out[p, :] += Σ_q K(z_p, z_q) rhs[q, :] for the rows p ∈ [r0, r1) against the columns
 * q ∈ [cb, ce), and with ``mirror`` (a tile of the symmetric product off its diagonal, the two
 * ranges disjoint) also out[q, :] += K_pq rhs[p, :]. zr (t × d): the row points; zT (d × n):
 * the column points, transposed; rhs (n × kp) and out (t × kp, n × kp with ``mirror``),
 * row-major, kp = 1 or a multiple of vector_width(). Columns are walked in spans of ``span``
 * points so that their right-hand sides (and mirrored outputs) stay in L2 while all rows pass.
 * Shared by dense_product (one profile) and composed_product (a composed kernel). */
static inline __attribute__((always_inline)) void FN(panel_product)(
        const struct FN(kernel) *K, int64_t n, int64_t d, const REAL *zr, const REAL *zT,
        const REAL *rhs, int64_t kp, REAL *out, int64_t r0, int64_t r1, int64_t cb, int64_t ce,
        int mirror, int64_t span) {
    REAL panel[MR * KC] __attribute__((aligned(64)));
    for (int64_t s0 = cb; s0 < ce; s0 += span) {
        const int64_t s1 = ce - s0 < span ? ce : s0 + span;
        for (int64_t i0 = r0; i0 < r1; i0 += MR) {
            const int mr = r1 - i0 < MR ? (int)(r1 - i0) : MR;
            for (int64_t c0 = s0; c0 < s1; c0 += KC) {
                const int64_t kc = s1 - c0 < KC ? s1 - c0 : KC;
                for (int i = 0; i < MR; ++i) {
                    REAL *row = panel + i * KC;
                    if (i < mr) {
                        FN(kernel_row)(K, kc, zr + (i0 + i) * d, zT, n, c0, row);
                    } else {
                        for (int64_t q = 0; q < kc; ++q) row[q] = 0;
                    }
                }
                if (kp == 1) { /* one right-hand side: loops over the chunk's columns */
                    for (int i = 0; i < mr; ++i) {
                        REAL acc = 0;
                        for (int64_t q = 0; q < kc; ++q) acc += panel[i * KC + q] * rhs[c0 + q];
                        out[i0 + i] += acc;
                    }
                    if (mirror)
                        for (int i = 0; i < mr; ++i) {
                            const REAL ri = rhs[i0 + i];
                            for (int64_t q = 0; q < kc; ++q) out[c0 + q] += panel[i * KC + q] * ri;
                        }
                    continue;
                }
                for (int64_t j0 = 0; j0 < kp; j0 += NVMAX * W) {
                    const int nv = (kp - j0) / W >= NVMAX ? NVMAX : (int)((kp - j0) / W);
                    const REAL *B = rhs + c0 * kp + j0, *Br = rhs + i0 * kp + j0;
                    REAL *C = out + i0 * kp + j0, *Cm = out + c0 * kp + j0;
#define PASS(NV)                                                                             \
    do {                                                                                     \
        FN(panel_rows)(NV, kc, panel, B, kp, C, kp, mr);                                     \
        if (mirror) FN(panel_cols)(NV, kc, panel, Br, kp, mr, Cm, kp);                       \
    } while (0)
                    switch (nv) {
                    case 1: PASS(1); break;
                    case 2: PASS(2); break;
                    case 3: PASS(3); break;
                    default: PASS(4); break;
                    }
#undef PASS
                }
            }
        }
    }
}

/* The product with one profile φ on all d coordinates (panel_product's arguments). */
void FN(dense_product)(int profile, int64_t n, int64_t d, const REAL *zr, const REAL *zT,
                       const REAL *rhs, int64_t kp, REAL *out, int64_t r0, int64_t r1,
                       int64_t cb, int64_t ce, int mirror, int64_t span) {
    const int64_t term_end[1] = {1}, leaf[3] = {profile, 0, d};
    const REAL scale[1] = {1};
    const struct FN(kernel) K = {1, term_end, scale, leaf};
    SUBNORMALS_OFF;
    FN(panel_product)(&K, n, d, zr, zT, rhs, kp, out, r0, r1, cb, ce, mirror, span);
    SUBNORMALS_RESTORE;
}

/* The product with a composed kernel (struct kernel: num_terms, term_end, scale, leaf) on the
 * leaves' gathered coordinates, d their total width (panel_product's other arguments). */
void FN(composed_product)(int64_t num_terms, const int64_t *term_end, const REAL *scale,
                          const int64_t *leaf, int64_t n, int64_t d, const REAL *zr,
                          const REAL *zT, const REAL *rhs, int64_t kp, REAL *out, int64_t r0,
                          int64_t r1, int64_t cb, int64_t ce, int mirror, int64_t span) {
    const struct FN(kernel) K = {num_terms, term_end, scale, leaf};
    SUBNORMALS_OFF;
    FN(panel_product)(&K, n, d, zr, zT, rhs, kp, out, r0, r1, cb, ce, mirror, span);
    SUBNORMALS_RESTORE;
}
#undef VEC
#undef W
