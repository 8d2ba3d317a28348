/*
 * Multi-LoRA delta of one fused projection, Punica style, in one call: the step's tokens come
 * grouped by slot (a plan built once per step), so each adapter's matrices are read once for
 * all of its tokens.
 *   shrink:  y[t, k]   = A[s, k, :] . x[t, :]                        (k < subs * rank)
 *   expand:  out[t, j] += sum_r y[t, sub(j) * rank + r] * Bt[s, r, j]
 * with s the slot of token t; sub(j) is the sub-matrix (q, k, v; gate, up) whose columns
 * ends[sub - 1] .. ends[sub] hold j. B is stored rank-major ([rank, cols] per slot), so the
 * expand runs along output columns with vector FMAs and no horizontal sums. Tokens without an
 * adapter are in no group and left alone.
 */
#include <stdint.h>
#include <string.h>

#include "vecw.h"

#define PARALLEL_MACS (1 << 14) /* below this a call runs on one thread */
#define TOKEN_BLOCK 4           /* shrink: tokens that share one read of an A row */
#define COL_VECS 4              /* expand: vectors of output columns per accumulator block */

typedef struct {
    const float *a;      /* [slots, rows, in] */
    const float *bt;     /* [slots, rank, cols] */
    const int64_t *ends; /* [subs] column end of each sub-matrix; the last is cols */
    int64_t a_slot_stride, b_slot_stride;
    int32_t in, rows, cols, rank, subs;
} lora_matrix;

typedef struct {
    const int64_t *order;  /* [n] the tokens with an adapter, grouped by slot */
    const int64_t *starts; /* [groups + 1] each group's range in order */
    const int64_t *slot;   /* [groups] */
    float *y;              /* [n, y_stride] scratch, row i for the token order[i] */
    int64_t y_stride;
    int32_t groups, threads;
} lora_plan;

static inline float hsumw(vw v) {
    float s = 0.0f;
    for (int i = 0; i < VW; i++) s += v[i];
    return s;
}

/* y[i * ys] = a_row . x[order[i]] for nt (1..TOKEN_BLOCK) tokens, one read of a_row. */
static inline __attribute__((always_inline)) void shrink_row(
    const float *a_row, int64_t in, const float *x, int64_t x_stride, const int64_t *order,
    int nt, float *y, int64_t ys) {
    const float *xs[TOKEN_BLOCK];
    vw acc[TOKEN_BLOCK];
    for (int t = 0; t < nt; t++) xs[t] = x + order[t] * x_stride, acc[t] = splatw(0.0f);
    int64_t i = 0;
    for (; i + VW <= in; i += VW) {
        const vw av = loadw(a_row + i);
        for (int t = 0; t < nt; t++) acc[t] += av * loadw(xs[t] + i);
    }
    for (int t = 0; t < nt; t++) {
        float s = hsumw(acc[t]);
        for (int64_t k = i; k < in; k++) s += a_row[k] * xs[t][k];
        y[t * ys] = s;
    }
}

/* out[t, j0 .. j0 + nv * VW] += sum_r y_t[r] * bt[r, j0 ..] for nt (1 or 2) tokens. */
static inline __attribute__((always_inline)) void expand_vecs(
    const float *bt, int64_t ldb, int32_t rank, float *const *outs, const float *const *ys,
    int nt, int nv) {
    vw acc[2][COL_VECS];
    for (int t = 0; t < nt; t++)
        for (int v = 0; v < nv; v++) acc[t][v] = loadw(outs[t] + v * VW);
    for (int32_t r = 0; r < rank; r++) {
        const float *br = bt + r * ldb;
        for (int t = 0; t < nt; t++) {
            const vw yr = splatw(ys[t][r]);
            for (int v = 0; v < nv; v++) acc[t][v] += yr * loadw(br + v * VW);
        }
    }
    for (int t = 0; t < nt; t++)
        for (int v = 0; v < nv; v++) storew(outs[t] + v * VW, acc[t][v]);
}

/* Columns lo .. hi of one sub-matrix for nt (1 or 2) tokens. */
static inline __attribute__((always_inline)) void expand_cols(
    const float *bt, int64_t ldb, int32_t rank, float *const *outs, const float *const *ys,
    int nt, int64_t lo, int64_t hi) {
    int64_t j = lo;
    for (; j + COL_VECS * VW <= hi; j += COL_VECS * VW) {
        float *o[2] = {outs[0] + j, nt > 1 ? outs[1] + j : 0};
        expand_vecs(bt + j, ldb, rank, o, ys, nt, COL_VECS);
    }
    for (; j + VW <= hi; j += VW) {
        float *o[2] = {outs[0] + j, nt > 1 ? outs[1] + j : 0};
        expand_vecs(bt + j, ldb, rank, o, ys, nt, 1);
    }
    for (; j < hi; j++)
        for (int t = 0; t < nt; t++) {
            float s = 0.0f;
            for (int32_t r = 0; r < rank; r++) s += ys[t][r] * bt[r * ldb + j];
            outs[t][j] += s;
        }
}

static void shrink_item(const lora_matrix *m, const lora_plan *p, const float *x,
                        int64_t x_stride, int64_t g, int64_t k) {
    const float *a_row = m->a + p->slot[g] * m->a_slot_stride + k * (int64_t)m->in;
    int64_t i = p->starts[g];
    const int64_t end = p->starts[g + 1];
    for (; i + TOKEN_BLOCK <= end; i += TOKEN_BLOCK)
        shrink_row(a_row, m->in, x, x_stride, p->order + i, TOKEN_BLOCK, p->y + i * p->y_stride + k,
                   p->y_stride);
    for (; i < end; i++)
        shrink_row(a_row, m->in, x, x_stride, p->order + i, 1, p->y + i * p->y_stride + k,
                   p->y_stride);
}

static void expand_item(const lora_matrix *m, const lora_plan *p, float *out, int64_t out_stride,
                        int64_t g, int32_t sub, int64_t lo, int64_t hi) {
    const float *bt = m->bt + p->slot[g] * m->b_slot_stride;
    const int64_t ldb = m->cols;
    int64_t i = p->starts[g];
    const int64_t end = p->starts[g + 1];
    const int64_t yoff = (int64_t)sub * m->rank;
    for (; i + 2 <= end; i += 2) {
        float *o[2] = {out + p->order[i] * out_stride, out + p->order[i + 1] * out_stride};
        const float *y[2] = {p->y + i * p->y_stride + yoff, p->y + (i + 1) * p->y_stride + yoff};
        expand_cols(bt, ldb, m->rank, o, y, 2, lo, hi);
    }
    if (i < end) {
        float *o[2] = {out + p->order[i] * out_stride, 0};
        const float *y[2] = {p->y + i * p->y_stride + yoff, 0};
        expand_cols(bt, ldb, m->rank, o, y, 1, lo, hi);
    }
}

/* The work item c of the expand: sub-matrix and column range (chunks of COL_VECS vectors
   within each sub-matrix). */
static int32_t expand_chunk(const lora_matrix *m, int64_t c, int64_t *lo, int64_t *hi) {
    const int64_t width = COL_VECS * VW;
    int64_t start = 0;
    for (int32_t s = 0; s < m->subs; s++) {
        const int64_t n = (m->ends[s] - start + width - 1) / width;
        if (c < n) {
            *lo = start + c * width;
            *hi = *lo + width < m->ends[s] ? *lo + width : m->ends[s];
            return s;
        }
        c -= n, start = m->ends[s];
    }
    return -1;
}

void splitserve_lora_add_f32(const lora_matrix *m, const lora_plan *p, const float *x,
                             int64_t x_stride, float *out, int64_t out_stride) {
    const int64_t groups = p->groups, tokens = p->starts[groups];
    if (tokens == 0) return;
    const int64_t width = COL_VECS * VW;
    int64_t chunks = 0, start = 0;
    for (int32_t s = 0; s < m->subs; s++)
        chunks += (m->ends[s] - start + width - 1) / width, start = m->ends[s];
    const int64_t macs = tokens * m->rows * (int64_t)m->in + tokens * m->cols * (int64_t)m->rank;
    const int threads = p->threads > 0 ? p->threads : 1;
    if (groups >= 2 * threads || (groups >= threads && groups % threads == 0)) {
        /* enough slot groups to share out whole: a thread runs its groups' shrink and expand
           with no barrier between them */
#pragma omp parallel for num_threads(threads) schedule(static) if (macs >= PARALLEL_MACS)
        for (int64_t g = 0; g < groups; g++) {
            for (int64_t k = 0; k < m->rows; k++) shrink_item(m, p, x, x_stride, g, k);
            for (int64_t c = 0; c < chunks; c++) {
                int64_t lo = 0, hi = 0;
                const int32_t sub = expand_chunk(m, c, &lo, &hi);
                expand_item(m, p, out, out_stride, g, sub, lo, hi);
            }
        }
        return;
    }
#pragma omp parallel num_threads(threads) if (macs >= PARALLEL_MACS)
    {
#pragma omp for schedule(static)
        for (int64_t item = 0; item < groups * m->rows; item++)
            shrink_item(m, p, x, x_stride, item / m->rows, item % m->rows);
#pragma omp for schedule(static)
        for (int64_t item = 0; item < groups * chunks; item++) {
            int64_t lo = 0, hi = 0;
            const int32_t sub = expand_chunk(m, item % chunks, &lo, &hi);
            expand_item(m, p, out, out_stride, item / chunks, sub, lo, hi);
        }
    }
}
