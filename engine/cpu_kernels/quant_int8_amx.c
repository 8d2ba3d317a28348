/*
 * The many-row integer product (quant_int8_gemm.c) on AMX-int8 tiles: the same sums as its
 * VNNI tiles, in the same order, so a row's result does not depend on which kernel took it.
 * For each block of qb inputs (32, or 16 where the group is 16) and each 32 x 32 output tile:
 *   - A tiles (4, 5): 16 rows of int8 activations, qb bytes a row, read where they lie (the
 *     rounded rows, K bytes apart);
 *   - B tiles (6, 7): a panel's qb / 4 lines of the buffer (16 columns x 4 inputs, unsigned
 *     codes: 4-bit widened to bytes by quant_int8_gemm.c's fill, 8-bit with their +128);
 *   - TDPBSUD (signed activations times unsigned codes) into 4 int32 C tiles (0-3: m-tile i,
 *     panel j at 2 i + j), started from zero, stored once the block is done;
 *   - the block's sums to fp32 (8-bit: less 128 * the block's sum of q first), times d *
 *     scale into the fp32 sums, kept in C over the chunk's inputs (as the AVX2 tiles keep
 *     theirs); per group the mins times the group's sum of d q. Each is the VNNI kernel's
 *     expression.
 * A block's sums are exact integers (below 2^24, so exact in fp32 too) whichever unit formed
 * them. The tile unit computes 16 x 16 x qb products per instruction; what bounds this
 * kernel is the fp32 scaling, once per block and output, as in the VNNI kernel, whose dots
 * it replaces.
 *
 * Built where the library targets AMX-TILE and AMX-INT8 with AVX-512 VNNI (Sapphire Rapids
 * on). SPLITSERVE_AMX_INT8_EMULATE builds it on any host with an integer-dot kernel, with
 * the tile instructions done in C from their definitions in Intel's SDM (LDTILECFG's shapes
 * checked as the hardware checks them: a bad shape aborts, as #UD would): the tests run the
 * kernel's logic that way where the host has no AMX (splitserve_qi8_amx_emulate_fault makes
 * it miscount: the check at first use must then refuse it). The engine turns the kernel on
 * only after that check has passed on the host (quant_int8.py amx_int8).
 */
#include <string.h>

#include "amx.h"
#include "quant_int8.h"

#if defined(SPLITSERVE_AMX_INT8_EMULATE) && QI8_ISA > 0
#define QI8_AMX 1
#include <stdio.h>
#elif defined(SPLITSERVE_HAS_AMX) && defined(__AMX_INT8__) && QI8_ISA == 2
#define QI8_AMX 1
#else
#define QI8_AMX 0
#endif

#if QI8_AMX

static int enabled; /* set by splitserve_qi8_amx_enable, before the products that use it */

#ifdef SPLITSERVE_AMX_INT8_EMULATE
static __thread tilecfg emu_cfg;
static __thread uint8_t emu_tiles[8][16][64];
static int emu_faulty; /* miscount one product of every TDPBSUD */

/* The tests' faulty unit: the check at first use must refuse the kernel. */
void splitserve_qi8_amx_emulate_fault(int32_t on) { emu_faulty = on; }

static void emu_fault(const char *what, int t)
{
    fprintf(stderr, "amx emulation: %s (tile %d)\n", what, t);
    abort();
}
static void emu_loadconfig(const tilecfg *cfg) { emu_cfg = *cfg; }
static void emu_zero(int t) { memset(emu_tiles[t], 0, sizeof emu_tiles[t]); }
static void emu_load(int t, const void *p, int64_t stride)
{
    if (emu_cfg.palette != 1) emu_fault("no configuration", t);
    emu_zero(t);
    for (int r = 0; r < emu_cfg.rows[t]; r++)
        memcpy(emu_tiles[t][r], (const uint8_t *)p + r * stride, emu_cfg.colsb[t]);
}
static void emu_store(int t, void *p, int64_t stride)
{
    for (int r = 0; r < emu_cfg.rows[t]; r++)
        memcpy((uint8_t *)p + r * stride, emu_tiles[t][r], emu_cfg.colsb[t]);
}
/* TDPBSUD: C[m].dword[n] += sum over k < A.colsb / 4, i < 4 of
   signed A[m].byte[4 k + i] * unsigned B[k].byte[4 n + i] */
static void emu_dpbsud(int c, int a, int b)
{
    const uint8_t *rows = emu_cfg.rows;
    const uint16_t *cb = emu_cfg.colsb;
    if (rows[a] != rows[c] || cb[a] / 4 != rows[b] || cb[b] != cb[c] || cb[a] % 4)
        emu_fault("shapes do not fit TDPBSUD", c);
    for (int m = 0; m < rows[c]; m++)
        for (int n = 0; n < cb[c] / 4; n++) {
            int32_t acc;
            memcpy(&acc, emu_tiles[c][m] + 4 * n, 4);
            for (int k = 0; k < cb[a] / 4; k++)
                for (int i = 0; i < 4; i++)
                    acc += (int8_t)emu_tiles[a][m][4 * k + i] * emu_tiles[b][k][4 * n + i];
            acc += emu_faulty && m == 5 && n == 3;
            memcpy(emu_tiles[c][m] + 4 * n, &acc, 4);
        }
}
#define TILE_CONFIG(cfg) emu_loadconfig(cfg)
#define TILE_ZERO(t) emu_zero(t)
#define TILE_LOAD(t, p, stride) emu_load(t, p, stride)
#define TILE_STORE(t, p, stride) emu_store(t, p, stride)
#define TILE_DPBSUD(c, a, b) emu_dpbsud(c, a, b)
static int permitted(void) { return 1; }
#else
#define TILE_CONFIG(cfg) _tile_loadconfig(cfg)
#define TILE_ZERO(t) _tile_zero(t)
#define TILE_LOAD(t, p, stride) _tile_loadd(t, p, stride)
#define TILE_STORE(t, p, stride) _tile_stored(t, p, stride)
#define TILE_DPBSUD(c, a, b) _tile_dpbsud(c, a, b)
static int permitted(void) { return amx_permitted(); }
#endif

#define NV (16 / VW) /* vectors a panel's row */
typedef int32_t vwi __attribute__((vector_size(VW * 4), aligned(4)));

int qi8_amx_ready(void) { return __atomic_load_n(&enabled, __ATOMIC_ACQUIRE) && permitted(); }

void qi8_amx_begin(int qb)
{
    tilecfg cfg = {0};
    cfg.palette = 1;
    for (int t = 0; t < 8; t++) {
        cfg.rows[t] = t < 6 ? 16 : qb / 4;
        cfg.colsb[t] = t == 4 || t == 5 ? qb : 64;
    }
    TILE_CONFIG(&cfg);
}

/* Rows [m0, m0 + 16 MT) times NP panels of the chunk into c (the rows' first output). */
static inline __attribute__((always_inline)) void tiles(const qi8_rows *a, const qi8_chunk *ch,
                                                        int bits, int m0, float *c, int64_t ldc,
                                                        int load_c, const int MT, const int NP)
{
    const int K = a->K, qb = a->qb, per = a->group / qb, groups = ch->kc / a->group;
    const int blocks_row = K / qb, groups_row = K / a->group, g0 = ch->k0 / a->group;
    int32_t sums[4][16][16] __attribute__((aligned(64)));
    /* the fp32 sums of (row, panel, vector) where they go: in C */
#define OUT(r, p, v) (c + (r) * ldc + (p) * 16 + (v) * VW)
    if (!load_c)
        for (int r = 0; r < 16 * MT; r++)
            for (int p = 0; p < NP; p++)
                for (int v = 0; v < NV; v++) storew(OUT(r, p, v), splatw(0.0f));
    const int8_t *q = a->q + (int64_t)m0 * K + ch->k0;
    for (int g = 0; g < groups; g++) {
        for (int b = 0; b < per; b++) {
            const int kb = (g * per + b) * qb;
            TILE_ZERO(0);
            if (NP > 1) TILE_ZERO(1);
            if (MT > 1) TILE_ZERO(2);
            if (MT > 1 && NP > 1) TILE_ZERO(3);
            TILE_LOAD(4, q + kb, K);
            if (MT > 1) TILE_LOAD(5, q + 16 * K + kb, K);
            TILE_LOAD(6, ch->lines[0] + kb / 4 * 64, 64);
            if (NP > 1) TILE_LOAD(7, ch->lines[1] + kb / 4 * 64, 64);
            TILE_DPBSUD(0, 4, 6);
            if (NP > 1) TILE_DPBSUD(1, 4, 7);
            if (MT > 1) TILE_DPBSUD(2, 5, 6);
            if (MT > 1 && NP > 1) TILE_DPBSUD(3, 5, 7);
            TILE_STORE(0, sums[0], 64);
            if (NP > 1) TILE_STORE(1, sums[1], 64);
            if (MT > 1) TILE_STORE(2, sums[2], 64);
            if (MT > 1 && NP > 1) TILE_STORE(3, sums[3], 64);
            for (int r = 0; r < 16 * MT; r++) {
                const int64_t i = (int64_t)(m0 + r) * blocks_row + (ch->k0 + kb) / qb;
                const vw dr = splatw(a->d[i]);
                const int32_t off = bits == 8 ? 128 * a->sums[i] : 0;
                for (int p = 0; p < NP; p++) {
                    const int32_t *s = sums[2 * (r / 16) + p][r % 16];
                    const float *sc = ch->scale + (p * groups + g) * 16;
                    for (int v = 0; v < NV; v++) {
                        const vw f = __builtin_convertvector(*(const vwi *)(s + v * VW) - off, vw);
                        float *o = OUT(r, p, v);
                        vw acc = loadw(o);
                        acc += f * (dr * loadw(sc + v * VW));
                        storew(o, acc);
                    }
                }
            }
        }
        if (!ch->min) continue;
        for (int r = 0; r < 16 * MT; r++) {
            const vw ds = splatw(a->dsum[(int64_t)(m0 + r) * groups_row + g0 + g]);
            for (int p = 0; p < NP; p++)
                for (int v = 0; v < NV; v++) {
                    float *o = OUT(r, p, v);
                    vw acc = loadw(o);
                    acc += ds * loadw(ch->min + (p * groups + g) * 16 + v * VW);
                    storew(o, acc);
                }
        }
    }
#undef OUT
}

int qi8_amx_rows(const qi8_rows *a, const qi8_chunk *ch, int bits, int m0, int rows, float *c,
                 int64_t ldc, int load_c, int np)
{
    int m = 0;
    for (; m + 32 <= rows; m += 32)
        if (np > 1) tiles(a, ch, bits, m0 + m, c + m * ldc, ldc, load_c, 2, 2);
        else tiles(a, ch, bits, m0 + m, c + m * ldc, ldc, load_c, 2, 1);
    if (m + 16 <= rows) {
        if (np > 1) tiles(a, ch, bits, m0 + m, c + m * ldc, ldc, load_c, 1, 2);
        else tiles(a, ch, bits, m0 + m, c + m * ldc, ldc, load_c, 1, 1);
        m += 16;
    }
    return m;
}

#else
int qi8_amx_ready(void) { return 0; }
void qi8_amx_begin(int qb) { (void)qb; }
int qi8_amx_rows(const qi8_rows *a, const qi8_chunk *ch, int bits, int m0, int rows, float *c,
                 int64_t ldc, int load_c, int np)
{
    (void)a, (void)ch, (void)bits, (void)m0, (void)rows, (void)c, (void)ldc, (void)load_c, (void)np;
    return 0;
}
#endif

/* 1 where this build has the AMX-int8 kernel (2: emulated in C, for the tests) */
int32_t splitserve_qi8_amx_built(void)
{
#if QI8_AMX && defined(SPLITSERVE_AMX_INT8_EMULATE)
    return 2;
#else
    return QI8_AMX;
#endif
}

/* Turn the kernel on or off for the products that follow; 1 if it is on (built, permitted). */
int32_t splitserve_qi8_amx_enable(int32_t on)
{
#if QI8_AMX
    __atomic_store_n(&enabled, on ? 1 : 0, __ATOMIC_RELEASE);
#endif
    (void)on;
    return qi8_amx_ready();
}
