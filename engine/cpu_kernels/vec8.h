/*
 * 8-float vectors for the CPU kernels: GCC/Clang generic vectors, which become AVX/AVX2
 * registers on x86-64 and pairs of NEON registers on arm64. Shared by the kernel sources.
 */
#ifndef SPLITSERVE_VEC8_H
#define SPLITSERVE_VEC8_H

#include <stdint.h>
#include <string.h>

typedef float v8 __attribute__((vector_size(32)));
typedef int32_t v8i __attribute__((vector_size(32)));
typedef float v8u __attribute__((vector_size(32), aligned(4))); /* unaligned access */

/* bf16 <-> fp32 (the quantized KV cache's scales, engine.kv.quant): round to nearest even,
   as torch's float -> bfloat16 (NaN is never a scale) */
static inline uint16_t bf16_of(float x)
{
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}
static inline float f32_of_bf16(uint16_t h)
{
    const uint32_t u = (uint32_t)h << 16;
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
}

static inline v8 load8(const float *p) { return *(const v8u *)p; }
static inline void store8(float *p, v8 v) { *(v8u *)p = v; }
static inline v8 splat8(float x) { return (v8){x, x, x, x, x, x, x, x}; }

/* a where mask is set, else b (mask lanes are all ones or zero, as comparisons give) */
static inline v8 select8(v8i mask, v8 a, v8 b) {
    return (v8)(((v8i)a & mask) | ((v8i)b & ~mask));
}

static inline float hsum8(v8 v) {
    return ((v[0] + v[4]) + (v[1] + v[5])) + ((v[2] + v[6]) + (v[3] + v[7]));
}

/* r[i] = sum of the lanes of a[i], for 8 vectors at once (a transpose-and-add tree). */
static inline v8 hsum8x8(const v8 *a) {
#if defined(__clang__) || (defined(__GNUC__) && __GNUC__ >= 12)
#define SHUF __builtin_shufflevector
    v8 s[4], u[2];
    for (int i = 0; i < 4; i++)
        s[i] = SHUF(a[2 * i], a[2 * i + 1], 0, 8, 1, 9, 4, 12, 5, 13) +
               SHUF(a[2 * i], a[2 * i + 1], 2, 10, 3, 11, 6, 14, 7, 15);
    for (int i = 0; i < 2; i++)
        u[i] = SHUF(s[2 * i], s[2 * i + 1], 0, 1, 8, 9, 4, 5, 12, 13) +
               SHUF(s[2 * i], s[2 * i + 1], 2, 3, 10, 11, 6, 7, 14, 15);
    return SHUF(u[0], u[1], 0, 1, 2, 3, 8, 9, 10, 11) + SHUF(u[0], u[1], 4, 5, 6, 7, 12, 13, 14, 15);
#undef SHUF
#else
    v8 r;
    for (int i = 0; i < 8; i++) r[i] = hsum8(a[i]);
    return r;
#endif
}

/* e^x per lane, x clamped to [-87, 88]: 2^n * e^f with n = round(x log2 e), |f| <= ln2 / 2,
   and a degree-7 Taylor polynomial for e^f. Relative error below 2e-7. Defined for a float
   vector type V, its int32 vector type VI and their splat / select (vecw.h's width uses it
   too). */
#define SPLITSERVE_DEFINE_EXP(NAME, V, VI, SPLAT, SELECT)                                    \
    static inline V NAME(V x) {                                                            \
        x = SELECT(x < SPLAT(-87.0f), SPLAT(-87.0f), x);                                   \
        x = SELECT(x > SPLAT(88.0f), SPLAT(88.0f), x);                                     \
        const V t = x * 1.4426950408889634f + 0.5f;                                        \
        VI n = __builtin_convertvector(t, VI); /* truncates toward zero ... */             \
        n += (VI)(__builtin_convertvector(n, V) > t); /* ... so step down below zero */    \
        const V f = (x * 1.4426950408889634f - __builtin_convertvector(n, V)) *            \
                    0.6931471805599453f;                                                   \
        V p = SPLAT(1.0f / 5040);                                                          \
        p = 1.0f / 720 + f * p;                                                            \
        p = 1.0f / 120 + f * p;                                                            \
        p = 1.0f / 24 + f * p;                                                             \
        p = 1.0f / 6 + f * p;                                                              \
        p = 0.5f + f * p;                                                                  \
        p = 1.0f + f * p;                                                                  \
        p = 1.0f + f * p;                                                                  \
        return p * (V)((n + 127) << 23);                                                   \
    }

SPLITSERVE_DEFINE_EXP(exp8, v8, v8i, splat8, select8)

static inline float exp1(float x) { return exp8(splat8(x))[0]; }

/* The factor a softmax row's accumulator is multiplied by: 1 / its denominator, the row's
   running max m and sum l (exponentials taken against m), with an attention sink's logit
   (gpt-oss: one more term, attending to nothing) when sink is not NULL. */
static inline float softmax_inv(float m, float l, const float *sink)
{
    if (!sink) return l > 0.0f ? 1.0f / l : 0.0f;
    const float top = *sink > m ? *sink : m, c = exp1(m - top);
    return c / (l * c + exp1(*sink - top));
}

#endif
