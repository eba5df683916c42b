/* SPDX-License-Identifier: MIT */
/*
 * test_api_estimate.c — kv_config_estimate and the metadata cap of
 * kv_store_create (kvpage.h, "store"):
 *   - the estimate validates like kv_store_create (same errors, nothing
 *     allocated) and its parts are what a store then holds: meta_bytes
 *     right after create is meta_fixed less the pool's arrays (which
 *     kv_stats does not count), and each sequence adds exactly meta_per_seq;
 *   - the largest documented shape, 4096 layers x 1024 kv heads x head_dim
 *     1024, at the default max_seqs needs 4M list headers per sequence:
 *     meta_max is over 200 GiB, and where that exceeds physical memory
 *     (meta_cap) kv_store_create returns KV_ENOMEM at once, allocating
 *     nothing (no metadata bytes live after it); with max_seqs 4 it fits.
 */
#include <time.h>

#include "alloc/kv_mem.h"
#include "kv_test.h"

static kv_config_t shape(uint32_t layers, uint32_t kvh, uint32_t d, uint64_t pages)
{
    kv_config_t c = kv_config_default();
    c.n_layers = layers;
    c.n_q_heads = kvh;
    c.n_kv_heads = kvh;
    c.head_dim = d;
    c.host_pages = pages;
    c.n_threads = 1;
    return c;
}

static void test_parts(void)
{
    kv_config_t c = shape(30, 3, 64, 4096);
    c.max_seqs = 16;
    kv_estimate_t e;
    CHECK_OK(kv_config_estimate(&c, &e));
    CHECK(e.meta_per_seq >= 30u * 3u * 48u && e.meta_per_seq <= 30u * 3u * 64u);
    CHECK_EQ(e.kv_max, 4096ull * 64u * 64u);
    CHECK(e.meta_max == e.meta_fixed + 16 * e.meta_per_seq + 4096 * e.meta_per_page);
    CHECK(e.meta_cap > 0);
    kv_store_t *st;
    CHECK_OK(kv_store_create(&c, &st));
    kv_stats_t s0 = {.struct_size = sizeof s0}, s1 = {.struct_size = sizeof s1};
    kv_store_stats(st, &s0);
    /* kv_stats counts the tables, not the pool's arrays (8 bytes a page) */
    CHECK(s0.meta_bytes + 4096 * 8 <= e.meta_fixed);
    CHECK(s0.meta_bytes + 4096 * 8 + 4096 >= e.meta_fixed);
    kv_seq_id_t q[3];
    for (int i = 0; i < 3; i++)
        CHECK_OK(kv_seq_create(st, &q[i]));
    kv_store_stats(st, &s1);
    CHECK_EQ(s1.meta_bytes - s0.meta_bytes, 3 * e.meta_per_seq);
    kv_store_destroy(st);
    /* the same errors as kv_store_create */
    kv_config_t bad = c;
    bad.n_q_heads = 4;
    CHECK_EQ(kv_config_estimate(&bad, &e), KV_EINVAL);
    bad = c;
    bad.host_pages = (1ull << 26) + 1;
    CHECK_EQ(kv_config_estimate(&bad, &e), KV_ERANGE);
    bad = c;
    bad.struct_size = 4;
    CHECK_EQ(kv_config_estimate(&bad, &e), KV_EVERSION);
    CHECK_EQ(kv_config_estimate(NULL, &e), KV_EINVAL);
    CHECK_EQ(kv_config_estimate(&c, NULL), KV_EINVAL);
}

static void test_cap(void)
{
    kv_config_t c = shape(4096, 1024, 1024, 1024);
    kv_estimate_t e;
    CHECK_OK(kv_config_estimate(&c, &e));
    CHECK(e.meta_per_seq >= 4096ull * 1024 * 48);
    CHECK(e.meta_max > 200ull << 30); /* 1024 sequences */
    uint64_t live0 = kv_mem_live_bytes();
    kv_store_t *st = NULL;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    int rc = kv_store_create(&c, &st);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    if (e.meta_max > e.meta_cap) {
        CHECK_EQ(rc, KV_ENOMEM);
        CHECK(st == NULL);
        CHECK_EQ(kv_mem_live_bytes(), live0); /* nothing was allocated */
        double s = (double)(t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) * 1e-9;
        CHECK(s < 1.0);
    } else { /* a machine with that much memory: it is created */
        CHECK_OK(rc);
        kv_store_destroy(st);
    }
    c.max_seqs = 4;
    CHECK_OK(kv_config_estimate(&c, &e));
    CHECK(e.meta_max < e.meta_cap);
    CHECK_OK(kv_store_create(&c, &st));
    kv_seq_id_t q;
    CHECK_OK(kv_seq_create(st, &q));
    kv_stats_t s = {.struct_size = sizeof s};
    kv_store_stats(st, &s);
    CHECK(s.meta_bytes >= e.meta_per_seq);
    kv_store_destroy(st);
}

int main(void)
{
    test_parts();
    test_cap();
    return kv_test_end();
}
