/* SPDX-License-Identifier: MIT */
/*
 * test_prefix_acc.c — prefix-cache statistics snapshots (store/
 * kv_store_prefix_acc.c) for the policies whose prefill end reads attention
 * summed over every prompt row: H2O, MiniKV, and StreamingLLM + CaM (CaM's
 * merge mask reads the same sums).
 *
 * Store: 2 layers, 4 query / 2 kv heads, head_dim 32 (16 FP16 tokens per
 * page). A prompt chunk is appended (K/V a function of token, index, layer,
 * head: tests/kv_test_prefix.h) and attended (kv_attn_prefill; Q likewise),
 * which is what fills a policy's accumulated attention.
 *
 * Checks:
 *   - per policy: A prefills 150 tokens in chunks [0,64) [64,128) [128,150),
 *     publishing after each: snapshots at 64 and 128 (none at 150, not a
 *     block boundary), prefix_snapshot_bytes = lists x (64 + 128) x 4;
 *     B matches 150 -> 128 (the last node with a snapshot; nodes at 144
 *     exist), prefills [128,150), kv_seq_prefill_end: every list keeps the
 *     same tokens as A's (positions, K, V bit for bit) and the selection
 *     evicted; C matches 100 -> 64 (nodes at 80, 96 have none);
 *   - no hit without a snapshot: a publisher that appended without attention
 *     makes nodes without one, and a match under its salt gets 0; a publish
 *     after kv_seq_prefill_end takes none; a later publisher that attended
 *     gives the cached node its snapshot, and then the match hits;
 *   - eviction: a small pool, the publisher freed, another sequence grows:
 *     the chain's end goes first, its snapshot's bytes with it (stats and
 *     kv_store_check), a match then stops at the remaining snapshot, and
 *     with none left matches nothing though nodes remain;
 *   - allocation failure (kv_fault_arm N = 1, 2, ...) of a publish that makes
 *     a node with a snapshot, of one that gives a cached node its snapshot,
 *     and of a match that restores one: KV_ENOMEM with nothing changed
 *     (nodes, snapshots, their bytes, the sequence, kv_mem bytes), or
 *     success; kv_store_check after each.
 */
#include <stdlib.h>
#include <string.h>

#include "alloc/kv_mem.h"
#include "kv_test.h"
#include "kv_test_prefix.h"

#define NL 2
#define NQ 4
#define NKV 2
#define HD 32
#define MAXT 256

static const char MODEL[] = "test-model-fingerprint";

static kv_store_t *mk(uint32_t pages)
{
    kv_config_t c = kv_config_default();
    c.n_layers = NL;
    c.n_q_heads = NQ;
    c.n_kv_heads = NKV;
    c.head_dim = HD;
    c.host_pages = pages;
    c.max_seqs = 16;
    c.n_threads = 1;
    c.prefix_cache = 1;
    c.prefix_model = MODEL;
    c.prefix_model_len = sizeof MODEL - 1;
    return kvt_pfx_store(&c);
}

static uint32_t len0(kv_store_t *s, kv_seq_id_t seq)
{
    uint32_t n = 0;
    kv_seq_len(s, seq, 0, 0, &n);
    return n;
}

/* Append tokens [t0, t0+n) of p to every layer of seq and attend them (all
 * n rows), as a model's prefill chunk does. */
static int step(kv_store_t *s, kv_seq_id_t seq, const int32_t *p, uint32_t t0, uint32_t n)
{
    static float q[MAXT * NQ * HD], out[MAXT * NQ * HD];
    int rc = kvt_pfx_feed(s, seq, p, t0, n, NL, NKV, HD);
    for (uint32_t l = 0; l < NL && rc == 0; l++) {
        for (uint32_t i = 0; i < n; i++)
            for (uint32_t h = 0; h < NQ; h++)
                for (uint32_t d = 0; d < HD; d++)
                    q[((size_t)i * NQ + h) * HD + d] =
                        2.0f * kvt_pfx_val(p[t0 + i], t0 + i, l, 16 + h, d, 0);
        kv_prefill_t a = {.layer = l, .seq = seq, .n_new = n, .q = q, .out = out};
        rc = kv_attn_prefill(s, &a);
    }
    return rc;
}

/* 1 if every list of a and b holds the same tokens (positions, K, V). */
static int same_lists(kv_store_t *s, kv_seq_id_t a, kv_seq_id_t b)
{
    return kvt_pfx_same_lists(s, a, b, NL, NKV, HD);
}

static kv_policy_t *policy(const char *spec)
{
    kv_policy_t *p = NULL;
    char err[128];
    if (kv_policy_parse(spec, &p, err, sizeof err)) {
        fprintf(stderr, "%s: %s\n", spec, err);
        exit(1);
    }
    return p;
}

static kv_seq_id_t seq_new(kv_store_t *s, const kv_policy_t *pol)
{
    kv_seq_id_t q;
    CHECK_OK(kv_seq_create(s, &q));
    CHECK_OK(kv_seq_set_policy(s, q, pol));
    return q;
}

static void test_policy(const char *spec)
{
    kv_store_t *s = mk(256);
    kv_policy_t *pol = policy(spec);
    int32_t p[MAXT];
    kvt_pfx_prompt(p, 150, 1);
    const uint64_t L = NL * NKV;
    uint32_t m;

    kv_seq_id_t a = seq_new(s, pol);
    CHECK_OK(step(s, a, p, 0, 64));
    CHECK_EQ(kv_seq_prefix_publish(s, a, p, 64, NULL, 0), 64);
    CHECK_EQ(kvt_pfx_stats(s).prefix_snapshots, 1);
    CHECK_OK(step(s, a, p, 64, 64));
    CHECK_EQ(kv_seq_prefix_publish(s, a, p, 128, NULL, 0), 128);
    CHECK_OK(step(s, a, p, 128, 22));
    CHECK_EQ(kv_seq_prefix_publish(s, a, p, 150, NULL, 0), 144);
    kv_stats_t st = kvt_pfx_stats(s);
    CHECK_EQ(st.prefix_nodes, 9);
    CHECK_EQ(st.prefix_snapshots, 2);
    CHECK_EQ(st.prefix_snapshot_bytes, L * (64 + 128) * 4);
    CHECK_OK(kv_store_check(s));
    CHECK_OK(kv_seq_prefill_end(s, a));
    CHECK(len0(s, a) < 150); /* the selection evicted */
    /* after prefill end: no snapshot (the sums now include nothing new, but
     * the lists were selected) */
    CHECK_EQ(kv_seq_prefix_publish(s, a, p, len0(s, a), NULL, 0) >= 0, 1);
    CHECK_EQ(kvt_pfx_stats(s).prefix_snapshots, 2);

    kv_seq_id_t b = seq_new(s, pol);
    CHECK_OK(kv_seq_prefix_match(s, b, p, 150, NULL, 0, &m));
    CHECK_EQ(m, 128);
    CHECK_OK(step(s, b, p, 128, 22));
    CHECK_OK(kv_seq_prefill_end(s, b));
    CHECK(same_lists(s, a, b));
    CHECK_OK(kv_store_check(s));

    kv_seq_id_t c = seq_new(s, pol);
    CHECK_OK(kv_seq_prefix_match(s, c, p, 100, NULL, 0, &m));
    CHECK_EQ(m, 64);
    CHECK_EQ(kvt_pfx_stats(s).prefix_hits, 2);

    /* no attention, no snapshot: nodes that never serve this policy */
    kv_seq_id_t d = seq_new(s, pol);
    CHECK_OK(kvt_pfx_feed(s, d, p, 0, 128, NL, NKV, HD));
    CHECK_EQ(kv_seq_prefix_publish(s, d, p, 128, "x", 1), 128);
    CHECK_EQ(kvt_pfx_stats(s).prefix_snapshots, 2);
    kv_seq_id_t e = seq_new(s, pol);
    CHECK_OK(kv_seq_prefix_match(s, e, p, 150, "x", 1, &m));
    CHECK_EQ(m, 0);
    CHECK_EQ(len0(s, e), 0);
    /* a publisher that attended gives the cached node at 64 its snapshot */
    kv_seq_id_t f = seq_new(s, pol);
    CHECK_OK(step(s, f, p, 0, 64));
    uint64_t nodes = kvt_pfx_stats(s).prefix_nodes;
    CHECK_EQ(kv_seq_prefix_publish(s, f, p, 64, "x", 1), 64);
    CHECK_EQ(kvt_pfx_stats(s).prefix_nodes, nodes);
    CHECK_EQ(kvt_pfx_stats(s).prefix_snapshots, 3);
    CHECK_OK(kv_seq_prefix_match(s, e, p, 150, "x", 1, &m));
    CHECK_EQ(m, 64);
    CHECK_OK(kv_store_check(s));
    kv_policy_destroy(pol);
    kv_store_destroy(s);
}

static void test_evict(void)
{
    /* A: 150 tokens = 10 pages per list (40); nodes hold 9 per list (36) */
    kv_store_t *s = mk(48);
    kv_policy_t *pol = policy("h2o:hh=0.2,rw=0.1");
    int32_t p[MAXT], q[MAXT];
    kvt_pfx_prompt(p, 150, 2);
    kvt_pfx_prompt(q, 200, 3);
    kv_seq_id_t a = seq_new(s, pol), b, c;
    for (uint32_t t = 0; t < 150; t += t < 128 ? 64 : 22) {
        uint32_t n = t < 128 ? 64 : 22;
        CHECK_OK(step(s, a, p, t, n));
        CHECK(kv_seq_prefix_publish(s, a, p, t + n, NULL, 0) >= 0);
    }
    CHECK_EQ(kvt_pfx_stats(s).prefix_snapshots, 2);
    CHECK_OK(kv_seq_free(s, a));
    CHECK_OK(kv_seq_create(s, &b));
    uint32_t t = 0, m;
    while (kvt_pfx_stats(s).prefix_snapshots == 2 && t < 200) {
        CHECK_OK(kvt_pfx_feed(s, b, q, t, 16, NL, NKV, HD));
        t += 16;
    }
    kv_stats_t st = kvt_pfx_stats(s);
    CHECK_EQ(st.prefix_snapshots, 1);
    CHECK_EQ(st.prefix_snapshot_bytes, NL * NKV * 64 * 4);
    CHECK_OK(kv_store_check(s));
    c = seq_new(s, pol);
    CHECK_OK(kv_seq_prefix_match(s, c, p, 150, NULL, 0, &m));
    CHECK_EQ(m, 64);
    CHECK_OK(kv_seq_free(s, c));
    while (kvt_pfx_stats(s).prefix_snapshots == 1 && t < 200) {
        CHECK_OK(kvt_pfx_feed(s, b, q, t, 16, NL, NKV, HD));
        t += 16;
    }
    st = kvt_pfx_stats(s);
    CHECK_EQ(st.prefix_snapshots, 0);
    CHECK_EQ(st.prefix_snapshot_bytes, 0);
    CHECK(st.prefix_nodes > 0); /* [0, 48) are left, without a snapshot */
    c = seq_new(s, pol);
    CHECK_OK(kv_seq_prefix_match(s, c, p, 150, NULL, 0, &m));
    CHECK_EQ(m, 0);
    CHECK_OK(kv_store_check(s));
    kv_policy_destroy(pol);
    kv_store_destroy(s);
}

/* ---- allocation failures -------------------------------------------------------------- */

typedef struct fcall {
    int match;           /* 1: match, else publish             */
    const int32_t *p;
    uint32_t n;
    const char *salt;
    uint32_t m;          /* match: tokens matched              */
} fcall_t;

static int fcall_run(kv_store_t *s, kv_seq_id_t seq, void *arg)
{
    fcall_t *c = arg;
    size_t sl = strlen(c->salt);
    if (c->match)
        return kv_seq_prefix_match(s, seq, c->p, c->n, c->salt, sl, &c->m);
    int rc = kv_seq_prefix_publish(s, seq, c->p, c->n, c->salt, sl);
    return rc < 0 ? rc : 0;
}

static void test_faults(void)
{
    kv_store_t *s = mk(256);
    kv_policy_t *pol = policy("minikv:hh=0.2,rw=0.1");
    int32_t p[MAXT];
    kvt_pfx_prompt(p, 150, 4);
    /* a new node with a snapshot */
    kv_seq_id_t a = seq_new(s, pol);
    CHECK_OK(step(s, a, p, 0, 64));
    fcall_t c = {.match = 0, .p = p, .n = 64, .salt = "f"};
    uint32_t n = kvt_pfx_faults(s, a, fcall_run, &c);
    printf("publish with a new snapshot node: %u allocations\n", n);
    CHECK(n >= 4);
    CHECK_EQ(kvt_pfx_stats(s).prefix_snapshots, 1);
    /* a snapshot for a cached node */
    kv_seq_id_t d = seq_new(s, pol);
    CHECK_OK(kvt_pfx_feed(s, d, p, 0, 64, NL, NKV, HD));
    CHECK_EQ(kv_seq_prefix_publish(s, d, p, 64, "g", 1), 64);
    CHECK_EQ(kvt_pfx_stats(s).prefix_snapshots, 1);
    c.salt = "g";
    n = kvt_pfx_faults(s, a, fcall_run, &c);
    printf("publish giving a cached node its snapshot: %u allocations\n", n);
    CHECK(n >= 3);
    CHECK_EQ(kvt_pfx_stats(s).prefix_snapshots, 2);
    /* a match that restores one */
    kv_seq_id_t b = seq_new(s, pol);
    c = (fcall_t){.match = 1, .p = p, .n = 100, .salt = "g"};
    n = kvt_pfx_faults(s, b, fcall_run, &c);
    printf("match restoring a snapshot: %u allocations\n", n);
    CHECK(n >= 4);
    CHECK_EQ(c.m, 64);
    CHECK_EQ(len0(s, b), 64);
    /* b continues like a: the same lists after the same rows */
    CHECK_OK(step(s, b, p, 64, 36));
    CHECK_OK(step(s, a, p, 64, 36));
    CHECK_OK(kv_seq_prefill_end(s, a));
    CHECK_OK(kv_seq_prefill_end(s, b));
    CHECK(same_lists(s, a, b));
    CHECK_OK(kv_store_check(s));
    kv_policy_destroy(pol);
    kv_store_destroy(s);
}

int main(void)
{
    uint64_t live0 = kv_mem_live_bytes();
    test_policy("h2o:hh=0.2,rw=0.1");
    test_policy("minikv:hh=0.2,rw=0.1");
    test_policy("streamingllm:sink=4,recent=32+cam:m=8");
    test_evict();
    test_faults();
    CHECK_EQ(kv_mem_live_bytes(), live0);
    return kv_test_end();
}
