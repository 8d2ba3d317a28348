/*
 * Linear layer over group-quantized weights: C[M, N] (+)= A[M, K] @ W^T, where W stays packed
 * (engine.model.quant.packing) and is dequantized as it is read. Two code formats:
 *   bits 4: [N / 16][K][8] bytes; byte j of row k holds column j in its low nibble and
 *           column j + 8 in its high one (unsigned codes 0..15);
 *   bits 8: [N / 16][K][16] int8 codes.
 * Both have scales [N / 16][K / group][16] and optional mins of the same shape, each fp32 or
 * fp16 (bit 0 of `halves`: the scales are fp16, bit 1: the mins; the packing stores fp16 where
 * it holds the values exactly, and they are widened to fp32 in registers, so the results are
 * the same bits): w = code * scale + min, one fused multiply-add, which for every GGUF type
 * this serves is exactly the value ggml dequantizes (the product code * scale is exact in fp32).
 *
 * The weights go through the same FMAs, in the same order over K, as the fp32 kernel
 * (linear.c) over the dequantized matrix, so the outputs are bit for bit the fp32 path's.
 * Up to QTILE_ROWS rows one tile walks a panel dequantizing in registers, a row of
 * the panel being one vector with 16 lanes (AVX-512) or two with 8 (vecw.h); threads split
 * the panels. For more rows quant_prefill.c runs: blocks of panels dequantized into L1 and
 * shared by every row tile, blocked for the host's caches, the same sums.
 *
 * Unless the caller asks for this path alone (amx_rows 0), two fp32-level kernels take over
 * where they are built: quant_small (below) up to SMALL_ROWS rows, the decode steps, and the
 * AMX tiles (quant_amx.c) from amx_rows rows on.
 */
#include <stdint.h>
#include <stdlib.h>

#include "linear.h"
#include "quant_dequant.h"

#ifdef _OPENMP
#include <omp.h>
#endif

#define QTILE_ROWS 6 /* from QTILE_ROWS + 1 rows on, quant_prefill.c */

/* R rows (R <= QTILE_ROWS) times panel p over the whole of K, the weights dequantized in
   registers; each element is summed in the order of linear.c's tiles. */
static inline __attribute__((always_inline)) void qtile(
    const float *a, int64_t lda, const qweight *w, int64_t p, float *c, int64_t ldc,
    int load_c, const int R)
{
    vw acc[QTILE_ROWS][NV];
    for (int r = 0; r < R; r++)
        for (int j = 0; j < NV; j++)
            acc[r][j] = load_c ? loadw(c + r * ldc + j * VW) : splatw(0.0f);
    for (int g = 0; g < w->K / w->group; g++) {
        vw s[NV], m[NV], b[NV];
        group_vectors(w, p, g, s, m);
        for (int k = g * w->group; k < (g + 1) * w->group; k++) {
            dequant_row(w, p, k, s, m, b);
            for (int r = 0; r < R; r++) {
                const vw ar = splatw(a[r * lda + k]);
                for (int j = 0; j < NV; j++) acc[r][j] += ar * b[j];
            }
        }
    }
    for (int r = 0; r < R; r++)
        for (int j = 0; j < NV; j++) storew(c + r * ldc + j * VW, acc[r][j]);
}

static void panel_small(const float *a, int64_t lda, const qweight *w, int64_t p, int rows,
                        float *c, int64_t ldc, int load_c)
{
    switch (rows) {
    case 1: qtile(a, lda, w, p, c, ldc, load_c, 1); break;
    case 2: qtile(a, lda, w, p, c, ldc, load_c, 2); break;
    case 3: qtile(a, lda, w, p, c, ldc, load_c, 3); break;
    case 4: qtile(a, lda, w, p, c, ldc, load_c, 4); break;
    case 5: qtile(a, lda, w, p, c, ldc, load_c, 5); break;
    case 6: qtile(a, lda, w, p, c, ldc, load_c, 6); break;
    default: break;
    }
}

#if defined(__AVX512F__) && VW == 16
/* Up to SMALL_ROWS rows (decode), where the build has AVX-512: per group, the codes widened
   to fp32 times the activations summed apart, then scaled once, w = code * scale + min giving
   sum(a * w) = scale * sum(a * code) + min * sum(a); fp32-level like the AMX kernel, not bit
   for bit the FMA path. SMALL_PANELS panels at a time keep 2 * R * SMALL_PANELS independent
   sums going (one chain of dependent FMAs per panel bound the FMA path at one row). 4-bit
   codes: 16 bytes hold rows k and k + 1 of a panel, columns 0-7 in the low nibbles and 8-15
   in the high ones; widened to 16 words, the low nibbles multiply [a[k] x 8, a[k+1] x 8] into
   one sum and the high ones into another, folded per group. */
#define SMALL_ROWS 4
#define SMALL_PANELS 8

/* 16 scales or mins from element `at` of p (fp16 where `half`), as fp32; and their address */
static inline __attribute__((always_inline)) __m512 load16(const void *p, int half, int64_t at)
{
    return half ? _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)((const uint16_t *)p + at)))
                : _mm512_loadu_ps((const float *)p + at);
}
static inline const char *param_at(const void *p, int half, int64_t at)
{
    return (const char *)p + at * (half ? 2 : 4);
}

static inline __attribute__((always_inline)) __m512 fold_pairs(__m512 lo, __m512 hi)
{
    return _mm512_add_ps(_mm512_shuffle_f32x4(lo, hi, 0x44), _mm512_shuffle_f32x4(lo, hi, 0xEE));
}

/* sum of a[k0 .. k0 + n), n a multiple of 16 */
static inline float span_sum(const float *a, int n)
{
    __m512 s = _mm512_loadu_ps(a);
    for (int k = 16; k < n; k += 16) s = _mm512_add_ps(s, _mm512_loadu_ps(a + k));
    return _mm512_reduce_add_ps(s);
}

#ifndef PREFETCH_GROUPS
#define PREFETCH_GROUPS 1
#endif
/* Group g of panels [p0, p0 + np) into the cache ahead of use. */
static inline __attribute__((always_inline)) void prefetch_group(const qweight *w, int64_t p0,
                                                                 int np, int g)
{
    const int groups = w->K / w->group, row_bytes = w->bits == 4 ? 8 : 16;
    for (int j = 0; j < np; j++) {
        const char *q = (const char *)w->codes + ((p0 + j) * w->K + g * w->group) * row_bytes;
        for (int b = 0; b < w->group * row_bytes; b += 64) _mm_prefetch(q + b, _MM_HINT_T0);
        const int64_t at = ((p0 + j) * groups + g) * 16;
        _mm_prefetch(param_at(w->scales, w->halves & HALF_SCALES, at), _MM_HINT_T0);
        if (w->mins) _mm_prefetch(param_at(w->mins, w->halves & HALF_MINS, at), _MM_HINT_T0);
    }
}

/* R rows times panels [p0, p0 + NP) over the whole of K; C (+)= the product. Panels up to
   `last` (exclusive) may be prefetched. */
static inline __attribute__((always_inline)) void small_panels(
    const float *a, int64_t lda, const qweight *w, int64_t p0, int64_t last, float *c,
    int64_t ldc, int load_c, const int R, const int NP)
{
    const int groups = w->K / w->group;
    __m512 out[SMALL_ROWS][SMALL_PANELS];
    for (int r = 0; r < R; r++)
        for (int j = 0; j < NP; j++)
            out[r][j] = load_c ? _mm512_loadu_ps(c + r * ldc + (p0 + j) * 16) : _mm512_setzero_ps();
    const __m512i pair = _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
    const __m512 values = _mm512_set_ps(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
    for (int g = 0; g < groups; g++) {
        const int k0 = g * w->group, k1 = k0 + w->group;
        if (g + PREFETCH_GROUPS < groups)
            prefetch_group(w, p0, NP, g + PREFETCH_GROUPS);
        else if (p0 + 2 * NP <= last) /* the next panels' first groups */
            prefetch_group(w, p0 + NP, NP, g + PREFETCH_GROUPS - groups);
        __m512 lo[SMALL_ROWS][SMALL_PANELS], hi[SMALL_ROWS][SMALL_PANELS];
        for (int r = 0; r < R; r++)
            for (int j = 0; j < NP; j++) lo[r][j] = hi[r][j] = _mm512_setzero_ps();
        if (w->bits == 4) {
            for (int k = k0; k < k1; k += 2) {
                __m512 x[SMALL_ROWS];
                for (int r = 0; r < R; r++)
                    x[r] = _mm512_permutexvar_ps(
                        pair, _mm512_castpd_ps(_mm512_set1_pd(*(const double *)(a + r * lda + k))));
                for (int j = 0; j < NP; j++) {
                    const __m512i v = _mm512_cvtepu8_epi32(
                        _mm_loadu_si128((const __m128i *)(w->codes + ((p0 + j) * w->K + k) * 8)));
                    /* a permute reads the low 4 bits of each index: the code's value */
                    const __m512 ql = _mm512_permutexvar_ps(v, values);
                    const __m512 qh = _mm512_permutexvar_ps(_mm512_srli_epi32(v, 4), values);
                    for (int r = 0; r < R; r++) {
                        lo[r][j] = _mm512_fmadd_ps(x[r], ql, lo[r][j]);
                        hi[r][j] = _mm512_fmadd_ps(x[r], qh, hi[r][j]);
                    }
                }
            }
            for (int r = 0; r < R; r++)
                for (int j = 0; j < NP; j++) lo[r][j] = fold_pairs(lo[r][j], hi[r][j]);
        } else {
            /* 8-bit: one row of 16 codes per k; even and odd k summed apart */
            for (int k = k0; k < k1; k += 2) {
                for (int j = 0; j < NP; j++) {
                    const int8_t *q = (const int8_t *)w->codes + ((p0 + j) * w->K + k) * 16;
                    const __m512 q0 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)q)));
                    const __m512 q1 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(q + 16))));
                    for (int r = 0; r < R; r++) {
                        lo[r][j] = _mm512_fmadd_ps(_mm512_set1_ps(a[r * lda + k]), q0, lo[r][j]);
                        hi[r][j] = _mm512_fmadd_ps(_mm512_set1_ps(a[r * lda + k + 1]), q1, hi[r][j]);
                    }
                }
            }
            for (int r = 0; r < R; r++)
                for (int j = 0; j < NP; j++) lo[r][j] = _mm512_add_ps(lo[r][j], hi[r][j]);
        }
        float sums[SMALL_ROWS];
        if (w->mins)
            for (int r = 0; r < R; r++) sums[r] = span_sum(a + r * lda + k0, w->group);
        for (int j = 0; j < NP; j++) {
            const int64_t at = ((p0 + j) * groups + g) * 16;
            const __m512 scale = load16(w->scales, w->halves & HALF_SCALES, at);
            for (int r = 0; r < R; r++) out[r][j] = _mm512_fmadd_ps(lo[r][j], scale, out[r][j]);
            if (w->mins) {
                const __m512 min = load16(w->mins, w->halves & HALF_MINS, at);
                for (int r = 0; r < R; r++)
                    out[r][j] = _mm512_fmadd_ps(_mm512_set1_ps(sums[r]), min, out[r][j]);
            }
        }
    }
    for (int r = 0; r < R; r++)
        for (int j = 0; j < NP; j++) _mm512_storeu_ps(c + r * ldc + (p0 + j) * 16, out[r][j]);
}

/* Panels [lo, hi) for R rows: SMALL_PANELS at a time (half as many from 3 rows on: the sums
   fill the registers), the rest by 4, 2 and 1. */
static inline __attribute__((always_inline)) void small_range(
    const float *a, int64_t lda, const qweight *w, int lo, int hi, float *c, int64_t ldc,
    int load_c, const int R)
{
    int p = lo;
    if (R <= 1)
        for (; hi - p >= SMALL_PANELS; p += SMALL_PANELS)
            small_panels(a, lda, w, p, hi, c, ldc, load_c, R, SMALL_PANELS);
    for (; hi - p >= 4; p += 4) small_panels(a, lda, w, p, hi, c, ldc, load_c, R, 4);
    if (hi - p >= 2) small_panels(a, lda, w, p, hi, c, ldc, load_c, R, 2), p += 2;
    if (hi - p >= 1) small_panels(a, lda, w, p, hi, c, ldc, load_c, R, 1);
}

/* 1 if it computed C (1 <= M <= SMALL_ROWS), else 0. */
static int quant_small(const float *a, int64_t lda, const qweight *w, int M, int N, float *c,
                       int64_t ldc, int accumulate, int threads)
{
    if (M < 1 || M > SMALL_ROWS) return 0;
    const int panels = N / PANEL;
#pragma omp parallel num_threads(threads > 0 ? threads : 1) if ((int64_t)M * N * w->K >= 1 << 16)
    {
        /* even shares of the panels (a thread's last few run 4, 2 or 1 at a time) */
        const int nt = omp_get_num_threads(), id = omp_get_thread_num();
        const int lo = (int)((int64_t)panels * id / nt), hi = (int)((int64_t)panels * (id + 1) / nt);
        switch (M) {
        case 1: small_range(a, lda, w, lo, hi, c, ldc, accumulate, 1); break;
        case 2: small_range(a, lda, w, lo, hi, c, ldc, accumulate, 2); break;
        case 3: small_range(a, lda, w, lo, hi, c, ldc, accumulate, 3); break;
        default: small_range(a, lda, w, lo, hi, c, ldc, accumulate, 4); break;
        }
    }
    return 1;
}
int32_t splitserve_quant_small_rows(void) { return SMALL_ROWS; }
#else
int32_t splitserve_quant_small_rows(void) { return 0; }

static int quant_small(const float *a, int64_t lda, const qweight *w, int M, int N, float *c,
                       int64_t ldc, int accumulate, int threads)
{
    (void)a, (void)lda, (void)w, (void)M, (void)N, (void)c, (void)ldc, (void)accumulate;
    (void)threads;
    return 0;
}
#endif

/* quant_amx.c, quant_amx_bf16.c: 1 if it computed C on AMX tiles, 0 if it declined */
int splitserve_quant_amx(const float *a, int64_t lda, const uint8_t *codes, const void *scales,
                         const void *mins, int halves, int bits, int group, int M, int N, int K,
                         float *c, int64_t ldc, int accumulate, int threads);
int splitserve_quant_amx_bf16(const float *a, int64_t lda, const uint8_t *codes,
                              const void *scales, const void *mins, int halves, int bits,
                              int group, int M, int N, int K, float *c, int64_t ldc,
                              int accumulate, int threads);

/* quant_prefill.c: 1 if it computed C (bit for bit this path's result), 0 below its rows */
int splitserve_quant_prefill(const float *a, int64_t lda, const qweight *w, int M, int N,
                             float *c, int64_t ldc, int accumulate, int threads);

/* N must be a multiple of 16, `group` of 16 and K of `group` (the packing sees to it); `halves`
   says which of the scales and mins are fp16 (HALF_SCALES, HALF_MINS). With
   `amx_rows` > 0, up to SMALL_ROWS rows run quant_small where the build has it, and from
   `amx_rows` rows on the AMX kernel runs where it can (both fp32-level, not bit for bit this
   path); amx_rows 0 keeps this path for every row count. With `bf16_products` the AMX rows
   run in bf16 products instead (quant_amx_bf16.c: bf16(A) times bf16(W), summed in fp32). */
void splitserve_linear_quant(
    const float *a, int64_t lda, const uint8_t *codes, const void *scales, const void *mins,
    int32_t halves, int32_t bits, int32_t group, int32_t M, int32_t N, int32_t K, float *c,
    int64_t ldc, int32_t accumulate, int32_t threads, int32_t amx_rows, int32_t bf16_products)
{
    const qweight w = {codes, scales, mins, bits, group, K, halves};
    if (amx_rows > 0 && quant_small(a, lda, &w, M, N, c, ldc, accumulate, threads)) return;
    if (amx_rows > 0 && M >= amx_rows && bf16_products &&
        splitserve_quant_amx_bf16(a, lda, codes, scales, mins, halves, bits, group, M, N, K, c,
                                  ldc, accumulate, threads))
        return;
    if (amx_rows > 0 && M >= amx_rows &&
        splitserve_quant_amx(a, lda, codes, scales, mins, halves, bits, group, M, N, K, c, ldc,
                             accumulate, threads))
        return;
    if (splitserve_quant_prefill(a, lda, &w, M, N, c, ldc, accumulate, threads)) return;
    const int panels = N / PANEL;
    const int parallel = (int64_t)M * N * K >= 1 << 16;
#pragma omp parallel for num_threads(threads > 0 ? threads : 1) if (parallel) schedule(static)
    for (int p = 0; p < panels; p++)
        for (int m0 = 0; m0 < M; m0 += QTILE_ROWS) {
            const int rows = M - m0 < QTILE_ROWS ? M - m0 : QTILE_ROWS;
            panel_small(a + m0 * lda, lda, &w, p, rows, c + m0 * ldc + p * PANEL, ldc, accumulate);
        }
}
