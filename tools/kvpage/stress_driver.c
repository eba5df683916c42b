/* SPDX-License-Identifier: MIT */
/*
 * stress_driver.c — the simulated server's state and its one door to the
 * store, stress_call (stress_driver.h): issue a public call, count it, and
 * on KV_ENOMEM verify that nothing changed, preempt, retry.
 *
 * Invariants: slots[i].used <=> slots[i].sh.id is a live store sequence;
 * n_live counts them; every live sequence's shadow says what was appended.
 */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "stress_driver.h"

#define DRV_QUEUE_CAP 1024u

/* Results an op may return besides 0 and KV_ENOMEM (stress_call). */
#define DRV_ACC_ENOSPC   0x1 /* -ENOSPC, nothing changed (a full page file)  */
#define DRV_ACC_IO       0x2 /* an I/O error (stress_io_error)                */
#define DRV_ACC_POSITIVE 0x4 /* a count (balance: pages written)              */
#define DRV_ACC_ANY      0x8 /* any result: the caller judges it (wait:       */
                             /* stress_verify_wait)                           */

/* Per op: its name; whether a KV_ENOMEM must leave the store exactly as it
 * was (prefill_end/step_end are done-or-untouched per list only; balance
 * keeps what it wrote; sync finishes all I/O first); whether a KV_ENOMEM
 * preempts and retries (attention: scratch, not pages; offload, balance,
 * sync: metadata or the file); DRV_ACC_* results. */
static const struct {
    const char *name;
    int atomic, preempt, accept;
} drv_ops[STRESS_OP_COUNT] = {
    [STRESS_OP_CREATE] = {"create", 1, 1, 0},
    [STRESS_OP_SET_POLICY] = {"set_policy", 1, 1, 0},
    [STRESS_OP_APPEND] = {"append", 1, 1, 0},
    [STRESS_OP_ATTN_PREFILL] = {"attn_prefill", 1, 0, 0},
    [STRESS_OP_PREFILL_END] = {"prefill_end", 0, 1, 0},
    [STRESS_OP_ATTN_DECODE] = {"attn_decode", 1, 0, 0},
    [STRESS_OP_STEP_END] = {"step_end", 0, 1, 0},
    [STRESS_OP_FORK] = {"fork", 1, 1, 0},
    [STRESS_OP_FREE] = {"free", 1, 1, 0},
    [STRESS_OP_OFFLOAD] = {"offload", 1, 0, DRV_ACC_ENOSPC},
    [STRESS_OP_PREFETCH] = {"prefetch", 1, 1, 0},
    [STRESS_OP_WAIT] = {"wait", 1, 0, DRV_ACC_ANY},
    [STRESS_OP_BALANCE] = {"balance", 0, 0, DRV_ACC_IO | DRV_ACC_POSITIVE},
    [STRESS_OP_SYNC] = {"sync", 0, 0, DRV_ACC_IO},
    [STRESS_OP_PREFIX_MATCH] = {"prefix_match", 0, 0, 0},
    [STRESS_OP_PREFIX_PUBLISH] = {"prefix_publish", 0, 0, DRV_ACC_POSITIVE},
    [STRESS_OP_CTX_MATCH] = {"ctx_match", 0, 0, 0},
    [STRESS_OP_CTX_PUBLISH] = {"ctx_publish", 0, 0, 0},
};

static const char *const drv_evs[STRESS_EV_COUNT] = {
    [STRESS_EV_ARRIVED] = "arrived",     [STRESS_EV_REJECTED] = "rejected",
    [STRESS_EV_ADMITTED] = "admitted",   [STRESS_EV_DEFERRED] = "deferred",
    [STRESS_EV_PREEMPTED] = "preempted", [STRESS_EV_DROPPED] = "dropped",
    [STRESS_EV_FINISHED] = "finished",   [STRESS_EV_ABORTED] = "aborted",
    [STRESS_EV_SAMPLED] = "sampled",     [STRESS_EV_BRANCHED] = "branched",
    [STRESS_EV_LOST] = "lost",
};

const char *stress_op_name(stress_op_t op)
{
    return op < STRESS_OP_COUNT ? drv_ops[op].name : "?";
}

const char *stress_ev_name(stress_ev_t ev)
{
    return ev < STRESS_EV_COUNT ? drv_evs[ev] : "?";
}

void stress_driver_destroy(stress_driver_t *d)
{
    stress_verifier_destroy(&d->vf);
    stress_pfx_destroy(&d->pfx);
    kv_store_destroy(d->st);
    free(d->slots);
    free(d->queue);
    free(d->k);
    free(d->v);
    free(d->q);
    free(d->out);
    free(d->hk);
    free(d->hv);
    free(d->pos);
    free(d->batch);
    free(d->batch_slot);
    free(d->running);
    free(d->live);
    memset(d, 0, sizeof *d);
}

/* Every policy of the mix must attach to a fresh sequence of this store. */
static int drv_check_policies(stress_driver_t *d, char *err, size_t err_len)
{
    for (uint32_t i = 0; i < d->cfg.mix->n; i++) {
        const stress_pol_t *p = &d->cfg.mix->pol[i];
        kv_seq_id_t s;
        if (!p->policy)
            continue;
        int rc = kv_seq_create(d->st, &s);
        if (rc) {
            snprintf(err, err_len, "kv_seq_create: %s", kv_strerror(rc));
            return rc;
        }
        rc = kv_seq_set_policy(d->st, s, p->policy);
        kv_seq_free(d->st, s);
        if (rc) {
            snprintf(err, err_len, "policy '%s' cannot run on this store: %s", p->spec,
                     kv_strerror(rc));
            return rc;
        }
    }
    return 0;
}

int stress_driver_create(const stress_cfg_t *cfg, stress_driver_t *d, FILE *log, char *err,
                         size_t err_len)
{
    memset(d, 0, sizeof *d);
    d->cfg = *cfg;
    d->rng = cfg->seed * 0x9E3779B97F4A7C15ull + 0x632BE59BD9B4E019ull;
    d->next_origin = 1;
    kv_config_t kc = kv_config_default();
    kc.n_layers = cfg->layers;
    kc.n_q_heads = cfg->q_heads;
    kc.n_kv_heads = cfg->kv_heads;
    kc.head_dim = cfg->head_dim;
    kc.host_pages = cfg->pool;
    kc.max_seqs = cfg->max_seqs;
    kc.n_threads = 1;
    if (cfg->offload_path) {
        kc.offload_path = cfg->offload_path;
        kc.offload_pages = cfg->offload_pages;
        kc.offload_flags = cfg->offload_pread ? KV_OFFLOAD_PREAD : 0;
        kc.offload_fault_ppm = cfg->fault_ppm;
        kc.offload_fault_seed = cfg->fault_ppm ? cfg->seed : 0;
    }
    if (cfg->pfx.on) {
        kc.prefix_cache = 1;
        kc.prefix_model = stress_pfx_fingerprint(d);
        kc.prefix_model_len = (uint32_t)strlen(d->pfx.fp);
        kc.prefix_remote = cfg->pfx.remote;
        kc.prefix_remote_timeout_ms = cfg->pfx.remote ? cfg->pfx.timeout_ms : 0;
        if (cfg->pfx.remote)
            kv_cli_remote_apply(&cfg->pfx.ropt, &kc);
    }
    int rc = kv_store_create(&kc, &d->st);
    if (rc) {
        snprintf(err, err_len, "kv_store_create: %s", kv_strerror(rc));
        return rc;
    }
    kv_stats_t st = {.struct_size = sizeof st};
    kv_store_stats(d->st, &st);
    d->tokens_per_page = st.fp16_tokens_per_page;
    const size_t n_slots = (size_t)cfg->max_seqs + 1; /* one more: creates hit ELIMIT */
    const size_t max_len = (cfg->dist.hi[0] > 0 ? cfg->dist.hi[0] : 1) +
                           (cfg->pfx.on ? cfg->pfx.prompt_len : 0);
    const size_t rows = n_slots > STRESS_PREFILL_ROWS ? n_slots : STRESS_PREFILL_ROWS;
    const size_t kv_n = max_len * cfg->kv_heads * cfg->head_dim;
    const size_t q_n = rows * cfg->q_heads * cfg->head_dim;
    d->slots = calloc(n_slots, sizeof *d->slots);
    d->live = calloc(n_slots, sizeof *d->live);
    d->queue = calloc(DRV_QUEUE_CAP, sizeof *d->queue);
    d->q_cap = DRV_QUEUE_CAP;
    d->k = malloc(kv_n * sizeof *d->k);
    d->v = malloc(kv_n * sizeof *d->v);
    d->hk = malloc(kv_n * sizeof *d->hk);
    d->hv = malloc(kv_n * sizeof *d->hv);
    d->q = malloc(q_n * sizeof *d->q);
    d->out = malloc(q_n * sizeof *d->out);
    d->pos = malloc(max_len * sizeof *d->pos);
    d->batch = malloc(n_slots * sizeof *d->batch);
    d->batch_slot = malloc(n_slots * sizeof *d->batch_slot);
    d->running = malloc(n_slots * sizeof *d->running);
    rc = stress_verifier_init(&d->vf, d->st, cfg->seed, log);
    if (!rc)
        rc = stress_pfx_init(d);
    if (rc || !d->slots || !d->live || !d->queue || !d->k || !d->v || !d->hk || !d->hv ||
        !d->q || !d->out || !d->pos || !d->batch || !d->batch_slot || !d->running) {
        snprintf(err, err_len, "out of memory");
        stress_driver_destroy(d);
        return KV_ENOMEM;
    }
    rc = drv_check_policies(d, err, err_len);
    if (rc) {
        stress_driver_destroy(d);
        return rc;
    }
    /* The leak baseline: the store's policy table is created on the first
     * kv_seq_set_policy (drv_check_policies) and kept until destroy. */
    kv_store_stats(d->st, &st);
    d->meta0 = st.meta_bytes;
    return 0;
}

/* Attention outputs of `rows` rows of slot s at layer: finite and within
 * the largest value its lists may hold (an output is a convex combination
 * of value rows). */
void stress_driver_check_out(stress_driver_t *d, const stress_slot_t *s, uint32_t layer,
                             const float *out, uint32_t rows)
{
    const size_t n = (size_t)rows * d->cfg.q_heads * d->cfg.head_dim;
    const double vmax = stress_check_vmax(s->sh.chk, layer, d->cfg.head_dim) * (1 + 1e-5) + 1e-6;
    for (size_t i = 0; i < n; i++)
        if (!isfinite(out[i]) || fabs(out[i]) > vmax) {
            stress_violation(&d->vf, "attention output of seq %u layer %u is %g, outside "
                             "[-%g, %g] (its values' bound)", s->sh.id, layer, out[i], vmax,
                             vmax);
            return;
        }
}

static int drv_append(stress_driver_t *d, stress_slot_t *s, const stress_call_t *c)
{
    const size_t n = (size_t)c->n * d->cfg.kv_heads * d->cfg.head_dim;
    stress_shadow_values(&s->sh, d->cfg.seed, c->layer, c->n, d->cfg.kv_heads,
                         d->cfg.head_dim, d->k, d->v, d->pos);
    kv_dtype_t dt = stress_rng_below(&d->rng, 4) == 0 ? KV_DTYPE_F16 : KV_DTYPE_F32;
    const void *k = d->k, *v = d->v;
    if (dt == KV_DTYPE_F16) {
        for (size_t i = 0; i < n; i++) {
            d->hk[i] = stress_gen_half(d->k[i]);
            d->hv[i] = stress_gen_half(d->v[i]);
        }
        k = d->hk;
        v = d->hv;
    }
    int rc = kv_append(d->st, s->sh.id, c->layer, c->n, dt, k, v, d->pos);
    if (rc == 0)
        stress_shadow_append(&s->sh, c->layer, c->n);
    return rc;
}

static int drv_attn_decode(stress_driver_t *d, const stress_call_t *c)
{
    const size_t row = (size_t)d->cfg.q_heads * d->cfg.head_dim;
    stress_gen_fill(&d->rng, d->q, c->batch * row);
    for (uint32_t j = 0; j < c->batch; j++)
        d->batch[j] = d->slots[d->batch_slot[j]].sh.id;
    kv_decode_t a = {.layer = c->layer, .batch = c->batch, .seqs = d->batch, .q = d->q,
                     .out = d->out};
    int rc = kv_attn_decode(d->st, &a);
    for (uint32_t j = 0; rc == 0 && j < c->batch; j++)
        stress_driver_check_out(d, &d->slots[d->batch_slot[j]], c->layer, d->out + j * row,
                                1);
    return rc;
}

static int drv_issue(stress_driver_t *d, stress_call_t *c)
{
    stress_slot_t *s = c->slot >= 0 ? &d->slots[c->slot] : NULL;
    switch (c->op) {
    case STRESS_OP_CREATE:
        return kv_seq_create(d->st, &c->out);
    case STRESS_OP_SET_POLICY:
        return kv_seq_set_policy(d->st, s->sh.id, d->cfg.mix->pol[s->req.pol].policy);
    case STRESS_OP_APPEND:
        return drv_append(d, s, c);
    case STRESS_OP_ATTN_PREFILL: {
        stress_gen_fill(&d->rng, d->q, (size_t)c->n * d->cfg.q_heads * d->cfg.head_dim);
        kv_prefill_t pf = {.layer = c->layer, .seq = s->sh.id, .n_new = c->n, .q = d->q,
                           .out = d->out};
        int rc = kv_attn_prefill(d->st, &pf);
        if (rc == 0)
            stress_driver_check_out(d, s, c->layer, d->out, c->n);
        return rc;
    }
    case STRESS_OP_PREFILL_END:
        return kv_seq_prefill_end(d->st, s->sh.id);
    case STRESS_OP_ATTN_DECODE:
        return drv_attn_decode(d, c);
    case STRESS_OP_STEP_END:
        return kv_seq_step_end(d->st, s->sh.id);
    case STRESS_OP_FORK:
        return kv_seq_fork(d->st, s->sh.id, &c->out);
    case STRESS_OP_FREE:
        return kv_seq_free(d->st, s->sh.id);
    case STRESS_OP_OFFLOAD:
        return kv_seq_offload(d->st, s->sh.id);
    case STRESS_OP_PREFETCH:
        return kv_seq_prefetch(d->st, s->sh.id);
    case STRESS_OP_WAIT:
        return kv_seq_wait(d->st, s->sh.id);
    case STRESS_OP_BALANCE:
        return kv_store_offload_balance(d->st);
    case STRESS_OP_SYNC:
        return kv_store_offload_sync(d->st);
    case STRESS_OP_PREFIX_MATCH:
    case STRESS_OP_PREFIX_PUBLISH:
    case STRESS_OP_CTX_MATCH:
    case STRESS_OP_CTX_PUBLISH: {
        char salt[32];
        const size_t n = (size_t)snprintf(salt, sizeof salt, "tenant-%u", s->req.salt);
        const kv_seq_id_t id = s->sh.id;
        if (c->op == STRESS_OP_PREFIX_PUBLISH)
            return kv_seq_prefix_publish(d->st, id, d->pfx.tok, c->matched, salt, n);
        if (c->op == STRESS_OP_PREFIX_MATCH)
            return kv_seq_prefix_match(d->st, id, d->pfx.tok, s->req.len[0], salt, n,
                                       &c->matched);
        if (c->op == STRESS_OP_CTX_PUBLISH)
            return kv_seq_prefix_publish_compressed(d->st, id, d->pfx.tok, c->matched, salt, n);
        return kv_seq_prefix_match_compressed(d->st, id, d->pfx.tok, c->matched, salt, n,
                                              &c->matched);
    }
    case STRESS_OP_COUNT:
        break;
    }
    return KV_EINVAL;
}

/* The newest live slot, if it is not the call's own (lowest priority
 * first, as vLLM preempts: the call's sequence goes itself when it is the
 * newest); or -1. */
static int drv_victim(const stress_driver_t *d, const stress_call_t *c)
{
    int best = -1;
    for (uint32_t i = 0; i <= d->cfg.max_seqs; i++)
        if (d->slots[i].used && (best < 0 || d->slots[i].order > d->slots[best].order))
            best = (int)i;
    if (best == c->slot)
        return -1;
    return best;
}

static void drv_context(stress_driver_t *d, const stress_call_t *c, const char *what)
{
    snprintf(d->vf.context, sizeof d->vf.context, "op %llu (%s%s%s)",
             (unsigned long long)d->ops, stress_op_name(c->op), what ? ": " : "",
             what ? what : "");
}

int stress_call(stress_driver_t *d, stress_call_t *c)
{
    for (;;) {
        const stress_shadow_t *sh = c->slot >= 0 ? &d->slots[c->slot].sh : NULL;
        stress_snap_take(&d->vf, sh);
        int rc = drv_issue(d, c);
        const int acc = drv_ops[c->op].accept;
        d->ops++;
        d->op_count[c->op]++;
        if (rc == 0 || (rc > 0 && (acc & DRV_ACC_POSITIVE)))
            return rc;
        if (rc == -ENOSPC && (acc & DRV_ACC_ENOSPC)) { /* all or nothing */
            drv_context(d, c, "-ENOSPC");
            stress_verify_unchanged(&d->vf, sh);
            return rc;
        }
        if ((acc & DRV_ACC_ANY) || ((acc & DRV_ACC_IO) && stress_io_error(rc)))
            return rc;
        if (rc == KV_ELIMIT && (c->op == STRESS_OP_CREATE || c->op == STRESS_OP_FORK)) {
            d->limit_failures++;
            drv_context(d, c, "KV_ELIMIT");
            stress_verify_unchanged(&d->vf, sh);
            return rc;
        }
        if (rc != KV_ENOMEM) {
            drv_context(d, c, NULL);
            stress_violation(&d->vf, "unexpected error %d (%s)", rc, kv_strerror(rc));
            return rc;
        }
        d->alloc_failures++;
        drv_context(d, c, "KV_ENOMEM");
        if (drv_ops[c->op].atomic) {
            stress_verify_unchanged(&d->vf, sh);
        } else {
            int crc = kv_store_check(d->st);
            if (crc)
                stress_violation(&d->vf, "kv_store_check after a failed call: %s",
                                 kv_strerror(crc));
            if (sh)
                stress_verify_seq(&d->vf, sh);
        }
        if (!drv_ops[c->op].preempt || c->defer)
            return rc; /* not for want of pages, or an admission that waits instead */
        int victim = drv_victim(d, c);
        if (victim < 0)
            return rc;
        stress_driver_release(d, victim, STRESS_EV_PREEMPTED);
    }
}

int stress_driver_free_slot(const stress_driver_t *d)
{
    for (uint32_t i = 0; i <= d->cfg.max_seqs; i++)
        if (!d->slots[i].used)
            return (int)i;
    return -1;
}

int stress_driver_enqueue(stress_driver_t *d, const stress_req_t *r, int front)
{
    if (d->q_len == d->q_cap)
        return -1;
    if (front) {
        d->q_head = (d->q_head + d->q_cap - 1) % d->q_cap;
        d->queue[d->q_head] = *r;
    } else {
        d->queue[(d->q_head + d->q_len) % d->q_cap] = *r;
    }
    d->q_len++;
    return 0;
}

void stress_driver_release(stress_driver_t *d, int i, stress_ev_t ev)
{
    stress_slot_t *s = &d->slots[i];
    stress_call_t c = {.op = STRESS_OP_FREE, .slot = i};
    stress_call(d, &c);
    s->used = 0;
    d->n_live--;
    if (ev < STRESS_EV_COUNT)
        d->ev_count[ev]++;
    if (ev == STRESS_EV_PREEMPTED || ev == STRESS_EV_LOST) {
        stress_req_t r = s->req;
        r.samples = 1;
        r.waited = 0;
        if (stress_driver_enqueue(d, &r, 1))
            d->ev_count[STRESS_EV_REJECTED]++;
    }
}

uint64_t stress_driver_verify(stress_driver_t *d)
{
    uint32_t n = 0;
    for (uint32_t i = 0; i <= d->cfg.max_seqs; i++)
        if (d->slots[i].used)
            d->live[n++] = &d->slots[i].sh;
    snprintf(d->vf.context, sizeof d->vf.context, "op %llu (verification)",
             (unsigned long long)d->ops);
    d->verify_runs++;
    d->last_verify = d->ops;
    return stress_verify_store(&d->vf, d->live, n);
}

/* 1 if a live slot has I/O the driver has not waited for. */
static int drv_io_pending(const stress_driver_t *d)
{
    for (uint32_t i = 0; i <= d->cfg.max_seqs; i++)
        if (d->slots[i].used && (d->slots[i].sh.res == STRESS_RES_WRITING ||
                                 d->slots[i].sh.res == STRESS_RES_READING))
            return 1;
    return 0;
}

uint64_t stress_driver_finish(stress_driver_t *d)
{
    /* bring back what is coming back (each lost sequence is retried at
     * most STRESS_LOST_TRIES times, so this ends) */
    while (d->cfg.offload_path && drv_io_pending(d))
        stress_off_settle_all(d);
    uint64_t bad = stress_driver_verify(d);
    for (uint32_t i = 0; i <= d->cfg.max_seqs; i++)
        if (d->slots[i].used)
            stress_driver_release(d, (int)i, STRESS_EV_COUNT);
    uint64_t meta0 = d->meta0;
    bad += stress_pfx_drain(d, &meta0);
    snprintf(d->vf.context, sizeof d->vf.context, "end (every sequence freed)");
    bad += stress_verify_empty(&d->vf, meta0);
    d->final.struct_size = sizeof d->final;
    kv_store_stats(d->st, &d->final);
    return bad;
}
