/*
 * Linear layer on the CPU, fp32: C[M, N] (+)= A[M, K] @ W^T, with W packed once at load into
 * panels of 16 output columns, [N / 16][K][16], so a panel streams through memory in order.
 * Each micro-tile keeps 6 rows x 16 columns of C in 12 vector registers while it walks K:
 * per step two loads of W, six broadcasts of A, twelve FMAs. Threads split the panels; rows
 * go in blocks of ROW_BLOCK so the rows of A in use stay in cache for large M.
 *
 * On the 2-core dev machine this ran the default model's layers at 150-157 GFLOP/s for 32
 * rows (oneDNN with prepacked weights: 104-120, F.linear: 90-97) and at or above F.linear up
 * to 2048 rows (bench/cpu_kernels.py measures it against the same-run matmul peak).
 */
#include <stdint.h>

#include "vec8.h"

#define PANEL 16
#define TILE_ROWS 6
#define ROW_BLOCK 512

static inline __attribute__((always_inline)) void tile(
    const float *a, int64_t lda, const float *panel, int K, float *c, int64_t ldc,
    int accumulate, const int R)
{
    v8 c0[TILE_ROWS], c1[TILE_ROWS];
    for (int r = 0; r < R; r++) {
        c0[r] = accumulate ? load8(c + r * ldc) : splat8(0.0f);
        c1[r] = accumulate ? load8(c + r * ldc + 8) : splat8(0.0f);
    }
    for (int k = 0; k < K; k++) {
        const v8 b0 = load8(panel + PANEL * k), b1 = load8(panel + PANEL * k + 8);
        for (int r = 0; r < R; r++) {
            const v8 ar = splat8(a[r * lda + k]);
            c0[r] += ar * b0;
            c1[r] += ar * b1;
        }
    }
    for (int r = 0; r < R; r++) {
        store8(c + r * ldc, c0[r]);
        store8(c + r * ldc + 8, c1[r]);
    }
}

static void panel_rows(const float *a, int64_t lda, const float *panel, int rows, int K,
                       float *c, int64_t ldc, int accumulate)
{
    int m = 0;
    for (; m + TILE_ROWS <= rows; m += TILE_ROWS)
        tile(a + m * lda, lda, panel, K, c + m * ldc, ldc, accumulate, TILE_ROWS);
    a += m * lda;
    c += m * ldc;
    switch (rows - m) {
    case 1: tile(a, lda, panel, K, c, ldc, accumulate, 1); break;
    case 2: tile(a, lda, panel, K, c, ldc, accumulate, 2); break;
    case 3: tile(a, lda, panel, K, c, ldc, accumulate, 3); break;
    case 4: tile(a, lda, panel, K, c, ldc, accumulate, 4); break;
    case 5: tile(a, lda, panel, K, c, ldc, accumulate, 5); break;
    default: break;
    }
}

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
            panel_rows(a + m0 * lda, lda, packed + (int64_t)p * K * PANEL, rows, K,
                       c + m0 * ldc + p * PANEL, ldc, accumulate);
    }
}
