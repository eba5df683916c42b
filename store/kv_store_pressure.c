/* SPDX-License-Identifier: MIT */
/*
 * kv_store_pressure.c — the memory-pressure ladder (kvpage.h, "memory
 * pressure"): when a mutating call fails because the pool refused a page,
 * write the coldest sequences to the page file (offload), convert (FP16 ->
 * INT4 -> INT2) and finally evict the coldest sequences' lists until the
 * call's pages are free, then retry the call once.
 *
 * The prefix cache comes first (store/kv_store_prefix.c): before any step,
 * and also without a ladder (s->press then exists with no steps), a refused
 * page evicts the cache's least recently used nodes until the call's pages
 * are free; only then do the steps run (counted as a ladder run). So the
 * cache never makes KV_ENOMEM more likely for the calls under the protocol.
 *
 * Shape of a run (relieve): for each step of the ladder in order, for each
 * live sequence from the least recently used (kv_store_lru_next) but the
 * call's own, for each layer from the shortest: apply the step to that
 * (sequence, layer); stop as soon as the pool has the target number of free
 * pages. Every action is one all-or-nothing page-table call, so whatever
 * happens (a refused page, a failed metadata allocation) the store is
 * consistent; an action that fails is skipped and the run goes on.
 *
 * The offload step (first when given: lossless before lossy) works on whole
 * sequences instead, under off->lock: it first finishes the I/O in flight
 * (so pages_out counts only its own writes), then submits page-outs of the
 * coldest sequences (kv_store_off_write_seq: their resident, unshared, non-
 * MERGED pages) until the pool would have the target once they complete,
 * and waits for them (kv_store_off_settle), so the pool pages are free
 * before the retry; a write that fails leaves its page resident, and the
 * step goes on with the next sequence. A sequence the file cannot take
 * (-ENOSPC: fewer free slots than its pages) or whose batch cannot be
 * allocated is skipped; the next step then runs on what is still resident.
 *
 * Progress when few pages are free: a conversion writes its new pages before
 * it releases the old ones, so a layer converts in chunks that fit in the
 * free pages (free / n_kv_heads pages per head, plus the room left in each
 * head's last page of the target format); each chunk frees more than it
 * takes, so chunks grow. With fewer free pages than kv heads a layer cannot
 * start and the step moves on; eviction of FP16 lists compacts in place and
 * needs no page. Lists whose pages are shared (forks, merged pairs) are
 * skipped by the conversion steps and counted as not freeing anything by
 * the evict step: acting on them costs pages. Sequences under a MiniCache
 * policy are left alone: its layer pairs merge only while both layers hold
 * the same tokens, which converting or evicting one layer would break.
 * Sequences under CaM are not converted (CaM rewrites values of FP16
 * tokens of the recent window), only evicted. Sequences with pages on the
 * page file or in flight (kv_page_seq_busy: the offload tier) are skipped:
 * the page table does not mutate them.
 *
 * Calls: kv_append, kv_compact (kv_store.c), kv_seq_quantize,
 * kv_seq_merge_layers (kv_store_format.c), kv_seq_prefill_end,
 * kv_seq_step_end (kv_policy_run.c) run under the retry protocol
 * (kv_store_int.h); a call made inside another one (the policy run's
 * conversions and merges) is nested: it leaves refusals to the outer call,
 * which retries as a whole. kv_store_press_ready makes a sequence resident
 * before such a call and runs the ladder when a KV_OFFLOAD_WAIT page-in is
 * refused its pool pages.
 *
 * Parsing: the ladder's text (kvpage.h) is steps split at ',' with the
 * keys of evict checked against a key table (kv_spec.h: ranges, defaults,
 * a key at most once, messages); kv_store_pressure_check answers with the
 * codes alone, kv_pressure_check (public) with the message too.
 *
 * Invariants: s->press is NULL when the ladder and the prefix cache are
 * off; s->cfg.pressure is NULL without a ladder (lad.n_steps 0), else it
 * points to press->spec (the store's copy). Counters only
 * grow. depth counts the calls under the protocol now running (0 between
 * calls). The ladder only runs inside a mutating call, never from
 * attention.
 * Ownership: the store owns s->press and its spec copy (kv_mem, counted in
 * meta_bytes); scratch of a run is freed before it returns.
 */
#include <assert.h>
#include <stdlib.h>
#include <string.h>

#include "alloc/kv_mem.h"
#include "kv_policy_int.h"
#include "kv_spec.h"
#include "kv_store_int.h"
#include "formats/kv_format.h"

enum { PRESS_OFFLOAD = 0, PRESS_INT4 = 1, PRESS_INT2 = 2, PRESS_EVICT = 3,
       PRESS_N_STEPS = 4 };

#define PRESS_MAX_SPEC    1023u
#define PRESS_MAX_SINK    65535u
#define PRESS_MAX_RECENT  (1u << 24)
#define PRESS_BACKOFF_MAX 1024u

/* A parsed ladder. */
typedef struct press_ladder {
    uint32_t steps[PRESS_N_STEPS]; /* PRESS_* in the order they run        */
    uint32_t n_steps;
    uint32_t sink, recent;         /* evict: tokens kept at each end       */
} press_ladder_t;

typedef struct kv_press {
    press_ladder_t lad;
    char *spec;                  /* copy of cfg.pressure [spec_bytes]        */
    size_t spec_bytes;
    uint32_t reserve;            /* pages to keep free (0: on refusal only)  */
    uint32_t backoff, skip;      /* top-ups skipped after one freed nothing  */
    uint32_t depth;              /* calls under the protocol now running     */
    uint64_t runs, rescued, pages_freed, converted, evicted; /* kv_stats_t   */
    uint64_t offloaded;          /* pages the offload step wrote (kv_stats_t)*/
} kv_press_t;

static const char *const step_names[PRESS_N_STEPS] = {"offload", "int4", "int2",
                                                      "evict"};
/* the format a conversion step converts to; FP16: not a conversion */
static const uint32_t step_format[PRESS_N_STEPS] = {KV_FMT_FP16, KV_FMT_INT4,
                                                    KV_FMT_INT2, KV_FMT_FP16};

/* ---- parsing ---------------------------------------------------------------- */

/* The keys of the steps (kv_spec.h): evict's. */
static const kv_spec_key_t ladder_keys[] = {
    KV_SPEC_U(PRESS_EVICT, "sink", press_ladder_t, sink, 0, PRESS_MAX_SINK, 4),
    KV_SPEC_U(PRESS_EVICT, "recent", press_ladder_t, recent, 1, PRESS_MAX_RECENT, 256),
};
static const kv_spec_table_t ladder_table = {ladder_keys,
                                             sizeof ladder_keys / sizeof ladder_keys[0]};

/* spec (non-empty) -> *lad; 0, KV_EINVAL or KV_ERANGE with a message in err.
 * Items are comma separated: a step name, optionally followed by
 * ":key=value"; an item "key=value" continues the keys of the step before
 * it (only evict has keys). */
static int ladder_parse(const char *spec, press_ladder_t *lad, char *err, size_t err_len)
{
    memset(lad, 0, sizeof *lad);
    kv_spec_defaults(ladder_table, PRESS_EVICT, lad);
    size_t len = strlen(spec);
    if (len > PRESS_MAX_SPEC)
        return kv_spec_err(KV_EINVAL, err, err_len, "ladder longer than %u bytes",
                           PRESS_MAX_SPEC);
    uint32_t keys_of = PRESS_N_STEPS; /* the step whose keys an item may continue */
    uint64_t seen = 0;
    const char *p = spec, *end = spec + len;
    for (;;) {
        const char *comma = memchr(p, ',', (size_t)(end - p));
        const char *item_end = comma ? comma : end;
        size_t n = (size_t)(item_end - p);
        const char *colon = memchr(p, ':', n);
        size_t name_n = colon ? (size_t)(colon - p) : n;
        int rc;
        if (n == 0)
            return kv_spec_err(KV_EINVAL, err, err_len, "empty step in '%s'", spec);
        if (!colon && memchr(p, '=', n)) { /* continues the keys */
            if (keys_of == PRESS_N_STEPS)
                return kv_spec_err(KV_EINVAL, err, err_len, "'%.*s' follows no "
                                   "step:key=value", (int)n, p);
            if ((rc = kv_spec_set(ladder_table, keys_of, step_names[keys_of], p, n, lad,
                                  &seen, err, err_len)))
                return rc;
        } else {
            uint32_t step = kv_spec_lookup(step_names, PRESS_N_STEPS, p, name_n);
            if (step == PRESS_N_STEPS)
                return kv_spec_err(KV_EINVAL, err, err_len, "unknown step '%.*s' (valid, "
                                   "in this order: offload, int4, int2, evict)",
                                   (int)name_n, p);
            if (lad->n_steps && step <= lad->steps[lad->n_steps - 1])
                return kv_spec_err(KV_EINVAL, err, err_len, "step '%s' %s", step_names[step],
                                   step == lad->steps[lad->n_steps - 1]
                                       ? "given twice"
                                       : "out of order (offload, int4, int2, evict)");
            lad->steps[lad->n_steps++] = step;
            keys_of = PRESS_N_STEPS;
            if (colon) {
                if ((rc = kv_spec_set(ladder_table, step, step_names[step], colon + 1,
                                      n - name_n - 1, lad, &seen, err, err_len)))
                    return rc;
                keys_of = step;
            }
        }
        if (!comma)
            return 0;
        p = comma + 1;
    }
}

int kv_pressure_check(const char *ladder, char *err, size_t err_len)
{
    if (err && err_len)
        err[0] = '\0';
    if (!ladder || !ladder[0])
        return 0;
    press_ladder_t lad;
    return ladder_parse(ladder, &lad, err, err_len);
}

int kv_store_pressure_check(const kv_config_t *cfg)
{
    if (!cfg->pressure || !cfg->pressure[0])
        return cfg->pressure_reserve ? KV_EINVAL : 0;
    press_ladder_t lad;
    int rc = ladder_parse(cfg->pressure, &lad, NULL, 0);
    if (rc)
        return rc;
    if (cfg->pressure_reserve > cfg->host_pages)
        return KV_ERANGE;
    if (lad.steps[0] == PRESS_OFFLOAD && !cfg->offload_path)
        return KV_EINVAL; /* offload names a tier the store does not have */
    kv_page_geom_t g = {.head_dim = cfg->head_dim, .page_bytes = cfg->page_bytes};
    for (uint32_t i = 0; i < lad.n_steps; i++) {
        uint32_t f = step_format[lad.steps[i]];
        if (f != KV_FMT_FP16 && kv_format_get(f)->tokens_per_page(&g) == 0)
            return KV_ENOTSUP;
    }
    return 0;
}

int kv_store_pressure_init(kv_store_t *s)
{
    s->press = NULL;
    const int ladder = s->cfg.pressure && s->cfg.pressure[0];
    if (!ladder)
        s->cfg.pressure = NULL;
    if (!ladder && !s->pfx)
        return 0; /* nothing to run when a page is refused */
    kv_press_t *p = kv_mem_calloc(1, sizeof *p);
    size_t n = ladder ? strlen(s->cfg.pressure) + 1 : 0;
    char *spec = ladder ? kv_mem_alloc(n) : NULL;
    if (!p || (ladder && !spec)) {
        kv_mem_free(p, sizeof *p);
        kv_mem_free(spec, n);
        s->cfg.pressure = NULL;
        return KV_ENOMEM;
    }
    if (ladder) {
        memcpy(spec, s->cfg.pressure, n);
        int rc = ladder_parse(spec, &p->lad, NULL, 0);
        assert(rc == 0 && "validated by kv_store_pressure_check");
        (void)rc;
    }
    p->spec = spec;
    p->spec_bytes = n;
    p->reserve = s->cfg.pressure_reserve;
    s->press = p;
    s->cfg.pressure = spec;
    return 0;
}

void kv_store_pressure_fini(kv_store_t *s)
{
    kv_press_t *p = s->press;
    if (!p)
        return;
    kv_mem_free(p->spec, p->spec_bytes);
    kv_mem_free(p, sizeof *p);
    s->press = NULL;
    s->cfg.pressure = NULL;
}

void kv_store_pressure_stats(const kv_store_t *s, kv_stats_t *out)
{
    const kv_press_t *p = s->press;
    if (!p)
        return; /* (a store with a prefix cache and no ladder has p: all 0) */
    out->meta_bytes += sizeof *p + p->spec_bytes;
    out->pressure_runs = p->runs;
    out->pressure_rescued = p->rescued;
    out->pressure_pages_freed = p->pages_freed;
    out->pressure_converted_tokens = p->converted;
    out->pressure_evicted_tokens = p->evicted;
    out->pressure_offloaded_pages = p->offloaded;
}

/* ---- the pool ------------------------------------------------------------------ */

static uint32_t shared(const kv_store_t *s, const kv_page_ent_t *e)
{
    return kv_alloc_refcount(s->pool, e->id) > 1;
}

uint64_t kv_store_press_append_need(const kv_store_t *s, kv_seq_id_t seq,
                                    uint32_t layer, uint32_t n)
{
    const uint32_t T = kv_store_fp16_tpp(s);
    uint64_t need = 0;
    for (uint32_t h = 0; h < s->cfg.n_kv_heads; h++) {
        const kv_page_list_t *l = kv_page_list_get(s->pt, seq, layer, h);
        uint32_t fill = 0;
        if (l && l->n_ents) {
            const kv_page_ent_t *t = &l->ents[l->n_ents - 1];
            if (t->format == KV_FMT_FP16 && t->flags == 0 && t->n_tokens < T) {
                fill = T - t->n_tokens < n ? T - t->n_tokens : n;
                need += shared(s, t);
            }
        }
        need += (n - fill + T - 1) / T;
    }
    return need;
}

uint64_t kv_store_press_layer_need(const kv_store_t *s, kv_seq_id_t seq,
                                   uint32_t layer)
{
    const uint32_t T = kv_store_fp16_tpp(s);
    uint64_t need = 0;
    for (uint32_t h = 0; h < s->cfg.n_kv_heads; h++) {
        uint64_t n = kv_page_list_get(s->pt, seq, layer, h)->n_tokens;
        need += (n + T - 1) / T + 1;
    }
    return need;
}

/* ---- conversion steps -------------------------------------------------------- */

/* The target a conversion step to fmt sets: fmt, rotated if the list's
 * target is a rotated INT format (the ladder keeps a policy's rotation). */
static uint32_t rot_target(uint32_t old_target, uint32_t fmt)
{
    return fmt | (kv_page_target_format(old_target) != KV_FMT_FP16
                      ? (old_target & KV_FMT_ROT)
                      : 0u);
}

/* The FP16 residual of every kv head of (seq, layer) for a conversion to
 * fmt (tpp tokens per page): the longest (*rmax), the least room in the
 * heads' last fmt pages (*room, tokens), the total (*sum). 0 if the layer
 * may convert, 1 if it must be skipped (already converting to a smaller
 * format, or pages it would touch are shared). */
static int conv_scan(const kv_store_t *s, kv_seq_id_t seq, uint32_t layer,
                     uint32_t fmt, uint32_t tpp, uint32_t *rmax, uint32_t *room,
                     uint64_t *sum)
{
    *rmax = 0;
    *room = UINT32_MAX;
    *sum = 0;
    for (uint32_t h = 0; h < s->cfg.n_kv_heads; h++) {
        const kv_page_list_t *l = kv_page_list_get(s->pt, seq, layer, h);
        if (fmt == KV_FMT_INT4 && kv_page_target_format(l->target) == KV_FMT_INT2)
            return 1;
        uint32_t e = l->n_ents, res = 0, rm = 0;
        while (e > 0 && l->ents[e - 1].format == KV_FMT_FP16 &&
               l->ents[e - 1].flags == 0) {
            if (shared(s, &l->ents[--e]))
                return 1;
            res += l->ents[e].n_tokens;
        }
        if (e > 0 && l->ents[e - 1].format == fmt &&
            l->ents[e - 1].flags == kv_page_target_variant(rot_target(l->target, fmt)) &&
            l->ents[e - 1].n_tokens < tpp) {
            if (shared(s, &l->ents[e - 1]))
                return 1; /* the conversion would copy it first */
            rm = tpp - l->ents[e - 1].n_tokens;
        }
        *sum += res;
        if (res >= 16) {
            *rmax = res > *rmax ? res : *rmax;
            *room = rm < *room ? rm : *room;
        }
    }
    if (*room == UINT32_MAX)
        *room = 0;
    return 0;
}

/* Convert the FP16 residual of (seq, layer) to fmt, in chunks that fit in
 * the free pages, until target pages are free or nothing more converts.
 * A layer that converted nothing keeps its target format. */
static void step_convert(kv_store_t *s, kv_seq_id_t seq, uint32_t layer,
                         uint32_t fmt, uint64_t target)
{
    const uint32_t H = s->cfg.n_kv_heads;
    const uint32_t tpp = kv_format_get(fmt)->tokens_per_page(kv_page_table_geom(s->pt));
    const uint32_t old_target = kv_page_list_get(s->pt, seq, layer, 0)->target;
    const uint32_t new_target = rot_target(old_target, fmt);
    uint64_t converted = 0;
    int set = 0;
    for (;;) {
        uint64_t f = kv_store_pool_free(s), before, after;
        uint32_t rmax, room, r2, m2;
        if (f >= target || conv_scan(s, seq, layer, fmt, tpp, &rmax, &room, &before) ||
            rmax < 16)
            break;
        uint64_t c = (f / H) * tpp + room; /* per head: <= f / H fresh pages */
        c = c > rmax ? rmax : c / 16 * 16;
        if (c == 0)
            break;
        if (!set && kv_page_set_format(s->pt, seq, layer, new_target))
            break;
        set = 1;
        if (kv_page_quantize(s->pt, seq, layer, rmax - (uint32_t)c))
            break;
        (void)conv_scan(s, seq, layer, fmt, tpp, &r2, &m2, &after);
        converted += before - after;
        if (kv_store_pool_free(s) <= f)
            break; /* it took as much as it gave: no further */
    }
    if (set && converted == 0)
        (void)kv_page_set_format(s->pt, seq, layer, old_target);
    s->press->converted += converted;
}

/* ---- eviction ------------------------------------------------------------------- */

/* Keep the first sink and last recent tokens of every list of (seq, layer)
 * longer than that, where it frees pages: the compaction releases the
 * list's unshared pages and writes ceil(kept / T) pages (reusing the
 * leading FP16 ones in place; the others are fresh and must be free). */
static void step_evict(kv_store_t *s, kv_seq_id_t seq, uint32_t layer)
{
    kv_press_t *p = s->press;
    const uint32_t T = kv_store_fp16_tpp(s), n_keep = p->lad.sink + p->lad.recent;
    const uint32_t n_dst = (n_keep + T - 1) / T;
    kv_pol_seq_t *ps = kv_pol_get(s, seq);
    uint32_t *keep = NULL;
    for (uint32_t h = 0; h < s->cfg.n_kv_heads; h++) {
        const kv_page_list_t *l = kv_page_list_get(s->pt, seq, layer, h);
        const uint32_t n = l->n_tokens;
        if (n <= n_keep)
            continue;
        uint32_t excl = 0, reuse = 0, start = 0;
        for (uint32_t e = 0; e < l->n_ents; e++) {
            const kv_page_ent_t *en = &l->ents[e];
            int mine = !shared(s, en);
            excl += mine;
            reuse += mine && e < n_dst && en->format == KV_FMT_FP16 && start == e * T;
            start += en->n_tokens;
        }
        if (excl <= n_dst || n_dst - reuse > kv_store_pool_free(s))
            continue; /* frees nothing, or its fresh pages are not there */
        if (!keep && !(keep = kv_mem_alloc((size_t)n_keep * sizeof *keep)))
            return;
        for (uint32_t i = 0; i < n_keep; i++)
            keep[i] = i < p->lad.sink ? i : n - n_keep + i;
        int rc = ps ? kv_pol_keep(s, seq, ps, layer, h, keep, n_keep, 0)
                    : kv_page_compact(s->pt, seq, layer, h, keep, n_keep);
        if (rc == 0)
            p->evicted += n - n_keep;
    }
    kv_mem_free(keep, (size_t)n_keep * sizeof *keep);
}

/* ---- offload -------------------------------------------------------------------- */

/* Write whole sequences, coldest first (never hot), to the page file until
 * target pages are free; wait for the writes (see the file comment). */
static void step_offload(kv_store_t *s, kv_seq_id_t hot, uint64_t target)
{
    kv_store_off_t *o = s->off;
    pthread_mutex_lock(&o->lock);
    (void)kv_store_off_settle(s, KV_STORE_OFF_ALL, 1, 1); /* older I/O first */
    const uint64_t out0 = o->pages_out;
    uint64_t f = kv_store_pool_free(s), pending = 0, after = 0, tick;
    kv_seq_id_t seq;
    while (f < target && kv_store_lru_next(s, after, &seq, &tick) == 0) {
        after = tick;
        uint32_t n = 0;
        if (seq == hot || kv_store_off_write_seq(s, seq, &n) || n == 0)
            continue; /* -ENOSPC, KV_ENOMEM or nothing to write: the next one */
        pending += n; /* each written page frees one pool page (refcount 1) */
        if (f + pending >= target) {
            (void)kv_store_off_settle(s, KV_STORE_OFF_ALL, 1, 1);
            pending = 0;
            f = kv_store_pool_free(s); /* short if writes failed: go on */
        }
    }
    if (pending)
        (void)kv_store_off_settle(s, KV_STORE_OFF_ALL, 1, 1);
    s->press->offloaded += o->pages_out - out0;
    pthread_mutex_unlock(&o->lock);
}

/* ---- a run ---------------------------------------------------------------------- */

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* The i-th layer of seq, shortest first (tokens of kv head 0, then layer
 * index), for i = 0, 1, ... in turn: i == 0 sorts keys ([n_layers]
 * scratch); without scratch (NULL) layers go in index order. */
static uint32_t layer_at(const kv_store_t *s, kv_seq_id_t seq, uint64_t *keys,
                         uint32_t i)
{
    if (!keys)
        return i;
    if (i == 0) {
        for (uint32_t l = 0; l < s->cfg.n_layers; l++)
            keys[l] = (uint64_t)kv_page_list_get(s->pt, seq, l, 0)->n_tokens << 32 | l;
        qsort(keys, s->cfg.n_layers, sizeof *keys, cmp_u64);
    }
    return (uint32_t)keys[i];
}

/* Free pages until target are: first the prefix cache's least recently
 * used nodes (kv_store_prefix.c; never a sequence's tokens), then the
 * ladder on every live sequence but hot. Returns the pages freed. */
static uint64_t relieve(kv_store_t *s, kv_seq_id_t hot, uint64_t target)
{
    kv_press_t *p = s->press;
    const uint64_t c0 = kv_store_pool_free(s);
    if (c0 >= target)
        return 0;
    const uint64_t cached = kv_store_prefix_evict(s, target);
    const uint64_t f0 = kv_store_pool_free(s);
    uint64_t f = f0;
    if (f >= target || p->lad.n_steps == 0)
        return cached + (f > f0 ? f - f0 : 0);
    p->runs++;
    const size_t keys_n = (size_t)s->cfg.n_layers * sizeof(uint64_t);
    uint64_t *keys = kv_mem_alloc(keys_n); /* NULL: layer order */
    for (uint32_t st = 0; st < p->lad.n_steps && f < target; st++) {
        const uint32_t step = p->lad.steps[st];
        uint64_t after = 0, tick;
        kv_seq_id_t seq;
        if (step == PRESS_OFFLOAD) {
            step_offload(s, hot, target);
            f = kv_store_pool_free(s);
            continue;
        }
        while (f < target && kv_store_lru_next(s, after, &seq, &tick) == 0) {
            after = tick;
            const kv_pol_seq_t *ps = kv_pol_get(s, seq);
            if (seq == hot || (ps && ps->pol.mc) ||
                (ps && ps->pol.cam && step != PRESS_EVICT) ||
                kv_page_seq_busy(s->pt, seq))
                continue; /* see the file comment */
            for (uint32_t i = 0; i < s->cfg.n_layers && f < target; i++) {
                uint32_t layer = layer_at(s, seq, keys, i);
                if (step == PRESS_EVICT)
                    step_evict(s, seq, layer);
                else
                    step_convert(s, seq, layer, step_format[step], target);
                f = kv_store_pool_free(s);
            }
        }
    }
    kv_mem_free(keys, keys_n);
    uint64_t freed = f > f0 ? f - f0 : 0;
    p->pages_freed += freed;
    return cached + freed;
}

/* After a successful call: free pages up to the reserve (best effort). A
 * top-up that frees nothing makes the next ones wait 1, 2, 4, ... calls. */
static void top_up(kv_store_t *s, kv_seq_id_t hot)
{
    kv_press_t *p = s->press;
    if (!p->reserve)
        return;
    if (p->skip) {
        p->skip--;
        return;
    }
    if (kv_store_pool_free(s) >= p->reserve)
        return;
    if (relieve(s, hot, p->reserve)) {
        p->backoff = 0;
    } else {
        p->backoff = p->backoff ? p->backoff * 2 : 1;
        p->backoff = p->backoff > PRESS_BACKOFF_MAX ? PRESS_BACKOFF_MAX : p->backoff;
        p->skip = p->backoff;
    }
}

/* ---- the call protocol ---------------------------------------------------------- */

/* The pool's refused allocations so far. */
static uint64_t pool_refused(const kv_store_t *s)
{
    kv_alloc_stats_t as;
    kv_alloc_stats(s->pool, &as);
    return as.failed;
}

void kv_store_press_begin(kv_store_t *s, kv_store_press_call_t *pc,
                          kv_seq_id_t hot, uint64_t need)
{
    pc->hot = hot;
    pc->need = need;
    pc->retried = 0;
    pc->nested = 0;
    pc->failed0 = 0;
    if (s->press) {
        pc->nested = s->press->depth > 0;
        s->press->depth++;
        pc->failed0 = pool_refused(s);
    }
}

int kv_store_press_retry(kv_store_t *s, kv_store_press_call_t *pc, int rc)
{
    kv_press_t *p = s->press;
    if (!p)
        return 0;
    if (rc == KV_ENOMEM && !pc->retried && !pc->nested &&
        pool_refused(s) != pc->failed0) { /* else a metadata allocation failed */
        pc->retried = 1;
        if (relieve(s, pc->hot, pc->need) > 0)
            return 1;
    }
    assert(p->depth > 0);
    p->depth--;
    if (rc == 0 && !pc->nested) {
        p->rescued += (uint64_t)pc->retried;
        top_up(s, pc->hot);
    }
    return 0;
}

int kv_store_press_ready(kv_store_t *s, kv_seq_id_t seq)
{
    kv_press_t *p = s->press;
    if (!p || !s->off || p->depth)
        return kv_store_off_ready(s, seq); /* no ladder, no file, or nested */
    const uint64_t failed0 = pool_refused(s);
    int rc = kv_store_off_ready(s, seq);
    if (rc != KV_ENOMEM || pool_refused(s) == failed0)
        return rc; /* done, another error, or a metadata allocation failed */
    if (relieve(s, seq, s->off->seqs[seq].on_file) == 0)
        return rc;
    rc = kv_store_off_ready(s, seq);
    p->rescued += rc == 0;
    return rc;
}
