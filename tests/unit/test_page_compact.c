/* SPDX-License-Identifier: MIT */
/*
 * test_page_compact.c — compaction of page lists: keep all / none / every
 * other / first / last, on exclusive and shared (forked) lists; kept tokens
 * and positions read back in order, the result is packed densely, pages that
 * empty go back to the pool, pages shared with another sequence are never
 * written; invalid keep arrays change nothing; injected failures in compact
 * and append change nothing; a randomized run against the reference model
 * (page_ref.h). kv_page_table_check() after every step.
 */
#include "page_ref.h"

enum { L = 1, H = 2, D = 16, T = 4, S = 4, N0 = 14 };

static int compact(fix_t *f, uint32_t s, uint32_t head, const uint32_t *keep,
                   uint32_t n_keep)
{
    int rc = kv_page_compact(f->pt, s, 0, head, keep, n_keep);
    if (rc == 0)
        ref_compact(&f->ref, s, 0, head, keep, n_keep);
    return rc;
}

static void step_ok(fix_t *f)
{
    CHECK_OK(kv_page_table_check(f->pt));
    CHECK_EQ(ref_diff(f->pt, &f->ref), 0);
    CHECK(meta_exact(f));
}

/* A new sequence holding N0 tokens (pages 4+4+4+2) per head. */
static uint32_t filled_seq(fix_t *f, uint64_t *seed)
{
    uint32_t s;
    CHECK_OK(kv_page_seq_create(f->pt, &s));
    f->ref.live[s] = 1;
    CHECK_OK(fix_append(f, seed, s, 0, N0, NULL));
    return s;
}

static void drop_seq(fix_t *f, uint32_t s)
{
    CHECK_OK(kv_page_seq_free(f->pt, s));
    ref_clear(&f->ref, s);
}

typedef struct pattern {
    const char *name;
    uint32_t n;
    uint32_t keep[N0];
    int identity_pos; /* result positions are 0..n-1 */
} pattern_t;

static const pattern_t patterns[] = {
    {"all", N0, {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13}, 1},
    {"none", 0, {0}, 1},
    {"every other", 7, {0, 2, 4, 6, 8, 10, 12}, 0},
    {"first", 1, {0}, 1},
    {"last", 1, {13}, 0},
    {"prefix 5", 5, {0, 1, 2, 3, 4}, 1},
    {"tail 6", 6, {8, 9, 10, 11, 12, 13}, 0},
};
enum { N_PAT = sizeof patterns / sizeof *patterns };

/* Exclusive list: pages written in place, emptied ones released. */
static void test_patterns_exclusive(void)
{
    fix_t f;
    fix_open(&f, L, H, D, T, S, 256);
    uint64_t seed = 1;
    for (int i = 0; i < N_PAT; i++) {
        const pattern_t *p = &patterns[i];
        long fails0 = kv_test_fail_;
        uint32_t s = filled_seq(&f, &seed);
        const kv_page_list_t *l = kv_page_list_get(f.pt, s, 0, 1);
        kv_page_id_t old0 = l->ents[0].id;
        uint64_t used = pool_used(&f);
        CHECK_OK(compact(&f, s, 1, p->keep, p->n));
        uint32_t pages = (p->n + T - 1) / T;
        l = kv_page_list_get(f.pt, s, 0, 1);
        CHECK_EQ(l->n_tokens, p->n);
        CHECK_EQ(l->n_ents, pages);
        CHECK_EQ((l->pos == NULL), p->identity_pos);
        /* 4 pages before; in place: no page taken, emptied ones freed. */
        CHECK_EQ(pool_used(&f), used - (4 - pages));
        if (pages)
            CHECK_EQ(l->ents[0].id, old0);
        /* Head 0 is untouched. */
        CHECK_EQ(kv_page_list_get(f.pt, s, 0, 0)->n_tokens, N0);
        step_ok(&f);
        if (kv_test_fail_ != fails0)
            fprintf(stderr, "  pattern %s (exclusive)\n", p->name);
        /* Appends continue after the last kept position. */
        CHECK_OK(fix_append(&f, &seed, s, 0, 3, NULL));
        int32_t last = p->n ? (int32_t)p->keep[p->n - 1] : -1;
        CHECK_EQ(kv_page_list_pos(kv_page_list_get(f.pt, s, 0, 1), p->n + 2),
                 last + 3);
        step_ok(&f);
        drop_seq(&f, s);
    }
    CHECK_EQ(pool_used(&f), 0);
    fix_close(&f);
}

/* Shared list (child of a fork): the parent's data is intact; pages the
 * child keeps unchanged stay shared, the rest are fresh. */
static void test_patterns_shared(void)
{
    fix_t f;
    fix_open(&f, L, H, D, T, S, 256);
    uint64_t seed = 2;
    for (int i = 0; i < N_PAT; i++) {
        const pattern_t *p = &patterns[i];
        for (int side = 0; side < 2; side++) { /* compact child, then parent */
            long fails0 = kv_test_fail_;
            uint32_t a = filled_seq(&f, &seed), b;
            CHECK_OK(kv_page_seq_fork(f.pt, a, &b));
            ref_fork(&f.ref, a, b);
            uint32_t s = side ? a : b;
            uint64_t used = pool_used(&f);
            CHECK_OK(compact(&f, s, 0, p->keep, p->n));
            uint32_t pages = (p->n + T - 1) / T;
            /* Prefix patterns keep the shared pages; others copy. */
            uint32_t fresh = p->identity_pos ? 0 : pages;
            CHECK_EQ(pool_used(&f), used + fresh);
            const kv_page_list_t *l = kv_page_list_get(f.pt, s, 0, 0);
            for (uint32_t e = 0; e < l->n_ents; e++)
                CHECK_EQ(kv_alloc_refcount(f.pool, l->ents[e].id),
                         p->identity_pos ? 2 : 1);
            step_ok(&f);
            /* The compacted side appends: a kept shared partial tail is
             * copied, never written. */
            CHECK_OK(fix_append(&f, &seed, s, 0, 2, NULL));
            step_ok(&f);
            if (kv_test_fail_ != fails0)
                fprintf(stderr, "  pattern %s (shared, side %d)\n", p->name,
                        side);
            drop_seq(&f, a);
            step_ok(&f);
            drop_seq(&f, b);
        }
    }
    CHECK_EQ(pool_used(&f), 0);
    fix_close(&f);
}

/* Repeated compaction of a list with materialized positions, and a list
 * whose pages are partly shared (the shared prefix with an exclusive tail). */
static void test_mixed(void)
{
    fix_t f;
    fix_open(&f, L, H, D, T, S, 256);
    uint64_t seed = 3;
    uint32_t a = filled_seq(&f, &seed), b;
    CHECK_OK(kv_page_seq_fork(f.pt, a, &b));
    ref_fork(&f.ref, a, b);
    CHECK_OK(fix_append(&f, &seed, b, 0, 10, NULL)); /* b: 24 tokens */
    /* b's pages: 0-2 shared full, 3 copied (CoW), 4-5 exclusive. */
    uint32_t keep[] = {1, 5, 9, 12, 13, 14, 15, 16, 17, 20, 23};
    uint64_t used = pool_used(&f);
    CHECK_OK(compact(&f, b, 1, keep, 11));
    /* 3 destination pages: 0, 1, 2 were shared -> 3 fresh pages; all 6 old
     * pages of b's list are dropped: 3 exclusive ones freed. */
    CHECK_EQ(pool_used(&f), used + 3 - 3);
    step_ok(&f);
    uint32_t keep2[] = {0, 2, 3, 4, 8, 10};
    CHECK_OK(compact(&f, b, 1, keep2, 6));
    step_ok(&f);
    uint32_t keep3[] = {1, 5};
    CHECK_OK(compact(&f, b, 1, keep3, 2));
    /* positions: 1,5,9,12,13,... -> 1,9,12,13,17,23 -> 9,23 */
    CHECK_EQ(kv_page_list_pos(kv_page_list_get(f.pt, b, 0, 1), 0), 9);
    CHECK_EQ(kv_page_list_pos(kv_page_list_get(f.pt, b, 0, 1), 1), 23);
    step_ok(&f);
    /* Compacting to the identity prefix drops the position array. */
    uint32_t keep4[] = {0, 1, 2, 5};
    CHECK_OK(compact(&f, a, 0, keep4, 4));
    CHECK(kv_page_list_get(f.pt, a, 0, 0)->pos != NULL);
    step_ok(&f);
    CHECK_OK(compact(&f, a, 0, keep4, 3));
    CHECK(kv_page_list_get(f.pt, a, 0, 0)->pos == NULL);
    step_ok(&f);
    fix_close(&f);
}

static void test_invalid(void)
{
    fix_t f;
    fix_open(&f, L, H, D, T, S, 256);
    uint64_t seed = 4;
    uint32_t s = filled_seq(&f, &seed), dead;
    CHECK_OK(kv_page_seq_create(f.pt, &dead));
    CHECK_OK(kv_page_seq_free(f.pt, dead));
    snap_t a = {0}, b = {0};
    snap_take(&f, &a);
    uint32_t dup[] = {0, 3, 3, 5};
    uint32_t down[] = {0, 5, 4};
    uint32_t high[] = {0, 5, N0};
    uint32_t huge[] = {UINT32_MAX};
    uint32_t first_bad[] = {N0 + 1, 2};
    uint32_t ok[] = {1, 2};
    CHECK_EQ(kv_page_compact(f.pt, s, 0, 0, dup, 4), KV_EINVAL);
    CHECK_EQ(kv_page_compact(f.pt, s, 0, 0, down, 3), KV_EINVAL);
    CHECK_EQ(kv_page_compact(f.pt, s, 0, 0, high, 3), KV_ERANGE);
    CHECK_EQ(kv_page_compact(f.pt, s, 0, 0, huge, 1), KV_ERANGE);
    CHECK_EQ(kv_page_compact(f.pt, s, 0, 0, first_bad, 2), KV_ERANGE);
    CHECK_EQ(kv_page_compact(f.pt, s, 0, 0, NULL, 2), KV_EINVAL);
    CHECK_EQ(kv_page_compact(f.pt, s, 1, 0, ok, 2), KV_ERANGE);
    CHECK_EQ(kv_page_compact(f.pt, s, 0, H, ok, 2), KV_ERANGE);
    CHECK_EQ(kv_page_compact(f.pt, dead, 0, 0, ok, 2), KV_ENOENT);
    CHECK_EQ(kv_page_compact(f.pt, S + 3, 0, 0, ok, 2), KV_ENOENT);
    CHECK_EQ(kv_page_compact(NULL, s, 0, 0, ok, 2), KV_EINVAL);
    snap_take(&f, &b);
    CHECK(snap_same(&a, &b));
    step_ok(&f);
    /* An empty list: only n_keep == 0 is valid. */
    uint32_t e;
    CHECK_OK(kv_page_seq_create(f.pt, &e));
    f.ref.live[e] = 1;
    CHECK_EQ(kv_page_compact(f.pt, e, 0, 0, ok, 1), KV_ERANGE);
    CHECK_OK(kv_page_compact(f.pt, e, 0, 0, NULL, 0));
    step_ok(&f);
    snap_free(&a), snap_free(&b);
    fix_close(&f);
}

typedef struct compact_ctx {
    uint32_t s, head, n;
    const uint32_t *keep;
} compact_ctx_t;

static int compact_op(fix_t *f, void *ctx)
{
    compact_ctx_t *c = ctx;
    return compact(f, c->s, c->head, c->keep, c->n);
}

typedef struct append_ctx {
    uint64_t seed;
    uint32_t s, n;
} append_ctx_t;

static int append_op(fix_t *f, void *ctx)
{
    append_ctx_t *c = ctx;
    uint64_t seed = c->seed;
    return fix_append(f, &seed, c->s, 0, c->n, NULL);
}

/* Injected failures (N = 1.. until success) for compact and append. */
static void test_faults(void)
{
    fix_t f;
    fix_open(&f, L, H, D, T, S, 256);
    uint64_t seed = 5;
    uint32_t a = filled_seq(&f, &seed), b;
    CHECK_OK(kv_page_seq_fork(f.pt, a, &b));
    ref_fork(&f.ref, a, b);
    /* Shared list, non-identity result: fresh pages + position array. */
    static const uint32_t odd[] = {1, 3, 5, 7, 9, 11, 13};
    compact_ctx_t c1 = {.s = b, .head = 0, .n = 7, .keep = odd};
    CHECK(fault_sweep(&f, compact_op, &c1, 100) >= 2);
    step_ok(&f);
    /* Exclusive list, in place: only the position array can fail. */
    compact_ctx_t c2 = {.s = b, .head = 0, .n = 3, .keep = odd};
    CHECK(fault_sweep(&f, compact_op, &c2, 100) == 0); /* pos array fits */
    uint32_t a_excl = filled_seq(&f, &seed);
    compact_ctx_t c3 = {.s = a_excl, .head = 1, .n = 7, .keep = odd};
    CHECK(fault_sweep(&f, compact_op, &c3, 100) >= 1);
    step_ok(&f);
    /* Append after compaction, into a list with positions (array grows). */
    append_ctx_t ap = {.seed = 99, .s = a_excl, .n = 9};
    CHECK(fault_sweep(&f, append_op, &ap, 100) >= 2);
    step_ok(&f);
    /* Append into a shared partial tail (fork of the compacted list). */
    uint32_t c;
    CHECK_OK(kv_page_seq_fork(f.pt, a_excl, &c));
    ref_fork(&f.ref, a_excl, c);
    append_ctx_t ap2 = {.seed = 98, .s = c, .n = 1};
    CHECK(fault_sweep(&f, append_op, &ap2, 100) >= 1);
    step_ok(&f);
    fix_close(&f);
}

/* Random appends, forks, frees and compactions against the model. */
static void test_random(void)
{
    fix_t f;
    fix_open(&f, 2, H, D, 3, S, 4096);
    uint64_t rng = 42, seed = 6;
    uint32_t keep[200];
    int ops = 0;
    for (int it = 0; it < 600; it++) {
        uint32_t s = (uint32_t)(kv_test_rand(&rng) % S);
        uint32_t layer = (uint32_t)(kv_test_rand(&rng) % 2);
        uint32_t head = (uint32_t)(kv_test_rand(&rng) % H);
        int live = kv_page_seq_live(f.pt, s);
        switch (kv_test_rand(&rng) % 6) {
        case 0:
            if (!live) {
                uint32_t id;
                CHECK_OK(kv_page_seq_create(f.pt, &id));
                f.ref.live[id] = 1;
            } else if (kv_page_seq_count(f.pt) < S) {
                uint32_t id;
                CHECK_OK(kv_page_seq_fork(f.pt, s, &id));
                ref_fork(&f.ref, s, id);
            }
            break;
        case 1:
            if (live && kv_test_rand(&rng) % 3 == 0)
                drop_seq(&f, s);
            break;
        case 2:
        case 3:
            if (live && kv_page_list_get(f.pt, s, layer, 0)->n_tokens < 150)
                CHECK_OK(fix_append(&f, &seed, s, layer,
                                    1 + (uint32_t)(kv_test_rand(&rng) % 9),
                                    NULL));
            break;
        default:
            if (live) {
                const kv_page_list_t *l =
                    kv_page_list_get(f.pt, s, layer, head);
                uint32_t n = 0, pct = (uint32_t)(kv_test_rand(&rng) % 101);
                for (uint32_t i = 0; i < l->n_tokens; i++)
                    if (kv_test_rand(&rng) % 100 < pct)
                        keep[n++] = i;
                int rc = kv_page_compact(f.pt, s, layer, head, keep, n);
                CHECK_OK(rc);
                if (rc == 0)
                    ref_compact(&f.ref, s, layer, head, keep, n);
            }
            break;
        }
        ops++;
        int rc = kv_page_table_check(f.pt);
        int diff = ref_diff(f.pt, &f.ref);
        CHECK_OK(rc);
        CHECK_EQ(diff, 0);
        if (rc || diff) {
            fprintf(stderr, "  random: diverged at step %d\n", it);
            break;
        }
    }
    CHECK(meta_exact(&f));
    CHECK_EQ(ops, 600);
    fix_close(&f);
}

int main(void)
{
    test_patterns_exclusive();
    test_patterns_shared();
    test_mixed();
    test_invalid();
    test_faults();
    test_random();
    return kv_test_end();
}
