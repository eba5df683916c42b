/* SPDX-License-Identifier: MIT */
/*
 * test_remote_prefix.c — the prefix cache's remote tier (docs/prefix.md;
 * store/kv_store_prefix_remote.c) against real redis-server processes
 * (scripts/kv_redis.sh): one server, then a 3-master cluster.
 *
 * Two stores stand for two engine processes sharing one Redis: store A
 * publishes a 128-token prompt (8 nodes, queued to the publisher, flushed);
 * store B, with an empty host tier, matches it: 112 tokens (the n - 1 cap)
 * come from the remote (7 nodes fetched, validated, installed), and B's
 * lists read back bit for bit as A's; a second match in B is a host hit
 * (no remote key asked). Then, on the single server:
 *   - salt: a match under another salt gets nothing;
 *   - a value that passes the frame's crc but carries an Inf in a page (the
 *     frame rebuilt around the changed payload): a new store matches only
 *     the nodes before it, the bad one counted (prefix_remote_bad), no
 *     wrong token; garbage bytes under every key: nothing matched, counted;
 *   - old magic: values whose node record carries "KVPN" (the remote
 *     record's magic before "KVPR") are refused, a miss counted in
 *     prefix_remote_bad; the same values with "KVPR" are taken;
 *   - the server stopped (SIGSTOP): a match returns within the timeout
 *     (200 ms, checked < 2 s) as a miss, counted (prefix_remote_errors);
 *     SIGCONT: served again;
 *   - H2O: a publish with a statistics snapshot queues nothing for the
 *     remote, and a match under H2O in another store gets nothing from it;
 *   - KIVI INT2 (R 64): a 64-token node fetched, its INT2 pages bit for bit;
 *   - cluster: the same sharing; then every allocation of a fetching match
 *     failed in turn (kv_fault_arm): KV_ENOMEM, or success with every
 *     matched token right (a failure inside the fetch is a shorter match);
 *   - kv_store_check after every step; nothing leaks (ASan run).
 */
#include <signal.h>
#include <string.h>
#include <time.h>

#include "alloc/kv_mem.h"
#include "kv_test.h"
#include "kv_test_prefix.h"
#include "kv_test_redis.h"
#include "remote/kv_remote.h"
#include "util/kv_le.h"
#include "util/kv_rec.h"

#define NL 2
#define NKV 2
#define HD 32
#define NTOK 128

static const char MODEL[] = "remote-test-model";

static uint32_t g_fmt = KV_FMT_FP16; /* stores' kv_format (R 64 for INT2) */

static kv_store_t *mk(const char *url, uint32_t timeout_ms)
{
    kv_config_t c = kv_config_default();
    c.kv_format = g_fmt;
    c.residual = 64;
    c.n_layers = NL, c.n_q_heads = 4, c.n_kv_heads = NKV, c.head_dim = HD;
    c.host_pages = 256, c.max_seqs = 8, c.n_threads = 1;
    c.prefix_cache = 1, c.prefix_model = MODEL, c.prefix_model_len = sizeof MODEL - 1;
    c.prefix_remote = url;
    c.prefix_remote_timeout_ms = timeout_ms;
    return kvt_pfx_store(&c);
}


static void feed(kv_store_t *s, kv_seq_id_t seq, const int32_t *p, uint32_t n)
{
    CHECK_OK(kvt_pfx_feed(s, seq, p, 0, n, NL, NKV, HD));
}

/* 1 if seq of store s holds exactly the values feed() gives for [0, n). */
static int holds(kv_store_t *s, kv_seq_id_t seq, const int32_t *p, uint32_t n)
{
    static float k[NTOK * HD], v[NTOK * HD];
    for (uint32_t l = 0; l < NL; l++)
        for (uint32_t h = 0; h < NKV; h++) {
            uint32_t len = 0;
            if (kv_seq_len(s, seq, l, h, &len) || len != n ||
                kv_read(s, seq, l, h, 0, n, k, v, NULL))
                return 0;
            for (uint32_t i = 0; i < n; i++)
                for (uint32_t d = 0; d < HD; d++)
                    if (k[i * HD + d] != kvt_pfx_val(p[i], i, l, h, d, 0) ||
                        v[i * HD + d] != kvt_pfx_val(p[i], i, l, h, d, 1))
                        return 0;
        }
    return 1;
}

int kv_store_prefix_flush(kv_store_t *s, uint32_t timeout_ms); /* store/kv_store_int.h */

/* A publishes, B fetches: the shared part of both runs. Returns B. */
static kv_store_t *share(const char *url, const int32_t *p, const char *salt)
{
    kv_store_t *a = mk(url, 1000), *b = mk(url, 1000);
    kv_seq_id_t sa, sb;
    uint32_t m = 0;
    size_t sl = salt ? strlen(salt) : 0;
    CHECK_OK(kv_seq_create(a, &sa));
    feed(a, sa, p, NTOK);
    CHECK_EQ(kv_seq_prefix_publish(a, sa, p, NTOK, salt, sl), NTOK);
    CHECK_OK(kv_store_prefix_flush(a, 5000));
    kv_stats_t st = kvt_pfx_stats(a);
    CHECK_EQ(st.prefix_remote_put, 8);
    CHECK_EQ(st.prefix_remote_dropped, 0);
    CHECK_OK(kv_seq_create(b, &sb));
    CHECK_OK(kv_seq_prefix_match(b, sb, p, NTOK, salt, sl, &m));
    CHECK_EQ(m, 112);
    CHECK(holds(b, sb, p, 112));
    st = kvt_pfx_stats(b);
    CHECK_EQ(st.prefix_remote_hits, 7);
    CHECK_EQ(st.prefix_remote_tokens, 112);
    CHECK_EQ(st.prefix_remote_bad, 0);
    CHECK_EQ(st.prefix_nodes, 7);
    CHECK_OK(kv_store_check(b));
    /* again: the host tier answers */
    kv_seq_id_t s2;
    CHECK_OK(kv_seq_create(b, &s2));
    CHECK_OK(kv_seq_prefix_match(b, s2, p, NTOK, salt, sl, &m));
    CHECK_EQ(m, 112);
    CHECK_EQ(kvt_pfx_stats(b).prefix_remote_hits, 7);
    CHECK_OK(kv_seq_free(b, s2));
    CHECK_OK(kv_seq_free(b, sb));
    kv_store_destroy(a);
    return b;
}

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* Call fn on a copy of every kvp:* value longer than min bytes and SET the
 * copy where fn returns 1. Returns values rewritten. */
typedef int (*rewrite_fn)(uint8_t *v, size_t n, void *arg);
static int rewrite_all(const kv_tredis_t *t, size_t min, rewrite_fn fn, void *arg)
{
    redisReply *keys = kv_tredis_cmd(t, 0, "KEYS kvp:*");
    int n = 0;
    for (size_t i = 0; keys && keys->type == REDIS_REPLY_ARRAY && i < keys->elements; i++) {
        const char *k = keys->element[i]->str;
        redisReply *v = kv_tredis_cmd(t, 0, "GET %s", k);
        if (v && v->type == REDIS_REPLY_STRING && v->len > min) {
            uint8_t *buf = malloc(v->len);
            memcpy(buf, v->str, v->len);
            if (fn(buf, v->len, arg)) {
                redisReply *r = kv_tredis_cmd(t, 0, "SET %s %b", k, buf, (size_t)v->len);
                n += r && r->type == REDIS_REPLY_STATUS;
                freeReplyObject(r);
            }
            free(buf);
        }
        freeReplyObject(v);
    }
    freeReplyObject(keys);
    return n;
}

/* Rebuild the (unsigned) frame of value v around its payload of plen bytes. */
static void reframe(uint8_t *v, size_t plen)
{
    kv_remote_key_t key;
    memcpy(key.hash, v + 24, 32);
    struct iovec iov = {v + KV_REC_FRAME_BYTES, plen};
    CHECK_OK(kv_remote_frame_header("kvp", &key, kv_le_get32(v + 8), &iov, 1, plen, v));
}

/* *(int *)how 0: an Inf in the payload's first page, frame rebuilt (passes
 * the crc); 1: garbage. */
static int spoil(uint8_t *v, size_t n, void *how)
{
    if (*(const int *)how == 0) {
        uint8_t *pay = v + KV_REC_FRAME_BYTES;
        size_t plen = n - KV_REC_FRAME_BYTES;
        size_t meta = plen - (size_t)NL * NKV * 64 * HD; /* one page per list */
        pay[meta + 1] = 0x7C, pay[meta] = 0; /* +Inf as the first K value */
        reframe(v, plen);
    } else {
        memset(v + 10, 0xA5, 40);
    }
    return 1;
}

/* Rewrite every kvp:* value as spoil(how). Returns keys rewritten. */
static int corrupt_all(const kv_tredis_t *t, int how)
{
    return rewrite_all(t, KV_REC_FRAME_BYTES + 200, spoil, &how);
}

/* Value v's node record magic ft[0] -> ft[1] (frame rebuilt); 0 (left
 * alone) for a value that is not well framed or has another magic. */
static int swap_magic(uint8_t *v, size_t n, void *ft_)
{
    const uint32_t *ft = ft_;
    const uint8_t *pay = NULL;
    size_t plen = 0;
    uint32_t fmt = 0;
    kv_remote_key_t key;
    memcpy(key.hash, v + 24, 32);
    if (kv_remote_frame_check("kvp", &key, v, n, &pay, &plen, &fmt) || kv_le_get32(pay) != ft[0])
        return 0;
    CHECK(ft[0] != KV_REC_REMOTE_MAGIC || memcmp(pay, "KVPR", 4) == 0); /* the bytes */
    kv_le_put32(v + KV_REC_FRAME_BYTES, ft[1]);
    reframe(v, plen);
    return 1;
}

/* Rewrite the node record's magic from `from` to `to` in every well-framed
 * kvp:* value whose record carries `from`. Returns values rewritten. */
static int remagic(const kv_tredis_t *t, uint32_t from, uint32_t to)
{
    uint32_t ft[2] = {from, to};
    return rewrite_all(t, KV_REC_FRAME_BYTES + 4, swap_magic, ft);
}

/* Values of the node record's layout under "KVPN", the magic kvpage wrote
 * before the remote record had its own ("KVPR"), are refused: a miss,
 * counted bad. The same values given back their "KVPR" magic are taken
 * (so the refusal is the magic's alone). */
static void test_old_magic(const kv_tredis_t *t, const int32_t *p)
{
    const uint32_t old = KV_REC_MAGIC('K', 'V', 'P', 'N');
    kv_store_t *b = share(t->url, p, "old");
    kv_store_destroy(b);
    CHECK_EQ(remagic(t, KV_REC_REMOTE_MAGIC, old), 8);
    for (int pass = 0; pass < 2; pass++) {
        b = mk(t->url, 1000);
        kv_seq_id_t s;
        uint32_t m = 99;
        CHECK_OK(kv_seq_create(b, &s));
        CHECK_OK(kv_seq_prefix_match(b, s, p, NTOK, "old", 3, &m));
        kv_stats_t st = kvt_pfx_stats(b);
        CHECK_EQ(m, pass ? 112 : 0);
        CHECK(pass ? holds(b, s, p, 112) : 1);
        CHECK_EQ(st.prefix_remote_bad, pass ? 0 : 1); /* the first node: refused */
        CHECK_EQ(st.prefix_remote_hits, pass ? 7 : 0);
        CHECK_EQ(st.prefix_nodes, pass ? 7 : 0);
        CHECK_OK(kv_store_check(b));
        kv_store_destroy(b);
        if (!pass)
            CHECK_EQ(remagic(t, old, KV_REC_REMOTE_MAGIC), 8);
    }
}

int main(void)
{
    int32_t p[NTOK], q[NTOK];
    for (uint32_t i = 0; i < NTOK; i++)
        p[i] = (int32_t)(i * 7919u % 30000u), q[i] = (int32_t)(i * 104729u % 30000u);
    static kv_tredis_t t, c; /* static: the atexit handler reads them */
    kv_tredis_start(&t, "single");
    kv_store_t *b = share(t.url, p, NULL);
    kv_seq_id_t s;
    uint32_t m = 99;
    /* salt */
    CHECK_OK(kv_seq_create(b, &s));
    CHECK_OK(kv_seq_prefix_match(b, s, q, NTOK, "x", 1, &m));
    CHECK_EQ(m, 0);
    CHECK_OK(kv_seq_free(b, s));
    kv_store_destroy(b);
    /* corrupt values: another prompt, published with salt "c" */
    b = share(t.url, q, "c");
    kv_store_destroy(b);
    CHECK_EQ(corrupt_all(&t, 0), 16); /* p's 8 and q's 8 */
    b = mk(t.url, 1000);
    CHECK_OK(kv_seq_create(b, &s));
    CHECK_OK(kv_seq_prefix_match(b, s, q, NTOK, "c", 1, &m));
    CHECK_EQ(m, 0); /* the first node is bad: nothing */
    kv_stats_t st = kvt_pfx_stats(b);
    CHECK_EQ(st.prefix_remote_bad, 1);
    CHECK_EQ(st.prefix_remote_hits, 0);
    CHECK_EQ(st.prefix_nodes, 0);
    CHECK_EQ(corrupt_all(&t, 1), 16);
    CHECK_OK(kv_seq_prefix_match(b, s, p, NTOK, NULL, 0, &m));
    CHECK_EQ(m, 0);
    CHECK_EQ(kvt_pfx_stats(b).prefix_remote_bad, 1 + 7); /* the frame's crc, every key of the batch */
    CHECK_OK(kv_store_check(b));
    kv_store_destroy(b);
    test_old_magic(&t, p);
    /* H2O (statistics snapshots, kv_store_prefix_acc.c): nodes with a
     * snapshot are not sent (a fetched node would have none), and a match
     * under H2O asks nothing of the remote */
    {
        kv_store_t *a = mk(t.url, 1000);
        b = mk(t.url, 1000);
        kv_policy_t *h2o = NULL;
        char err[64];
        CHECK_OK(kv_policy_parse("h2o:hh=0.2,rw=0.1", &h2o, err, sizeof err));
        kv_seq_id_t sa;
        CHECK_OK(kv_seq_create(a, &sa));
        CHECK_OK(kv_seq_set_policy(a, sa, h2o));
        feed(a, sa, p, NTOK);
        static float qo[NTOK * 4 * HD];
        for (uint32_t l = 0; l < NL; l++) { /* fills the attention sums */
            for (uint32_t i = 0; i < NTOK * 4 * HD; i++)
                qo[i] = (float)((i * 37u + l) % 17u) / 16.0f;
            kv_prefill_t pa = {.layer = l, .seq = sa, .n_new = NTOK, .q = qo, .out = qo};
            CHECK_OK(kv_attn_prefill(a, &pa));
        }
        CHECK_EQ(kv_seq_prefix_publish(a, sa, p, NTOK, NULL, 0), NTOK);
        CHECK_OK(kv_store_prefix_flush(a, 5000));
        st = kvt_pfx_stats(a);
        CHECK_EQ(st.prefix_snapshots, 1);
        CHECK_EQ(st.prefix_remote_put, 0);
        kv_seq_id_t sb2;
        CHECK_OK(kv_seq_create(b, &sb2));
        CHECK_OK(kv_seq_set_policy(b, sb2, h2o));
        CHECK_OK(kv_seq_prefix_match(b, sb2, p, NTOK, NULL, 0, &m));
        CHECK_EQ(m, 0);
        st = kvt_pfx_stats(b);
        CHECK_EQ(st.prefix_remote_hits + st.prefix_remote_errors + st.prefix_nodes, 0);
        CHECK_OK(kv_store_check(a));
        CHECK_OK(kv_store_check(b));
        kv_policy_destroy(h2o);
        kv_store_destroy(a);
        kv_store_destroy(b);
    }
    /* a silent server: a miss within the timeout */
    b = mk(t.url, 200);
    CHECK_OK(kv_seq_create(b, &s));
    CHECK_OK(kv_tredis_signal(&t, 0, SIGSTOP));
    double t0 = now();
    CHECK_OK(kv_seq_prefix_match(b, s, p, NTOK, NULL, 0, &m));
    double dt = now() - t0;
    CHECK_EQ(m, 0);
    CHECK(dt < 2.0);
    CHECK(kvt_pfx_stats(b).prefix_remote_errors >= 1);
    printf("match with the server stopped: %.3f s (timeout 0.2 s), %llu errors\n", dt,
           (unsigned long long)kvt_pfx_stats(b).prefix_remote_errors);
    CHECK_OK(kv_tredis_signal(&t, 0, SIGCONT));
    CHECK_OK(kv_store_check(b));
    kv_store_destroy(b);
    /* KIVI INT2 (R 64): nodes at 64 and 128, one INT2 page per list each;
     * the fetch checks every group's scales and minimums */
    g_fmt = KV_FMT_INT2;
    {
        kv_store_t *a = mk(t.url, 1000);
        b = mk(t.url, 1000);
        kv_seq_id_t sa;
        CHECK_OK(kv_seq_create(a, &sa));
        feed(a, sa, q, NTOK);
        CHECK_EQ(kv_seq_prefix_publish(a, sa, q, NTOK, "kivi", 4), NTOK);
        CHECK_OK(kv_store_prefix_flush(a, 5000));
        CHECK_OK(kv_seq_create(b, &s));
        CHECK_OK(kv_seq_prefix_match(b, s, q, NTOK, "kivi", 4, &m));
        CHECK_EQ(m, 64);
        CHECK_EQ(kvt_pfx_stats(b).prefix_remote_hits, 1);
        static float k1[64 * HD], v1[64 * HD], k2[64 * HD], v2[64 * HD];
        for (uint32_t l = 0; l < NL; l++)
            for (uint32_t h = 0; h < NKV; h++) {
                CHECK_OK(kv_read(a, sa, l, h, 0, 64, k1, v1, NULL));
                CHECK_OK(kv_read(b, s, l, h, 0, 64, k2, v2, NULL));
                CHECK(memcmp(k1, k2, sizeof k1) == 0 && memcmp(v1, v2, sizeof v1) == 0);
            }
        CHECK_EQ(kvt_pfx_stats(b).pages_by_format[KV_FMT_INT2], NL * NKV);
        CHECK_OK(kv_store_check(b));
        kv_store_destroy(a);
        kv_store_destroy(b);
    }
    g_fmt = KV_FMT_FP16;
    kv_tredis_stop(&t);


    kv_tredis_start(&c, "cluster");
    b = share(c.url, p, "cluster");
    kv_store_destroy(b);
    /* allocation failures during a fetch: KV_ENOMEM, or a (shorter) match
     * whose every token is right */
    uint32_t n;
    for (n = 1; n < 5000; n++) {
        b = mk(c.url, 1000);
        CHECK_OK(kv_seq_create(b, &s));
        kv_fault_arm(n);
        int rc = kv_seq_prefix_match(b, s, p, NTOK, "cluster", 7, &m);
        int fired = kv_fault_fired();
        kv_fault_arm(0);
        CHECK(rc == 0 || (fired && rc == KV_ENOMEM));
        if (rc == 0)
            CHECK(holds(b, s, p, m));
        CHECK_OK(kv_store_check(b));
        kv_store_destroy(b);
        if (!fired) {
            CHECK_EQ(m, 112);
            break;
        }
    }
    printf("fetch: %u allocations failed in turn\n", n - 1);
    CHECK(n > 10);
    kv_tredis_stop(&c);
    return kv_test_end();
}
