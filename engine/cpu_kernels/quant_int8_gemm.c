/*
 * Products of many rows on integer dots (prefill chunks, decode batches; quant_int8.c sends
 * them from QI8_GEMM_ROWS rows on): C[M, N] (+)= Q8(A) @ W^T, the same sums as
 * quant_int8.c's few-row tiles (exact integer sums per block, scaled in fp32), blocked like
 * quant_prefill.c for the caches the build read from the host (32 KB and 1 MB where it
 * found none):
 *   - a block of PANELS panels over KC inputs goes into a buffer of half of L1: 4-bit codes
 *     widened to one byte each (0..15, lines of 4 inputs x 16 columns), the block's scales
 *     and mins as fp32; every row tile of the row block runs over it while it is there
 *     (8-bit codes, already such lines, are read where they lie);
 *   - a row block of MC rows of int8 activations spans K in half of L2;
 *   - the micro-tile: ROWS rows x PANELS panels; per 4 inputs, one line load per panel and
 *     one broadcast per row feed ROWS x PANELS integer dots: AVX-512 VNNI VPDPBUSD into int32
 *     (4 x 4 x 2: 8 dots per 6 loads); AVX2 (4-bit codes only) VPMADDUBSW into int16,
 *     widened once per block by VPMADDWD (a block's int16 sums stay below 2^15: 8 products
 *     of at most 2 * 15 * 127 for a block of 32);
 *   - per block, the integer sums to fp32 times d * scale into the fp32 sums, which stay in
 *     registers over the buffer's inputs with AVX-512; with AVX2 they go to the output rows
 *     (16 registers do not hold 8 int16 sums and 8 fp32 ones: the compiler had kept the int16
 *     sums on the stack, reloaded every 4 inputs); per group the mins times the group's sum
 *     of d q.
 * Threads split the panel blocks. Where the AMX-int8 kernel is on (quant_int8_amx.c), it
 * takes each row block's rows 16 at a time over the same buffers, and these tiles the rest.
 */
#include "quant_int8.h"

#ifdef _OPENMP
#include <omp.h>
#endif

#include "cache_sizes.h"

#if QI8_ISA > 0

#define ROWS 4
#define PANELS QI8_PANELS
#define NV (16 / VW) /* vectors of fp32 sums per panel */
/* inputs per buffer: PANELS panels of one byte per (input, column) in half of L1 */
#define KC_RAW (SPLITSERVE_L1D_BYTES / 2 / (PANELS * 16) / 32 * 32)
#define KC (KC_RAW < 32 ? 32 : KC_RAW > 2048 ? 2048 : KC_RAW)

/* A panel's 16 columns as HALVES vectors: the sums of one (row, panel) are iacc[HALVES],
   plain vectors (a struct of two would be kept in memory, not registers). */
#if QI8_ISA == 2
#define HALVES 1
typedef __m512i ivec; /* 16 columns of int32 sums; a line of codes */
static inline ivec wload(const uint8_t *p, int h) { return (void)h, _mm512_loadu_si512(p); }
static inline __m512i abcast(int32_t x) { return _mm512_set1_epi32(x); }
static inline ivec izero(void) { return _mm512_setzero_si512(); }
static inline ivec idot(ivec acc, ivec w, __m512i a) { return _mm512_dpbusd_epi32(acc, w, a); }
/* 8-bit codes carry +128: take off 128 * sum(q) of the block */
static inline void ifloat(const ivec *acc, int bits, int32_t sum_q, vw *f)
{
    f[0] = (vw)_mm512_cvtepi32_ps(bits == 8 ? _mm512_sub_epi32(acc[0], _mm512_set1_epi32(128 * sum_q)) : acc[0]);
}
#else
#define HALVES 2
typedef __m256i ivec; /* columns 0-7 or 8-15: int16 sums, two a column; half a line */
static inline ivec wload(const uint8_t *p, int h) { return _mm256_loadu_si256((const __m256i *)(p + 32 * h)); }
static inline __m256i abcast(int32_t x) { return _mm256_set1_epi32(x); }
static inline ivec izero(void) { return _mm256_setzero_si256(); }
static inline ivec idot(ivec acc, ivec w, __m256i a) { return _mm256_add_epi16(acc, _mm256_maddubs_epi16(w, a)); }
static inline void ifloat(const ivec *acc, int bits, int32_t sum_q, vw *f) /* 4-bit only */
{
    float t[16];
    const __m256i ones = _mm256_set1_epi16(1);
    (void)bits, (void)sum_q;
    for (int h = 0; h < 2; h++)
        _mm256_storeu_ps(t + 8 * h, _mm256_cvtepi32_ps(_mm256_madd_epi16(acc[h], ones)));
    for (int v = 0; v < NV; v++) f[v] = loadw(t + v * VW);
}
#endif

/* R rows from m0 times np panels (np <= PANELS) of the chunk into c. */
static inline __attribute__((always_inline)) void tile(const qi8_rows *a, const qi8_chunk *ch,
                                                       int bits, int m0, float *c, int64_t ldc,
                                                       int load_c, const int R, const int NP)
{
    const int K = a->K, qb = a->qb, per = a->group / qb, groups = ch->kc / a->group;
    const int blocks_row = K / qb, groups_row = K / a->group, g0 = ch->k0 / a->group;
#if QI8_ISA == 2
    vw out[ROWS][PANELS][NV];
#define OUT(r, p, v) out[r][p][v]
#else /* AVX2's 16 registers hold the int16 sums; the fp32 sums stay in C (same order) */
#define OUT(r, p, v) (*(vwu *)(c + (r) * ldc + (p) * 16 + (v) * VW))
#endif
    for (int r = 0; r < R; r++)
        for (int p = 0; p < NP; p++)
            for (int v = 0; v < NV; v++)
                OUT(r, p, v) = load_c ? loadw(c + r * ldc + p * 16 + v * VW) : splatw(0.0f);
    const int8_t *q = a->q + (int64_t)m0 * K + ch->k0;
    for (int g = 0; g < groups; g++) {
        for (int b = 0; b < per; b++) {
            const int kb = (g * per + b) * qb;
            ivec acc[ROWS][PANELS][HALVES];
            for (int r = 0; r < R; r++)
                for (int p = 0; p < NP; p++)
                    for (int h = 0; h < HALVES; h++) acc[r][p][h] = izero();
            for (int k = kb; k < kb + qb; k += 4) {
                ivec w[PANELS][HALVES];
                for (int p = 0; p < NP; p++)
                    for (int h = 0; h < HALVES; h++) w[p][h] = wload(ch->lines[p] + k / 4 * 64, h);
                for (int r = 0; r < R; r++) {
                    const __typeof__(abcast(0)) x = abcast(qi8_four(q + (int64_t)r * K + k));
                    for (int p = 0; p < NP; p++)
                        for (int h = 0; h < HALVES; h++) acc[r][p][h] = idot(acc[r][p][h], w[p][h], x);
                }
            }
            for (int r = 0; r < R; r++) {
                const int64_t i = (int64_t)(m0 + r) * blocks_row + (ch->k0 + kb) / qb;
                const vw dr = splatw(a->d[i]);
                for (int p = 0; p < NP; p++) {
                    vw f[NV];
                    ifloat(acc[r][p], bits, a->sums[i], f);
                    const float *sc = ch->scale + (p * groups + g) * 16;
                    for (int v = 0; v < NV; v++) OUT(r, p, v) += f[v] * (dr * loadw(sc + v * VW));
                }
            }
        }
        if (!ch->min) continue;
        for (int r = 0; r < R; r++) {
            const vw ds = splatw(a->dsum[(int64_t)(m0 + r) * groups_row + g0 + g]);
            for (int p = 0; p < NP; p++)
                for (int v = 0; v < NV; v++)
                    OUT(r, p, v) += ds * loadw(ch->min + (p * groups + g) * 16 + v * VW);
        }
    }
    for (int r = 0; r < R; r++)
        for (int p = 0; p < NP; p++)
            for (int v = 0; v < NV; v++) storew(c + r * ldc + p * 16 + v * VW, OUT(r, p, v));
#undef OUT
}

/* The last rows of a block (fewer than ROWS), each height unrolled on its own. */
static void tail(const qi8_rows *a, const qi8_chunk *ch, int bits, int m0, float *c, int64_t ldc,
                 int load_c, int rows, const int NP)
{
    switch (rows) {
    case 1: tile(a, ch, bits, m0, c, ldc, load_c, 1, NP); break;
    case 2: tile(a, ch, bits, m0, c, ldc, load_c, 2, NP); break;
    case 3: tile(a, ch, bits, m0, c, ldc, load_c, 3, NP); break;
    default: break;
    }
}

/* Rows [m0, m0 + rows) times the chunk's np panels. */
static void block_rows(const qi8_rows *a, const qi8_chunk *ch, int bits, int m0, int rows, float *c,
                       int64_t ldc, int load_c, int np)
{
    int m = 0;
    if (np == PANELS) {
        for (; m + ROWS <= rows; m += ROWS)
            tile(a, ch, bits, m0 + m, c + m * ldc, ldc, load_c, ROWS, PANELS);
        tail(a, ch, bits, m0 + m, c + m * ldc, ldc, load_c, rows - m, PANELS);
        return;
    }
    for (; m + ROWS <= rows; m += ROWS) tile(a, ch, bits, m0 + m, c + m * ldc, ldc, load_c, ROWS, 1);
    tail(a, ch, bits, m0 + m, c + m * ldc, ldc, load_c, rows - m, 1);
}

/* Panels p0.. (np of them) over inputs [k0, k0 + kc) into the buffers, described by ch. */
static void fill(const qi8_weight *w, int K, int p0, int np, int k0, int kc, uint8_t *codes,
                 float *params, qi8_chunk *ch)
{
    const int groups = kc / w->group, groups_row = K / w->group, g0 = k0 / w->group;
    float *scale = params, *min = params + PANELS * groups * 16;
    for (int p = 0; p < np; p++) {
        const int64_t panel = p0 + p;
        if (w->bits == 4) {
            const uint8_t *src = w->codes + (panel * (K / 8) + k0 / 8) * 64;
            uint8_t *dst = codes + (int64_t)p * kc * 16;
            for (int l = 0; l < kc / 8; l++)
                for (int i = 0; i < 64; i++) {
                    dst[128 * l + i] = src[64 * l + i] & 15;
                    dst[128 * l + 64 + i] = src[64 * l + i] >> 4;
                }
            ch->lines[p] = dst;
        } else {
            ch->lines[p] = w->codes + (panel * (K / 4) + k0 / 4) * 64;
        }
        for (int g = 0; g < groups; g++) {
            const int64_t at = (panel * groups_row + g0 + g) * 16;
            qi8_params16(w->scales, w->halves & 1, at, scale + (p * groups + g) * 16);
            if (w->mins) qi8_params16(w->mins, w->halves & 2, at, min + (p * groups + g) * 16);
        }
    }
    ch->scale = scale, ch->min = w->mins ? min : 0, ch->k0 = k0, ch->kc = kc;
}

int qi8_gemm(const qi8_rows *a, const qi8_weight *w, int M, int N, float *c, int64_t ldc,
             int accumulate, int threads)
{
    const int K = a->K, group = w->group, kc_max = KC / group * group;
    if ((QI8_ISA == 1 && w->bits != 4) || kc_max < group) return 0;
    const int panels = N / 16, units = (panels + PANELS - 1) / PANELS;
    int mc = (int)((int64_t)SPLITSERVE_L2_BYTES / 2 / K) / ROWS * ROWS;
    mc = mc < ROWS ? ROWS : mc;
    const int amx = M >= 16 && qi8_amx_ready();
    if (amx) mc = mc < 32 ? 32 : mc / 32 * 32; /* pairs of AMX m-tiles */
#pragma omp parallel num_threads(threads > 0 ? threads : 1) if ((int64_t)M * N * K >= 1 << 16)
    {
        uint8_t codes[PANELS * KC * 16] __attribute__((aligned(64)));
        float params[2 * PANELS * (KC / 16) * 16] __attribute__((aligned(64)));
        const int nt = omp_get_num_threads(), id = omp_get_thread_num();
        if (amx) qi8_amx_begin(a->qb);
        const int lo = (int)((int64_t)units * id / nt), hi = (int)((int64_t)units * (id + 1) / nt);
        for (int m0 = 0; m0 < M; m0 += mc) {
            const int rows = M - m0 < mc ? M - m0 : mc;
            for (int u = lo; u < hi; u++) {
                const int p0 = u * PANELS, np = panels - p0 < PANELS ? panels - p0 : PANELS;
                for (int k0 = 0; k0 < K; k0 += kc_max) {
                    qi8_chunk ch = {{0}, 0, 0, 0, 0};
                    fill(w, K, p0, np, k0, K - k0 < kc_max ? K - k0 : kc_max, codes, params, &ch);
                    const int load_c = accumulate || k0 > 0;
                    float *cb = c + m0 * ldc + p0 * 16;
                    const int done = amx ? qi8_amx_rows(a, &ch, w->bits, m0, rows, cb, ldc, load_c, np) : 0;
                    block_rows(a, &ch, w->bits, m0 + done, rows - done, cb + done * ldc, ldc, load_c, np);
                }
            }
        }
    }
    return 1;
}

#else
int qi8_gemm(const qi8_rows *a, const qi8_weight *w, int M, int N, float *c, int64_t ldc,
             int accumulate, int threads)
{
    (void)a, (void)w, (void)M, (void)N, (void)c, (void)ldc, (void)accumulate, (void)threads;
    return 0;
}
#endif
