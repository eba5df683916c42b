/* SPDX-License-Identifier: MIT */
/*
 * plan_sim.h — one sequence of `kvpage plan` through the real store.
 *
 * plan_sim_run creates a store of the simulated shape (layers, kv heads,
 * head_dim; query heads = kv heads * q_per_kv) with a host pool large
 * enough for the run, attaches the policy to a sequence and drives it like
 * an engine: per layer the prompt is appended in chunks of synthetic K/V;
 * where the policy scores tokens from prefill attention, one causal
 * prefill call then attends the rows it reads (SnapKV: its window w;
 * SimLayerKV in prefill mode: its rows; MiniKV, H2O, CaM: the last row: the
 * budgets are token counts, so which tokens are kept may change with the
 * rows attended, not how many); KVzip: a scoring pass (a fork marked by
 * kv_seq_score_begin over the whole prompt, one reconstruction row per
 * layer appended and attended, freed: the kept count is the budget
 * whatever the scores; the pass's pages are a transient the footprint does
 * not include); kv_seq_prefill_end; then `out` decode steps
 * (one token per layer, kv_seq_step_end after each) with decode attention
 * on the first step for SimLayerKV (decode mode) and on every step for
 * H2O/CaM. kv_store_stats then gives the exact footprint: pages (partly
 * filled ones, FP16 residual tails and MERGED pages shared by a layer pair
 * count as whole pages), the high-water mark, and the sequence's own
 * metadata.
 *
 * Synthetic data (the same for every kv head, so heads are identical and
 * the footprint scales exactly with their number): every token's K and V
 * row is the unit vector e1, except:
 *   - MiniCache retention: a fraction retain_frac of positions (spread
 *     evenly) is e1 in even layers and e2 in odd layers, so across every
 *     adjacent layer pair exactly those tokens are at angle pi/2 and the
 *     others at angle 0. The store's retention rule (d_i > d_max - gamma
 *     (d_max - d_min) over each merge call; all-equal distances retain
 *     nothing) then retains exactly them, for any gamma in (0, 1).
 *   - SimLayerKV: queries are s*e0; in the round(lazy_frac * L) lazy
 *     layers (spread evenly) the first `sink` tokens' keys are s*e0, in the
 *     others the key of token `sink` (outside the sink and, whenever a
 *     layer could be lazy at all, outside the recent window) is. With
 *     s^2 / sqrt(head_dim) = 40 nearly all attention mass lands on those
 *     keys, so exactly the chosen layers measure a mass > delta.
 *
 * Errors: 0 or a negative KV_E* code (KV_ERANGE: the run needs a pool over
 * the store's limit). Nothing is kept between calls.
 */
#ifndef PLAN_SIM_H
#define PLAN_SIM_H

#include <stdint.h>

#include "kvpage/kvpage.h"

typedef struct plan_sim_cfg {
    uint32_t layers;       /* simulated layers (the model's)               */
    uint32_t q_per_kv;     /* query heads per kv head (the model's group)  */
    uint32_t head_dim;     /* simulated head_dim (a multiple of 16)        */
    const kv_policy_t *policy;
    uint32_t chunk;        /* prompt tokens per kv_append, >= 1            */
    double lazy_frac;      /* SimLayerKV: fraction of lazy layers, 0..1    */
    double retain_frac;    /* MiniCache: retained fraction, 0..0.5         */
    double prefix_hit;     /* 0: one sequence alone; > 0: the prefix run   */
                           /* (plan_sim_run_prefix): this fraction of the  */
                           /* prompt is another sequence's prefix, 0..1    */
    int prefix_ctx;        /* prefix run: 1 = the prefix is a compressed   */
                           /* context (published after its prefill end)    */
} plan_sim_cfg_t;

/* One sequence's footprint in the simulated store. */
typedef struct plan_foot {
    uint64_t pages;        /* pages held at the end                        */
    uint64_t peak_pages;   /* high-water mark over the run                 */
    uint64_t kv_bytes;     /* pages * page_bytes                           */
    uint64_t meta_bytes;   /* metadata of the sequence (store's excluded)  */
    uint64_t tokens;       /* tokens held, summed over lists               */
    uint32_t page_bytes;   /* of the simulated store                       */
    /* the prefix run only (plan_sim_run_prefix); pages above are then the   */
    /* sequence's own, beyond the shared ones                               */
    uint64_t shared_pages; /* pages the prefix cache holds for the shared   */
                           /* prefix (counted once, however many share it) */
    uint32_t matched;      /* prompt tokens kv_seq_prefix_match attached    */
} plan_foot_t;

/* Run one sequence of `prompt` (>= 1) + `out` tokens with kv_heads kv heads. */
int plan_sim_run(const plan_sim_cfg_t *c, uint32_t kv_heads, uint32_t prompt,
                 uint32_t out, plan_foot_t *f);

/* 1 when index i of n is among the round(frac * n) chosen ones, spread
 * evenly (floor((i+1)k/n) > floor(ik/n), k = round(frac * n)). */
/* With c->prefix_hit > 0, plan_sim_run is the prefix run: with the store's prefix cache on, a
 * first sequence appends a prompt of `prompt` tokens and publishes its
 * first S = floor(prefix_hit x prompt) tokens (kv_seq_prefix_publish, before
 * kv_seq_prefill_end) and is freed: the cache keeps f->shared_pages. The
 * measured sequence's prompt has the same S first tokens and its own rest:
 * kv_seq_prefix_match attaches f->matched tokens (S rounded down to a node,
 * or less: the policy's rule, docs/prefix.md; 0 under H2O/MiniKV), it
 * prefills the rest and decodes `out` tokens like plan_sim_run. f->pages =
 * pages in use then minus shared_pages (its own; what its selection dropped
 * from the shared prefix stays with the cache); peak_pages is the store's
 * high-water mark (both sequences); meta_bytes its own. With c->prefix_ctx
 * the first S = floor(prefix_hit x prompt) tokens (any S >= 1) are a
 * compressed context: the first sequence ends its prefill after them and
 * publishes the compressed cache (kv_seq_prefix_publish_compressed); the
 * measured one installs it (kv_seq_prefix_match_compressed: matched = S),
 * appends the rest after the prefill end, kv_seq_step_end, and decodes. */

int plan_sim_pick(uint64_t i, uint64_t n, double frac);

#endif /* PLAN_SIM_H */
