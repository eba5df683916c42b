/* SPDX-License-Identifier: MIT */
/*
 * test_store_offload_balance.c — kv_store_offload_balance and a full file:
 *   - four equal FP16 sequences (32 pages each) in a pool of 200 pages with
 *     watermarks 600/500 per mille: balance writes exactly the least
 *     recently used sequence (the one attention did not touch last), returns
 *     its page count, and the pool ends at or under the low mark; a second
 *     balance under the high mark does nothing; a new sequence pushes the
 *     pool over again and the next coldest one (skipping the one already on
 *     the file) goes;
 *   - ENOSPC: a file of 40 slots holds one sequence; kv_seq_offload of a
 *     second one returns -ENOSPC and changes nothing (residency, stats,
 *     kv_store_check), balance returns -ENOSPC when it can write nothing;
 *     freeing the first sequence makes room;
 *   - the count is balance's own (every I/O queue): writes of an earlier
 *     kv_seq_offload still in flight when balance starts (one page per I/O,
 *     one I/O at a time) are not among the pages it returns.
 */
#include "test_store_offload_util.h"

enum { TOK = 64, PAGES = KVS_LISTS * (TOK / 16) }; /* 32 pages per sequence */

static void make(kv_store_t *st, kv_seq_id_t *seq, uint64_t seed)
{
    CHECK_OK(kv_seq_create(st, seq));
    CHECK_OK(kvs_fill(st, *seq, TOK, seed, KVS_FP16));
    CHECK_EQ(kvs_res(st, *seq).pages, PAGES);
}

static void test_watermarks(const kvt_dir_t *d, uint32_t slots)
{
    char p[4096];
    kvt_path(d, "bal.kvp", p);
    kv_config_t c = kvs_config(p, 0, slots, 200);
    c.offload_high = 600; /* 120 pages */
    c.offload_low = 500;  /* 100 pages */
    kv_store_t *st;
    CHECK_OK(kv_store_create(&c, &st));
    kv_seq_id_t s[5];
    for (int i = 0; i < 4; i++)
        make(st, &s[i], 10 + (uint64_t)i);
    float out[KVS_ATTN_N];
    CHECK_OK(kvs_attn(st, s[0], out)); /* s[0] used last: s[1] is the coldest */
    CHECK_EQ(kvs_stats(st).pages_used, 4 * PAGES);

    int n = kv_store_offload_balance(st);
    CHECK_EQ(n, PAGES);
    CHECK_EQ(kvs_res(st, s[1]).on_file, PAGES);
    CHECK_EQ(kvs_res(st, s[0]).resident, PAGES);
    CHECK_EQ(kvs_res(st, s[2]).resident, PAGES);
    CHECK_EQ(kvs_res(st, s[3]).resident, PAGES);
    CHECK(kvs_stats(st).pages_used <= 100);
    CHECK_EQ(kv_store_offload_balance(st), 0); /* under the high mark */
    CHECK_OK(kv_store_check(st));

    make(st, &s[4], 20); /* 128 in use again; s[1] is on the file: s[2] next */
    kv_stats_t before = kvs_stats(st);
    n = kv_store_offload_balance(st);
    if (slots >= 2 * PAGES) {
        CHECK_EQ(n, PAGES);
        CHECK_EQ(kvs_res(st, s[2]).on_file, PAGES);
        CHECK_EQ(kvs_res(st, s[3]).resident, PAGES);
        CHECK(kvs_stats(st).pages_used <= 100);
    } else { /* the file holds one sequence: nothing fits, nothing changes */
        CHECK_EQ(n, -ENOSPC);
        kv_stats_t after = kvs_stats(st);
        CHECK_EQ(after.pages_used, before.pages_used);
        CHECK_EQ(after.pages_on_file, before.pages_on_file);
        CHECK_EQ(after.offload_slots_used, before.offload_slots_used);
        CHECK_EQ(kvs_res(st, s[2]).resident, PAGES);
        CHECK_EQ(kv_seq_offload(st, s[3]), -ENOSPC);
        CHECK_EQ(kvs_res(st, s[3]).resident, PAGES);
        CHECK_EQ(kvs_res(st, s[3]).in_flight, 0);
        CHECK_OK(kv_store_check(st));
        CHECK_OK(kv_seq_free(st, s[1])); /* room again */
        CHECK_OK(kv_seq_offload(st, s[3]));
        CHECK_OK(kv_seq_wait(st, s[3]));
        CHECK_EQ(kvs_res(st, s[3]).on_file, PAGES);
    }
    CHECK_OK(kv_store_check(st));
    kv_store_destroy(st);
    CHECK_OK(kv_offload_unlink(p));
}

/* Regression: balance returned the pages_out of every write that completed
 * while it waited, an earlier kv_seq_offload's included (so its result, and
 * whether it reported KV_EIO, depended on how far that I/O had got). */
static void test_own_count(const kvt_dir_t *d, uint32_t flags)
{
    char p[4096];
    kvt_path(d, "own.kvp", p);
    kv_config_t c = kvs_config(p, flags, 256, 200);
    c.offload_qd = 1;
    c.offload_high = 600; /* 120 pages */
    c.offload_low = 500;  /* 100 pages */
    kv_store_t *st;
    CHECK_OK(kv_store_create(&c, &st));
    CHECK_OK(kv_offload_set_max_io(st->off->file, 1)); /* one page per I/O */
    kv_seq_id_t s[5];
    for (int i = 0; i < 5; i++)
        make(st, &s[i], 30 + (uint64_t)i);
    CHECK_OK(kv_seq_offload(st, s[0])); /* 32 writes, one at a time */
    CHECK(kvs_stats(st).pages_in_flight > 0);
    /* 160 in use, 32 of them on their way out: s[0] (coldest) has nothing
     * left to write, s[1] goes and brings the pool to 96 <= 100 */
    CHECK_EQ(kv_store_offload_balance(st), PAGES);
    CHECK_EQ(kvs_res(st, s[1]).on_file, PAGES);
    CHECK_EQ(kvs_res(st, s[2]).resident, PAGES);
    CHECK_OK(kv_seq_wait(st, s[0]));
    CHECK_EQ(kvs_res(st, s[0]).on_file, PAGES);
    CHECK_EQ(kvs_stats(st).pages_used, 3 * PAGES);
    CHECK_OK(kv_store_check(st));
    kv_store_destroy(st);
    CHECK_OK(kv_offload_unlink(p));
}

int main(void)
{
    kvt_dir_t d;
    kvt_dir_make(&d);
    uint64_t live0 = kv_mem_live_bytes();
    test_watermarks(&d, 256);
    test_watermarks(&d, 40);
    uint32_t eng[2];
    int n = kvt_ioqs(&d, eng);
    for (int i = 0; i < n; i++)
        test_own_count(&d, eng[i] == KV_OFFLOAD_IOQ_PREAD ? KV_OFFLOAD_PREAD : 0);
    CHECK_EQ(kv_mem_live_bytes(), live0);
    kvt_dir_remove(&d);
    return kv_test_end();
}
