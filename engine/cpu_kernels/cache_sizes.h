/*
 * The cache sizes a core, as build.py read them from the host (-DSPLITSERVE_L1D_BYTES and
 * -DSPLITSERVE_L2_BYTES), or 32 KB of L1d and 1 MB of L2 where it found none: the blocked
 * products size their tiles from them.
 */
#ifndef SPLITSERVE_CACHE_SIZES_H
#define SPLITSERVE_CACHE_SIZES_H

#ifndef SPLITSERVE_L1D_BYTES
#define SPLITSERVE_L1D_BYTES (32 << 10)
#endif
#ifndef SPLITSERVE_L2_BYTES
#define SPLITSERVE_L2_BYTES (1 << 20)
#endif

#endif
