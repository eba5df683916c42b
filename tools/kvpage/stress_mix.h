/* SPDX-License-Identifier: MIT */
/*
 * stress_mix.h — the policy mix of `kvpage stress` and what each policy
 * lets the verifier expect of a sequence's contents.
 *
 * A mix is a '|'-separated list of policy specs (docs/policies.md), e.g.
 * "none|kivi2|h2o:hh=0.1,rw=0.1+cam"; each arriving request draws one
 * uniformly. "none" means no policy is attached (plain FP16 pages).
 *
 * From a policy's canonical spec (kv_policy_describe) the check of each
 * layer is derived (stress_check_t): which elements must come back exactly,
 * which within the KIVI bound, which only finite and in FP16 range, and
 * whether positions may be a subset or a permutation of those appended.
 * The derivation and its reasons are in stress_mix.c and docs/stress.md.
 *
 * Ownership: a stress_mix_t owns its parsed policies (stress_mix_destroy;
 * a zeroed mix is safe to destroy).
 */
#ifndef STRESS_MIX_H
#define STRESS_MIX_H

#include <stddef.h>
#include <stdint.h>

#include "kvpage/kvpage.h"

#define STRESS_MIX_MAX 16    /* policies in one mix       */
#define STRESS_MAX_LAYERS 64 /* --layers upper bound      */
#define STRESS_FP16_MAX 65504.0

/* What a sequence's lists must satisfy against the appended values. */
typedef struct stress_check {
    uint32_t bits;     /* 0: K/V exact; 2/4: KIVI-quantized at most once,      */
                       /* |err| <= stress_check_qbound(bits) per element      */
    uint8_t select;    /* tokens may be evicted: positions are a strictly     */
                       /* increasing subset of those appended                 */
    uint8_t drift;     /* evicted lists are re-quantized every step (error    */
                       /* accumulates): K and V finite, |x| <= 65504 only     */
    uint8_t cam;       /* CaM adds evicted values into kept ones: keys as     */
                       /* `bits` says, values finite, |v| <= 65504 only       */
    uint32_t merge_lo; /* MiniCache paired layers [merge_lo, merge_hi):       */
    uint32_t merge_hi; /* positions a permutation of those appended; a token  */
                       /* matches as `bits` says, or (merged) keeps the norm  */
                       /* of its K and of its V                               */
} stress_check_t;

/* One policy of the mix. */
typedef struct stress_pol {
    char spec[512];      /* canonical spec, or "none"                      */
    kv_policy_t *policy; /* owned; NULL for "none"                         */
    stress_check_t chk;
} stress_pol_t;

typedef struct stress_mix {
    uint32_t n;                      /* 1..STRESS_MIX_MAX */
    stress_pol_t pol[STRESS_MIX_MAX];
} stress_mix_t;

/* Parse a '|'-separated list for a store of n_layers layers. Returns 0, or
 * -1 with a message in err (the store's message for a bad spec). */
int stress_mix_parse(const char *list, uint32_t n_layers, stress_mix_t *m, char *err,
                     size_t err_len);
void stress_mix_destroy(stress_mix_t *m);

/* The check a policy implies (NULL, "none", and "fp16": all exact). */
void stress_check_derive(const kv_policy_t *policy, uint32_t n_layers, stress_check_t *c);

/* Largest |read - appended| of one element quantized to `bits` (2 or 4)
 * once, for appended elements in [-A, A] exact in FP16 (stress_gen.h);
 * 0 for bits 0. Derivation in stress_mix.c. */
double stress_check_qbound(uint32_t bits);

/* Largest |element| a read may return under c at `layer` (bounds attention
 * outputs too: an output is a convex combination of value rows). */
double stress_check_vmax(const stress_check_t *c, uint32_t layer, uint32_t head_dim);

/* Nonzero when `layer` is in a MiniCache pair. */
int stress_check_merged(const stress_check_t *c, uint32_t layer);

#endif /* STRESS_MIX_H */
