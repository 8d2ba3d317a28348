/*
 * The linear kernel's building blocks, shared with the other kernels of the library that run
 * matmuls over weights packed the same way (moe.c, quant_linear.c): one panel of 16 output
 * columns, and the micro-tile's accumulators.
 */
#ifndef SPLITSERVE_LINEAR_H
#define SPLITSERVE_LINEAR_H

#include <stdint.h>

#include "vec8.h"

#define PANEL 16
#define TILE_ROWS 6 /* rows of C a micro-tile keeps in registers */

/* A micro-tile's accumulators: R rows x 16 columns of C, two vectors a row. */
typedef struct {
    v8 lo[TILE_ROWS], hi[TILE_ROWS];
} tile_acc;

/* The accumulators loaded from c (rows ldc apart), or zero. */
static inline __attribute__((always_inline)) void tile_begin(tile_acc *t, const float *c,
                                                             int64_t ldc, int load_c, const int R)
{
    for (int r = 0; r < R; r++) {
        t->lo[r] = load_c ? load8(c + r * ldc) : splat8(0.0f);
        t->hi[r] = load_c ? load8(c + r * ldc + 8) : splat8(0.0f);
    }
}

/* acc[r] += a[r, k] * (b0, b1): row k of a panel times column k of R rows of A. */
static inline __attribute__((always_inline)) void tile_fma(tile_acc *t, const float *a,
                                                           int64_t lda, int k, v8 b0, v8 b1,
                                                           const int R)
{
    for (int r = 0; r < R; r++) {
        const v8 ar = splat8(a[r * lda + k]);
        t->lo[r] += ar * b0;
        t->hi[r] += ar * b1;
    }
}

static inline __attribute__((always_inline)) void tile_end(const tile_acc *t, float *c,
                                                           int64_t ldc, const int R)
{
    for (int r = 0; r < R; r++) {
        store8(c + r * ldc, t->lo[r]);
        store8(c + r * ldc + 8, t->hi[r]);
    }
}

/* c[rows, 16] (+)= a[rows, K] @ panel, where panel is one packed [K][16] panel of W^T; rows of
   a are lda apart, rows of c ldc apart; with `accumulate` the product is added to c. */
void splitserve_panel_rows(const float *a, int64_t lda, const float *panel, int rows, int K,
                           float *c, int64_t ldc, int accumulate);

#endif
