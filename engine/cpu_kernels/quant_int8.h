/*
 * What the integer-dot kernels share (quant_int8.c: rounding the rows and products of a few
 * rows; quant_int8_gemm.c: products of many rows): the ISA this build targets and the rounded
 * activations.
 */
#ifndef SPLITSERVE_QUANT_INT8_H
#define SPLITSERVE_QUANT_INT8_H

#include <stdint.h>
#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

#include "vecw.h"

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__) && VW == 16
#define QI8_ISA 2
#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define QI8_ISA 1
#else
#define QI8_ISA 0
#endif

/* The rows of A rounded to int8 per block of qb inputs: q [M][K], the block scales d
   [M][K / qb], the blocks' sums of q [M][K / qb] and, per weight group, the sum over its
   blocks of d * sum(q) [M][K / group] (what the group's min multiplies). */
typedef struct {
    const int8_t *q;
    const float *d;
    const int32_t *sums;
    const float *dsum;
    int K, qb, group;
} qi8_rows;

/* The packed weight in the kernels' lines (quant_int8.py repack_codes). */
typedef struct {
    const uint8_t *codes;
    const void *scales, *mins;
    int bits, group, halves;
} qi8_weight;

/* four int8 activations as one int32, to broadcast */
static inline int32_t qi8_four(const int8_t *q)
{
    int32_t v;
    memcpy(&v, q, sizeof v);
    return v;
}

#if QI8_ISA > 0
/* 16 scales or mins from element `at` of p (fp16 where `half`) as fp32, into f */
static inline void qi8_params16(const void *p, int half, int64_t at, float *f)
{
    if (!half) {
        memcpy(f, (const float *)p + at, 16 * sizeof(float));
        return;
    }
    const uint16_t *h = (const uint16_t *)p + at;
    for (int i = 0; i < 16; i += 8)
        _mm256_storeu_ps(f + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(h + i))));
}
#endif

/* 1 if it computed C = (or +=) rows x W^T over M rows and N columns, 0 where this kernel does
   not take the weight (the caller runs the few-row kernel). quant_int8_gemm.c. */
int qi8_gemm(const qi8_rows *a, const qi8_weight *w, int M, int N, float *c, int64_t ldc,
             int accumulate, int threads);

#endif
