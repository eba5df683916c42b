/* SPDX-License-Identifier: MIT */
/*
 * plan_closed.h — the closed-form KV bytes of `kvpage plan`: what a policy
 * would cost from the formats' bits per element and the policy's budgets
 * alone, with no pages, no metadata and no rounding to page boundaries.
 * Shown beside the simulated footprint, the difference is what the page
 * granularity and the store's bookkeeping add.
 *
 * The numbers come from the library: bits per element from kv_format_info
 * (FP16 16, INT4 g16 6, INT2 g16 4, MERGED 8 + 32/head_dim, with INT4
 * directions 3 + 32/head_dim), what the policy keeps from kv_policy_info
 * (its format, R, budget resolved against the prompt as kv_seq_prefill_end
 * resolves it, SimLayerKV's window, MiniCache's pairs). Per (layer,
 * kv_head) list, for a prompt of P and G decode tokens (T = P + G):
 *   fp16                 T tokens at 16 bits
 *   kivi/int (alone)     T - T mod R at the format's bits, T mod R at 16
 *   selection            kept = min(P, budget); + G while decoding for
 *                        minikv/snapkv (no eviction), the budget alone for
 *                        h2o/streamingllm (evict every step); in the
 *                        policy's format (MiniKV: INT2 unless a format is
 *                        given), quantized as KIVI (held - held mod R); a
 *                        pyramid is taken at its mean budget
 *   simlayerkv           round(lazy_frac * L) lazy layers hold sink + w
 *                        tokens once P (+1 in decode mode) > sink + w; the
 *                        other layers as the rest of the spec says
 *   minicache            unpaired layers FP16 (KIVI-4 with +int4); each
 *                        merged pair holds its merged tokens once
 *                        (P + every * floor(G / every) of them, a fraction
 *                        1 - retain_frac at the MERGED bits of both
 *                        layers), the retained ones and the G mod every
 *                        newest FP16 in both layers
 * All on every kv head; lists are 2 * head_dim elements per token (K, V).
 * R is the format method's r, else the store's default (128).
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
 * direction variant) for head_dim d (kv_format_info); NAN for a format or
 * head_dim the library refuses. */
double plan_closed_bits(kv_format_t fmt, int int4_dirs, uint32_t d);

/* KV bytes of one sequence (prompt >= 1, out >= 0) under policy; NAN when
 * the library refuses the shape. */
double plan_closed_bytes(const plan_closed_in_t *in, const kv_policy_t *policy,
                         uint32_t prompt, uint32_t out);

#endif /* PLAN_CLOSED_H */
