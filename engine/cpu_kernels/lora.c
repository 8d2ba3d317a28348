/*
 * Multi-LoRA delta, Punica style: every token carries the slot of its adapter (negative: none)
 * and the step runs two passes over all its tokens at once.
 *   shrink:  y[t, k]  = A[slot[t], k, :] . x[t, :]             (k < rows, rows = subs * rank)
 *   expand:  out[t, j] += B[slot[t], j, :] . y[t, sub(j) * rank : (sub(j) + 1) * rank]
 * sub(j) is the sub-matrix (q, k, v; gate, up) whose columns ends[sub - 1] .. ends[sub] hold j.
 * Tokens without an adapter get zeros from shrink and are left alone by expand.
 * rank is a multiple of 8 (the slots are padded to it).
 */
#include <stdint.h>
#include <string.h>

#include "vec8.h"

#define EXPAND_COLS 64 /* output columns per work item */
#define PARALLEL_MACS (1 << 14) /* below this a pass runs on one thread */

static inline float dot(const float *a, const float *b, int64_t n) {
    v8 acc0 = splat8(0.0f), acc1 = splat8(0.0f);
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        acc0 += load8(a + i) * load8(b + i);
        acc1 += load8(a + i + 8) * load8(b + i + 8);
    }
    for (; i + 8 <= n; i += 8) acc0 += load8(a + i) * load8(b + i);
    float s = hsum8(acc0 + acc1);
    for (; i < n; i++) s += a[i] * b[i];
    return s;
}

void splitserve_lora_shrink_f32(
    const float *x, int64_t x_stride, int32_t tokens, int32_t in,
    const float *a, int64_t a_slot_stride, int32_t rows, const int64_t *slots,
    float *y, int64_t y_stride, int32_t threads) {
    const int64_t items = (int64_t)tokens * rows;
    const int parallel = items * in >= PARALLEL_MACS;
#pragma omp parallel for num_threads(threads > 0 ? threads : 1) schedule(static) if (parallel)
    for (int64_t item = 0; item < items; item++) {
        const int64_t t = item / rows, k = item % rows;
        const int64_t s = slots[t];
        y[t * y_stride + k] =
            s < 0 ? 0.0f : dot(a + s * a_slot_stride + k * (int64_t)in, x + t * x_stride, in);
    }
}

void splitserve_lora_expand_f32(
    float *out, int64_t out_stride, int32_t tokens, int32_t cols,
    const float *y, int64_t y_stride, int32_t rank,
    const float *b, int64_t b_slot_stride, const int64_t *slots,
    const int64_t *ends, int32_t subs, int32_t threads) {
    const int64_t chunks = (cols + EXPAND_COLS - 1) / EXPAND_COLS;
    const int64_t items = (int64_t)tokens * chunks;
    const int parallel = (int64_t)tokens * cols * rank >= PARALLEL_MACS;
#pragma omp parallel for num_threads(threads > 0 ? threads : 1) schedule(static) if (parallel)
    for (int64_t item = 0; item < items; item++) {
        const int64_t t = item / chunks, c = item % chunks;
        const int64_t s = slots[t];
        if (s < 0) continue;
        const int64_t lo = c * EXPAND_COLS;
        const int64_t hi = lo + EXPAND_COLS < cols ? lo + EXPAND_COLS : cols;
        const float *bs = b + s * b_slot_stride;
        float *o = out + t * out_stride;
        int32_t sub = 0;
        for (int64_t j = lo; j < hi; j++) {
            while (sub < subs - 1 && j >= ends[sub]) sub++;
            const float *yt = y + t * y_stride + (int64_t)sub * rank;
            const float *bj = bs + j * rank;
            v8 acc = splat8(0.0f);
            for (int32_t r = 0; r < rank; r += 8) acc += load8(bj + r) * load8(yt + r);
            o[j] += hsum8(acc);
        }
    }
}
