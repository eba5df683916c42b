/* SPDX-License-Identifier: MIT */
/*
 * test_alloc.c — page pools, single thread.
 *
 * Checks, with the per-thread cache on and off: allocation fails exactly when
 * used == capacity (capacities 1, 2, 37, 64, 1000), freed pages come back,
 * LIFO order without cache, batches are all-or-nothing, refcounts (retain /
 * release / double release / free page -> KV_ESTATE with stats unchanged),
 * ids of other pools / 0 / garbage / out of range -> KV_EINVAL, page
 * addresses aligned, distinct and non-overlapping (pattern per page),
 * stats used/free/peak/failed (peak exact against a tracked maximum),
 * bad configs, injected failures changing nothing (including pool creation
 * at every allocation step) and destroy with pages still held (no leak).
 */
#include <string.h>

#include "alloc/kv_alloc.h"
#include "alloc/kv_mem.h"
#include "kv_test.h"

static kv_alloc_pool_t *make_pool(uint32_t page_bytes, uint32_t capacity,
                                  kv_tier_t tier, uint32_t flags)
{
    kv_alloc_config_t cfg = { .page_bytes = page_bytes, .capacity = capacity,
                              .tier = tier, .flags = flags };
    kv_alloc_pool_t *pool = NULL;
    int rc = kv_alloc_pool_create(&cfg, &pool);
    CHECK_OK(rc);
    CHECK(rc != 0 || pool != NULL);
    return rc ? NULL : pool;
}

static int same_stats(const kv_alloc_stats_t *a, const kv_alloc_stats_t *b)
{
    return a->used == b->used && a->free == b->free && a->peak == b->peak &&
           a->failed == b->failed && a->capacity == b->capacity &&
           a->page_bytes == b->page_bytes;
}

/* Fill a pool until refused, check the count and the stats, release all,
 * fill again. */
static void test_capacity(uint32_t cap, uint32_t flags, uint64_t *seed)
{
    kv_alloc_pool_t *pool = make_pool(64, cap, KV_TIER_HOST, flags);
    if (!pool)
        return;
    kv_page_id_t *ids = kv_mem_alloc((size_t)cap * sizeof *ids);
    unsigned char *seen = kv_mem_calloc(cap, 1);
    for (int round = 0; round < 3; round++) {
        uint32_t n = 0;
        kv_page_id_t id;
        while (n <= cap && kv_alloc_page(pool, &id) == 0) {
            CHECK(kv_alloc_id_valid(pool, id));
            uint32_t ix = kv_alloc_page_index(id);
            CHECK(ix < cap);
            if (ix < cap) {
                CHECK(!seen[ix]);
                seen[ix] = 1;
            }
            CHECK_EQ(kv_alloc_refcount(pool, id), 1);
            ids[n++] = id;
        }
        CHECK_EQ(n, cap);
        CHECK_EQ(kv_alloc_page(pool, &id), KV_ENOMEM);
        kv_alloc_stats_t st;
        kv_alloc_stats(pool, &st);
        CHECK_EQ(st.used, cap);
        CHECK_EQ(st.free, 0);
        CHECK_EQ(st.peak, cap);
        CHECK_EQ(st.failed, 3 * round + 2);
        /* release in a random order, partly; then refill to capacity */
        for (uint32_t i = cap; i > 1; i--) {
            uint32_t j = (uint32_t)(kv_test_rand(seed) % i);
            kv_page_id_t t = ids[i - 1];
            ids[i - 1] = ids[j];
            ids[j] = t;
        }
        uint32_t drop = cap / 2 + 1;
        for (uint32_t i = 0; i < drop; i++) {
            CHECK_EQ(kv_alloc_release(pool, ids[cap - 1 - i]), 1);
            seen[kv_alloc_page_index(ids[cap - 1 - i])] = 0;
        }
        kv_alloc_stats(pool, &st);
        CHECK_EQ(st.used, cap - drop);
        CHECK_EQ(st.free, drop);
        uint32_t got = 0;
        while (got < drop && kv_alloc_page(pool, &id) == 0) {
            uint32_t ix = kv_alloc_page_index(id);
            CHECK(!seen[ix]);
            seen[ix] = 1;
            ids[cap - drop + got++] = id;
        }
        CHECK_EQ(got, drop);
        CHECK_EQ(kv_alloc_page(pool, &id), KV_ENOMEM); /* full again */
        for (uint32_t i = 0; i < cap; i++) {
            CHECK_EQ(kv_alloc_release(pool, ids[i]), 1);
            seen[kv_alloc_page_index(ids[i])] = 0;
        }
        kv_alloc_stats(pool, &st);
        CHECK_EQ(st.used, 0);
        CHECK_EQ(st.free, cap);
    }
    kv_mem_free(seen, cap);
    kv_mem_free(ids, (size_t)cap * sizeof *ids);
    kv_alloc_pool_destroy(pool);
}

static void test_lifo(void)
{
    kv_alloc_pool_t *pool = make_pool(128, 16, KV_TIER_HOST, KV_ALLOC_NO_TCACHE);
    if (!pool)
        return;
    kv_page_id_t a = 0, b = 0, c = 0, x = 0;
    CHECK_OK(kv_alloc_page(pool, &a));
    CHECK_OK(kv_alloc_page(pool, &b));
    CHECK_OK(kv_alloc_page(pool, &c));
    CHECK_EQ(kv_alloc_page_index(a), 0); /* fresh pool: 0, 1, 2, ... */
    CHECK_EQ(kv_alloc_page_index(b), 1);
    CHECK_EQ(kv_alloc_page_index(c), 2);
    CHECK_EQ(kv_alloc_release(pool, b), 1);
    CHECK_EQ(kv_alloc_release(pool, a), 1);
    CHECK_EQ(kv_alloc_release(pool, c), 1);
    CHECK_OK(kv_alloc_page(pool, &x));
    CHECK_EQ(x, c);
    CHECK_OK(kv_alloc_page(pool, &x));
    CHECK_EQ(x, a);
    CHECK_OK(kv_alloc_page(pool, &x));
    CHECK_EQ(x, b);
    kv_page_id_t v[3];
    CHECK_OK(kv_alloc_pages(pool, 3, v)); /* batch pops the stack top first */
    CHECK_EQ(kv_alloc_page_index(v[0]), 3);
    CHECK_EQ(kv_alloc_page_index(v[2]), 5);
    kv_alloc_pool_destroy(pool);
}

static void test_batch(uint32_t flags)
{
    const uint32_t cap = 10;
    kv_alloc_pool_t *pool = make_pool(64, cap, KV_TIER_HOST, flags);
    if (!pool)
        return;
    kv_page_id_t ids[16], more[16];
    kv_alloc_stats_t st0, st1;
    CHECK_OK(kv_alloc_pages(pool, 0, NULL)); /* nothing to do */
    CHECK_EQ(kv_alloc_pages(pool, 2, NULL), KV_EINVAL);
    CHECK_EQ(kv_alloc_pages(NULL, 2, ids), KV_EINVAL);
    CHECK_OK(kv_alloc_pages(pool, 4, ids));
    kv_alloc_stats(pool, &st0);
    CHECK_EQ(st0.used, 4);
    for (int i = 0; i < 16; i++)
        more[i] = 0xDEADBEEF;
    CHECK_EQ(kv_alloc_pages(pool, 7, more), KV_ENOMEM); /* 6 free */
    CHECK_EQ(kv_alloc_pages(pool, cap + 1, more), KV_ENOMEM);
    kv_alloc_stats(pool, &st1);
    CHECK_EQ(st1.used, 4);
    CHECK_EQ(st1.free, 6);
    CHECK_EQ(st1.failed, st0.failed + 2);
    CHECK_EQ(more[0], 0xDEADBEEF);
    CHECK_OK(kv_alloc_pages(pool, 6, ids + 4));
    kv_page_id_t one;
    CHECK_EQ(kv_alloc_pages(pool, 1, &one), KV_ENOMEM);
    CHECK_EQ(kv_alloc_page(pool, &one), KV_ENOMEM);
    unsigned char seen[10] = { 0 };
    for (uint32_t i = 0; i < cap; i++) {
        uint32_t ix = kv_alloc_page_index(ids[i]);
        CHECK(ix < cap && !seen[ix]);
        if (ix < cap)
            seen[ix] = 1;
        CHECK_EQ(kv_alloc_refcount(pool, ids[i]), 1);
    }
    for (uint32_t i = 0; i < cap; i++)
        CHECK_EQ(kv_alloc_release(pool, ids[i]), 1);
    CHECK_OK(kv_alloc_pages(pool, cap, ids)); /* all of it at once */
    kv_alloc_stats(pool, &st1);
    CHECK_EQ(st1.used, cap);
    kv_alloc_pool_destroy(pool);
}

static void test_refcounts(uint32_t flags)
{
    kv_alloc_pool_t *pool = make_pool(64, 8, KV_TIER_HOST, flags);
    if (!pool)
        return;
    kv_page_id_t a = 0, b = 0;
    CHECK_OK(kv_alloc_page(pool, &a));
    CHECK_OK(kv_alloc_page(pool, &b));
    CHECK_EQ(kv_alloc_refcount(pool, a), 1);
    CHECK_OK(kv_alloc_retain(pool, a));
    CHECK_OK(kv_alloc_retain(pool, a));
    CHECK_EQ(kv_alloc_refcount(pool, a), 3);
    CHECK_EQ(kv_alloc_release(pool, a), 0);
    CHECK_EQ(kv_alloc_release(pool, a), 0);
    CHECK_EQ(kv_alloc_refcount(pool, a), 1);
    kv_alloc_stats_t st0, st1;
    kv_alloc_stats(pool, &st0);
    CHECK_EQ(st0.used, 2);
    CHECK_EQ(kv_alloc_release(pool, a), 1);
    CHECK_EQ(kv_alloc_refcount(pool, a), 0);
    kv_alloc_stats(pool, &st0);
    CHECK_EQ(st0.used, 1);
    /* double release, retain of a free page, release of a never-used page */
    CHECK_EQ(kv_alloc_release(pool, a), KV_ESTATE);
    CHECK_EQ(kv_alloc_retain(pool, a), KV_ESTATE);
    kv_page_id_t never = (b & ~(KV_ALLOC_MAX_PAGES - 1u)) | 7u;
    CHECK(kv_alloc_id_valid(pool, never));
    CHECK_EQ(kv_alloc_release(pool, never), KV_ESTATE);
    CHECK_EQ(kv_alloc_retain(pool, never), KV_ESTATE);
    CHECK_EQ(kv_alloc_refcount(pool, never), 0);
    kv_alloc_stats(pool, &st1);
    CHECK(same_stats(&st0, &st1));
    /* the freed page comes back with refcount 1 */
    kv_page_id_t c = 0;
    CHECK_OK(kv_alloc_page(pool, &c));
    CHECK_EQ(c, a);
    CHECK_EQ(kv_alloc_refcount(pool, c), 1);
    CHECK_EQ(kv_alloc_release(pool, c), 1);
    CHECK_EQ(kv_alloc_release(pool, b), 1);
    kv_alloc_pool_destroy(pool);
}

static void test_bad_ids(void)
{
    kv_alloc_pool_t *p1 = make_pool(64, 8, KV_TIER_HOST, 0);
    kv_alloc_pool_t *p2 = make_pool(64, 8, KV_TIER_HOST, 0);
    if (!p1 || !p2)
        goto out;
    kv_page_id_t a = 0, b = 0;
    CHECK_OK(kv_alloc_page(p1, &a));
    CHECK_OK(kv_alloc_page(p2, &b));
    CHECK(a != b); /* same index, different tags */
    CHECK_EQ(kv_alloc_page_index(a), kv_alloc_page_index(b));
    kv_alloc_stats_t st0, st1;
    kv_alloc_stats(p1, &st0);
    const kv_page_id_t bad[] = { b, KV_PAGE_ID_INVALID, 0xFFFFFFFFu,
                                 (a & ~(KV_ALLOC_MAX_PAGES - 1u)) | 8u, /* index = cap */
                                 (a & ~(KV_ALLOC_MAX_PAGES - 1u)) | (KV_ALLOC_MAX_PAGES - 1u),
                                 a & (KV_ALLOC_MAX_PAGES - 1u) /* tag 0 */ };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        CHECK(!kv_alloc_id_valid(p1, bad[i]));
        CHECK_EQ(kv_alloc_release(p1, bad[i]), KV_EINVAL);
        CHECK_EQ(kv_alloc_retain(p1, bad[i]), KV_EINVAL);
        CHECK_EQ(kv_alloc_refcount(p1, bad[i]), 0);
        CHECK(kv_alloc_page_ptr(p1, bad[i]) == NULL);
    }
    kv_alloc_stats(p1, &st1);
    CHECK(same_stats(&st0, &st1));
    CHECK_EQ(kv_alloc_refcount(p2, b), 1); /* p2's page untouched */
    CHECK_EQ(kv_alloc_release(NULL, a), KV_EINVAL);
    CHECK_EQ(kv_alloc_retain(NULL, a), KV_EINVAL);
    CHECK_EQ(kv_alloc_page(NULL, &a), KV_EINVAL);
    CHECK_EQ(kv_alloc_page(p1, NULL), KV_EINVAL);
    CHECK(!kv_alloc_id_valid(NULL, a));
    CHECK(kv_alloc_page_ptr(NULL, a) == NULL);
out:
    kv_alloc_pool_destroy(p1);
    kv_alloc_pool_destroy(p2);
}

/* Every page gets its own pattern; nothing overlaps; alignment holds. */
static void test_page_memory(uint32_t page_bytes, uint32_t cap, uint32_t align)
{
    kv_alloc_pool_t *pool = make_pool(page_bytes, cap, KV_TIER_HOST, 0);
    if (!pool)
        return;
    kv_page_id_t *ids = kv_mem_alloc((size_t)cap * sizeof *ids);
    CHECK_OK(kv_alloc_pages(pool, cap, ids));
    int aligned = 1, spaced = 1;
    for (uint32_t i = 0; i < cap; i++) {
        unsigned char *p = kv_alloc_page_ptr(pool, ids[i]);
        aligned &= p != NULL && ((uintptr_t)p % align) == 0;
        if (!p)
            continue;
        spaced &= p == (unsigned char *)kv_alloc_page_ptr(pool, ids[0]) +
                           ((ptrdiff_t)kv_alloc_page_index(ids[i]) -
                            (ptrdiff_t)kv_alloc_page_index(ids[0])) *
                               (ptrdiff_t)page_bytes;
        memset(p, (int)(i * 37u + 11u) & 0xFF, page_bytes);
    }
    CHECK(aligned);
    CHECK(spaced);
    int intact = 1;
    for (uint32_t i = 0; i < cap; i++) {
        const unsigned char *p = kv_alloc_page_ptr(pool, ids[i]);
        unsigned char want = (unsigned char)((i * 37u + 11u) & 0xFF);
        for (uint32_t j = 0; p && j < page_bytes; j++)
            intact &= p[j] == want;
    }
    CHECK(intact);
    CHECK_EQ(kv_alloc_page_bytes(pool), page_bytes);
    CHECK_EQ(kv_alloc_capacity(pool), cap);
    kv_mem_free(ids, (size_t)cap * sizeof *ids);
    kv_alloc_pool_destroy(pool);
}

static void test_id_only_pool(void)
{
    kv_alloc_pool_t *pool = make_pool(1u << 20, 1000, KV_TIER_DEVICE, 0);
    if (!pool)
        return;
    kv_page_id_t id;
    CHECK_OK(kv_alloc_page(pool, &id));
    CHECK(kv_alloc_id_valid(pool, id));
    CHECK(kv_alloc_page_ptr(pool, id) == NULL);
    CHECK_EQ(kv_alloc_release(pool, id), 1);
    kv_alloc_pool_destroy(pool);
}

/* kv_alloc_page_mem: the page and the address kv_alloc_page_ptr gives, for
 * every page until the pool is exhausted; bad arguments, an id-only pool,
 * exhaustion and an injected failure take nothing and leave *mem alone. */
static void test_page_mem(uint32_t flags)
{
    enum { CAP = 40 };
    kv_alloc_pool_t *pool = make_pool(4096, CAP, KV_TIER_HOST, flags);
    kv_alloc_pool_t *ids_only = make_pool(4096, 8, KV_TIER_FILE, flags);
    if (!pool || !ids_only) {
        kv_alloc_pool_destroy(pool);
        kv_alloc_pool_destroy(ids_only);
        return;
    }
    kv_page_id_t ids[CAP], id = 0x5555;
    void *mem = &id, *keep = &id;
    kv_alloc_stats_t st0, st1;
    kv_alloc_stats(pool, &st0);
    CHECK_EQ(kv_alloc_page_mem(pool, &id, NULL), KV_EINVAL);
    CHECK_EQ(kv_alloc_page_mem(pool, NULL, &mem), KV_EINVAL);
    CHECK_EQ(kv_alloc_page_mem(NULL, &id, &mem), KV_EINVAL);
    kv_alloc_stats(pool, &st1);
    CHECK(same_stats(&st0, &st1));
    kv_alloc_stats(ids_only, &st0);
    CHECK_EQ(kv_alloc_page_mem(ids_only, &id, &mem), KV_EINVAL);
    kv_alloc_stats(ids_only, &st1);
    CHECK(st1.used == 0 && st1.free == 8 && st1.failed == st0.failed);
    CHECK(mem == keep);
    int same = 1, distinct = 1;
    for (uint32_t i = 0; i < CAP; i++) {
        CHECK_OK(kv_alloc_page_mem(pool, &ids[i], &mem));
        same &= mem == kv_alloc_page_ptr(pool, ids[i]) &&
                kv_alloc_refcount(pool, ids[i]) == 1;
        memset(mem, (int)i, 4096);
    }
    for (uint32_t i = 0; i < CAP; i++)
        distinct &= *(const unsigned char *)kv_alloc_page_ptr(pool, ids[i]) == i;
    CHECK(same);
    CHECK(distinct);
    mem = keep;
    CHECK_EQ(kv_alloc_page_mem(pool, &id, &mem), KV_ENOMEM);
    CHECK(mem == keep && id == 0x5555);
    CHECK_EQ(kv_alloc_release(pool, ids[0]), 1);
    kv_fault_arm(1);
    CHECK_EQ(kv_alloc_page_mem(pool, &id, &mem), KV_ENOMEM);
    CHECK(kv_fault_fired());
    kv_fault_arm(0);
    CHECK(mem == keep);
    CHECK_OK(kv_alloc_page_mem(pool, &ids[0], &mem));
    CHECK(mem == kv_alloc_page_ptr(pool, ids[0]));
    kv_alloc_stats(pool, &st1);
    CHECK(st1.used == CAP && st1.free == 0);
    for (uint32_t i = 0; i < CAP; i++)
        CHECK_EQ(kv_alloc_release(pool, ids[i]), 1);
    kv_alloc_pool_destroy(pool);
    kv_alloc_pool_destroy(ids_only);
}

/* Random alloc/free walk: stats match a shadow model, peak included.
 * cap 300: drifts up to exhaustion and back down (crossing the low
 * watermark both ways). cap 1000 with a ceiling rising from 40 to 240: the
 * peak creeps up while the caches do all the work (never low). */
static void test_stats_walk(uint32_t flags, uint32_t cap, uint64_t *seed)
{
    kv_alloc_pool_t *pool = make_pool(64, cap, KV_TIER_PINNED, flags);
    if (!pool)
        return;
    static kv_page_id_t held[1000];
    uint32_t n = 0, peak = 0, failed = 0;
    int ok = 1;
    for (int step = 0; step < 20000; step++) {
        /* drift up and down so we cross the low watermark both ways */
        int up = (step / 2000) % 2 == 0;
        uint64_t r = kv_test_rand(seed) % 100;
        uint32_t ceiling = cap > 300 ? 40 + (uint32_t)step / 100 : cap;
        if (cap > 300)
            up = n < ceiling;
        if ((up && r < 65) || (!up && r < 35) || n == 0) {
            kv_page_id_t id;
            int rc = kv_alloc_page(pool, &id);
            if (n == cap) {
                ok &= rc == KV_ENOMEM;
                failed++;
            } else {
                ok &= rc == 0;
                if (rc == 0)
                    held[n++] = id;
            }
        } else {
            uint32_t j = (uint32_t)(kv_test_rand(seed) % n);
            ok &= kv_alloc_release(pool, held[j]) == 1;
            held[j] = held[--n];
        }
        if (n > peak)
            peak = n;
        if (step % 97 == 0) {
            kv_alloc_stats_t st;
            kv_alloc_stats(pool, &st);
            ok &= st.used == n && st.free == cap - n && st.peak == peak &&
                  st.failed == failed;
            if (!ok) {
                fprintf(stderr, "step %d: used %llu/%u peak %llu/%u failed %llu/%u\n",
                        step, (unsigned long long)st.used, n,
                        (unsigned long long)st.peak, peak,
                        (unsigned long long)st.failed, failed);
                break;
            }
        }
    }
    CHECK(ok);
    CHECK(cap > 300 ? peak >= 200 : failed > 0); /* the walk went where meant */
    kv_alloc_pool_destroy(pool);
}

/* Peak reached inside the cache and given back before any trip to the
 * shared stack is still seen, by stats and after later trips. */
static void test_peak_in_cache(void)
{
    kv_alloc_pool_t *pool = make_pool(64, 1000, KV_TIER_HOST, 0);
    if (!pool)
        return;
    kv_page_id_t ids[40];
    kv_alloc_stats_t st;
    for (int round = 0; round < 3; round++) {
        for (int i = 0; i < 40; i++)
            CHECK_OK(kv_alloc_page(pool, &ids[i]));
        for (int i = 0; i < 40; i++)
            CHECK_EQ(kv_alloc_release(pool, ids[i]), 1);
        kv_alloc_stats(pool, &st);
        CHECK_EQ(st.used, 0);
        CHECK_EQ(st.peak, 40);
    }
    /* many small pairs: trips happen, the peak stays */
    for (int i = 0; i < 500; i++) {
        CHECK_OK(kv_alloc_pages(pool, 3, ids));
        for (int j = 0; j < 3; j++)
            kv_alloc_release(pool, ids[j]);
    }
    kv_alloc_stats(pool, &st);
    CHECK_EQ(st.peak, 40);
    kv_alloc_pool_destroy(pool);
}

static void test_bad_configs(void)
{
    kv_alloc_pool_t *pool = (kv_alloc_pool_t *)(uintptr_t)0x1234;
    kv_alloc_config_t ok = { .page_bytes = 64, .capacity = 4,
                             .tier = KV_TIER_HOST, .flags = 0 };
    kv_alloc_config_t c;
    c = ok; c.page_bytes = 0;
    CHECK_EQ(kv_alloc_pool_create(&c, &pool), KV_ERANGE);
    c = ok; c.page_bytes = 100;
    CHECK_EQ(kv_alloc_pool_create(&c, &pool), KV_ERANGE);
    c = ok; c.page_bytes = 32;
    CHECK_EQ(kv_alloc_pool_create(&c, &pool), KV_ERANGE);
    c = ok; c.capacity = 0;
    CHECK_EQ(kv_alloc_pool_create(&c, &pool), KV_ERANGE);
    c = ok; c.capacity = KV_ALLOC_MAX_PAGES + 1u;
    CHECK_EQ(kv_alloc_pool_create(&c, &pool), KV_ERANGE);
    c = ok; c.tier = (kv_tier_t)9;
    CHECK_EQ(kv_alloc_pool_create(&c, &pool), KV_EINVAL);
    c = ok; c.flags = 0x80;
    CHECK_EQ(kv_alloc_pool_create(&c, &pool), KV_EINVAL);
    CHECK_EQ(kv_alloc_pool_create(NULL, &pool), KV_EINVAL);
    CHECK_EQ(kv_alloc_pool_create(&ok, NULL), KV_EINVAL);
    CHECK(pool == (kv_alloc_pool_t *)(uintptr_t)0x1234); /* untouched */
    kv_alloc_pool_destroy(NULL);
    kv_alloc_stats_t st;
    memset(&st, 0xFF, sizeof st);
    kv_alloc_stats(NULL, &st);
    CHECK_EQ(st.capacity, 0);
}

/* An injected failure in alloc changes nothing but the failed count; pool
 * creation failing at each of its allocations leaks nothing. */
static void test_injected(uint32_t flags)
{
    uint64_t base = kv_mem_live_bytes();
    kv_alloc_config_t cfg = { .page_bytes = 4096, .capacity = 50,
                              .tier = KV_TIER_HOST, .flags = flags };
    kv_alloc_pool_t *pool = NULL;
    int created = 0;
    for (uint64_t k = 1; k < 20 && !created; k++) {
        kv_fault_arm(k);
        int rc = kv_alloc_pool_create(&cfg, &pool);
        if (kv_fault_fired()) {
            CHECK_EQ(rc, KV_ENOMEM);
            CHECK_EQ(kv_mem_live_bytes(), base);
        } else {
            CHECK_OK(rc);
            created = rc == 0;
            CHECK(k > 2); /* creation allocates a few times first */
        }
    }
    kv_fault_arm(0);
    CHECK(created);
    if (!created)
        return;
    kv_page_id_t id, keep[3];
    CHECK_OK(kv_alloc_pages(pool, 3, keep));
    kv_alloc_stats_t st0, st1;
    kv_alloc_stats(pool, &st0);
    kv_fault_arm(1);
    id = 0x5555;
    CHECK_EQ(kv_alloc_page(pool, &id), KV_ENOMEM);
    CHECK_EQ(id, 0x5555);
    kv_alloc_stats(pool, &st1);
    CHECK_EQ(st1.failed, st0.failed + 1);
    st1.failed = st0.failed;
    CHECK(same_stats(&st0, &st1));
    CHECK_OK(kv_alloc_page(pool, &id));
    CHECK_EQ(kv_alloc_refcount(pool, id), 1);
    /* destroy with pages still held: all metadata comes back */
    kv_alloc_pool_destroy(pool);
    CHECK_EQ(kv_mem_live_bytes(), base);
}

int main(void)
{
    uint64_t seed = 42;
    const uint32_t caps[] = { 1, 2, 37, 64, 1000 };
    for (uint32_t f = 0; f <= KV_ALLOC_NO_TCACHE; f++) {
        for (size_t i = 0; i < sizeof caps / sizeof caps[0]; i++)
            test_capacity(caps[i], f, &seed);
        test_batch(f);
        test_refcounts(f);
        test_stats_walk(f, 300, &seed);
        test_stats_walk(f, 1000, &seed);
        test_injected(f);
        test_page_mem(f);
    }
    test_lifo();
    test_bad_ids();
    test_page_memory(4096, 64, 4096);
    test_page_memory(192, 100, 64);
    test_page_memory(64, 1, 64);
    test_id_only_pool();
    test_peak_in_cache();
    test_bad_configs();
    return kv_test_end();
}
