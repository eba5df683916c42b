/* SPDX-License-Identifier: MIT */
/*
 * test_prefix_ctx.c — compressed contexts in the prefix cache (kvpage.h,
 * "compressed contexts"; store/kv_store_prefix_ctx.c) through the public
 * API, without a model: the K/V of a prompt's token are a function of the
 * token (kv_test_prefix.h), the policies' decisions functions of positions
 * (StreamingLLM) or of statistics no attention call fed (H2O: all zero,
 * ties keep the older token), so two sequences given the same calls hold
 * the same bits.
 *
 * Store: 2 layers, 2 kv heads, head_dim 32, R 64 (16 FP16 / 32 INT4 tokens
 * per page). Checks, kv_store_check after every step:
 *   - per policy (streamingllm, streamingllm+int4, h2o): a publisher
 *     prefills 100 tokens, kv_seq_prefill_end, publishes; a second sequence
 *     of the same policy matches (100), holds exactly the publisher's lists
 *     (lengths, K/V and positions bit for bit), shares its pages; both then
 *     append the same 70 tokens and kv_seq_step_end: the same again; a
 *     second publish is idempotent; the node outlives the publisher;
 *   - isolation: another salt, another policy spec, a changed token, a
 *     shorter or longer context: misses, counted, nothing attached;
 *   - refused calls (nothing changed): publish before the prefill end,
 *     after a step end or an append, with n not the prompt length, without
 *     a policy, with merged pages (minicache: KV_ENOTSUP), cache off; match
 *     on a non-empty, prefill-ended or policy-less sequence; NULL, n 0;
 *   - memory: an append the pool refuses evicts the context node (its pages
 *     only the cache held) and succeeds;
 *   - allocation failures (kv_fault_arm 1, 2, ...) in publish and match:
 *     KV_ENOMEM with nothing changed, or success.
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
#define N 100

static const char MODEL[] = "test-model-fingerprint";

static kv_store_t *mk(uint32_t pages, int cache)
{
    kv_config_t c = kv_config_default();
    c.n_layers = NL;
    c.n_q_heads = 4;
    c.n_kv_heads = NKV;
    c.head_dim = HD;
    c.host_pages = pages;
    c.max_seqs = 16;
    c.n_threads = 1;
    c.residual = 64;
    if (cache) {
        c.prefix_cache = 1;
        c.prefix_model = MODEL;
        c.prefix_model_len = sizeof MODEL - 1;
    }
    return kvt_pfx_store(&c);
}

static int feed(kv_store_t *s, kv_seq_id_t seq, const int32_t *prompt, uint32_t t0, uint32_t n)
{
    return kvt_pfx_feed(s, seq, prompt, t0, n, NL, NKV, HD);
}

static kv_seq_id_t seq_with(kv_store_t *s, const char *spec)
{
    kv_seq_id_t q;
    CHECK_OK(kv_seq_create(s, &q));
    if (spec) {
        kv_policy_t *p = NULL;
        char err[128];
        CHECK_OK(kv_policy_parse(spec, &p, err, sizeof err));
        CHECK_OK(kv_seq_set_policy(s, q, p));
        kv_policy_destroy(p);
    }
    return q;
}

/* 1 if every list of a and b holds the same tokens (positions, K, V). */
static int same_lists(kv_store_t *s, kv_seq_id_t a, kv_seq_id_t b)
{
    return kvt_pfx_same_lists(s, a, b, NL, NKV, HD);
}

static uint32_t len0(kv_store_t *s, kv_seq_id_t seq)
{
    uint32_t n = 0;
    kv_seq_len(s, seq, 0, 0, &n);
    return n;
}

/* A publisher of p[0..N) under spec, prefill-ended. */
static kv_seq_id_t cold(kv_store_t *s, const char *spec, const int32_t *p)
{
    kv_seq_id_t a = seq_with(s, spec);
    CHECK_OK(feed(s, a, p, 0, N));
    CHECK_OK(kv_seq_prefill_end(s, a));
    return a;
}

static void test_hit(const char *spec)
{
    int32_t p[N + 80];
    kvt_pfx_prompt(p, N + 80, 1);
    kv_store_t *s = mk(256, 1);
    kv_seq_id_t a = cold(s, spec, p);
    CHECK(len0(s, a) < N); /* compressed */
    uint64_t used = kvt_pfx_stats(s).pages_used;
    CHECK_OK(kv_seq_prefix_publish_compressed(s, a, p, N, "t", 1));
    CHECK_OK(kv_seq_prefix_publish_compressed(s, a, p, N, "t", 1)); /* idempotent */
    kv_stats_t st = kvt_pfx_stats(s);
    CHECK_EQ(st.prefix_ctx_nodes, 1);
    CHECK_EQ(st.prefix_ctx_published, 1);
    CHECK_EQ(st.prefix_nodes, 1);
    CHECK_EQ(st.pages_used, used); /* shared, not copied */
    CHECK_OK(kv_store_check(s));

    kv_seq_id_t b = seq_with(s, spec);
    uint32_t m = 99;
    CHECK_OK(kv_seq_prefix_match_compressed(s, b, p, N, "t", 1, &m));
    CHECK_EQ(m, N);
    CHECK(same_lists(s, a, b));
    CHECK_EQ(kvt_pfx_stats(s).pages_used, used);
    CHECK_EQ(kv_seq_prefill_end(s, b), 0); /* already ended: nothing to do */
    CHECK(same_lists(s, a, b));
    /* the rest of the request, on both: the same bits (70 tokens: a KIVI
     * residual of R = 64 converts, by the target the hit carries) */
    CHECK_OK(feed(s, a, p, N, 70));
    CHECK_OK(feed(s, b, p, N, 70));
    CHECK_OK(kv_seq_step_end(s, a));
    CHECK_OK(kv_seq_step_end(s, b));
    CHECK(same_lists(s, a, b));
    CHECK_OK(kv_store_check(s));
    /* the node outlives its publisher and the first hit */
    CHECK_OK(kv_seq_free(s, a));
    CHECK_OK(kv_seq_free(s, b));
    kv_seq_id_t c = seq_with(s, spec);
    CHECK_OK(kv_seq_prefix_match_compressed(s, c, p, N, "t", 1, &m));
    CHECK_EQ(m, N);
    kv_seq_id_t d = cold(s, spec, p); /* a cold run again: the same state */
    CHECK(same_lists(s, c, d));
    st = kvt_pfx_stats(s);
    CHECK_EQ(st.prefix_ctx_hits, 2);
    CHECK_EQ(st.prefix_ctx_misses, 0);
    CHECK_EQ(st.prefix_tokens_reused, 2 * N);
    CHECK_OK(kv_store_check(s));
    printf("%s: hit of %u tokens, %u kept in list 0\n", spec, N, len0(s, c));
    kv_store_destroy(s);
}

static void test_isolation(void)
{
    const char *spec = "streamingllm:sink=4,recent=0.3";
    int32_t p[N + 1], q[N + 1];
    kvt_pfx_prompt(p, N + 1, 2);
    kv_store_t *s = mk(256, 1);
    kv_seq_id_t a = cold(s, spec, p);
    CHECK_OK(kv_seq_prefix_publish_compressed(s, a, p, N, "t", 1));
    uint32_t m = 7;
    kv_seq_id_t b = seq_with(s, spec);
    CHECK_OK(kv_seq_prefix_match_compressed(s, b, p, N, "u", 1, &m)); /* salt */
    CHECK_EQ(m, 0);
    CHECK_OK(kv_seq_prefix_match_compressed(s, b, p, N, NULL, 0, &m));
    CHECK_EQ(m, 0);
    CHECK_OK(kv_seq_prefix_match_compressed(s, b, p, N - 1, "t", 1, &m)); /* shorter */
    CHECK_EQ(m, 0);
    CHECK_OK(kv_seq_prefix_match_compressed(s, b, p, N + 1, "t", 1, &m)); /* longer */
    CHECK_EQ(m, 0);
    memcpy(q, p, sizeof q);
    q[N - 1] ^= 1; /* the last token, in the end block */
    CHECK_OK(kv_seq_prefix_match_compressed(s, b, q, N, "t", 1, &m));
    CHECK_EQ(m, 0);
    memcpy(q, p, sizeof q);
    q[3] ^= 1; /* a token of a full block */
    CHECK_OK(kv_seq_prefix_match_compressed(s, b, q, N, "t", 1, &m));
    CHECK_EQ(m, 0);
    CHECK_EQ(len0(s, b), 0);
    kv_seq_id_t c = seq_with(s, "streamingllm:sink=4,recent=0.4"); /* another spec */
    CHECK_OK(kv_seq_prefix_match_compressed(s, c, p, N, "t", 1, &m));
    CHECK_EQ(m, 0);
    /* the block match sees no context node (another kind of key) */
    CHECK_OK(kv_seq_prefix_match(s, c, p, N + 1, "t", 1, &m));
    CHECK_EQ(m, 0);
    kv_stats_t st = kvt_pfx_stats(s);
    CHECK_EQ(st.prefix_ctx_misses, 7);
    CHECK_EQ(st.prefix_ctx_hits, 0);
    CHECK_OK(kv_seq_prefix_match_compressed(s, b, p, N, "t", 1, &m));
    CHECK_EQ(m, N);
    CHECK(same_lists(s, a, b));
    CHECK_OK(kv_store_check(s));
    kv_store_destroy(s);
}

static void test_refused(void)
{
    const char *spec = "streamingllm:sink=4,recent=0.3";
    int32_t p[N + 8];
    kvt_pfx_prompt(p, N + 8, 3);
    kv_store_t *s = mk(256, 1);
    kv_seq_id_t a = seq_with(s, spec);
    CHECK_OK(feed(s, a, p, 0, N));
    CHECK_EQ(kv_seq_prefix_publish_compressed(s, a, p, N, NULL, 0), KV_ESTATE); /* no end */
    CHECK_OK(kv_seq_prefill_end(s, a));
    CHECK_EQ(kv_seq_prefix_publish_compressed(s, a, p, N - 1, NULL, 0), KV_ESTATE);
    CHECK_EQ(kv_seq_prefix_publish_compressed(NULL, a, p, N, NULL, 0), KV_EINVAL);
    CHECK_EQ(kv_seq_prefix_publish_compressed(s, a, NULL, N, NULL, 0), KV_EINVAL);
    CHECK_EQ(kv_seq_prefix_publish_compressed(s, a, p, 0, NULL, 0), KV_EINVAL);
    CHECK_EQ(kv_seq_prefix_publish_compressed(s, a, p, N, NULL, 1), KV_EINVAL);
    CHECK_EQ(kv_seq_prefix_publish_compressed(s, 15, p, N, NULL, 0), KV_ENOENT);
    kv_seq_id_t e = seq_with(s, spec); /* appended after its end */
    CHECK_OK(feed(s, e, p, 0, N));
    CHECK_OK(kv_seq_prefill_end(s, e));
    CHECK_OK(feed(s, e, p, N, 1));
    CHECK_EQ(kv_seq_prefix_publish_compressed(s, e, p, N, NULL, 0), KV_ESTATE);
    CHECK_OK(kv_seq_step_end(s, e)); /* stepped */
    CHECK_EQ(kv_seq_prefix_publish_compressed(s, e, p, N, NULL, 0), KV_ESTATE);
    kv_seq_id_t f = seq_with(s, NULL); /* no policy */
    CHECK_OK(feed(s, f, p, 0, N));
    CHECK_EQ(kv_seq_prefix_publish_compressed(s, f, p, N, NULL, 0), KV_ESTATE);
    kv_seq_id_t g = seq_with(s, "minicache:from=0"); /* merged pages */
    CHECK_OK(feed(s, g, p, 0, N));
    CHECK_OK(kv_seq_prefill_end(s, g));
    CHECK_EQ(kv_seq_prefix_publish_compressed(s, g, p, N, NULL, 0), KV_ENOTSUP);
    CHECK_EQ(kvt_pfx_stats(s).prefix_ctx_nodes, 0);
    /* match: not empty, ended, no policy */
    CHECK_OK(kv_seq_prefix_publish_compressed(s, a, p, N, NULL, 0));
    uint32_t m = 5;
    CHECK_EQ(kv_seq_prefix_match_compressed(s, a, p, N, NULL, 0, &m), KV_ESTATE);
    kv_seq_id_t h = seq_with(s, spec);
    CHECK_OK(kv_seq_prefill_end(s, h)); /* an empty prompt ended */
    CHECK_EQ(kv_seq_prefix_match_compressed(s, h, p, N, NULL, 0, &m), KV_ESTATE);
    kv_seq_id_t i = seq_with(s, NULL);
    CHECK_EQ(kv_seq_prefix_match_compressed(s, i, p, N, NULL, 0, &m), KV_ESTATE);
    kv_seq_id_t j = seq_with(s, spec);
    CHECK_EQ(kv_seq_prefix_match_compressed(s, j, p, N, NULL, 0, NULL), KV_EINVAL);
    CHECK_EQ(kv_seq_prefix_match_compressed(s, j, p, 0, NULL, 0, &m), KV_EINVAL);
    CHECK_EQ(len0(s, j), 0);
    CHECK_OK(kv_store_check(s));
    kv_store_destroy(s);
    s = mk(64, 0); /* cache off */
    a = cold(s, spec, p);
    CHECK_EQ(kv_seq_prefix_publish_compressed(s, a, p, N, NULL, 0), KV_ENOTSUP);
    kv_seq_id_t b = seq_with(s, spec);
    CHECK_EQ(kv_seq_prefix_match_compressed(s, b, p, N, NULL, 0, &m), KV_ENOTSUP);
    kv_store_destroy(s);
}

static void test_pressure(void)
{
    const char *spec = "streamingllm:sink=4,recent=0.3";
    int32_t p[MAXT];
    kvt_pfx_prompt(p, MAXT, 4);
    kv_store_t *s = mk(40, 1);
    kv_seq_id_t a = cold(s, spec, p);
    CHECK_OK(kv_seq_prefix_publish_compressed(s, a, p, N, NULL, 0));
    CHECK_OK(kv_seq_free(s, a)); /* its pages now only the cache holds */
    kv_stats_t st = kvt_pfx_stats(s);
    CHECK(st.prefix_pages_only > 0);
    CHECK_EQ(st.prefix_pages_only, st.pages_used);
    /* a sequence that needs the whole pool: the node goes */
    kv_seq_id_t b = seq_with(s, NULL);
    CHECK_OK(feed(s, b, p, 0, 16 * 40 / (NL * NKV)));
    st = kvt_pfx_stats(s);
    CHECK_EQ(st.prefix_ctx_nodes, 0);
    CHECK_EQ(st.prefix_nodes, 0);
    CHECK(st.prefix_evicted >= 1);
    kv_seq_id_t c = seq_with(s, spec);
    uint32_t m = 3;
    CHECK_OK(kv_seq_prefix_match_compressed(s, c, p, N, NULL, 0, &m));
    CHECK_EQ(m, 0);
    CHECK_OK(kv_store_check(s));
    kv_store_destroy(s);
}

static int call_publish(kv_store_t *s, kv_seq_id_t seq, void *arg)
{
    return kv_seq_prefix_publish_compressed(s, seq, arg, N, "f", 1);
}

static int call_match(kv_store_t *s, kv_seq_id_t seq, void *arg)
{
    uint32_t m = 0;
    int rc = kv_seq_prefix_match_compressed(s, seq, arg, N, "f", 1, &m);
    return rc ? rc : m == N ? 0 : KV_ECORRUPT;
}

static void test_faults(void)
{
    const char *spec = "h2o:hh=0.2,rw=0.1+int4:r=64";
    int32_t p[N];
    kvt_pfx_prompt(p, N, 5);
    kv_store_t *s = mk(256, 1);
    kv_seq_id_t a = cold(s, spec, p);
    uint32_t n = kvt_pfx_faults(s, a, call_publish, p);
    printf("publish: %u allocations\n", n);
    CHECK(n >= 3);
    CHECK_EQ(kvt_pfx_stats(s).prefix_ctx_nodes, 1);
    kv_seq_id_t b = seq_with(s, spec);
    n = kvt_pfx_faults(s, b, call_match, p);
    printf("match: %u allocations\n", n);
    CHECK(n >= 3);
    CHECK(same_lists(s, a, b));
    CHECK_OK(kv_store_check(s));
    kv_store_destroy(s);
}

int main(void)
{
    uint64_t live0 = kv_mem_live_bytes();
    test_hit("streamingllm:sink=4,recent=0.3");
    test_hit("streamingllm:sink=4,recent=0.3+int4:r=64");
    test_hit("h2o:hh=0.2,rw=0.1");
    test_isolation();
    test_refused();
    test_pressure();
    test_faults();
    CHECK_EQ(kv_mem_live_bytes(), live0);
    return kv_test_end();
}
