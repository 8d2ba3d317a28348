/*
 * The batched sampler's draw on the CPU, one pass per row: greedy argmax, or temperature,
 * top-k (a partial selection, not a sort of the vocabulary), the top-p nucleus, min-p and
 * the inverse-CDF draw with the row's counter-based uniform number (splitmix64 of seed and
 * draw count). It follows engine/sampling/sampler.py step by step, in the same float
 * arithmetic where torch's is sequential (the CDF accumulates in double and is stored as
 * float, as torch's CPU cumsum does), so both give the same token unless a draw falls
 * within rounding of a CDF boundary. Penalties, logit_bias and logprobs stay tensor ops
 * before and after this.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "vec8.h"

#define PARALLEL_MIN 65536

typedef int32_t v8iu __attribute__((vector_size(32), aligned(4))); /* unaligned access */

typedef struct {
    float value;
    int32_t index;
} entry;

static double uniform_draw(int64_t seed, int64_t n)
{
    uint64_t z = (uint64_t)seed * 0x9E3779B97F4A7C15ull + (uint64_t)n + 1u;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return (double)(z >> 11) * 0x1.0p-53;
}

/* a before b: larger value first, then the lower token id */
static inline int before(const entry *a, const entry *b)
{
    return a->value > b->value || (a->value == b->value && a->index < b->index);
}

static inline void swap(entry *a, entry *b)
{
    const entry t = *a;
    *a = *b;
    *b = t;
}

static int by_rank(const void *pa, const void *pb)
{
    const entry *a = pa, *b = pb;
    return before(a, b) ? -1 : before(b, a) ? 1 : 0;
}

/* e[0..n) best first (insertion for the short runs it mostly gets) */
static void sort_by_rank(entry *e, int n)
{
    if (n > 32) {
        qsort(e, (size_t)n, sizeof(entry), by_rank);
        return;
    }
    for (int i = 1; i < n; i++) {
        const entry v = e[i];
        int j = i - 1;
        while (j >= 0 && before(&v, &e[j])) {
            e[j + 1] = e[j];
            j--;
        }
        e[j + 1] = v;
    }
}

/* A row's tokens in rank order, sorted lazily: a counting sort into BUCKETS buckets of
   (best - value) puts every bucket's tokens before the next's (the map is monotone), and a
   bucket is sorted exactly only when a token of it is asked for. */
#define BUCKETS 256
typedef struct {
    entry *e;
    int32_t *start; /* BUCKETS + 1 offsets */
    int bucket, ready;
} ranked;

static inline int bucket_of(float value, float best, float scale)
{
    const float d = (best - value) * scale;
    return d < (float)(BUCKETS - 1) ? (int)d : BUCKETS - 1; /* -inf and NaN: the last */
}

/* Bucket the tokens of x (values; low: the smallest above -inf) into r. With limit < vocab
   only the buckets that hold the best `limit` tokens are filled. */
static void rank_tokens(ranked *r, const float *x, int vocab, float best, float low, int limit,
                        int32_t *picked, int32_t *ids)
{
    int32_t *start = r->start;
    const float span = best - low;
    const float scale = span > 0.0f && span < INFINITY ? (float)(BUCKETS - 1) / span : 0.0f;
    int i = 0;
    for (; i + 8 <= vocab; i += 8) {
        v8 d = (splat8(best) - load8(x + i)) * splat8(scale);
        d = select8(d < splat8((float)(BUCKETS - 1)), d, splat8((float)(BUCKETS - 1)));
        *(v8iu *)(void *)(ids + i) = __builtin_convertvector(d, v8i);
    }
    for (; i < vocab; i++) ids[i] = bucket_of(x[i], best, scale);
    memset(start, 0, sizeof(int32_t) * (BUCKETS + 1));
    for (i = 0; i < vocab; i++) start[ids[i] + 1]++;
    int last = BUCKETS - 1; /* the last bucket needed */
    for (int b = 0, total = 0; b < BUCKETS; b++) {
        total += start[b + 1];
        if (total >= limit) {
            last = b;
            break;
        }
    }
    for (int b = 0; b < BUCKETS; b++) start[b + 1] += start[b];
    int32_t next[BUCKETS];
    memcpy(next, start, sizeof(next));
    int n = 0;
    if (last < BUCKETS - 1) {
        for (i = 0; i < vocab; i++) {
            picked[n] = i;
            n += ids[i] <= last;
        }
    } else {
        for (i = 0; i < vocab; i++) picked[i] = i;
        n = vocab;
    }
    for (int j = 0; j < n; j++) {
        i = picked[j];
        r->e[next[ids[i]]++] = (entry){x[i], i};
    }
    r->bucket = 0;
    r->ready = 0;
}

/* make r->e[0..j] exact */
static inline void rank_up_to(ranked *r, int j)
{
    while (r->ready <= j) {
        const int b = r->bucket++, lo = r->start[b], hi = r->start[b + 1];
        sort_by_rank(r->e + lo, hi - lo);
        r->ready = hi;
    }
}

/* e[0..n) by token id (n small: insertion) */
static void sort_by_index(entry *e, int n)
{
    for (int i = 1; i < n; i++) {
        const entry v = e[i];
        int j = i - 1;
        while (j >= 0 && e[j].index > v.index) {
            e[j + 1] = e[j];
            j--;
        }
        e[j + 1] = v;
    }
}

/* the inverse-CDF draw over weights w: the first token whose cumulative weight (summed in
   double, compared as float: torch's CPU cumsum) exceeds u times the total */
static inline float draw_target(double total, double u)
{
    const float total_f = (float)total;
    const float target = (float)(u * (double)total_f);
    const float below = nextafterf(total_f, 0.0f);
    return target < below ? target : below;
}

/* The first token whose running sum of weights (in double, compared as float, as torch's CPU
   cumsum) passes u times their total. */
static int64_t inverse_cdf(const float *weights, int vocab, double total, double u)
{
    const float target = draw_target(total, u);
    double acc = 0.0;
    for (int i = 0; i < vocab; i++) {
        acc += weights[i];
        if ((float)acc > target) return i;
    }
    return vocab - 1;
}

/* The token of one random row, from x: the row divided by its temperature. Scratch: sorted
   (vocab entries), weights (vocab floats), picked (vocab ints), start (BUCKETS + 1 ints). */
static int64_t draw_row(const float *x, int vocab, int64_t k, float p, float min_p, double u,
                        entry *sorted, float *weights, int32_t *picked, int32_t *start)
{
    v8 best8 = splat8(x[0]), low8 = splat8(INFINITY);
    int i = 0;
    for (; i + 8 <= vocab; i += 8) {
        const v8 v = load8(x + i);
        best8 = select8(v > best8, v, best8);
        low8 = select8((v < low8) & (v > splat8(-INFINITY)), v, low8);
    }
    float best = best8[0], low = low8[0];
    for (int l = 1; l < 8; l++) {
        best = best8[l] > best ? best8[l] : best;
        low = low8[l] < low ? low8[l] : low;
    }
    for (; i < vocab; i++) {
        best = x[i] > best ? x[i] : best;
        low = x[i] < low && x[i] > -INFINITY ? x[i] : low;
    }
    if (k >= vocab && p >= 1.0f) {
        /* no filter: every token, weighted relative to the best */
        double total = 0.0;
        for (i = 0; i < vocab; i++) {
            float w = expf(x[i] - best);
            w = w < min_p ? 0.0f : w;
            weights[i] = w;
            total += w;
        }
        return inverse_cdf(weights, vocab, total, u);
    }
    /* top-k / top-p: the tokens best first, sorted only as far as needed */
    const int m = k < vocab ? (int)k : vocab;
    ranked r = {sorted, start, 0, 0};
    rank_tokens(&r, x, vocab, best, low, m, picked, (int32_t *)(void *)weights);
    double sum = 0.0;
    if (m < vocab) {  /* the top-k's weights, kept for the nucleus below */
        rank_up_to(&r, m - 1);
        for (int j = 0; j < m; j++) {
            weights[j] = expf(sorted[j].value - best);
            sum += weights[j];
        }
    } else {
        for (i = 0; i < vocab; i++) sum += expf(x[i] - best);
    }
    /* log of the nucleus's normalizer: the top-k's, or every token's */
    const float norm = best + (float)log(sum);
    /* the nucleus ends at the first token whose strictly better tokens hold p (never the
       best token); the weights are relative to the best, then min-p drops the small ones */
    double cumulative = 0.0;
    int n = 0;
    for (int j = 0; j < m; j++) {
        rank_up_to(&r, j);
        const float value = sorted[j].value;
        const float prob = expf(value - norm);
        cumulative += prob;
        if (j > 0 && p < 1.0f && (float)cumulative - prob >= p) break;
        const float w = m < vocab ? weights[j] : expf(value - best);
        if (w < min_p) continue;
        sorted[n].index = sorted[j].index;
        sorted[n++].value = w;
    }
    double total = 0.0;
    if (n <= 64) {
        sort_by_index(sorted, n);
        for (int j = 0; j < n; j++) total += sorted[j].value;
        const float target = draw_target(total, u);
        double acc = 0.0;
        for (int j = 0; j < n; j++) {
            acc += sorted[j].value;
            if ((float)acc > target) return sorted[j].index;
        }
        return sorted[n - 1].index;
    }
    for (i = 0; i < vocab; i++) weights[i] = 0.0f;
    for (int j = 0; j < n; j++) weights[sorted[j].index] = sorted[j].value;
    for (i = 0; i < vocab; i++) total += weights[i];
    return inverse_cdf(weights, vocab, total, u);
}

/* the first position of the largest value: per lane the first maximum and where it is
   (two sets of lanes, for independent chains), then the best lane, the lowest id on ties */
static int64_t argmax_row(const float *row, int vocab)
{
    v8 m0 = splat8(-INFINITY), m1 = m0;
    v8i at0 = {0, 1, 2, 3, 4, 5, 6, 7}, at1 = at0 + 8, i0 = at0, i1 = at1;
    const v8i step = {16, 16, 16, 16, 16, 16, 16, 16};
    int i = 0;
    for (; i + 16 <= vocab; i += 16) {
        const v8 a = load8(row + i), b = load8(row + i + 8);
        const v8i ga = a > m0, gb = b > m1;
        m0 = select8(ga, a, m0);
        m1 = select8(gb, b, m1);
        at0 = (i0 & ga) | (at0 & ~ga);
        at1 = (i1 & gb) | (at1 & ~gb);
        i0 += step;
        i1 += step;
    }
    float best = row[0];
    int64_t where = 0;
    if (i > 0) {
        best = m0[0];
        where = at0[0];
        for (int l = 0; l < 8; l++) {
            const float v[2] = {m0[l], m1[l]};
            const int w[2] = {at0[l], at1[l]};
            for (int h = 0; h < 2; h++)
                if (v[h] > best || (v[h] == best && w[h] < where)) {
                    best = v[h];
                    where = w[h];
                }
        }
    }
    for (; i < vocab; i++)
        if (row[i] > best) {
            best = row[i];
            where = i;
        }
    return where; /* -inf everywhere: 0, as torch */
}

/* One token per row of logits [rows, vocab] (row stride in floats). Greedy rows take the
   first largest logit; the others divide by temperature and draw. top_k >= vocab: off.
   Returns 0, or -1 when scratch memory could not be had. */
int splitserve_sample_f32(
    const float *logits, int64_t row_stride, int32_t rows, int32_t vocab, const uint8_t *greedy,
    const float *temperature, const int64_t *top_k, const float *top_p, const float *min_p,
    const int64_t *seed, const int64_t *draws, int64_t *out, int32_t threads)
{
    int failed = 0;
    const int parallel = (int64_t)rows * vocab >= PARALLEL_MIN;
#pragma omp parallel num_threads(threads > 0 ? threads : 1) if (parallel)
    {
        entry *sorted = NULL;
        float *x = NULL, *weights = NULL;
        int32_t *picked = NULL;
        int32_t start[BUCKETS + 1];
#pragma omp for schedule(dynamic, 8)
        for (int r = 0; r < rows; r++) {
            const float *row = logits + r * row_stride;
            if (greedy[r]) {
                out[r] = argmax_row(row, vocab);
                continue;
            }
            if (x == NULL) {
                sorted = malloc(sizeof(entry) * (size_t)vocab);
                x = malloc(sizeof(float) * (size_t)vocab);
                weights = malloc(sizeof(float) * (size_t)vocab);
                picked = malloc(sizeof(int32_t) * (size_t)vocab);
            }
            if (x == NULL || sorted == NULL || weights == NULL || picked == NULL) {
#pragma omp atomic write
                failed = 1;
                out[r] = 0;
                continue;
            }
            const float t = temperature[r];
            for (int i = 0; i < vocab; i++) x[i] = row[i] / t;
            out[r] = draw_row(x, vocab, top_k[r], top_p[r], min_p[r],
                              uniform_draw(seed[r], draws[r]), sorted, weights, picked, start);
        }
        free(sorted);
        free(x);
        free(weights);
        free(picked);
    }
    return failed ? -1 : 0;
}
