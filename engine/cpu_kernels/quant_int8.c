/*
 * The packed linear layer on integer dot products: C[M, N] (+)= Q8(A)[M, K] @ W^T, where W
 * is group-quantized (w = code * scale + min, as quant_linear.c) and each row of A is rounded
 * to int8 per block of QB inputs (QB = 32, or 16 where the group is 16): a = d * q with
 * d = max|a| / 127 and q = rint(a / d) in [-127, 127] (Q8_0, as llama.cpp's activations).
 * Per block, sum_k a_k w_k = d * (scale * sum_k q_k code_k + min * sum_k q_k): the sums are
 * exact integers, the block's two products are fp32. So the result is the product of the
 * dequantized weights with the rounded activations, summed in fp32 per block.
 *
 * Codes in a layout of their own (engine.cpu_kernels.quant_int8.repack_codes), 64 bytes per
 * line, byte 4 c + j holding column c of the panel at input k0 + j:
 *   bits 4: [N / 16][K / 8] lines, the low nibble input k0 + j, the high nibble k0 + 4 + j;
 *   bits 8: [N / 16][K / 4] lines, code + 128 as an unsigned byte.
 * Kernels, chosen when the library is built for the host:
 *   AVX-512 VNNI (16 lanes): one VPDPBUSD multiplies a line (unsigned codes) by four int8
 *     activations broadcast to every column and adds into 16 int32 sums; 8-bit codes carry
 *     +128, taken off once per block with 128 * sum_k q_k;
 *   AVX2 (8 lanes): VPMADDUBSW (codes times activations, pairs added into int16; a 4-bit
 *     block's sums stay below 2^15) then VPMADDWD by ones into int32; 8-bit codes go back to
 *     signed and multiply as |w| times sign(w) q (llama.cpp's way: no int16 overflow).
 *   AMX-INT8 (from 16 rows, inside quant_int8_gemm.c's blocks): quant_int8_amx.c.
 * Rows go RT at a time under each panel (the panel stays in L1 while every row tile reads
 * it); threads split the panels. Quantizing A happens once per call, before the threads.
 */
#include <math.h>
#include <stdlib.h>

#include "quant_int8.h"

/* inputs per rounded block of a row: QI8_BLOCK where the weight's group is a multiple of it,
   else 16 (every group is a multiple of 16) */
#define QI8_BLOCK 32
#define QI8_GEMM_ROWS 8

/* 1: AVX2, 2: AVX-512 VNNI, 0: none (the caller keeps quant_linear.c) */
int32_t splitserve_qi8_isa(void) { return QI8_ISA; }
int32_t splitserve_qi8_block_for(int32_t group) { return group % QI8_BLOCK ? 16 : QI8_BLOCK; }
/* rows from which a product runs quant_int8_gemm.c's tiles */
int32_t splitserve_qi8_gemm_rows(void) { return QI8_GEMM_ROWS; }

/* max |x_k| over qb inputs */
static inline float block_amax(const float *x, int qb)
{
    int k = 0;
    float amax = 0.0f;
#if QI8_ISA == 2
    __m512 m = _mm512_setzero_ps();
    for (; k + 16 <= qb; k += 16) m = _mm512_max_ps(m, _mm512_abs_ps(_mm512_loadu_ps(x + k)));
    amax = _mm512_reduce_max_ps(m);
#elif QI8_ISA == 1
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 m = _mm256_setzero_ps();
    for (; k + 8 <= qb; k += 8) m = _mm256_max_ps(m, _mm256_andnot_ps(sign, _mm256_loadu_ps(x + k)));
    float t[8];
    _mm256_storeu_ps(t, m);
    for (int i = 0; i < 8; i++) amax = fmaxf(amax, t[i]);
#endif
    for (; k < qb; k++) amax = fmaxf(amax, fabsf(x[k]));
    return amax;
}

/* q_k = rint(x_k * inv) (round to nearest even, as the vector conversions); their sum */
static inline int32_t block_round(const float *x, float inv, int qb, int8_t *q)
{
    int k = 0;
    int32_t s = 0;
#if QI8_ISA == 2
    const __m512 iv = _mm512_set1_ps(inv);
    for (; k + 16 <= qb; k += 16) {
        const __m512i r = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(x + k), iv));
        _mm_storeu_si128((__m128i *)(q + k), _mm512_cvtsepi32_epi8(r));
        s += _mm512_reduce_add_epi32(r);
    }
#endif
    for (; k < qb; k++) {
        q[k] = (int8_t)rintf(x[k] * inv);
        s += q[k];
    }
    return s;
}

/* Rows of A as int8 blocks of qb inputs (qi8_rows): q [M][K], the block scales d, the
   blocks' sums of q, and per group of `group` inputs the sum of d * sum(q), [M][K / group]. */
void splitserve_qi8_quantize(const float *a, int64_t lda, int32_t M, int32_t K, int32_t qb,
                             int32_t group, int8_t *q, float *d, int32_t *sums, float *dsum,
                             int32_t threads)
{
    const int blocks = K / qb, per = group / qb;
#pragma omp parallel for schedule(static) num_threads(threads > 0 ? threads : 1) \
    if ((int64_t)M * K >= 1 << 15)
    for (int r = 0; r < M; r++)
        for (int b = 0; b < blocks; b++) {
            const float *x = a + r * lda + b * qb;
            const float amax = block_amax(x, qb);
            const float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
            const int64_t i = (int64_t)r * blocks + b;
            d[i] = amax / 127.0f;
            sums[i] = block_round(x, inv, qb, q + (int64_t)r * K + b * qb);
            float *ds = dsum + (int64_t)r * (K / group) + b / per;
            *ds = (b % per ? *ds : 0.0f) + d[i] * (float)sums[i];
        }
}

#if QI8_ISA > 0

#define RT 4 /* rows per tile */

typedef struct {
    const uint8_t *codes;
    const void *scales, *mins;
    int bits, group, K, halves, qb;
    const int8_t *q; /* the quantized rows, [M][K] */
    const float *d;
    const int32_t *sums;
    const float *dsum;
} qi8_job;

#if QI8_ISA == 2
typedef __m512i isum_t; /* 16 columns of int32 sums */
static inline isum_t izero(void) { return _mm512_setzero_si512(); }

/* Sums over one block (qb inputs from k0) of R rows times panel line pointer `w`. */
static inline __attribute__((always_inline)) void block_dots(const qi8_job *j, const uint8_t *w,
                                                             const int8_t *const *q, int k0,
                                                             const int R, isum_t *acc)
{
    isum_t odd[RT];
    for (int r = 0; r < R; r++) acc[r] = odd[r] = izero();
    if (j->bits == 4) {
        const __m512i nib = _mm512_set1_epi8(15);
        for (int k = k0; k < k0 + j->qb; k += 8, w += 64) {
            const __m512i x = _mm512_loadu_si512(w);
            const __m512i lo = _mm512_and_si512(x, nib);
            const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(x, 4), nib);
            for (int r = 0; r < R; r++) {
                acc[r] = _mm512_dpbusd_epi32(acc[r], lo, _mm512_set1_epi32(qi8_four(q[r] + k)));
                odd[r] = _mm512_dpbusd_epi32(odd[r], hi, _mm512_set1_epi32(qi8_four(q[r] + k + 4)));
            }
        }
    } else {
        for (int k = k0; k < k0 + j->qb; k += 8, w += 128) {
            const __m512i x0 = _mm512_loadu_si512(w), x1 = _mm512_loadu_si512(w + 64);
            for (int r = 0; r < R; r++) {
                acc[r] = _mm512_dpbusd_epi32(acc[r], x0, _mm512_set1_epi32(qi8_four(q[r] + k)));
                odd[r] = _mm512_dpbusd_epi32(odd[r], x1, _mm512_set1_epi32(qi8_four(q[r] + k + 4)));
            }
        }
    }
    for (int r = 0; r < R; r++) acc[r] = _mm512_add_epi32(acc[r], odd[r]);
}

static inline isum_t ioffset(isum_t acc, int32_t x)
{
    return _mm512_sub_epi32(acc, _mm512_set1_epi32(x));
}

/* 16 columns of fp32 sums, and what the tile does with them */
typedef __m512 fsum_t;
static inline fsum_t fload(const float *p) { return _mm512_loadu_ps(p); }
static inline void fstore(float *p, fsum_t v) { _mm512_storeu_ps(p, v); }
static inline fsum_t fzero(void) { return _mm512_setzero_ps(); }
/* out + (float)acc * (d * scale) */
static inline fsum_t fscaled(isum_t acc, float d, fsum_t scale, fsum_t out)
{
    return _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc), _mm512_mul_ps(_mm512_set1_ps(d), scale), out);
}
static inline fsum_t fmadd1(float x, fsum_t v, fsum_t out)
{
    return _mm512_fmadd_ps(_mm512_set1_ps(x), v, out);
}

#else /* AVX2 */
typedef struct {
    __m256i h[2]; /* columns 0-7, 8-15 */
} isum_t;
static inline isum_t izero(void) { return (isum_t){{_mm256_setzero_si256(), _mm256_setzero_si256()}}; }

static inline __attribute__((always_inline)) void block_dots(const qi8_job *j, const uint8_t *w,
                                                             const int8_t *const *q, int k0,
                                                             const int R, isum_t *acc)
{
    const __m256i ones = _mm256_set1_epi16(1);
    for (int r = 0; r < R; r++) acc[r] = izero();
    if (j->bits == 4) {
        /* int16 sums: at most 2 * 15 * 127 a product pair, 8 pairs a lane per block of 32 */
        __m256i s16[RT][2];
        for (int r = 0; r < R; r++) s16[r][0] = s16[r][1] = _mm256_setzero_si256();
        const __m256i nib = _mm256_set1_epi8(15);
        for (int k = k0; k < k0 + j->qb; k += 8, w += 64)
            for (int h = 0; h < 2; h++) {
                const __m256i x = _mm256_loadu_si256((const __m256i *)(w + 32 * h));
                const __m256i lo = _mm256_and_si256(x, nib);
                const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(x, 4), nib);
                for (int r = 0; r < R; r++) {
                    const __m256i a0 = _mm256_set1_epi32(qi8_four(q[r] + k));
                    const __m256i a1 = _mm256_set1_epi32(qi8_four(q[r] + k + 4));
                    s16[r][h] = _mm256_add_epi16(s16[r][h], _mm256_maddubs_epi16(lo, a0));
                    s16[r][h] = _mm256_add_epi16(s16[r][h], _mm256_maddubs_epi16(hi, a1));
                }
            }
        for (int r = 0; r < R; r++)
            for (int h = 0; h < 2; h++) acc[r].h[h] = _mm256_madd_epi16(s16[r][h], ones);
        return;
    }
    const __m256i flip = _mm256_set1_epi8((char)0x80);
    for (int k = k0; k < k0 + j->qb; k += 4, w += 64)
        for (int h = 0; h < 2; h++) {
            const __m256i x = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(w + 32 * h)), flip);
            const __m256i ax = _mm256_abs_epi8(x);
            for (int r = 0; r < R; r++) {
                const __m256i s = _mm256_sign_epi8(_mm256_set1_epi32(qi8_four(q[r] + k)), x);
                acc[r].h[h] = _mm256_add_epi32(acc[r].h[h],
                                               _mm256_madd_epi16(_mm256_maddubs_epi16(ax, s), ones));
            }
        }
}

static inline isum_t ioffset(isum_t acc, int32_t x) { return (void)x, acc; } /* unused */

typedef struct {
    __m256 h[2];
} fsum_t;
static inline fsum_t fload(const float *p) { return (fsum_t){{_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)}}; }
static inline void fstore(float *p, fsum_t v)
{
    _mm256_storeu_ps(p, v.h[0]);
    _mm256_storeu_ps(p + 8, v.h[1]);
}
static inline fsum_t fzero(void) { return (fsum_t){{_mm256_setzero_ps(), _mm256_setzero_ps()}}; }
static inline fsum_t fscaled(isum_t acc, float d, fsum_t scale, fsum_t out)
{
    const __m256 dv = _mm256_set1_ps(d);
    for (int h = 0; h < 2; h++)
        out.h[h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(acc.h[h]), _mm256_mul_ps(dv, scale.h[h]), out.h[h]);
    return out;
}
static inline fsum_t fmadd1(float x, fsum_t v, fsum_t out)
{
    const __m256 xv = _mm256_set1_ps(x);
    for (int h = 0; h < 2; h++) out.h[h] = _mm256_fmadd_ps(xv, v.h[h], out.h[h]);
    return out;
}
#endif

/* R rows from m0 times panel p into c (rows ldc apart, the panel's 16 columns). Per group,
   each block adds (float)sums * (d * scale) (on VNNI, 8-bit sums less 128 * sum(q) first,
   exactly); the mins' part comes once per group: the sum over its blocks of d * sum(q),
   times min. */
static inline __attribute__((always_inline)) void qi8_tile(const qi8_job *j, int64_t p, int m0,
                                                           float *c, int64_t ldc, int load_c,
                                                           const int R)
{
    const int K = j->K, blocks = K / j->qb, groups = K / j->group, per = j->group / j->qb;
    const int line_k = j->bits == 4 ? 8 : 4, offset = QI8_ISA == 2 && j->bits == 8;
    const uint8_t *panel = j->codes + p * (int64_t)(K / line_k) * 64;
    const int8_t *q[RT];
    fsum_t out[RT];
    for (int r = 0; r < R; r++) {
        q[r] = j->q + (int64_t)(m0 + r) * K;
        out[r] = load_c ? fload(c + r * ldc) : fzero();
    }
    float param[16] __attribute__((aligned(64)));
    for (int g = 0; g < groups; g++) {
        const int64_t at = (p * groups + g) * 16;
        qi8_params16(j->scales, j->halves & 1, at, param);
        const fsum_t scale = fload(param);
        for (int b = g * per; b < (g + 1) * per; b++) {
            isum_t acc[RT];
            block_dots(j, panel + (int64_t)(b * j->qb / line_k) * 64, q, b * j->qb, R, acc);
            for (int r = 0; r < R; r++) {
                const int64_t i = (int64_t)(m0 + r) * blocks + b;
                if (offset) acc[r] = ioffset(acc[r], 128 * j->sums[i]);
                out[r] = fscaled(acc[r], j->d[i], scale, out[r]);
            }
        }
        if (!j->mins) continue;
        qi8_params16(j->mins, j->halves & 2, at, param);
        const fsum_t min = fload(param);
        for (int r = 0; r < R; r++) out[r] = fmadd1(j->dsum[(int64_t)(m0 + r) * groups + g], min, out[r]);
    }
    for (int r = 0; r < R; r++) fstore(c + r * ldc, out[r]);
}

static void qi8_panel(const qi8_job *j, int64_t p, int M, float *c, int64_t ldc, int load_c)
{
    int m = 0;
    for (; m + RT <= M; m += RT) qi8_tile(j, p, m, c + m * ldc, ldc, load_c, RT);
    switch (M - m) {
    case 1: qi8_tile(j, p, m, c + m * ldc, ldc, load_c, 1); break;
    case 2: qi8_tile(j, p, m, c + m * ldc, ldc, load_c, 2); break;
    case 3: qi8_tile(j, p, m, c + m * ldc, ldc, load_c, 3); break;
    default: break;
    }
}

/* A thread's buffer of at least `bytes`, kept for the next call; NULL if memory ran out. */
static void *qi8_scratch(size_t bytes)
{
    static __thread void *buf;
    static __thread size_t cap;
    if (bytes > cap) {
        free(buf);
        buf = aligned_alloc(64, (bytes + 63) / 64 * 64);
        cap = buf ? bytes : 0;
    }
    return buf;
}

/* 1 if it computed C, 0 if it could not (no memory for the quantized rows). N a multiple of
   16, K of the group, the group of 16. */
int32_t splitserve_linear_qi8(const float *a, int64_t lda, const uint8_t *codes,
                              const void *scales, const void *mins, int32_t halves, int32_t bits,
                              int32_t group, int32_t M, int32_t N, int32_t K, float *c,
                              int64_t ldc, int32_t accumulate, int32_t threads)
{
    if (M <= 0) return 1;
    const int qb = splitserve_qi8_block_for(group), blocks = K / qb, groups = K / group;
    const size_t qbytes = ((size_t)M * K + 63) / 64 * 64, dbytes = (size_t)M * blocks * 4;
    char *buf = qi8_scratch(qbytes + 2 * dbytes + (size_t)M * groups * 4);
    if (!buf) return 0;
    int8_t *q = (int8_t *)buf;
    float *d = (float *)(buf + qbytes), *dsum = (float *)(buf + qbytes + 2 * dbytes);
    int32_t *sums = (int32_t *)(buf + qbytes + dbytes);
    splitserve_qi8_quantize(a, lda, M, K, qb, group, q, d, sums, dsum, threads);
    const qi8_rows rows = {q, d, sums, dsum, K, qb, group};
    const qi8_weight w = {codes, scales, mins, bits, group, halves};
    if (M >= QI8_GEMM_ROWS && qi8_gemm(&rows, &w, M, N, c, ldc, accumulate, threads)) return 1;
    const qi8_job j = {codes, scales, mins, bits, group, K, halves, qb, q, d, sums, dsum};
    const int panels = N / 16;
#pragma omp parallel for schedule(static) num_threads(threads > 0 ? threads : 1) \
    if ((int64_t)M * N * K >= 1 << 16)
    for (int p = 0; p < panels; p++) qi8_panel(&j, p, M, c + p * 16, ldc, accumulate);
    return 1;
}

#else
int32_t splitserve_linear_qi8(const float *a, int64_t lda, const uint8_t *codes,
                              const void *scales, const void *mins, int32_t halves, int32_t bits,
                              int32_t group, int32_t M, int32_t N, int32_t K, float *c,
                              int64_t ldc, int32_t accumulate, int32_t threads)
{
    (void)a, (void)lda, (void)codes, (void)scales, (void)mins, (void)halves, (void)bits;
    (void)group, (void)M, (void)N, (void)K, (void)c, (void)ldc, (void)accumulate, (void)threads;
    return 0;
}
#endif
