/*
 * The prefill product over packed weights: C[M, N] (+)= A[M, K] @ W^T for PREFILL_MIN_ROWS
 * rows and more (prefill chunks, decode batches), W group-quantized as quant_linear.c reads
 * it. Blocked for the caches the build found on the host (build.py passes their sizes; 32 KB
 * and 1 MB where it found none):
 *   - a block of PANELS panels over KC inputs is dequantized into a buffer that fills half
 *     of L1, and every row tile of the row block runs over it while it is there;
 *   - a row block of MC rows spans the whole of K in half of L2, so every panel block of the
 *     thread reads A from L2;
 *   - the micro-tile keeps ROWS rows x PANELS panels of C in registers: with 16 lanes
 *     (AVX-512, 32 registers) 12 rows x 2 panels, 24 sums, one broadcast of A for two FMAs;
 *     with 8 (AVX2, 16 registers) 6 rows x 1 panel, 12 sums, also one broadcast for two.
 *     (linear.c's 12 x 1 at 16 lanes spends one broadcast per FMA.)
 * Threads split the panel blocks. Each element of C is summed over k in order, from its
 * value (accumulating) or zero, partial sums stored between KC blocks (fp32 stores are
 * exact): the same FMAs in the same order as linear.c's tiles over the dequantized weights,
 * so the results are that kernel's, bit for bit.
 */
#include <stdint.h>

#include "quant_dequant.h"

#ifdef _OPENMP
#include <omp.h>
#endif

#include "cache_sizes.h"

#if VW == 16
#define ROWS 12
#define PANELS 2
#else
#define ROWS 6
#define PANELS 1
#endif
#define PREFILL_MIN_ROWS 7 /* up to 6 rows, quant_linear.c's tiles dequantize in registers */
/* inputs per dequantized block: PANELS panels of KC rows of 64 bytes in half of L1 */
#define KC_RAW (SPLITSERVE_L1D_BYTES / 2 / (PANELS * PANEL * 4) / 16 * 16)
#define KC (KC_RAW < 16 ? 16 : KC_RAW > 1024 ? 1024 : KC_RAW)

/* R rows times np panels (np <= PANELS) of the buffer b ([np][kc][16]) over kc inputs. */
static inline __attribute__((always_inline)) void tile(
    const float *a, int64_t lda, const float *b, int kc, float *c, int64_t ldc, int load_c,
    const int R, const int NP)
{
    vw acc[ROWS][PANELS * NV];
    for (int r = 0; r < R; r++)
        for (int j = 0; j < NP * NV; j++)
            acc[r][j] = load_c ? loadw(c + r * ldc + j * VW) : splatw(0.0f);
    for (int k = 0; k < kc; k++) {
        vw w[PANELS * NV];
        for (int p = 0; p < NP; p++)
            for (int j = 0; j < NV; j++) w[p * NV + j] = loadw(b + (p * kc + k) * PANEL + j * VW);
        for (int r = 0; r < R; r++) {
            const vw ar = splatw(a[r * lda + k]);
            for (int j = 0; j < NP * NV; j++) acc[r][j] += ar * w[j];
        }
    }
    for (int r = 0; r < R; r++)
        for (int j = 0; j < NP * NV; j++) storew(c + r * ldc + j * VW, acc[r][j]);
}

/* The last rows of a block (fewer than ROWS): each height unrolled on its own. */
static void tail(const float *a, int64_t lda, const float *b, int kc, float *c, int64_t ldc,
                 int load_c, int rows, const int NP)
{
#define TAIL_CASE(n) \
    case n: tile(a, lda, b, kc, c, ldc, load_c, n, NP); break;
    switch (rows) {
        TAIL_CASE(1) TAIL_CASE(2) TAIL_CASE(3) TAIL_CASE(4) TAIL_CASE(5)
#if ROWS > 6
        TAIL_CASE(6) TAIL_CASE(7) TAIL_CASE(8) TAIL_CASE(9) TAIL_CASE(10) TAIL_CASE(11)
#endif
    default: break;
    }
#undef TAIL_CASE
}

/* Rows [0, rows) of A (rows lda apart, columns k0 on) times the buffer's np panels. */
static void block_rows(const float *a, int64_t lda, const float *b, int kc, float *c,
                       int64_t ldc, int load_c, int rows, int np)
{
    int m = 0;
    if (np == PANELS) {
        for (; m + ROWS <= rows; m += ROWS)
            tile(a + m * lda, lda, b, kc, c + m * ldc, ldc, load_c, ROWS, PANELS);
        tail(a + m * lda, lda, b, kc, c + m * ldc, ldc, load_c, rows - m, PANELS);
        return;
    }
    for (; m + ROWS <= rows; m += ROWS)
        tile(a + m * lda, lda, b, kc, c + m * ldc, ldc, load_c, ROWS, 1);
    tail(a + m * lda, lda, b, kc, c + m * ldc, ldc, load_c, rows - m, 1);
}

/* Rows from which this kernel runs (quant_linear.c asks). */
int splitserve_quant_prefill_rows(void) { return PREFILL_MIN_ROWS; }

/* The block sizes, for the tests and the benchmark: {ROWS, PANELS, KC, MC for this K}. */
static int row_block(int K)
{
    const int mc = (int)((int64_t)SPLITSERVE_L2_BYTES / 2 / ((int64_t)K * 4)) / ROWS * ROWS;
    return mc < ROWS ? ROWS : mc;
}

void splitserve_quant_prefill_blocking(int32_t K, int32_t *out)
{
    out[0] = ROWS, out[1] = PANELS, out[2] = KC, out[3] = row_block(K);
}

/* 1 if it computed C (M >= PREFILL_MIN_ROWS), else 0. */
int splitserve_quant_prefill(const float *a, int64_t lda, const qweight *w, int M, int N,
                             float *c, int64_t ldc, int accumulate, int threads)
{
    if (M < PREFILL_MIN_ROWS) return 0;
    const int K = w->K, panels = N / PANEL, blocks = (panels + PANELS - 1) / PANELS;
    const int mc = row_block(K);
#pragma omp parallel num_threads(threads > 0 ? threads : 1) if ((int64_t)M * N * K >= 1 << 16)
    {
        float b[PANELS * KC * PANEL] __attribute__((aligned(64)));
        const int nt = omp_get_num_threads(), id = omp_get_thread_num();
        const int lo = (int)((int64_t)blocks * id / nt), hi = (int)((int64_t)blocks * (id + 1) / nt);
        for (int m0 = 0; m0 < M; m0 += mc) {
            const int rows = M - m0 < mc ? M - m0 : mc;
            for (int u = lo; u < hi; u++) {
                const int p0 = u * PANELS, np = panels - p0 < PANELS ? panels - p0 : PANELS;
                for (int k0 = 0; k0 < K; k0 += KC) {
                    const int kc = K - k0 < KC ? K - k0 : KC;
                    for (int p = 0; p < np; p++) dequant_rows(w, p0 + p, k0, k0 + kc, b + p * kc * PANEL);
                    block_rows(a + m0 * lda + k0, lda, b, kc, c + m0 * ldc + p0 * PANEL, ldc,
                               accumulate || k0 > 0, rows, np);
                }
            }
        }
    }
    return 1;
}
