/*
 * Paged decode attention on the CPU, fp32: one query token per sequence, reading K and V
 * from the blocks of the paged cache in place (no gather, no padding to the longest
 * context). Built on first use by engine/cpu_kernels/__init__.py and called through ctypes.
 *
 * Work is split over units with OpenMP, taken by the threads as they finish: a sequence's
 * kv heads together (their rows of a block lie side by side: one stream from memory, 15%
 * less CPU time a step than a kv head a unit at batch 32, contexts 64-640, one thread), or
 * one kv head a unit where that leaves too few units; sequences with the most keys first,
 * so the last units taken are short. The library links libgomp by its soname, so inside a
 * torch process it shares torch's OpenMP runtime.
 *
 * For each kv head, the group of query heads that share it walks the sequence's blocks
 * once: scores of the block's tokens, an online-softmax rescale, then the weighted sum of
 * V. Each query head's sums run in one order whatever the unit, so the plan changes no bit. Softmax statistics and accumulators are fp32. head_dim is a compile-time
 * constant in each instantiation so the accumulators stay in registers.
 *
 * With a sliding window W > 0 the query (at position n - 1) sees only the last W keys: the
 * walk starts at the block holding key n - W and never reads the blocks before it (they may
 * be back in the pool). With a soft-cap C > 0 each score s becomes C * tanh(s / C) (Gemma 2).
 *
 * An int8 cache (kv_cache_dtype int8, engine.kv.quant) holds each (token, kv head) row as
 * head_dim codes, then two bf16 scales and two bf16 mids, one of each per half of the row
 * (x = code * scale + mid): K codes are dequantised in registers before the dot with the
 * query, V codes are weighted by softmax weight * their half's scale, plus weight * mid.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define MAX_GROUP 32
#define MAX_BLOCK_SIZE 128
#define CHUNK 4 /* vectors of head_dim accumulated at once in the P @ V pass */
#define CHUNK_OF(ND) ((ND) < CHUNK ? (ND) : CHUNK) /* ND is 2 or a multiple of 4 */
#define PREFETCH_AHEAD 2 /* blocks */
#define KV_PARAM_BYTES 8 /* an int8 row's bf16 scales and mids, after its codes */

#include "vec8.h"

typedef int8_t v8c __attribute__((vector_size(8)));

/* 8 int8 codes as fp32 lanes */
static inline v8 load8_i8(const int8_t *p)
{
    v8c x;
    memcpy(&x, p, sizeof x);
    return __builtin_convertvector(x, v8);
}

/* the bf16 scales and mids after a row's head_dim codes: p[0], p[1] scales, p[2], p[3] mids */
static inline void row_params(const int8_t *row, int head_dim, float p[4])
{
    uint16_t bits[4];
    memcpy(bits, row + head_dim, sizeof bits);
    for (int i = 0; i < 4; i++) p[i] = f32_of_bf16(bits[i]);
}

/* a half's value for vector j (8 channels) of a row: ND is even, ND / 2 vectors per half */
static inline v8 per_half(int j, int ND, float first, float second)
{
    return splat8(j < ND / 2 ? first : second);
}

struct job {
    const float *q;
    int64_t q_seq_stride, q_head_stride;
    float *out;
    const void *cache; /* float, or int8 codes + scales (quantized) */
    int quantized;
    int64_t block_stride, k_offset, v_offset, token_stride;
    const int32_t *tables;
    int64_t table_stride;
    const int32_t *ctx_lens;
    int heads, kv_heads, group, block_size;
    float scale;
    int window;    /* 0: the whole context */
    float softcap; /* 0: off */
    const float *sinks; /* [heads] logits in each softmax, or NULL */
};

/* C * tanh(s / C) for the n scores at p, with tanh(x) = 1 - 2 / (e^2x + 1) */
static inline void soft_cap(float *p, int n, float cap)
{
    for (int t = 0; t < n; t++) p[t] = cap * (1.0f - 2.0f / (exp1(2.0f * p[t] / cap) + 1.0f));
}

/* The query heads of kv heads [h0, h0 + nh) of sequence s (nh * group <= MAX_GROUP; ND =
   head_dim / 8; Q: an int8 cache). Offsets and strides count the cache's elements (4 or 1
   bytes); a row is head_dim (+ KV_PARAM_BYTES with Q). */
static inline __attribute__((always_inline)) void decode_unit(
    const struct job *jb, int s, int h0, int nh, const int ND, const int Q)
{
    const int esz = Q ? 1 : 4, row = Q ? 8 * ND + KV_PARAM_BYTES : 8 * ND;
    const char *cache = (const char *)jb->cache;
    v8 qs[MAX_GROUP][ND];
    v8 acc[MAX_GROUP][ND];
    float p[MAX_GROUP][MAX_BLOCK_SIZE + 8];
    float m[MAX_GROUP], l[MAX_GROUP];
    const int group = jb->group, rows = nh * group; /* query heads h0 * group + r */
    const v8 zero = {0};
    for (int r = 0; r < rows; r++) {
        const float *qg = jb->q + s * jb->q_seq_stride + (int64_t)(h0 * group + r) * jb->q_head_stride;
        for (int j = 0; j < ND; j++) {
            qs[r][j] = load8(qg + 8 * j) * jb->scale;
            acc[r][j] = zero;
        }
        m[r] = -3.0e38f;
        l[r] = 0.0f;
    }
    const int n = jb->ctx_lens[s], bs = jb->block_size;
    const int64_t ts = jb->token_stride;
    const int32_t *table = jb->tables + s * jb->table_stride;
    const int lo = jb->window > 0 && n > jb->window ? n - jb->window : 0; /* first key seen */
    for (int start = lo - lo % bs; start < n; start += bs) {
        const int len = n - start < bs ? n - start : bs;
        const int skip = lo > start ? lo - start : 0; /* tokens of this block behind the window */
        const char *base = cache + (int64_t)table[start / bs] * jb->block_stride * esz;
        const char *kb = base + (jb->k_offset + (int64_t)h0 * row) * esz;
        const char *vb = base + (jb->v_offset + (int64_t)h0 * row) * esz;
        /* these heads' rows PREFETCH_AHEAD blocks on, requested row by row below: the memory
           loads overlap the arithmetic (measured 8% faster per step than without) */
        const int ahead = start + PREFETCH_AHEAD * bs < n;
        const char *nk = ahead ? cache + ((int64_t)table[start / bs + PREFETCH_AHEAD] *
                                  jb->block_stride + jb->k_offset + (int64_t)h0 * row) * esz
                               : kb;
        const char *nv = nk + (jb->v_offset - jb->k_offset) * esz;
        for (int t0 = 0; t0 < len; t0 += 8) { /* scores of 8 tokens per vector */
            const int tn = len - t0 < 8 ? len - t0 : 8;
            v8 part[MAX_GROUP][8];
            for (int t = 0; t < 8; t++) {
                if (t >= tn) {
                    for (int r = 0; r < rows; r++) part[r][t] = zero;
                    continue;
                }
                for (int c = 0; c < nh * row * esz; c += 64) { /* 64-byte lines */
                    __builtin_prefetch(nk + (t0 + t) * ts * esz + c);
                    __builtin_prefetch(nv + (t0 + t) * ts * esz + c);
                }
                for (int hh = 0; hh < nh; hh++) {
                    const char *kt = kb + ((t0 + t) * ts + hh * row) * esz;
                    v8 k[ND];
                    if (Q) {
                        float pr[4];
                        row_params((const int8_t *)kt, 8 * ND, pr);
                        for (int j = 0; j < ND; j++)
                            k[j] = load8_i8((const int8_t *)kt + 8 * j) * per_half(j, ND, pr[0], pr[1]) +
                                   per_half(j, ND, pr[2], pr[3]);
                    } else {
                        for (int j = 0; j < ND; j++) k[j] = load8((const float *)kt + 8 * j);
                    }
                    for (int r = hh * group; r < (hh + 1) * group; r++) {
                        v8 d0 = qs[r][0] * k[0], d1 = zero;
                        for (int j = 1; j < ND; j += 2) {
                            d1 += qs[r][j] * k[j];
                            if (j + 1 < ND) d0 += qs[r][j + 1] * k[j + 1];
                        }
                        part[r][t] = d0 + d1;
                    }
                }
            }
            for (int r = 0; r < rows; r++) store8(&p[r][t0], hsum8x8(part[r]));
        }
        for (int r = 0; r < rows; r++) {
            if (jb->softcap > 0.0f) soft_cap(p[r], len, jb->softcap);
            for (int t = 0; t < skip; t++) p[r][t] = -3.0e38f;
            float block_max = p[r][skip];
            for (int t = skip + 1; t < len; t++) block_max = p[r][t] > block_max ? p[r][t] : block_max;
            const float new_m = block_max > m[r] ? block_max : m[r];
            const float correction = exp1(m[r] - new_m);
            /* p[r] is padded to a whole number of vectors; lanes past len get weight 0 */
            v8 sum = {0};
            for (int t = 0; t < len; t += 8) {
                v8 e = exp8(load8(&p[r][t]) - new_m);
                for (int i = len - t; i < 8; i++) e[i] = 0.0f;
                for (int i = 0; i < 8 && t + i < skip; i++) e[i] = 0.0f;
                store8(&p[r][t], e);
                sum += e;
            }
            l[r] = l[r] * correction + hsum8(sum);
            m[r] = new_m;
            if (correction != 1.0f)
                for (int j = 0; j < ND; j++) acc[r][j] *= correction;
        }
        for (int r = 0; r < rows; r++) {
            const char *vh = vb + (int64_t)(r / group) * row * esz;
            for (int j0 = 0; j0 < ND; j0 += CHUNK_OF(ND)) {
                v8 a[CHUNK];
                for (int c = 0; c < CHUNK_OF(ND); c++) a[c] = acc[r][j0 + c];
                for (int t = 0; t < len; t++) {
                    const char *vrow = vh + t * ts * esz;
                    if (Q) {
                        const int8_t *vt = (const int8_t *)vrow + 8 * j0;
                        float pr[4];
                        row_params((const int8_t *)vrow, 8 * ND, pr);
                        const float w = p[r][t];
                        for (int c = 0; c < CHUNK_OF(ND); c++)
                            a[c] += per_half(j0 + c, ND, w * pr[0], w * pr[1]) * load8_i8(vt + 8 * c) +
                                    per_half(j0 + c, ND, w * pr[2], w * pr[3]);
                    } else {
                        const float *vt = (const float *)vrow + 8 * j0;
                        const float w = p[r][t];
                        for (int c = 0; c < CHUNK_OF(ND); c++) a[c] += w * load8(vt + 8 * c);
                    }
                }
                for (int c = 0; c < CHUNK_OF(ND); c++) acc[r][j0 + c] = a[c];
            }
        }
    }
    for (int r = 0; r < rows; r++) {
        const int head = h0 * group + r;
        float *og = jb->out + ((int64_t)s * jb->heads + head) * 8 * ND;
        const float *sink = jb->sinks ? jb->sinks + head : NULL;
        const float inv = softmax_inv(m[r], l[r], sink);
        for (int j = 0; j < ND; j++) store8(og + 8 * j, acc[r][j] * inv);
    }
}

/* Unit u of the plan: sequence order[u / chunks], kv heads from (u % chunks) * per_unit. */
#define DECODE_UNITS(ND_, Q_)                                                            \
    _Pragma("omp parallel for schedule(dynamic, 1) num_threads(threads)")               \
    for (int64_t u = 0; u < units; u++) {                                               \
        const int h0 = (int)(u % chunks) * per_unit;                                     \
        const int nh = kv_heads - h0 < per_unit ? kv_heads - h0 : per_unit;              \
        decode_unit(&jb, order[u / chunks], h0, nh, ND_, Q_);                            \
    }
#define DECODE_ALL(ND_)                                                                  \
    if (jb.quantized) {                                                                  \
        DECODE_UNITS(ND_, 1)                                                             \
    } else {                                                                             \
        DECODE_UNITS(ND_, 0)                                                             \
    }

static int by_cost(const void *a, const void *b)
{
    const int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

/* The work plan: fills `order` with the sequences, the most keys first (the threads take
   units as they finish, so the last units taken are the shortest), and returns how many kv
   heads a unit walks at once: as many as fit MAX_GROUP query heads, whose rows of each
   block lie side by side, unless that leaves under 4 units a thread (then one). */
static int plan_units(const int32_t *ctx_lens, int seqs, int kv_heads, int group, int window,
                      int threads, int32_t *order)
{
    int64_t *keys = malloc((seqs > 0 ? seqs : 1) * sizeof *keys);
    for (int s = 0; s < seqs; s++) {
        const int n = ctx_lens[s], seen = window > 0 && n > window ? window : n;
        if (keys) keys[s] = ((int64_t)(INT32_MAX - seen) << 32) | s;
        else order[s] = s;
    }
    if (keys) {
        qsort(keys, seqs, sizeof *keys, by_cost);
        for (int s = 0; s < seqs; s++) order[s] = (int32_t)(keys[s] & 0xffffffff);
        free(keys);
    }
    int per_unit = MAX_GROUP / group < kv_heads ? MAX_GROUP / group : kv_heads;
    const int chunks = (kv_heads + per_unit - 1) / per_unit;
    if ((int64_t)seqs * chunks < 4 * (int64_t)threads) per_unit = 1;
    return per_unit;
}

/* Returns 0, or -1 for a shape outside the kernel's limits (the caller checks first). */
int splitserve_paged_decode_f32(
    const float *q, int64_t q_seq_stride, int64_t q_head_stride,
    float *out,                /* [seqs, heads, head_dim], contiguous */
    const void *cache,         /* the whole paged cache: fp32, or int8 codes + scales */
    int32_t quantized,         /* 1: int8 rows of head_dim codes + scales + mids */
    int64_t block_stride,      /* elements from one block to the next */
    int64_t k_offset,          /* elements from a block's start to this layer's K */
    int64_t v_offset,          /* ... and to its V; K/V tokens are [kv_heads, head_dim] */
    const int32_t *tables, int64_t table_stride,
    const int32_t *ctx_lens,
    int32_t seqs, int32_t heads, int32_t kv_heads, int32_t head_dim, int32_t block_size,
    float scale, int32_t window, float softcap,
    const float *sinks,        /* [heads] attention sinks, or NULL */
    int32_t threads)
{
    if (kv_heads <= 0 || heads % kv_heads != 0 || heads / kv_heads > MAX_GROUP) return -1;
    if (block_size <= 0 || block_size > MAX_BLOCK_SIZE) return -1;
    struct job jb = {
        q, q_seq_stride, q_head_stride, out, cache, quantized != 0, block_stride, k_offset,
        v_offset, (int64_t)kv_heads * (head_dim + (quantized ? KV_PARAM_BYTES : 0)), tables, table_stride, ctx_lens,
        heads, kv_heads, heads / kv_heads, block_size, scale, window, softcap, sinks,
    };
    threads = threads > 0 ? threads : 1;
    int32_t *order = malloc((seqs > 0 ? seqs : 1) * sizeof *order);
    if (!order) return -2;
    const int per_unit = plan_units(ctx_lens, seqs, kv_heads, heads / kv_heads, window, threads, order);
    const int chunks = (kv_heads + per_unit - 1) / per_unit;
    const int64_t units = (int64_t)seqs * chunks;
    int rc = 0;
    switch (head_dim) {
    case 16: DECODE_ALL(2) break;
    case 32: DECODE_ALL(4) break;
    case 64: DECODE_ALL(8) break;
    case 96: DECODE_ALL(12) break;
    case 128: DECODE_ALL(16) break;
    case 256: DECODE_ALL(32) break;
    default: rc = -1;
    }
    free(order);
    return rc;
}
