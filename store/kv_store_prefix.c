/* SPDX-License-Identifier: MIT */
/*
 * kv_store_prefix.c — the prefix cache in the host pool (kvpage.h, "prefix
 * cache"; docs/prefix.md): content-addressed nodes of prompt blocks shared
 * copy-on-write with the sequences that match them.
 *
 * A node covers tokens [start, end) of a prompt, both block boundaries (B =
 * FP16 tokens per page), and is keyed by the chained block hash of its last
 * block (prefix/kv_prefix_hash.h: the hash names the whole prefix [0, end),
 * the fingerprint and the salt). It holds, for every list of a sequence
 * (li = layer * n_kv_heads + head), the entries covering [start, end), and
 * one pool reference per entry (pages/kv_page_extern.c). Its parent is the
 * node ending at start (NULL when start == 0). A match walks the prompt's
 * block hashes and accepts a node only where its start is the tokens
 * matched so far, so the entries of an accepted chain, concatenated per
 * list, are the lists of [0, end).
 *
 * When a node may exist (publish): at boundary b, every list of the
 * publisher holds only full, unflagged (resident, not merged or retained)
 * pages from token 0 to b, of FP16 where the list's target is FP16 and of
 * the target format where it is INT4/INT2, with positions 0..b-1; and b is
 * a multiple of the residual R for a list converting to INT (the KIVI rule:
 * an append reaching R tokens of residual converts them, so at a multiple of
 * R a cold prefill of [0, b) holds exactly that). This is stricter than
 * "INT up to floor(b/R)*R, FP16 after": a node whose FP16 tail a longer
 * prefix would have converted could not serve as the parent of that longer
 * prefix's node, so such nodes are not made. With full pages from token 0,
 * list li's entries of [a, b) are entries a/tpp .. b/tpp - 1 (tpp: tokens
 * per page of the list's format).
 *
 * Policies whose prefill end reads attention summed over every prompt row
 * (H2O, MiniKV, CaM): a node may carry a statistics snapshot (the sums of
 * [0, end) after rows [0, end), kv_store_prefix_acc.c), taken by a publish
 * made when the prefill has processed exactly `end` rows; a match under
 * such a policy stops at the last node of its chain with one, restores it,
 * and never uses the remote tier (whose nodes carry none).
 *
 * Invariants (kv_store_prefix_check): every node is in exactly one hash
 * bucket (by key) and in the LRU list (coldest first); children == the
 * nodes whose parent it is; a node's entries per list sum to end - start
 * tokens; refcount of each page == table entries + node entries naming it
 * (kv_page_table_check_ext) for nodes in the pool; a node on the page file
 * holds no pool reference (kv_store_prefix_file.c: the page-file tier,
 * its invariants there). file_kids == the children on the file. A node
 * with children in the pool is never evicted: chains are evicted from
 * their ends; with a page file an evicted node is demoted (kept, on the
 * file, its snapshot kept in memory), else dropped. bytes == every kv_mem
 * block held here (snapshots included; n_acc, acc_bytes: theirs; the
 * copies' blocks: f_mem).
 *
 * Ownership: the store owns s->pfx, its buckets, its copy of the model
 * fingerprint and every node (one kv_mem block each) with its references.
 */
#include <stdio.h>
#include <string.h>

#include "alloc/kv_mem.h"
#include "kv_policy_int.h"
#include "kv_store_int.h"
#include "kv_store_prefix_int.h"

/* ---- life -------------------------------------------------------------------- */

int kv_store_prefix_resolve(const kv_config_t *c)
{
    if (c->prefix_cache > 1)
        return KV_EINVAL;
    int rc = kv_pfx_sec_resolve(c);
    if (rc)
        return rc;
    if (!c->prefix_cache)
        return (c->prefix_model || c->prefix_model_len || c->prefix_remote ||
                c->prefix_remote_timeout_ms || c->prefix_remote_ns || c->prefix_remote_mac ||
                c->prefix_remote_mac_prev) ? KV_EINVAL : 0;
    rc = kv_pfx_remote_resolve(c);
    if (rc)
        return rc;
    if (!c->prefix_model || c->prefix_model_len == 0)
        return KV_EINVAL;
    return c->prefix_model_len > KV_PREFIX_MAX_FIELD_BYTES ? KV_ERANGE : 0;
}

uint64_t kv_store_prefix_fixed_bytes(const kv_config_t *c)
{
    return c->prefix_cache ? sizeof(kv_pfx_t) + c->prefix_model_len +
                                 PFX_BUCKETS0 * sizeof(kv_pfx_node_t *)
                           : 0;
}

int kv_store_prefix_init(kv_store_t *s)
{
    s->pfx = NULL;
    if (!s->cfg.prefix_cache)
        return 0;
    kv_pfx_t *p = kv_mem_calloc(1, sizeof *p);
    uint8_t *model = kv_mem_alloc(s->cfg.prefix_model_len);
    kv_pfx_node_t **b = kv_mem_calloc(PFX_BUCKETS0, sizeof *b);
    if (!p || !model || !b) {
        kv_mem_free(p, sizeof *p);
        kv_mem_free(model, s->cfg.prefix_model_len);
        kv_mem_free(b, b ? PFX_BUCKETS0 * sizeof *b : 0);
        return KV_ENOMEM;
    }
    memcpy(model, s->cfg.prefix_model, s->cfg.prefix_model_len);
    p->model = model;
    p->model_len = s->cfg.prefix_model_len;
    p->buckets = b;
    p->n_buckets = PFX_BUCKETS0;
    p->bytes = sizeof *p + p->model_len + PFX_BUCKETS0 * sizeof *b;
    s->pfx = p;
    s->cfg.prefix_model = model; /* the store's copy */
    return kv_pfx_remote_init(s); /* (the store's destroy frees p on error) */
}

static void node_release(kv_store_t *s, kv_pfx_node_t *n)
{
    for (uint32_t i = 0; !n->on_file && i < n->n_ents; i++)
        kv_page_ref_drop(s->pt, n->ents[i].id, n->ents[i].format);
    s->pfx->n_refs -= n->on_file ? 0 : n->n_ents;
    kv_pfx_file_release(s, n); /* its copy on the page file, if any */
    s->pfx->bytes -= n->bytes + n->acc_bytes;
    if (n->pol) /* a compressed context's policy state (kv_store_prefix_ctx.c) */
        kv_pfx_ctx_release(s, n);
    if (n->acc) { /* its statistics snapshot (kv_store_prefix_acc.c) */
        s->pfx->n_acc--;
        s->pfx->acc_bytes -= n->acc_bytes;
        kv_mem_free(n->acc, n->acc_bytes);
    }
    kv_mem_free(n, n->bytes);
}

void kv_store_prefix_fini(kv_store_t *s)
{
    kv_pfx_t *p = s->pfx;
    if (!p)
        return;
    kv_pfx_remote_fini(s); /* its publisher copied what it queued */
    for (kv_pfx_node_t *n = p->cold, *next; n; n = next) {
        next = n->next;
        node_release(s, n);
    }
    kv_mem_free(p->buckets, (size_t)p->n_buckets * sizeof *p->buckets);
    kv_mem_free(p->model, p->model_len);
    kv_mem_free(p, sizeof *p);
    s->pfx = NULL;
    s->cfg.prefix_model = NULL;
}

/* ---- the table ---------------------------------------------------------------- */

static uint32_t bucket_of(const kv_pfx_t *p, const kv_prefix_hash_t *k)
{
    uint32_t x;
    memcpy(&x, k->b, sizeof x);
    return x & (p->n_buckets - 1);
}

kv_pfx_node_t *kv_pfx_lookup(const kv_pfx_t *p, const kv_prefix_hash_t *k)
{
    for (kv_pfx_node_t *n = p->buckets[bucket_of(p, k)]; n; n = n->hnext)
        if (memcmp(n->key.b, k->b, sizeof k->b) == 0)
            return n;
    return NULL;
}

/* kv_store_prefix_int.h; load factor <= 1. */
int kv_pfx_reserve(kv_pfx_t *p, uint64_t more)
{
    uint64_t want = p->n_buckets;
    while (want < p->n_nodes + more)
        want *= 2;
    if (want == p->n_buckets)
        return 0;
    if (want > (1u << 30))
        return KV_ENOMEM;
    kv_pfx_node_t **b = kv_mem_calloc(want, sizeof *b);
    if (!b)
        return KV_ENOMEM;
    kv_pfx_node_t **old = p->buckets;
    uint32_t n_old = p->n_buckets;
    p->buckets = b;
    p->n_buckets = (uint32_t)want;
    for (uint32_t i = 0; i < n_old; i++)
        for (kv_pfx_node_t *n = old[i], *next; n; n = next) {
            next = n->hnext;
            uint32_t j = bucket_of(p, &n->key);
            n->hnext = b[j];
            b[j] = n;
        }
    kv_mem_free(old, (size_t)n_old * sizeof *old);
    p->bytes += (want - n_old) * sizeof *b;
    return 0;
}

static void lru_unlink(kv_pfx_t *p, kv_pfx_node_t *n)
{
    if (n->prev)
        n->prev->next = n->next;
    else
        p->cold = n->next;
    if (n->next)
        n->next->prev = n->prev;
    else
        p->hot = n->prev;
    n->prev = n->next = NULL;
}

static void lru_push_hot(kv_pfx_t *p, kv_pfx_node_t *n)
{
    n->prev = p->hot;
    n->next = NULL;
    if (p->hot)
        p->hot->next = n;
    else
        p->cold = n;
    p->hot = n;
}

/* Touch a chain root first, so its end is the hottest. */
void kv_pfx_touch(kv_pfx_t *p, kv_pfx_node_t *n)
{
    lru_unlink(p, n);
    lru_push_hot(p, n);
}

/* Unlink a childless node from the table and free it. */
static void node_evict(kv_store_t *s, kv_pfx_node_t *n)
{
    kv_pfx_t *p = s->pfx;
    kv_pfx_node_t **pp = &p->buckets[bucket_of(p, &n->key)];
    while (*pp != n)
        pp = &(*pp)->hnext;
    *pp = n->hnext;
    lru_unlink(p, n);
    if (n->parent) {
        n->parent->children--;
        n->parent->file_kids -= n->on_file;
    }
    p->n_nodes--;
    p->f_nodes -= n->on_file;
    node_release(s, n);
}

/* kv_store_prefix_int.h. Children first: a node's children are found by a
 * scan (drops are rare: a node on the file that fails its check, a full
 * file). */
void kv_pfx_drop(kv_store_t *s, kv_pfx_node_t *x)
{
    while (x->children) {
        kv_pfx_node_t *c = s->pfx->cold;
        while (c->parent != x)
            c = c->next;
        kv_pfx_drop(s, c);
    }
    node_evict(s, x);
}

kv_pfx_node_t *kv_pfx_node_alloc(uint32_t n_lists, uint32_t n_ents, uint32_t n_pos)
{
    const uint32_t n_off = n_lists + 1 + (n_pos ? n_lists : 0); /* off, target */
    size_t head = (sizeof(kv_pfx_node_t) + n_off * sizeof(uint32_t) + 7) & ~(size_t)7;
    size_t bytes = head + (size_t)n_ents * sizeof(kv_page_ent_t) + (size_t)n_pos * sizeof(int32_t);
    kv_pfx_node_t *x = kv_mem_calloc(1, bytes);
    if (!x)
        return NULL;
    x->bytes = bytes;
    x->n_ents = n_ents;
    x->off = (uint32_t *)(x + 1);
    x->ents = (kv_page_ent_t *)((char *)x + head);
    x->pos = n_pos ? (int32_t *)(x->ents + n_ents) : NULL;
    x->target = n_pos ? x->off + n_lists + 1 : NULL;
    x->n_pos = n_pos;
    return x;
}

void kv_pfx_link(kv_store_t *s, kv_pfx_node_t *x, int take_refs)
{
    kv_pfx_t *p = s->pfx;
    uint32_t bk = bucket_of(p, &x->key);
    x->hnext = p->buckets[bk];
    p->buckets[bk] = x;
    if (x->parent) {
        x->parent->children++;
        x->parent->file_kids += x->on_file;
    }
    for (uint32_t e = 0; take_refs && e < x->n_ents; e++)
        kv_page_ref_take(s->pt, x->ents[e].id);
    p->n_refs += x->on_file ? 0 : x->n_ents;
    p->f_nodes += x->on_file;
    p->n_nodes++;
    p->bytes += x->bytes;
    if (x->acc) /* given before linking */
        kv_pfx_acc_give(p, x, x->acc, x->acc_bytes, 1);
    lru_push_hot(p, x);
}

/* ---- eviction ----------------------------------------------------------------- */

/* 1 if no sequence holds a page of the node (evicting it frees them all). */
static int node_only_cached(const kv_store_t *s, const kv_pfx_node_t *n)
{
    for (uint32_t i = 0; i < n->n_ents; i++)
        if (kv_alloc_refcount(s->pool, n->ents[i].id) != 1)
            return 0;
    return 1;
}

uint64_t kv_store_prefix_evict(kv_store_t *s, uint64_t target)
{
    kv_pfx_t *p = s->pfx;
    if (!p)
        return 0;
    const uint64_t f0 = kv_store_pool_free(s);
    uint64_t f = f0;
    /* Pass 0: nodes whose pages only the cache holds; pass 1: any (a node
     * shared with a sequence keeps that sequence's pages shared, which the
     * ladder's lossy steps then skip). Coldest first, chains from their
     * ends: evicting a leaf may make its parent a leaf. With a page file a
     * node is demoted there instead (kv_store_prefix_file.c): it stays as
     * a node on the file, so "leaf" means no children in the pool; one the
     * file does not take is dropped with its subtree on the file (the scan
     * then starts again: the subtree may hold `next`). */
    for (int pass = 0; pass < 2 && f < target; pass++) {
        for (kv_pfx_node_t *n = p->cold, *next; n && f < target; n = next) {
            next = n->next;
            for (kv_pfx_node_t *x = n; x && f < target;) {
                if (x->on_file || x->children > x->file_kids ||
                    (pass == 0 && !node_only_cached(s, x)))
                    break;
                kv_pfx_node_t *up = x->parent;
                if (next == x)
                    next = x->next;
                if (kv_pfx_file_demote(s, x)) {
                    /* kept on the file */
                } else if (x->children) {
                    kv_pfx_drop(s, x);
                    next = p->cold;
                } else {
                    node_evict(s, x);
                }
                p->evicted++;
                f = kv_store_pool_free(s);
                x = up;
            }
        }
    }
    uint64_t freed = f > f0 ? f - f0 : 0;
    p->evicted_pages += freed;
    return freed;
}

/* ---- stats and check ------------------------------------------------------------ */

void kv_store_prefix_stats(const kv_store_t *s, kv_stats_t *out)
{
    const kv_pfx_t *p = s->pfx;
    if (!p)
        return;
    out->meta_bytes += p->bytes;
    out->prefix_nodes = p->n_nodes;
    out->prefix_pages = p->n_refs;
    for (const kv_pfx_node_t *n = p->cold; n; n = n->next)
        for (uint32_t i = 0; !n->on_file && i < n->n_ents; i++)
            out->prefix_pages_only += kv_alloc_refcount(s->pool, n->ents[i].id) == 1;
    out->prefix_hits = p->hits;
    out->prefix_misses = p->misses;
    out->prefix_tokens_reused = p->reused;
    out->prefix_published = p->published;
    out->prefix_evicted = p->evicted;
    out->prefix_evicted_pages = p->evicted_pages;
    out->prefix_ctx_nodes = p->ctx_nodes;
    out->prefix_ctx_published = p->ctx_published;
    out->prefix_ctx_hits = p->ctx_hits;
    out->prefix_ctx_misses = p->ctx_misses;
    out->prefix_snapshots = p->n_acc;
    out->prefix_snapshot_bytes = p->acc_bytes;
    out->prefix_remote_hits = p->r_hits;
    out->prefix_remote_tokens = p->r_tokens;
    out->prefix_remote_bad = p->r_bad;
    out->prefix_remote_errors = p->r_errors;
    out->prefix_remote_bytes_in = p->r_bytes_in;
    out->prefix_remote_put = p->r_put;
    out->prefix_remote_dropped = p->r_dropped;
    out->prefix_remote_unauth = p->r_unauth;
    kv_pfx_sec_stats(s, out);
    kv_pfx_file_stats(s, out);
}

#define PFX_FAIL(...)                                                   \
    do {                                                                \
        fprintf(stderr, "kv_store_check (prefix): " __VA_ARGS__);       \
        fputc('\n', stderr);                                            \
        rc = KV_ECORRUPT;                                               \
        goto out;                                                       \
    } while (0)

int kv_store_prefix_check(const kv_store_t *s)
{
    const kv_pfx_t *p = s->pfx;
    if (!p)
        return kv_page_table_check(s->pt);
    const uint32_t L = s->cfg.n_layers * s->cfg.n_kv_heads;
    size_t ext_n = p->n_refs ? p->n_refs : 1;
    kv_page_ent_t *ext = kv_mem_alloc(ext_n * sizeof *ext);
    if (!ext)
        return KV_ENOMEM;
    int rc = 0;
    uint64_t nodes = 0, refs = 0, bytes = sizeof *p + p->model_len + p->url_bytes + p->sec_bytes +
                                          p->rstr_bytes[0] + p->rstr_bytes[1] +
                                          p->rstr_bytes[2] +
                                          (uint64_t)p->n_buckets * sizeof *p->buckets;
    uint64_t acc_n = 0, acc_b = 0, ctx = 0;
    for (const kv_pfx_node_t *n = p->cold; n; n = n->next, nodes++) {
        if (nodes >= p->n_nodes || (n->next ? n->next->prev != n : p->hot != n))
            PFX_FAIL("LRU list broken at node %llu", (unsigned long long)nodes);
        if (kv_pfx_lookup(p, &n->key) != n)
            PFX_FAIL("node [%u, %u) not found by its key", n->start, n->end);
        if (n->start >= n->end || (n->parent ? n->parent->end != n->start : n->start != 0))
            PFX_FAIL("node [%u, %u): parent ends at %u", n->start, n->end,
                     n->parent ? n->parent->end : 0);
        if (n->pol && (n->parent || n->children || n->on_file || n->copy || n->acc))
            PFX_FAIL("context node [0, %u): a parent, children, a copy or a snapshot", n->end);
        ctx += n->pol != NULL;
        uint32_t kids = 0, fkids = 0;
        for (const kv_pfx_node_t *c = p->cold; c; c = c->next) {
            kids += c->parent == n;
            fkids += c->parent == n && c->on_file;
        }
        if (kids != n->children || fkids != n->file_kids)
            PFX_FAIL("node [%u, %u): %u/%u children counted, %u/%u recorded", n->start,
                     n->end, kids, fkids, n->children, n->file_kids);
        if (n->off[0] != 0 || n->off[L] != n->n_ents)
            PFX_FAIL("node [%u, %u): entry offsets", n->start, n->end);
        uint64_t all = 0; /* a context node's lists: as compressed, n_pos in all */
        for (uint32_t li = 0; li < L; li++) {
            uint64_t t = 0;
            for (uint32_t e = n->off[li]; e < n->off[li + 1]; e++)
                t += n->ents[e].n_tokens;
            all += t;
            if (n->off[li + 1] < n->off[li] || (!n->pol && t != n->end - n->start))
                PFX_FAIL("node [%u, %u) list %u: %llu tokens", n->start, n->end, li,
                         (unsigned long long)t);
        }
        if (n->pol && all != n->n_pos)
            PFX_FAIL("context node [0, %u): %llu tokens, %u positions", n->end,
                     (unsigned long long)all, n->n_pos);
        if (kv_pfx_acc_check(s, n))
            PFX_FAIL("node [%u, %u): statistics snapshot of %zu bytes", n->start, n->end,
                     n->acc_bytes);
        bytes += n->bytes + n->acc_bytes;
        acc_n += n->acc != NULL;
        acc_b += n->acc_bytes;
        if (n->on_file)
            continue; /* no pool reference (kv_pfx_file_check) */
        if (refs + n->n_ents > p->n_refs)
            PFX_FAIL("more node entries than the %llu recorded",
                     (unsigned long long)p->n_refs);
        memcpy(ext + refs, n->ents, (size_t)n->n_ents * sizeof *ext);
        refs += n->n_ents;
    }
    if (nodes != p->n_nodes || refs != p->n_refs || bytes != p->bytes)
        PFX_FAIL("nodes %llu/%llu, refs %llu/%llu, bytes %llu/%llu",
                 (unsigned long long)nodes, (unsigned long long)p->n_nodes,
                 (unsigned long long)refs, (unsigned long long)p->n_refs,
                 (unsigned long long)bytes, (unsigned long long)p->bytes);
    if (ctx != p->ctx_nodes)
        PFX_FAIL("context nodes %llu/%llu", (unsigned long long)ctx,
                 (unsigned long long)p->ctx_nodes);
    if (acc_n != p->n_acc || acc_b != p->acc_bytes)
        PFX_FAIL("snapshots %llu/%llu, %llu/%llu bytes", (unsigned long long)acc_n,
                 (unsigned long long)p->n_acc, (unsigned long long)acc_b,
                 (unsigned long long)p->acc_bytes);
    rc = kv_page_table_check_ext(s->pt, ext, refs);
    if (rc == 0)
        rc = kv_pfx_file_check(s);
out:
    kv_mem_free(ext, ext_n * sizeof *ext);
    return rc;
}

/* ---- fingerprint and hashing ------------------------------------------------------ */


static uint32_t gcd_u32(uint32_t a, uint32_t b)
{
    while (b) {
        uint32_t t = a % b;
        a = b;
        b = t;
    }
    return a;
}

static uint32_t lcm_u32(uint32_t a, uint32_t b)
{
    uint64_t l = (uint64_t)a / gcd_u32(a, b) * b;
    return l > (1u << 30) ? (1u << 30) : (uint32_t)l;
}

/* kv_store_prefix_int.h */
int kv_pfx_hasher(kv_store_t *s, kv_seq_id_t seq, const uint8_t *targets, const void *salt,
                  size_t salt_len, kv_prefix_hasher_t **out, pfx_rule_t *rule)
{
    const uint32_t NL = s->cfg.n_layers, B = kv_store_fp16_tpp(s);
    const size_t cap = 96 + NL + 4096;
    char *st = kv_mem_alloc(cap);
    if (!st)
        return KV_ENOMEM;
    int at = snprintf(st, cap, "kvpage-prefix/1 q=%u r=%u fmt=", s->cfg.n_q_heads,
                      s->cfg.residual);
    memset(rule, 0, sizeof *rule);
    rule->step = B;
    for (uint32_t l = 0; l < NL; l++) {
        uint32_t t = targets ? targets[l] : kv_page_list_get(s->pt, seq, l, 0)->target;
        st[at++] = (char)('0' + t);
        if (t != KV_FMT_FP16) /* KIVI: multiples of R, full INT pages */
            rule->step = lcm_u32(lcm_u32(rule->step, s->cfg.residual),
                                 kv_format_get(t)->tokens_per_page(kv_page_table_geom(s->pt)));
    }
    at += snprintf(st + at, cap - (size_t)at, " pol=");
    const kv_pol_seq_t *ps = kv_pol_get(s, seq);
    if (ps) {
        if (kv_policy_describe(&ps->pol, st + at, cap - (size_t)at))
            st[at] = '?'; /* never: specs are far shorter */
        at += (int)strlen(st + at);
        rule->off = ps->pol.sel == KV_POL_SEL_EATTN && ps->pol.window == 0;
        rule->acc = kv_pfx_acc_rule(s, seq);
        if (ps->pol.sel == KV_POL_SEL_SNAPKV || ps->pol.sel == KV_POL_SEL_EATTN)
            rule->window = ps->pol.window;
        if (ps->pol.sim && ps->pol.sim_mode == KV_POL_SIM_PREFILL && ps->pol.sim_rows > rule->window)
            rule->window = ps->pol.sim_rows;
    } else {
        st[at++] = '-';
    }
    kv_prefix_fp_t fp = {
        .model = s->pfx->model,
        .model_len = s->pfx->model_len,
        .n_layers = NL,
        .n_kv_heads = s->cfg.n_kv_heads,
        .head_dim = s->cfg.head_dim,
        .page_bytes = s->cfg.page_bytes,
        .block_tokens = B,
        .state = st,
        .state_len = (size_t)at,
        .salt = salt,
        .salt_len = salt_len,
    };
    int rc = kv_prefix_hash_create(&fp, out);
    kv_mem_free(st, cap);
    return rc;
}

/* kv_store_prefix_int.h */
int kv_pfx_call_begin(kv_store_t *s, kv_seq_id_t seq, const int32_t *tokens, uint32_t n,
                      const void *salt, size_t salt_len, const uint8_t *targets,
                      pfx_rule_t *rule, kv_prefix_hash_t **h, uint32_t *nb, size_t *h_bytes,
                      kv_prefix_hash_t *end)
{
    *h = NULL;
    *nb = 0;
    *h_bytes = 0;
    if (!s || (n && !tokens) || (salt_len && !salt))
        return KV_EINVAL;
    if (salt_len > PFX_MAX_SALT)
        return KV_EINVAL;
    if (!s->pfx)
        return KV_ENOTSUP;
    if (!kv_page_seq_live(s->pt, seq))
        return KV_ENOENT;
    kv_prefix_hasher_t *hs;
    int rc = kv_pfx_hasher(s, seq, targets, salt, salt_len, &hs, rule);
    if (rc)
        return rc;
    const uint32_t B = kv_prefix_hash_block_tokens(hs);
    uint32_t blocks = n / B;
    if (blocks) {
        *h_bytes = (size_t)blocks * sizeof **h;
        *h = kv_mem_alloc(*h_bytes);
        if (!*h)
            rc = KV_ENOMEM;
        else if ((rc = kv_prefix_hash_blocks(hs, NULL, (const uint32_t *)tokens,
                                             (size_t)blocks * B, *h, blocks)) >= 0)
            rc = 0;
        if (rc) {
            kv_mem_free(*h, *h_bytes);
            *h = NULL;
            *h_bytes = 0;
            blocks = 0;
        }
    }
    if (rc == 0 && end && (rc = kv_prefix_hash_end(hs, blocks ? &(*h)[blocks - 1] : NULL,
                                                   (const uint32_t *)tokens + blocks * B,
                                                   n - blocks * B, end))) {
        kv_mem_free(*h, *h_bytes);
        *h = NULL;
        *h_bytes = 0;
        blocks = 0;
    }
    kv_prefix_hash_destroy(hs);
    *nb = blocks;
    return rc;
}

/* ---- match -------------------------------------------------------------------------- */

int kv_seq_prefix_match(kv_store_t *s, kv_seq_id_t seq, const int32_t *tokens, uint32_t n,
                        const void *salt, size_t salt_len, uint32_t *matched)
{
    if (!matched)
        return KV_EINVAL;
    if (s && s->pfx && kv_page_seq_live(s->pt, seq)) {
        const uint32_t L = s->cfg.n_layers * s->cfg.n_kv_heads;
        for (uint32_t li = 0; li < L; li++)
            if (kv_page_list_get(s->pt, seq, li / s->cfg.n_kv_heads,
                                 li % s->cfg.n_kv_heads)->n_tokens)
                return KV_ESTATE;
    }
    pfx_rule_t rule;
    kv_prefix_hash_t *h;
    uint32_t nb;
    size_t hb;
    /* at most n - 1 tokens, and the policy's window left to the engine */
    uint32_t cap = n ? n - 1 : 0;
    int rc = kv_pfx_call_begin(s, seq, tokens, n, salt, salt_len, NULL, &rule, &h, &nb, &hb, NULL);
    if (rc)
        return rc;
    kv_pfx_t *p = s->pfx;
    const uint32_t B = kv_store_fp16_tpp(s);
    if (rule.window)
        cap = n > rule.window ? (n - rule.window < cap ? n - rule.window : cap) : 0;
    if (rule.off)
        cap = 0;
    /* the chain: nodes accepted in order */
    uint32_t got = 0, n_chain = 0, ents = 0;
    kv_pfx_node_t *last = NULL;
    for (uint32_t j = 0; j < nb && (j + 1) * B <= cap; j++) {
        kv_pfx_node_t *x = kv_pfx_lookup(p, &h[j]);
        if (x && x->start == got && x->end == (j + 1) * B && x->parent == last) {
            got = x->end;
            last = x;
            n_chain++;
            ents += x->n_ents;
        }
    }
    if (p->f_nodes) /* the file tier: its nodes on the chain read back */
        kv_pfx_file_load(s, &got, &last);
    if (rule.acc) { /* the chain ends at its last node with a snapshot */
        while (last && !last->acc)
            last = last->parent;
        got = last ? last->end : 0;
    }
    if (p->remote && !rule.acc && got + rule.step <= cap) { /* the remote tier, after the host */
        const uint32_t H = s->cfg.n_kv_heads, L0 = s->cfg.n_layers * H;
        uint8_t *tg = kv_mem_alloc(L0);
        if (tg) {
            for (uint32_t li = 0; li < L0; li++)
                tg[li] = (uint8_t)kv_page_list_get(s->pt, seq, li / H, li % H)->target;
            const uint32_t got0 = got;
            kv_pfx_remote_fetch(s, h, nb, cap, rule.step, tg, &got, &last);
            kv_mem_free(tg, L0);
            p->r_tokens += got - got0;
        }
    }
    n_chain = ents = 0; /* the tiers may have cut or grown it */
    for (const kv_pfx_node_t *x = last; x; x = x->parent)
        n_chain++, ents += x->n_ents;
    kv_mem_free(h, hb);
    *matched = 0;
    if (!n_chain) {
        p->misses++;
        return 0;
    }
    /* the lists of [0, got): per list, the chain's entries root first */
    const uint32_t L = s->cfg.n_layers * s->cfg.n_kv_heads;
    size_t bytes = (size_t)ents * sizeof(kv_page_ent_t) + (size_t)L * sizeof(uint32_t) +
                   (size_t)n_chain * sizeof(kv_pfx_node_t *);
    void *mem = kv_mem_alloc(bytes);
    if (!mem)
        return KV_ENOMEM;
    kv_pfx_node_t **chain = mem; /* pointers first: every part aligned */
    kv_page_ent_t *flat = (kv_page_ent_t *)(chain + n_chain);
    uint32_t *cnt = (uint32_t *)(flat + ents);
    uint32_t k = n_chain;
    for (kv_pfx_node_t *x = last; x; x = x->parent)
        chain[--k] = x;
    size_t at = 0;
    for (uint32_t li = 0; li < L; li++) {
        cnt[li] = 0;
        for (uint32_t c = 0; c < n_chain; c++) {
            const kv_pfx_node_t *x = chain[c];
            uint32_t m = x->off[li + 1] - x->off[li];
            memcpy(flat + at, x->ents + x->off[li], (size_t)m * sizeof *flat);
            at += m;
            cnt[li] += m;
        }
    }
    float **staged = NULL; /* the snapshot, staged before anything changes */
    if (rule.acc && (rc = kv_pfx_acc_stage(s, seq, last, &staged))) {
        kv_mem_free(mem, bytes);
        return rc;
    }
    rc = kv_page_seq_attach(s->pt, seq, flat, cnt, NULL, NULL);
    if (rc == 0 && staged)
        kv_pfx_acc_commit(s, seq, staged, got);
    else if (staged)
        kv_pfx_acc_unstage(s, seq, staged, got);
    if (rc == 0) {
        for (uint32_t c = 0; c < n_chain; c++)
            kv_pfx_touch(p, chain[c]);
        p->hits++;
        p->reused += got;
        *matched = got;
        kv_store_touch(s, seq);
    }
    kv_mem_free(mem, bytes);
    return rc;
}

/* ---- publish ------------------------------------------------------------------------ */

/* good[j] = 1 where boundary (j+1)*B may end a node for every list of seq
 * (the file comment), for j < nb; positions checked up to n. */
static void boundaries(const kv_store_t *s, kv_seq_id_t seq, uint32_t nb, uint32_t step,
                       uint8_t *good, uint8_t *ends)
{
    const uint32_t B = kv_store_fp16_tpp(s);
    for (uint32_t j = 0; j < nb; j++)
        good[j] = ((uint64_t)(j + 1) * B) % step == 0;
    for (uint32_t layer = 0; layer < s->cfg.n_layers; layer++)
        for (uint32_t hd = 0; hd < s->cfg.n_kv_heads; hd++) {
            const kv_page_list_t *l = kv_page_list_get(s->pt, seq, layer, hd);
            const uint32_t fmt = l->target;
            const uint32_t tpp = kv_format_get(fmt)->tokens_per_page(kv_page_table_geom(s->pt));
            memset(ends, 0, nb);
            uint32_t at = 0;
            for (uint32_t e = 0; e < l->n_ents && at < (uint64_t)nb * B; e++) {
                const kv_page_ent_t *en = &l->ents[e];
                if (en->flags || en->format != fmt || en->n_tokens != tpp)
                    break;
                uint32_t t = 0;
                while (l->pos && t < tpp && l->pos[at + t] == (int32_t)(at + t))
                    t++;
                if (l->pos && t < tpp)
                    break;
                at += tpp;
                if (at % B == 0 && at / B <= nb)
                    ends[at / B - 1] = 1;
            }
            for (uint32_t j = 0; j < nb; j++)
                good[j] &= ends[j];
        }
}

/* A new node for [a, b) of seq's lists (full pages from token 0). */
static kv_pfx_node_t *node_new(const kv_store_t *s, kv_seq_id_t seq, uint32_t a, uint32_t b)
{
    const uint32_t H = s->cfg.n_kv_heads, L = s->cfg.n_layers * H;
    uint32_t n_ents = 0;
    for (uint32_t li = 0; li < L; li++) {
        const kv_page_list_t *l = kv_page_list_get(s->pt, seq, li / H, li % H);
        const uint32_t tpp = l->ents[0].n_tokens; /* full pages */
        n_ents += b / tpp - a / tpp;
    }
    kv_pfx_node_t *x = kv_pfx_node_alloc(L, n_ents, 0);
    if (!x)
        return NULL;
    x->start = a;
    x->end = b;
    uint32_t at = 0;
    for (uint32_t li = 0; li < L; li++) {
        const kv_page_list_t *l = kv_page_list_get(s->pt, seq, li / H, li % H);
        const uint32_t tpp = l->ents[0].n_tokens;
        x->off[li] = at;
        for (uint32_t e = a / tpp; e < b / tpp; e++)
            x->ents[at++] = l->ents[e];
    }
    x->off[L] = at;
    return x;
}

int kv_seq_prefix_publish(kv_store_t *s, kv_seq_id_t seq, const int32_t *tokens, uint32_t n,
                          const void *salt, size_t salt_len)
{
    if (s && s->pfx && kv_page_seq_live(s->pt, seq))
        for (uint32_t l = 0; l < s->cfg.n_layers; l++)
            for (uint32_t hd = 0; hd < s->cfg.n_kv_heads; hd++)
                if (kv_page_list_get(s->pt, seq, l, hd)->n_tokens < n)
                    return KV_ERANGE;
    pfx_rule_t rule;
    kv_prefix_hash_t *h;
    uint32_t nb;
    size_t hb;
    int rc = kv_pfx_call_begin(s, seq, tokens, n, salt, salt_len, NULL, &rule, &h, &nb, &hb, NULL);
    if (rc)
        return rc;
    if (rule.off || nb == 0) {
        kv_mem_free(h, hb);
        return 0;
    }
    kv_pfx_t *p = s->pfx;
    const uint32_t B = kv_store_fp16_tpp(s);
    size_t sb = (size_t)nb * (2 + sizeof(kv_pfx_node_t *));
    uint8_t *scr = kv_mem_alloc(sb);
    if (!scr) {
        kv_mem_free(h, hb);
        return KV_ENOMEM;
    }
    uint8_t *good = scr, *ends = scr + nb;
    uint8_t *made = scr + 2 * (size_t)nb; /* [nb] node pointers, unaligned: memcpy */
    boundaries(s, seq, nb, rule.step, good, ends);
    uint32_t n_made = 0, covered = 0;
    kv_pfx_node_t *prev = NULL;
    /* ACC policies: a statistics snapshot for the node ending where the
     * prefill is now (kv_store_prefix_acc.c), given to a new node before it
     * is linked or to a cached one that has none after all succeeded */
    const uint32_t snap_b = rule.acc ? kv_pfx_acc_at(s, seq, nb * B) : 0;
    kv_pfx_node_t *snap_to = NULL;
    float *snap = NULL;
    size_t snap_bytes = 0;
    for (uint32_t j = 0; j < nb && rc == 0; j++) {
        const uint32_t b = (j + 1) * B;
        kv_pfx_node_t *x = kv_pfx_lookup(p, &h[j]);
        if (x && x->end == b && x->start == covered) {
            if (b == snap_b && !x->acc) {
                if (!(snap = kv_pfx_acc_take(s, seq, b, &snap_bytes)))
                    rc = KV_ENOMEM;
                snap_to = x;
            }
            prev = x;
            covered = b;
            continue;
        }
        if (x || !good[j])
            continue;
        if (!(x = node_new(s, seq, covered, b))) {
            rc = KV_ENOMEM;
            break;
        }
        if (b == snap_b) {
            if (!(snap = kv_pfx_acc_take(s, seq, b, &snap_bytes))) {
                kv_mem_free(x, x->bytes);
                rc = KV_ENOMEM;
                break;
            }
            kv_pfx_acc_give(p, x, snap, snap_bytes, 0);
        }
        x->key = h[j];
        x->parent = prev;
        memcpy(made + sizeof x * n_made++, &x, sizeof x);
        prev = x;
        covered = b;
    }
    if (rc == 0)
        rc = kv_pfx_reserve(p, n_made);
    for (uint32_t i = 0; i < n_made; i++) {
        kv_pfx_node_t *x;
        memcpy(&x, made + sizeof x * i, sizeof x);
        if (rc) { /* all or nothing: nothing was linked */
            kv_mem_free(x->acc, x->acc_bytes);
            kv_mem_free(x, x->bytes);
            continue;
        }
        kv_pfx_link(s, x, 1);
        p->published++;
        if (!rule.acc) /* never fetched under ACC policies (no snapshot there) */
            kv_pfx_remote_put(s, x); /* non-blocking (remote tier) */
    }
    if (snap_to && rc == 0)
        kv_pfx_acc_give(p, snap_to, snap, snap_bytes, 1);
    else if (snap_to)
        kv_mem_free(snap, snap_bytes);
    kv_mem_free(scr, sb);
    kv_mem_free(h, hb);
    return rc ? rc : (int)covered;
}
