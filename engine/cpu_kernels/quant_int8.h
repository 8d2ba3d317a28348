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

/* panels of 16 columns in one buffer of quant_int8_gemm.c */
#if QI8_ISA == 2
#define QI8_PANELS 2
#else
#define QI8_PANELS 1
#endif

/* One buffer of quant_int8_gemm.c: each panel's line at the buffer's first input (64 bytes per
   4 inputs, byte 4 c + j holding column c at input 4 l + j of line l), the scales and mins of
   its groups as fp32 ([QI8_PANELS][groups][16]; no mins: min NULL), over [k0, k0 + kc). */
typedef struct {
    const uint8_t *lines[QI8_PANELS];
    const float *scale, *min;
    int k0, kc;
} qi8_chunk;

/* AMX-int8 (quant_int8_amx.c): 1 where this build has it, the OS grants the tiles and
   splitserve_qi8_amx_enable turned it on; then each thread of a product calls qi8_amx_begin
   once (the tile configuration for blocks of qb), and qi8_amx_rows takes the first rows of a
   row block, a multiple of 16 (it returns how many), of the chunk's np panels. */
int qi8_amx_ready(void);
void qi8_amx_begin(int qb);
int qi8_amx_rows(const qi8_rows *a, const qi8_chunk *ch, int bits, int m0, int rows, float *c,
                 int64_t ldc, int load_c, int np);

/* 1 if it computed C = (or +=) rows x W^T over M rows and N columns, 0 where this kernel does
   not take the weight (the caller runs the few-row kernel). quant_int8_gemm.c. */
int qi8_gemm(const qi8_rows *a, const qi8_weight *w, int M, int N, float *c, int64_t ldc,
             int accumulate, int threads);

#endif
