/*
 * Causal prefill attention on AMX tiles in bf16 products, for float32_matmul_precision
 * "medium": prompts computed without a cached prefix (each attends over the step's own
 * K/V), no window, no soft-cap; anything else is declined and runs the fp32 kernel
 * (prefill_attention.c).
 *
 * The products run transposed, so that one vector lane is one query row and the online
 * softmax is plain vector work down the keys (no reductions across lanes). K and V of each
 * (sequence, kv head) are rounded once to bf16 as A tiles: K as [16-key block][32-dim
 * step][16 keys][32 dims] for S^T = K Q^T, V^T as [32-key block][16-dim tile][16 dims][32
 * keys] for O^T = V^T P^T. Work items are (sequence, query head, 16 query tokens), the
 * longest first. An item keeps its queries (scaled, bf16) as B tiles and walks the key
 * blocks of 32 up to its last token: S^T in two C tiles, the causal mask and the softmax step
 * in fp32 vectors, P^T rounded to bf16 as a B tile, O^T in up to four C tiles at a time,
 * added to fp32 accumulators rescaled by the softmax correction. Scores, softmax statistics
 * and sums are fp32.
 */
#include "amx.h"

#ifdef SPLITSERVE_HAS_AMX

#include "vec8.h"

#define QT 16     /* query tokens per item */
#define KBLK 32   /* keys per block */
#define MAX_D 256 /* largest head_dim taken */
#define NEG_INF -3.0e38f

typedef float v16 __attribute__((vector_size(64)));
typedef int32_t v16i __attribute__((vector_size(64)));
typedef float v16u __attribute__((vector_size(64), aligned(4)));
static inline v16 splat16(float x) { return (v16){0} + x; }
static inline v16 select16(v16i m, v16 a, v16 b) { return (v16)(((v16i)a & m) | ((v16i)b & ~m)); }
static inline v16 ld16(const float *p) { return *(const v16u *)p; }
static inline void st16(float *p, v16 v) { *(v16u *)p = v; }
SPLITSERVE_DEFINE_EXP(exp16, v16, v16i, splat16, select16)

/* word 2n + t of the result: word n of a (t = 0) or of b (t = 1), from both = (b: high, a: low) */
static inline __m512i interleave_words(__m512 a, __m512 b)
{
    const __m512i idx = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9,
                                         24, 8, 23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1,
                                         16, 0);
    return _mm512_permutexvar_epi16(idx, (__m512i)_mm512_cvtne2ps_pbh(b, a));
}

/* n keys (rows of x, `tok` floats apart) of one head as A tiles [16-key block][32-dim
   step][16 keys][32 dims], zero-padded to npad keys */
static void k_tiles(const float *x, int64_t tok, int n, int npad, int D, uint16_t *dst)
{
    const int steps = D / 32;
    for (int key = 0; key < npad; key++)
        for (int s = 0; s < steps; s++) {
            uint16_t *row = dst + ((int64_t)(key / 16) * steps + s) * 512 + (key % 16) * 32;
            __m512i bits = _mm512_setzero_si512();
            if (key < n) {
                const float *in = x + key * tok + 32 * s;
                bits = (__m512i)_mm512_cvtne2ps_pbh(_mm512_loadu_ps(in + 16), _mm512_loadu_ps(in));
            }
            _mm512_store_si512(row, bits);
        }
}

/* n values of one head as V^T A tiles [32-key block][16-dim tile][16 dims][32 keys],
   zero-padded to npad keys: key pair (2i, 2i + 1) of a block is uint32 column i of each
   dim's row */
static void v_tiles(const float *x, int64_t tok, int n, int npad, int D, uint16_t *dst)
{
    const int dtiles = D / 16;
    const __m512i rows = _mm512_mullo_epi32(
        _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0), _mm512_set1_epi32(16));
    for (int key = 0; key < npad; key += 2) {
        uint32_t *block = (uint32_t *)(dst + (int64_t)(key / KBLK) * dtiles * 512) + (key % KBLK) / 2;
        for (int j = 0; j < dtiles; j++) {
            const __m512 a = key < n ? _mm512_loadu_ps(x + key * tok + 16 * j) : _mm512_setzero_ps();
            const __m512 b = key + 1 < n ? _mm512_loadu_ps(x + (key + 1) * tok + 16 * j)
                                         : _mm512_setzero_ps();
            _mm512_i32scatter_epi32(block + j * 256, rows, interleave_words(a, b), 4);
        }
    }
}

typedef struct {
    const float *q;
    int64_t q_tok, q_head;
    float *out;
    int heads, kv_heads, D;
    float scale;
} job_t;

/* One item: query tokens t0 .. t0 + rows - 1 of a sequence of n tokens (from token `first`
   of the step), head h, over ka / va of its kv head. Everything runs transposed, one lane
   per query row: S^T = K Q^T [keys][rows] in two C tiles, the softmax over the keys down the
   columns in fp32 vectors, O^T = V^T P^T [dims][rows] in up to four C tiles at a time. */
static void item(const job_t *j, int64_t first, int n, int t0, int h, const uint16_t *ka,
                 const uint16_t *va)
{
    const int D = j->D, steps = D / 32, dtiles = D / 16;
    const int rows = n - t0 < QT ? n - t0 : QT;
    uint32_t qb[MAX_D / 32][256] __attribute__((aligned(64))); /* Q^T B tiles, dim pairs */
    uint16_t pb[512] __attribute__((aligned(64)));              /* P^T B tile, key pairs */
    float s[KBLK][QT] __attribute__((aligned(64)));
    float ob[64][QT] __attribute__((aligned(64)));
    v16 acc[MAX_D];
    const __m512i lanes16 = _mm512_mullo_epi32(
        _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0), _mm512_set1_epi32(16));
    memset(qb, 0, sizeof qb);
    for (int r = 0; r < rows; r++) {
        const float *row = j->q + (first + t0 + r) * j->q_tok + h * j->q_head;
        for (int st = 0; st < steps; st++) {
            const __m512 lo = _mm512_mul_ps(_mm512_loadu_ps(row + 32 * st), _mm512_set1_ps(j->scale));
            const __m512 hi = _mm512_mul_ps(_mm512_loadu_ps(row + 32 * st + 16), _mm512_set1_ps(j->scale));
            _mm512_i32scatter_epi32(qb[st] + r, lanes16, (__m512i)_mm512_cvtne2ps_pbh(hi, lo), 4);
        }
    }
    for (int d = 0; d < D; d++) acc[d] = splat16(0.0f);
    v16 m = splat16(NEG_INF), l = splat16(0.0f);
    const v16 token = splat16((float)t0) + (v16){0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
    const int last = t0 + rows - 1, blocks = last / KBLK + 1;
    for (int kb = 0; kb < blocks; kb++) {
        _tile_zero(0);
        _tile_zero(1);
        for (int st = 0; st < steps; st++) {
            _tile_loadd(6, qb[st], 64);
            _tile_loadd(4, ka + ((int64_t)(2 * kb) * steps + st) * 512, 64);
            _tile_loadd(5, ka + ((int64_t)(2 * kb + 1) * steps + st) * 512, 64);
            _tile_dpbf16ps(0, 4, 6);
            _tile_dpbf16ps(1, 5, 6);
        }
        _tile_stored(0, &s[0][0], 64);
        _tile_stored(1, &s[16][0], 64);
        const int k0 = kb * KBLK, diagonal = k0 + KBLK - 1 > t0;
        v16 mx = m;
        for (int c = 0; c < KBLK; c++) {
            v16 x = ld16(s[c]);
            if (diagonal) x = select16(splat16((float)(k0 + c)) > token, splat16(NEG_INF), x);
            st16(s[c], x);
            mx = select16(x > mx, x, mx);
        }
        const v16 corr = exp16(m - mx);
        v16 sum = splat16(0.0f);
        for (int c = 0; c < KBLK; c += 2) {
            v16 p0 = exp16(ld16(s[c]) - mx), p1 = exp16(ld16(s[c + 1]) - mx);
            if (diagonal) {
                p0 = select16(splat16((float)(k0 + c)) > token, splat16(0.0f), p0);
                p1 = select16(splat16((float)(k0 + c + 1)) > token, splat16(0.0f), p1);
            }
            sum += p0 + p1;
            _mm512_store_si512(pb + c / 2 * 32, interleave_words((__m512)p0, (__m512)p1));
        }
        l = l * corr + sum;
        m = mx;
        _tile_loadd(6, pb, 64);
        for (int j0 = 0; j0 < dtiles; j0 += 4) {
            const int nt = dtiles - j0 < 4 ? dtiles - j0 : 4;
            const uint16_t *vb = va + ((int64_t)kb * dtiles + j0) * 512;
            _tile_zero(0);
            _tile_loadd(4, vb, 64);
            _tile_dpbf16ps(0, 4, 6);
            if (nt > 1) {
                _tile_zero(1);
                _tile_loadd(5, vb + 512, 64);
                _tile_dpbf16ps(1, 5, 6);
            }
            if (nt > 2) {
                _tile_zero(2);
                _tile_loadd(4, vb + 1024, 64);
                _tile_dpbf16ps(2, 4, 6);
            }
            if (nt > 3) {
                _tile_zero(3);
                _tile_loadd(5, vb + 1536, 64);
                _tile_dpbf16ps(3, 5, 6);
            }
            _tile_stored(0, &ob[0][0], 64);
            if (nt > 1) _tile_stored(1, &ob[16][0], 64);
            if (nt > 2) _tile_stored(2, &ob[32][0], 64);
            if (nt > 3) _tile_stored(3, &ob[48][0], 64);
            for (int d = 0; d < 16 * nt; d++)
                acc[16 * j0 + d] = acc[16 * j0 + d] * corr + ld16(ob[d]);
        }
    }
    /* out[token t0 + r, h, d] = acc[d][r] / l[r], lanes of the real rows */
    const __mmask16 real = (__mmask16)((1u << rows) - 1);
    const __m512i at = _mm512_mullo_epi32(
        _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
        _mm512_set1_epi32(j->heads * D));
    float *o = j->out + ((first + t0) * j->heads + h) * (int64_t)D;
    const v16 inv = 1.0f / l;
    for (int d = 0; d < D; d++) _mm512_mask_i32scatter_ps(o + d, real, at, (__m512)(acc[d] * inv), 4);
}

/* 0 if it computed out [tokens, heads, head_dim] (contiguous) for the prompts (sequence i:
   tokens qsl[i] .. qsl[i + 1] - 1, causal over its own k, v); 1 if declined (no AMX here or
   refused, head_dim not a multiple of 32 or over 256, heads not a multiple of kv_heads),
   2 out of memory: then the caller computes out. */
int32_t splitserve_prefill_attention_amx(const float *q, int64_t q_tok, int64_t q_head,
                                         const float *k, int64_t k_tok, int64_t k_head,
                                         const float *v, int64_t v_tok, int64_t v_head, float *out,
                                         const int32_t *qsl, int32_t seqs, int32_t heads,
                                         int32_t kv_heads, int32_t head_dim, float scale,
                                         int32_t threads)
{
    const int D = head_dim;
    if (D % 32 || D > MAX_D || kv_heads < 1 || heads % kv_heads || !amx_permitted()) return 1;
    int64_t *base = malloc(sizeof(int64_t) * (seqs + 1));
    if (!base) return 2;
    base[0] = 0; /* bf16 words of K (and of V) before sequence i's, all kv heads */
    int items = 0;
    for (int i = 0; i < seqs; i++) {
        const int n = qsl[i + 1] - qsl[i], npad = (n + KBLK - 1) / KBLK * KBLK;
        base[i + 1] = base[i] + (int64_t)npad * D * kv_heads;
        items += heads * ((n + QT - 1) / QT);
    }
    uint16_t *kt = aligned_alloc(64, (size_t)base[seqs] * 2 * 2 + 64);
    int32_t *order = malloc(sizeof(int32_t) * 3 * (items ? items : 1));
    if (!kt || !order) {
        free(base), free(kt), free(order);
        return 2;
    }
    uint16_t *vt = kt + base[seqs];
    /* items (sequence, head, query tile), the latest tiles (most keys) first */
    int at = 0, most = 0;
    for (int i = 0; i < seqs; i++)
        most = qsl[i + 1] - qsl[i] > most ? qsl[i + 1] - qsl[i] : most;
    for (int t = (most + QT - 1) / QT - 1; t >= 0; t--)
        for (int i = 0; i < seqs; i++)
            if (t * QT < qsl[i + 1] - qsl[i])
                for (int h = 0; h < heads; h++) {
                    order[3 * at] = i, order[3 * at + 1] = h, order[3 * at + 2] = t;
                    at++;
                }
    const job_t job = {q, q_tok, q_head, out, heads, kv_heads, D, scale};
    const int group = heads / kv_heads;
#pragma omp parallel num_threads(threads > 0 ? threads : 1)
    {
        load_tile_config();
#pragma omp for schedule(static)
        for (int w = 0; w < seqs * kv_heads; w++) {
            const int i = w / kv_heads, g = w % kv_heads, n = qsl[i + 1] - qsl[i];
            const int npad = (n + KBLK - 1) / KBLK * KBLK;
            const int64_t off = base[i] + (int64_t)g * npad * D;
            k_tiles(k + qsl[i] * k_tok + g * k_head, k_tok, n, npad, D, kt + off);
            v_tiles(v + qsl[i] * v_tok + g * v_head, v_tok, n, npad, D, vt + off);
        }
#pragma omp for schedule(dynamic, 1)
        for (int w = 0; w < items; w++) {
            const int i = order[3 * w], h = order[3 * w + 1], t = order[3 * w + 2];
            const int n = qsl[i + 1] - qsl[i], npad = (n + KBLK - 1) / KBLK * KBLK;
            const int64_t off = base[i] + (int64_t)(h / group) * npad * D;
            item(&job, qsl[i], n, t * QT, h, kt + off, vt + off);
        }
        _tile_release();
    }
    free(base), free(kt), free(order);
    return 0;
}

#else /* no AMX in this build */

int32_t splitserve_prefill_attention_amx(const float *q, int64_t q_tok, int64_t q_head,
                                         const float *k, int64_t k_tok, int64_t k_head,
                                         const float *v, int64_t v_tok, int64_t v_head, float *out,
                                         const int32_t *qsl, int32_t seqs, int32_t heads,
                                         int32_t kv_heads, int32_t head_dim, float scale,
                                         int32_t threads)
{
    (void)q, (void)q_tok, (void)q_head, (void)k, (void)k_tok, (void)k_head, (void)v;
    (void)v_tok, (void)v_head, (void)out, (void)qsl, (void)seqs, (void)heads, (void)kv_heads;
    (void)head_dim, (void)scale, (void)threads;
    return 1;
}

#endif
