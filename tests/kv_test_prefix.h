/* SPDX-License-Identifier: MIT */
/*
 * kv_test_prefix.h — what the prefix-cache tests share: a store created or
 * the test ended, and the K/V a prompt's token gets (a function of the token
 * id, its index, layer, head and element, multiples of 1/256 in [-1, 1):
 * exact in FP16), appended to every layer of a sequence; and the loop that
 * fails every allocation of a prefix call in turn; the store's stats and
 * the token ids of a test prompt.
 */
#ifndef KV_TEST_PREFIX_H
#define KV_TEST_PREFIX_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alloc/kv_mem.h"
#include "kv_test.h"
#include "kvpage/kvpage.h"

/* kv_store_create, or exit(1) with the reason. */
static inline kv_store_t *kvt_pfx_store(const kv_config_t *c)
{
    kv_store_t *s = NULL;
    int rc = kv_store_create(c, &s);
    if (rc) {
        fprintf(stderr, "kv_store_create: %s\n", kv_strerror(rc));
        exit(1);
    }
    return s;
}

/* The store's statistics (kv_store_stats cannot fail on a live store). */
static inline kv_stats_t kvt_pfx_stats(kv_store_t *s)
{
    kv_stats_t st = {.struct_size = sizeof st};
    kv_store_stats(s, &st);
    return st;
}

/* n token ids of a test prompt, different per seed. */
static inline void kvt_pfx_prompt(int32_t *p, uint32_t n, uint32_t seed)
{
    for (uint32_t i = 0; i < n; i++)
        p[i] = (int32_t)((i * 7919u + seed * 104729u) % 49152u);
}

/* Element d of the K (v 0) or V (v 1) row of token tok at index i. */
static inline float kvt_pfx_val(int32_t tok, uint32_t i, uint32_t l, uint32_t h, uint32_t d,
                                int v)
{
    uint32_t x = (uint32_t)tok * 2654435761u ^ i * 40503u ^ l * 977u ^ h * 131u ^ d * 7u ^
                 (uint32_t)v * 0x9e37u;
    x ^= x >> 13;
    x *= 0x5bd1e995u;
    x ^= x >> 15;
    return (float)((int)(x % 512u) - 256) / 256.0f;
}

/* Append tokens [t0, t0+n) of prompt to every layer of seq (nl layers, nkv
 * kv heads, hd elements): 0 or the first kv_append error. */
static inline int kvt_pfx_feed(kv_store_t *s, kv_seq_id_t seq, const int32_t *prompt,
                               uint32_t t0, uint32_t n, uint32_t nl, uint32_t nkv, uint32_t hd)
{
    size_t cnt = (size_t)n * nkv * hd;
    float *k = malloc(cnt * sizeof *k), *v = malloc(cnt * sizeof *v);
    int rc = k && v ? 0 : KV_ENOMEM;
    for (uint32_t l = 0; l < nl && rc == 0; l++) {
        for (uint32_t i = 0; i < n; i++)
            for (uint32_t h = 0; h < nkv; h++)
                for (uint32_t d = 0; d < hd; d++) {
                    size_t o = ((size_t)i * nkv + h) * hd + d;
                    k[o] = kvt_pfx_val(prompt[t0 + i], t0 + i, l, h, d, 0);
                    v[o] = kvt_pfx_val(prompt[t0 + i], t0 + i, l, h, d, 1);
                }
        rc = kv_append(s, seq, l, n, KV_DTYPE_F32, k, v, NULL);
    }
    free(k);
    free(v);
    return rc;
}

/* 1 if every list of seqs a and b (nl layers, nkv kv heads, hd elements)
 * holds the same tokens: count, K, V and positions, bit for bit. */
static inline int kvt_pfx_same_lists(kv_store_t *s, kv_seq_id_t a, kv_seq_id_t b,
                                     uint32_t nl, uint32_t nkv, uint32_t hd)
{
    return kvt_seq_same(s, a, s, b, nl, nkv, hd);
}

/* A prefix call on (s, seq) with the test's arguments: 0 or an error. */
typedef int (*kvt_pfx_call_fn)(kv_store_t *s, kv_seq_id_t seq, void *arg);

/* Fail every kv_mem allocation of fn in turn (kv_fault_arm 1, 2, ...): each
 * must give KV_ENOMEM with nothing changed (nodes, snapshots and their
 * bytes, hits, pages, seq's length, kv_mem bytes; kv_store_check passes),
 * until a run that fails none succeeds. Returns the allocations found. */
static inline uint32_t kvt_pfx_faults(kv_store_t *s, kv_seq_id_t seq, kvt_pfx_call_fn fn,
                                      void *arg)
{
    for (uint32_t n = 1; n < 10000; n++) {
        kv_stats_t b = {.struct_size = sizeof b}, a = {.struct_size = sizeof a};
        uint32_t len = 0, len2 = 0;
        kv_store_stats(s, &b);
        kv_seq_len(s, seq, 0, 0, &len);
        uint64_t live = kv_mem_live_bytes();
        kv_fault_arm(n);
        int rc = fn(s, seq, arg);
        int fired = kv_fault_fired();
        kv_fault_arm(0);
        if (!fired) {
            CHECK_OK(rc);
            CHECK_OK(kv_store_check(s));
            return n - 1;
        }
        CHECK_EQ(rc, KV_ENOMEM);
        kv_store_stats(s, &a);
        kv_seq_len(s, seq, 0, 0, &len2);
        CHECK_EQ(a.prefix_nodes, b.prefix_nodes);
        CHECK_EQ(a.prefix_snapshots, b.prefix_snapshots);
        CHECK_EQ(a.prefix_snapshot_bytes, b.prefix_snapshot_bytes);
        CHECK_EQ(a.prefix_hits, b.prefix_hits);
        CHECK_EQ(a.pages_used, b.pages_used);
        CHECK_EQ(len2, len);
        CHECK_EQ(kv_mem_live_bytes(), live);
        CHECK_OK(kv_store_check(s));
    }
    CHECK(0);
    return 0;
}

#endif /* KV_TEST_PREFIX_H */
