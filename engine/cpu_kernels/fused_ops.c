/*
 * Element-wise steps of a decoder layer on the CPU, fp32, each one pass over its data where
 * torch takes several ops (and as many small allocations): rotary embedding plus the KV
 * cache write, and SiLU(gate) * up. Built with paged_attention.c into one library.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "vec8.h"

/* Below this many elements the work runs on the calling thread: waking the pool costs more. */
#define PARALLEL_MIN 16384

/* Rotate-half RoPE in place on the q and k heads of each token's row of qkv
   ([heads | kv_heads | kv_heads] x head_dim), then copy its K and V rows into the cache
   slot (block = slot / block_size). cos and sin are [positions, head_dim / 2]. */
/* rotate the first `rotated` heads of one token's qkv row in place */
static inline void rope_heads(float *row, const float *c, const float *s, int rotated, int head_dim)
{
    const int half = head_dim / 2;
    for (int hh = 0; hh < rotated; hh++) {
        float *x1 = row + (int64_t)hh * head_dim, *x2 = x1 + half;
        int i = 0;
        for (; i + 8 <= half; i += 8) {
            const v8 a = load8(x1 + i), b = load8(x2 + i), cc = load8(c + i), ss = load8(s + i);
            store8(x1 + i, a * cc - b * ss);
            store8(x2 + i, b * cc + a * ss);
        }
        for (; i < half; i++) {
            const float a = x1[i], b = x2[i];
            x1[i] = a * c[i] - b * s[i];
            x2[i] = b * c[i] + a * s[i];
        }
    }
}

void splitserve_rope_write_kv_f32(
    float *qkv, int64_t row_stride, int32_t tokens, int32_t heads, int32_t kv_heads,
    int32_t head_dim, const int64_t *positions, const float *cos, const float *sin,
    float *cache, int64_t block_stride, int64_t k_offset, int64_t v_offset,
    int64_t token_stride, const int64_t *slots, int32_t block_size, int32_t threads)
{
    const int half = head_dim / 2, rotated = heads + kv_heads;
    const int64_t kv_bytes = (int64_t)kv_heads * head_dim * sizeof(float);
    const int parallel = (int64_t)tokens * row_stride >= PARALLEL_MIN;
#pragma omp parallel for schedule(static) num_threads(threads > 0 ? threads : 1) if (parallel)
    for (int t = 0; t < tokens; t++) {
        float *row = qkv + t * row_stride;
        rope_heads(row, cos + positions[t] * half, sin + positions[t] * half, rotated, head_dim);
        const int64_t slot = slots[t];
        float *dst = cache + (slot / block_size) * block_stride + (slot % block_size) * token_stride;
        memcpy(dst + k_offset, row + (int64_t)heads * head_dim, kv_bytes);
        memcpy(dst + v_offset, row + (int64_t)rotated * head_dim, kv_bytes);
    }
}

/* int8 KV (engine.kv.quant): each head's row becomes head_dim codes round((x - mid) / scale),
   then two bf16 scales and two bf16 mids (8 bytes), one of each per half of the row:
   mid = (max + min) / 2 and scale = half range / 127, each rounded to bf16. The same fp32
   operations as the torch quantize_rows, so both write the same bytes. */
static inline void quantize_heads_i8(const float *x, int8_t *dst, int kv_heads, int head_dim)
{
    const int half = head_dim / 2;
    for (int h = 0; h < kv_heads; h++) {
        const float *src = x + (int64_t)h * head_dim;
        int8_t *out = dst + (int64_t)h * (head_dim + 8);
        uint16_t params[4]; /* scale 0, scale 1, mid 0, mid 1 */
        for (int g = 0; g < 2; g++) {
            const float *xs = src + g * half;
            float hi = xs[0], lo = xs[0];
            for (int i = 1; i < half; i++) {
                hi = fmaxf(hi, xs[i]);
                lo = fminf(lo, xs[i]);
            }
            params[2 + g] = bf16_of((hi + lo) / 2.0f);
            const float m = f32_of_bf16(params[2 + g]);
            params[g] = bf16_of(fmaxf(hi - m, m - lo) / 127.0f);
            const float sc = f32_of_bf16(params[g]), divisor = sc > 0.0f ? sc : 1.0f;
            for (int i = 0; i < half; i++) {
                const float q = nearbyintf((xs[i] - m) / divisor);
                out[g * half + i] = (int8_t)fminf(fmaxf(q, -127.0f), 127.0f);
            }
        }
        memcpy(out + head_dim, params, sizeof params);
    }
}

/* x <- H x on each of `n_heads` heads of one token's row, in place: the normalized Sylvester
   Hadamard in blocks of `block` values (a power of two), by butterflies, the order of
   engine.kv.quant.rotate_heads_ (the same bits). A quantized cache stores keys rotated. */
static void hadamard_heads(float *row, int n_heads, int head_dim, int block)
{
    const float norm = (float)(1.0 / __builtin_sqrt((double)block));
    for (int b0 = 0; b0 < n_heads * head_dim; b0 += block) {
        float *y = row + b0;
        for (int span = 1; span < block; span <<= 1)
            for (int i = 0; i < block; i += 2 * span)
                for (int j = i; j < i + span; j++) {
                    const float a = y[j], c = y[j + span];
                    y[j] = a + c;
                    y[j + span] = a - c;
                }
        for (int i = 0; i < block; i++) y[i] *= norm;
    }
}

void splitserve_rope_write_kv_i8(
    float *qkv, int64_t row_stride, int32_t tokens, int32_t heads, int32_t kv_heads,
    int32_t head_dim, const int64_t *positions, const float *cos, const float *sin,
    int8_t *cache, int64_t block_stride, int64_t k_offset, int64_t v_offset,
    int64_t token_stride, const int64_t *slots, int32_t block_size, int32_t threads)
{
    const int half = head_dim / 2, rotated = heads + kv_heads;
    const int parallel = (int64_t)tokens * row_stride >= PARALLEL_MIN;
#pragma omp parallel for schedule(static) num_threads(threads > 0 ? threads : 1) if (parallel)
    for (int t = 0; t < tokens; t++) {
        float *row = qkv + t * row_stride;
        rope_heads(row, cos + positions[t] * half, sin + positions[t] * half, rotated, head_dim);
        hadamard_heads(row, rotated, head_dim, head_dim & -head_dim);
        const int64_t slot = slots[t];
        int8_t *dst = cache + (slot / block_size) * block_stride + (slot % block_size) * token_stride;
        quantize_heads_i8(row + (int64_t)heads * head_dim, dst + k_offset, kv_heads, head_dim);
        quantize_heads_i8(row + (int64_t)rotated * head_dim, dst + v_offset, kv_heads, head_dim);
    }
}

/* out[t, i] = silu(gate_up[t, i]) * gate_up[t, inter + i] */
void splitserve_silu_mul_f32(
    const float *gate_up, int64_t row_stride, float *out, int64_t out_stride, int32_t tokens,
    int32_t inter, int32_t threads)
{
    const int parallel = (int64_t)tokens * inter >= PARALLEL_MIN;
#pragma omp parallel for schedule(static) num_threads(threads > 0 ? threads : 1) if (parallel)
    for (int t = 0; t < tokens; t++) {
        const float *g = gate_up + t * row_stride, *u = g + inter;
        float *o = out + t * out_stride;
        int i = 0;
        for (; i + 8 <= inter; i += 8) {
            const v8 x = load8(g + i);
            store8(o + i, x / (1.0f + exp8(-x)) * load8(u + i));
        }
        for (; i < inter; i++) o[i] = g[i] / (1.0f + exp1(-g[i])) * u[i];
    }
}

/* o = x / sqrt(mean(x^2) + eps) * weight over n values (o may be x), accumulated in fp32 */
static inline void norm_row(const float *x, float *o, const float *weight, int n, float eps)
{
    v8 acc = splat8(0.0f);
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        const v8 v = load8(x + i);
        acc += v * v;
    }
    float sq = hsum8(acc);
    for (; i < n; i++) sq += x[i] * x[i];
    const float inv = 1.0f / __builtin_sqrtf(sq / (float)n + eps);
    for (i = 0; i + 8 <= n; i += 8) store8(o + i, load8(x + i) * inv * load8(weight + i));
    for (; i < n; i++) o[i] = x[i] * inv * weight[i];
}

/* out[t] = x[t] / sqrt(mean(x[t]^2) + eps) * weight, accumulated in fp32 */
void splitserve_rms_norm_f32(
    const float *x, int64_t x_stride, const float *weight, float *out, int64_t out_stride,
    int32_t tokens, int32_t hidden, float eps, int32_t threads)
{
    const int parallel = (int64_t)tokens * hidden >= PARALLEL_MIN;
#pragma omp parallel for schedule(static) num_threads(threads > 0 ? threads : 1) if (parallel)
    for (int t = 0; t < tokens; t++)
        norm_row(x + t * x_stride, out + t * out_stride, weight, hidden, eps);
}

/* Each head of each token row normalised in place over its head_dim values (Qwen3's and
   Gemma 3's q and k norms): row t, head h at x + t * row_stride + h * head_dim. */
void splitserve_head_norm_f32(
    float *x, int64_t row_stride, int32_t tokens, int32_t heads, int32_t head_dim,
    const float *weight, float eps, int32_t threads)
{
    const int64_t rows = (int64_t)tokens * heads;
    const int parallel = rows * head_dim >= PARALLEL_MIN;
#pragma omp parallel for schedule(static) num_threads(threads > 0 ? threads : 1) if (parallel)
    for (int64_t r = 0; r < rows; r++) {
        float *row = x + (r / heads) * row_stride + (r % heads) * head_dim;
        norm_row(row, row, weight, head_dim, eps);
    }
}
