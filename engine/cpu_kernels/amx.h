/*
 * What the AMX kernels (quant_amx.c, quant_amx_bf16.c, quant_int8_amx.c) share: whether this
 * build has the tiles (SPLITSERVE_HAS_AMX: the build targets AMX-TILE, AMX-BF16, AVX512-BF16,
 * AVX512-BW and AVX512-VBMI on Linux), the OS's grant of the tile state, the tile
 * configuration, per-thread buffers and bf16 conversions.
 */
#ifndef SPLITSERVE_AMX_H
#define SPLITSERVE_AMX_H

#include <stdint.h>
#include <stdlib.h>

#if defined(__x86_64__) && defined(__AMX_TILE__) && defined(__AMX_BF16__) && \
    defined(__AVX512BF16__) && defined(__AVX512BW__) && defined(__AVX512VBMI__) && \
    defined(__linux__)
#define SPLITSERVE_HAS_AMX 1
#include <immintrin.h>
#include <omp.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

/* LDTILECFG's 64 bytes: palette 1 gives 8 tiles of up to 16 rows x 64 bytes */
typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} __attribute__((packed, aligned(64))) tilecfg;

#ifdef SPLITSERVE_HAS_AMX

#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18
#define KSTEP 32 /* bf16 along K in one tile step */
#define TILE_BYTES 1024

/* Linux hands out the tile state only on request, once per process; the request is
   idempotent, so threads racing here all get the same answer. */
static inline int amx_permitted(void)
{
    static int state; /* 0: not asked yet, 1: granted, -1: refused */
    int s = __atomic_load_n(&state, __ATOMIC_ACQUIRE);
    if (!s) {
        s = syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0 ? 1 : -1;
        __atomic_store_n(&state, s, __ATOMIC_RELEASE);
    }
    return s > 0;
}

/* Every thread loads it before its first tile instruction (other libraries in the process
   may have loaded theirs): 8 tiles of 16 rows x 64 bytes. */
static inline void load_tile_config(void)
{
    tilecfg cfg = {0};
    cfg.palette = 1;
    for (int t = 0; t < 8; t++) {
        cfg.rows[t] = 16;
        cfg.colsb[t] = 64;
    }
    _tile_loadconfig(&cfg);
}

/* A buffer of `bytes`, 64-byte aligned, kept per thread for the next call; NULL when memory
   ran out. */
static inline void *grow(void **buf, size_t *cap, size_t bytes)
{
    if (bytes > *cap) {
        free(*buf);
        *buf = aligned_alloc(64, (bytes + 63) / 64 * 64);
        *cap = *buf ? bytes : 0;
    }
    return *buf;
}

/* In a parallel region, every thread: its buffer of `bytes` (kept in *buf for the next call)
   and the tile configuration loaded, once all threads have theirs; NULL in every thread
   when one of them ran out of memory (*failed, shared, is then set). */
static inline void *thread_tiles(void **buf, size_t *cap, size_t bytes, int *failed)
{
    void *b = grow(buf, cap, bytes);
    if (!b) __atomic_store_n(failed, 1, __ATOMIC_RELAXED);
#pragma omp barrier
    if (__atomic_load_n(failed, __ATOMIC_RELAXED)) return NULL;
    load_tile_config();
    return b;
}

/* The share [*lo, *hi) of n items of this thread of the parallel region */
static inline void thread_share(int n, int *lo, int *hi)
{
    const int nt = omp_get_num_threads(), id = omp_get_thread_num();
    *lo = (int)((int64_t)n * id / nt), *hi = (int)((int64_t)n * (id + 1) / nt);
}

/* x rounded to bf16 (nearest even), as 16 words; and words of bf16 back to fp32 (exact) */
static inline __m256i bf16_bits(__m512 x) { return (__m256i)_mm512_cvtneps_pbh(x); }
static inline __m512 bf16_value(__m256i h)
{
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

/* a packed weight's groups: w = code * scale + min per `group` along K */
typedef struct {
    const void *scales, *mins;
    int K, group, halves; /* halves: bit 0 fp16 scales, bit 1 fp16 mins */
} groups_t;

/* 16 scales or mins from element `at` of p (fp16 where `half`), as fp32 (exact) */
static inline __m512 load16(const void *p, int half, int64_t at)
{
    return half ? _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)((const uint16_t *)p + at)))
                : _mm512_loadu_ps((const float *)p + at);
}

#endif /* SPLITSERVE_HAS_AMX */
#endif /* SPLITSERVE_AMX_H */
