/* SPDX-License-Identifier: MIT */
/*
 * test_prefix_file.c — the prefix cache's page-file tier
 * (store/kv_store_prefix_file.c) on a real page file, on both I/O queues
 * (io_uring where it runs, and pread).
 *
 * Store: 2 layers, 2 kv heads, head_dim 32 (16 FP16 tokens per page, 4
 * lists): a node of one block holds 4 pages. The K/V of token i of a
 * prompt is a function of (token id, i, layer, head, element), exact in
 * FP16, so a sequence fed the same prompt is the reference, bit for bit.
 *
 * Checks, per I/O queue:
 *   - demote: evicting the cache's nodes with a page file keeps them on the
 *     file (counters, no pool page held); a match reads them back (7 nodes,
 *     112 tokens) and the sequence equals a fed one bit for bit; demoting
 *     nodes that kept their copy writes nothing;
 *   - pressure: an append the pool refuses demotes nodes instead of
 *     dropping them; a match with no free pool page for a read-back stops
 *     at the pool's part (never a refused page, never KV_ENOMEM); with room
 *     it reads the rest;
 *   - restart: nodes on the file and host nodes (written at destroy) come
 *     back at KV_OFFLOAD_OPEN, match and equal fed sequences bit for bit;
 *     kv_store_offload_sync writes copies of host nodes; a store without
 *     the cache frees their slots (orphans);
 *   - corrupt: one byte of a page of the node at [64, 80) flipped on disk:
 *     the match stops at 64 (bit for bit), the node and its descendants are
 *     dropped and counted (prefix_file_bad), a second match gets 64 from
 *     the pool; a flipped record byte: that node and its descendants are
 *     not restored;
 *   - full file: demotion to a file with too few slots drops the nodes,
 *     counted; a sequence's page-out that finds the file full takes the
 *     slots of the cache's copies (childless pool nodes' first); a sync
 *     that finds it full writes the copies of a chain from its root (all
 *     restored, none bad);
 *   - allocation failure (kv_fault_arm N = 1, 2, ...) in demotion, in a
 *     match that reads back, and in the reopen: the store stays consistent
 *     (kv_store_check, no kv_mem leak), a match is a correct prefix or
 *     KV_ENOMEM, a reopen is KV_ENOMEM with the file untouched, or success
 *     with every node (a record chunk whose read failed is read again).
 * kv_store_check after every step.
 */
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>

#include "alloc/kv_mem.h"
#include "kv_test.h"
#include "kv_test_prefix.h"
#include "store/kv_store_int.h"
#include "store/kv_store_prefix_int.h"
#include "test_store_offload_util.h"

#define NL 2
#define NKV 2
#define HD 32
#define MAXT 256

static const char MODEL[] = "test-model-fingerprint";
static uint32_t g_flags; /* the I/O queue: 0 (io_uring if it runs) or PREAD */

static kv_config_t cfg(const char *path, uint32_t open, uint32_t slots, uint32_t pages,
                       int cache)
{
    kv_config_t c = kv_config_default();
    c.n_layers = NL;
    c.n_q_heads = 4;
    c.n_kv_heads = NKV;
    c.head_dim = HD;
    c.host_pages = pages;
    c.max_seqs = 16;
    c.n_threads = 1;
    c.flags = KV_CONFIG_NO_TCACHE;
    if (cache) {
        c.prefix_cache = 1;
        c.prefix_model = MODEL;
        c.prefix_model_len = sizeof MODEL - 1;
    }
    c.offload_path = path;
    c.offload_pages = open ? 0 : slots;
    c.offload_qd = 16;
    c.offload_flags = g_flags | (open ? KV_OFFLOAD_OPEN : 0);
    return c;
}

static kv_store_t *mk(const char *path, uint32_t open, uint32_t slots, uint32_t pages)
{
    kv_config_t c = cfg(path, open, slots, pages, 1);
    return kvt_pfx_store(&c);
}

static int feed(kv_store_t *s, kv_seq_id_t seq, const int32_t *prompt, uint32_t t0, uint32_t n)
{
    return kvt_pfx_feed(s, seq, prompt, t0, n, NL, NKV, HD);
}

/* 1 if seq holds tokens [0, n) of prompt exactly as appended (kv_read:
 * K, V bit for bit, positions 0..n-1). */
static int holds(kv_store_t *s, kv_seq_id_t seq, const int32_t *prompt, uint32_t n)
{
    static float k[MAXT * HD], v[MAXT * HD];
    static int32_t pos[MAXT];
    for (uint32_t l = 0; l < NL; l++)
        for (uint32_t h = 0; h < NKV; h++) {
            if (kv_read(s, seq, l, h, 0, n, k, v, pos))
                return 0;
            for (uint32_t i = 0; i < n; i++) {
                if (pos[i] != (int32_t)i)
                    return 0;
                for (uint32_t d = 0; d < HD; d++)
                    if (k[i * HD + d] != kvt_pfx_val(prompt[i], i, l, h, d, 0) ||
                        v[i * HD + d] != kvt_pfx_val(prompt[i], i, l, h, d, 1))
                        return 0;
            }
        }
    return 1;
}

/* A new sequence matched against prompt[0..n): its tokens (checked bit for
 * bit), freed after. */
static uint32_t match_check(kv_store_t *s, const int32_t *prompt, uint32_t n)
{
    kv_seq_id_t b;
    uint32_t m = 0;
    CHECK_OK(kv_seq_create(s, &b));
    CHECK_OK(kv_seq_prefix_match(s, b, prompt, n, NULL, 0, &m));
    CHECK_OK(kv_store_check(s));
    CHECK(holds(s, b, prompt, m));
    CHECK_OK(kv_seq_free(s, b));
    return m;
}

/* Publish prompt[0..n) from a fresh sequence, freed after. */
static void publish(kv_store_t *s, const int32_t *p, uint32_t n)
{
    kv_seq_id_t a;
    CHECK_OK(kv_seq_create(s, &a));
    CHECK_OK(feed(s, a, p, 0, n));
    CHECK_EQ(kv_seq_prefix_publish(s, a, p, n, NULL, 0), (int)(n / 16 * 16));
    CHECK_OK(kv_seq_free(s, a));
}

static void demote_all(kv_store_t *s)
{
    kv_store_prefix_evict(s, UINT64_MAX);
    CHECK_OK(kv_store_check(s));
}

/* The node of s starting at `start` (internal). */
static kv_pfx_node_t *node_at(kv_store_t *s, uint32_t start)
{
    for (kv_pfx_node_t *x = s->pfx->cold; x; x = x->next)
        if (x->start == start)
            return x;
    return NULL;
}

static void test_demote(const kvt_dir_t *d)
{
    char path[4096];
    kv_store_t *s = mk(kvt_path(d, "demote", path), 0, 256, 64);
    kv_offload_stats_t fs;
    kv_offload_stats(kv_store_off_file(s), &fs);
    printf("I/O queue: %s\n", fs.ioq);
    int32_t p[MAXT];
    kvt_pfx_prompt(p, 200, 1);
    publish(s, p, 128);
    kv_stats_t st = kvt_pfx_stats(s);
    CHECK_EQ(st.prefix_nodes, 8);
    CHECK_EQ(st.pages_used, 32);
    demote_all(s);
    st = kvt_pfx_stats(s);
    CHECK_EQ(st.prefix_nodes, 8);
    CHECK_EQ(st.prefix_file_nodes, 8);
    CHECK_EQ(st.prefix_file_demoted, 8);
    CHECK_EQ(st.prefix_pages, 0);
    CHECK_EQ(st.pages_used, 0);
    CHECK_EQ(st.prefix_file_bytes_out, 32u * st.page_bytes);
    CHECK_EQ(st.prefix_file_slots, 8u * (4 + 1)); /* 4 pages + a 1-chunk record */
    CHECK_EQ(st.offload_slots_used, st.prefix_file_slots);
    /* read back: 7 nodes (the n - 1 cap), bit for bit */
    CHECK_EQ(match_check(s, p, 128), 112);
    st = kvt_pfx_stats(s);
    CHECK_EQ(st.prefix_file_hits, 7);
    CHECK_EQ(st.prefix_file_tokens, 112);
    CHECK_EQ(st.prefix_file_bytes_in, 28u * st.page_bytes);
    CHECK_EQ(st.prefix_file_nodes, 1);
    CHECK_EQ(st.prefix_pages, 28);
    CHECK_EQ(st.prefix_file_bad, 0);
    /* a shorter prompt: the pool's part alone */
    CHECK_EQ(match_check(s, p, 50), 48);
    /* demoted again: the copies are kept, nothing written */
    demote_all(s);
    st = kvt_pfx_stats(s);
    CHECK_EQ(st.prefix_file_nodes, 8);
    CHECK_EQ(st.prefix_file_bytes_out, 32u * st.page_bytes);
    CHECK_EQ(st.prefix_file_demoted, 15);
    CHECK_EQ(match_check(s, p, 129), 128);
    CHECK_EQ(kvt_pfx_stats(s).prefix_file_hits, 15);
    kv_store_destroy(s);
    kv_offload_unlink(path);
}

static void test_pressure(const kvt_dir_t *d)
{
    char path[4096];
    /* 40 pages: the prompt's 8 nodes hold 32 */
    kv_store_t *s = mk(kvt_path(d, "pressure", path), 0, 256, 40);
    int32_t p[MAXT], q[MAXT];
    kvt_pfx_prompt(p, 200, 2);
    kvt_pfx_prompt(q, 200, 3);
    publish(s, p, 128);
    kv_seq_id_t b;
    CHECK_OK(kv_seq_create(s, &b));
    CHECK_OK(feed(s, b, q, 0, 64)); /* 16 pages: 8 free, the cache gives 8 */
    kv_stats_t st = kvt_pfx_stats(s);
    CHECK(st.prefix_file_demoted >= 2);
    CHECK_EQ(st.prefix_nodes, 8); /* none lost */
    CHECK_EQ(st.prefix_file_nodes, st.prefix_file_demoted);
    CHECK_EQ(st.prefix_evicted, st.prefix_file_demoted);
    CHECK_OK(kv_store_check(s));
    const uint32_t host = 16u * (8 - (uint32_t)st.prefix_file_nodes);
    /* the pool is full: the file's nodes cannot be read back */
    kv_seq_id_t c;
    uint32_t m;
    CHECK_OK(kv_seq_create(s, &c));
    CHECK_OK(kv_seq_prefix_match(s, c, p, 128, NULL, 0, &m));
    CHECK_EQ(m, host);
    CHECK_EQ(kvt_pfx_stats(s).prefix_file_hits, 0);
    CHECK_OK(kv_seq_free(s, c));
    CHECK_OK(kv_seq_free(s, b));
    CHECK_OK(kv_store_check(s));
    /* with room: all of it */
    CHECK_EQ(match_check(s, p, 128), 112);
    CHECK(kvt_pfx_stats(s).prefix_file_hits >= 1);
    kv_store_destroy(s);
    kv_offload_unlink(path);
}

static void test_restart(const kvt_dir_t *d)
{
    char path[4096];
    kvt_path(d, "restart", path);
    int32_t p[MAXT], q[MAXT], r[MAXT];
    kvt_pfx_prompt(p, 200, 4);
    kvt_pfx_prompt(q, 200, 5);
    kvt_pfx_prompt(r, 200, 6);
    kv_store_t *s = mk(path, 0, 256, 128);
    publish(s, p, 128);
    demote_all(s); /* p's nodes on the file */
    publish(s, q, 64); /* q's in the pool only: written at destroy */
    CHECK_EQ(kvt_pfx_stats(s).prefix_file_nodes, 8);
    kv_store_destroy(s);

    s = mk(path, 1, 0, 128);
    kv_stats_t st = kvt_pfx_stats(s);
    CHECK_EQ(st.prefix_file_restored, 12);
    CHECK_EQ(st.prefix_nodes, 12);
    CHECK_EQ(st.prefix_file_nodes, 12);
    CHECK_EQ(st.prefix_file_bad, 0);
    CHECK_OK(kv_store_check(s));
    CHECK_EQ(match_check(s, p, 128), 112);
    CHECK_EQ(match_check(s, q, 64), 48);
    CHECK_EQ(match_check(s, q, 65), 64);
    /* sync writes copies of host nodes (r's) */
    publish(s, r, 32);
    uint64_t slots0 = kvt_pfx_stats(s).prefix_file_slots;
    CHECK_OK(kv_store_offload_sync(s));
    CHECK_EQ(kvt_pfx_stats(s).prefix_file_slots, slots0 + 2 * 5);
    CHECK_OK(kv_store_check(s));
    kv_store_destroy(s);

    s = mk(path, 1, 0, 128);
    CHECK_EQ(kvt_pfx_stats(s).prefix_file_restored, 14);
    CHECK_EQ(match_check(s, r, 33), 32);
    CHECK_EQ(match_check(s, p, 129), 128);
    kv_store_destroy(s);

    /* a store without the cache: the nodes' slots are orphans, freed */
    kv_config_t c = cfg(path, 1, 0, 128, 0);
    s = kvt_pfx_store(&c);
    st = kvt_pfx_stats(s);
    CHECK_EQ(st.offload_slots_used, 0);
    CHECK_EQ(st.prefix_nodes, 0);
    CHECK_OK(kv_store_check(s));
    kv_store_destroy(s);
    s = mk(path, 1, 0, 128);
    CHECK_EQ(kvt_pfx_stats(s).prefix_file_restored, 0);
    kv_store_destroy(s);
    kv_offload_unlink(path);
}

static void test_corrupt(const kvt_dir_t *d)
{
    char path[4096];
    kvt_path(d, "corrupt", path);
    int32_t p[MAXT];
    kvt_pfx_prompt(p, 200, 7);
    kv_store_t *s = mk(path, 0, 256, 128);
    publish(s, p, 128);
    demote_all(s);
    /* a data page of node [64, 80) (on the file: its ids are slots) */
    off_t page_at = kvs_slot_off(s, node_at(s, 64)->ents[1].id, 100);
    kv_store_destroy(s);
    kvs_flip(path, page_at);

    s = mk(path, 1, 0, 128);
    CHECK_EQ(kvt_pfx_stats(s).prefix_file_restored, 8);
    CHECK_EQ(match_check(s, p, 128), 64); /* never the damaged page */
    kv_stats_t st = kvt_pfx_stats(s);
    CHECK_EQ(st.prefix_file_bad, 1);
    CHECK_EQ(st.prefix_file_hits, 4);
    CHECK_EQ(st.prefix_nodes, 4); /* [64, 80) and its descendants dropped */
    CHECK(st.io_errors >= 1);
    CHECK_EQ(match_check(s, p, 128), 64);
    /* published again, the chain is whole */
    publish(s, p, 128);
    CHECK_EQ(match_check(s, p, 128), 112);
    kv_store_destroy(s);
    kv_offload_unlink(path);
}

/* A record chunk damaged on disk: its node and descendants not restored. */
static void test_corrupt_record(const kvt_dir_t *d)
{
    char path[4096];
    kvt_path(d, "record", path);
    int32_t p[MAXT];
    kvt_pfx_prompt(p, 200, 8);
    kv_store_t *s = mk(path, 0, 256, 128);
    publish(s, p, 128);
    demote_all(s);
    /* the record chunk follows the node's 4 page slots in its copy */
    const kv_pfx_node_t *x = node_at(s, 80);
    kv_offload_entry_t fe;
    kv_offload_slot_t rec = 0;
    uint64_t n = 0;
    kv_offload_list(kv_store_off_file(s), NULL, 0, &n);
    kv_offload_entry_t *all = malloc(n * sizeof *all);
    CHECK(all != NULL);
    CHECK_OK(kv_offload_list(kv_store_off_file(s), all, n, &n));
    CHECK_OK(kv_offload_info(kv_store_off_file(s), x->ents[0].id, &fe));
    for (uint64_t i = 0; i < n; i++) /* same copy id, the record bit */
        if ((all[i].key >> 24) == (fe.key >> 24) && all[i].format == 255)
            rec = all[i].slot;
    free(all);
    CHECK(rec != 0);
    off_t at = kvs_slot_off(s, rec, 70);
    kv_store_destroy(s);
    kvs_flip(path, at);
    s = mk(path, 1, 0, 128);
    kv_stats_t st = kvt_pfx_stats(s);
    CHECK_EQ(st.prefix_file_restored, 5); /* [0, 80) */
    CHECK_EQ(st.prefix_file_bad, 1 + 2); /* the record; two orphaned children */
    CHECK_OK(kv_store_check(s));
    CHECK_EQ(match_check(s, p, 128), 80);
    kv_store_destroy(s);
    kv_offload_unlink(path);
}

static void test_full(const kvt_dir_t *d)
{
    char path[4096];
    /* 12 slots: two nodes' copies (5 slots each) fit, not a third */
    kv_store_t *s = mk(kvt_path(d, "full", path), 0, 12, 64);
    int32_t p[MAXT];
    kvt_pfx_prompt(p, 200, 9);
    publish(s, p, 64);
    demote_all(s);
    /* [48, 64) and [32, 48) go to the file; [16, 32) finds it full and is
     * dropped with its subtree on the file; then [0, 16) fits */
    kv_stats_t st = kvt_pfx_stats(s);
    CHECK_EQ(st.prefix_file_demoted, 3);
    CHECK_EQ(st.prefix_file_dropped, 1);
    CHECK_EQ(st.prefix_nodes, 1);
    CHECK_EQ(st.prefix_file_slots, 5);
    CHECK_OK(kv_store_check(s));
    /* the copies yield to a sequence's page-out */
    publish(s, p, 32);
    demote_all(s);
    CHECK_EQ(kvt_pfx_stats(s).prefix_file_nodes, 2); /* 10 of 12 slots */
    kv_seq_id_t a;
    CHECK_OK(kv_seq_create(s, &a));
    CHECK_OK(feed(s, a, p, 0, 32)); /* 8 pages */
    CHECK_OK(kv_seq_offload(s, a));
    CHECK_OK(kv_seq_wait(s, a));
    st = kvt_pfx_stats(s);
    CHECK_EQ(st.pages_on_file, 8);
    CHECK(st.prefix_file_dropped >= 3);
    CHECK_OK(kv_store_check(s));
    CHECK_OK(kv_seq_free(s, a));
    kv_store_destroy(s);
    kv_offload_unlink(path);

    /* a sync that finds the file full writes chains from their roots (a
     * copy under a parent without one could not be restored): of [0, 16),
     * [16, 32), [32, 48) in the pool, the leaf the hottest, the two roots */
    s = mk(kvt_path(d, "full-sync", path), 0, 12, 64);
    publish(s, p, 48);
    kv_store_destroy(s);
    s = mk(path, 1, 0, 64);
    st = kvt_pfx_stats(s);
    CHECK_EQ(st.prefix_file_restored, 2);
    CHECK_EQ(st.prefix_file_bad, 0);
    CHECK_OK(kv_store_check(s));
    CHECK_EQ(match_check(s, p, 49), 32);
    kv_store_destroy(s);
    kv_offload_unlink(path);

    /* a page-out that finds the file full takes the copy of the pool's
     * childless node [16, 32) before its parent's (the coldest) */
    s = mk(kvt_path(d, "full-room", path), 0, 12, 64);
    publish(s, p, 32);
    CHECK_OK(kv_store_offload_sync(s)); /* 10 of 12 slots */
    kv_seq_id_t b;
    int32_t q[MAXT];
    kvt_pfx_prompt(q, 16, 10);
    CHECK_OK(kv_seq_create(s, &b));
    CHECK_OK(feed(s, b, q, 0, 16)); /* 4 pages of its own */
    CHECK_OK(kv_seq_offload(s, b));
    CHECK_OK(kv_seq_wait(s, b));
    CHECK(node_at(s, 0) && node_at(s, 0)->copy);
    CHECK(node_at(s, 16) && !node_at(s, 16)->copy);
    CHECK_EQ(kvt_pfx_stats(s).prefix_file_dropped, 0);
    CHECK_OK(kv_store_check(s));
    CHECK_OK(kv_seq_free(s, b));
    kv_store_destroy(s);
    kv_offload_unlink(path);
}

/* ---- allocation failures ------------------------------------------------------- */

static void drop_all(kv_store_t *s)
{
    while (s->pfx->cold) {
        kv_pfx_node_t *x = s->pfx->cold;
        while (x->parent)
            x = x->parent;
        kv_pfx_drop(s, x);
    }
}

static void test_faults(const kvt_dir_t *d)
{
    char path[4096];
    kvt_path(d, "faults", path);
    int32_t p[MAXT];
    kvt_pfx_prompt(p, 200, 10);
    kv_store_t *s = mk(path, 0, 256, 128);
    /* demotion: a failed node is dropped (counted), never half-demoted */
    uint32_t n;
    for (n = 1; n < 10000; n++) {
        publish(s, p, 128);
        uint64_t live = kv_mem_live_bytes();
        kv_stats_t b = kvt_pfx_stats(s);
        kv_fault_arm(n);
        kv_store_prefix_evict(s, UINT64_MAX);
        int fired = kv_fault_fired();
        kv_fault_arm(0);
        kv_stats_t a = kvt_pfx_stats(s);
        CHECK_OK(kv_store_check(s));
        CHECK_EQ(a.pages_used, 0);
        CHECK_EQ(a.prefix_file_nodes, a.prefix_nodes);
        CHECK(a.prefix_file_demoted - b.prefix_file_demoted + a.prefix_file_dropped -
                  b.prefix_file_dropped >= 1);
        uint32_t m = match_check(s, p, 129);
        CHECK_EQ(m, 16u * (uint32_t)a.prefix_nodes);
        drop_all(s);
        CHECK_OK(kv_store_check(s));
        if (!fired)
            break;
        CHECK(kv_mem_live_bytes() <= live);
    }
    printf("demote: %u allocations\n", n - 1);
    CHECK(n > 2);
    /* a match that reads back */
    for (n = 1; n < 10000; n++) {
        publish(s, p, 128);
        demote_all(s);
        kv_seq_id_t b;
        uint32_t m = 0;
        CHECK_OK(kv_seq_create(s, &b));
        kv_fault_arm(n);
        int rc = kv_seq_prefix_match(s, b, p, 128, NULL, 0, &m);
        int fired = kv_fault_fired();
        kv_fault_arm(0);
        CHECK(rc == 0 || rc == KV_ENOMEM);
        CHECK_OK(kv_store_check(s));
        if (rc == 0)
            CHECK(holds(s, b, p, m));
        CHECK_OK(kv_seq_free(s, b));
        if (!fired) {
            CHECK_EQ(m, 112);
            break;
        }
        drop_all(s);
    }
    printf("match: %u allocations\n", n - 1);
    CHECK(n > 2);
    kv_store_destroy(s);
    /* the reopen */
    for (n = 1; n < 10000; n++) {
        uint64_t live = kv_mem_live_bytes();
        kv_config_t c = cfg(path, 1, 0, 128, 1);
        kv_store_t *t = NULL;
        kv_fault_arm(n);
        int rc = kv_store_create(&c, &t);
        int fired = kv_fault_fired();
        kv_fault_arm(0);
        if (!fired) {
            CHECK_OK(rc);
            CHECK_EQ(kvt_pfx_stats(t).prefix_file_restored, 8);
            CHECK_OK(kv_store_check(t));
            CHECK_EQ(match_check(t, p, 128), 112);
            kv_store_destroy(t);
            break;
        }
        if (rc == 0) { /* a failed read of a record chunk, tried again */
            CHECK_EQ(kvt_pfx_stats(t).prefix_file_restored, 8);
            CHECK_OK(kv_store_check(t));
            kv_store_destroy(t);
            continue;
        }
        CHECK_EQ(rc, KV_ENOMEM);
        CHECK_EQ(kv_mem_live_bytes(), live);
    }
    printf("reopen: %u allocations\n", n - 1);
    CHECK(n > 2);
    kv_offload_unlink(path);
}

int main(void)
{
    kvt_dir_t d;
    kvt_dir_make(&d);
    static const uint32_t queues[2] = {0, KV_OFFLOAD_PREAD};
    for (int q = 0; q < 2; q++) {
        g_flags = queues[q];
        test_demote(&d);
        test_pressure(&d);
        test_restart(&d);
        test_corrupt(&d);
        test_corrupt_record(&d);
        test_full(&d);
        test_faults(&d);
    }
    kvt_dir_remove(&d);
    return kv_test_end();
}
