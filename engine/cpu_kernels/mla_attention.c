/*
 * Multi-head latent attention (DeepSeek-V2 / V3) over the paged latent cache on the CPU, fp32,
 * in the absorbed form: every query head arrives projected into the latent space
 * (W_uk[h]^T q_nope[h], then its rotated q_pe[h]: kv_lora + rope values), each cache row is a
 * token's [c, k_pe] (one KV "head" all query heads share), score = q . row, and the output
 * is sum_t p_t c_t in the latent space ([tokens, heads, kv_lora]; the caller up-projects it
 * with W_uv). No key or value is ever expanded. Built with the other kernels
 * (engine/cpu_kernels/build.py), called through ctypes (engine/cpu_kernels/mla.py).
 *
 * Decodes and prefill chunks go through one code path: sequence i owns query tokens
 * qsl[i] .. qsl[i + 1] - 1, the last of its ctx_lens[i] positions, each attending causally to
 * its earlier positions (a decode is a chunk of one; a cached prefix is read from the cache
 * like any other key, so chunked prefill and a prefix hit need nothing more).
 *
 * A work unit is (sequence, tile of query tokens, run of heads): up to MLA_ROWS rows of
 * (token, head), every head of the step where that leaves the threads enough units, so a
 * latent block is read from memory once for all heads. The unit walks the blocks its last
 * token sees, once: per block, the scores of every row against the block's rows (a row's
 * causal limit cut per row), an online-softmax step, then acc += p * c. Each row's sums run
 * in one order whatever the unit it falls in: the plan changes no bit. A quantized cache
 * (int8 or fp8 e4m3 rows: latent codes, two bf16 scales and two bf16 mids, one of each per
 * half row, engine.kv_format.rows; latent rows are never rotated) is dequantized a block at
 * a time into the unit's buffer. Vectors are VW floats (vecw.h: 16 with AVX-512, else 8).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "vec8.h"
#include "vecw.h"

#define MLA_ROWS 32        /* (query token, head) rows of a unit */
#define MLA_MAX_BLOCK 128  /* block_size limit (the score buffer) */
#define MLA_PARAM_BYTES 8  /* a quantized row's bf16 scales and mids, after its codes */
#define MLA_NEG -3.0e38f
#define MLA_CHUNK 4        /* accumulator vectors held in registers over a block's rows */

struct mla_job {
    const float *q; /* [tokens, heads, latent] absorbed queries */
    int64_t q_token_stride, q_head_stride;
    float *out; /* [tokens, heads, kv_lora], contiguous */
    const char *cache;
    int quant; /* 0: fp32 rows; 1: int8 codes; 2: fp8 e4m3 codes */
    int64_t block_stride, layer_offset, token_stride; /* elements (bytes when quant) */
    const int32_t *tables;
    int64_t table_stride;
    const int32_t *qsl, *ctx_lens;
    int heads, latent, kv_lora, block_size;
    float scale;
};

struct mla_unit { int32_t seq, t0, tn, h0, nh; };

static inline float mla_dot(const float *a, const float *b, int n)
{
    vw s0 = {0}, s1 = {0};
    int i = 0;
    for (; i + 2 * VW <= n; i += 2 * VW) {
        s0 += loadw(a + i) * loadw(b + i);
        s1 += loadw(a + i + VW) * loadw(b + i + VW);
    }
    for (; i + VW <= n; i += VW) s0 += loadw(a + i) * loadw(b + i);
    s0 += s1;
    float s = 0.0f;
    for (int j = 0; j < VW; j++) s += s0[j];
    for (; i < n; i++) s += a[i] * b[i];
    return s;
}

/* acc[0 .. C) = acc * c + sum_t w[t] * x[t] over n rows x (stride xs): MLA_CHUNK vectors of
   acc stay in registers over all the rows */
static inline void mla_weighted_sum(float *acc, float c, const float *w, const float *x,
                                    int64_t xs, int n, int C)
{
    int i = 0;
    for (; i + MLA_CHUNK * VW <= C; i += MLA_CHUNK * VW) {
        vw a[MLA_CHUNK];
        for (int j = 0; j < MLA_CHUNK; j++) a[j] = loadw(acc + i + j * VW) * c;
        for (int t = 0; t < n; t++)
            for (int j = 0; j < MLA_CHUNK; j++) a[j] += loadw(x + t * xs + i + j * VW) * w[t];
        for (int j = 0; j < MLA_CHUNK; j++) storew(acc + i + j * VW, a[j]);
    }
    for (; i < C; i++) {
        float a = acc[i] * c;
        for (int t = 0; t < n; t++) a += x[t * xs + i] * w[t];
        acc[i] = a;
    }
}

/* fp8 e4m3fn bits as fp32 (no infinities; 0x7f / 0xff are NaN, never written by the cache) */
static inline float mla_e4m3(uint8_t b)
{
    const int e = (b >> 3) & 15, m = b & 7;
    const float mag = e ? (1.0f + m / 8.0f) * (float)(1 << e) / 128.0f : m / 512.0f;
    return b & 0x80 ? -mag : mag;
}

/* len rows of a quantized block as fp32 into dst [len, latent] */
static void mla_dequantize(const struct mla_job *jb, const char *rows, int len, float *dst)
{
    const int L = jb->latent, half = L / 2;
    for (int t = 0; t < len; t++) {
        const char *row = rows + t * jb->token_stride;
        uint16_t bits[4];
        memcpy(bits, row + L, sizeof bits);
        float p[4];
        for (int i = 0; i < 4; i++) p[i] = f32_of_bf16(bits[i]);
        float *x = dst + (int64_t)t * L;
        for (int i = 0; i < L; i++) {
            const int g = i >= half;
            const float code = jb->quant == 1 ? (float)(int8_t)row[i] : mla_e4m3((uint8_t)row[i]);
            x[i] = code * p[g] + p[2 + g];
        }
    }
}

/* The rows' online-softmax step over one block (scores in p[r][0 .. lim)) and their
   weighted sums of its latents. */
static void mla_block_values(const struct mla_job *jb, int rows, const int *lim,
                             float p[][MLA_MAX_BLOCK], float *m, float *l, float *acc,
                             const float *k, int64_t kstride)
{
    const int C = jb->kv_lora;
    for (int r = 0; r < rows; r++) {
        const int n = lim[r];
        if (n <= 0) continue;
        float top = m[r];
        for (int t = 0; t < n; t++) top = p[r][t] > top ? p[r][t] : top;
        const float c = exp1(m[r] - top);
        float sum = 0.0f;
        for (int t = 0; t < n; t++) {
            p[r][t] = exp1(p[r][t] - top);
            sum += p[r][t];
        }
        l[r] = l[r] * c + sum;
        m[r] = top;
        mla_weighted_sum(acc + (int64_t)r * C, c, p[r], k, kstride, n, C);
    }
}

static void mla_run_unit(const struct mla_job *jb, const struct mla_unit *u, float *work)
{
    const int L = jb->latent, C = jb->kv_lora, bs = jb->block_size;
    const int rows = u->tn * u->nh, s = u->seq;
    const int n = jb->qsl[s + 1] - jb->qsl[s], first = jb->ctx_lens[s] - n; /* query 0's position */
    float *qs = work, *acc = qs + (int64_t)MLA_ROWS * L, *kbuf = acc + (int64_t)MLA_ROWS * C;
    float p[MLA_ROWS][MLA_MAX_BLOCK], m[MLA_ROWS], l[MLA_ROWS];
    int limit[MLA_ROWS], lim[MLA_ROWS];
    for (int r = 0; r < rows; r++) {
        const int t = u->t0 + r / u->nh, h = u->h0 + r % u->nh;
        const float *qr = jb->q + (int64_t)(jb->qsl[s] + t) * jb->q_token_stride + (int64_t)h * jb->q_head_stride;
        for (int i = 0; i < L; i++) qs[(int64_t)r * L + i] = qr[i] * jb->scale;
        memset(acc + (int64_t)r * C, 0, C * sizeof(float));
        m[r] = MLA_NEG;
        l[r] = 0.0f;
        limit[r] = first + t + 1; /* keys [0, limit) */
    }
    const int end = first + u->t0 + u->tn;
    const int32_t *table = jb->tables + s * jb->table_stride;
    const int esz = jb->quant ? 1 : 4;
    for (int start = 0; start < end; start += bs) {
        const int len = end - start < bs ? end - start : bs;
        const char *base = jb->cache + ((int64_t)table[start / bs] * jb->block_stride + jb->layer_offset) * esz;
        const float *k = (const float *)base;
        int64_t kstride = jb->token_stride;
        if (jb->quant) {
            mla_dequantize(jb, base, len, kbuf);
            k = kbuf;
            kstride = L;
        }
        for (int r = 0; r < rows; r++) {
            const int seen = limit[r] - start;
            lim[r] = seen < len ? seen : len;
        }
        for (int t = 0; t < len; t++) /* one cache row against every row of the unit */
            for (int r = 0; r < rows; r++)
                if (t < lim[r]) p[r][t] = mla_dot(qs + (int64_t)r * L, k + t * kstride, L);
        mla_block_values(jb, rows, lim, p, m, l, acc, k, kstride);
    }
    for (int r = 0; r < rows; r++) {
        const int t = u->t0 + r / u->nh, h = u->h0 + r % u->nh;
        float *o = jb->out + ((int64_t)(jb->qsl[s] + t) * jb->heads + h) * C;
        const float inv = softmax_inv(m[r], l[r], NULL);
        for (int i = 0; i < C; i++) o[i] = acc[(int64_t)r * C + i] * inv;
    }
}

/* The plan: heads per unit (all of them unless that leaves under 2 units a thread), query
   tokens per unit (filling MLA_ROWS rows), units in order. Returns the unit count, or -1. */
static int64_t mla_plan(const struct mla_job *jb, int seqs, int threads, struct mla_unit **units)
{
    const int heads = jb->heads;
    int nh = heads < MLA_ROWS ? heads : MLA_ROWS;
    int64_t count = 0;
    for (;;) {
        const int tq = MLA_ROWS / nh, chunks = (heads + nh - 1) / nh;
        count = 0;
        for (int s = 0; s < seqs; s++) count += (int64_t)((jb->qsl[s + 1] - jb->qsl[s] + tq - 1) / tq) * chunks;
        if (nh == 1 || count >= 2 * (int64_t)threads) break;
        nh = (nh + 1) / 2;
    }
    const int tq = MLA_ROWS / nh;
    struct mla_unit *list = malloc((count > 0 ? count : 1) * sizeof *list);
    if (!list) return -1;
    int64_t i = 0;
    for (int s = 0; s < seqs; s++) {
        const int n = jb->qsl[s + 1] - jb->qsl[s];
        for (int t0 = n - (n - 1) % tq - 1; t0 >= 0; t0 -= tq) /* latest tokens (most keys) first */
            for (int h0 = 0; h0 < heads; h0 += nh)
                list[i++] = (struct mla_unit){s, t0, n - t0 < tq ? n - t0 : tq, h0, heads - h0 < nh ? heads - h0 : nh};
    }
    *units = list;
    return count;
}

/* Returns 0; -1 for a shape outside the kernel's limits, -2 when out of memory. */
int splitserve_mla_attention_f32(
    const float *q, int64_t q_token_stride, int64_t q_head_stride,
    float *out,               /* [tokens, heads, kv_lora], contiguous */
    const void *cache,        /* the whole paged cache: fp32, or codes + scales (quant) */
    int32_t quant,            /* 0: fp32; 1: int8 rows; 2: fp8 e4m3 rows */
    int64_t block_stride,     /* elements from one block to the next */
    int64_t layer_offset,     /* elements from a block's start to this layer's latent rows */
    int64_t token_stride,     /* elements from one token's row to the next */
    const int32_t *tables, int64_t table_stride,
    const int32_t *qsl,       /* [seqs + 1] query offsets from 0 */
    const int32_t *ctx_lens,  /* [seqs] */
    int32_t seqs, int32_t heads, int32_t latent, int32_t kv_lora, int32_t block_size,
    float scale, int32_t threads)
{
    if (heads <= 0 || kv_lora <= 0 || kv_lora > latent || latent % 2) return -1;
    if (block_size <= 0 || block_size > MLA_MAX_BLOCK) return -1;
    const struct mla_job jb = {
        q, q_token_stride, q_head_stride, out, (const char *)cache, quant, block_stride,
        layer_offset, token_stride, tables, table_stride, qsl, ctx_lens, heads, latent,
        kv_lora, block_size, scale,
    };
    threads = threads > 0 ? threads : 1;
    struct mla_unit *units = NULL;
    const int64_t count = mla_plan(&jb, seqs, threads, &units);
    if (count < 0) return -2;
    const int64_t work = (int64_t)MLA_ROWS * (latent + kv_lora) + (int64_t)block_size * latent;
    int failed = 0;
#pragma omp parallel num_threads(threads) reduction(| : failed)
    {
        float *buf = malloc(work * sizeof(float));
        if (!buf) failed = 1;
#pragma omp for schedule(dynamic, 1)
        for (int64_t i = 0; i < count; i++)
            if (buf) mla_run_unit(&jb, &units[i], buf);
        free(buf);
    }
    free(units);
    return failed ? -2 : 0;
}
