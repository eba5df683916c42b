/* SPDX-License-Identifier: MIT */
/*
 * test_prefix_store.c — the prefix cache in the host pool (kvpage.h,
 * "prefix cache"; store/kv_store_prefix.c) through the public API.
 *
 * Store: 2 layers, 2 kv heads, head_dim 32: 16 FP16 / 32 INT4 / 64 INT2
 * tokens per page. The K/V appended for token i of a prompt is a function of
 * (token id, i, layer, head, element), multiples of 1/256 (exact in FP16),
 * so two sequences given the same prompt hold the same values.
 *
 * Checks:
 *   - config: cache without a model fingerprint, a fingerprint without the
 *     cache, prefix_cache 2 (KV_EINVAL); the store's copy of the model;
 *   - FP16: publish 100 tokens covers 96 (6 blocks); a match of the same 100
 *     tokens attaches 96, pages shared (refcount 2 per page), K/V/positions
 *     read back bit for bit; the n - 1 cap (96 tokens -> 80); a changed
 *     token in block 3 -> 48; a salt mismatch -> 0 (and with salt 'a'
 *     published, 'a' matches and 'b' does not); not empty -> KV_ESTATE;
 *     cache off -> KV_ENOTSUP; n beyond the lists -> KV_ERANGE; idempotent
 *     publish; fork and free of a matched sequence; kv_store_check after
 *     every step; counters;
 *   - KIVI (INT2 target, R 64): nodes only at multiples of 64 (full INT2
 *     pages); a sequence that matched 128 and appends the rest holds exactly
 *     the publisher's lists (formats, tokens, values bit for bit);
 *   - policies: h2o without attention statistics publishes nodes without a
 *     snapshot and matches nothing (test_prefix_acc.c); snapkv w=40 leaves the
 *     last 40 tokens to the engine; different policies never share;
 *   - memory: with no ladder, an append the pool refuses evicts cached-only
 *     nodes (chain ends first) and succeeds; a cached prefix shared with a
 *     live sequence is evicted last; counters; the remaining chain still
 *     matches from token 0;
 *   - allocation failure (kv_fault_arm N = 1, 2, ...) in create, publish,
 *     match: KV_ENOMEM with nothing changed (nodes, lists, kv_mem bytes),
 *     or success; each call must have failed at least once.
 */
#include <stdlib.h>
#include <string.h>

#include "alloc/kv_mem.h"
#include "kv_test.h"
#include "kv_test_prefix.h"

#define NL 2
#define NKV 2
#define HD 32
#define MAXT 512

static const char MODEL[] = "test-model-fingerprint";

static kv_store_t *mk(uint32_t pages, uint32_t fmt, uint32_t resid, int cache)
{
    kv_config_t c = kv_config_default();
    c.n_layers = NL;
    c.n_q_heads = 4;
    c.n_kv_heads = NKV;
    c.head_dim = HD;
    c.host_pages = pages;
    c.max_seqs = 16;
    c.n_threads = 1;
    c.kv_format = fmt;
    c.residual = resid;
    if (cache) {
        c.prefix_cache = 1;
        c.prefix_model = MODEL;
        c.prefix_model_len = sizeof MODEL - 1;
    }
    return kvt_pfx_store(&c);
}


/* Append tokens [t0, t0+n) of prompt to every layer of seq. */
static int feed(kv_store_t *s, kv_seq_id_t seq, const int32_t *prompt, uint32_t t0, uint32_t n)
{
    return kvt_pfx_feed(s, seq, prompt, t0, n, NL, NKV, HD);
}

/* 1 if seqs a and b hold the same tokens [0, n) everywhere (bit for bit). */
static int same(kv_store_t *s, kv_seq_id_t a, kv_seq_id_t b, uint32_t n)
{
    static float ka[MAXT * HD], va[MAXT * HD], kb[MAXT * HD], vb[MAXT * HD];
    static int32_t pa[MAXT], pb[MAXT];
    for (uint32_t l = 0; l < NL; l++)
        for (uint32_t h = 0; h < NKV; h++) {
            if (kv_read(s, a, l, h, 0, n, ka, va, pa) || kv_read(s, b, l, h, 0, n, kb, vb, pb))
                return 0;
            if (memcmp(ka, kb, (size_t)n * HD * 4) || memcmp(va, vb, (size_t)n * HD * 4) ||
                memcmp(pa, pb, (size_t)n * 4))
                return 0;
        }
    return 1;
}

static uint32_t len0(kv_store_t *s, kv_seq_id_t seq)
{
    uint32_t n = 0;
    kv_seq_len(s, seq, 0, 0, &n);
    return n;
}

static void test_config(void)
{
    kv_config_t c = kv_config_default();
    c.n_layers = NL, c.n_q_heads = 4, c.n_kv_heads = NKV, c.head_dim = HD, c.host_pages = 8;
    kv_store_t *s = NULL;
    c.prefix_cache = 1;
    CHECK_EQ(kv_store_create(&c, &s), KV_EINVAL); /* no fingerprint */
    c.prefix_cache = 0;
    c.prefix_model = MODEL;
    c.prefix_model_len = 4;
    CHECK_EQ(kv_store_create(&c, &s), KV_EINVAL); /* fingerprint, cache off */
    c.prefix_cache = 2;
    CHECK_EQ(kv_store_create(&c, &s), KV_EINVAL);
    c.prefix_cache = 1;
    c.prefix_model_len = 0;
    CHECK_EQ(kv_store_create(&c, &s), KV_EINVAL);
    c.prefix_model_len = 4;
    CHECK_OK(kv_store_create(&c, &s));
    kv_config_t got;
    CHECK_OK(kv_store_config(s, &got));
    CHECK(got.prefix_model && got.prefix_model != (const void *)MODEL &&
          memcmp(got.prefix_model, MODEL, 4) == 0);
    kv_store_destroy(s);
}

static void test_fp16(void)
{
    kv_store_t *s = mk(256, KV_FMT_FP16, 0, 1);
    int32_t p[MAXT];
    kvt_pfx_prompt(p, 200, 1);
    kv_seq_id_t a, b, c, d, f;
    uint32_t m = 99;
    CHECK_OK(kv_seq_create(s, &a));
    CHECK_OK(feed(s, a, p, 0, 100));
    CHECK_EQ(kv_seq_prefix_publish(s, a, p, 101, NULL, 0), KV_ERANGE);
    CHECK_EQ(kv_seq_prefix_publish(s, a, p, 100, NULL, 0), 96);
    kv_stats_t st = kvt_pfx_stats(s);
    CHECK_EQ(st.prefix_nodes, 6);
    CHECK_EQ(st.prefix_pages, 6 * NL * NKV);
    CHECK_EQ(st.prefix_pages_only, 0); /* a holds them too */
    CHECK_EQ(st.prefix_published, 6);
    CHECK_OK(kv_store_check(s));
    CHECK_EQ(kv_seq_prefix_publish(s, a, p, 100, NULL, 0), 96); /* idempotent */
    CHECK_EQ(kvt_pfx_stats(s).prefix_nodes, 6);

    CHECK_OK(kv_seq_create(s, &b));
    CHECK_OK(kv_seq_prefix_match(s, b, p, 100, NULL, 0, &m));
    CHECK_EQ(m, 96);
    CHECK_EQ(len0(s, b), 96);
    CHECK(same(s, a, b, 96));
    const uint64_t used = kvt_pfx_stats(s).pages_used;
    CHECK_OK(kv_store_check(s));
    CHECK_OK(feed(s, b, p, 96, 4)); /* one fresh page per list */
    CHECK_EQ(kvt_pfx_stats(s).pages_used, used + NL * NKV);
    CHECK(same(s, a, b, 100));
    CHECK_OK(kv_store_check(s));
    CHECK_EQ(kv_seq_prefix_match(s, b, p, 100, NULL, 0, &m), KV_ESTATE);

    /* the n - 1 cap: 96 tokens match 80 */
    CHECK_OK(kv_seq_create(s, &c));
    CHECK_OK(kv_seq_prefix_match(s, c, p, 96, NULL, 0, &m));
    CHECK_EQ(m, 80);
    CHECK_OK(kv_seq_free(s, c));
    /* a token changed in block 3: blocks 0..2 */
    int32_t q[MAXT];
    memcpy(q, p, sizeof q);
    q[50] ^= 1;
    CHECK_OK(kv_seq_create(s, &c));
    CHECK_OK(kv_seq_prefix_match(s, c, q, 100, NULL, 0, &m));
    CHECK_EQ(m, 48);
    CHECK_OK(kv_seq_free(s, c));
    /* salts: published without a salt; 'a' misses */
    CHECK_OK(kv_seq_create(s, &c));
    CHECK_OK(kv_seq_prefix_match(s, c, p, 100, "a", 1, &m));
    CHECK_EQ(m, 0);
    CHECK_EQ(len0(s, c), 0);
    CHECK_OK(kv_seq_create(s, &d));
    CHECK_OK(feed(s, d, p, 0, 64));
    CHECK_EQ(kv_seq_prefix_publish(s, d, p, 64, "a", 1), 64);
    CHECK_OK(kv_seq_prefix_match(s, c, p, 100, "b", 1, &m));
    CHECK_EQ(m, 0);
    CHECK_OK(kv_seq_prefix_match(s, c, p, 100, "ab", 2, &m));
    CHECK_EQ(m, 0);
    CHECK_OK(kv_seq_prefix_match(s, c, p, 100, "a", 1, &m));
    CHECK_EQ(m, 64);
    /* 'a' shares d's pages, never a's: the pages of c are d's */
    CHECK(same(s, c, d, 64));
    CHECK_OK(kv_store_check(s));
    /* fork of a matched sequence, then free everything but the cache */
    CHECK_OK(kv_seq_fork(s, b, &f));
    CHECK(same(s, b, f, 100));
    CHECK_OK(kv_store_check(s));
    kv_seq_id_t all[] = {a, b, c, d, f};
    for (int i = 0; i < 5; i++)
        CHECK_OK(kv_seq_free(s, all[i]));
    st = kvt_pfx_stats(s);
    CHECK_EQ(st.prefix_nodes, 10);
    CHECK_EQ(st.prefix_pages_only, st.prefix_pages);
    CHECK_EQ(st.pages_used, st.prefix_pages);
    CHECK_EQ(st.prefix_hits, 4);
    CHECK_EQ(st.prefix_misses, 3);
    CHECK_EQ(st.prefix_tokens_reused, 96 + 80 + 48 + 64);
    CHECK_OK(kv_store_check(s));
    /* bad input */
    CHECK_EQ(kv_seq_prefix_match(s, 99, p, 10, NULL, 0, &m), KV_ENOENT);
    CHECK_EQ(kv_seq_prefix_match(s, 0, NULL, 10, NULL, 0, &m), KV_EINVAL);
    CHECK_EQ(kv_seq_prefix_match(s, 0, p, 10, NULL, 3, &m), KV_EINVAL);
    CHECK_EQ(kv_seq_prefix_match(NULL, 0, p, 10, NULL, 0, &m), KV_EINVAL);
    CHECK_EQ(kv_seq_prefix_publish(s, 0, p, 10, NULL, 0), KV_ENOENT);
    kv_store_destroy(s);

    s = mk(64, KV_FMT_FP16, 0, 0);
    CHECK_OK(kv_seq_create(s, &a));
    CHECK_EQ(kv_seq_prefix_match(s, a, p, 10, NULL, 0, &m), KV_ENOTSUP);
    CHECK_EQ(kv_seq_prefix_publish(s, a, p, 0, NULL, 0), KV_ENOTSUP);
    kv_store_destroy(s);
}

/* INT2 target, R 64: the KIVI rule. */
static void test_kivi(void)
{
    kv_store_t *s = mk(256, KV_FMT_INT2, 64, 1);
    int32_t p[MAXT];
    kvt_pfx_prompt(p, 300, 2);
    kv_seq_id_t a, b, c;
    uint32_t m;
    CHECK_OK(kv_seq_create(s, &a));
    CHECK_OK(feed(s, a, p, 0, 150)); /* [0, 128) INT2, [128, 150) FP16 */
    CHECK_EQ(kv_seq_prefix_publish(s, a, p, 150, NULL, 0), 128);
    CHECK_EQ(kvt_pfx_stats(s).prefix_nodes, 2); /* [0, 64), [64, 128) */
    CHECK_OK(feed(s, a, p, 150, 106)); /* the rest: 256 */
    CHECK_EQ(kv_seq_prefix_publish(s, a, p, 256, NULL, 0), 256);
    CHECK_EQ(kvt_pfx_stats(s).prefix_nodes, 4);
    CHECK_OK(kv_store_check(s));
    /* b matches 128 of a 150-token prompt, then appends the rest as a did */
    CHECK_OK(kv_seq_create(s, &b));
    CHECK_OK(kv_seq_prefix_match(s, b, p, 150, NULL, 0, &m));
    CHECK_EQ(m, 128);
    CHECK_OK(feed(s, b, p, 128, 128));
    CHECK(same(s, a, b, 256));
    /* a: 4 INT2 pages per list; b shares 2 and converted [128, 256) into 2 */
    CHECK_EQ(kvt_pfx_stats(s).pages_by_format[KV_FMT_INT2], (4 + 2) * NL * NKV);
    CHECK_OK(kv_store_check(s));
    /* a store whose residual differs never matches (R is in the hash) */
    kv_store_t *s2 = mk(64, KV_FMT_INT2, 128, 1);
    CHECK_OK(kv_seq_create(s2, &c));
    CHECK_OK(kv_seq_prefix_match(s2, c, p, 150, NULL, 0, &m));
    CHECK_EQ(m, 0);
    kv_store_destroy(s2);
    /* an FP16-target sequence in the INT2 store does not see INT2 nodes */
    CHECK_OK(kv_seq_create(s, &c));
    for (uint32_t l = 0; l < NL; l++)
        CHECK_OK(kv_seq_set_format(s, c, l, KV_FMT_FP16));
    CHECK_OK(kv_seq_prefix_match(s, c, p, 150, NULL, 0, &m));
    CHECK_EQ(m, 0);
    kv_store_destroy(s);
}

static void test_policies(void)
{
    kv_store_t *s = mk(256, KV_FMT_FP16, 0, 1);
    int32_t p[MAXT];
    kvt_pfx_prompt(p, 200, 3);
    kv_policy_t *h2o, *snap;
    char err[128];
    CHECK_OK(kv_policy_parse("h2o:hh=0.1,rw=0.1", &h2o, err, sizeof err));
    CHECK_OK(kv_policy_parse("snapkv:c=32,w=40", &snap, err, sizeof err));
    kv_seq_id_t a, b, c, d;
    uint32_t m;
    CHECK_OK(kv_seq_create(s, &a));
    CHECK_OK(kv_seq_set_policy(s, a, h2o));
    CHECK_OK(feed(s, a, p, 0, 128));
    /* h2o: no attention ran, so no statistics snapshot: nodes, but no
     * match (test_prefix_acc.c has the rest) */
    CHECK_EQ(kv_seq_prefix_publish(s, a, p, 128, NULL, 0), 128);
    CHECK_EQ(kvt_pfx_stats(s).prefix_nodes, 8);
    CHECK_EQ(kvt_pfx_stats(s).prefix_snapshots, 0);
    kv_seq_id_t e;
    CHECK_OK(kv_seq_create(s, &e));
    CHECK_OK(kv_seq_set_policy(s, e, h2o));
    CHECK_OK(kv_seq_prefix_match(s, e, p, 128, NULL, 0, &m));
    CHECK_EQ(m, 0);
    CHECK_OK(kv_seq_create(s, &b));
    CHECK_OK(kv_seq_set_policy(s, b, snap));
    CHECK_OK(feed(s, b, p, 0, 128));
    CHECK_EQ(kv_seq_prefix_publish(s, b, p, 128, NULL, 0), 128);
    CHECK_OK(kv_seq_prefill_end(s, b)); /* selection: the nodes keep the pages */
    CHECK_OK(kv_store_check(s));
    CHECK_OK(kv_seq_create(s, &c));
    CHECK_OK(kv_seq_set_policy(s, c, snap));
    CHECK_OK(kv_seq_prefix_match(s, c, p, 128, NULL, 0, &m));
    CHECK_EQ(m, 80); /* 128 - 40 = 88, rounded down to a block */
    CHECK_OK(kv_seq_create(s, &d)); /* no policy: another fingerprint */
    CHECK_OK(kv_seq_prefix_match(s, d, p, 128, NULL, 0, &m));
    CHECK_EQ(m, 0);
    CHECK_OK(kv_store_check(s));
    kv_policy_destroy(h2o);
    kv_policy_destroy(snap);
    kv_store_destroy(s);
}

static void test_evict(void)
{
    /* 40 pages: a prompt of 128 tokens takes 8 per list = 32 */
    kv_store_t *s = mk(40, KV_FMT_FP16, 0, 1);
    int32_t p[MAXT], q[MAXT];
    kvt_pfx_prompt(p, 200, 4);
    kvt_pfx_prompt(q, 200, 5);
    kv_seq_id_t a, b, c;
    uint32_t m;
    CHECK_OK(kv_seq_create(s, &a));
    CHECK_OK(feed(s, a, p, 0, 128));
    CHECK_EQ(kv_seq_prefix_publish(s, a, p, 128, NULL, 0), 128);
    CHECK_OK(kv_seq_free(s, a));
    CHECK_EQ(kvt_pfx_stats(s).pages_used, 32);
    /* b needs 16 pages for 64 tokens: 8 free, the cache must give 8 */
    CHECK_OK(kv_seq_create(s, &b));
    CHECK_OK(feed(s, b, q, 0, 64));
    kv_stats_t st = kvt_pfx_stats(s);
    CHECK_EQ(st.pressure_runs, 0); /* no ladder */
    CHECK(st.prefix_evicted >= 2);
    CHECK(st.prefix_evicted_pages >= 8);
    CHECK_EQ(st.prefix_nodes, 8 - st.prefix_evicted);
    CHECK_OK(kv_store_check(s));
    /* the chain's root survives: a match still finds [0, 16 * nodes) */
    CHECK_OK(kv_seq_create(s, &c));
    CHECK_OK(kv_seq_prefix_match(s, c, p, 128, NULL, 0, &m));
    CHECK_EQ(m, 16 * st.prefix_nodes);
    CHECK(m > 0);
    /* c now shares what is left; b grows until the pool is out: the
     * shared nodes go too (second pass), then KV_ENOMEM */
    int rc = 0;
    for (uint32_t t = 64; t < 192 && rc == 0; t += 16)
        rc = feed(s, b, q, t, 16);
    CHECK_EQ(rc, KV_ENOMEM);
    st = kvt_pfx_stats(s);
    CHECK_EQ(st.prefix_nodes, 0);
    CHECK_EQ(len0(s, c), m); /* c keeps its tokens */
    CHECK_OK(kv_store_check(s));
    kv_store_destroy(s);
}

static int call_publish(kv_store_t *s, kv_seq_id_t seq, void *p)
{
    int rc = kv_seq_prefix_publish(s, seq, p, 128, "t", 1);
    return rc < 0 ? rc : 0;
}

static int call_match(kv_store_t *s, kv_seq_id_t seq, void *p)
{
    uint32_t m;
    return kv_seq_prefix_match(s, seq, p, 128, "t", 1, &m);
}

static void test_faults(void)
{
    int32_t p[MAXT];
    kvt_pfx_prompt(p, 200, 6);
    /* create */
    uint32_t n;
    for (n = 1; n < 1000; n++) {
        uint64_t live = kv_mem_live_bytes();
        kv_config_t c = kv_config_default();
        c.n_layers = NL, c.n_q_heads = 4, c.n_kv_heads = NKV, c.head_dim = HD;
        c.host_pages = 64, c.n_threads = 1;
        c.prefix_cache = 1, c.prefix_model = MODEL, c.prefix_model_len = 4;
        kv_store_t *s = NULL;
        kv_fault_arm(n);
        int rc = kv_store_create(&c, &s);
        int fired = kv_fault_fired();
        kv_fault_arm(0);
        if (!fired) {
            CHECK_OK(rc);
            kv_store_destroy(s);
            break;
        }
        CHECK_EQ(rc, KV_ENOMEM);
        CHECK_EQ(kv_mem_live_bytes(), live);
    }
    printf("create: %u allocations\n", n - 1);
    CHECK(n > 1);
    kv_store_t *s = mk(128, KV_FMT_FP16, 0, 1);
    kv_seq_id_t a, b;
    CHECK_OK(kv_seq_create(s, &a));
    CHECK_OK(feed(s, a, p, 0, 128));
    n = kvt_pfx_faults(s, a, call_publish, p);
    printf("publish: %u allocations\n", n);
    CHECK(n >= 3);
    CHECK_EQ(kvt_pfx_stats(s).prefix_nodes, 8);
    CHECK_OK(kv_seq_create(s, &b));
    n = kvt_pfx_faults(s, b, call_match, p);
    printf("match: %u allocations\n", n);
    CHECK(n >= 3);
    CHECK_EQ(len0(s, b), 112);
    CHECK(same(s, a, b, 112));
    CHECK_OK(kv_store_check(s));
    kv_store_destroy(s);
}

/* An odd number of lists (3 layers x 1 kv head): scratch layouts stay
 * aligned (UBSan); values compared through kv_read. */
static void test_odd_lists(void)
{
    kv_config_t c = kv_config_default();
    c.n_layers = 3, c.n_q_heads = 2, c.n_kv_heads = 1, c.head_dim = HD, c.host_pages = 64;
    c.n_threads = 1, c.prefix_cache = 1, c.prefix_model = MODEL, c.prefix_model_len = 4;
    kv_store_t *s = NULL;
    CHECK_OK(kv_store_create(&c, &s));
    static float k[48 * HD], v[48 * HD], k2[48 * HD], v2[48 * HD];
    int32_t p[48];
    for (int i = 0; i < 48; i++)
        p[i] = i + 5;
    for (int i = 0; i < 48 * HD; i++)
        k[i] = (float)(i % 97) / 128.0f, v[i] = (float)(i % 89) / -128.0f;
    kv_seq_id_t a, b;
    uint32_t m = 0;
    CHECK_OK(kv_seq_create(s, &a));
    for (uint32_t l = 0; l < 3; l++)
        CHECK_OK(kv_append(s, a, l, 48, KV_DTYPE_F32, k, v, NULL));
    CHECK_EQ(kv_seq_prefix_publish(s, a, p, 48, NULL, 0), 48);
    CHECK_OK(kv_seq_create(s, &b));
    CHECK_OK(kv_seq_prefix_match(s, b, p, 48, NULL, 0, &m));
    CHECK_EQ(m, 32);
    for (uint32_t l = 0; l < 3; l++) {
        CHECK_OK(kv_read(s, b, l, 0, 0, 32, k2, v2, NULL));
        CHECK(memcmp(k, k2, 32 * HD * 4) == 0 && memcmp(v, v2, 32 * HD * 4) == 0);
    }
    CHECK_OK(kv_store_check(s));
    kv_store_destroy(s);
}

int main(void)
{
    uint64_t live0 = kv_mem_live_bytes();
    test_config();
    test_fp16();
    test_kivi();
    test_policies();
    test_evict();
    test_faults();
    test_odd_lists();
    CHECK_EQ(kv_mem_live_bytes(), live0);
    return kv_test_end();
}
