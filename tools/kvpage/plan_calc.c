/* SPDX-License-Identifier: MIT */
/*
 * plan_calc.c — the capacity plan per policy (see plan_calc.h for the
 * method): pool, samples, footprints scaled from the simulated heads,
 * capacity, max context, curves, quality.
 */
#include "plan_calc.h"

#include <math.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "plan_closed.h"
#include "plan_sim.h"

#define CALC_SIM_HEAD_DIM 16u   /* page counts are head_dim-free without MERGED */
#define CALC_CTX_MARGIN 2u      /* pages per list kept back when extrapolating */
#define CALC_CURVE_MAX_CTX 32768u

static double calc_now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

int plan_init(const plan_in_t *in, plan_t *p)
{
    const plan_model_t *m = &in->model;
    memset(p, 0, sizeof *p);
    p->in = in;
    if (!m->layers || !m->kv_heads || !m->q_heads || m->q_heads % m->kv_heads ||
        !m->head_dim || m->head_dim % 16 || in->samples == 0 ||
        in->samples > PLAN_MAX_SAMPLES || !in->chunk || !in->ctx_base)
        return KV_EINVAL;
    p->page_bytes = 64u * m->head_dim;
    p->pool_bytes = in->gpu_bytes * (1.0 - in->reserve) - in->weights_bytes;
    if (!(p->pool_bytes >= p->page_bytes))
        return KV_ERANGE;
    p->pool_pages = (uint64_t)floor(p->pool_bytes / p->page_bytes);
    p->n_samples = in->dist.kind == STRESS_DIST_FIXED ? 1 : in->samples;
    uint64_t rng = in->seed;
    double sum[2] = {0, 0};
    for (uint32_t i = 0; i < p->n_samples; i++) {
        stress_dist_sample(&in->dist, &rng, p->len[i]);
        sum[0] += p->len[i][0];
        sum[1] += p->len[i][1];
    }
    p->mean_prompt = sum[0] / p->n_samples;
    p->mean_out = sum[1] / p->n_samples;
    p->ctx_out = (uint32_t)llround(stress_dist_mean(&in->dist, 1));
    if (in->concurrency)
        p->target = (double)in->concurrency;
    else if (in->rate > 0 && in->decode_tps > 0)
        p->target = in->rate * stress_dist_mean(&in->dist, 1) / in->decode_tps;
    return 0;
}

plan_sim_cfg_t plan_sim_cfg(const plan_t *p, const plan_spec_t *spec)
{
    const plan_model_t *m = &p->in->model;
    int merged = (plan_spec_methods(spec->ep.policy) & KV_POLICY_MINICACHE) != 0;
    return (plan_sim_cfg_t){.layers = m->layers, .q_per_kv = m->q_heads / m->kv_heads,
                            .head_dim = merged ? m->head_dim : CALC_SIM_HEAD_DIM,
                            .policy = spec->ep.policy, .chunk = p->in->chunk,
                            .lazy_frac = p->in->lazy_frac,
                            .retain_frac = p->in->retain_frac};
}

static plan_closed_in_t closed_in(const plan_t *p)
{
    const plan_model_t *m = &p->in->model;
    return (plan_closed_in_t){.layers = m->layers, .kv_heads = m->kv_heads,
                              .head_dim = m->head_dim, .lazy_frac = p->in->lazy_frac,
                              .retain_frac = p->in->retain_frac};
}

/* The workload's samples: footprints, capacity, bytes per token. */
static int calc_workload(const plan_t *p, const plan_sim_cfg_t *c, plan_result_t *r)
{
    const uint32_t H = p->in->model.kv_heads;
    const plan_closed_in_t ci = closed_in(p);
    double pages = 0, peak = 0, meta = 0, tokens = 0, closed = 0;
    r->heads_exact = 1;
    for (uint32_t i = 0; i < p->n_samples; i++) {
        plan_foot_t f1, f2;
        uint32_t P = p->len[i][0], G = p->len[i][1];
        int rc = plan_sim_run(c, 1, P, G, &f1);
        if (!rc && H > 1)
            rc = plan_sim_run(c, 2, P, G, &f2);
        if (rc)
            return rc;
        if (H == 1)
            f2 = (plan_foot_t){.pages = 2 * f1.pages, .peak_pages = 2 * f1.peak_pages,
                               .meta_bytes = 2 * f1.meta_bytes};
        r->heads_exact &= f2.pages == 2 * f1.pages && f2.peak_pages == 2 * f1.peak_pages;
        pages += (double)H * f1.pages;
        peak += (double)H * f1.peak_pages;
        meta += (double)f1.meta_bytes + ((double)f2.meta_bytes - f1.meta_bytes) * (H - 1);
        tokens += (double)P + G;
        closed += plan_closed_bytes(&ci, c->policy, P, G);
    }
    r->pages_per_seq = pages / p->n_samples;
    r->peak_pages_per_seq = peak / p->n_samples;
    r->max_seqs = (uint64_t)floor((double)p->pool_pages * p->n_samples / pages);
    r->kv_bytes_per_token = pages * p->page_bytes / tokens;
    r->meta_bytes_per_token = meta / tokens;
    r->bytes_per_token = r->kv_bytes_per_token + r->meta_bytes_per_token;
    r->closed_bytes_per_token = closed / tokens;
    r->fits = p->target > 0 ? (double)r->max_seqs >= p->target : -1;
    return 0;
}

/* The prefix figures (plan_calc.h): each sample as the second sequence of
 * a shared prefix, one head, scaled to H as calc_workload's pages. */
static int calc_prefix(const plan_t *p, const plan_sim_cfg_t *c0, plan_result_t *r)
{
    const double H = p->in->model.kv_heads;
    plan_sim_cfg_t c = *c0;
    c.prefix_hit = p->in->prefix_hit;
    c.prefix_ctx = p->in->prefix_ctx;
    double own = 0, matched = 0, prompt = 0, shared = 0;
    for (uint32_t i = 0; i < p->n_samples; i++) {
        plan_foot_t f;
        int rc = plan_sim_run(&c, 1, p->len[i][0], p->len[i][1], &f);
        if (rc)
            return rc;
        own += H * (double)f.pages;
        shared = fmax(shared, H * (double)f.shared_pages);
        matched += f.matched;
        prompt += p->len[i][0];
    }
    r->pfx_hit = matched / prompt;
    r->pfx_shared_pages = shared;
    r->pfx_pages_per_seq = own / p->n_samples;
    r->pfx_prefill_tokens = (prompt - matched) / p->n_samples;
    double room = (double)p->pool_pages - p->in->prefix_groups * shared;
    r->pfx_max_seqs = room > 0 && own > 0 ? (uint64_t)floor(room * p->n_samples / own) : 0;
    return 0;
}

/* High-water mark (pages, one head) of a prompt of P tokens + ctx_out. */
static int ctx_peak(const plan_t *p, const plan_sim_cfg_t *c, uint32_t P, double *peak)
{
    plan_foot_t f;
    int rc = plan_sim_run(c, 1, P, p->ctx_out, &f);
    *peak = rc ? INFINITY : (double)f.peak_pages;
    return rc;
}

static int calc_ctx(const plan_t *p, const plan_sim_cfg_t *c, plan_result_t *r)
{
    const double budget = floor((double)p->pool_pages / p->in->model.kv_heads);
    /* probes: whole chunks (the peak is periodic in the last chunk's fill),
     * at least two of them, and past SimLayerKV's window */
    const uint32_t C = c->chunk;
    uint64_t P1 = ((uint64_t)p->in->ctx_base + C - 1) / C * C;
    P1 = P1 > 2ull * C ? P1 : 2ull * C;
    kv_policy_info_t pi;
    if (!kv_policy_info(c->policy, c->layers, 0, &pi) &&
        (pi.methods & KV_POLICY_SIMLAYERKV)) {
        double win = pi.lazy_window;
        while (P1 < 2 * win)
            P1 *= 2;
    }
    if (P1 > (1u << 30))
        return KV_ERANGE;
    uint32_t P2 = 2 * (uint32_t)P1;
    double pk1, pk2;
    int rc = ctx_peak(p, c, (uint32_t)P1, &pk1);
    if (!rc)
        rc = ctx_peak(p, c, P2, &pk2);
    if (rc)
        return rc;
    uint64_t best = 0;
    if (pk2 <= budget) {
        double slope = (pk2 - pk1) / (double)(P2 - P1);
        double room = budget - pk2 - (double)CALC_CTX_MARGIN * c->layers;
        double extra = slope > 0 && room > 0 ? floor(room / slope) : 0;
        best = (uint64_t)fmin((double)P2 + extra, (double)UINT32_MAX);
        r->ctx_method = PLAN_CTX_EXTRAPOLATED;
    } else { /* exact: the largest prompt in [1, P2) whose peak fits */
        uint32_t lo = 0, hi = P2;
        while (hi - lo > 1 && !rc) {
            uint32_t mid = lo + (hi - lo) / 2;
            double pk;
            rc = ctx_peak(p, c, mid, &pk);
            if (pk <= budget)
                lo = mid;
            else
                hi = mid;
        }
        best = lo;
        r->ctx_method = best ? PLAN_CTX_EXACT : PLAN_CTX_NONE;
    }
    r->max_ctx = best ? best + p->ctx_out : 0;
    return rc;
}

/* The cap at the model's trained context and the sequences of that length
 * the pool holds (plan_calc.h). */
static int calc_trained_ctx(const plan_t *p, const plan_sim_cfg_t *c, plan_result_t *r)
{
    const uint32_t T = p->in->model.ctx_len;
    r->pool_ctx = r->max_ctx;
    if (!T)
        return 0;
    if (r->max_ctx <= T)
        return 0; /* not even one sequence of T tokens fits: seqs_at_ctx 0 */
    r->max_ctx = T;
    r->ctx_capped = 1;
    uint32_t G = p->ctx_out < T ? p->ctx_out : T - 1, P = T - G;
    plan_foot_t f;
    int rc = plan_sim_run(c, 1, P, G, &f);
    if (!rc && f.pages)
        r->seqs_at_ctx = p->pool_pages / ((uint64_t)f.pages * p->in->model.kv_heads);
    return rc;
}

static int calc_curve(const plan_t *p, const plan_sim_cfg_t *c, plan_result_t *r)
{
    const plan_closed_in_t ci = closed_in(p);
    const uint32_t H = p->in->model.kv_heads;
    r->n_curve = 0;
    for (uint32_t ctx = 256; ctx <= CALC_CURVE_MAX_CTX && r->n_curve < PLAN_CURVE_MAX;
         ctx *= 2) {
        if (r->max_ctx && ctx + 1 > r->max_ctx)
            break;
        plan_foot_t f;
        int rc = plan_sim_run(c, 1, ctx, 1, &f);
        if (rc)
            return rc;
        plan_curve_pt_t *pt = &r->curve[r->n_curve++];
        pt->ctx = ctx;
        pt->bytes_per_token = (double)f.pages * H * p->page_bytes / (ctx + 1.0);
        pt->closed_bytes_per_token = plan_closed_bytes(&ci, c->policy, ctx, 1) / (ctx + 1.0);
    }
    return 0;
}

static void calc_assumption(const plan_t *p, const plan_spec_t *spec, plan_result_t *r)
{
    const uint32_t methods = plan_spec_methods(spec->ep.policy);
    if (methods & KV_POLICY_SIMLAYERKV)
        snprintf(r->assumption, sizeof r->assumption,
                 "SimLayerKV: %u of %u layers lazy (--lazy-frac %.2f; the paper measures "
                 "~55%% on Llama-3-8B-Instruct)",
                 (unsigned)llround(p->in->lazy_frac * p->in->model.layers),
                 p->in->model.layers, p->in->lazy_frac);
    else if (methods & KV_POLICY_MINICACHE)
        snprintf(r->assumption, sizeof r->assumption,
                 "MiniCache: %.0f%% of merged tokens retained (--retain-frac %.2f; the "
                 "paper's memory analysis assumes 5%%)",
                 100 * p->in->retain_frac, p->in->retain_frac);
}

int plan_policy(const plan_t *p, const plan_spec_t *spec, plan_result_t *r)
{
    memset(r, 0, sizeof *r);
    r->spec = spec;
    double t0 = calc_now();
    plan_sim_cfg_t c = plan_sim_cfg(p, spec);
    r->sim_head_dim = c.head_dim;
    calc_assumption(p, spec, r);
    int rc = calc_workload(p, &c, r);
    if (!rc)
        rc = calc_ctx(p, &c, r);
    if (!rc)
        rc = calc_trained_ctx(p, &c, r);
    if (!rc && p->in->curves)
        rc = calc_curve(p, &c, r);
    if (!rc && p->in->prefix_hit > 0)
        rc = calc_prefix(p, &c, r);
    if (!rc && p->in->eval_dir)
        plan_evalq_find(p->in->eval_dir, p->in->model.name, spec->ep.spec, &r->quality);
    r->seconds = calc_now() - t0;
    return rc;
}
