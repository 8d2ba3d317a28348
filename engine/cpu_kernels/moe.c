/*
 * Mixture-of-experts experts on the CPU, fp32: out[t] (+)= sum over the top-k experts e of
 * token t of weight[t, e] * down_e(act(gate_e(x[t])) * up_e(x[t])), over expert weights packed
 * once at load into the linear kernel's 16-column panels (linear.h):
 *   w13: [E][I / 16][2][H][16], gate panel j beside up panel j, so one work item reads both
 *        in one stream and applies the activation before anything leaves the thread;
 *   w2:  [E][H / 16][I][16].
 *
 * The (token, slot) pairs are counting-sorted by expert (stable, so an expert's rows keep the
 * token order) and their rows of x gathered into one contiguous block per expert. Threads then
 * share out (expert, panel) work items: gate/up + activation into `act` [slots, I], then down
 * into `ys` [slots, H]. Each expert's weights are read once per call, however many of the
 * step's tokens chose it. A last pass adds each token's k rows, weighted, into its output row
 * in ascending expert order (the order transformers' reference adds them in). A token's
 * result does not depend on the other tokens of the step, bit for bit: the panel kernel sums
 * in the same order for any row count, and the work split changes no sum.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "linear.h"
#include "moe.h"
#include "vec8.h"

#define ACT_SILU 0
#define ACT_GELU_TANH 1
#define MOE_ROWS 64    /* an expert's rows per pass of a gate/up item (stack partials) */
#define PARALLEL_MIN (1 << 18) /* multiply-adds below which the calling thread does it all */

/* act(g): SiLU, or GELU with the tanh approximation written as g - g / (e^{2u} + 1). */
static inline v8 act8(v8 g, int activation)
{
    if (activation == ACT_SILU) return g / (1.0f + exp8(-g));
    const v8 u = 0.7978845608028654f * (g + 0.044715f * g * g * g);
    return g - g / (exp8(2.0f * u) + 1.0f);
}

/* Gate and up panel j of expert e for its `rows` gathered rows, then act(gate) * up. */
static void gate_up_item(const float *xs, const float *w13, float *act, int64_t base, int rows,
                         int e, int j, int H, int I, int activation)
{
    const int64_t panel = (int64_t)H * PANEL;
    const float *gate = w13 + ((int64_t)e * (I / PANEL) + j) * 2 * panel, *up = gate + panel;
    float g[MOE_ROWS * PANEL] __attribute__((aligned(64)));
    float u[MOE_ROWS * PANEL] __attribute__((aligned(64)));
    for (int r0 = 0; r0 < rows; r0 += MOE_ROWS) {
        const int n = rows - r0 < MOE_ROWS ? rows - r0 : MOE_ROWS;
        const float *a = xs + (base + r0) * H;
        splitserve_panel_rows(a, H, gate, n, H, g, PANEL, 0);
        splitserve_panel_rows(a, H, up, n, H, u, PANEL, 0);
        for (int r = 0; r < n; r++) {
            float *o = act + (base + r0 + r) * I + j * PANEL;
            store8(o, act8(load8(g + r * PANEL), activation) * load8(u + r * PANEL));
            store8(o + 8, act8(load8(g + r * PANEL + 8), activation) * load8(u + r * PANEL + 8));
        }
    }
}

/* Rows [p0, p1) of the sorted order: the rows of x of their slots' tokens. */
static void gather_rows(const float *x, int64_t ldx, const int32_t *slot_at, int k, int64_t p0,
                        int64_t p1, int H, float *xs)
{
    for (int64_t p = p0; p < p1; p++)
        memcpy(xs + p * H, x + (slot_at[p] / k) * ldx, sizeof(float) * H);
}

int splitserve_moe_begin(const int64_t *ids, int32_t T, int32_t k, int32_t E,
                         int64_t scratch_floats, moe_order *o)
{
    const int64_t slots = (int64_t)T * k;
    if (k > MAX_TOP_K) return -3;
    for (int64_t s = 0; s < slots; s++)
        if (ids[s] < 0 || ids[s] >= E) return -2;
    int32_t *counts = calloc((size_t)E * 3 + 1 + 2 * (size_t)slots, sizeof(int32_t));
    o->scratch = malloc(sizeof(float) * (size_t)(scratch_floats + 1));
    if (!counts || !o->scratch) {
        free(counts), free(o->scratch);
        return -1;
    }
    o->mem = counts;
    o->offsets = counts + E, o->active = o->offsets + E + 1, o->slot_at = o->active + E;
    o->pos_of = o->slot_at + slots;
    for (int64_t s = 0; s < slots; s++) counts[ids[s]]++;
    o->n_active = 0;
    for (int e = 0; e < E; e++) {
        o->offsets[e + 1] = o->offsets[e] + counts[e];
        if (counts[e]) o->active[o->n_active++] = e;
    }
    for (int64_t s = 0; s < slots; s++) { /* stable counting sort, counts reused as cursors */
        const int e = (int)ids[s];
        const int32_t p = o->offsets[e + 1] - counts[e]--;
        o->slot_at[p] = (int32_t)s;
        o->pos_of[s] = p;
    }
    return 0;
}

void splitserve_moe_end(moe_order *o) { free(o->mem), free(o->scratch); }

void splitserve_moe_reduce_token(const float *ys, const int64_t *ids, const float *weights,
                                 const int32_t *pos_of, int t, int k, int H, float *o,
                                 int accumulate)
{
    int order[MAX_TOP_K];
    for (int i = 0; i < k; i++) {
        int m = i;
        for (; m > 0 && ids[(int64_t)t * k + order[m - 1]] > ids[(int64_t)t * k + i]; m--)
            order[m] = order[m - 1];
        order[m] = i;
    }
    if (!accumulate) memset(o, 0, sizeof(float) * H);
    for (int i = 0; i < k; i++) {
        const int64_t slot = (int64_t)t * k + order[i];
        const float *y = ys + (int64_t)pos_of[slot] * H;
        const v8 w = splat8(weights[slot]);
        int h = 0;
        for (; h + 8 <= H; h += 8) store8(o + h, load8(o + h) + w * load8(y + h));
        for (; h < H; h++) o[h] += weights[slot] * y[h];
    }
}

/* H and I must be multiples of PANEL (the caller packs only such weights). Returns 0; -1 when
   scratch memory could not be had, -2 for an expert id outside [0, E), -3 for top_k above
   MAX_TOP_K. */
int32_t splitserve_moe_f32(
    const float *x, int64_t ldx, int32_t T, int32_t H, const int64_t *ids, const float *weights,
    int32_t k, const float *w13, const float *w2, int32_t E, int32_t I, float *out,
    int64_t ldo, int32_t accumulate, int32_t activation, int32_t threads)
{
    const int64_t slots = (int64_t)T * k;
    moe_order o;
    const int rc = splitserve_moe_begin(ids, T, k, E, slots * (2 * (int64_t)H + I), &o);
    if (rc) return rc;
    const int32_t *offsets = o.offsets, *active = o.active, *slot_at = o.slot_at,
                  *pos_of = o.pos_of;
    const int n_active = o.n_active;
    float *xs = o.scratch, *ys = xs + slots * H, *act = ys + slots * H;
    const int gu_panels = I / PANEL, down_panels = H / PANEL;
    const int parallel = slots * 3 * (int64_t)H * I >= PARALLEL_MIN;
    /* the gather and the sum share out threads only when large: each costs a barrier, and a
       barrier costs most when another process holds a core */
    const int wide = parallel && slots * (int64_t)H >= PARALLEL_MIN;
    if (!wide) gather_rows(x, ldx, slot_at, k, 0, slots, H, xs);
#pragma omp parallel num_threads(threads > 0 ? threads : 1) if (parallel)
    {
        if (wide) {
#pragma omp for schedule(static)
            for (int64_t p = 0; p < slots; p++) gather_rows(x, ldx, slot_at, k, p, p + 1, H, xs);
        }
#pragma omp for schedule(dynamic, 4)
        for (int it = 0; it < n_active * gu_panels; it++) {
            const int e = active[it / gu_panels];
            gate_up_item(xs, w13, act, offsets[e], offsets[e + 1] - offsets[e], e,
                         it % gu_panels, H, I, activation);
        }
#pragma omp for schedule(dynamic, 4)
        for (int it = 0; it < n_active * down_panels; it++) {
            const int e = active[it / down_panels], j = it % down_panels;
            splitserve_panel_rows(act + (int64_t)offsets[e] * I, I,
                                  w2 + ((int64_t)e * down_panels + j) * I * PANEL,
                                  offsets[e + 1] - offsets[e], I,
                                  ys + (int64_t)offsets[e] * H + j * PANEL, H, 0);
        }
        if (wide) {
#pragma omp for schedule(static)
            for (int t = 0; t < T; t++)
                splitserve_moe_reduce_token(ys, ids, weights, pos_of, t, k, H, out + t * ldo,
                                            accumulate);
        }
    }
    if (!wide)
        for (int t = 0; t < T; t++)
            splitserve_moe_reduce_token(ys, ids, weights, pos_of, t, k, H, out + t * ldo,
                                        accumulate);
    splitserve_moe_end(&o);
    return 0;
}
