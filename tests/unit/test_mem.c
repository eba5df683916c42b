/* SPDX-License-Identifier: MIT */
/*
 * test_mem.c — kv_mem_* accounting and kv_fault_* injection.
 *
 * Checks: live-byte accounting through alloc/calloc/realloc/free; zero sizes
 * and count*size overflow give NULL and change nothing; realloc keeps the
 * contents and, on (injected) failure, leaves the block as it was; an armed
 * fault fires at exactly the n-th allocation, counts page allocations of
 * kv_alloc pools (a batch as one), disarms itself, and fires exactly once
 * when several threads allocate at the same time.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>

#include "alloc/kv_alloc.h"
#include "alloc/kv_mem.h"
#include "kv_test.h"

static void test_accounting(void)
{
    uint64_t base = kv_mem_live_bytes();
    unsigned char *p = kv_mem_alloc(100);
    CHECK(p != NULL);
    CHECK_EQ(kv_mem_live_bytes(), base + 100);
    for (int i = 0; i < 100; i++)
        p[i] = (unsigned char)i;
    unsigned char *q = kv_mem_realloc(p, 100, 5000);
    CHECK(q != NULL);
    CHECK_EQ(kv_mem_live_bytes(), base + 5000);
    int same = 1;
    for (int i = 0; i < 100; i++)
        same &= q[i] == (unsigned char)i;
    CHECK(same);
    q = kv_mem_realloc(q, 5000, 10);
    CHECK(q != NULL);
    CHECK_EQ(kv_mem_live_bytes(), base + 10);
    CHECK_EQ(q[9], 9);

    unsigned char *z = kv_mem_calloc(300, 7);
    CHECK(z != NULL);
    CHECK_EQ(kv_mem_live_bytes(), base + 10 + 2100);
    int zero = 1;
    for (int i = 0; i < 2100; i++)
        zero &= z[i] == 0;
    CHECK(zero);

    kv_mem_free(q, 10);
    kv_mem_free(z, 2100);
    kv_mem_free(NULL, 123); /* no-op */
    CHECK_EQ(kv_mem_live_bytes(), base);

    /* realloc(NULL) is an alloc */
    void *r = kv_mem_realloc(NULL, 0, 64);
    CHECK(r != NULL);
    CHECK_EQ(kv_mem_live_bytes(), base + 64);
    kv_mem_free(r, 64);
    CHECK_EQ(kv_mem_live_bytes(), base);
}

static void test_bad_sizes(void)
{
    uint64_t base = kv_mem_live_bytes();
    CHECK(kv_mem_alloc(0) == NULL);
    CHECK(kv_mem_calloc(0, 8) == NULL);
    CHECK(kv_mem_calloc(8, 0) == NULL);
    CHECK(kv_mem_calloc(SIZE_MAX / 2 + 1, 2) == NULL);
    CHECK(kv_mem_calloc(2, SIZE_MAX / 2 + 1) == NULL);
    CHECK(kv_mem_calloc((SIZE_MAX >> 16) + 2, 1u << 16) == NULL);
    CHECK_EQ(kv_mem_live_bytes(), base);
    /* Overflow checks are not allocations: an armed fault is not consumed. */
    kv_fault_arm(1);
    CHECK(kv_mem_calloc(SIZE_MAX, 3) == NULL);
    CHECK(!kv_fault_fired());
    kv_fault_arm(0);
}

static void test_fault_counting(void)
{
    uint64_t base = kv_mem_live_bytes();
    void *a[6] = { 0 };
    kv_fault_arm(3);
    CHECK(!kv_fault_fired());
    a[0] = kv_mem_alloc(16);
    a[1] = kv_mem_calloc(2, 16);
    CHECK(!kv_fault_fired());
    a[2] = kv_mem_alloc(16); /* the 3rd: fails */
    CHECK(a[0] != NULL);
    CHECK(a[1] != NULL);
    CHECK(a[2] == NULL);
    CHECK(kv_fault_fired());
    a[3] = kv_mem_alloc(16); /* disarmed again */
    CHECK(a[3] != NULL);
    CHECK(kv_fault_fired()); /* stays set until re-armed */
    CHECK_EQ(kv_mem_live_bytes(), base + 16 + 32 + 16);

    /* realloc counts, and a failed realloc leaves the block alone */
    memset(a[0], 0xAB, 16);
    kv_fault_arm(1);
    void *r = kv_mem_realloc(a[0], 16, 4096);
    CHECK(r == NULL);
    CHECK(kv_fault_fired());
    CHECK_EQ(((unsigned char *)a[0])[15], 0xAB);
    CHECK_EQ(kv_mem_live_bytes(), base + 16 + 32 + 16);

    /* arm(0) disarms and clears fired */
    kv_fault_arm(2);
    kv_fault_arm(0);
    CHECK(!kv_fault_fired());
    for (int i = 4; i < 6; i++) {
        a[i] = kv_mem_alloc(8);
        CHECK(a[i] != NULL);
    }
    CHECK(!kv_fault_fired());

    kv_mem_free(a[0], 16);
    kv_mem_free(a[1], 32);
    kv_mem_free(a[3], 16);
    kv_mem_free(a[4], 8);
    kv_mem_free(a[5], 8);
    CHECK_EQ(kv_mem_live_bytes(), base);
}

/* Page allocations of a pool count, a batch counts as one. */
static void test_fault_counts_pools(void)
{
    for (uint32_t flags = 0; flags <= KV_ALLOC_NO_TCACHE; flags++) {
        kv_alloc_config_t cfg = { .page_bytes = 256, .capacity = 64,
                                  .tier = KV_TIER_HOST, .flags = flags };
        kv_alloc_pool_t *pool = NULL;
        CHECK_OK(kv_alloc_pool_create(&cfg, &pool));
        if (!pool)
            return;
        kv_page_id_t id[8];
        kv_fault_arm(3);
        CHECK_OK(kv_alloc_page(pool, &id[0]));       /* 1 */
        void *m = kv_mem_alloc(32);                  /* 2 */
        CHECK(m != NULL);
        CHECK_EQ(kv_alloc_page(pool, &id[1]), KV_ENOMEM); /* 3: injected */
        CHECK(kv_fault_fired());
        CHECK_OK(kv_alloc_page(pool, &id[1]));       /* disarmed */

        kv_fault_arm(2);
        CHECK_OK(kv_alloc_pages(pool, 4, &id[2]));   /* 1: whole batch */
        CHECK(!kv_fault_fired());
        CHECK_EQ(kv_alloc_pages(pool, 2, &id[6]), KV_ENOMEM); /* 2 */
        CHECK(kv_fault_fired());
        kv_alloc_stats_t st;
        kv_alloc_stats(pool, &st);
        CHECK_EQ(st.used, 6);
        CHECK_EQ(st.failed, 2);

        /* pool creation's own allocations count too */
        kv_alloc_pool_t *p2 = NULL;
        kv_fault_arm(1);
        CHECK_EQ(kv_alloc_pool_create(&cfg, &p2), KV_ENOMEM);
        CHECK(p2 == NULL);
        CHECK(kv_fault_fired());

        kv_mem_free(m, 32);
        kv_alloc_pool_destroy(pool);
    }
}

#define KV_TEST_THREADS 4
#define KV_TEST_PER_THREAD 2000

static _Atomic int kv_test_null_count;

static void *fault_thread(void *arg)
{
    (void)arg;
    for (int i = 0; i < KV_TEST_PER_THREAD; i++) {
        void *p = kv_mem_alloc(24);
        if (!p)
            atomic_fetch_add(&kv_test_null_count, 1);
        kv_mem_free(p, 24);
    }
    return NULL;
}

/* Many threads, one armed fault: exactly one allocation fails. */
static void test_fault_threads(void)
{
    uint64_t base = kv_mem_live_bytes();
    uint64_t seed = 7;
    for (int round = 0; round < 5; round++) {
        atomic_store(&kv_test_null_count, 0);
        kv_fault_arm(1 + kv_test_rand(&seed) % (KV_TEST_THREADS * KV_TEST_PER_THREAD));
        pthread_t th[KV_TEST_THREADS];
        for (int i = 0; i < KV_TEST_THREADS; i++)
            CHECK_EQ(pthread_create(&th[i], NULL, fault_thread, NULL), 0);
        for (int i = 0; i < KV_TEST_THREADS; i++)
            pthread_join(th[i], NULL);
        CHECK_EQ(atomic_load(&kv_test_null_count), 1);
        CHECK(kv_fault_fired());
    }
    CHECK_EQ(kv_mem_live_bytes(), base);
}

int main(void)
{
    test_accounting();
    test_bad_sizes();
    test_fault_counting();
    test_fault_counts_pools();
    test_fault_threads();
    return kv_test_end();
}
