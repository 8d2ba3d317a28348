/*
 * Vectors of the machine's width for the CPU kernels: 16 floats where the build targets
 * AVX-512 (one zmm register), 8 otherwise (AVX/AVX2 ymm, or NEON pairs on arm64), as GCC/Clang
 * generic vectors. SPLITSERVE_VEC_WIDTH overrides the choice (8 or 16): the tests build the
 * other width too, which a narrower machine runs as pairs of registers, so each width's code
 * is checked on whatever machine runs the tests.
 */
#ifndef SPLITSERVE_VECW_H
#define SPLITSERVE_VECW_H

#include <stdint.h>

#ifndef SPLITSERVE_VEC_WIDTH
#if defined(__AVX512F__)
#define SPLITSERVE_VEC_WIDTH 16
#else
#define SPLITSERVE_VEC_WIDTH 8
#endif
#endif
#if SPLITSERVE_VEC_WIDTH != 8 && SPLITSERVE_VEC_WIDTH != 16
#error "SPLITSERVE_VEC_WIDTH must be 8 or 16"
#endif
#define VW SPLITSERVE_VEC_WIDTH

typedef float vw __attribute__((vector_size(VW * 4)));
typedef float vwu __attribute__((vector_size(VW * 4), aligned(4))); /* unaligned access */

static inline vw loadw(const float *p) { return *(const vwu *)p; }
static inline void storew(float *p, vw v) { *(vwu *)p = v; }
/* x - 0 is x for every x (0 + x is not, for -0): the subtraction folds away, a broadcast is left */
static inline vw splatw(float x) { return x - (vw){0}; }

#endif
