/*
 * Linear layer over group-quantized weights: C[M, N] (+)= A[M, K] @ W^T, where W stays packed
 * (engine.model.quant.packing) and is dequantized as it is read. Two code formats:
 *   bits 4: [N / 16][K][8] bytes; byte j of row k holds column j in its low nibble and
 *           column j + 8 in its high one (unsigned codes 0..15);
 *   bits 8: [N / 16][K][16] int8 codes.
 * Both have fp32 scales [N / 16][K / group][16] and optional fp32 mins of the same shape:
 * w = code * scale + min, one fused multiply-add, which for every GGUF type this serves is
 * exactly the value ggml dequantizes (the product code * scale is exact in fp32).
 *
 * The weights go through the same FMAs, in the same order over K, as the fp32 kernel
 * (linear.c) over the dequantized matrix, so the outputs are bit for bit the fp32 path's.
 * Up to TILE_ROWS rows (decode) one tile walks a panel dequantizing in registers; for more
 * rows a thread dequantizes the whole panel into its scratch ([K][16] floats, in L2) and runs
 * the fp32 panel kernel over it: the dequantization is shared by all rows, and the kernel
 * reads the panel from cache instead of memory. Threads split the panels.
 */
#include <stdint.h>
#include <stdlib.h>

#include "linear.h"
#include "vec8.h"

#define ROW_BLOCK 512
#define K_CHUNK 128 /* without scratch: 8 KB of the panel at a time */

typedef uint8_t u8x8 __attribute__((vector_size(8), aligned(1)));
typedef int8_t i8x8 __attribute__((vector_size(8), aligned(1)));

typedef struct {
    const uint8_t *codes;
    const float *scales, *mins; /* mins may be NULL */
    int bits, group, K;
} qweight;

/* The 16 weights of row k of panel p, as two vectors: columns 0..7 and 8..15. The group's
   scale and min vectors are passed in (s0, s1, m0, m1). */
static inline __attribute__((always_inline)) void dequant16(
    const qweight *w, int64_t p, int k, v8 s0, v8 s1, v8 m0, v8 m1, v8 *lo, v8 *hi)
{
    if (w->bits == 4) {
        const u8x8 b = *(const u8x8 *)(w->codes + (p * w->K + k) * 8);
        *lo = __builtin_convertvector(__builtin_convertvector(b & 15, v8i), v8);
        *hi = __builtin_convertvector(__builtin_convertvector(b >> 4, v8i), v8);
    } else {
        const int8_t *row = (const int8_t *)w->codes + (p * w->K + k) * 16;
        *lo = __builtin_convertvector(__builtin_convertvector(*(const i8x8 *)row, v8i), v8);
        *hi = __builtin_convertvector(__builtin_convertvector(*(const i8x8 *)(row + 8), v8i), v8);
    }
    *lo = *lo * s0 + m0;
    *hi = *hi * s1 + m1;
}

static inline void group_vectors(const qweight *w, int64_t p, int g, v8 *s0, v8 *s1, v8 *m0,
                                 v8 *m1)
{
    const int64_t at = (p * (w->K / w->group) + g) * 16;
    *s0 = load8(w->scales + at);
    *s1 = load8(w->scales + at + 8);
    *m0 = w->mins ? load8(w->mins + at) : splat8(0.0f);
    *m1 = w->mins ? load8(w->mins + at + 8) : splat8(0.0f);
}

/* Rows [k0, k1) of panel p dequantized into dst[k1 - k0][16]. */
static void dequant_rows(const qweight *w, int64_t p, int k0, int k1, float *dst)
{
    for (int k = k0; k < k1;) {
        const int g = k / w->group, end = (g + 1) * w->group < k1 ? (g + 1) * w->group : k1;
        v8 s0, s1, m0, m1, lo, hi;
        group_vectors(w, p, g, &s0, &s1, &m0, &m1);
        for (; k < end; k++) {
            dequant16(w, p, k, s0, s1, m0, m1, &lo, &hi);
            store8(dst + (k - k0) * PANEL, lo);
            store8(dst + (k - k0) * PANEL + 8, hi);
        }
    }
}

/* R rows (R <= TILE_ROWS) times panel p over the whole of K, the weights dequantized in
   registers; the sums run in the order of linear.c's tile. */
static inline __attribute__((always_inline)) void qtile(
    const float *a, int64_t lda, const qweight *w, int64_t p, float *c, int64_t ldc,
    int load_c, const int R)
{
    tile_acc t;
    tile_begin(&t, c, ldc, load_c, R);
    for (int g = 0; g < w->K / w->group; g++) {
        v8 s0, s1, m0, m1, b0, b1;
        group_vectors(w, p, g, &s0, &s1, &m0, &m1);
        for (int k = g * w->group; k < (g + 1) * w->group; k++) {
            dequant16(w, p, k, s0, s1, m0, m1, &b0, &b1);
            tile_fma(&t, a, lda, k, b0, b1, R);
        }
    }
    tile_end(&t, c, ldc, R);
}

#if defined(__AVX512F__) && (defined(__clang__) || __GNUC__ >= 12)
/* With AVX-512 a row of a panel is one 16-lane vector: half the dequantizing instructions
   and FMAs per weight. Each lane computes what it does in qtile, so the results are the same
   bit for bit. */
#define QTILE qtile16
typedef float v16 __attribute__((vector_size(64)));
typedef float v16u __attribute__((vector_size(64), aligned(4)));
typedef int32_t v16i __attribute__((vector_size(64)));
typedef int8_t i8x16 __attribute__((vector_size(16), aligned(1)));

static inline __attribute__((always_inline)) v16 dequant16_x16(const qweight *w, int64_t p,
                                                               int k, v16 s, v16 m)
{
    v16i q;
    if (w->bits == 4) {
        const u8x8 b = *(const u8x8 *)(w->codes + (p * w->K + k) * 8);
        q = __builtin_convertvector(
            __builtin_shufflevector(b & 15, b >> 4, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13,
                                    14, 15),
            v16i);
    } else {
        q = __builtin_convertvector(*(const i8x16 *)(w->codes + (p * w->K + k) * 16), v16i);
    }
    return __builtin_convertvector(q, v16) * s + m;
}

static inline __attribute__((always_inline)) void qtile16(
    const float *a, int64_t lda, const qweight *w, int64_t p, float *c, int64_t ldc,
    int load_c, const int R)
{
    v16 acc[TILE_ROWS];
    for (int r = 0; r < R; r++) acc[r] = load_c ? *(const v16u *)(c + r * ldc) : (v16){0};
    for (int g = 0; g < w->K / w->group; g++) {
        const int64_t at = (p * (w->K / w->group) + g) * 16;
        const v16 s = *(const v16u *)(w->scales + at);
        const v16 m = w->mins ? *(const v16u *)(w->mins + at) : (v16){0};
        for (int k = g * w->group; k < (g + 1) * w->group; k++) {
            const v16 b = dequant16_x16(w, p, k, s, m);
            for (int r = 0; r < R; r++) acc[r] += a[r * lda + k] * b;
        }
    }
    for (int r = 0; r < R; r++) *(v16u *)(c + r * ldc) = acc[r];
}
#else
#define QTILE qtile
#endif

static void panel_small(const float *a, int64_t lda, const qweight *w, int64_t p, int rows,
                        float *c, int64_t ldc, int load_c)
{
    switch (rows) {
    case 1: QTILE(a, lda, w, p, c, ldc, load_c, 1); break;
    case 2: QTILE(a, lda, w, p, c, ldc, load_c, 2); break;
    case 3: QTILE(a, lda, w, p, c, ldc, load_c, 3); break;
    case 4: QTILE(a, lda, w, p, c, ldc, load_c, 4); break;
    case 5: QTILE(a, lda, w, p, c, ldc, load_c, 5); break;
    case 6: QTILE(a, lda, w, p, c, ldc, load_c, 6); break;
    default: break;
    }
}

/* A thread's scratch of at least `floats` floats, grown as needed and kept for the next
   call (OpenMP's threads live as long as the process); NULL if memory ran out. */
static float *scratch(size_t floats)
{
    static __thread float *buf;
    static __thread size_t cap;
    if (floats > cap) {
        free(buf);
        buf = aligned_alloc(64, (floats * sizeof(float) + 63) / 64 * 64);
        cap = buf ? floats : 0;
    }
    return buf;
}

/* Panel p for more rows than a tile, dequantized into `panel` ([K][16]) or, where no scratch
   could be had, a chunk at a time into a stack buffer (the partial sums wait in C: fp32
   stores are exact, the sums run in the same order). */
static void panel_rows(const float *a, int64_t lda, const qweight *w, int64_t p, int rows,
                       float *c, int64_t ldc, int accumulate, float *panel)
{
    if (panel) {
        dequant_rows(w, p, 0, w->K, panel);
        splitserve_panel_rows(a, lda, panel, rows, w->K, c, ldc, accumulate);
        return;
    }
    float buf[K_CHUNK * PANEL] __attribute__((aligned(64)));
    for (int k0 = 0; k0 < w->K; k0 += K_CHUNK) {
        const int k1 = w->K - k0 < K_CHUNK ? w->K : k0 + K_CHUNK;
        dequant_rows(w, p, k0, k1, buf);
        splitserve_panel_rows(a + k0, lda, buf, rows, k1 - k0, c, ldc, accumulate || k0 > 0);
    }
}

/* N must be a multiple of 16, `group` of 16 and K of `group` (the packing sees to it). */
void splitserve_linear_quant(
    const float *a, int64_t lda, const uint8_t *codes, const float *scales, const float *mins,
    int32_t bits, int32_t group, int32_t M, int32_t N, int32_t K, float *c, int64_t ldc,
    int32_t accumulate, int32_t threads)
{
    const qweight w = {codes, scales, mins, bits, group, K};
    const int panels = N / PANEL;
    const int parallel = (int64_t)M * N * K >= 1 << 16;
#pragma omp parallel num_threads(threads > 0 ? threads : 1) if (parallel)
    {
        float *panel = M > TILE_ROWS ? scratch((size_t)K * PANEL) : NULL;
        for (int m0 = 0; m0 < M; m0 += ROW_BLOCK) {
            const int rows = M - m0 < ROW_BLOCK ? M - m0 : ROW_BLOCK;
#pragma omp for schedule(static)
            for (int p = 0; p < panels; p++) {
                float *cp = c + m0 * ldc + p * PANEL;
                if (rows <= TILE_ROWS) {
                    panel_small(a + m0 * lda, lda, &w, p, rows, cp, ldc, accumulate);
                } else {
                    panel_rows(a + m0 * lda, lda, &w, p, rows, cp, ldc, accumulate, panel);
                }
            }
        }
    }
}
