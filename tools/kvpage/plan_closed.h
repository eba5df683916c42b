/*
 * plan_closed.h — the closed-form KV bytes of `kvpage plan`: what a policy
 * would cost from the formats' bits per element and the policy's budgets
 * alone, with no pages, no metadata and no rounding to page boundaries.
 * Shown beside the simulated footprint, the difference is what the page
 * granularity and the store's bookkeeping add.
 *
 * Bits per element are read from the library's own notes (kv_format_note:
 * "FP16 = 16", "INT4 g16 = 6", "INT2 g16 = 4", "MERGED = 8 + 32/head_dim",
 * INT4 directions "3 + 32/head_dim"). Per (layer, kv_head) list, for a
 * prompt of P and G decode tokens (T = P + G):
 *   fp16                 T tokens at 16 bits
 *   kivi/int (alone)     T - T mod R at the format's bits, T mod R at 16
 *   selection            kept = min(P, budget) (budgets resolved against P
 *                        as the store does: round(fraction * P) or tokens);
 *                        + G while decoding for minikv/snapkv (no eviction),
 *                        the budget alone for h2o/streamingllm (evict every
 *                        step); MiniKV's kept tokens INT2 unless a format
 *                        is given; quantized as KIVI (held - held mod R);
 *                        a pyramid is taken at its mean budget
 *   simlayerkv           round(lazy_frac * L) lazy layers hold sink + w
 *                        tokens once P (+1 in decode mode) > sink + w; the
 *                        other layers as the rest of the spec says
 *   minicache            unpaired layers FP16 (KIVI-4 with +int4); each
 *                        pair of layers from floor(L * from) on holds its
 *                        merged tokens once (P + every * floor(G / every)
 *                        of them, a fraction 1 - retain_frac at the MERGED
 *                        bits of both layers), the retained ones and the
 *                        G mod every newest FP16 in both layers
 * All on every kv head; lists are 2 * head_dim elements per token (K, V).
 */
#ifndef PLAN_CLOSED_H
#define PLAN_CLOSED_H

#include <stdint.h>

#include "kvpage/kvpage.h"

typedef struct plan_closed_in {
    uint32_t layers, kv_heads, head_dim;
    double lazy_frac;    /* SimLayerKV assumption (plan_sim.h)  */
    double retain_frac;  /* MiniCache assumption                */
} plan_closed_in_t;

/* Bits per element of format fmt (MERGED: int4_dirs selects the INT4
 * direction variant) for head_dim d, parsed from kv_format_note; NAN when
 * the note cannot be read. */
double plan_closed_bits(kv_format_t fmt, int int4_dirs, uint32_t d);

/* KV bytes of one sequence (prompt >= 1, out >= 0) under the canonical
 * spec canon; NAN when a bits note cannot be read. */
double plan_closed_bytes(const plan_closed_in_t *in, const char *canon, uint32_t prompt,
                         uint32_t out);

#endif /* PLAN_CLOSED_H */
