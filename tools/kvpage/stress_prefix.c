/* SPDX-License-Identifier: MIT */
/*
 * stress_prefix.c — the shared-prefix workload of `kvpage stress`
 * (stress_prefix.h): requests drawn from a few system prompts and salts,
 * kv_seq_prefix_match at admission, kv_seq_prefix_publish after each
 * prefill chunk, every match checked against what was published, and the
 * final drain of the cache; with cfg.compressed, system prompts as
 * compressed contexts (stress_pfx_ctx*).
 *
 * Invariant: pub[(salt * prompts + j) * n_pol + pol] >= every prefix of
 * system prompt j the store can hold under (salt, pol): it is raised by
 * each publish before anything else can match it, and never lowered (the
 * store may forget, never invent).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "stress_driver.h"

#define PFX_SYS_BIT (1ull << 62)
#define PFX_CONTENT_BIT (1ull << 61)

uint64_t stress_pfx_sys_origin(uint32_t salt, uint32_t sys)
{
    return PFX_SYS_BIT | (uint64_t)salt << 24 | sys;
}

uint64_t stress_pfx_content_origin(uint64_t n)
{
    return PFX_CONTENT_BIT | n;
}

/* The token id at position pos of the prompt part made by `origin` (system
 * prompts: their salt-0 origin, so every salt sees the same ids). */
static int32_t pfx_token(uint64_t seed, uint64_t origin, uint32_t pos)
{
    uint64_t s = seed * 0xD1B54A32D192ED03ull ^ origin * 0x9E3779B97F4A7C15ull ^ pos;
    return (int32_t)(stress_rng_next(&s) & 0x7FFFFFFF);
}

/* Index of (salt, system prompt, policy) in pub and ctx_digest. */
static size_t pfx_key(const stress_driver_t *d, uint32_t salt, int32_t sys, uint32_t pol)
{
    return ((size_t)salt * d->cfg.pfx.prompts + (uint32_t)sys) * d->pfx.n_pol + pol;
}

static uint32_t *pfx_pub(stress_driver_t *d, uint32_t salt, int32_t sys, uint32_t pol)
{
    return &d->pfx.pub[pfx_key(d, salt, sys, pol)];
}

int stress_pfx_init(stress_driver_t *d)
{
    const stress_pfx_cfg_t *c = &d->cfg.pfx;
    stress_pfx_t *p = &d->pfx;
    if (!c->on)
        return 0;
    kv_stats_t st = {.struct_size = sizeof st};
    kv_store_stats(d->st, &st);
    p->block = st.fp16_tokens_per_page;
    p->n_pol = d->cfg.mix->n;
    p->len = calloc(c->prompts, sizeof *p->len);
    p->pub = calloc((size_t)c->salts * c->prompts * p->n_pol, sizeof *p->pub);
    p->tok = malloc(((size_t)d->cfg.dist.hi[0] + c->prompt_len) * sizeof *p->tok);
    if (c->compressed)
        p->ctx_digest = calloc((size_t)c->salts * c->prompts * p->n_pol,
                               sizeof *p->ctx_digest);
    if (!p->len || !p->pub || !p->tok || (c->compressed && !p->ctx_digest))
        return KV_ENOMEM;
    /* lengths spread over [len/2, len], most not block-aligned */
    for (uint32_t j = 0; j < c->prompts; j++) {
        uint32_t half = c->prompt_len / 2;
        p->len[j] = c->prompts > 1 ? half + (c->prompt_len - half) * j / (c->prompts - 1)
                                   : c->prompt_len;
        p->len[j] -= j ? 5 * j % p->block : 0;
        p->len[j] = p->len[j] ? p->len[j] : 1;
    }
    return 0;
}

/* The run's model fingerprint: values of earlier runs in a shared remote
 * (other seeds, other processes) never match this run's hashes, so the
 * bound table covers everything a match can return. */
const char *stress_pfx_fingerprint(stress_driver_t *d)
{
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    snprintf(d->pfx.fp, sizeof d->pfx.fp, "kvpage-stress seed %llu pid %ld t %lld.%09ld",
             (unsigned long long)d->cfg.seed, (long)getpid(), (long long)t.tv_sec,
             (long)t.tv_nsec);
    return d->pfx.fp;
}

void stress_pfx_destroy(stress_pfx_t *p)
{
    free(p->len);
    free(p->pub);
    free(p->ctx_digest);
    free(p->tok);
    memset(p, 0, sizeof *p);
}

void stress_pfx_draw(stress_driver_t *d, stress_req_t *r)
{
    const stress_pfx_cfg_t *c = &d->cfg.pfx;
    r->sys = -1;
    if (!c->on)
        return;
    r->salt = stress_rng_below(&d->rng, c->salts);
    r->content = stress_pfx_content_origin(++d->pfx.next_content);
    if (stress_rng_unit(&d->rng) < c->share) {
        r->sys = (int32_t)stress_rng_below(&d->rng, c->prompts);
        r->len[0] += d->pfx.len[r->sys];
    }
}

void stress_pfx_shadow(stress_driver_t *d, stress_slot_t *s, kv_seq_id_t id, uint64_t origin)
{
    const stress_req_t *r = &s->req;
    const stress_check_t *chk = &d->cfg.mix->pol[r->pol].chk;
    if (!d->cfg.pfx.on) {
        stress_shadow_init(&s->sh, id, origin, d->cfg.layers, chk);
        return;
    }
    if (r->sys >= 0) {
        stress_shadow_init(&s->sh, id, stress_pfx_sys_origin(r->salt, (uint32_t)r->sys),
                           d->cfg.layers, chk);
        stress_shadow_push(&s->sh, r->content, (int32_t)d->pfx.len[r->sys]);
    } else {
        stress_shadow_init(&s->sh, id, r->content, d->cfg.layers, chk);
    }
    stress_shadow_push(&s->sh, origin, (int32_t)r->len[0]);
}

/* Slot i's prompt ids into d->pfx.tok. */
static void pfx_fill(stress_driver_t *d, const stress_req_t *r)
{
    const uint32_t l_sys = r->sys >= 0 ? d->pfx.len[r->sys] : 0;
    const uint64_t sys = r->sys >= 0 ? stress_pfx_sys_origin(0, (uint32_t)r->sys) : 0;
    for (uint32_t p = 0; p < r->len[0]; p++)
        d->pfx.tok[p] = pfx_token(d->cfg.seed, p < l_sys ? sys : r->content, p);
}

/* A system prompt published under another salt (same policy), none under
 * this one: the match is a salt probe. */
static int pfx_probe(stress_driver_t *d, const stress_req_t *r)
{
    if (r->sys < 0 || *pfx_pub(d, r->salt, r->sys, r->pol) || r->published)
        return 0;
    for (uint32_t s = 0; s < d->cfg.pfx.salts; s++)
        if (s != r->salt && *pfx_pub(d, s, r->sys, r->pol) >= d->pfx.block)
            return 1;
    return 0;
}

/* The most nodes the cache held: they only appear in match (remote
 * fetches) and publish, so sampling after those calls sees the peak. */
static void pfx_peak(stress_driver_t *d)
{
    kv_stats_t st = {.struct_size = sizeof st};
    if (kv_store_stats(d->st, &st) == 0 && st.prefix_nodes > d->pfx.peak_nodes)
        d->pfx.peak_nodes = st.prefix_nodes;
}

uint32_t stress_pfx_match(stress_driver_t *d, int i)
{
    stress_slot_t *s = &d->slots[i];
    const stress_req_t *r = &s->req;
    if (!d->cfg.pfx.on)
        return 0;
    pfx_fill(d, r);
    const int probe = pfx_probe(d, r);
    stress_call_t c = {.op = STRESS_OP_PREFIX_MATCH, .slot = i};
    const int rc = stress_call(d, &c);
    pfx_peak(d);
    if (rc)
        return 0; /* KV_ENOMEM: checked unchanged by stress_call; prefill it all */
    const uint32_t m = c.matched;
    uint32_t bound = r->sys >= 0 ? *pfx_pub(d, r->salt, r->sys, r->pol) : 0;
    bound = r->published > bound ? r->published : bound;
    d->pfx.n.matches++;
    d->pfx.n.salt_probes += (uint64_t)probe;
    snprintf(d->vf.context, sizeof d->vf.context, "op %llu (prefix match)",
             (unsigned long long)d->ops);
    if (m % d->pfx.block || m >= r->len[0] || m > bound)
        stress_violation(&d->vf, "seq %u (salt %u, system prompt %d, policy %u): matched %u "
                         "of %u prompt tokens; at most %u were published under its salt and "
                         "policy%s (blocks of %u)", s->sh.id, r->salt, r->sys, r->pol, m,
                         r->len[0], bound, probe ? ", the others under other salts" : "",
                         d->pfx.block);
    if (m == 0)
        return 0;
    d->pfx.n.hits++;
    d->pfx.n.tokens_matched += m;
    d->pfx.n.own_hits += r->sys < 0 || m > d->pfx.len[r->sys];
    for (uint32_t l = 0; l < d->cfg.layers; l++)
        stress_shadow_append(&s->sh, l, m);
    snprintf(d->vf.context, sizeof d->vf.context, "op %llu (prefix hit check)",
             (unsigned long long)d->ops);
    stress_verify_seq(&d->vf, &s->sh);
    d->pfx.n.hits_verified++;
    return m;
}

/* Every copy of the request with this content origin (its live slots and
 * queued entries: a request with parallel samples whose forks are
 * preempted is requeued once per sample) now knows that `got` tokens of its
 * prompt were published. */
static void pfx_own_raise(stress_driver_t *d, uint64_t content, uint32_t got)
{
    for (uint32_t i = 0; i <= d->cfg.max_seqs; i++) {
        stress_req_t *r = &d->slots[i].req;
        if (d->slots[i].used && r->content == content && r->published < got)
            r->published = got;
    }
    for (uint32_t j = 0; j < d->q_len; j++) {
        stress_req_t *r = &d->queue[(d->q_head + j) % d->q_cap];
        if (r->content == content && r->published < got)
            r->published = got;
    }
}

void stress_pfx_publish(stress_driver_t *d, int i, uint32_t n)
{
    stress_slot_t *s = &d->slots[i];
    stress_req_t *r = &s->req;
    if (!d->cfg.pfx.on || !d->slots[i].used)
        return;
    pfx_fill(d, r);
    stress_call_t c = {.op = STRESS_OP_PREFIX_PUBLISH, .slot = i, .matched = n};
    int got = stress_call(d, &c);
    pfx_peak(d);
    if (got < 0)
        return;
    d->pfx.n.publishes++;
    if ((uint32_t)got > n)
        stress_violation(&d->vf, "seq %u: kv_seq_prefix_publish of %u tokens says %d are "
                         "cached", s->sh.id, n, got);
    pfx_own_raise(d, r->content, (uint32_t)got);
    if (r->sys >= 0) {
        uint32_t *pub = pfx_pub(d, r->salt, r->sys, r->pol);
        uint32_t sys_part = (uint32_t)got < d->pfx.len[r->sys] ? (uint32_t)got
                                                               : d->pfx.len[r->sys];
        if (sys_part > *pub)
            *pub = sys_part;
    }
}

uint32_t stress_pfx_ctx(const stress_driver_t *d, const stress_req_t *r)
{
    const stress_pol_t *pol = &d->cfg.mix->pol[r->pol];
    if (!d->cfg.pfx.on || !d->cfg.pfx.compressed || r->sys < 0 || !pol->policy ||
        pol->chk.merge_hi > pol->chk.merge_lo)
        return 0;
    return d->pfx.len[r->sys];
}

/* Digest of slot i's lists (a violation when it cannot be read). */
static uint64_t ctx_digest(stress_driver_t *d, int i)
{
    uint64_t h = 0;
    int rc = stress_verify_digest(&d->vf, d->slots[i].sh.id, &h);
    if (rc)
        stress_violation(&d->vf, "seq %u: reading its compressed context back: %s",
                         d->slots[i].sh.id, kv_strerror(rc));
    return rc ? 0 : h;
}

uint32_t stress_pfx_ctx_match(stress_driver_t *d, int i)
{
    stress_slot_t *s = &d->slots[i];
    const stress_req_t *r = &s->req;
    const uint32_t n = stress_pfx_ctx(d, r);
    pfx_fill(d, r);
    stress_call_t c = {.op = STRESS_OP_CTX_MATCH, .slot = i, .matched = n};
    const int rc = stress_call(d, &c);
    pfx_peak(d);
    if (rc)
        return 0; /* KV_ENOMEM, checked by stress_call: prefill the context */
    d->pfx.n.ctx_matches++;
    snprintf(d->vf.context, sizeof d->vf.context, "op %llu (compressed context match)",
             (unsigned long long)d->ops);
    if (c.matched != 0 && c.matched != n)
        stress_violation(&d->vf, "seq %u: a compressed context of %u tokens matched %u",
                         s->sh.id, n, c.matched);
    if (c.matched != n)
        return 0;
    d->pfx.n.ctx_hits++;
    for (uint32_t l = 0; l < d->cfg.layers; l++)
        stress_shadow_append(&s->sh, l, n);
    stress_verify_seq(&d->vf, &s->sh);
    const uint64_t want = d->pfx.ctx_digest[pfx_key(d, r->salt, r->sys, r->pol)];
    const uint64_t got = ctx_digest(d, i);
    if (got && got == want)
        d->pfx.n.ctx_hits_verified++;
    else if (got)
        stress_violation(&d->vf, "seq %u (salt %u, system prompt %d, policy %u): the "
                         "compressed context it matched %s", s->sh.id, r->salt, r->sys,
                         r->pol, want ? "differs from what its publisher held"
                                      : "was never published under its salt and policy");
    return n;
}

void stress_pfx_ctx_publish(stress_driver_t *d, int i)
{
    const stress_req_t *r = &d->slots[i].req;
    kv_stats_t before = {.struct_size = sizeof before}, after = before;
    pfx_fill(d, r);
    kv_store_stats(d->st, &before);
    stress_call_t c = {.op = STRESS_OP_CTX_PUBLISH, .slot = i, .matched = stress_pfx_ctx(d, r)};
    const int rc = stress_call(d, &c);
    pfx_peak(d);
    if (rc)
        return;
    d->pfx.n.ctx_publishes++;
    kv_store_stats(d->st, &after);
    if (after.prefix_ctx_published == before.prefix_ctx_published)
        return; /* the node was there already: its digest is recorded */
    d->pfx.n.ctx_nodes_made++;
    snprintf(d->vf.context, sizeof d->vf.context, "op %llu (compressed context publish)",
             (unsigned long long)d->ops);
    d->pfx.ctx_digest[pfx_key(d, r->salt, r->sys, r->pol)] = ctx_digest(d, i);
}

/* Append 16 zero tokens at a time to layer 0 of a new sequence until the
 * pool refuses a page: *seq (*made = 1 once created), the last result. */
static int drain_fill(stress_driver_t *d, kv_seq_id_t *seq, uint32_t *made)
{
    const uint32_t n = 16, row = d->cfg.kv_heads * d->cfg.head_dim;
    int32_t pos[16];
    int rc = kv_seq_create(d->st, seq);
    *made += rc == 0;
    float *zero = rc ? NULL : calloc((size_t)n * row, sizeof *zero);
    rc = rc ? rc : zero ? 0 : KV_ENOMEM;
    for (int32_t p = 0; rc == 0; p += (int32_t)n) {
        for (uint32_t t = 0; t < n; t++)
            pos[t] = p + (int32_t)t;
        rc = kv_append(d->st, *seq, 0, n, KV_DTYPE_F32, zero, zero, pos);
    }
    free(zero);
    return rc;
}

uint64_t stress_pfx_drain(stress_driver_t *d, uint64_t *meta0)
{
    stress_verifier_t *vf = &d->vf;
    const uint64_t before = vf->leaks;
    kv_stats_t st = {.struct_size = sizeof st};
    if (!d->cfg.pfx.on || kv_store_stats(d->st, &st))
        return 0;
    snprintf(vf->context, sizeof vf->context, "end (prefix cache drain)");
    if (st.pages_used != st.prefix_pages_only || st.prefix_pages != st.prefix_pages_only)
        stress_leak(vf, "every sequence freed: %llu pages used, the cache holds %llu "
                    "references, %llu pages only it holds", (unsigned long long)st.pages_used,
                    (unsigned long long)st.prefix_pages, (unsigned long long)st.prefix_pages_only);
    const uint64_t nodes0 = st.prefix_nodes;
    /* sequences fill the pool until a page is refused: the store must have
     * evicted (or, with a page file, demoted) every node's pool pages by
     * then; with a page file each full sequence then goes to the file
     * until the file refuses one: the nodes' copies yield first, so no node
     * may be left */
    kv_seq_id_t seqs[64];
    uint32_t n_seqs = 0;
    int rc = 0, frc = 0;
    while (n_seqs < 64) {
        rc = drain_fill(d, &seqs[n_seqs], &n_seqs);
        if (rc != KV_ENOMEM || !d->cfg.offload_path || !n_seqs)
            break;
        kv_store_stats(d->st, &st);
        if (st.prefix_pages)
            break; /* checked below */
        frc = kv_seq_offload(d->st, seqs[n_seqs - 1]);
        int wrc = frc ? 0 : kv_seq_wait(d->st, seqs[n_seqs - 1]);
        if (frc || wrc) {
            frc = frc ? frc : wrc;
            break;
        }
    }
    kv_store_stats(d->st, &st);
    if (rc != KV_ENOMEM || st.prefix_pages || st.pages_free >= d->cfg.kv_heads)
        stress_violation(vf, "filling the pool after the run: append returned %d (%s) with "
                         "%llu cache references to pool pages left and %llu pages free", rc,
                         kv_strerror(rc), (unsigned long long)st.prefix_pages,
                         (unsigned long long)st.pages_free);
    if (d->cfg.offload_path && (frc != -ENOSPC || st.prefix_nodes))
        stress_violation(vf, "filling the page file after the run: kv_seq_offload returned "
                         "%d (%s) with %llu cached nodes left (%llu on the file)", frc,
                         kv_strerror(frc), (unsigned long long)st.prefix_nodes,
                         (unsigned long long)st.prefix_file_nodes);
    else if (!d->cfg.offload_path && st.prefix_nodes)
        stress_violation(vf, "filling the pool after the run: %llu cached nodes left",
                         (unsigned long long)st.prefix_nodes);
    d->pfx.n.drained_nodes = nodes0 - st.prefix_nodes;
    for (uint32_t i = 0; i < n_seqs; i++)
        kv_seq_free(d->st, seqs[i]);
    /* the cache's hash table keeps the size it grew to (a power of two,
     * load factor <= 1: fewer than 2 buckets per node at the peak) */
    kv_store_stats(d->st, &st);
    const uint64_t grown = st.meta_bytes - *meta0;
    if (st.meta_bytes > *meta0 && grown % sizeof(void *) == 0 &&
        grown <= 2 * d->pfx.peak_nodes * sizeof(void *)) {
        d->pfx.table_bytes = grown;
        *meta0 = st.meta_bytes;
    }
    return vf->leaks - before;
}
