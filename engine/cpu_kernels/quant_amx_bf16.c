/*
 * The packed linear layer on AMX tiles in bf16 products: what a layer computes where the
 * engine runs with float32_matmul_precision "medium" (torch's name: fp32 products may be
 * formed from bf16 inputs). quant_amx.c, the "highest" kernel, splits each activation into
 * three bf16 terms and scales every group's sums in fp32, which bounds it at a third of the
 * tile unit's rate and adds a store and a scaling pass per group. Here
 *     C[M, N] (+)= bf16(A)[M, K] @ bf16(W)^T, w = code * scale + min (in fp32, rounded once)
 * with fp32 sums over the whole K in the tiles: the precision of a bf16 model (vLLM's CPU
 * backend serves the same weights in bf16), from the packed weights with no bf16 copy kept.
 *
 * Layout. A row block (BF_ROW_BLOCK rows) of A is rounded once by all threads into tiles
 * [m-tile][k-step][16 rows][32 bf16]. Each thread owns a range of panel pairs (32 output
 * columns; with few pairs, up to BF_ROW_SPLIT_PAIRS, a range of row pairs instead, over every
 * panel: 2-core dev machine, 384 rows, the 576 x 1536 product 0.533 -> 0.456 ms and a whole
 * prefill 109.4 -> 103.7 ms median, loaded) and takes them a few at a time (as many as fit BF_B_BYTES): it dequantizes their
 * whole K into the VNNI bf16 layout of B tiles (each weight once per row block), then for
 * each pair of m-tiles and each panel pair runs per k-step 2 A and 2 B loads and 4 TDPBF16PS
 * into 4 C tiles, and stores those once, at the end of K. A gated MLP's gate_up product can
 * take each gate panel with its up panel and write silu(gate) * up alone (the gate_up
 * output, twice the size, is never stored; the values are silu_mul's on the unfused output).
 */
#include "amx.h"

#ifdef SPLITSERVE_HAS_AMX

#include "vec8.h"

#ifndef BF_ROW_BLOCK
#define BF_ROW_BLOCK 512 /* rows rounded at a time: 512 * K * 2 bytes, in L2 */
#endif
#ifndef BF_ROW_SPLIT_PAIRS
#define BF_ROW_SPLIT_PAIRS 18 /* up to this many panel pairs (N = 576) the threads split rows */
#endif
#ifndef BF_B_BYTES
#define BF_B_BYTES (384 << 10) /* dequantized B tiles a thread holds at a time */
#endif

/* 16 rows (`valid` real, the rest zero) of A from k = 0 as bf16 tiles [k-step][16][32] */
static void round_tile(const float *a, int64_t lda, int valid, int K, uint16_t *dst)
{
    const int steps = K / KSTEP;
    for (int r = 0; r < 16; r++)
        for (int s = 0; s < steps; s++) {
            uint16_t *out = dst + (int64_t)s * 512 + r * 32;
            if (r < valid) {
                const __m512 lo = _mm512_loadu_ps(a + r * lda + s * KSTEP);
                const __m512 hi = _mm512_loadu_ps(a + r * lda + s * KSTEP + 16);
                _mm512_storeu_si512(out, (__m512i)_mm512_cvtne2ps_pbh(hi, lo));
            } else {
                _mm512_storeu_si512(out, _mm512_setzero_si512());
            }
        }
}

/* Panel p's weights over the whole K as B tiles [k-step][16 pair rows][16 columns x 2] bf16
   (pair row i of a step holds (column n, k = 2i + t) at word 2n + t), each bf16(code * scale
   + min) rounded to nearest even from the fp32 value. */
static void dequantize_panel(const uint8_t *codes, const groups_t *w, int bits, int64_t p,
                             uint16_t *dst)
{
    const int K = w->K, group = w->group, groups = K / group;
    /* word 2n + t of a half takes column n (first half) or 8 + n (second half) */
    const __m512i dup_lo = _mm512_set_epi32(7, 7, 6, 6, 5, 5, 4, 4, 3, 3, 2, 2, 1, 1, 0, 0);
    const __m512i dup_hi = _mm512_add_epi32(dup_lo, _mm512_set1_epi32(8));
    const __m128i nib = _mm_set1_epi8(15);
    __m512 s_lo = _mm512_setzero_ps(), s_hi = s_lo, m_lo = s_lo, m_hi = s_lo;
    for (int k = 0; k < K; k += 2) {
        if (k % group == 0) {
            const int64_t at = (p * groups + k / group) * 16;
            const __m512 s = load16(w->scales, w->halves & 1, at);
            s_lo = _mm512_permutexvar_ps(dup_lo, s), s_hi = _mm512_permutexvar_ps(dup_hi, s);
            if (w->mins) {
                const __m512 m = load16(w->mins, w->halves & 2, at);
                m_lo = _mm512_permutexvar_ps(dup_lo, m), m_hi = _mm512_permutexvar_ps(dup_hi, m);
            }
        }
        __m512 v_lo, v_hi;
        if (bits == 4) {
            /* 8 bytes a k: column j in the low nibble of byte j, column 8 + j in its high one */
            const __m128i x = _mm_loadu_si128((const __m128i *)(codes + (p * K + k) * 8));
            const __m128i lo = _mm_and_si128(x, nib), hi = _mm_and_si128(_mm_srli_epi16(x, 4), nib);
            v_lo = _mm512_cvtepi32_ps(
                _mm512_cvtepu8_epi32(_mm_unpacklo_epi8(lo, _mm_srli_si128(lo, 8))));
            v_hi = _mm512_cvtepi32_ps(
                _mm512_cvtepu8_epi32(_mm_unpacklo_epi8(hi, _mm_srli_si128(hi, 8))));
        } else {
            /* 16 signed bytes a k, column j at byte j */
            const int8_t *src = (const int8_t *)codes + (p * K + k) * 16;
            const __m128i even = _mm_loadu_si128((const __m128i *)src);
            const __m128i odd = _mm_loadu_si128((const __m128i *)(src + 16));
            v_lo = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_unpacklo_epi8(even, odd)));
            v_hi = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_unpackhi_epi8(even, odd)));
        }
        const __m512 w_lo = w->mins ? _mm512_fmadd_ps(v_lo, s_lo, m_lo) : _mm512_mul_ps(v_lo, s_lo);
        const __m512 w_hi = w->mins ? _mm512_fmadd_ps(v_hi, s_hi, m_hi) : _mm512_mul_ps(v_hi, s_hi);
        uint16_t *out = dst + (int64_t)(k / KSTEP) * 512 + (k % KSTEP) / 2 * 32;
        _mm512_store_si512(out, (__m512i)_mm512_cvtne2ps_pbh(w_hi, w_lo));
    }
}

/* MT m-tiles (1 or 2) of A from `at` times NP panels (1 or 2) of B over the whole K; c and
   rows: the first row of the m-tiles in C and how many are real; accumulate: add to C.
   Tiles: C 0-3 (m-tile i, panel j: 2 i + j), A 4-5, B 6-7. The C tiles start from C (or
   zero) and go back to it, in place where all 16 MT rows are real, else through d (the real
   rows copied in and out): a row's sums run in the same order whatever its batch. With GLU
   (panel 0 a gate, panel 1 its up) only silu(gate) * up goes out, 16 columns. */
static inline __attribute__((always_inline)) void block_bf16(
    const uint16_t *at, const uint16_t *const *b, int steps, float *c, int64_t ldc, int rows,
    int accumulate, const int MT, const int NP, const int GLU)
{
    float d[2][16][32] __attribute__((aligned(64))); /* [m-tile][row][2 panels] */
    const int64_t tile_stride = (int64_t)steps * 512; /* uint16 per m-tile */
    const int whole = !GLU && rows >= 16 * MT;
    float *base = whole ? c : &d[0][0][0];
    const int64_t ld = whole ? ldc : 32;
    const size_t stride = (size_t)ld * sizeof(float);
    if (accumulate && !whole)
        for (int i = 0; i < MT; i++)
            for (int r = 0; r < 16; r++)
                for (int j = 0; j < NP; j++) {
                    const int real = 16 * i + r < rows;
                    _mm512_store_ps(d[i][r] + 16 * j, real ? _mm512_loadu_ps(c + (16 * i + r) * ldc + 16 * j)
                                                           : _mm512_setzero_ps());
                }
    if (accumulate) {
        _tile_loadd(0, base, stride);
        if (NP > 1) _tile_loadd(1, base + 16, stride);
        if (MT > 1) _tile_loadd(2, base + 16 * ld, stride);
        if (MT > 1 && NP > 1) _tile_loadd(3, base + 16 * ld + 16, stride);
    } else {
        _tile_zero(0);
        if (NP > 1) _tile_zero(1);
        if (MT > 1) _tile_zero(2);
        if (MT > 1 && NP > 1) _tile_zero(3);
    }
    for (int s = 0; s < steps; s++) {
        _tile_loadd(4, at + (int64_t)s * 512, 64);
        _tile_loadd(6, b[0] + (int64_t)s * 512, 64);
        if (MT > 1) _tile_loadd(5, at + tile_stride + (int64_t)s * 512, 64);
        if (NP > 1) _tile_loadd(7, b[1] + (int64_t)s * 512, 64);
        _tile_dpbf16ps(0, 4, 6);
        if (NP > 1) _tile_dpbf16ps(1, 4, 7);
        if (MT > 1) _tile_dpbf16ps(2, 5, 6);
        if (MT > 1 && NP > 1) _tile_dpbf16ps(3, 5, 7);
    }
    _tile_stored(0, base, stride);
    if (NP > 1) _tile_stored(1, base + 16, stride);
    if (MT > 1) _tile_stored(2, base + 16 * ld, stride);
    if (MT > 1 && NP > 1) _tile_stored(3, base + 16 * ld + 16, stride);
    if (GLU) /* panel 0 gate, panel 1 up: 16 columns of silu(gate) * up, as silu_mul does */
        for (int i = 0; i < MT; i++)
            for (int r = 0; r < 16 && 16 * i + r < rows; r++)
                for (int h = 0; h < 16; h += 8) {
                    const v8 g = load8(d[i][r] + h), u = load8(d[i][r] + 16 + h);
                    store8(c + (16 * i + r) * ldc + h, g / (1.0f + exp8(-g)) * u);
                }
    else if (!whole)
        for (int i = 0; i < MT; i++)
            for (int r = 0; r < 16 && 16 * i + r < rows; r++)
                for (int j = 0; j < NP; j++)
                    _mm512_storeu_ps(c + (16 * i + r) * ldc + 16 * j, _mm512_load_ps(d[i][r] + 16 * j));
}

/* 1 if it computed C, 0 if it declined (no AMX here or refused by the kernel, K not a
   multiple of 32, an odd group, or no memory): then the caller computes C. */
static int quant_amx_bf16(const float *a, int64_t lda, const uint8_t *codes, const void *scales,
                          const void *mins, int halves, int bits, int group, int M, int N, int K,
                          float *c, int64_t ldc, int accumulate, int threads, int glu)
{
    if (K % KSTEP || group % 2 || K % group || N % (glu ? 32 : 16) || !amx_permitted()) return 0;
    const int steps = K / KSTEP, panels = N / 16;
    /* a pair: panels 2 pp and 2 pp + 1, or with glu gate panel pp and its up panel */
    const int pairs = glu ? panels / 2 : (panels + 1) / 2, second = glu ? panels / 2 : 1;
    const int block_tiles = (BF_ROW_BLOCK < M ? BF_ROW_BLOCK : M + 15) / 16;
    const size_t pair_words = (size_t)2 * steps * 512;
    const int sb_pairs = BF_B_BYTES / (int)(pair_words * 2) > 1 ? BF_B_BYTES / (int)(pair_words * 2) : 1;
    static __thread void *a_buf;
    static __thread size_t a_cap;
    uint16_t *abf = grow(&a_buf, &a_cap, (size_t)block_tiles * steps * TILE_BYTES);
    if (!abf) return 0;
    const groups_t w = {scales, mins, K, group, halves};
    /* few panel pairs: the threads split the rows instead, each dequantizing every panel */
    const int by_rows = pairs <= BF_ROW_SPLIT_PAIRS && M >= 64;
    int failed = 0;
#pragma omp parallel num_threads(threads > 0 ? threads : 1) if ((int64_t)M * N * K >= 1 << 16)
    {
        static __thread void *b_buf;
        static __thread size_t b_cap;
        uint16_t *bb = thread_tiles(&b_buf, &b_cap, sb_pairs * pair_words * 2, &failed);
        if (bb) {
            int lo = 0, hi = pairs;
            if (!by_rows) thread_share(pairs, &lo, &hi);
            for (int m0 = 0; m0 < M; m0 += BF_ROW_BLOCK) {
                const int rows = M - m0 < BF_ROW_BLOCK ? M - m0 : BF_ROW_BLOCK;
                const int tiles = (rows + 15) / 16;
                int t_lo = 0, t_hi = (tiles + 1) / 2; /* pairs of m-tiles */
                if (by_rows) {
                    thread_share((tiles + 1) / 2, &t_lo, &t_hi);
                    for (int t = 2 * t_lo; t < 2 * t_hi && t < tiles; t++) {
                        const int valid = rows - 16 * t < 16 ? rows - 16 * t : 16;
                        round_tile(a + (int64_t)(m0 + 16 * t) * lda, lda, valid, K,
                                   abf + (size_t)t * steps * 512);
                    }
                } else {
#pragma omp for schedule(static)
                    for (int t = 0; t < tiles; t++) {
                        const int valid = rows - 16 * t < 16 ? rows - 16 * t : 16;
                        round_tile(a + (int64_t)(m0 + 16 * t) * lda, lda, valid, K,
                                   abf + (size_t)t * steps * 512);
                    }
                }
                for (int sb = lo; sb < hi; sb += sb_pairs) {
                    const int se = hi - sb < sb_pairs ? hi : sb + sb_pairs;
                    for (int pp = sb; pp < se; pp++) {
                        const int64_t first = glu ? pp : 2 * pp;
                        for (int j = 0; j < 2 && first + j * second < panels; j++)
                            dequantize_panel(codes, &w, bits, first + j * second,
                                             bb + (pp - sb) * pair_words + j * steps * 512);
                    }
                    for (int t = 2 * t_lo; t < 2 * t_hi && t < tiles; t += 2) {
                        const uint16_t *at = abf + (size_t)t * steps * 512;
                        const int left = rows - 16 * t;
                        for (int pp = sb; pp < se; pp++) {
                            const int64_t p = 2 * pp;
                            const uint16_t *b[2] = {bb + (pp - sb) * pair_words,
                                                    bb + (pp - sb) * pair_words + steps * 512};
                            float *ct = c + (int64_t)(m0 + 16 * t) * ldc + (glu ? pp : p) * 16;
                            const int two_m = tiles - t > 1, two_p = panels - p > 1;
                            if (glu && two_m)
                                block_bf16(at, b, steps, ct, ldc, left, 0, 2, 2, 1);
                            else if (glu)
                                block_bf16(at, b, steps, ct, ldc, left, 0, 1, 2, 1);
                            else if (two_m && two_p)
                                block_bf16(at, b, steps, ct, ldc, left, accumulate, 2, 2, 0);
                            else if (two_m)
                                block_bf16(at, b, steps, ct, ldc, left, accumulate, 2, 1, 0);
                            else if (two_p)
                                block_bf16(at, b, steps, ct, ldc, left, accumulate, 1, 2, 0);
                            else
                                block_bf16(at, b, steps, ct, ldc, left, accumulate, 1, 1, 0);
                        }
                    }
                }
#pragma omp barrier
            }
            _tile_release();
        }
    }
    return !failed;
}

int splitserve_quant_amx_bf16(const float *a, int64_t lda, const uint8_t *codes,
                              const void *scales, const void *mins, int halves, int bits,
                              int group, int M, int N, int K, float *c, int64_t ldc,
                              int accumulate, int threads)
{
    return quant_amx_bf16(a, lda, codes, scales, mins, halves, bits, group, M, N, K, c, ldc,
                          accumulate, threads, 0);
}

/* out[M, N / 2] = silu(A @ gate^T) * (A @ up^T) in bf16 products, W = [gate; up] [N, K] (N a
   multiple of 32): the gate and up panels of each output panel go through the tiles
   together, and only their product is written. 1 if computed, 0 if declined. */
int32_t splitserve_quant_amx_bf16_silu_mul(
    const float *a, int64_t lda, const uint8_t *codes, const void *scales, const void *mins,
    int32_t halves, int32_t bits, int32_t group, int32_t M, int32_t N, int32_t K, float *out,
    int64_t ldo, int32_t threads)
{
    return quant_amx_bf16(a, lda, codes, scales, mins, halves, bits, group, M, N, K, out, ldo, 0,
                          threads, 1);
}

#else /* no AMX in this build */

int splitserve_quant_amx_bf16(const float *a, int64_t lda, const uint8_t *codes,
                              const void *scales, const void *mins, int halves, int bits,
                              int group, int M, int N, int K, float *c, int64_t ldc,
                              int accumulate, int threads)
{
    (void)a, (void)lda, (void)codes, (void)scales, (void)mins, (void)halves, (void)bits;
    (void)group;
    (void)M, (void)N, (void)K, (void)c, (void)ldc, (void)accumulate, (void)threads;
    return 0;
}

int32_t splitserve_quant_amx_bf16_silu_mul(
    const float *a, int64_t lda, const uint8_t *codes, const void *scales, const void *mins,
    int32_t halves, int32_t bits, int32_t group, int32_t M, int32_t N, int32_t K, float *out,
    int64_t ldo, int32_t threads)
{
    (void)a, (void)lda, (void)codes, (void)scales, (void)mins, (void)halves, (void)bits;
    (void)group, (void)M, (void)N, (void)K, (void)out, (void)ldo, (void)threads;
    return 0;
}

#endif
