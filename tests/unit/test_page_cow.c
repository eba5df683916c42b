/* SPDX-License-Identifier: MIT */
/*
 * test_page_cow.c — fork and copy-on-write in the page table: a fork shares
 * every page (refcount 2, no new page), an append to a shared partly filled
 * tail copies exactly that page, full shared pages stay shared, the other
 * sequence never changes, nested forks, freeing in any order returns every
 * page; fork and CoW-append under injected allocation failures change
 * nothing. kv_page_table_check() after every step; a reference model
 * (page_ref.h) holds what every list must read back.
 */
#include "page_ref.h"

enum { L = 2, H = 2, D = 16, T = 4, S = 6 };

/* Refcount of entry e of (s, layer, head). */
static uint32_t ent_ref(const fix_t *f, uint32_t s, uint32_t layer,
                        uint32_t head, uint32_t e)
{
    const kv_page_list_t *l = kv_page_list_get(f->pt, s, layer, head);
    return l && e < l->n_ents ? kv_alloc_refcount(f->pool, l->ents[e].id) : 0;
}

static kv_page_id_t ent_id(const fix_t *f, uint32_t s, uint32_t layer,
                           uint32_t head, uint32_t e)
{
    const kv_page_list_t *l = kv_page_list_get(f->pt, s, layer, head);
    return l && e < l->n_ents ? l->ents[e].id : KV_PAGE_ID_INVALID;
}

static void step_ok(fix_t *f)
{
    CHECK_OK(kv_page_table_check(f->pt));
    CHECK_EQ(ref_diff(f->pt, &f->ref), 0);
    CHECK(meta_exact(f));
}

static void test_fork_cow(void)
{
    fix_t f;
    fix_open(&f, L, H, D, T, S, 256);
    uint64_t seed = 1;
    uint32_t p, c, g;
    CHECK_OK(kv_page_seq_create(f.pt, &p));
    f.ref.live[p] = 1;
    CHECK_OK(fix_append(&f, &seed, p, 0, 6, NULL)); /* 4 + 2: partial tail */
    CHECK_OK(fix_append(&f, &seed, p, 1, 8, NULL)); /* 4 + 4: full tail */
    step_ok(&f);
    uint64_t used0 = pool_used(&f);
    CHECK_EQ(used0, 4 * H);
    kv_page_totals_t t0, t1;
    kv_page_table_totals(f.pt, &t0);

    /* Fork: same pages, refcount 2, nothing allocated. */
    CHECK_OK(kv_page_seq_fork(f.pt, p, &c));
    ref_fork(&f.ref, p, c);
    CHECK(c != p);
    CHECK_EQ(pool_used(&f), used0);
    kv_page_table_totals(f.pt, &t1);
    CHECK_EQ(t1.tokens, 2 * t0.tokens);
    CHECK_EQ(t1.pages_by_format[KV_FMT_FP16], t0.pages_by_format[KV_FMT_FP16]);
    for (uint32_t l = 0; l < L; l++)
        for (uint32_t h = 0; h < H; h++)
            for (uint32_t e = 0; e < 2; e++) {
                CHECK_EQ(ent_id(&f, c, l, h, e), ent_id(&f, p, l, h, e));
                CHECK_EQ(ent_ref(&f, c, l, h, e), 2);
            }
    step_ok(&f);

    /* Child appends 1 token at layer 0: only the shared partial tail is
     * copied (one page per head); the full first page stays shared. */
    kv_page_id_t ptail = ent_id(&f, p, 0, 0, 1);
    CHECK_OK(fix_append(&f, &seed, c, 0, 1, NULL));
    CHECK_EQ(pool_used(&f), used0 + H);
    for (uint32_t h = 0; h < H; h++) {
        CHECK(ent_id(&f, c, 0, h, 1) != ent_id(&f, p, 0, h, 1));
        CHECK_EQ(ent_ref(&f, c, 0, h, 1), 1);
        CHECK_EQ(ent_ref(&f, p, 0, h, 1), 1);
        CHECK_EQ(ent_ref(&f, c, 0, h, 0), 2);
        CHECK_EQ(ent_id(&f, c, 0, h, 0), ent_id(&f, p, 0, h, 0));
    }
    CHECK_EQ(ent_id(&f, p, 0, 0, 1), ptail); /* parent untouched */
    step_ok(&f);

    /* Child appends at layer 1 (full shared tails): one new page per head,
     * nothing copied, the shared pages stay shared. */
    CHECK_OK(fix_append(&f, &seed, c, 1, 3, NULL));
    CHECK_EQ(pool_used(&f), used0 + 2 * H);
    for (uint32_t h = 0; h < H; h++) {
        CHECK_EQ(ent_ref(&f, c, 1, h, 0), 2);
        CHECK_EQ(ent_ref(&f, c, 1, h, 1), 2);
        CHECK_EQ(ent_ref(&f, c, 1, h, 2), 1);
    }
    step_ok(&f);

    /* Parent appends at layer 0: its tail is now exclusive, filled in place. */
    CHECK_OK(fix_append(&f, &seed, p, 0, 2, NULL));
    CHECK_EQ(ent_id(&f, p, 0, 0, 1), ptail);
    CHECK_EQ(pool_used(&f), used0 + 2 * H);
    step_ok(&f);

    /* Nested fork; the grandchild's CoW append spans the copy and a fresh
     * page (tail 3/4 shared with c: copy + 1 token, then 4 + 1 more). */
    CHECK_OK(kv_page_seq_fork(f.pt, c, &g));
    ref_fork(&f.ref, c, g);
    CHECK_EQ(ent_ref(&f, g, 0, 1, 0), 3); /* p, c, g */
    CHECK_EQ(ent_ref(&f, g, 0, 1, 1), 2); /* c, g */
    uint64_t used1 = pool_used(&f);
    CHECK_OK(fix_append(&f, &seed, g, 0, 6, NULL));
    CHECK_EQ(pool_used(&f), used1 + 3 * H);
    CHECK_EQ(ent_ref(&f, c, 0, 1, 1), 1);
    CHECK_EQ(ent_ref(&f, g, 0, 1, 0), 3);
    step_ok(&f);

    /* Explicit positions are copied by a fork (and its metadata counted). */
    int32_t pos[2] = {500, 600};
    CHECK_OK(fix_append(&f, &seed, g, 1, 2, pos));
    uint32_t gg;
    CHECK_OK(kv_page_seq_fork(f.pt, g, &gg));
    ref_fork(&f.ref, g, gg);
    CHECK(kv_page_list_get(f.pt, gg, 1, 0)->pos != NULL);
    CHECK(kv_page_list_get(f.pt, gg, 1, 0)->pos !=
          kv_page_list_get(f.pt, g, 1, 0)->pos);
    CHECK_OK(fix_append(&f, &seed, gg, 1, 1, NULL)); /* continues at 601 */
    CHECK_EQ(kv_page_list_pos(kv_page_list_get(f.pt, gg, 1, 1), 13), 601);
    step_ok(&f);

    /* Errors. */
    uint32_t x;
    CHECK_EQ(kv_page_seq_fork(f.pt, S, &x), KV_ENOENT);
    CHECK_EQ(kv_page_seq_fork(f.pt, p, NULL), KV_EINVAL);
    uint32_t dead;
    CHECK_OK(kv_page_seq_create(f.pt, &dead));
    CHECK_OK(kv_page_seq_free(f.pt, dead));
    CHECK_EQ(kv_page_seq_fork(f.pt, dead, &x), KV_ENOENT);
    uint32_t fill1, fill2;
    CHECK_OK(kv_page_seq_fork(f.pt, p, &fill1));
    ref_fork(&f.ref, p, fill1);
    CHECK_OK(kv_page_seq_fork(f.pt, p, &fill2));
    ref_fork(&f.ref, p, fill2);
    CHECK_EQ(kv_page_seq_count(f.pt), S);
    uint64_t used2 = pool_used(&f);
    CHECK_EQ(kv_page_seq_fork(f.pt, p, &x), KV_ELIMIT);
    CHECK_EQ(pool_used(&f), used2);
    step_ok(&f);

    /* Free the parent first: only pages it alone held go back. */
    uint64_t before = pool_used(&f);
    CHECK_OK(kv_page_seq_free(f.pt, fill1));
    ref_clear(&f.ref, fill1);
    CHECK_OK(kv_page_seq_free(f.pt, fill2));
    ref_clear(&f.ref, fill2);
    CHECK_EQ(pool_used(&f), before); /* all their pages are p's too */
    CHECK_OK(kv_page_seq_free(f.pt, p));
    ref_clear(&f.ref, p);
    CHECK_EQ(pool_used(&f), before - H); /* p's exclusive layer-0 tails */
    step_ok(&f);
    CHECK_OK(kv_page_seq_free(f.pt, c));
    ref_clear(&f.ref, c);
    step_ok(&f);
    CHECK_OK(kv_page_seq_free(f.pt, gg));
    ref_clear(&f.ref, gg);
    step_ok(&f);
    CHECK_OK(kv_page_seq_free(f.pt, g));
    ref_clear(&f.ref, g);
    CHECK_EQ(pool_used(&f), 0);
    kv_page_totals_t t2;
    kv_page_table_totals(f.pt, &t2);
    CHECK_EQ(t2.tokens, 0);
    CHECK_EQ(t2.pages_by_format[KV_FMT_FP16], 0);
    step_ok(&f);
    fix_close(&f);
}

/* Forking an empty sequence and a sequence with empty lists. */
static void test_fork_empty(void)
{
    fix_t f;
    fix_open(&f, L, H, D, T, S, 16);
    uint64_t seed = 4;
    uint32_t p, c;
    CHECK_OK(kv_page_seq_create(f.pt, &p));
    f.ref.live[p] = 1;
    CHECK_OK(kv_page_seq_fork(f.pt, p, &c));
    ref_fork(&f.ref, p, c);
    step_ok(&f);
    CHECK_OK(fix_append(&f, &seed, c, 1, 5, NULL));
    CHECK_EQ(kv_page_list_get(f.pt, p, 1, 0)->n_tokens, 0);
    step_ok(&f);
    fix_close(&f);
}

typedef struct fork_ctx {
    uint32_t parent;
} fork_ctx_t;

static int fork_op(fix_t *f, void *ctx)
{
    fork_ctx_t *c = ctx;
    uint32_t child;
    int rc = kv_page_seq_fork(f->pt, c->parent, &child);
    if (rc == 0)
        ref_fork(&f->ref, c->parent, child);
    return rc;
}

typedef struct append_ctx {
    uint64_t seed;
    uint32_t s, layer, n;
} append_ctx_t;

static int append_op(fix_t *f, void *ctx)
{
    append_ctx_t *c = ctx;
    uint64_t seed = c->seed; /* the same data on every try */
    return fix_append(f, &seed, c->s, c->layer, c->n, NULL);
}

/* Injected failures: fork and CoW append fail cleanly at every point. */
static void test_faults(void)
{
    fix_t f;
    fix_open(&f, L, H, D, T, S, 256);
    uint64_t seed = 2;
    uint32_t p;
    CHECK_OK(kv_page_seq_create(f.pt, &p));
    f.ref.live[p] = 1;
    int32_t pos[5] = {10, 20, 30, 40, 50};
    CHECK_OK(fix_append(&f, &seed, p, 0, 5, pos)); /* pos arrays */
    CHECK_OK(fix_append(&f, &seed, p, 1, 7, NULL));
    step_ok(&f);
    /* A fork allocates the list array, then ents (and pos) per list:
     * 1 + L*H + H (layer 0 has positions) = 7 points of failure. */
    fork_ctx_t fc = {.parent = p};
    int fails = fault_sweep(&f, fork_op, &fc, 100);
    CHECK_EQ(fails, 1 + L * H + H);
    step_ok(&f);
    /* The child (lowest free id) appends into shared partial tails. */
    uint32_t c = 0;
    while (c < S && (c == p || !kv_page_seq_live(f.pt, c)))
        c++;
    CHECK(c < S);
    CHECK_EQ(ent_ref(&f, c, 0, 0, 1), 2);
    append_ctx_t ac = {.seed = 77, .s = c, .layer = 0, .n = 6};
    fails = fault_sweep(&f, append_op, &ac, 100);
    CHECK(fails >= 1); /* at least the page allocation */
    CHECK_EQ(ent_ref(&f, c, 0, 0, 1), 1);
    CHECK_EQ(ent_ref(&f, p, 0, 0, 1), 1);
    step_ok(&f);
    /* Forking under pool exhaustion needs no page: it still works. */
    fix_t g;
    fix_open(&g, 1, 1, D, T, 3, 2);
    uint32_t q, q2;
    CHECK_OK(kv_page_seq_create(g.pt, &q));
    g.ref.live[q] = 1;
    CHECK_OK(fix_append(&g, &seed, q, 0, 6, NULL)); /* both pages */
    CHECK_OK(kv_page_seq_fork(g.pt, q, &q2));
    ref_fork(&g.ref, q, q2);
    step_ok(&g);
    /* But the CoW copy of the shared tail cannot get a page. */
    snap_t a = {0}, b = {0};
    snap_take(&g, &a);
    CHECK_EQ(fix_append(&g, &seed, q2, 0, 1, NULL), KV_ENOMEM);
    snap_take(&g, &b);
    CHECK(snap_same(&a, &b));
    step_ok(&g);
    /* Once the parent is gone the tail is exclusive: no page needed. */
    CHECK_OK(kv_page_seq_free(g.pt, q));
    ref_clear(&g.ref, q);
    CHECK_OK(fix_append(&g, &seed, q2, 0, 2, NULL));
    step_ok(&g);
    snap_free(&a), snap_free(&b);
    fix_close(&g);
    fix_close(&f);
}

int main(void)
{
    test_fork_cow();
    test_fork_empty();
    test_faults();
    return kv_test_end();
}
