/*
 * What the MoE kernels share (moe.c: fp32 experts; mxfp4.c: packed MXFP4 experts): the step's
 * (token, slot) pairs counting-sorted by expert, and the weighted sum of a token's k expert rows.
 */
#ifndef SPLITSERVE_MOE_H
#define SPLITSERVE_MOE_H

#include <stdint.h>

#define MAX_TOP_K 64

/* The sorted order of a step's T * k slots: expert e's slots are sorted positions
   [offsets[e], offsets[e + 1]), in token order; slot_at[p] is the slot at position p and
   pos_of[s] the position of slot s; active lists the experts with a slot, ascending; scratch
   is the caller's working memory. */
typedef struct {
    int32_t *offsets, *active, *slot_at, *pos_of;
    int32_t n_active;
    float *scratch;
    void *mem;
} moe_order;

/* Fills `o` for expert ids [T, k] in [0, E), with `scratch_floats` floats of scratch.
   Returns 0; -1 without memory, -2 for an expert id outside [0, E), -3 for k above
   MAX_TOP_K (nothing to free then). */
int splitserve_moe_begin(const int64_t *ids, int32_t T, int32_t k, int32_t E,
                         int64_t scratch_floats, moe_order *o);
void splitserve_moe_end(moe_order *o);

/* o (+)= sum_i weights[t, i] * ys[sorted position of slot (t, i)], in ascending expert order
   (the order transformers' reference adds them in). */
void splitserve_moe_reduce_token(const float *ys, const int64_t *ids, const float *weights,
                                 const int32_t *pos_of, int t, int k, int H, float *o,
                                 int accumulate);

#endif
