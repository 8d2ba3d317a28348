/*
 * Linear layer on the CPU, fp32: C[M, N] (+)= A[M, K] @ W^T, with W packed once at load into
 * panels of 16 output columns, [N / 16][K][16], so a panel streams through memory in order.
 * Each micro-tile keeps TILE_ROWS rows x 16 columns of C in registers while it walks K, at the
 * machine's vector width (vecw.h): with 8 lanes (AVX2, 16 registers) 6 rows in 12 registers,
 * per step two loads of W, six broadcasts of A, twelve FMAs; with 16 lanes (AVX-512, 32
 * registers) 12 rows in 12 registers, one load of W, twelve broadcasts (folded into the FMAs'
 * memory operands), twelve FMAs: twice the rows per pass over a panel for the same registers.
 * Threads split the panels; rows go in blocks of ROW_BLOCK so the rows of A in use stay in
 * cache for large M.
 *
 * Between one tile and CHUNK_MAX_ROWS rows (decode batches, speculative verification) a
 * panel is walked in chunks that every row tile uses while they are in L1, and the first tile
 * of a chunk prefetches the lines PREFETCH_LINES ahead, so the weights stream from memory
 * while the tiles compute. On the 2-core dev machine, over the default model's linear
 * layers (540 MB of fp32 weights) that took 8 rows from 26.4 to 20.5 ms (the memory alone:
 * about 19.5), 16 rows from 37.6 to 31.6 ms, 40 rows from 70.5 to 66.8 ms; one row and 64 and
 * more are as before (one tile over the whole panel). It ran the default model's layers at
 * 150-157 GFLOP/s for 32 rows (oneDNN with prepacked weights: 104-120, F.linear: 90-97) and
 * at or above F.linear up to 2048 rows (bench/cpu_kernels.py measures it against the
 * same-run matmul peak).
 */
#include <stdint.h>

#include "linear.h"
#include "vecw.h"

#define NV (PANEL / VW) /* vectors per row of a panel */
#if VW == 16
#define TILE_ROWS 12
#else
#define TILE_ROWS 6
#endif
#define ROW_BLOCK 512
#define K_CHUNK 64        /* 4 KB of a panel */
#define CHUNK_MAX_ROWS 48 /* from here on the tiles of a panel are compute-bound anyway */
#define PREFETCH_LINES 64 /* a panel's k-th row of 16 floats is one 64-byte line */

static inline __attribute__((always_inline)) void tile(
    const float *a, int64_t lda, const float *panel, int k0, int k1, float *c, int64_t ldc,
    int load_c, const int R, const int PF)
{
    vw acc[TILE_ROWS][NV];
    for (int r = 0; r < R; r++)
        for (int j = 0; j < NV; j++) acc[r][j] = load_c ? loadw(c + r * ldc + j * VW) : splatw(0.0f);
    for (int k = k0; k < k1; k++) {
        vw b[NV];
        for (int j = 0; j < NV; j++) b[j] = loadw(panel + PANEL * k + j * VW);
        if (PF) __builtin_prefetch(panel + PANEL * (k + PREFETCH_LINES));
        for (int r = 0; r < R; r++) {
            const vw ar = splatw(a[r * lda + k]);
            for (int j = 0; j < NV; j++) acc[r][j] += ar * b[j];
        }
    }
    for (int r = 0; r < R; r++)
        for (int j = 0; j < NV; j++) storew(c + r * ldc + j * VW, acc[r][j]);
}

/* Every row tile over columns [k0, k1) of one panel. */
static void chunk_rows(const float *a, int64_t lda, const float *panel, int rows, int k0,
                       int k1, float *c, int64_t ldc, int load_c)
{
    int m = 0;
    /* the first tile requests the lines PREFETCH_LINES ahead: past the panel's end they are
       the next panel's (a thread's panels are contiguous), past the weights' end harmless;
       a single row streams alone, where the hardware prefetcher keeps up */
    if (rows >= TILE_ROWS) {
        tile(a, lda, panel, k0, k1, c, ldc, load_c, TILE_ROWS, 1);
        m = TILE_ROWS;
    }
    for (; m + TILE_ROWS <= rows; m += TILE_ROWS)
        tile(a + m * lda, lda, panel, k0, k1, c + m * ldc, ldc, load_c, TILE_ROWS, 0);
    a += m * lda;
    c += m * ldc;
    switch (rows - m) { /* the last rows: a tile of each height is unrolled on its own */
    case 1: tile(a, lda, panel, k0, k1, c, ldc, load_c, 1, 0); break;
    case 2: tile(a, lda, panel, k0, k1, c, ldc, load_c, 2, 1); break;
    case 3: tile(a, lda, panel, k0, k1, c, ldc, load_c, 3, 1); break;
    case 4: tile(a, lda, panel, k0, k1, c, ldc, load_c, 4, 1); break;
    case 5: tile(a, lda, panel, k0, k1, c, ldc, load_c, 5, 1); break;
#if TILE_ROWS > 6
    case 6: tile(a, lda, panel, k0, k1, c, ldc, load_c, 6, 1); break;
    case 7: tile(a, lda, panel, k0, k1, c, ldc, load_c, 7, 1); break;
    case 8: tile(a, lda, panel, k0, k1, c, ldc, load_c, 8, 1); break;
    case 9: tile(a, lda, panel, k0, k1, c, ldc, load_c, 9, 1); break;
    case 10: tile(a, lda, panel, k0, k1, c, ldc, load_c, 10, 1); break;
    case 11: tile(a, lda, panel, k0, k1, c, ldc, load_c, 11, 1); break;
#endif
    default: break;
    }
}

/* One panel for `rows` rows. Between one tile and CHUNK_MAX_ROWS rows the panel is walked in
   chunks of K_CHUNK that every row tile uses while it is in L1, the first tile requesting the
   next chunk meanwhile: the memory keeps streaming while the tiles compute. (One tile at a
   time over the whole panel read it from memory during the first tile and left the memory
   idle during the others.) The partial sums wait between chunks in `buf`, rows PANEL floats
   apart (C's rows are often a multiple of 4 KB apart and would share a cache set); fp32
   stores are exact, so every element is summed in the same order as in one pass. */
void splitserve_panel_rows(const float *a, int64_t lda, const float *panel, int rows, int K,
                       float *c, int64_t ldc, int accumulate)
{
    if (rows <= TILE_ROWS || rows >= CHUNK_MAX_ROWS) {
        chunk_rows(a, lda, panel, rows, 0, K, c, ldc, accumulate);
        return;
    }
    float buf[CHUNK_MAX_ROWS * PANEL] __attribute__((aligned(64)));
    if (accumulate)
        for (int r = 0; r < rows; r++)
            for (int j = 0; j < PANEL; j++) buf[r * PANEL + j] = c[r * ldc + j];
    for (int k0 = 0; k0 < K; k0 += K_CHUNK) {
        const int k1 = K - k0 < K_CHUNK ? K : k0 + K_CHUNK;
        chunk_rows(a, lda, panel, rows, k0, k1, buf, PANEL, accumulate || k0 > 0);
    }
    for (int r = 0; r < rows; r++)
        for (int j = 0; j < PANEL; j++) c[r * ldc + j] = buf[r * PANEL + j];
}

/* The vector width the kernels were built for (vecw.h): 8 or 16 floats. */
int32_t splitserve_vec_width(void) { return VW; }

/* N must be a multiple of PANEL (the caller packs only such weights). */
void splitserve_linear_f32(
    const float *a, int64_t lda, const float *packed, int32_t M, int32_t N, int32_t K,
    float *c, int64_t ldc, int32_t accumulate, int32_t threads)
{
    const int panels = N / PANEL;
    const int parallel = (int64_t)M * N * K >= 1 << 18;
#pragma omp parallel num_threads(threads > 0 ? threads : 1) if (parallel)
    for (int m0 = 0; m0 < M; m0 += ROW_BLOCK) {
        const int rows = M - m0 < ROW_BLOCK ? M - m0 : ROW_BLOCK;
#pragma omp for schedule(static)
        for (int p = 0; p < panels; p++)
            splitserve_panel_rows(a + m0 * lda, lda, packed + (int64_t)p * K * PANEL, rows, K,
                       c + m0 * ldc + p * PANEL, ldc, accumulate);
    }
}
