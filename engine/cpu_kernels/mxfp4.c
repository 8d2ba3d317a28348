/*
 * Mixture-of-experts experts over packed MXFP4 weights (gpt-oss), fp32 activations:
 *   out[t] (+)= sum over the top-k experts e of token t of
 *               weight[t, e] * (W2_e swiglu(W13_e x[t] + b13_e) + b2_e),
 * swiglu gpt-oss's clamped one over interleaved gate / up rows (row 2j gate j, row 2j + 1 up
 * j): g = min(g, limit), u = clamp(u, -limit, limit), (u + 1) * g * sigmoid(alpha * g).
 *
 * The weights stay as the checkpoint stores them (engine.model.quant.mxfp4): W [E, rows,
 * cols] as codes [E, rows, cols / 32, 16] (two 4-bit e2m1 codes a byte, the low nibble the
 * even value) and e8m0 scales [E, rows, cols / 32] (2^(s - 127)), 4.25 bits a value. A block
 * of 32 codes is decoded in registers through a 16-entry table (one permute per vector with
 * AVX-512, a permute and a sign flip with AVX2, a table in memory elsewhere), its product with
 * the activations summed in fp32 and scaled once. The codes decode as even values then odd
 * ones, so the activations are gathered in that order (each block of 32 deinterleaved) and
 * the swiglu output is written in it for the down projection: the products pair up as in
 * the natural order.
 *
 * As in moe.c, the (token, slot) pairs are counting-sorted by expert (moe.h), each expert's
 * rows gathered, and threads share out (expert, 16 weight rows) work items: gate/up +
 * bias + swiglu, then down + bias. Up to PANEL_MIN_ROWS rows routed to an expert, each
 * weight row is decoded once per TILE_ROWS of them, in registers; from PANEL_MIN_ROWS on, an
 * item's 16 weight rows are dequantized PANEL_K inputs at a time into an L1 panel that the
 * fp32 linear kernel (linear.h) runs every row over. A last pass adds each token's k rows,
 * weighted, in ascending expert order.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "linear.h"
#include "moe.h"
#include "vecw.h"

#define QBLOCK 32              /* values a scale covers */
#define QBYTES (QBLOCK / 2)    /* bytes of codes a block */
#define NB (QBLOCK / VW)       /* vectors a decoded block fills */
#define TILE_ROWS 4            /* activation rows a weight row is decoded for at once */
#define ITEM_ROWS PANEL        /* weight rows of a work item (gate / up pairs stay together) */
#define PANEL_MIN_ROWS 16      /* an expert's rows from which its items go through panels */
#define PANEL_K 256            /* input values of a dequantized panel chunk (16 KB) */
#define PANEL_M 64             /* activation rows a panel chunk is used for at once */
#define PARALLEL_MIN (1 << 18) /* multiply-adds below which the calling thread does it all */

static const float E2M1[16] = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                               -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

/* 2^(s - 127) of an e8m0 scale byte */
static inline float e8m0(uint8_t s)
{
    const uint32_t bits = s ? (uint32_t)s << 23 : 0x00400000u;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

/* The 32 values of a block's 16 code bytes: w[0 .. NB / 2) the even values, the rest odd. */
static inline __attribute__((always_inline)) void decode_block(const uint8_t *q, vw *w)
{
#if VW == 16 && defined(__AVX512F__)
    const __m512 lut = _mm512_loadu_ps(E2M1);
    const __m512i c = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)q));
    w[0] = (vw)_mm512_permutexvar_ps(_mm512_and_si512(c, _mm512_set1_epi32(15)), lut);
    w[1] = (vw)_mm512_permutexvar_ps(_mm512_srli_epi32(c, 4), lut);
#elif VW == 8 && defined(__AVX2__)
    const __m256 magnitude = _mm256_loadu_ps(E2M1); /* the permute reads 3 bits of a code */
    for (int h = 0; h < 2; h++) {
        const __m256i c = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(q + 8 * h)));
        const __m256i hi = _mm256_srli_epi32(c, 4), eight = _mm256_set1_epi32(8);
        const __m256 sign_lo = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_and_si256(c, eight), 28));
        const __m256 sign_hi = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_and_si256(hi, eight), 28));
        w[h] = (vw)_mm256_xor_ps(_mm256_permutevar8x32_ps(magnitude, c), sign_lo);
        w[2 + h] = (vw)_mm256_xor_ps(_mm256_permutevar8x32_ps(magnitude, hi), sign_hi);
    }
#else
    float t[QBLOCK];
    for (int j = 0; j < QBYTES; j++) t[j] = E2M1[q[j] & 15], t[QBYTES + j] = E2M1[q[j] >> 4];
    for (int v = 0; v < NB; v++) w[v] = loadw(t + v * VW);
#endif
}

static inline float hsumw(vw v)
{
    float s = 0.0f;
    for (int i = 0; i < VW; i++) s += v[i];
    return s;
}

/* dots[r] = row r of x (R rows ldx apart, blocks deinterleaved) . one weight row */
static inline __attribute__((always_inline)) void row_dots(
    const float *x, int64_t ldx, const uint8_t *codes, const uint8_t *scales, int blocks,
    float *dots, const int R)
{
    vw acc[TILE_ROWS];
    for (int r = 0; r < R; r++) acc[r] = splatw(0.0f);
    for (int b = 0; b < blocks; b++) {
        vw w[NB];
        decode_block(codes + (int64_t)b * QBYTES, w);
        const vw s = splatw(e8m0(scales[b]));
        for (int r = 0; r < R; r++) {
            const float *xr = x + r * ldx + (int64_t)b * QBLOCK;
            vw p = loadw(xr) * w[0];
            for (int v = 1; v < NB; v++) p += loadw(xr + v * VW) * w[v];
            acc[r] += p * s;
        }
    }
    for (int r = 0; r < R; r++) dots[r] = hsumw(acc[r]);
}

static void tile_dots(const float *x, int64_t ldx, const uint8_t *codes, const uint8_t *scales,
                      int blocks, float *dots, int rows)
{
    switch (rows) {
    case 1: row_dots(x, ldx, codes, scales, blocks, dots, 1); break;
    case 2: row_dots(x, ldx, codes, scales, blocks, dots, 2); break;
    case 3: row_dots(x, ldx, codes, scales, blocks, dots, 3); break;
    default: row_dots(x, ldx, codes, scales, blocks, dots, 4); break;
    }
}

/* Where value j of a row sits once each block of 32 is deinterleaved. */
static inline int64_t split_pos(int64_t j)
{
    const int64_t i = j & (QBLOCK - 1);
    return j - i + ((i & 1) ? QBYTES + (i >> 1) : (i >> 1));
}

/* Rows [p0, p1) of the sorted order: x's rows of their slots' tokens, deinterleaved. */
static void gather_split(const float *x, int64_t ldx, const int32_t *slot_at, int k, int64_t p0,
                         int64_t p1, int H, float *xs)
{
    for (int64_t p = p0; p < p1; p++) {
        const float *src = x + (slot_at[p] / k) * ldx;
        for (int64_t j = 0; j < H; j++) xs[p * H + split_pos(j)] = src[j];
    }
}

typedef struct {
    const uint8_t *codes, *scales; /* [E, rows, cols / 32, 16] and [E, rows, cols / 32] */
    const float *bias;             /* [E, rows], or NULL */
    int rows, cols;
} mxfp4_weight;

/* One weight row's dots with `n` rows of x (ldx apart): out[r * ldo] = dot + bias. */
static void weight_row(const mxfp4_weight *w, int64_t row, const float *x, int64_t ldx, int n,
                       float *out, int64_t ldo)
{
    const int blocks = w->cols / QBLOCK;
    const float bias = w->bias ? w->bias[row] : 0.0f;
    for (int r0 = 0; r0 < n; r0 += TILE_ROWS) {
        float dots[TILE_ROWS];
        const int R = n - r0 < TILE_ROWS ? n - r0 : TILE_ROWS;
        tile_dots(x + r0 * ldx, ldx, w->codes + row * blocks * QBYTES, w->scales + row * blocks,
                  blocks, dots, R);
        for (int r = 0; r < R; r++) out[(r0 + r) * ldo] = dots[r] + bias;
    }
}

/* Inputs [k0, k0 + kc) of weight rows [row0, row0 + PANEL) as a panel [kc][PANEL] of fp32,
   the inputs in the codes' (deinterleaved) order. */
static void dequant_panel(const mxfp4_weight *w, int64_t row0, int k0, int kc, float *panel)
{
    const int blocks = w->cols / QBLOCK;
    float t[QBLOCK] __attribute__((aligned(64)));
    for (int c = 0; c < PANEL; c++)
        for (int b = k0 / QBLOCK; b < (k0 + kc) / QBLOCK; b++) {
            const int64_t at = (row0 + c) * blocks + b;
            vw v[NB];
            decode_block(w->codes + at * QBYTES, v);
            const vw s = splatw(e8m0(w->scales[at]));
            for (int i = 0; i < NB; i++) storew(t + i * VW, v[i] * s);
            float *dst = panel + (int64_t)(b * QBLOCK - k0) * PANEL + c;
            for (int i = 0; i < QBLOCK; i++) dst[i * PANEL] = t[i];
        }
}

/* c[r * ldc + j] = row r of x (n rows ldx apart) . weight row row0 + j, for j < PANEL and
   r < n <= PANEL_M (no bias). */
static void panel_product(const mxfp4_weight *w, int64_t row0, const float *x, int64_t ldx,
                          int n, float *c, int64_t ldc)
{
    float panel[PANEL_K * PANEL] __attribute__((aligned(64)));
    for (int k0 = 0; k0 < w->cols; k0 += PANEL_K) {
        const int kc = w->cols - k0 < PANEL_K ? w->cols - k0 : PANEL_K;
        dequant_panel(w, row0, k0, kc, panel);
        splitserve_panel_rows(x + k0, ldx, panel, n, kc, c, ldc, k0 > 0);
    }
}

static inline float clamped_swiglu(float g, float u, float alpha, float limit)
{
    g = g < limit ? g : limit;
    u = u < -limit ? -limit : (u > limit ? limit : u);
    return (u + 1.0f) * (g / (1.0f + expf(-alpha * g)));
}

/* Gate / up rows [o0, o0 + ITEM_ROWS) of expert e for its n rows at sorted position base
   through a dequantized panel: their swiglu into act (deinterleaved columns). */
static void gate_up_panels(const mxfp4_weight *w, const float *xs, float *act, int64_t base,
                           int n, int64_t e, int o0, float alpha, float limit)
{
    const int H = w->cols, I = w->rows / 2;
    const int64_t row0 = e * w->rows + o0;
    float gu[PANEL_M * PANEL] __attribute__((aligned(64)));
    for (int r0 = 0; r0 < n; r0 += PANEL_M) {
        const int m = n - r0 < PANEL_M ? n - r0 : PANEL_M;
        panel_product(w, row0, xs + (base + r0) * H, H, m, gu, PANEL);
        for (int r = 0; r < m; r++)
            for (int c = 0; c < PANEL; c += 2) {
                const float *b = w->bias ? w->bias + row0 + c : NULL;
                const float g = gu[r * PANEL + c] + (b ? b[0] : 0.0f);
                const float u = gu[r * PANEL + c + 1] + (b ? b[1] : 0.0f);
                act[(base + r0 + r) * I + split_pos((o0 + c) / 2)] =
                    clamped_swiglu(g, u, alpha, limit);
            }
    }
}

/* Down rows [h0, h0 + ITEM_ROWS) of expert e for its n rows at sorted position base, plus
   their biases, into ys. */
static void down_item(const mxfp4_weight *w, const float *act, float *ys, int64_t base, int n,
                      int64_t e, int h0)
{
    const int H = w->rows, I = w->cols;
    const int64_t row0 = e * H + h0;
    if (n < PANEL_MIN_ROWS) {
        for (int h = 0; h < ITEM_ROWS; h++)
            weight_row(w, row0 + h, act + base * I, I, n, ys + base * H + h0 + h, H);
        return;
    }
    for (int r0 = 0; r0 < n; r0 += PANEL_M) {
        const int m = n - r0 < PANEL_M ? n - r0 : PANEL_M;
        float *c = ys + (base + r0) * H + h0;
        panel_product(w, row0, act + (base + r0) * I, I, m, c, H);
        if (w->bias)
            for (int r = 0; r < m; r++)
                for (int j = 0; j < PANEL; j++) c[r * H + j] += w->bias[row0 + j];
    }
}

/* Gate / up rows [o0, o0 + ITEM_ROWS) of expert e for its n rows at sorted position base:
   their swiglu into act (deinterleaved columns). */
static void gate_up_item(const mxfp4_weight *w, const float *xs, float *act, int64_t base,
                         int n, int64_t e, int o0, float alpha, float limit)
{
    const int H = w->cols, I = w->rows / 2;
    float g[TILE_ROWS], u[TILE_ROWS];
    if (n >= PANEL_MIN_ROWS) {
        gate_up_panels(w, xs, act, base, n, e, o0, alpha, limit);
        return;
    }
    for (int r0 = 0; r0 < n; r0 += TILE_ROWS) {
        const int R = n - r0 < TILE_ROWS ? n - r0 : TILE_ROWS;
        const float *x = xs + (base + r0) * H;
        for (int o = o0; o < o0 + ITEM_ROWS; o += 2) {
            const int64_t row = e * w->rows + o;
            weight_row(w, row, x, H, R, g, 1);
            weight_row(w, row + 1, x, H, R, u, 1);
            float *dst = act + (base + r0) * I + split_pos(o / 2);
            for (int r = 0; r < R; r++) dst[r * I] = clamped_swiglu(g[r], u[r], alpha, limit);
        }
    }
}

/* Returns 0; -1 when scratch memory could not be had, -2 for an expert id outside [0, E), -3
   for top_k above MAX_TOP_K. H and I must be multiples of 32 (the caller checks). */
int32_t splitserve_moe_mxfp4_f32(
    const float *x, int64_t ldx, int32_t T, int32_t H, const int64_t *ids, const float *weights,
    int32_t k, const uint8_t *w13_codes, const uint8_t *w13_scales, const float *b13,
    const uint8_t *w2_codes, const uint8_t *w2_scales, const float *b2, int32_t E, int32_t I,
    float alpha, float limit, float *out, int64_t ldo, int32_t accumulate, int32_t threads)
{
    const int64_t slots = (int64_t)T * k;
    moe_order o;
    const int rc = splitserve_moe_begin(ids, T, k, E, slots * (2 * (int64_t)H + I), &o);
    if (rc) return rc;
    const mxfp4_weight w13 = {w13_codes, w13_scales, b13, 2 * I, H};
    const mxfp4_weight w2 = {w2_codes, w2_scales, b2, H, I};
    const int32_t *offsets = o.offsets, *active = o.active;
    const int n_active = o.n_active, gu_items = 2 * I / ITEM_ROWS, down_items = H / ITEM_ROWS;
    float *xs = o.scratch, *ys = xs + slots * H, *act = ys + slots * H;
    const int parallel = slots * 3 * (int64_t)H * I >= PARALLEL_MIN;
#pragma omp parallel num_threads(threads > 0 ? threads : 1) if (parallel)
    {
#pragma omp for schedule(static)
        for (int64_t p = 0; p < slots; p++) gather_split(x, ldx, o.slot_at, k, p, p + 1, H, xs);
#pragma omp for schedule(dynamic, 2)
        for (int it = 0; it < n_active * gu_items; it++) {
            const int e = active[it / gu_items];
            gate_up_item(&w13, xs, act, offsets[e], offsets[e + 1] - offsets[e], e,
                         (it % gu_items) * ITEM_ROWS, alpha, limit);
        }
#pragma omp for schedule(dynamic, 2)
        for (int it = 0; it < n_active * down_items; it++) {
            const int e = active[it / down_items];
            down_item(&w2, act, ys, offsets[e], offsets[e + 1] - offsets[e], e,
                      (it % down_items) * ITEM_ROWS);
        }
#pragma omp for schedule(static)
        for (int t = 0; t < T; t++)
            splitserve_moe_reduce_token(ys, ids, weights, o.pos_of, t, k, H, out + t * ldo,
                                        accumulate);
    }
    splitserve_moe_end(&o);
    return 0;
}
