/*
 * The linear kernel's building block, shared with the other kernels of the library that run
 * matmuls over weights packed the same way (moe.c): one panel of 16 output columns.
 */
#ifndef SPLITSERVE_LINEAR_H
#define SPLITSERVE_LINEAR_H

#include <stdint.h>

#define PANEL 16

/* c[rows, 16] (+)= a[rows, K] @ panel, where panel is one packed [K][16] panel of W^T; rows of
   a are lda apart, rows of c ldc apart; with `accumulate` the product is added to c. */
void splitserve_panel_rows(const float *a, int64_t lda, const float *panel, int rows, int K,
                           float *c, int64_t ldc, int accumulate);

#endif
