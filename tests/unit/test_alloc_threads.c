/* SPDX-License-Identifier: MIT */
/*
 * test_alloc_threads.c — page pools under several threads.
 *
 * Checks: 4 threads hammering alloc / retain / release on one pool and on
 * two pools, handing pages to each other through mailboxes (so pages are
 * freed into other threads' caches), with each exclusively held page stamped
 * and verified (no page handed out twice); at barriers (quiescent) the stats
 * match the pages the threads hold and used + free == capacity; after the
 * threads exit, used == 0 and every page can be allocated again (their
 * caches were flushed back). A pool destroyed while another thread still has
 * a cache bound to it: that thread then allocates from a new pool correctly
 * (ASan checks nothing touched the freed pool). Low watermark: a pool
 * drained by one thread while another sits on a full cache gets that cache
 * back as soon as the other thread calls into the pool. A thread allocating
 * again from a TLS destructor after its caches were flushed strands nothing.
 * One thread cycling through
 * more pools than it has cache slots keeps every pool's capacity exact.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>

#include "alloc/kv_alloc.h"
#include "alloc/kv_mem.h"
#include "kv_test.h"

#define N_THREADS 4
#define HOLD_MAX 48
#define N_MAILBOX 8

typedef struct hammer {
    kv_alloc_pool_t *pools[2];
    uint32_t n_pools;
    pthread_barrier_t barrier;
    _Atomic kv_page_id_t mailbox[2][N_MAILBOX]; /* shared pages in flight, 0 = empty */
    _Atomic uint32_t held[2][N_THREADS];        /* refs each thread holds, per pool   */
    _Atomic int errors;
    int rounds, steps;
} hammer_t;

typedef struct worker {
    hammer_t *h;
    uint32_t me;
} worker_t;

static void stamp(kv_alloc_pool_t *pool, kv_page_id_t id, uint32_t v)
{
    uint32_t *p = kv_alloc_page_ptr(pool, id);
    p[0] = v;
    p[15] = ~v;
}

static int stamped(kv_alloc_pool_t *pool, kv_page_id_t id, uint32_t v)
{
    const uint32_t *p = kv_alloc_page_ptr(pool, id);
    return p[0] == v && p[15] == ~v;
}

static void *hammer_thread(void *arg)
{
    worker_t *w = arg;
    hammer_t *h = w->h;
    uint64_t seed = 1000 + w->me;
    kv_page_id_t mine[2][HOLD_MAX]; /* exclusively held, stamped */
    uint32_t n_mine[2] = { 0, 0 };
    uint32_t n_shared[2] = { 0, 0 }; /* refs taken from mailboxes, released at once */
    int err = 0;
    for (int round = 0; round < h->rounds; round++) {
        for (int step = 0; step < h->steps; step++) {
            uint32_t pi = (uint32_t)(kv_test_rand(&seed) % h->n_pools);
            kv_alloc_pool_t *pool = h->pools[pi];
            uint64_t r = kv_test_rand(&seed) % 100;
            uint32_t tagv = (w->me << 24) | (uint32_t)step;
            if (r < 45 && n_mine[pi] < HOLD_MAX) {
                kv_page_id_t id;
                int rc = kv_alloc_page(pool, &id);
                if (rc == 0) {
                    err |= kv_alloc_refcount(pool, id) != 1;
                    stamp(pool, id, tagv);
                    mine[pi][n_mine[pi]++] = (id);
                    /* remember the stamp in the page's word 1 */
                    ((uint32_t *)kv_alloc_page_ptr(pool, id))[1] = tagv;
                } else {
                    err |= rc != KV_ENOMEM;
                }
            } else if (r < 85 && n_mine[pi] > 0) {
                uint32_t j = (uint32_t)(kv_test_rand(&seed) % n_mine[pi]);
                kv_page_id_t id = mine[pi][j];
                uint32_t v = ((uint32_t *)kv_alloc_page_ptr(pool, id))[1];
                err |= !stamped(pool, id, v) || (v >> 24) != w->me;
                mine[pi][j] = mine[pi][--n_mine[pi]];
                if (r < 70) {
                    err |= kv_alloc_release(pool, id) != 1;
                } else {
                    /* share: retain for the mailbox, then drop ours */
                    err |= kv_alloc_retain(pool, id) != 0;
                    err |= kv_alloc_release(pool, id) != 0;
                    kv_page_id_t old = atomic_exchange(
                        &h->mailbox[pi][kv_test_rand(&seed) % N_MAILBOX], id);
                    if (old)
                        err |= kv_alloc_release(pool, old) != 1;
                }
            } else {
                /* take a page from a mailbox, retain+release a ref on it */
                kv_page_id_t id = atomic_exchange(
                    &h->mailbox[pi][kv_test_rand(&seed) % N_MAILBOX], 0);
                if (id) {
                    err |= kv_alloc_retain(pool, id) != 0;
                    err |= kv_alloc_refcount(pool, id) < 2;
                    n_shared[pi]++;
                    err |= kv_alloc_release(pool, id) != 0;
                    err |= kv_alloc_release(pool, id) != 1; /* last ref */
                }
            }
            for (uint32_t p = 0; p < h->n_pools; p++)
                atomic_store(&h->held[p][w->me], n_mine[p]);
        }
        /* quiescent point: main checks the stats between the two waits */
        pthread_barrier_wait(&h->barrier);
        pthread_barrier_wait(&h->barrier);
    }
    for (uint32_t p = 0; p < h->n_pools; p++) {
        for (uint32_t j = 0; j < n_mine[p]; j++)
            err |= kv_alloc_release(h->pools[p], mine[p][j]) != 1;
        atomic_store(&h->held[p][w->me], 0);
    }
    (void)n_shared;
    if (err)
        atomic_fetch_add(&h->errors, 1);
    return NULL;
}

static uint32_t mailbox_pages(hammer_t *h, uint32_t p)
{
    uint32_t n = 0;
    for (int i = 0; i < N_MAILBOX; i++)
        n += atomic_load(&h->mailbox[p][i]) != 0;
    return n;
}

static void run_hammer(uint32_t n_pools, uint32_t capacity, uint32_t flags)
{
    static hammer_t h; /* big, and zeroed per run below */
    memset(&h, 0, sizeof h);
    h.n_pools = n_pools;
    h.rounds = 6;
    h.steps = 20000;
    for (uint32_t p = 0; p < n_pools; p++) {
        kv_alloc_config_t cfg = { .page_bytes = 64, .capacity = capacity,
                                  .tier = KV_TIER_HOST, .flags = flags };
        CHECK_OK(kv_alloc_pool_create(&cfg, &h.pools[p]));
        if (!h.pools[p])
            return;
    }
    pthread_barrier_init(&h.barrier, NULL, N_THREADS + 1);
    worker_t w[N_THREADS];
    pthread_t th[N_THREADS];
    for (uint32_t i = 0; i < N_THREADS; i++) {
        w[i].h = &h;
        w[i].me = i;
        CHECK_EQ(pthread_create(&th[i], NULL, hammer_thread, &w[i]), 0);
    }
    int quiet_ok = 1;
    for (int round = 0; round < h.rounds; round++) {
        pthread_barrier_wait(&h.barrier);
        for (uint32_t p = 0; p < n_pools; p++) {
            uint64_t held = mailbox_pages(&h, p);
            for (int i = 0; i < N_THREADS; i++)
                held += atomic_load(&h.held[p][i]);
            kv_alloc_stats_t st;
            kv_alloc_stats(h.pools[p], &st);
            if (st.used != held || st.used + st.free != capacity ||
                st.peak < st.used || st.peak > capacity) {
                quiet_ok = 0;
                fprintf(stderr, "pool %u round %d: used %llu held %llu free %llu peak %llu\n",
                        p, round, (unsigned long long)st.used,
                        (unsigned long long)held, (unsigned long long)st.free,
                        (unsigned long long)st.peak);
            }
        }
        pthread_barrier_wait(&h.barrier);
    }
    for (uint32_t i = 0; i < N_THREADS; i++)
        pthread_join(th[i], NULL);
    CHECK(quiet_ok);
    CHECK_EQ(atomic_load(&h.errors), 0);
    for (uint32_t p = 0; p < n_pools; p++) {
        for (int i = 0; i < N_MAILBOX; i++) {
            kv_page_id_t id = atomic_load(&h.mailbox[p][i]);
            if (id)
                CHECK_EQ(kv_alloc_release(h.pools[p], id), 1);
        }
        kv_alloc_stats_t st;
        kv_alloc_stats(h.pools[p], &st);
        CHECK_EQ(st.used, 0);
        CHECK_EQ(st.free, capacity);
        CHECK(st.failed > 0 || capacity > N_THREADS * HOLD_MAX + N_MAILBOX);
        /* every page is allocatable again: the exited threads' caches were
         * flushed back to the pool */
        kv_page_id_t *ids = kv_mem_alloc(capacity * sizeof *ids);
        CHECK_OK(kv_alloc_pages(h.pools[p], capacity, ids));
        kv_mem_free(ids, capacity * sizeof *ids);
        kv_alloc_pool_destroy(h.pools[p]);
    }
    pthread_barrier_destroy(&h.barrier);
}

/* ---- a pool destroyed under a bound cache -------------------------------- */

typedef struct handoff {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int stage;                 /* 0: bind, 1: bound, 2: new pool ready, 3: done */
    kv_alloc_pool_t *pool;     /* the pool the worker should use now  */
    int errors;
} handoff_t;

static void handoff_wait(handoff_t *s, int stage)
{
    pthread_mutex_lock(&s->mu);
    while (s->stage < stage)
        pthread_cond_wait(&s->cv, &s->mu);
    pthread_mutex_unlock(&s->mu);
}

static void handoff_set(handoff_t *s, int stage)
{
    pthread_mutex_lock(&s->mu);
    s->stage = stage;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

static void *handoff_thread(void *arg)
{
    handoff_t *s = arg;
    kv_page_id_t ids[40];
    /* fill this thread's cache for the first pool: alloc+free 20 pages */
    for (int i = 0; i < 20; i++)
        s->errors += kv_alloc_page(s->pool, &ids[i]) != 0;
    for (int i = 0; i < 20; i++)
        s->errors += kv_alloc_release(s->pool, ids[i]) != 1;
    handoff_set(s, 1);
    handoff_wait(s, 2);
    /* first pool is gone; use the new one, to exhaustion */
    kv_alloc_pool_t *pool = s->pool;
    uint32_t cap = kv_alloc_capacity(pool);
    uint32_t n = 0;
    while (n < 40 && kv_alloc_page(pool, &ids[n]) == 0)
        n++;
    s->errors += n != cap;
    kv_alloc_stats_t st;
    kv_alloc_stats(pool, &st);
    s->errors += st.used != cap;
    for (uint32_t i = 0; i < n; i++)
        s->errors += kv_alloc_release(pool, ids[i]) != 1;
    /* leave a few pages in the cache: thread exit must flush them */
    for (int i = 0; i < 3; i++)
        s->errors += kv_alloc_page(pool, &ids[i]) != 0;
    for (int i = 0; i < 3; i++)
        s->errors += kv_alloc_release(pool, ids[i]) != 1;
    return NULL;
}

static void test_destroy_under_cache(void)
{
    handoff_t s;
    memset(&s, 0, sizeof s);
    pthread_mutex_init(&s.mu, NULL);
    pthread_cond_init(&s.cv, NULL);
    kv_alloc_config_t cfg = { .page_bytes = 64, .capacity = 1000,
                              .tier = KV_TIER_HOST, .flags = 0 };
    CHECK_OK(kv_alloc_pool_create(&cfg, &s.pool));
    if (!s.pool)
        return;
    pthread_t th;
    CHECK_EQ(pthread_create(&th, NULL, handoff_thread, &s), 0);
    handoff_wait(&s, 1);
    kv_alloc_stats_t st;
    kv_alloc_stats(s.pool, &st);
    CHECK_EQ(st.used, 0);
    /* peak may miss the worker's cache traffic since its last trip */
    CHECK(st.peak >= 20 - KV_ALLOC_TCACHE_MAX / 2 && st.peak <= 20);
    kv_alloc_pool_destroy(s.pool); /* the worker's cache is still bound */
    /* a small new pool: likely at the same address; any stale cache entry
     * would hand out a page twice or an index >= 30 */
    cfg.capacity = 30;
    CHECK_OK(kv_alloc_pool_create(&cfg, &s.pool));
    handoff_set(&s, 2);
    pthread_join(th, NULL);
    CHECK_EQ(s.errors, 0);
    kv_alloc_stats(s.pool, &st);
    CHECK_EQ(st.used, 0);
    CHECK_EQ(st.peak, 30);
    /* the worker exited with pages in its cache: all 30 must be here */
    kv_page_id_t ids[30];
    CHECK_OK(kv_alloc_pages(s.pool, 30, ids));
    kv_alloc_pool_destroy(s.pool);
    pthread_cond_destroy(&s.cv);
    pthread_mutex_destroy(&s.mu);
}

/* ---- thread exit flushes the caches of every pool it used ---------------- */

static kv_alloc_pool_t *exit_pools[2];

static void *exit_thread(void *arg)
{
    (void)arg;
    kv_page_id_t ids[25];
    for (int p = 0; p < 2; p++) {
        for (int i = 0; i < 25; i++)
            if (kv_alloc_page(exit_pools[p], &ids[i]) != 0)
                return (void *)1;
        for (int i = 0; i < 25; i++)
            kv_alloc_release(exit_pools[p], ids[i]);
    }
    return NULL;
}

static void test_thread_exit_flush(void)
{
    const uint32_t cap = 200;
    kv_alloc_config_t cfg = { .page_bytes = 64, .capacity = cap,
                              .tier = KV_TIER_FILE, .flags = 0 };
    CHECK_OK(kv_alloc_pool_create(&cfg, &exit_pools[0]));
    CHECK_OK(kv_alloc_pool_create(&cfg, &exit_pools[1]));
    if (!exit_pools[0] || !exit_pools[1])
        return;
    pthread_t th;
    void *ret = (void *)2;
    CHECK_EQ(pthread_create(&th, NULL, exit_thread, NULL), 0);
    pthread_join(th, &ret);
    CHECK(ret == NULL);
    for (int p = 0; p < 2; p++) {
        /* one at a time: the single-page path must find every page */
        kv_page_id_t id;
        uint32_t n = 0;
        while (n <= cap && kv_alloc_page(exit_pools[p], &id) == 0)
            n++;
        CHECK_EQ(n, cap);
        kv_alloc_pool_destroy(exit_pools[p]);
    }
}

/* ---- a thread allocating from a TLS destructor after its caches were
 *      flushed (a key created after the pool's runs later) ---------------- */

static pthread_key_t late_key;
static kv_alloc_pool_t *late_pool;
static _Atomic int late_errors;

static void late_destructor(void *arg)
{
    (void)arg;
    kv_page_id_t ids[3];
    for (int i = 0; i < 3; i++)
        if (kv_alloc_page(late_pool, &ids[i]) != 0)
            atomic_fetch_add(&late_errors, 1);
    for (int i = 0; i < 3; i++)
        if (kv_alloc_release(late_pool, ids[i]) != 1)
            atomic_fetch_add(&late_errors, 1);
}

static void *late_thread(void *arg)
{
    (void)arg;
    kv_page_id_t id;
    /* bind a cache, leave pages in it */
    for (int i = 0; i < 5; i++)
        if (kv_alloc_page(late_pool, &id) != 0 || kv_alloc_release(late_pool, id) != 1)
            atomic_fetch_add(&late_errors, 1);
    pthread_setspecific(late_key, (void *)1);
    return NULL;
}

static void test_alloc_in_late_destructor(void)
{
    const uint32_t cap = 500;
    kv_alloc_config_t cfg = { .page_bytes = 64, .capacity = cap,
                              .tier = KV_TIER_HOST, .flags = 0 };
    CHECK_OK(kv_alloc_pool_create(&cfg, &late_pool));
    if (!late_pool)
        return;
    CHECK_EQ(pthread_key_create(&late_key, late_destructor), 0);
    pthread_t th;
    CHECK_EQ(pthread_create(&th, NULL, late_thread, NULL), 0);
    pthread_join(th, NULL);
    CHECK_EQ(atomic_load(&late_errors), 0);
    static kv_page_id_t ids[500];
    uint32_t n = 0;
    while (n < cap && kv_alloc_page(late_pool, &ids[n]) == 0)
        n++;
    CHECK_EQ(n, cap); /* nothing stranded in the dead thread's slots */
    kv_alloc_stats_t st;
    kv_alloc_stats(late_pool, &st);
    CHECK_EQ(st.used, cap);
    pthread_key_delete(late_key);
    kv_alloc_pool_destroy(late_pool);
}

/* ---- low watermark: an idle thread's cache comes back when it calls ------ */

static void *low_thread(void *arg)
{
    handoff_t *s = arg;
    kv_page_id_t ids[20];
    for (int i = 0; i < 20; i++)
        s->errors += kv_alloc_page(s->pool, &ids[i]) != 0;
    for (int i = 0; i < 20; i++)
        s->errors += kv_alloc_release(s->pool, ids[i]) != 1;
    handoff_set(s, 1);
    handoff_wait(s, 2);
    /* the pool ran dry meanwhile: this call must give our cache back */
    s->errors += kv_alloc_page(s->pool, &ids[0]) != 0;
    s->errors += kv_alloc_release(s->pool, ids[0]) != 1;
    handoff_set(s, 3);
    handoff_wait(s, 4);
    return NULL;
}

static void test_low_watermark(void)
{
    const uint32_t cap = 1000;
    handoff_t s;
    memset(&s, 0, sizeof s);
    pthread_mutex_init(&s.mu, NULL);
    pthread_cond_init(&s.cv, NULL);
    kv_alloc_config_t cfg = { .page_bytes = 64, .capacity = cap,
                              .tier = KV_TIER_HOST, .flags = 0 };
    CHECK_OK(kv_alloc_pool_create(&cfg, &s.pool));
    if (!s.pool)
        return;
    static kv_page_id_t ids[1000];
    pthread_t th;
    CHECK_EQ(pthread_create(&th, NULL, low_thread, &s), 0);
    handoff_wait(&s, 1);
    uint32_t n = 0;
    while (n < cap && kv_alloc_page(s.pool, &ids[n]) == 0)
        n++;
    /* only the idle worker's cache may be missing */
    CHECK(n >= cap - KV_ALLOC_TCACHE_MAX);
    handoff_set(&s, 2);
    handoff_wait(&s, 3);
    while (n < cap && kv_alloc_page(s.pool, &ids[n]) == 0)
        n++;
    CHECK_EQ(n, cap); /* the worker flushed when it saw the pool low */
    kv_page_id_t extra;
    CHECK_EQ(kv_alloc_page(s.pool, &extra), KV_ENOMEM);
    handoff_set(&s, 4);
    pthread_join(th, NULL);
    CHECK_EQ(s.errors, 0);
    for (uint32_t i = 0; i < n; i++)
        kv_alloc_release(s.pool, ids[i]);
    kv_alloc_stats_t st;
    kv_alloc_stats(s.pool, &st);
    CHECK_EQ(st.used, 0);
    CHECK_EQ(st.peak, cap);
    kv_alloc_pool_destroy(s.pool);
    pthread_cond_destroy(&s.cv);
    pthread_mutex_destroy(&s.mu);
}

/* ---- more pools than cache slots, one thread ----------------------------- */

static void test_many_pools(void)
{
    enum { NP = 7, CAP = 150 };
    kv_alloc_pool_t *pools[NP] = { 0 };
    kv_alloc_config_t cfg = { .page_bytes = 64, .capacity = CAP,
                              .tier = KV_TIER_DEVICE, .flags = 0 };
    for (int p = 0; p < NP; p++)
        CHECK_OK(kv_alloc_pool_create(&cfg, &pools[p]));
    static kv_page_id_t ids[NP][CAP];
    uint32_t n[NP] = { 0 };
    int progress = 1;
    /* round-robin one page per pool, so slots get evicted constantly */
    while (progress) {
        progress = 0;
        for (int p = 0; p < NP; p++) {
            if (pools[p] && n[p] < CAP && kv_alloc_page(pools[p], &ids[p][n[p]]) == 0) {
                n[p]++;
                progress = 1;
            }
        }
    }
    for (int p = 0; p < NP; p++) {
        CHECK_EQ(n[p], CAP);
        kv_page_id_t id;
        CHECK_EQ(kv_alloc_page(pools[p], &id), KV_ENOMEM);
        for (uint32_t i = 0; i < n[p]; i++)
            CHECK_EQ(kv_alloc_release(pools[p], ids[p][i]), 1);
        kv_alloc_stats_t st;
        kv_alloc_stats(pools[p], &st);
        CHECK_EQ(st.used, 0);
        CHECK_EQ(st.peak, CAP);
    }
    for (int p = 0; p < NP; p++)
        kv_alloc_pool_destroy(pools[p]);
}

int main(void)
{
    uint64_t base = kv_mem_live_bytes();
    run_hammer(1, 100, 0);                 /* tight: often exhausted       */
    run_hammer(1, 4096, 0);                /* roomy: caches do the work    */
    run_hammer(2, 150, 0);                 /* two pools at once            */
    run_hammer(1, 100, KV_ALLOC_NO_TCACHE);
    test_destroy_under_cache();
    test_thread_exit_flush();
    test_low_watermark();
    test_alloc_in_late_destructor();
    test_many_pools();
    CHECK_EQ(kv_mem_live_bytes(), base);
    return kv_test_end();
}
