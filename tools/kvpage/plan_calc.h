/* SPDX-License-Identifier: MIT */
/*
 * plan_calc.h — the capacity plan of `kvpage plan`: the KV pool a GPU
 * leaves, and per policy the footprint of the workload's sequences measured
 * in the real store (plan_sim.h), the capacity it allows, the longest
 * context of one sequence, and the closed form beside it (plan_closed.h).
 *
 * Pool: pool_bytes = gpu_bytes * (1 - reserve) - weights_bytes, in pages of
 * the store's default size (64 * head_dim bytes = 16 FP16 tokens of one
 * (layer, kv_head) list); pool_pages = floor(pool_bytes / page_bytes).
 *
 * Footprint of a sequence (prompt P, output G): simulated with 1 and with 2
 * kv heads. Every (layer, kv_head) list is independent and the synthetic
 * data is the same on every head, so pages (and the high-water mark) are
 * exactly n_kv_heads * those of one head (checked on every run: pages of 2
 * heads == 2 * pages of 1, reported as heads_exact); metadata is affine in
 * the number of heads (per-list page tables and score vectors plus a
 * per-sequence part), extrapolated from the two runs. Page counts do not
 * depend on head_dim for the FP16/INT4/INT2 formats (16/32/64 tokens per
 * page for any head_dim), so policies without MERGED pages are simulated
 * with head_dim 16; MiniCache runs at the model's head_dim.
 *
 * Workload: a length distribution of `kvpage stress` (stress_gen.h); for a
 * distribution, `samples` (prompt, output) pairs are drawn once (seeded)
 * and shared by every policy. pages_per_seq = mean pages of a sequence at
 * its end; max_seqs = floor(pool_pages / pages_per_seq). Bytes per token
 * = (page bytes + metadata) / (P + G) over all samples.
 *
 * Max context at batch 1: the longest prompt P such that one sequence of P
 * prompt tokens and ctx_out decode tokens never holds more than the pool
 * (its high-water mark, which for policies that select at prefill end is
 * the whole prompt in FP16), reported as P + ctx_out. Two exact runs probe
 * prompts of P1 and 2 * P1 tokens, P1 = ctx_base rounded up to whole
 * prefill chunks, at least two chunks (the high-water mark of a prompt
 * appended in chunks is affine in whole chunks: its transient depends only
 * on the last chunk's fill, largest when full) and, for SimLayerKV, at
 * least twice sink + w. If the answer is below 2 * P1 it is found exactly
 * by bisection over simulations ("exact"); beyond, the high-water mark is
 * extrapolated linearly from the two probes, minus a margin of 2 pages per
 * list for page rounding: a lower bound ("extrapolated").
 *
 * Prefix cache (in->prefix_hit = F > 0): every sample is run once more as
 * the second of two sequences whose prompts share their first floor(F x P)
 * tokens (plan_sim_run's prefix run): the store matches what its rule
 * allows (pfx_hit, <= F: nodes, the policy), the sequence prefills only
 * the rest (pfx_prefill_tokens) and holds pages beyond the shared ones
 * (pfx_pages_per_seq); the shared prefix's pages are counted once per
 * group (prefix_groups distinct prefixes, each as large as the largest
 * sample's): pfx_max_seqs = floor((pool_pages - groups x pfx_shared_pages)
 * / pfx_pages_per_seq). Peak and max context are those of one sequence
 * alone (batch 1 shares nothing).
 *
 * Trained context: a model with ctx_len (its max_position_embeddings)
 * attends no further than that, so max_ctx is capped at ctx_len (pool_ctx
 * keeps the pool's answer) and the room the pool has beyond one such
 * sequence is reported as seqs_at_ctx: how many sequences of ctx_len
 * tokens (ctx_len - ctx_out prompt + ctx_out output, one exact run, its
 * final pages as for max_seqs) the pool holds at once (0 when the pool
 * does not hold one: max_ctx < ctx_len).
 *
 * Ownership: plan_t borrows the input and specs; results are arrays the
 * caller owns. Errors: 0 or a negative KV_E* code.
 */
#ifndef PLAN_CALC_H
#define PLAN_CALC_H

#include <stdint.h>

#include "plan_evalq.h"
#include "plan_preset.h"
#include "plan_sim.h"
#include "plan_spec.h"
#include "stress_gen.h"

#define PLAN_MAX_SAMPLES 256u
#define PLAN_CURVE_MAX 12u

typedef enum plan_ctx_method {
    PLAN_CTX_NONE = 0,          /* not even one prompt token fits         */
    PLAN_CTX_EXACT = 1,         /* bisection over exact simulations       */
    PLAN_CTX_EXTRAPOLATED = 2,  /* linear from two exact runs, minus margin */
} plan_ctx_method_t;

typedef struct plan_in {
    plan_model_t model;         /* shape, name, params (a preset or flags) */
    const char *gpu_name;       /* a preset's name or "custom"             */
    double gpu_bytes;           /* GPU memory                              */
    double weights_bytes;       /* model weights                           */
    double reserve;             /* fraction of gpu_bytes not for the pool  */
    const char *workload;       /* the distribution's spec, for reports    */
    stress_dist_t dist;         /* lengths                                 */
    uint32_t samples;           /* pairs drawn from a distribution          */
    uint64_t seed;
    uint32_t chunk;             /* prompt tokens per append (prefill chunk) */
    uint32_t ctx_base;          /* max-context probe (prompt tokens)        */
    double lazy_frac;           /* SimLayerKV assumption                   */
    double retain_frac;         /* MiniCache assumption                    */
    double rate;                /* requests/s (0: not given)               */
    double decode_tps;          /* tokens/s per sequence, for Little's law */
    uint64_t concurrency;       /* target concurrent sequences (0: none)   */
    int curves;                 /* compute bytes/token vs context          */
    const char *eval_dir;       /* kvpage eval reports (NULL: none)        */
    int trained_ctx_given;      /* model.ctx_len from --trained-ctx        */
    double prefix_hit;          /* fraction of each prompt found in the    */
                                /* prefix cache (0: no prefix figures)     */
    uint32_t prefix_groups;     /* distinct shared prefixes in the pool    */
    int prefix_ctx;             /* the shared prefixes are compressed      */
                                /* contexts (docs/prefix.md)               */
} plan_in_t;

typedef struct plan_curve_pt {
    uint32_t ctx;               /* prompt tokens (then one decode step)    */
    double bytes_per_token;     /* page bytes / (ctx + 1), full model      */
    double closed_bytes_per_token;
} plan_curve_pt_t;

typedef struct plan_result {
    const plan_spec_t *spec;
    uint32_t sim_head_dim;      /* head_dim the runs used                  */
    int heads_exact;            /* pages(2 heads) == 2 pages(1) everywhere  */
    double pages_per_seq;       /* mean, full model                        */
    double peak_pages_per_seq;  /* mean high-water mark, full model        */
    double kv_bytes_per_token, meta_bytes_per_token, bytes_per_token;
    double closed_bytes_per_token; /* NAN when not available              */
    uint64_t max_seqs;
    uint64_t max_ctx;           /* max prompt + ctx_out; 0 with NONE;      */
                                /* at most the model's ctx_len             */
    plan_ctx_method_t ctx_method;
    uint64_t pool_ctx;          /* max_ctx before the cap: what the pool   */
                                /* would hold for one sequence             */
    int ctx_capped;             /* pool_ctx > ctx_len: max_ctx = ctx_len   */
    uint64_t seqs_at_ctx;       /* sequences of ctx_len tokens (ctx_len -  */
                                /* ctx_out prompt + ctx_out) the pool      */
                                /* holds, as max_seqs; 0 without ctx_len   */
    int fits;                   /* -1 no target; 0/1 max_seqs >= target    */
    plan_quality_t quality;
    plan_curve_pt_t curve[PLAN_CURVE_MAX];
    uint32_t n_curve;
    /* prefix cache (in->prefix_hit > 0; plan_sim_run's prefix run, per     */
    /* sample): pages beyond the shared prefix, the prefix counted once per  */
    /* group; full model                                                     */
    double pfx_hit;             /* prompt tokens matched / prompt tokens   */
    double pfx_shared_pages;    /* the largest sample's shared prefix      */
    double pfx_pages_per_seq;   /* mean pages of a sequence beyond it      */
    uint64_t pfx_max_seqs;      /* floor((pool - groups x shared) / that)  */
    double pfx_prefill_tokens;  /* mean prompt tokens prefilled (computed) */
    char assumption[256];       /* data-dependent footprint: what's assumed */
    double seconds;             /* simulation wall time                    */
} plan_result_t;

typedef struct plan {
    const plan_in_t *in;
    uint32_t page_bytes;        /* of the model's store                    */
    double pool_bytes;
    uint64_t pool_pages;
    uint32_t n_samples;
    uint32_t len[PLAN_MAX_SAMPLES][2]; /* prompt, output of each sample    */
    double mean_prompt, mean_out;      /* of the samples                   */
    uint32_t ctx_out;           /* decode tokens of the max-context runs   */
    double target;              /* sequences to hold: --concurrency, or    */
                                /* Little's law from --rate; 0: none       */
} plan_t;

/* Pool and samples. KV_ERANGE when weights and reserve leave no page;
 * KV_EINVAL for a bad shape. */
int plan_init(const plan_in_t *in, plan_t *p);

/* Everything for one policy into r. */
int plan_policy(const plan_t *p, const plan_spec_t *spec, plan_result_t *r);

/* The simulation config plan_policy runs spec with (plan_sim.h): the
 * model's shape, head_dim 16 unless the policy writes MERGED pages. */
plan_sim_cfg_t plan_sim_cfg(const plan_t *p, const plan_spec_t *spec);

#endif /* PLAN_CALC_H */
