/* SPDX-License-Identifier: MIT */
/*
 * test_store_offload_pressure.c — the memory-pressure ladder's offload step
 * (kvpage.h, "memory pressure"; store/kv_store_pressure.c) and the offload
 * tier seen by every mutating call (KV_OFFLOAD_WAIT).
 *
 * Store: test_store_offload_util.h's shape (4 layers, 2 kv heads, 16 FP16
 * tokens per page); a sequence of 64 tokens per list holds 32 pages.
 *
 * Checks:
 *   - LRU rescue: a full pool (cold C, D, A; attention makes A recent) and
 *     pressure "offload": an append on hot B succeeds after exactly C went
 *     to the page file (32 pages, counters: runs, rescued, pages freed,
 *     pressure_offloaded_pages, pages_out); a bigger one takes D next and
 *     leaves A; after kv_seq_prefetch + kv_seq_wait both are bit-exact;
 *   - a full page file (-ENOSPC for every sequence): "offload" alone gives
 *     KV_ENOMEM with nothing changed; "offload,int4" falls through to int4,
 *     which converts the coldest resident sequence;
 *   - injected allocation failures (kv_fault_arm N = 1..) through the
 *     offload step: KV_ENOMEM or success, kv_store_check passes, B changed
 *     only on success, every cold sequence comes back bit-exact, no byte
 *     leaked;
 *   - the hooked calls kv_seq_quantize, kv_seq_merge_layers,
 *     kv_seq_prefill_end (StreamingLLM + INT4) and kv_seq_step_end
 *     (MiniCache merging new tokens) on the least recently used sequence,
 *     in a full pool: KV_ENOMEM without a ladder; with one, rescued by the
 *     offload step, which pages out the next coldest (never the call's
 *     own); their effect checked;
 *   - KV_OFFLOAD_WAIT: those calls and kv_seq_set_format on an offloaded
 *     sequence page it in and give exactly what they give on a resident
 *     twin; without WAIT they return KV_ENOTRES and it stays on the file;
 *   - a WAIT page-in the pool cannot take runs the ladder: kv_append on an
 *     offloaded sequence pages out the coldest others to come back;
 *   - pressure_reserve with "offload": the reserve is kept by paging out,
 *     with no page ever refused (the watermark made automatic);
 *   - config: offload must come first; keys refused; with a page file the
 *     full ladder is accepted.
 * Prints the pages each scenario's offload step freed.
 */
#include "test_store_offload_util.h"

enum { TOK = 64, PAGES = KVS_LISTS * (TOK / 16) }; /* 32 pages per sequence */

static kv_store_t *open_st(const kvt_dir_t *d, char *path, const char *ladder,
                           uint32_t reserve, uint32_t slots, uint64_t pages,
                           uint32_t flags)
{
    kvt_path(d, "press.kvp", path);
    kv_config_t c = kvs_config(path, flags, slots, pages);
    c.pressure = ladder;
    c.pressure_reserve = reserve;
    kv_store_t *st = NULL;
    int rc = kv_store_create(&c, &st);
    CHECK_OK(rc);
    if (rc)
        exit(1);
    return st;
}

static void close_st(kv_store_t *st, const char *path)
{
    CHECK_OK(kv_store_check(st));
    kv_store_destroy(st);
    CHECK_OK(kv_offload_unlink(path));
}

/* n tokens of reproducible data on one layer. */
static int app(kv_store_t *st, kv_seq_id_t q, uint32_t layer, uint32_t n, uint64_t seed)
{
    size_t ne = (size_t)n * KVS_KVH * KVS_D;
    float *k = malloc(sizeof(float) * ne), *v = malloc(sizeof(float) * ne);
    uint64_t s = seed;
    for (size_t i = 0; i < ne; i++) {
        k[i] = kv_test_randf(&s) * 2.0f;
        v[i] = kv_test_randf(&s);
    }
    int rc = kv_append(st, q, layer, n, KV_DTYPE_F32, k, v, NULL);
    free(k);
    free(v);
    return rc;
}

static kv_seq_id_t make(kv_store_t *st, uint64_t seed)
{
    kv_seq_id_t q = 0;
    CHECK_OK(kv_seq_create(st, &q));
    CHECK_OK(kvs_fill(st, q, TOK, seed, KVS_FP16));
    return q;
}

/* Read seq back (prefetch + wait) and compare it with ref. */
static int back_exact(kv_store_t *st, kv_seq_id_t q, const kv_test_seq_t *ref)
{
    kv_test_seq_t now;
    memset(&now, 0, sizeof now);
    int rc = kv_seq_prefetch(st, q);
    if (!rc)
        rc = kv_seq_wait(st, q);
    if (!rc)
        rc = kv_test_seq_take(st, q, &now);
    int ok = rc == 0 && kv_test_seq_same(ref, &now) && kvs_res(st, q).on_file == 0;
    kv_test_seq_free(&now);
    return ok;
}

static void report(const char *what, kv_store_t *st)
{
    kv_stats_t s = kvs_stats(st);
    printf("  %-38s runs %llu rescued %llu offloaded %llu pages (pool pages freed "
           "%llu, pages_out %llu), converted %llu, free now %llu\n",
           what, (unsigned long long)s.pressure_runs,
           (unsigned long long)s.pressure_rescued,
           (unsigned long long)s.pressure_offloaded_pages,
           (unsigned long long)s.pressure_pages_freed, (unsigned long long)s.pages_out,
           (unsigned long long)s.pressure_converted_tokens,
           (unsigned long long)s.pages_free);
}

/* ---- LRU rescue ------------------------------------------------------------ */

static void test_lru(const kvt_dir_t *d)
{
    char p[4096];
    kv_store_t *st = open_st(d, p, "offload", 0, 256, 4 * PAGES, 0);
    kv_seq_id_t a = make(st, 1), c = make(st, 2), dd = make(st, 3), b = make(st, 4);
    kv_test_seq_t sa, sc, sd;
    CHECK_OK(kv_test_seq_take(st, a, &sa));
    CHECK_OK(kv_test_seq_take(st, c, &sc));
    CHECK_OK(kv_test_seq_take(st, dd, &sd));
    float out[KVS_ATTN_N];
    CHECK_OK(kvs_attn(st, a, out)); /* A used last: C, D, B, A */
    CHECK_EQ(kvs_stats(st).pages_free, 0);

    CHECK_OK(app(st, b, 0, 16, 40)); /* 2 pages: C goes */
    kv_stats_t s = kvs_stats(st);
    CHECK_EQ(kvs_res(st, c).on_file, PAGES);
    CHECK_EQ(kvs_res(st, dd).on_file, 0);
    CHECK_EQ(kvs_res(st, a).on_file, 0);
    CHECK_EQ(s.pressure_runs, 1);
    CHECK_EQ(s.pressure_rescued, 1);
    CHECK_EQ(s.pressure_offloaded_pages, PAGES);
    CHECK_EQ(s.pressure_pages_freed, PAGES);
    CHECK_EQ(s.pages_out, PAGES);
    CHECK_EQ(s.pages_free, PAGES - 2);
    CHECK_EQ(s.pressure_converted_tokens + s.pressure_evicted_tokens, 0);
    CHECK_OK(kv_store_check(st));
    report("offload, 0 free, needs 2:", st);

    CHECK_OK(app(st, b, 1, 480, 41)); /* 60 pages, 30 free: D next, not A */
    s = kvs_stats(st);
    CHECK_EQ(kvs_res(st, dd).on_file, PAGES);
    CHECK_EQ(kvs_res(st, a).on_file, 0);
    CHECK_EQ(s.pressure_runs, 2);
    CHECK_EQ(s.pressure_rescued, 2);
    CHECK_EQ(s.pressure_offloaded_pages, 2 * PAGES);
    CHECK_EQ(s.pages_free, 2);
    uint32_t n;
    CHECK_OK(kv_seq_len(st, b, 1, 1, &n));
    CHECK_EQ(n, TOK + 480);
    CHECK_OK(kv_store_check(st));
    report("offload, 30 free, needs 60:", st);

    CHECK_OK(kv_seq_free(st, b)); /* room to read them back */
    CHECK(back_exact(st, c, &sc));
    CHECK(back_exact(st, dd, &sd));
    CHECK(back_exact(st, a, &sa));
    kv_test_seq_free(&sa), kv_test_seq_free(&sc), kv_test_seq_free(&sd);
    close_st(st, p);
}

/* ---- a full page file ------------------------------------------------------ */

static void test_enospc(const kvt_dir_t *d)
{
    for (int with_int4 = 0; with_int4 < 2; with_int4++) {
        char p[4096];
        /* 40 slots: X takes 32, no other sequence fits; int4 needs 2 free
         * pages (one per kv head) to start a conversion */
        kv_store_t *st = open_st(d, p, with_int4 ? "offload,int4" : "offload", 0, 40,
                                 4 * PAGES + 2 * (uint64_t)with_int4, 0);
        kv_seq_id_t x = make(st, 1), c = make(st, 2), dd = make(st, 3), b = make(st, 4);
        CHECK_OK(kv_seq_offload(st, x));
        CHECK_OK(kv_seq_wait(st, x));
        CHECK_OK(app(st, b, 0, 256, 50)); /* fills what X left: 32 pages */
        CHECK_EQ(kvs_stats(st).pages_free, 2 * (uint64_t)with_int4);
        kv_test_seq_t sc, sd, sb, nc, nd, nb;
        CHECK_OK(kv_test_seq_take(st, c, &sc));
        CHECK_OK(kv_test_seq_take(st, dd, &sd));
        CHECK_OK(kv_test_seq_take(st, b, &sb));
        int rc = app(st, b, 1, 48, 51); /* 6 pages */
        kv_stats_t s = kvs_stats(st);
        CHECK_OK(kv_test_seq_take(st, c, &nc));
        CHECK_OK(kv_test_seq_take(st, dd, &nd));
        CHECK_OK(kv_test_seq_take(st, b, &nb));
        CHECK_EQ(s.pressure_runs, 1);
        CHECK_EQ(s.pressure_offloaded_pages, 0);
        CHECK_EQ(s.pages_on_file, PAGES); /* X only */
        CHECK_EQ(s.offload_slots_used, PAGES);
        CHECK(kv_test_seq_same(&sd, &nd)); /* C is colder and enough */
        if (!with_int4) {
            CHECK_EQ(rc, KV_ENOMEM);
            CHECK(kv_test_seq_same(&sc, &nc) && kv_test_seq_same(&sb, &nb));
            CHECK_EQ(s.pages_free, 0);
        } else {
            CHECK_OK(rc);
            CHECK(s.pressure_converted_tokens > 0);
            CHECK(!kv_test_seq_same(&sc, &nc)); /* converted: within INT4's bound */
            CHECK_EQ(kv_page_list_get(st->pt, c, 0, 0)->target, KV_FMT_INT4);
            CHECK_EQ(nb.l[1 * KVS_KVH].n, TOK + 48);
            report("offload,int4 on a full file:", st);
        }
        kv_test_seq_free(&sc), kv_test_seq_free(&sd), kv_test_seq_free(&sb);
        kv_test_seq_free(&nc), kv_test_seq_free(&nd), kv_test_seq_free(&nb);
        close_st(st, p);
    }
}

/* ---- allocation failures through the offload step ------------------------- */

static void test_faults(const kvt_dir_t *d)
{
    long ok_fired = 0, fail_fired = 0, offloaded = 0;
    uint64_t base = kv_mem_live_bytes();
    for (uint64_t N = 1; N < 10000; N++) {
        char p[4096];
        kv_store_t *st = open_st(d, p, "offload", 0, 256, 3 * PAGES, 0);
        kv_seq_id_t a = make(st, 1), c = make(st, 2), b = make(st, 3);
        kv_test_seq_t sa, sc, sb, nb;
        CHECK_OK(kv_test_seq_take(st, a, &sa));
        CHECK_OK(kv_test_seq_take(st, c, &sc));
        CHECK_OK(kv_test_seq_take(st, b, &sb));
        kv_fault_arm(N);
        int rc = app(st, b, 0, 16, 60);
        int fired = kv_fault_fired();
        kv_fault_arm(0);
        CHECK(rc == 0 || rc == KV_ENOMEM);
        CHECK_OK(kv_store_check(st));
        CHECK_OK(kv_test_seq_take(st, b, &nb));
        CHECK_EQ(nb.l[0].n, TOK + (rc == 0 ? 16u : 0u));
        if (rc) /* B unchanged */
            CHECK(kv_test_seq_same(&sb, &nb));
        offloaded += kvs_stats(st).pressure_offloaded_pages > 0;
        CHECK_OK(kv_seq_free(st, b)); /* room to read everything back */
        CHECK(back_exact(st, a, &sa));
        CHECK(back_exact(st, c, &sc));
        ok_fired += fired && rc == 0;
        fail_fired += fired && rc != 0;
        kv_test_seq_free(&sa), kv_test_seq_free(&sc);
        kv_test_seq_free(&sb), kv_test_seq_free(&nb);
        close_st(st, p);
        CHECK_EQ(kv_mem_live_bytes(), base);
        if (!fired) {
            CHECK_OK(rc);
            printf("  faults through the offload step: %llu allocations: %ld failed "
                   "calls, %ld absorbed, %ld runs that offloaded\n",
                   (unsigned long long)N - 1, fail_fired, ok_fired, offloaded);
            break;
        }
    }
    CHECK(ok_fired > 0 && fail_fired > 0 && offloaded > 0);
}

/* ---- the hooked calls ------------------------------------------------------------ */

/* Plain FP16 residual tokens at the end of list (layer, head) of q. */
static uint32_t residual(const kv_store_t *st, kv_seq_id_t q, uint32_t layer, uint32_t head)
{
    const kv_page_list_t *l = kv_page_list_get(st->pt, q, layer, head);
    uint32_t n = 0;
    for (uint32_t e = l->n_ents; e > 0; e--) {
        if (l->ents[e - 1].format != KV_FMT_FP16 || l->ents[e - 1].flags)
            break;
        n += l->ents[e - 1].n_tokens;
    }
    return n;
}

/* Pages of format fmt in list (layer, head) of q. */
static uint32_t n_fmt(const kv_store_t *st, kv_seq_id_t q, uint32_t layer, uint32_t head,
                      uint32_t fmt)
{
    const kv_page_list_t *l = kv_page_list_get(st->pt, q, layer, head);
    uint32_t n = 0;
    for (uint32_t e = 0; e < l->n_ents; e++)
        n += l->ents[e].format == fmt;
    return n;
}

static int all_layers(kv_store_t *st, kv_seq_id_t q, uint64_t seed)
{
    int rc = 0;
    for (uint32_t l = 0; l < KVS_LAYERS && !rc; l++)
        rc = app(st, q, l, TOK, seed + (l == 3 ? 2 : l)); /* layer 3 = layer 2 */
    return rc;
}

typedef struct hook {
    const char *name;
    const char *policy; /* or NULL */
    int takes_pages;    /* 1: fails in a full pool without a ladder */
    int (*prep)(kv_store_t *st, kv_seq_id_t q, uint64_t seed);
    int (*call)(kv_store_t *st, kv_seq_id_t q);
    int (*done)(const kv_store_t *st, kv_seq_id_t q); /* the call's effect */
} hook_t;

static int prep_plain(kv_store_t *st, kv_seq_id_t q, uint64_t seed)
{
    return all_layers(st, q, seed);
}

static int prep_int4(kv_store_t *st, kv_seq_id_t q, uint64_t seed)
{
    int rc = all_layers(st, q, seed);
    return rc ? rc : kv_seq_set_format(st, q, 0, KV_FMT_INT4);
}

/* MiniCache (pair 2, 3): prefill end merges the prompt, then 16 decode
 * tokens with step ends; the 16th step's end (the call) merges them. */
static int prep_mc(kv_store_t *st, kv_seq_id_t q, uint64_t seed)
{
    int rc = all_layers(st, q, seed);
    if (!rc)
        rc = kv_seq_prefill_end(st, q);
    for (uint32_t t = 0; t < 16 && !rc; t++) {
        for (uint32_t l = 0; l < KVS_LAYERS && !rc; l++)
            rc = app(st, q, l, 1, seed + 100 + t * 4 + (l == 3 ? 2 : l));
        if (!rc && t < 15)
            rc = kv_seq_step_end(st, q);
    }
    return rc ? rc : residual(st, q, 3, 0) == 16 ? 0 : KV_ESTATE;
}

static int call_set_format(kv_store_t *st, kv_seq_id_t q)
{
    return kv_seq_set_format(st, q, 1, KV_FMT_INT2);
}

static int call_quantize(kv_store_t *st, kv_seq_id_t q)
{
    return kv_seq_quantize(st, q, 0, 0);
}

static int call_merge(kv_store_t *st, kv_seq_id_t q)
{
    return kv_seq_merge_layers(st, q, 3, NULL);
}

static int done_set_format(const kv_store_t *st, kv_seq_id_t q)
{
    return kv_page_list_get(st->pt, q, 1, 0)->target == KV_FMT_INT2;
}

static int done_int4_l0(const kv_store_t *st, kv_seq_id_t q)
{
    return n_fmt(st, q, 0, 0, KV_FMT_INT4) > 0 && n_fmt(st, q, 0, 1, KV_FMT_INT4) > 0;
}

static int done_merged(const kv_store_t *st, kv_seq_id_t q)
{
    return n_fmt(st, q, 3, 0, KV_FMT_MERGED) > 0 && residual(st, q, 3, 0) == 0 &&
           residual(st, q, 2, 1) == 0;
}

static int done_prefill(const kv_store_t *st, kv_seq_id_t q)
{
    int ok = 1;
    for (uint32_t l = 0; l < KVS_LAYERS; l++)
        ok &= n_fmt(st, q, l, 0, KV_FMT_INT4) > 0 && residual(st, q, l, 1) == 0;
    return ok;
}

static const hook_t hooks[] = {
    {"kv_seq_set_format", NULL, 0, prep_plain, call_set_format, done_set_format},
    {"kv_seq_quantize", NULL, 1, prep_int4, call_quantize, done_int4_l0},
    {"kv_seq_merge_layers", NULL, 1, prep_plain, call_merge, done_merged},
    {"kv_seq_prefill_end", "streamingllm:sink=4,recent=1000+int4:r=32", 1, prep_plain,
     kv_seq_prefill_end, done_prefill},
    {"kv_seq_step_end", "minicache:from=0.5,every=16", 1, prep_mc, kv_seq_step_end,
     done_merged},
};
#define N_HOOKS (sizeof hooks / sizeof hooks[0])

static kv_seq_id_t hook_seq(kv_store_t *st, const hook_t *h, uint64_t seed)
{
    kv_seq_id_t q = 0;
    CHECK_OK(kv_seq_create(st, &q));
    if (h->policy) {
        kv_policy_t *pol = NULL;
        char err[256];
        CHECK_OK(kv_policy_parse(h->policy, &pol, err, sizeof err));
        CHECK_OK(kv_seq_set_policy(st, q, pol));
        kv_policy_destroy(pol);
    }
    CHECK_OK(h->prep(st, q, seed));
    return q;
}

/* A full pool: the call on hot B fails without a ladder and is rescued by
 * the offload step (cold A goes) with one. */
static void test_hooked(const kvt_dir_t *d)
{
    for (size_t i = 0; i < N_HOOKS; i++) {
        const hook_t *h = &hooks[i];
        if (!h->takes_pages)
            continue;
        for (int on = 0; on < 2; on++) {
            char p[4096];
            kv_store_t *st = open_st(d, p, on ? "offload" : NULL, 0, 256, 5 * PAGES, 0);
            /* B (the call's) the coldest, then A, then F filling the pool */
            kv_seq_id_t b = hook_seq(st, h, 7), a = make(st, 1), f = 0;
            CHECK_OK(kv_seq_create(st, &f));
            for (uint64_t t = 0; kvs_stats(st).pages_free >= 2; t++)
                CHECK_OK(app(st, f, (uint32_t)(t % KVS_LAYERS), 16, 90 + t));
            kv_test_seq_t sa, sb, nb;
            CHECK_OK(kv_test_seq_take(st, a, &sa));
            CHECK_OK(kv_test_seq_take(st, b, &sb));
            int rc = h->call(st, b);
            kv_stats_t s = kvs_stats(st);
            if (!on) {
                if (rc != KV_ENOMEM)
                    fprintf(stderr, "  %s in a full pool: %d\n", h->name, rc);
                CHECK_EQ(rc, KV_ENOMEM); /* the call needs pages */
                CHECK_EQ(s.pressure_runs, 0);
            } else {
                CHECK_OK(rc);
                CHECK(h->done(st, b));
                CHECK_OK(kv_test_seq_take(st, b, &nb));
                CHECK(!kv_test_seq_same(&sb, &nb)); /* converted or merged */
                kv_test_seq_free(&nb);
                CHECK_EQ(kvs_res(st, a).on_file, PAGES);
                CHECK_EQ(kvs_res(st, f).on_file, 0);
                CHECK_EQ(kvs_res(st, b).on_file, 0); /* never the call's own */
                CHECK_EQ(s.pressure_runs, 1);
                CHECK_EQ(s.pressure_rescued, 1);
                CHECK_EQ(s.pressure_offloaded_pages, PAGES);
                char what[64];
                snprintf(what, sizeof what, "%s, full pool:", h->name);
                report(what, st);
                CHECK_OK(kv_seq_free(st, f)); /* room to read A back */
                CHECK(back_exact(st, a, &sa));
            }
            kv_test_seq_free(&sa), kv_test_seq_free(&sb);
            close_st(st, p);
        }
    }
}

/* ---- KV_OFFLOAD_WAIT for those calls ------------------------------------------ */

static void test_wait(const kvt_dir_t *d)
{
    for (size_t i = 0; i < N_HOOKS; i++) {
        const hook_t *h = &hooks[i];
        for (int wait = 0; wait < 2; wait++) {
            char p[4096];
            kv_store_t *st = open_st(d, p, NULL, 0, 256, 6 * PAGES,
                                     wait ? KV_OFFLOAD_WAIT : 0);
            kv_seq_id_t t = hook_seq(st, h, 11), o = hook_seq(st, h, 11); /* twins */
            CHECK_OK(kv_seq_offload(st, o));
            CHECK_OK(kv_seq_wait(st, o));
            uint64_t on_file = kvs_res(st, o).on_file;
            CHECK(on_file > 0);
            kv_test_seq_t st0, so;
            CHECK_OK(kv_test_seq_take(st, t, &st0));
            int rc = h->call(st, o);
            if (!wait) {
                CHECK_EQ(rc, KV_ENOTRES);
                CHECK_EQ(kvs_res(st, o).on_file, on_file);
                CHECK(back_exact(st, o, &st0)); /* nothing changed */
            } else {
                if (rc)
                    fprintf(stderr, "  %s with WAIT: %d\n", h->name, rc);
                CHECK_OK(rc);
                CHECK_EQ(kvs_res(st, o).on_file, 0);
                CHECK_OK(h->call(st, t));
                CHECK(h->done(st, o));
                kv_test_seq_t stt;
                CHECK_OK(kv_test_seq_take(st, t, &stt));
                CHECK_OK(kv_test_seq_take(st, o, &so));
                CHECK(kv_test_seq_same(&stt, &so)); /* as on the resident twin */
                kv_test_seq_free(&stt), kv_test_seq_free(&so);
            }
            kv_test_seq_free(&st0);
            close_st(st, p);
        }
    }
}

/* A WAIT page-in the pool cannot take: the ladder pages out C, then D for
 * the append itself. */
static void test_wait_pagein(const kvt_dir_t *d)
{
    char p[4096];
    kv_store_t *st = open_st(d, p, "offload", 0, 256, 3 * PAGES, KV_OFFLOAD_WAIT);
    kv_seq_id_t a = make(st, 1), c = make(st, 2), dd = make(st, 3);
    kv_test_seq_t sa, na;
    CHECK_OK(kv_test_seq_take(st, a, &sa));
    CHECK_OK(kv_seq_offload(st, a));
    CHECK_OK(kv_seq_wait(st, a));
    kv_seq_id_t e = make(st, 4); /* the pool is full again */
    CHECK_EQ(kvs_stats(st).pages_free, 0);
    CHECK_OK(app(st, a, 0, 16, 70));
    kv_stats_t s = kvs_stats(st);
    CHECK_EQ(kvs_res(st, a).on_file, 0);
    CHECK_EQ(kvs_res(st, c).on_file, PAGES); /* for the page-in */
    CHECK_EQ(kvs_res(st, dd).on_file, PAGES); /* for the append's 2 pages */
    CHECK_EQ(kvs_res(st, e).on_file, 0);
    CHECK_EQ(s.pressure_runs, 2);
    CHECK_EQ(s.pressure_rescued, 2);
    CHECK_EQ(s.pressure_offloaded_pages, 2 * PAGES);
    CHECK_OK(kv_test_seq_take(st, a, &na));
    int ok = na.l[0].n == TOK + 16 && na.l[1].n == TOK + 16 && na.l[KVS_KVH].n == TOK;
    for (uint32_t i = 0; i < KVS_LISTS && ok; i++) /* the old tokens exact */
        ok = !memcmp(sa.l[i].k, na.l[i].k, sizeof(float) * TOK * KVS_D) &&
             !memcmp(sa.l[i].v, na.l[i].v, sizeof(float) * TOK * KVS_D) &&
             !memcmp(sa.l[i].pos, na.l[i].pos, sizeof(int32_t) * TOK);
    CHECK(ok);
    report("WAIT page-in, full pool:", st);
    kv_test_seq_free(&sa), kv_test_seq_free(&na);
    close_st(st, p);
}

/* ---- the reserve ------------------------------------------------------------------ */

static void test_reserve(const kvt_dir_t *d)
{
    char p[4096];
    kv_store_t *st = open_st(d, p, "offload", 40, 256, 5 * PAGES, 0);
    kv_seq_id_t a = make(st, 1), c = make(st, 2), dd = make(st, 3), b = 0;
    CHECK_EQ(kvs_stats(st).pressure_runs, 0); /* 64 free >= 40 */
    CHECK_OK(kv_seq_create(st, &b));
    CHECK_OK(app(st, b, 0, 256, 80)); /* 32 pages: 32 free < 40 */
    kv_stats_t s = kvs_stats(st);
    CHECK_EQ(s.alloc_failures, 0);
    CHECK_EQ(s.pressure_runs, 1);
    CHECK_EQ(s.pressure_rescued, 0);
    CHECK_EQ(s.pressure_offloaded_pages, PAGES);
    CHECK_EQ(s.pages_free, 2 * PAGES);
    CHECK_EQ(kvs_res(st, a).on_file, PAGES);
    CHECK_EQ(kvs_res(st, c).on_file + kvs_res(st, dd).on_file, 0);
    report("reserve 40, 32 free after an append:", st);
    close_st(st, p);
}

/* ---- config ------------------------------------------------------------------------- */

static void test_config(const kvt_dir_t *d)
{
    static const struct {
        const char *spec;
        int rc;
    } cases[] = {
        {"offload", 0},
        {"offload,int4,int2,evict:sink=4,recent=256", 0},
        {"offload,evict", 0},
        {"int4,offload", KV_EINVAL},
        {"evict,offload", KV_EINVAL},
        {"offload,offload", KV_EINVAL},
        {"offload:sink=4", KV_EINVAL},
        {"offload,sink=4", KV_EINVAL},
        {"Offload", KV_EINVAL},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char p[4096];
        kvt_path(d, "cfg.kvp", p);
        kv_config_t c = kvs_config(p, 0, 64, 64);
        c.pressure = cases[i].spec;
        kv_store_t *st = NULL;
        int rc = kv_store_create(&c, &st);
        if (rc != cases[i].rc)
            fprintf(stderr, "  pressure \"%s\": %d, expected %d\n", cases[i].spec, rc,
                    cases[i].rc);
        CHECK_EQ(rc, cases[i].rc);
        CHECK(rc ? st == NULL : st != NULL);
        if (st) {
            kv_store_destroy(st);
            CHECK_OK(kv_offload_unlink(p));
        }
    }
}

int main(void)
{
    kvt_dir_t d;
    kvt_dir_make(&d);
    uint64_t live0 = kv_mem_live_bytes();
    test_config(&d);
    test_lru(&d);
    test_enospc(&d);
    test_hooked(&d);
    test_wait(&d);
    test_wait_pagein(&d);
    test_reserve(&d);
    test_faults(&d);
    CHECK_EQ(kv_mem_live_bytes(), live0);
    kvt_dir_remove(&d);
    return kv_test_end();
}
