/*
 * The packed linear layer (quant_linear.c) on AMX tiles, from as many rows as quant_linear.py
 * sets (AMX_ROWS):
 * C[M, N] (+)= A[M, K] @ W^T with w = code * scale + min per group of `group` (a multiple of
 * 32) along K. Compiled only where the build targets AMX-TILE, AMX-BF16 and AVX512-BF16
 * (-march=native on such a machine); elsewhere splitserve_quant_amx declines and the caller
 * runs its FMA path.
 *
 * Exact products in bf16: a code (0..15 or -128..127) is exact in bf16, and each fp32
 * activation is split into three bf16 terms, hi = bf16(a), mid = bf16(a - hi), lo =
 * bf16(a - hi - mid), whose sum is a (24 significant bits in three 8-bit pieces; only
 * values below 2^-110 or so lose their last bits, which the hardware flushes). TDPBF16PS
 * multiplies those exactly and sums in fp32, so per group g and column n
 *     D[m, n, g] = sum over k in g of a[m, k] * code[n, k]
 * comes out at fp32 accuracy; then, in fp32 vector registers (scales and mins widened from
 * fp16 where the packing stored them so, see quant_linear.c),
 *     C[m, n] += scale[n, g] * D[m, n, g] + min[n, g] * sum over k in g of a[m, k].
 * The result is not bit for bit the FMA path's (the sums run in another order) but within a
 * few fp32 roundings of it.
 *
 * Layout. A row block (AMX_ROW_BLOCK rows) is split once by all threads into tiles
 * [m-tile][k-step][term][16 rows][32 bf16] (1 KB each, K * 96 bytes per 16 rows) with the
 * group sums of each row. Each thread owns a range of panel pairs (32 output columns) and
 * walks it SB_PAIRS pairs at a time, K a k-block (KB_STEPS k-steps of 32) at a time: it
 * unpacks the k-block of their codes into the VNNI bf16 layout of B tiles (32 bytes per
 * code, per thread 64 KB, no second copy of the weights is kept), then for each pair of
 * m-tiles and each panel pair runs per k-step 2 B loads, 6 A loads and 12 TDPBF16PS into 4 C
 * tiles; at the end of each group the C tiles go to memory, and at the end of the k-block
 * they are scaled into C (the partial sums wait in C between k-blocks). A k-block of a pair
 * of m-tiles' activations (24 KB) stays in L1 while it serves the SB_PAIRS panel pairs.
 *
 * On the 2-core dev machine (Xeon with AMX, one thread, loaded by other work), over the
 * default model's gate_up shape (3072 x 576, Q4_1) it ran 200-210 GFLOP/s at 16 rows, 240-260
 * at 32 and 290-340 at 128-512, where the fp32 kernel ran 65-75 and the FMA path 24-70. The
 * tile unit alone would allow about 1100 (3 TDPBF16PS per product at 3.3 TFLOP/s): the rest
 * goes to the per-group stores and scaling (about a third) and unpacking the codes.
 *
 * Where the time goes at 384 rows (the default model's four shapes, Q4_1, one thread, CPU
 * time, same process, the kernel compiled with parts cut out; 2-core dev machine, loaded):
 * whole kernel 8.8-9.2 ms, without the per-group tile stores and scaling 7.7, without them
 * and the unpacking 6.9; the tile products alone (loads included) 5.6, 4.7 without the
 * unpacking; everything but the products 6.9. The tile unit itself runs about 3 TFLOP/s of
 * bf16 per core (4 C tiles, A and B reloaded from L1 or L2 alike), but a store and zero of the
 * C tiles after every k-step halves that (1.5). Tried and dropped, none faster: AMX_ROW_BLOCK
 * 64 / 256, KB_STEPS 2 / 8, SB_PAIRS 4 / 16 (the three can be set with -D to compare); the
 * A and B reloads issued early, between the products; two sets of C tiles taking the groups
 * in turn (2 m-tiles x 1 panel each); the scaling of a block deferred until the next block's
 * products were issued; and, as an upper bound for codes * scale split in two bf16 terms
 * (no per-group stores, 5 products per term pair instead of 3, scaling once a k-block, the
 * heavier unpacking and the min term left out), within 6% of this kernel. Both the tile
 * work and the vector work per group bound it; a gain needs less of both (e.g. int8 tiles,
 * twice the products per instruction, with per-row-and-group activation scales).
 */
#include "amx.h"

#ifdef SPLITSERVE_HAS_AMX

#ifndef AMX_ROW_BLOCK
#define AMX_ROW_BLOCK 128 /* rows split at a time: 128 * K * 6 bytes, in L2 */
#endif
#ifndef KB_STEPS
#define KB_STEPS 4 /* k-steps in a k-block (fewer where a group is longer) */
#endif
#ifndef SB_PAIRS
#define SB_PAIRS 8 /* panel pairs whose k-block of codes is unpacked at a time */
#endif

/* 16 rows (`valid` of them real, the rest zero) of A from k = 0 into the tiles of one m-tile,
   [k-step][term][16][32] bf16, and the rows' sums over each group into sums[g][16]. */
static void split_tile(const float *a, int64_t lda, int valid, int K, int group, uint16_t *dst,
                       float *sums)
{
    const int steps = K / KSTEP, per_group = group / KSTEP;
    for (int r = 0; r < 16; r++) {
        float sum = 0.0f;
        for (int s = 0; s < steps; s++) {
            uint16_t *out = dst + (int64_t)s * 3 * 512 + r * 32;
            __m512 v[2] = {_mm512_setzero_ps(), _mm512_setzero_ps()};
            if (r < valid) {
                v[0] = _mm512_loadu_ps(a + r * lda + s * KSTEP);
                v[1] = _mm512_loadu_ps(a + r * lda + s * KSTEP + 16);
                sum += _mm512_reduce_add_ps(_mm512_add_ps(v[0], v[1]));
            }
            for (int h = 0; h < 2; h++) {
                __m512 rest = v[h];
                for (int t = 0; t < 3; t++) {
                    const __m256i bits = bf16_bits(rest);
                    _mm256_storeu_si256((__m256i *)(out + t * 512 + h * 16), bits);
                    rest = _mm512_sub_ps(rest, bf16_value(bits));
                }
            }
            if ((s + 1) % per_group == 0) {
                sums[(s / per_group) * 16 + r] = sum;
                sum = 0.0f;
            }
        }
    }
}

/* The bytes of bf16(c) for codes c = 0..15 (small integers are exact in bf16), and which
   code's byte each output byte of a pair row takes (see unpack_codes). */
static const uint8_t bf16_low[64] __attribute__((aligned(64))) = {
    0, 128, 0, 64, 128, 160, 192, 224, 0, 16, 32, 48, 64, 80, 96, 112,
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
};
static const uint8_t bf16_high[64] __attribute__((aligned(64))) = {
    0, 63, 64, 64, 64, 64, 64, 64, 65, 65, 65, 65, 65, 65, 65, 65,
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
};
static const uint8_t pick_even[64] __attribute__((aligned(64))) = {
    0, 64, 8, 72, 1, 65, 9, 73, 2, 66, 10, 74, 3, 67, 11, 75,
    4, 68, 12, 76, 5, 69, 13, 77, 6, 70, 14, 78, 7, 71, 15, 79,
    32, 96, 40, 104, 33, 97, 41, 105, 34, 98, 42, 106, 35, 99, 43, 107,
    36, 100, 44, 108, 37, 101, 45, 109, 38, 102, 46, 110, 39, 103, 47, 111,
};

/* `pairs` pair rows (even) of panel p's codes from k = k0 as B tiles, [pair row][16 columns
   x 2] bf16: pair row i holds (column n, k = k0 + 2i + t) at 2n + t. */
static void unpack_codes(const uint8_t *codes, int bits, int64_t p, int K, int k0, int pairs,
                         uint16_t *dst)
{
    if (bits == 4) {
        /* Two pair rows at a time from 32 bytes (4 values of k, 8 bytes each: columns 0-7 in
           the low nibbles, 8-15 in the high ones). The 64 codes, low nibbles then high, index
           tables of bf16's low and high bytes; each output byte then picks its code's byte
           from one of the two (+64: the high bytes; +16: the second pair row). */
        const __m512i tl = _mm512_load_si512(bf16_low), th = _mm512_load_si512(bf16_high);
        const __m512i p0 = _mm512_load_si512(pick_even);
        const __m512i p1 = _mm512_add_epi8(p0, _mm512_set1_epi8(16));
        const __m256i nib = _mm256_set1_epi8(15);
        const uint8_t *src = codes + (p * K + k0) * 8;
        for (int i = 0; i < pairs; i += 2) {
            const __m256i x = _mm256_loadu_si256((const __m256i *)(src + i * 16));
            const __m512i c = _mm512_inserti64x4(
                _mm512_castsi256_si512(_mm256_and_si256(x, nib)),
                _mm256_and_si256(_mm256_srli_epi16(x, 4), nib), 1);
            const __m512i l = _mm512_permutexvar_epi8(c, tl), h = _mm512_permutexvar_epi8(c, th);
            _mm512_store_si512(dst + i * 32, _mm512_permutex2var_epi8(l, p0, h));
            _mm512_store_si512(dst + i * 32 + 32, _mm512_permutex2var_epi8(l, p1, h));
        }
    } else {
        /* bytes 0-15: k even, columns 0-15; bytes 16-31: k odd; word w of the output takes
           column w / 2 of k parity w % 2 */
        const __m512i idx = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25,
                                             9, 24, 8, 23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2,
                                             17, 1, 16, 0);
        const int8_t *src = (const int8_t *)codes + (p * K + k0) * 16;
        for (int i = 0; i < pairs; i++) {
            const __m128i *row = (const __m128i *)(src + i * 32);
            const __m512 even = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(row)));
            const __m512 odd = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(row + 1)));
            const __m512i both = (__m512i)_mm512_cvtne2ps_pbh(odd, even); /* even: words 0-15 */
            _mm512_store_si512(dst + i * 32, _mm512_permutexvar_epi16(idx, both));
        }
    }
}

/* MT m-tiles (1 or 2) from `at` (tiles of split_tile, whole K) times NP panels (1 or 2) from
   p over the k-steps [s0, s0 + ks) (whole groups), whose B tiles are b[NP] ([ks][512]); c and
   rows: the first row of the m-tiles in C and how many are real; load_c: start from C (else
   zero). Tiles: C 0-3 (m-tile i, panel j: 2 i + j), A 4-5, B 6-7. Each group's sums go to
   memory (d) as they finish and are scaled into the accumulators once the k-block is done. */
static inline __attribute__((always_inline)) void block(
    const uint16_t *at, const float *sums, const uint16_t *const *b, const groups_t *w,
    int64_t p, int s0, int ks, float *c, int64_t ldc, int rows, int load_c, const int MT,
    const int NP)
{
    float d[KB_STEPS][4][16][16] __attribute__((aligned(64)));
    const int steps = w->K / KSTEP, per_group = w->group / KSTEP, groups = w->K / w->group;
    const int64_t tile_stride = (int64_t)steps * 3 * 512; /* uint16 per m-tile */
    const int g0 = s0 / per_group, ng = ks / per_group;
    for (int e = 0; e < ng; e++) {
        _tile_zero(0);
        if (NP > 1) _tile_zero(1);
        if (MT > 1) _tile_zero(2);
        if (MT > 1 && NP > 1) _tile_zero(3);
        for (int s = e * per_group; s < (e + 1) * per_group; s++) {
            const uint16_t *as = at + (int64_t)(s0 + s) * 3 * 512;
            _tile_loadd(6, b[0] + s * 512, 64);
            if (NP > 1) _tile_loadd(7, b[1] + s * 512, 64);
            for (int t = 0; t < 3; t++) {
                _tile_loadd(4, as + t * 512, 64);
                if (MT > 1) _tile_loadd(5, as + tile_stride + t * 512, 64);
                _tile_dpbf16ps(0, 4, 6);
                if (NP > 1) _tile_dpbf16ps(1, 4, 7);
                if (MT > 1) _tile_dpbf16ps(2, 5, 6);
                if (MT > 1 && NP > 1) _tile_dpbf16ps(3, 5, 7);
            }
        }
        _tile_stored(0, d[e][0], 64);
        if (NP > 1) _tile_stored(1, d[e][1], 64);
        if (MT > 1) _tile_stored(2, d[e][2], 64);
        if (MT > 1 && NP > 1) _tile_stored(3, d[e][3], 64);
    }
    for (int j = 0; j < NP; j++) {
        __m512 scale[KB_STEPS], min[KB_STEPS];
        for (int e = 0; e < ng; e++) {
            const int64_t at_g = ((p + j) * groups + g0 + e) * 16;
            scale[e] = load16(w->scales, w->halves & 1, at_g);
            min[e] = w->mins ? load16(w->mins, w->halves & 2, at_g) : _mm512_setzero_ps();
        }
        for (int i = 0; i < MT; i++) {
            const float *sum = sums + ((int64_t)i * groups + g0) * 16;
            for (int r = 0; r < 16 && 16 * i + r < rows; r++) {
                float *cr = c + (16 * i + r) * ldc + 16 * j;
                __m512 v = load_c ? _mm512_loadu_ps(cr) : _mm512_setzero_ps();
                for (int e = 0; e < ng; e++) {
                    v = _mm512_fmadd_ps(_mm512_load_ps(d[e][2 * i + j][r]), scale[e], v);
                    if (w->mins) v = _mm512_fmadd_ps(_mm512_set1_ps(sum[e * 16 + r]), min[e], v);
                }
                _mm512_storeu_ps(cr, v);
            }
        }
    }
}

int32_t splitserve_amx_available(void) { return amx_permitted(); }

/* 1 if it computed C, 0 if it declined (no AMX here or refused by the kernel, a group that
   is not a multiple of 32, or no memory): then the caller computes C. */
int splitserve_quant_amx(const float *a, int64_t lda, const uint8_t *codes, const void *scales,
                         const void *mins, int halves, int bits, int group, int M, int N, int K,
                         float *c, int64_t ldc, int accumulate, int threads)
{
    if (group % KSTEP || K % group || N % 16 || !amx_permitted()) return 0;
    const int steps = K / KSTEP, groups = K / group, panels = N / 16, pairs = (panels + 1) / 2;
    const int per_group = group / KSTEP;
    const int kb_steps = (per_group >= KB_STEPS ? 1 : KB_STEPS / per_group) * per_group;
    const int block_tiles = (AMX_ROW_BLOCK < M ? AMX_ROW_BLOCK : M + 15) / 16;
    static __thread void *split_buf, *sums_buf;
    static __thread size_t split_cap, sums_cap;
    uint16_t *split = grow(&split_buf, &split_cap, (size_t)block_tiles * steps * 3 * TILE_BYTES);
    float *sums = grow(&sums_buf, &sums_cap, (size_t)block_tiles * groups * 16 * sizeof(float));
    if (!split || !sums) return 0;
    const groups_t w = {scales, mins, K, group, halves};
    int failed = 0;
#pragma omp parallel num_threads(threads > 0 ? threads : 1) if ((int64_t)M * N * K >= 1 << 16)
    {
        static __thread void *b_buf;
        static __thread size_t b_cap;
        const size_t pair_words = (size_t)2 * kb_steps * 512;
        uint16_t *bb = thread_tiles(&b_buf, &b_cap, SB_PAIRS * pair_words * 2, &failed);
        if (bb) {
            int lo, hi;
            thread_share(pairs, &lo, &hi);
            for (int m0 = 0; m0 < M; m0 += AMX_ROW_BLOCK) {
                const int rows = M - m0 < AMX_ROW_BLOCK ? M - m0 : AMX_ROW_BLOCK;
                const int tiles = (rows + 15) / 16;
#pragma omp for schedule(static)
                for (int t = 0; t < tiles; t++) {
                    const int valid = rows - 16 * t < 16 ? rows - 16 * t : 16;
                    split_tile(a + (int64_t)(m0 + 16 * t) * lda, lda, valid, K, group,
                               split + (size_t)t * steps * 3 * 512, sums + (size_t)t * groups * 16);
                }
                /* a thread's panel pairs, SB_PAIRS at a time: each k-block of their codes is
                   unpacked once for all the row tiles, and each k-block of a row tile pair's
                   activations serves all SB_PAIRS pairs from L1 */
                for (int sb = lo; sb < hi; sb += SB_PAIRS) {
                    const int se = hi - sb < SB_PAIRS ? hi : sb + SB_PAIRS;
                    for (int s0 = 0; s0 < steps; s0 += kb_steps) {
                        const int ks = steps - s0 < kb_steps ? steps - s0 : kb_steps;
                        for (int pp = sb; pp < se; pp++)
                            for (int j = 0; j < 2 && 2 * pp + j < panels; j++)
                                unpack_codes(codes, bits, 2 * pp + j, K, s0 * KSTEP, ks * 16,
                                             bb + (pp - sb) * pair_words + j * kb_steps * 512);
                        const int load_c = accumulate || s0 > 0;
                        for (int t = 0; t < tiles; t += 2) {
                            const uint16_t *at = split + (size_t)t * steps * 3 * 512;
                            const float *st = sums + (size_t)t * groups * 16;
                            const int left = rows - 16 * t;
                            for (int pp = sb; pp < se; pp++) {
                                const int64_t p = 2 * pp;
                                const uint16_t *b[2] = {bb + (pp - sb) * pair_words,
                                                        bb + (pp - sb) * pair_words + kb_steps * 512};
                                float *ct = c + (int64_t)(m0 + 16 * t) * ldc + p * 16;
                                const int two_m = tiles - t > 1, two_p = panels - p > 1;
                                if (two_m && two_p)
                                    block(at, st, b, &w, p, s0, ks, ct, ldc, left, load_c, 2, 2);
                                else if (two_m)
                                    block(at, st, b, &w, p, s0, ks, ct, ldc, left, load_c, 2, 1);
                                else if (two_p)
                                    block(at, st, b, &w, p, s0, ks, ct, ldc, left, load_c, 1, 2);
                                else
                                    block(at, st, b, &w, p, s0, ks, ct, ldc, left, load_c, 1, 1);
                            }
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

#else /* no AMX in this build */

int32_t splitserve_amx_available(void) { return 0; }

int splitserve_quant_amx(const float *a, int64_t lda, const uint8_t *codes, const void *scales,
                         const void *mins, int halves, int bits, int group, int M, int N, int K,
                         float *c, int64_t ldc, int accumulate, int threads)
{
    (void)a, (void)lda, (void)codes, (void)scales, (void)mins, (void)halves, (void)bits;
    (void)group;
    (void)M, (void)N, (void)K, (void)c, (void)ldc, (void)accumulate, (void)threads;
    return 0;
}

#endif
