/* SPDX-License-Identifier: MIT */
/*
 * stress_step.c — one iteration of the serving loop `kvpage stress` simulates
 * (stress_driver_step): the phases every iteration runs, in order, then the
 * random events of a table, each with its probability per iteration.
 *
 *   arrive  Poisson(rate) requests join the queue (lengths from the dist,
 *           a policy from the mix, 10% want 2-4 parallel samples).
 *   admit   while one of the first 8 queued requests fits (free pages, and
 *           pages only the prefix cache holds, >= its prompt's pages, vLLM's
 *           watermark; the head first, and only
 *           the head once it was passed over 64 iterations, so that nothing
 *           starves): create, attach the policy, prefill every
 *           layer (one chunk, or two in 1 of 4; kv_attn_prefill over up to
 *           STRESS_PREFILL_ROWS new rows in half the layers), prefill_end, fork the extra
 *           samples (each fork checked equal to its parent). Out of pages
 *           or sequences: the request waits at the head of the queue
 *           (deferred); alone and still out of pages: dropped.
 *   decode  every layer: append one token to each running sequence (out of
 *           pages: the newest other sequence is preempted, or this one if
 *           it is the newest), then one kv_attn_decode over the batch;
 *           then step_end for each.
 *   finish  sequences with all their output tokens are freed.
 * With shared prefixes (cfg.pfx.on, stress_prefix.c) admission matches the
 * prompt against the prefix cache after attaching the policy, prefills only
 * the rest, and publishes the prompt after each prefill chunk (before
 * prefill_end); with compressed contexts a request whose system prompt is
 * its context matches or prefills, compresses and publishes that, then
 * appends the rest of its prompt and ends it with step_end.
 * With a page file (cfg.offload_path) an iteration starts with
 *   settle  kv_seq_wait every sequence with I/O in flight (stress_offload.c),
 * and only sequences whose pages are all resident decode or branch.
 * Events (a table, each row with its probability per iteration): abort (a
 * random live sequence is freed, wherever its pages are), branch (a random
 * running sequence is forked mid-decode); with a page file (rows not even
 * drawn without one, so such runs are the same as before the tier): offload
 * (a random running sequence goes to the file), prefetch (a random one on
 * the file comes back), balance (kv_store_offload_balance), sync
 * (kv_store_offload_sync).
 */
#include "stress_driver.h"

#define ENG_LOOKAHEAD 8u  /* queued requests admission looks at      */
#define ENG_MAX_WAIT 64u  /* iterations the head may be skipped      */

typedef void (*eng_fn)(stress_driver_t *d);

static int eng_call(stress_driver_t *d, stress_op_t op, int slot, uint32_t layer, uint32_t n,
                    int defer)
{
    stress_call_t c = {.op = op, .slot = slot, .layer = layer, .n = n,
                       .defer = defer};
    return stress_call(d, &c);
}

static void eng_arrive(stress_driver_t *d)
{
    uint32_t n = stress_rng_poisson(&d->rng, d->cfg.rate);
    for (uint32_t i = 0; i < n; i++) {
        stress_req_t r = {.samples = 1};
        stress_dist_sample(&d->cfg.dist, &d->rng, r.len);
        if (stress_rng_below(&d->rng, 10) == 0)
            r.samples = 2 + stress_rng_below(&d->rng, 3);
        r.pol = stress_rng_below(&d->rng, d->cfg.mix->n);
        stress_pfx_draw(d, &r);
        d->ev_count[STRESS_EV_ARRIVED]++;
        if (stress_driver_enqueue(d, &r, 0))
            d->ev_count[STRESS_EV_REJECTED]++;
    }
}

/* Fork running slot `parent` into a free slot; ev SAMPLED or BRANCHED. */
static void eng_fork(stress_driver_t *d, int parent, stress_ev_t ev)
{
    stress_slot_t *p = &d->slots[parent];
    stress_shadow_t sh;
    int i = stress_driver_free_slot(d);
    if (i < 0 || stress_shadow_fork(&p->sh, 0, d->next_origin, &sh))
        return; /* lineage full (or layers uneven: never between steps) */
    stress_call_t c = {.op = STRESS_OP_FORK, .slot = parent};
    if (stress_call(d, &c))
        return;
    stress_slot_t *s = &d->slots[i];
    *s = *p;
    s->order = d->next_order++;
    s->req.samples = 1;
    s->sh = sh;
    s->sh.id = c.out;
    d->next_origin++;
    d->n_live++;
    d->max_live = d->n_live > d->max_live ? d->n_live : d->max_live;
    d->ev_count[ev]++;
    snprintf(d->vf.context, sizeof d->vf.context, "op %llu (fork check)",
             (unsigned long long)d->ops);
    stress_verify_same(&d->vf, p->sh.id, s->sh.id);
}

/* Append prompt tokens [from, to) of slot i to every layer, in one chunk or
 * two (1 in 4), with kv_attn_prefill over up to STRESS_PREFILL_ROWS new
 * rows in about half the layers; `publish`: kv_seq_prefix_publish the
 * prompt so far after each chunk. Returns 0 or the failing call's error. */
static int eng_prefill(stress_driver_t *d, int i, uint32_t from, uint32_t to, int publish)
{
    const uint32_t rest = to - from;
    uint32_t chunk[2] = {rest, 0};
    if (rest >= 2 && stress_rng_below(&d->rng, 4) == 0) {
        chunk[0] = 1 + stress_rng_below(&d->rng, rest - 1);
        chunk[1] = rest - chunk[0];
    }
    int rc = 0;
    for (int ch = 0; ch < 2 && chunk[ch] && !rc; ch++) {
        for (uint32_t l = 0; l < d->cfg.layers && !rc; l++) {
            rc = eng_call(d, STRESS_OP_APPEND, i, l, chunk[ch], 1);
            if (!rc && stress_rng_below(&d->rng, 2) == 0) {
                uint32_t rows = chunk[ch] < STRESS_PREFILL_ROWS ? chunk[ch] : STRESS_PREFILL_ROWS;
                eng_call(d, STRESS_OP_ATTN_PREFILL, i, l, rows, 1);
            }
        }
        if (!rc && publish) /* what is prefilled, before prefill_end */
            stress_pfx_publish(d, i, from + chunk[0] + (ch ? chunk[1] : 0));
    }
    return rc;
}

/* Slot i's prompt: its system prompt as a compressed context of ctx tokens
 * (matched, or prefilled, compressed and published), the rest appended
 * after the prefill end and ended with a step. */
static int eng_prefill_ctx(stress_driver_t *d, int i, uint32_t ctx)
{
    int rc = 0;
    if (!stress_pfx_ctx_match(d, i)) {
        rc = eng_prefill(d, i, 0, ctx, 0);
        if (!rc)
            rc = eng_call(d, STRESS_OP_PREFILL_END, i, 0, 0, 1);
        if (!rc)
            stress_pfx_ctx_publish(d, i);
    }
    if (!rc && d->slots[i].req.len[0] > ctx) {
        rc = eng_prefill(d, i, ctx, d->slots[i].req.len[0], 0);
        if (!rc)
            rc = eng_call(d, STRESS_OP_STEP_END, i, 0, 0, 1);
    }
    return rc;
}

/* Prefill request r into a new sequence. Returns 0 (admitted, dropped or
 * failed) or -1: the request must wait (re-queue it). */
static int eng_admit_one(stress_driver_t *d, stress_req_t *r)
{
    int i = stress_driver_free_slot(d);
    stress_call_t c = {.op = STRESS_OP_CREATE, .slot = -1, .defer = 1};
    if (i < 0 || stress_call(d, &c))
        return -1;
    stress_slot_t *s = &d->slots[i];
    *s = (stress_slot_t){.used = 1, .order = d->next_order++, .req = *r};
    stress_pfx_shadow(d, s, c.out, d->next_origin++);
    d->n_live++;
    d->max_live = d->n_live > d->max_live ? d->n_live : d->max_live;
    if (d->cfg.mix->pol[r->pol].policy && eng_call(d, STRESS_OP_SET_POLICY, i, 0, 0, 1)) {
        stress_driver_release(d, i, STRESS_EV_DROPPED);
        return 0;
    }
    const uint32_t ctx = stress_pfx_ctx(d, r);
    int rc;
    if (ctx) {
        rc = eng_prefill_ctx(d, i, ctx);
    } else {
        const uint32_t m = stress_pfx_match(d, i); /* tokens from the prefix cache */
        rc = eng_prefill(d, i, m, r->len[0], 1);
        if (!rc)
            rc = eng_call(d, STRESS_OP_PREFILL_END, i, 0, 0, 1);
    }
    if (rc) {
        int alone = d->n_live == 1;
        r->published = s->req.published; /* requeued: what it published stays */
        stress_driver_release(d, i, alone ? STRESS_EV_DROPPED : STRESS_EV_COUNT);
        return rc == KV_ENOMEM && !alone ? -1 : 0;
    }
    s->decoding = 1;
    d->ev_count[STRESS_EV_ADMITTED]++;
    for (uint32_t k = 1; k < r->samples; k++)
        eng_fork(d, i, STRESS_EV_SAMPLED);
    return 0;
}

/* Pages a request's prompt needs (its lists' FP16 pages, one spare each). */
static uint64_t eng_need(const stress_driver_t *d, const stress_req_t *r)
{
    return (uint64_t)d->cfg.layers * d->cfg.kv_heads *
           ((r->len[0] + d->tokens_per_page - 1) / d->tokens_per_page + 1);
}

/* Index (from the head) of the first of the next ENG_LOOKAHEAD queued
 * requests that fits, or -1. Skipping the head stops once it has waited
 * ENG_MAX_WAIT iterations (it then waits for room: no starvation). */
static int eng_pick_req(stress_driver_t *d)
{
    kv_stats_t st = {.struct_size = sizeof st};
    kv_store_stats(d->st, &st);
    uint32_t n = d->q_len < ENG_LOOKAHEAD ? d->q_len : ENG_LOOKAHEAD;
    if (d->queue[d->q_head].waited >= ENG_MAX_WAIT)
        n = 1;
    /* pages only the prefix cache holds are free to an engine: the store
     * evicts them before it refuses a page */
    const uint64_t avail = st.pages_free + st.prefix_pages_only;
    for (uint32_t j = 0; j < n; j++)
        if (d->n_live == 0 || avail >= eng_need(d, &d->queue[(d->q_head + j) % d->q_cap]))
            return (int)j;
    return -1;
}

static void eng_admit(stress_driver_t *d)
{
    if (d->q_len && d->n_live && eng_pick_req(d) != 0)
        d->queue[d->q_head].waited++;
    while (d->q_len) {
        int j = eng_pick_req(d);
        if (j < 0) {
            d->ev_count[STRESS_EV_DEFERRED]++;
            return;
        }
        stress_req_t r = d->queue[(d->q_head + (uint32_t)j) % d->q_cap];
        for (uint32_t i = (uint32_t)j; i > 0; i--) /* close the gap */
            d->queue[(d->q_head + i) % d->q_cap] = d->queue[(d->q_head + i - 1) % d->q_cap];
        d->q_head = (d->q_head + 1) % d->q_cap;
        d->q_len--;
        if (eng_admit_one(d, &r)) {
            stress_driver_enqueue(d, &r, 1);
            d->ev_count[STRESS_EV_DEFERRED]++;
            return;
        }
    }
}

/* Running slot i ran out of pages with nobody newer to preempt. */
static void eng_evict_self(stress_driver_t *d, int i)
{
    stress_driver_release(d, i, d->n_live == 1 ? STRESS_EV_DROPPED : STRESS_EV_PREEMPTED);
}

static void eng_decode(stress_driver_t *d)
{
    uint32_t nb = 0, *bs = d->batch_slot, *run = d->running;
    for (uint32_t i = 0; i <= d->cfg.max_seqs; i++)
        if (d->slots[i].used && d->slots[i].decoding &&
            d->slots[i].sh.res == STRESS_RES_RESIDENT)
            run[nb++] = i;
    for (uint32_t l = 0; l < d->cfg.layers; l++) {
        uint32_t m = 0;
        for (uint32_t j = 0; j < nb; j++) {
            int i = (int)run[j];
            if (!d->slots[i].used)
                continue;
            if (eng_call(d, STRESS_OP_APPEND, i, l, 1, 0))
                eng_evict_self(d, i);
        }
        for (uint32_t j = 0; j < nb; j++)
            if (d->slots[run[j]].used)
                bs[m++] = run[j];
        if (m) {
            stress_call_t c = {.op = STRESS_OP_ATTN_DECODE, .slot = -1,
                               .layer = l, .batch = m};
            stress_call(d, &c);
        }
    }
    for (uint32_t j = 0; j < nb; j++) {
        int i = (int)run[j];
        if (!d->slots[i].used)
            continue;
        if (eng_call(d, STRESS_OP_STEP_END, i, 0, 0, 0))
            eng_evict_self(d, i);
        else
            d->slots[i].generated++;
    }
}

static void eng_finish(stress_driver_t *d)
{
    for (uint32_t i = 0; i <= d->cfg.max_seqs; i++) {
        stress_slot_t *s = &d->slots[i];
        if (s->used && s->decoding && s->generated >= s->req.len[1])
            stress_driver_release(d, (int)i, STRESS_EV_FINISHED);
    }
}

static int eng_pickable(const stress_slot_t *s, int res)
{
    return s->used && s->decoding && (res < 0 || s->sh.res == (stress_res_t)res);
}

int stress_driver_pick(stress_driver_t *d, int res)
{
    uint32_t n = 0;
    for (uint32_t i = 0; i <= d->cfg.max_seqs; i++)
        n += (uint32_t)eng_pickable(&d->slots[i], res);
    if (n == 0)
        return -1;
    uint32_t k = stress_rng_below(&d->rng, n);
    for (uint32_t i = 0; i <= d->cfg.max_seqs; i++)
        if (eng_pickable(&d->slots[i], res) && k-- == 0)
            return (int)i;
    return -1;
}

static void eng_abort(stress_driver_t *d)
{
    int i = stress_driver_pick(d, -1);
    if (i >= 0)
        stress_driver_release(d, i, STRESS_EV_ABORTED);
}

static void eng_branch(stress_driver_t *d)
{
    int i = stress_driver_pick(d, STRESS_RES_RESIDENT);
    if (i >= 0)
        eng_fork(d, i, STRESS_EV_BRANCHED);
}

/* Phases, in order; `offload`: only with a page file. */
static const struct {
    const char *name;
    eng_fn fn;
    int offload;
} eng_phases[] = {
    {"settle", stress_off_settle_all, 1},
    {"arrive", eng_arrive, 0},
    {"admit", eng_admit, 0},
    {"decode", eng_decode, 0},
    {"finish", eng_finish, 0},
};

/* Random events: each runs with probability p per iteration; `offload`:
 * only with a page file (not drawn without one). */
static const struct {
    const char *name;
    double p;
    eng_fn fn;
    int offload;
} eng_events[] = {
    {"abort", 0.01, eng_abort, 0},
    {"branch", 0.03, eng_branch, 0},
    {"offload", 0.2, stress_off_offload, 1},
    {"prefetch", 0.3, stress_off_prefetch, 1},
    {"balance", 0.02, stress_off_balance, 1},
    {"sync", 0.005, stress_off_sync, 1},
};

void stress_driver_step(stress_driver_t *d)
{
    const int off = d->cfg.offload_path != NULL;
    for (size_t i = 0; i < sizeof eng_phases / sizeof eng_phases[0]; i++)
        if (off || !eng_phases[i].offload)
            eng_phases[i].fn(d);
    for (size_t i = 0; i < sizeof eng_events / sizeof eng_events[0]; i++)
        if ((off || !eng_events[i].offload) && stress_rng_unit(&d->rng) < eng_events[i].p)
            eng_events[i].fn(d);
    d->iterations++;
    if (d->cfg.verify_every && d->ops - d->last_verify >= d->cfg.verify_every)
        stress_driver_verify(d);
}
