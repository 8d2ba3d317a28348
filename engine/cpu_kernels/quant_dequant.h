/*
 * Packed weights (engine.model.quant.packing) dequantized in registers, shared by the kernels
 * that read them (quant_linear.c, quant_prefill.c): the weight's description, fp16 scales and
 * mins widened to fp32, codes widened to floats, and w = code * scale + min (one FMA, exact
 * for every GGUF type served) a panel row or a run of rows at a time.
 */
#ifndef SPLITSERVE_QUANT_DEQUANT_H
#define SPLITSERVE_QUANT_DEQUANT_H

#include <stdint.h>

#include "linear.h"
#include "vecw.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

#define NV (PANEL / VW) /* vectors per row of a panel */

typedef int32_t vwi __attribute__((vector_size(VW * 4)));
typedef int8_t i8w __attribute__((vector_size(VW), aligned(1)));
typedef uint8_t u8x8 __attribute__((vector_size(8), aligned(1)));

typedef struct {
    const uint8_t *codes;
    const void *scales, *mins; /* mins may be NULL */
    int bits, group, K, halves; /* halves: bit 0 fp16 scales, bit 1 fp16 mins */
} qweight;

#define HALF_SCALES 1
#define HALF_MINS 2

/* An fp16 value as fp32 (exact), for builds without F16C. */
static inline float half_to_float(uint16_t h)
{
    const uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 31, man = h & 0x3ff;
    union {
        uint32_t u;
        float f;
    } v;
    if (exp == 0) { /* zero or subnormal: man * 2^-24, exact in fp32 */
        v.f = (float)man * 5.9604644775390625e-08f;
        v.u |= sign;
    } else if (exp == 31) {
        v.u = sign | 0x7f800000u | (man << 13);
    } else {
        v.u = sign | ((exp + 112) << 23) | (man << 13);
    }
    return v.f;
}

/* VW scales or mins from element `at` of p (fp16 where `half`), as fp32. */
static inline __attribute__((always_inline)) vw load_param(const void *p, int half, int64_t at)
{
    if (!half) return loadw((const float *)p + at);
    const uint16_t *h = (const uint16_t *)p + at;
#if defined(__AVX512F__) && VW == 16
    return (vw)_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)h));
#else
    float f[VW] __attribute__((aligned(64)));
#ifdef __F16C__
    for (int i = 0; i < VW; i += 8) _mm256_store_ps(f + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(h + i))));
#else
    for (int i = 0; i < VW; i++) f[i] = half_to_float(h[i]);
#endif
    return loadw(f);
#endif
}

/* Bytes to floats: GCC 12 turns __builtin_convertvector from 8 or 16 bytes into a byte at a
   time (it took a one-row product to 6x the fp32 kernel's time), so x86 builds widen with
   the instructions for it; the values are the same. */
#if defined(__AVX512F__) && VW == 16
static inline __attribute__((always_inline)) vw widen_u8(__m128i b)
{
    return (vw)_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(b));
}
static inline __attribute__((always_inline)) vw widen_i8(__m128i b)
{
    return (vw)_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(b));
}
#define WIDEN_X86 1
#elif defined(__AVX2__) && VW == 8
static inline __attribute__((always_inline)) vw widen_u8(__m128i b)
{
    return (vw)_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(b));
}
static inline __attribute__((always_inline)) vw widen_i8(__m128i b)
{
    return (vw)_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b));
}
#define WIDEN_X86 1
#endif

/* 4-bit codes of one panel row: byte j holds column j (low nibble) and j + 8 (high). */
static inline __attribute__((always_inline)) void nibbles(const uint8_t *row, vw *q)
{
#ifdef WIDEN_X86
    const __m128i b = _mm_loadl_epi64((const __m128i *)row);
    const __m128i lo = _mm_and_si128(b, _mm_set1_epi8(15));
    const __m128i hi = _mm_and_si128(_mm_srli_epi16(b, 4), _mm_set1_epi8(15));
#if VW == 16
    q[0] = widen_u8(_mm_unpacklo_epi64(lo, hi));
#else
    q[0] = widen_u8(lo);
    q[1] = widen_u8(hi);
#endif
#else
    const u8x8 b = *(const u8x8 *)row;
    const u8x8 lo = b & 15, hi = b >> 4;
#if VW == 8
    q[0] = __builtin_convertvector(__builtin_convertvector(lo, vwi), vw);
    q[1] = __builtin_convertvector(__builtin_convertvector(hi, vwi), vw);
#elif defined(__clang__) || __GNUC__ >= 12
    q[0] = __builtin_convertvector(
        __builtin_convertvector(__builtin_shufflevector(lo, hi, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10,
                                                        11, 12, 13, 14, 15),
                                vwi),
        vw);
#else
    for (int j = 0; j < 8; j++) {
        q[0][j] = lo[j];
        q[0][j + 8] = hi[j];
    }
#endif
#endif
}

/* Row k of panel p, w = code * scale + min, as NV vectors; s and m: the group's scales and
   mins (NV vectors each). */
static inline __attribute__((always_inline)) void dequant_row(const qweight *w, int64_t p,
                                                              int k, const vw *s, const vw *m,
                                                              vw *b)
{
    if (w->bits == 4) {
        nibbles(w->codes + (p * w->K + k) * 8, b);
    } else {
        const int8_t *row = (const int8_t *)w->codes + (p * w->K + k) * 16;
#ifdef WIDEN_X86
        for (int j = 0; j < NV; j++)
            b[j] = widen_i8(VW == 16 ? _mm_loadu_si128((const __m128i *)(row + j * VW))
                                     : _mm_loadl_epi64((const __m128i *)(row + j * VW)));
#else
        for (int j = 0; j < NV; j++)
            b[j] = __builtin_convertvector(__builtin_convertvector(*(const i8w *)(row + j * VW), vwi), vw);
#endif
    }
    for (int j = 0; j < NV; j++) b[j] = b[j] * s[j] + m[j];
}

/* The scales and mins of group g of panel p (zero mins where there are none). */
static inline __attribute__((always_inline)) void group_vectors(const qweight *w, int64_t p,
                                                                int g, vw *s, vw *m)
{
    const int64_t at = (p * (w->K / w->group) + g) * 16;
    for (int j = 0; j < NV; j++) {
        s[j] = load_param(w->scales, w->halves & HALF_SCALES, at + j * VW);
        m[j] = w->mins ? load_param(w->mins, w->halves & HALF_MINS, at + j * VW) : splatw(0.0f);
    }
}

/* Rows [k0, k1) of panel p dequantized into dst[k1 - k0][16]. */
static inline void dequant_rows(const qweight *w, int64_t p, int k0, int k1, float *dst)
{
    for (int k = k0; k < k1;) {
        const int g = k / w->group, end = (g + 1) * w->group < k1 ? (g + 1) * w->group : k1;
        vw s[NV], m[NV], b[NV];
        group_vectors(w, p, g, s, m);
        for (; k < end; k++) {
            dequant_row(w, p, k, s, m, b);
            for (int j = 0; j < NV; j++) storew(dst + (k - k0) * PANEL + j * VW, b[j]);
        }
    }
}

#endif
