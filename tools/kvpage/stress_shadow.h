/* SPDX-License-Identifier: MIT */
/*
 * stress_shadow.h — the shadow record of one live sequence in `kvpage
 * stress`: what was appended to it, in a few integers.
 *
 * Token values are regenerated from (seed, origin, layer, head, position)
 * (stress_gen_token), so the shadow keeps only, per layer, how many
 * positions were appended (positions are 0, 1, 2, ... per layer, passed to
 * kv_append explicitly), and the lineage: which sequence incarnation
 * (origin, a number never reused) appended which positions. A fork copies
 * the parent's lineage and adds its own origin from the parent's length on,
 * so a child's inherited tokens regenerate as the parent's.
 *
 * Invariant: lineage[i].from is non-decreasing; position p was appended by
 * the last entry with from <= p. Plain data: copy freely, nothing to free.
 *
 * With the offload tier, `res` says where the driver last put the pages
 * (stress_res_t) and so what the verifier may expect from kv_read.
 */
#ifndef STRESS_SHADOW_H
#define STRESS_SHADOW_H

#include <stdint.h>

#include "kvpage/kvpage.h"
#include "stress_mix.h"

#define STRESS_MAX_LINEAGE 16 /* fork depth a shadow can describe */

/* Where a sequence's pages are, as far as the driver knows (offload). */
typedef enum stress_res {
    STRESS_RES_RESIDENT = 0, /* every page readable: kv_read must succeed    */
    STRESS_RES_WRITING,      /* kv_seq_offload started, not waited for: a    */
                             /* list reads as its data or KV_ENOTRES         */
    STRESS_RES_ON_FILE,      /* waited for, pages on the file: a list reads  */
                             /* as data or KV_ENOTRES, at least one the      */
                             /* latter                                       */
    STRESS_RES_READING,      /* kv_seq_prefetch started, not waited for: not */
                             /* read (a read would take in page-ins at a     */
                             /* moment that depends on the I/O)              */
} stress_res_t;

typedef struct stress_lineage {
    uint64_t origin; /* incarnation that appended positions >= from */
    int32_t from;    /* first position it appended                  */
} stress_lineage_t;

typedef struct stress_shadow {
    kv_seq_id_t id;              /* the store's sequence                   */
    const stress_check_t *chk;   /* how its lists compare (its policy)     */
    uint32_t n_layers;
    uint32_t n_lineage;          /* 1..STRESS_MAX_LINEAGE                  */
    stress_lineage_t lineage[STRESS_MAX_LINEAGE];
    int32_t next[STRESS_MAX_LAYERS]; /* per layer: positions appended (the */
                                     /* next position)                     */
    stress_res_t res;            /* offload: where its pages are           */
} stress_shadow_t;

/* An empty sequence `id` whose own appends are `origin`'s. */
void stress_shadow_init(stress_shadow_t *s, kv_seq_id_t id, uint64_t origin,
                        uint32_t n_layers, const stress_check_t *chk);

/* child = a fork of parent as sequence `id`, appending as `origin` from now
 * on. Returns -1 (child untouched) when the lineage is full or the parent's
 * layers hold different position counts (fork only between steps). */
int stress_shadow_fork(const stress_shadow_t *parent, kv_seq_id_t id, uint64_t origin,
                       stress_shadow_t *child);

/* Positions >= from (from >= the last entry's) are origin's from now on:
 * a prompt whose parts come from different origins (shared prefixes,
 * stress_prefix.h). Returns -1 (unchanged) when the lineage is full. */
int stress_shadow_push(stress_shadow_t *s, uint64_t origin, int32_t from);

/* The incarnation that appended position pos. */
uint64_t stress_shadow_origin(const stress_shadow_t *s, int32_t pos);

/* The next n tokens of `layer` as kv_append wants them: k, v
 * [n][n_kv_heads][head_dim], pos [n], each position's values from its
 * origin (stress_shadow_origin). Does not advance the shadow. */
void stress_shadow_values(const stress_shadow_t *s, uint64_t seed, uint32_t layer,
                          uint32_t n, uint32_t n_kv_heads, uint32_t head_dim, float *k,
                          float *v, int32_t *pos);

/* Record that the next n positions of `layer` were appended. */
void stress_shadow_append(stress_shadow_t *s, uint32_t layer, uint32_t n);

#endif /* STRESS_SHADOW_H */
