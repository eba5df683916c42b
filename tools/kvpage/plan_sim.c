/* SPDX-License-Identifier: MIT */
/*
 * plan_sim.c — one sequence of `kvpage plan` through the real store (see
 * plan_sim.h for the serving loop and the synthetic data).
 *
 * Ownership: every buffer and the store live for one plan_sim_run call.
 */
#include "plan_sim.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "plan_spec.h"

#define SIM_LOGIT 40.0       /* s^2 / sqrt(head_dim) of the strong keys    */
#define SIM_MAX_PAGES (1ull << 26)

enum { VEC_E1 = 0, VEC_E2 = 1, VEC_STRONG = 2 };

typedef struct sim {
    const plan_sim_cfg_t *c;
    uint32_t H, Hq, D, L;
    uint64_t n_pos;          /* prompt + out: positions of the run         */
    int mc, sim, zip;        /* MiniCache, SimLayerKV, KVzip present       */
    uint32_t sink;           /* SimLayerKV sink tokens                     */
    float strong;            /* s                                          */
    float *k;                /* [chunk][H][D] rows being appended          */
    float *q, *out;          /* [rows][Hq][D]                              */
    uint32_t rows;           /* prefill rows attended per layer (0: none)  */
    int attn_first, attn_every; /* decode attention: first step, every step */
    kv_store_t *st;
    kv_seq_id_t seq;         /* the measured sequence                      */
    int32_t *ids;            /* prefix run: a prompt's token ids [n_pos]   */
} sim_t;

int plan_sim_pick(uint64_t i, uint64_t n, double frac)
{
    if (n == 0 || i >= n || !(frac > 0))
        return 0;
    uint64_t k = (uint64_t)llround(frac * (double)n);
    k = k > n ? n : k;
    return (i + 1) * k / n > i * k / n;
}

static int vec_kind(const sim_t *S, uint32_t layer, uint64_t t)
{
    if (S->sim) {
        int lazy = plan_sim_pick(layer, S->L, S->c->lazy_frac);
        if (lazy ? t < S->sink : t == S->sink)
            return VEC_STRONG;
    }
    if (S->mc && (layer & 1u) && plan_sim_pick(t, S->n_pos, S->c->retain_frac))
        return VEC_E2;
    return VEC_E1;
}

/* Rows of positions [t0, t0 + n) of one layer into S->k (every head alike). */
static void fill_rows(sim_t *S, uint32_t layer, uint64_t t0, uint32_t n)
{
    const size_t row = S->D;
    memset(S->k, 0, (size_t)n * S->H * row * sizeof *S->k);
    for (uint32_t i = 0; i < n; i++) {
        int kind = vec_kind(S, layer, t0 + i);
        for (uint32_t h = 0; h < S->H; h++) {
            float *r = S->k + ((size_t)i * S->H + h) * row;
            if (kind == VEC_STRONG)
                r[0] = S->strong;
            else
                r[kind == VEC_E2 ? 2 : 1] = 1.0f;
        }
    }
}

/* KVzip's scoring of prompt tokens [0, prompt): a pass appends and attends
 * one reconstruction row per layer (plan_sim.h). */
static int zip_pass(sim_t *S, uint32_t prompt)
{
    kv_seq_id_t pass;
    int rc = kv_seq_fork(S->st, S->seq, &pass);
    if (rc)
        return rc;
    rc = kv_seq_score_begin(S->st, pass, S->seq, 0, prompt);
    for (uint32_t l = 0; l < S->L && !rc; l++) {
        fill_rows(S, l, prompt, 1);
        rc = kv_append(S->st, pass, l, 1, KV_DTYPE_F32, S->k, S->k, NULL);
        kv_prefill_t pf = {.layer = l, .seq = pass, .n_new = 1, .q = S->q, .out = S->out};
        if (!rc)
            rc = kv_attn_prefill(S->st, &pf);
    }
    int frc = kv_seq_free(S->st, pass);
    return rc ? rc : frc;
}

/* Append prompt tokens [from, prompt) of every layer in chunks, attend the
 * policy's rows (at most those appended), then (when end) KVzip's scoring
 * pass and kv_seq_prefill_end. */
static int prefill(sim_t *S, uint32_t from, uint32_t prompt, int end)
{
    const plan_sim_cfg_t *c = S->c;
    const uint32_t rows = S->rows < prompt - from ? S->rows : prompt - from;
    int rc = 0;
    for (uint32_t l = 0; l < S->L && !rc; l++) {
        for (uint32_t t = from; t < prompt && !rc; t += c->chunk) {
            uint32_t n = prompt - t < c->chunk ? prompt - t : c->chunk;
            fill_rows(S, l, t, n);
            rc = kv_append(S->st, S->seq, l, n, KV_DTYPE_F32, S->k, S->k, NULL);
        }
        kv_prefill_t pf = {.layer = l, .seq = S->seq, .n_new = rows, .q = S->q,
                           .out = S->out};
        if (!rc && rows)
            rc = kv_attn_prefill(S->st, &pf);
    }
    if (!rc && end && S->zip)
        rc = zip_pass(S, prompt);
    return rc || !end ? rc : kv_seq_prefill_end(S->st, S->seq);
}

/* The prefix run's token ids: the first `shared` of every prompt alike, the
 * rest the sequence's own (`who`). */
static void prefix_ids(int32_t *ids, uint32_t prompt, uint32_t shared, int32_t who)
{
    for (uint32_t i = 0; i < prompt; i++)
        ids[i] = i < shared ? (int32_t)i : (int32_t)((uint32_t)who << 24 | i);
}

/* The prefix run's first sequence: its prompt appended, the shared part
 * published, freed; *shared_pages = what the cache keeps. */
static int prefix_publisher(sim_t *S, uint32_t prompt, uint32_t shared, uint64_t *shared_pages)
{
    kv_stats_t st = {.struct_size = sizeof st};
    int rc = kv_seq_create(S->st, &S->seq);
    if (!rc)
        rc = kv_seq_set_policy(S->st, S->seq, S->c->policy);
    /* the shared part as its own chunk, published at its end: a node there
     * also carries H2O/MiniKV/CaM's statistics snapshot (docs/prefix.md);
     * a compressed context after its prefill end (the rest never comes) */
    const int ctx = S->c->prefix_ctx && shared;
    if (!rc)
        rc = prefill(S, 0, shared, ctx);
    prefix_ids(S->ids, prompt, shared, 1);
    if (!rc && ctx) {
        rc = kv_seq_prefix_publish_compressed(S->st, S->seq, S->ids, shared, NULL, 0);
    } else if (!rc && shared) {
        int got = kv_seq_prefix_publish(S->st, S->seq, S->ids, shared, NULL, 0);
        rc = got < 0 ? got : 0;
    }
    if (!rc && !ctx)
        rc = prefill(S, shared, prompt, 0);
    if (!rc)
        rc = kv_seq_free(S->st, S->seq);
    if (!rc && !(rc = kv_store_stats(S->st, &st)))
        *shared_pages = st.pages_used;
    return rc;
}

static int decode(sim_t *S, uint32_t prompt, uint32_t out)
{
    kv_seq_id_t seq = S->seq;
    int rc = 0;
    for (uint32_t g = 0; g < out && !rc; g++) {
        for (uint32_t l = 0; l < S->L && !rc; l++) {
            fill_rows(S, l, (uint64_t)prompt + g, 1);
            rc = kv_append(S->st, seq, l, 1, KV_DTYPE_F32, S->k, S->k, NULL);
            kv_decode_t d = {.layer = l, .batch = 1, .seqs = &seq, .q = S->q, .out = S->out};
            if (!rc && (S->attn_every || (g == 0 && S->attn_first)))
                rc = kv_attn_decode(S->st, &d);
        }
        if (!rc)
            rc = kv_seq_step_end(S->st, seq);
    }
    return rc;
}

/* A store for the run; a warm-up sequence with the policy, freed at once
 * (it creates the store's policy table, so the baseline metadata is the
 * store's own); then the measured sequence. */
static int run_once(sim_t *S, uint64_t pages, uint32_t prompt, uint32_t out, plan_foot_t *f)
{
    const plan_sim_cfg_t *c = S->c;
    kv_config_t cfg = kv_config_default();
    cfg.n_layers = S->L;
    cfg.n_q_heads = S->Hq;
    cfg.n_kv_heads = S->H;
    cfg.head_dim = S->D;
    cfg.host_pages = pages;
    cfg.max_seqs = 3;
    cfg.n_threads = 1;
    cfg.flags = KV_CONFIG_NO_TCACHE;
    kv_policy_info_t pi;
    cfg.residual = kv_policy_info(c->policy, S->L, prompt, &pi) ? 0 : pi.residual;
    static const char fingerprint[] = "kvpage plan";
    if (S->ids) {
        cfg.prefix_cache = 1;
        cfg.prefix_model = fingerprint;
        cfg.prefix_model_len = sizeof fingerprint - 1;
    }
    int rc = kv_store_create(&cfg, &S->st);
    if (rc)
        return rc;
    kv_seq_id_t seq;
    kv_stats_t base = {.struct_size = sizeof base}, end = {.struct_size = sizeof end};
    if (!(rc = kv_seq_create(S->st, &seq)) && !(rc = kv_seq_set_policy(S->st, seq, c->policy)))
        rc = kv_seq_free(S->st, seq);
    uint64_t shared_pages = 0;
    uint32_t matched = 0;
    uint32_t shared = 0; /* whole blocks: the cache's node unit (a context: any) */
    if (!rc && S->ids && !(rc = kv_store_stats(S->st, &base)))
        shared = c->prefix_ctx ? (uint32_t)floor(c->prefix_hit * prompt)
                               : (uint32_t)floor(c->prefix_hit * prompt) /
                                     base.fp16_tokens_per_page * base.fp16_tokens_per_page;
    if (shared >= prompt) /* the engine computes at least one prompt token */
        shared = prompt - 1;
    if (!rc && S->ids)
        rc = prefix_publisher(S, prompt, shared, &shared_pages);
    if (!rc)
        rc = kv_store_stats(S->st, &base);
    if (!rc && !(rc = kv_seq_create(S->st, &S->seq)))
        rc = kv_seq_set_policy(S->st, S->seq, c->policy);
    const int ctx = S->ids && c->prefix_ctx && shared;
    if (!rc && S->ids) {
        prefix_ids(S->ids, prompt, shared, 2);
        rc = ctx ? kv_seq_prefix_match_compressed(S->st, S->seq, S->ids, shared, NULL, 0,
                                                  &matched)
                 : kv_seq_prefix_match(S->st, S->seq, S->ids, prompt, NULL, 0, &matched);
    }
    if (!rc && ctx && matched) /* past the context's prefill end: the rest, a step end */
        rc = prefill(S, matched, prompt, 0);
    if (!rc && ctx && matched)
        rc = kv_seq_step_end(S->st, S->seq);
    else if (!rc)
        rc = prefill(S, matched, prompt, 1);
    if (!rc)
        rc = decode(S, prompt, out);
    if (!rc)
        rc = kv_store_check(S->st);
    if (!rc)
        rc = kv_store_stats(S->st, &end);
    if (!rc)
        *f = (plan_foot_t){.pages = end.pages_used - shared_pages,
                           .peak_pages = end.pages_peak,
                           .shared_pages = matched ? shared_pages : 0, /* else freed first */
                           .matched = matched,
                           .kv_bytes = end.kv_bytes,
                           .meta_bytes = end.meta_bytes - base.meta_bytes,
                           .tokens = end.tokens, .page_bytes = end.page_bytes};
    kv_store_destroy(S->st);
    S->st = NULL;
    return rc;
}

/* Attention only where the policy scores tokens, on the rows it reads. */
static void sim_attention(sim_t *S, uint32_t prompt)
{
    const kv_policy_t *p = S->c->policy;
    const uint32_t m = plan_spec_methods(p);
    int sim_prefill = S->sim && plan_spec_value(p, "simlayerkv", "mode", 0) == 1; /* prefill */
    int acc = (m & (KV_POLICY_MINIKV | KV_POLICY_H2O | KV_POLICY_CAM)) != 0;
    double rows = acc ? 1 : 0;
    rows = fmax(rows, plan_spec_value(p, "snapkv", "w", 0));
    if (m & KV_POLICY_EATTN) /* its queries' moments (w = 0: every row) */
        rows = fmax(rows, fmax(1, plan_spec_value(p, "eattn", "w", 0)));
    rows = fmax(rows, sim_prefill ? plan_spec_value(p, "simlayerkv", "rows", 0) : 0);
    S->rows = rows < prompt ? (uint32_t)rows : prompt;
    S->attn_every = (m & (KV_POLICY_H2O | KV_POLICY_CAM)) != 0;
    S->attn_first = S->sim && !sim_prefill;
}

int plan_sim_run(const plan_sim_cfg_t *c, uint32_t kv_heads, uint32_t prompt,
                 uint32_t out, plan_foot_t *f)
{
    if (!c || !f || !c->policy || !c->layers || !c->q_per_kv || !kv_heads ||
        !c->head_dim || !c->chunk || !prompt || !(c->lazy_frac >= 0 && c->lazy_frac <= 1) ||
        !(c->retain_frac >= 0 && c->retain_frac <= 0.5) ||
        !(c->prefix_hit >= 0 && c->prefix_hit <= 1))
        return KV_EINVAL;
    sim_t S = {.c = c, .H = kv_heads, .Hq = kv_heads * c->q_per_kv, .D = c->head_dim,
               .L = c->layers, .n_pos = (uint64_t)prompt + out,
               .mc = (plan_spec_methods(c->policy) & KV_POLICY_MINICACHE) != 0,
               .sim = (plan_spec_methods(c->policy) & KV_POLICY_SIMLAYERKV) != 0,
               .zip = (plan_spec_methods(c->policy) & KV_POLICY_KVZIP) != 0,
               .sink = (uint32_t)plan_spec_value(c->policy, "simlayerkv", "sink", 4),
               .strong = (float)sqrt(SIM_LOGIT * sqrt((double)c->head_dim))};
    sim_attention(&S, prompt);
    size_t qrows = S.rows ? S.rows : 1;
    size_t kn = (size_t)c->chunk * S.H * S.D, qn = qrows * S.Hq * S.D;
    if (c->prefix_hit > 0 && !(S.ids = malloc(((size_t)prompt + 1) * sizeof *S.ids)))
        return KV_ENOMEM;
    S.k = malloc(kn * sizeof *S.k);
    S.q = calloc(qn, sizeof *S.q);
    S.out = malloc(qn * sizeof *S.out);
    int rc = S.k && S.q && S.out ? 0 : KV_ENOMEM;
    for (size_t i = 0; !rc && i < qn; i += S.D)
        S.q[i] = S.strong;
    /* FP16 pages of every token, twice (conversion and compaction
     * transients), plus slack; doubled when a run still runs out. */
    uint64_t lists = (uint64_t)S.L * S.H, per_list = ((uint64_t)prompt + out) / 16 + 4;
    uint64_t pages = (S.ids ? 3 : 2) * lists * per_list + 64; /* + the shared prefix */
    for (int attempt = 0; !rc; attempt++) {
        if (pages > SIM_MAX_PAGES) {
            rc = KV_ERANGE;
            break;
        }
        rc = run_once(&S, pages, prompt, out, f);
        if (rc != KV_ENOMEM || attempt == 2)
            break;
        rc = 0;
        pages *= 2;
    }
    free(S.k);
    free(S.q);
    free(S.out);
    free(S.ids);
    return rc;
}
