/*
 * Paged prefill attention on the CPU, fp32, flash-attention style: the query tokens of
 * prefill chunks (causal, after a cached prefix or not) over K/V read from the paged cache
 * where they lie. Built with the other kernels (engine/cpu_kernels/build.py), called through
 * ctypes (engine/cpu_kernels/prefill.py).
 *
 * Work items are (sequence, kv head, query tile); OpenMP threads take them longest first.
 * A tile holds up to ROWS rows: its query tokens times the group of query heads sharing the
 * kv head (row = token * group + g), so each K/V chunk is read once per group. For each
 * chunk of KC keys the item packs K transposed ([d][KC]) and V ([KC][d]) into its thread's
 * buffers (an int8 cache's codes are dequantised on the way), computes the scores
 * S = Q K^T with RT x JN-vector register tiles, applies the soft-cap, the causal / window
 * mask and an online-softmax step per row, then O += P V with RT x CW-vector tiles. Scores,
 * softmax statistics and accumulators are fp32; the scale is folded into the packed Q.
 *
 * A sequence whose context is its chunk (no cached prefix) reads its keys from the step's
 * fresh K/V (``kf``, ``vf``) instead of the cache, as the torch path does: with an int8
 * cache a fresh prompt attends over unquantised K/V. Keys wholly behind a window are never
 * read. Vectors are VW floats (vecw.h: 16 with AVX-512, else 8).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "vec8.h"
#include "vecw.h"

#ifndef ROWS
#define ROWS 96 /* rows (query token x group head) per tile, a multiple of VW * JMAX */
#endif
#ifndef RT
#define RT 8    /* keys (Q K^T) or channels (P V) per register tile, divides head_dim */
#endif
#ifndef JMAX
#define JMAX 3  /* vectors of rows per register tile */
#endif
#ifndef KC
#define KC 64   /* keys per chunk */
#endif
#define NEG -3.0e38f
#define KV_PARAM_BYTES 8

typedef int32_t vwi __attribute__((vector_size(VW * 4)));

/* x in every lane, as one broadcast (GCC < 12 lacks __builtin_shufflevector) */
static inline vw bcastw(float x)
{
#if defined(__clang__) || (defined(__GNUC__) && __GNUC__ >= 12)
#if VW == 16
    return __builtin_shufflevector((vw){x}, (vw){x}, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0);
#else
    return __builtin_shufflevector((vw){x}, (vw){x}, 0, 0, 0, 0, 0, 0, 0, 0);
#endif
#else
    return splatw(x);
#endif
}

static inline vw selectw(vwi mask, vw a, vw b) { return (vw)(((vwi)a & mask) | ((vwi)b & ~mask)); }

/* e^x per lane (exp8 of vec8.h at the machine's width) */
SPLITSERVE_DEFINE_EXP(expw, vw, vwi, splatw, selectw)

struct pjob {
    const float *q;
    int64_t q_tok, q_head;
    const float *kf, *vf; /* the step's fresh K and V */
    int64_t kf_tok, kf_head, vf_tok, vf_head;
    float *out; /* [tokens, heads, d] contiguous */
    const char *cache;
    int quantized;
    int64_t block_stride, k_offset, v_offset, token_stride; /* in elements */
    const int32_t *tables;
    int64_t table_stride;
    const int32_t *qsl, *ctx_lens;
    int heads, kv_heads, group, d, block_size, tile_tokens;
    float scale, softcap;
    int window;
    const float *sinks; /* [heads] logits in each softmax, or NULL */
};

/* a thread's buffers: Q^T and O^T [d][ROWS], S^T / P^T [KC][ROWS], K and V [KC][d] */
struct bufs {
    float *qt, *ot, *st, *k, *v;
};

/* key t of sequence s, kv head h (K: which 0, V: 1), as d floats at dst */
static inline void load_key_row(const struct pjob *jb, int s, int h, int fresh, int t, int which,
                                float *dst)
{
    const int d = jb->d;
    if (fresh) {
        const float *src = which ? jb->vf + (int64_t)(jb->qsl[s] + t) * jb->vf_tok + h * jb->vf_head
                                 : jb->kf + (int64_t)(jb->qsl[s] + t) * jb->kf_tok + h * jb->kf_head;
        memcpy(dst, src, sizeof(float) * d);
        return;
    }
    const int esz = jb->quantized ? 1 : 4;
    const int row = d + (jb->quantized ? KV_PARAM_BYTES : 0);
    const int32_t block = jb->tables[(int64_t)s * jb->table_stride + t / jb->block_size];
    const char *src = jb->cache + ((int64_t)block * jb->block_stride +
                                   (which ? jb->v_offset : jb->k_offset) +
                                   (int64_t)(t % jb->block_size) * jb->token_stride +
                                   (int64_t)h * row) * esz;
    if (!jb->quantized) {
        memcpy(dst, src, sizeof(float) * d);
        return;
    }
    const int8_t *codes = (const int8_t *)src;
    uint16_t bits[4];
    memcpy(bits, codes + d, sizeof bits);
    const float s0 = f32_of_bf16(bits[0]), s1 = f32_of_bf16(bits[1]);
    const float m0 = f32_of_bf16(bits[2]), m1 = f32_of_bf16(bits[3]);
    for (int c = 0; c < d / 2; c++) dst[c] = codes[c] * s0 + m0;
    for (int c = d / 2; c < d; c++) dst[c] = codes[c] * s1 + m1;
}

/* S^T[t0 + i][rv0 .. rv0 + JN vectors of rows] = sum_c K[t0 + i][c] Q^T[c][rows], i < RT */
static inline __attribute__((always_inline)) void qk_tile(const float *qt, const float *k, float *st,
                                                          int d, int t0, int rv0, const int JN)
{
    vw acc[RT][JMAX];
    for (int i = 0; i < RT; i++)
        for (int j = 0; j < JN; j++) acc[i][j] = splatw(0.0f);
    for (int c = 0; c < d; c++) {
        vw qv[JMAX];
        for (int j = 0; j < JN; j++) qv[j] = loadw(qt + c * ROWS + (rv0 + j) * VW);
        for (int i = 0; i < RT; i++) {
            const vw kb = bcastw(k[(t0 + i) * d + c]);
            for (int j = 0; j < JN; j++) acc[i][j] += kb * qv[j];
        }
    }
    for (int i = 0; i < RT; i++)
        for (int j = 0; j < JN; j++) storew(st + (t0 + i) * ROWS + (rv0 + j) * VW, acc[i][j]);
}

/* O^T[c0 + i][rows] = O^T[c0 + i][rows] * corr + sum_t V[t][c0 + i] P^T[t][rows], i < RT */
static inline __attribute__((always_inline)) void pv_tile(const float *pt, const float *v, float *ot,
                                                          const float *corr, int d, int kn, int c0,
                                                          int rv0, const int JN)
{
    vw acc[RT][JMAX];
    for (int j = 0; j < JN; j++) {
        const vw cj = loadw(corr + (rv0 + j) * VW);
        for (int i = 0; i < RT; i++) acc[i][j] = loadw(ot + (c0 + i) * ROWS + (rv0 + j) * VW) * cj;
    }
    for (int t = 0; t < kn; t++) {
        vw pv[JMAX];
        for (int j = 0; j < JN; j++) pv[j] = loadw(pt + t * ROWS + (rv0 + j) * VW);
        for (int i = 0; i < RT; i++) {
            const vw vb = bcastw(v[t * d + c0 + i]);
            for (int j = 0; j < JN; j++) acc[i][j] += vb * pv[j];
        }
    }
    for (int i = 0; i < RT; i++)
        for (int j = 0; j < JN; j++) storew(ot + (c0 + i) * ROWS + (rv0 + j) * VW, acc[i][j]);
}

/* C * tanh(x / C) with tanh(y) = 1 - 2 / (e^2y + 1) */
static inline vw soft_capw(vw x, float cap)
{
    return cap * (1.0f - 2.0f / (expw(x * (2.0f / cap)) + 1.0f));
}

/* CALL(J) with J = min(N, JMAX) as a compile-time constant */
#define JCLAMP(J) ((J) < JMAX ? (J) : JMAX)
#define TILES(CALL, N)                  \
    switch ((N) < JMAX ? (N) : JMAX) {  \
    case 1: CALL(1); break;             \
    case 2: CALL(JCLAMP(2)); break;     \
    case 3: CALL(JCLAMP(3)); break;     \
    case 4: CALL(JCLAMP(4)); break;     \
    case 5: CALL(JCLAMP(5)); break;     \
    default: CALL(JCLAMP(6)); break;    \
    }

/* dst[j][0..8) = src[0..8)[j] for 8 rows of 8 floats: dst_j at dst + j * dst_stride, row i
   at src[i] (scaled by mul[i]) */
static inline void transpose8(const float *const src[8], const float mul[8], float *dst,
                              int64_t dst_stride)
{
#if defined(__clang__) || (defined(__GNUC__) && __GNUC__ >= 12)
#define SHUF __builtin_shufflevector
    v8 r[8], t[8], u[8];
    for (int i = 0; i < 8; i++) r[i] = load8(src[i]) * mul[i];
    for (int i = 0; i < 8; i += 2) {
        t[i] = SHUF(r[i], r[i + 1], 0, 8, 1, 9, 4, 12, 5, 13);
        t[i + 1] = SHUF(r[i], r[i + 1], 2, 10, 3, 11, 6, 14, 7, 15);
    }
    for (int i = 0; i < 8; i += 4) {
        u[i] = SHUF(t[i], t[i + 2], 0, 1, 8, 9, 4, 5, 12, 13);
        u[i + 1] = SHUF(t[i], t[i + 2], 2, 3, 10, 11, 6, 7, 14, 15);
        u[i + 2] = SHUF(t[i + 1], t[i + 3], 0, 1, 8, 9, 4, 5, 12, 13);
        u[i + 3] = SHUF(t[i + 1], t[i + 3], 2, 3, 10, 11, 6, 7, 14, 15);
    }
    for (int j = 0; j < 4; j++) {
        store8(dst + j * dst_stride, SHUF(u[j], u[j + 4], 0, 1, 2, 3, 8, 9, 10, 11));
        store8(dst + (j + 4) * dst_stride, SHUF(u[j], u[j + 4], 4, 5, 6, 7, 12, 13, 14, 15));
    }
#undef SHUF
#else
    for (int i = 0; i < 8; i++)
        for (int j = 0; j < 8; j++) dst[j * dst_stride + i] = src[i][j] * mul[i];
#endif
}

static void prefill_item(const struct pjob *jb, const struct bufs *b, int s, int h, int tile)
{
    const int d = jb->d, group = jb->group;
    const int n = jb->qsl[s + 1] - jb->qsl[s], ctx = jb->ctx_lens[s], prefix = ctx - n;
    const int fresh = prefix == 0;
    const int i0 = tile * jb->tile_tokens;
    const int i1 = i0 + jb->tile_tokens < n ? i0 + jb->tile_tokens : n;
    const int rows = (i1 - i0) * group, nrv = (rows + VW - 1) / VW;
    /* Q^T, scaled, 8 x 8 blocks at a time; pad rows are zero, positioned as the last query
       (so never wholly masked) */
    int pos[ROWS];
    float m[ROWS], l[ROWS], corr[ROWS], mul[ROWS];
    const float *src[ROWS];
    for (int r = 0; r < nrv * VW; r++) {
        const int tok = r < rows ? i0 + r / group : i1 - 1;
        pos[r] = prefix + tok;
        m[r] = NEG;
        l[r] = 0.0f;
        src[r] = jb->q + (int64_t)(jb->qsl[s] + tok) * jb->q_tok +
                 (int64_t)(h * group + r % group) * jb->q_head;
        mul[r] = r < rows ? jb->scale : 0.0f;
    }
    for (int r0 = 0; r0 < nrv * VW; r0 += 8)
        for (int c0 = 0; c0 < d; c0 += 8) {
            const float *rows8[8];
            for (int i = 0; i < 8; i++) rows8[i] = src[r0 + i] + c0;
            transpose8(rows8, mul + r0, b->qt + c0 * ROWS + r0, ROWS);
        }
    for (int c = 0; c < d; c++) memset(b->ot + c * ROWS, 0, sizeof(float) * nrv * VW);
    const int window = jb->window;
    const int khi = prefix + i1; /* keys < khi */
    const int klo = window > 0 && prefix + i0 - window + 1 > 0 ? prefix + i0 - window + 1 : 0;
    for (int k0 = klo; k0 < khi; k0 += KC) {
        const int kn = khi - k0 < KC ? khi - k0 : KC;
        const int kpad = (kn + RT - 1) / RT * RT;
        for (int t = 0; t < kn; t++) {
            load_key_row(jb, s, h, fresh, k0 + t, 0, b->k + t * d);
            load_key_row(jb, s, h, fresh, k0 + t, 1, b->v + t * d);
        }
        memset(b->k + kn * d, 0, sizeof(float) * d * (kpad - kn));
        for (int t0 = 0; t0 < kpad; t0 += RT)
            for (int rv0 = 0; rv0 < nrv; rv0 += JMAX) {
#define QK(J) qk_tile(b->qt, b->k, b->st, d, t0, rv0, J)
                TILES(QK, nrv - rv0)
#undef QK
            }
        /* masks: a key is seen by a row at position p when k <= p and k > p - window; pad
           keys (>= kn) by none. Chunks wholly inside every row's range skip the test. */
        const int masked = k0 + kn - 1 > prefix + i0 || (window > 0 && k0 <= prefix + i1 - 1 - window);
        for (int rv = 0; rv < nrv; rv++) {
            const int off = rv * VW;
            vwi p, plo;
            for (int i = 0; i < VW; i++) {
                p[i] = pos[off + i];
                plo[i] = window > 0 ? pos[off + i] - window : -1;
            }
            vw mx = loadw(m + off);
            for (int t = 0; t < kn; t++) {
                vw x = loadw(b->st + t * ROWS + off);
                if (jb->softcap > 0.0f || masked) {
                    if (jb->softcap > 0.0f) x = soft_capw(x, jb->softcap);
                    if (masked) {
                        const vwi key = (vwi){0} + (k0 + t);
                        x = selectw((key <= p) & (key > plo), x, splatw(NEG));
                    }
                    storew(b->st + t * ROWS + off, x);
                }
                mx = selectw(x > mx, x, mx);
            }
            const vw mold = loadw(m + off);
            storew(corr + off, expw(mold - mx));
            vw sum = splatw(0.0f);
            for (int t = 0; t < kn; t++) {
                const vw x = loadw(b->st + t * ROWS + off);
                vw e = expw(x - mx);
                if (masked) e = selectw(x > splatw(0.5f * NEG), e, splatw(0.0f));
                storew(b->st + t * ROWS + off, e);
                sum += e;
            }
            storew(l + off, loadw(l + off) * loadw(corr + off) + sum);
            storew(m + off, mx);
        }
        for (int c0 = 0; c0 < d; c0 += RT)
            for (int rv0 = 0; rv0 < nrv; rv0 += JMAX) {
#define PV(J) pv_tile(b->st, b->v, b->ot, corr, d, kn, c0, rv0, J)
                TILES(PV, nrv - rv0)
#undef PV
            }
    }
    /* O = (O^T)^T / l, 8 x 8 blocks at a time, the rows past the last multiple of 8 alone */
    float inv[ROWS];
    for (int r = 0; r < rows; r++) {
        const float *sink = jb->sinks ? jb->sinks + h * group + r % group : NULL;
        inv[r] = softmax_inv(m[r], l[r], sink);
    }
    for (int r0 = 0; r0 < rows; r0 += 8) {
        float *dst[8];
        for (int i = 0; i < 8 && r0 + i < rows; i++)
            dst[i] = jb->out + ((int64_t)(jb->qsl[s] + i0 + (r0 + i) / group) * jb->heads +
                                h * group + (r0 + i) % group) * d;
        if (r0 + 8 > rows) {
            for (int i = 0; r0 + i < rows; i++)
                for (int c = 0; c < d; c++) dst[i][c] = b->ot[c * ROWS + r0 + i] * inv[r0 + i];
            continue;
        }
        for (int c0 = 0; c0 < d; c0 += 8) {
            const float *cols[8];
            float tmp[64];
            const float ones[8] = {1, 1, 1, 1, 1, 1, 1, 1};
            for (int j = 0; j < 8; j++) cols[j] = b->ot + (c0 + j) * ROWS + r0;
            transpose8(cols, ones, tmp, 8);
            for (int i = 0; i < 8; i++) store8(dst[i] + c0, load8(tmp + 8 * i) * inv[r0 + i]);
        }
    }
}

/* Returns 0, -1 for a shape outside the kernel's limits, -2 when out of memory. */
int splitserve_paged_prefill_f32(
    const float *q, int64_t q_tok, int64_t q_head,
    const float *kf, int64_t kf_tok, int64_t kf_head,
    const float *vf, int64_t vf_tok, int64_t vf_head,
    float *out, const void *cache, int32_t quantized,
    int64_t block_stride, int64_t k_offset, int64_t v_offset,
    const int32_t *tables, int64_t table_stride,
    const int32_t *qsl, const int32_t *ctx_lens, int32_t seqs,
    int32_t heads, int32_t kv_heads, int32_t head_dim, int32_t block_size,
    float scale, int32_t window, float softcap,
    const float *sinks, /* [heads] attention sinks, or NULL */
    int32_t threads)
{
    if (kv_heads <= 0 || heads % kv_heads != 0 || heads / kv_heads > ROWS) return -1;
    if (head_dim <= 0 || head_dim % VW != 0 || head_dim % RT != 0 || block_size <= 0) return -1;
    const int group = heads / kv_heads;
    struct pjob jb = {
        q, q_tok, q_head, kf, vf, kf_tok, kf_head, vf_tok, vf_head, out, (const char *)cache,
        quantized != 0, block_stride, k_offset, v_offset,
        (int64_t)kv_heads * (head_dim + (quantized ? KV_PARAM_BYTES : 0)), tables, table_stride,
        qsl, ctx_lens, heads, kv_heads, group, head_dim, block_size, ROWS / group, scale,
        softcap, window, sinks,
    };
    /* items: per sequence, kv_heads x tiles, the last tiles (most keys) first */
    int64_t *first = malloc(sizeof(int64_t) * (seqs + 1));
    if (!first) return -2;
    first[0] = 0;
    for (int s = 0; s < seqs; s++) {
        const int n = qsl[s + 1] - qsl[s];
        first[s + 1] = first[s] + (int64_t)kv_heads * ((n + jb.tile_tokens - 1) / jb.tile_tokens);
    }
    const int64_t items = first[seqs];
    int failed = 0;
    threads = threads > 0 ? threads : 1;
    const size_t floats = (size_t)head_dim * ROWS * 2 + KC * ROWS + (size_t)KC * head_dim * 2;
#pragma omp parallel num_threads(threads)
    {
        float *mem = aligned_alloc(64, (floats * sizeof(float) + 63) / 64 * 64);
        if (!mem) {
#pragma omp atomic write
            failed = 1;
        }
        struct bufs b = {0};
        if (mem) {
            b.qt = mem;
            b.ot = b.qt + (size_t)head_dim * ROWS;
            b.st = b.ot + (size_t)head_dim * ROWS;
            b.k = b.st + KC * ROWS;
            b.v = b.k + (size_t)KC * head_dim;
        }
#pragma omp for schedule(dynamic, 1) nowait
        for (int64_t item = 0; item < items; item++) {
            if (!mem) continue;
            int s = 0;
            while (first[s + 1] <= item) s++;
            const int64_t local = item - first[s];
            const int tiles = (int)((first[s + 1] - first[s]) / kv_heads);
            const int tile = tiles - 1 - (int)(local / kv_heads);
            prefill_item(&jb, &b, s, (int)(local % kv_heads), tile);
        }
        free(mem);
    }
    free(first);
    return failed ? -2 : 0;
}
