/* SPDX-License-Identifier: MIT */
/*
 * test_remote_mac.c — signed remote values and per-deployment key prefixes
 * (docs/prefix.md, "Deployments"; remote/kv_remote_mac.c,
 * kv_remote_secret.c, store/kv_store_prefix_remote.c) against a real
 * redis-server on loopback (scripts/kv_redis.sh).
 *
 * Keys come from files and environment variables as a deployment gives
 * them. Checked:
 *   - key sources: hex with whitespace around, bad hex, short, long, odd,
 *     unset variable, missing file (-ENOENT), bad source strings; the store
 *     refuses them at create, and a key prefix or key without a remote;
 *   - client level: a keyed round trip hits (96-byte header); a reader
 *     without the key, with another key, and a keyed reader of an unsigned
 *     value all refuse it (counted corrupt and unauth); every header byte
 *     and sampled payload bytes flipped in the server (SETRANGE): refused,
 *     never a hit; another key's MAC under our key id: refused; an unknown
 *     layout version: refused as corrupt, not unauth;
 *   - store level: two stores with one key share a prompt (7 nodes fetched,
 *     bit for bit); one byte of one value changed in the server: the match
 *     stops before it (every matched token right), counted in
 *     prefix_remote_bad and prefix_remote_unauth; readers without the key or
 *     with another key get nothing, counted; rotation: a reader with the new
 *     key and the old one as previous reads the old values, new writes are
 *     signed with the new key, and once the previous key is removed the old
 *     values are refused (counted) while the new ones hit;
 *   - key prefixes: two deployments on one server see only their own keys
 *     ("<ns>:*"), the same prefix shares; an ACL limiting the user to one
 *     prefix (and the client's commands) serves that prefix only;
 *   - allocation failures: every kv_mem allocation of a keyed client's create
 *     and of a keyed store's create (KV_ENOMEM, nothing leaked), and of a
 *     keyed fetching match (KV_ENOMEM, or a match whose every token is right).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "alloc/kv_mem.h"
#include "kv_test.h"
#include "kv_test_prefix.h"
#include "kv_test_redis.h"
#include "kv_test_remote.h"
#include "remote/kv_remote.h"

#define NL 2
#define NKV 2
#define HD 32
#define NTOK 128

static const char MODEL[] = "remote-mac-test-model";
static const char HEX1[] = "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f";
static const char HEX2[] = "F0E1D2C3B4A5968778695A4B3C2D1E0FF0E1D2C3B4A5968778695A4B3C2D1E0F"
                           "00112233";
static const char HEX3[] = "5555555555555555555555555555555555555555555555555555555555555555";

static char g_dir[128], g_k1[256], g_k2[256], g_k3[256]; /* "file:..." sources */

static void write_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    CHECK(f != NULL);
    if (f) {
        fputs(text, f);
        fclose(f);
    }
}

static void mk_key_file(char *src, size_t cap, const char *name, const char *text)
{
    char path[200];
    snprintf(path, sizeof path, "%s/%s", g_dir, name);
    write_file(path, text);
    snprintf(src, cap, "file:%s", path);
}

/* ---- key sources ------------------------------------------------------------ */

static int load(const char *src, uint8_t *key, size_t *len)
{
    return kv_remote_secret_load(src, key, len);
}

static void test_secret(void)
{
    uint8_t key[KV_REMOTE_MAC_KEY_MAX];
    size_t len = 0;
    char src[256];
    CHECK_OK(load(g_k1, key, &len));
    CHECK_EQ(len, 32);
    for (unsigned i = 0; i < 32; i++)
        CHECK_EQ(key[i], i);
    CHECK_OK(load(g_k2, key, &len)); /* upper case, 36 bytes, CRLF around */
    CHECK_EQ(len, 36);
    CHECK_EQ(key[0], 0xF0);
    CHECK_EQ(key[35], 0x33);
    setenv("KVT_MAC_KEY", " \t" "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f\n", 1);
    CHECK_OK(load("env:KVT_MAC_KEY", key, &len));
    CHECK_EQ(len, 32);
    CHECK_EQ(key[31], 31);
    unsetenv("KVT_MAC_UNSET");
    CHECK_EQ(load("env:KVT_MAC_UNSET", key, &len), KV_EINVAL);
    const char *bad[] = {
        "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e",   /* 31 bytes */
        "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f0", /* odd     */
        "000102030405060708090a0b0c0d0e0f1011121314151617 8191a1b1c1d1e1f0", /* a space */
        "g00102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f",  /* not hex */
        "", "\n"};
    for (unsigned i = 0; i < sizeof bad / sizeof *bad; i++) {
        mk_key_file(src, sizeof src, "bad", bad[i]);
        CHECK_EQ(load(src, key, &len), KV_EINVAL);
        setenv("KVT_MAC_KEY", bad[i], 1);
        CHECK_EQ(load("env:KVT_MAC_KEY", key, &len), KV_EINVAL);
    }
    char big[200] = "";
    for (int i = 0; i < 65; i++)
        strcat(big, "ab"); /* 65 bytes */
    mk_key_file(src, sizeof src, "bad", big);
    CHECK_EQ(load(src, key, &len), KV_EINVAL);
    snprintf(src, sizeof src, "file:%s/none", g_dir);
    CHECK_EQ(load(src, key, &len), -ENOENT);
    const char *syntax[] = {"", "file:", "env:", "env:A=B", "key:00", "FILE:/x", "/etc/key"};
    for (unsigned i = 0; i < sizeof syntax / sizeof *syntax; i++) {
        CHECK_EQ(kv_remote_secret_check(syntax[i]), KV_EINVAL);
        CHECK_EQ(load(syntax[i], key, &len), KV_EINVAL);
    }
    CHECK_OK(kv_remote_secret_check(NULL));
}

/* ---- client level ----------------------------------------------------------- */

static kv_remote_t *client(const char *url, const char *ns, const char *k, const char *prev)
{
    uint8_t a[KV_REMOTE_MAC_KEY_MAX], b[KV_REMOTE_MAC_KEY_MAX];
    size_t al = 0, bl = 0;
    if (k)
        CHECK_OK(load(k, a, &al));
    if (prev)
        CHECK_OK(load(prev, b, &bl));
    kv_remote_config_t c = {.url = url, .ns = ns, .timeout_ms = 2000,
                            .mac_key = k ? a : NULL, .mac_key_len = (uint32_t)al,
                            .mac_prev = prev ? b : NULL, .mac_prev_len = (uint32_t)bl};
    kv_remote_t *r = NULL;
    CHECK_OK(kv_remote_create(&c, &r));
    memset(a, 0, sizeof a); /* the client keeps its own */
    memset(b, 0, sizeof b);
    return r;
}

static uint8_t g_pay[5000];

/* GET key into g_out: the status. */
static uint8_t g_out[6000];
static int get1(kv_remote_t *r, const kv_remote_key_t *k, size_t *len)
{
    kv_remote_get_t g = {.key = *k, .dst = g_out, .cap = sizeof g_out, .status = 1};
    int rc = kv_remote_get(r, &g, 1);
    if (len)
        *len = g.len;
    return rc < 0 ? rc : g.status;
}

static int set1(kv_remote_t *r, const kv_remote_key_t *k, size_t len)
{
    struct iovec iov[2] = {{g_pay, len / 3}, {g_pay + len / 3, len - len / 3}};
    kv_remote_set_t s = {.key = *k, .format = 7, .iov = iov, .iovcnt = 2, .status = 1};
    int rc = kv_remote_set(r, &s, 1);
    return rc < 0 ? rc : s.status;
}

/* The value under "<ns>:<hex of k>" as a reply (free it), or NULL. */
static redisReply *raw_get(const kv_tredis_t *t, const char *ns, const kv_remote_key_t *k)
{
    char key[200];
    kv_remote_key_string(ns, k, key, sizeof key);
    return kv_tredis_cmd(t, 0, "GET %s", key);
}

static void raw_set(const kv_tredis_t *t, const char *ns, const kv_remote_key_t *k,
                    const void *v, size_t n)
{
    char key[200];
    kv_remote_key_string(ns, k, key, sizeof key);
    redisReply *r = kv_tredis_cmd(t, 0, "SET %s %b", key, v, n);
    CHECK(r && r->type == REDIS_REPLY_STATUS);
    freeReplyObject(r);
}

/* Flip byte off of the value under k in the server (GETRANGE, SETRANGE). */
static void flip(const kv_tredis_t *t, const char *ns, const kv_remote_key_t *k, size_t off)
{
    char key[200];
    kv_remote_key_string(ns, k, key, sizeof key);
    redisReply *r = kv_tredis_cmd(t, 0, "GETRANGE %s %d %d", key, (int)off, (int)off);
    CHECK(r && r->type == REDIS_REPLY_STRING && r->len == 1);
    char b = r ? (char)(r->str[0] ^ 0x01) : 0;
    freeReplyObject(r);
    r = kv_tredis_cmd(t, 0, "SETRANGE %s %d %b", key, (int)off, &b, (size_t)1);
    CHECK(r && r->type == REDIS_REPLY_INTEGER);
    freeReplyObject(r);
}

static void test_client(const kv_tredis_t *t)
{
    for (size_t i = 0; i < sizeof g_pay; i++)
        g_pay[i] = (uint8_t)(i * 131u + 7u);
    kv_remote_key_t k = {{0}}, ku = {{0}};
    k.hash[0] = 1, ku.hash[0] = 2;
    kv_remote_t *w1 = client(t->url, "cm", g_k1, NULL), *plain = client(t->url, "cm", NULL, NULL);
    kv_remote_t *r2 = client(t->url, "cm", g_k2, NULL), *r21 = client(t->url, "cm", g_k2, g_k1);
    size_t len = 0;
    /* round trip */
    CHECK_OK(set1(w1, &k, 4000));
    CHECK_OK(get1(w1, &k, &len));
    CHECK_EQ(len, 4000);
    CHECK(memcmp(g_out, g_pay, 4000) == 0);
    redisReply *v = raw_get(t, "cm", &k);
    CHECK(v && v->type == REDIS_REPLY_STRING && v->len == 4000 + KV_REC_FRAME_SIGNED_BYTES);
    CHECK(v && v->str[4] == 2); /* layout version 2 */
    freeReplyObject(v);
    /* readers without the key / with another key refuse it; the previous key reads it */
    memset(g_out, 0, sizeof g_out);
    CHECK_EQ(get1(plain, &k, NULL), KV_ENOENT);
    CHECK_EQ(get1(r2, &k, NULL), KV_ENOENT);
    CHECK_EQ(kv_tr_stats(plain).unauth, 1);
    CHECK_EQ(kv_tr_stats(plain).corrupt, 1);
    CHECK_EQ(kv_tr_stats(r2).unauth, 1);
    CHECK_OK(get1(r21, &k, &len));
    CHECK(len == 4000 && memcmp(g_out, g_pay, 4000) == 0);
    /* an unsigned value: the plain client reads it, keyed ones refuse it */
    CHECK_OK(set1(plain, &ku, 1000));
    CHECK_OK(get1(plain, &ku, &len));
    CHECK_EQ(get1(w1, &ku, NULL), KV_ENOENT);
    CHECK_EQ(get1(r21, &ku, NULL), KV_ENOENT);
    CHECK_EQ(kv_tr_stats(w1).unauth, 1);
    CHECK_EQ(kv_tr_stats(r21).unauth, 1);
    /* every header byte and sampled payload bytes flipped in the server */
    int refused = 0, unauth = 0;
    for (size_t off = 0; off < KV_REC_FRAME_SIGNED_BYTES + 4000; off += off < 96 ? 1 : 397) {
        CHECK_OK(set1(w1, &k, 4000));
        flip(t, "cm", &k, off);
        kv_remote_stats_t a = kv_tr_stats(w1);
        int st = get1(w1, &k, NULL);
        kv_remote_stats_t b = kv_tr_stats(w1);
        refused += st == KV_ENOENT && b.corrupt == a.corrupt + 1;
        unauth += b.unauth == a.unauth + 1;
        if (st != KV_ENOENT)
            fprintf(stderr, "byte %zu flipped: status %d\n", off, st);
        CHECK_EQ(st, KV_ENOENT);
        /* past the fields checked before the MAC (magic, version, sizes), the MAC refuses */
        if (off >= 24 || (off >= 8 && off < 16))
            CHECK_EQ(b.unauth, a.unauth + 1);
    }
    CHECK_EQ(refused, 96 + 11);
    printf("flipped bytes: %d refused, %d of them by the MAC\n", refused, unauth);
    /* another key's value under our key's id */
    kv_remote_t *w3 = client(t->url, "cm", g_k3, NULL);
    CHECK_OK(set1(w1, &k, 4000));
    v = raw_get(t, "cm", &k);
    uint8_t id1[4];
    memcpy(id1, v->str + 56, 4);
    freeReplyObject(v);
    CHECK_OK(set1(w3, &k, 4000));
    v = raw_get(t, "cm", &k);
    CHECK(v && v->len == 4000 + 96 && memcmp(v->str + 56, id1, 4) != 0);
    uint8_t *buf = malloc(v->len);
    memcpy(buf, v->str, v->len);
    memcpy(buf + 56, id1, 4);
    raw_set(t, "cm", &k, buf, v->len);
    uint64_t u0 = kv_tr_stats(w1).unauth;
    CHECK_EQ(get1(w1, &k, NULL), KV_ENOENT);
    CHECK_EQ(kv_tr_stats(w1).unauth, u0 + 1);
    /* an unknown layout version (3): corrupt, not unauthenticated */
    buf[4] = 3;
    raw_set(t, "cm", &k, buf, v->len);
    kv_remote_stats_t a = kv_tr_stats(w1);
    CHECK_EQ(get1(w1, &k, NULL), KV_ENOENT);
    CHECK_EQ(get1(plain, &k, NULL), KV_ENOENT);
    CHECK_EQ(kv_tr_stats(w1).corrupt, a.corrupt + 1);
    CHECK_EQ(kv_tr_stats(w1).unauth, a.unauth);
    free(buf);
    freeReplyObject(v);
    /* the key must not be in the client's config copy nor sent anywhere but
     * the contexts: a config error for bad keys */
    uint8_t kb[64] = {1};
    kv_remote_config_t c = {.url = t->url, .mac_key = kb, .mac_key_len = 31};
    kv_remote_t *r = NULL;
    CHECK_EQ(kv_remote_create(&c, &r), KV_ERANGE);
    c.mac_key_len = 65;
    CHECK_EQ(kv_remote_create(&c, &r), KV_ERANGE);
    c.mac_key = NULL;
    c.mac_key_len = 32;
    CHECK_EQ(kv_remote_create(&c, &r), KV_EINVAL);
    c.mac_key_len = 0;
    c.mac_prev = kb, c.mac_prev_len = 32;
    CHECK_EQ(kv_remote_create(&c, &r), KV_EINVAL); /* previous without a key */
    CHECK(r == NULL);
    /* allocation failures: a keyed client's create, its set and get */
    c = (kv_remote_config_t){.url = t->url, .ns = "cm", .mac_key = kb, .mac_key_len = 32,
                             .mac_prev = kb, .mac_prev_len = 40};
    CHECK(kv_tr_create_failures(&c) >= 2);
    CHECK_OK(kv_remote_create(&c, &r));
    for (uint32_t n = 1; n < 100; n++) {
        kv_fault_arm(n);
        int st = set1(r, &k, 3000);
        int fired = kv_fault_fired();
        kv_fault_arm(0);
        CHECK(st == 0 || (fired && (st == KV_ENOMEM || st == KV_EIO)));
        kv_fault_arm(n);
        int gt = get1(r, &k, &len);
        int fired2 = kv_fault_fired();
        kv_fault_arm(0);
        CHECK(gt == 0 || (fired2 && (gt == KV_ENOMEM || gt == KV_EIO)));
        if (gt == 0)
            CHECK(len == 3000 && memcmp(g_out, g_pay, 3000) == 0);
        if (!fired && !fired2)
            break;
    }
    CHECK_OK(get1(r, &k, &len));
    kv_remote_destroy(r);
    kv_remote_destroy(w1);
    kv_remote_destroy(w3);
    kv_remote_destroy(plain);
    kv_remote_destroy(r2);
    kv_remote_destroy(r21);
}

/* ---- store level ------------------------------------------------------------ */

static kv_config_t cfg(const char *url, const char *ns, const char *mac, const char *prev)
{
    kv_config_t c = kv_config_default();
    c.n_layers = NL, c.n_q_heads = 4, c.n_kv_heads = NKV, c.head_dim = HD;
    c.host_pages = 256, c.max_seqs = 8, c.n_threads = 1;
    c.prefix_cache = 1, c.prefix_model = MODEL, c.prefix_model_len = sizeof MODEL - 1;
    c.prefix_remote = url;
    c.prefix_remote_timeout_ms = 2000;
    c.prefix_remote_ns = ns;
    c.prefix_remote_mac = mac;
    c.prefix_remote_mac_prev = prev;
    return c;
}

static kv_store_t *mk(const char *url, const char *ns, const char *mac, const char *prev)
{
    kv_config_t c = cfg(url, ns, mac, prev);
    return kvt_pfx_store(&c);
}

int kv_store_prefix_flush(kv_store_t *s, uint32_t timeout_ms); /* store/kv_store_int.h */

/* 1 if seq holds exactly the values kvt_pfx_feed gives for p[0, n). */
static int holds(kv_store_t *s, kv_seq_id_t seq, const int32_t *p, uint32_t n)
{
    static float k[NTOK * HD], v[NTOK * HD];
    for (uint32_t l = 0; l < NL; l++)
        for (uint32_t h = 0; h < NKV; h++) {
            uint32_t len = 0;
            if (kv_seq_len(s, seq, l, h, &len) || len != n ||
                (n && kv_read(s, seq, l, h, 0, n, k, v, NULL)))
                return 0;
            for (uint32_t i = 0; i < n; i++)
                for (uint32_t d = 0; d < HD; d++)
                    if (k[i * HD + d] != kvt_pfx_val(p[i], i, l, h, d, 0) ||
                        v[i * HD + d] != kvt_pfx_val(p[i], i, l, h, d, 1))
                        return 0;
        }
    return 1;
}

/* Store s publishes prompt p (8 nodes) and flushes. */
static void publish(kv_store_t *s, const int32_t *p)
{
    kv_seq_id_t q;
    CHECK_OK(kv_seq_create(s, &q));
    CHECK_OK(kvt_pfx_feed(s, q, p, 0, NTOK, NL, NKV, HD));
    CHECK_EQ(kv_seq_prefix_publish(s, q, p, NTOK, NULL, 0), NTOK);
    CHECK_OK(kv_store_prefix_flush(s, 5000));
    CHECK_EQ(kvt_pfx_stats(s).prefix_remote_dropped, 0);
    CHECK_OK(kv_seq_free(s, q));
}

/* A new store of (ns, mac, prev) matches p: the tokens matched (checked
 * bit for bit); its stats into *st. */
static uint32_t fetch(const char *url, const char *ns, const char *mac, const char *prev,
                      const int32_t *p, kv_stats_t *st)
{
    kv_store_t *s = mk(url, ns, mac, prev);
    kv_seq_id_t q;
    uint32_t m = 999;
    CHECK_OK(kv_seq_create(s, &q));
    CHECK_OK(kv_seq_prefix_match(s, q, p, NTOK, NULL, 0, &m));
    CHECK(holds(s, q, p, m));
    *st = kvt_pfx_stats(s);
    CHECK_EQ(st->prefix_remote_tokens, m);
    CHECK_OK(kv_store_check(s));
    kv_store_destroy(s);
    return m;
}

static long count_keys(const kv_tredis_t *t, const char *pattern)
{
    redisReply *r = kv_tredis_cmd(t, 0, "KEYS %s", pattern);
    long n = r && r->type == REDIS_REPLY_ARRAY ? (long)r->elements : -1;
    freeReplyObject(r);
    return n;
}

/* Flip one payload byte of the n-th value matching pattern (KEYS order). */
static void tamper(const kv_tredis_t *t, const char *pattern, size_t n, size_t off)
{
    redisReply *r = kv_tredis_cmd(t, 0, "KEYS %s", pattern);
    CHECK(r && r->type == REDIS_REPLY_ARRAY && r->elements > n);
    if (r && r->type == REDIS_REPLY_ARRAY && r->elements > n) {
        const char *key = r->element[n]->str;
        redisReply *g = kv_tredis_cmd(t, 0, "GETRANGE %s %d %d", key, (int)off, (int)off);
        char b = g && g->len == 1 ? (char)(g->str[0] ^ 0x40) : 0;
        freeReplyObject(g);
        g = kv_tredis_cmd(t, 0, "SETRANGE %s %d %b", key, (int)off, &b, (size_t)1);
        CHECK(g && g->type == REDIS_REPLY_INTEGER);
        freeReplyObject(g);
    }
    freeReplyObject(r);
}

static void test_store(const kv_tredis_t *t)
{
    int32_t p[NTOK], q[NTOK];
    kvt_pfx_prompt(p, NTOK, 1);
    kvt_pfx_prompt(q, NTOK, 2);
    kv_stats_t st;
    /* config: what a store refuses */
    {
        kv_store_t *s = NULL;
        char missing[256];
        snprintf(missing, sizeof missing, "file:%s/none", g_dir);
        const struct {
            const char *url, *ns, *mac, *prev;
            int rc;
        } bad[] = {{NULL, "dep", NULL, NULL, KV_EINVAL},  {NULL, NULL, g_k1, NULL, KV_EINVAL},
                   {t->url, "a b", NULL, NULL, KV_EINVAL}, {t->url, "", NULL, NULL, KV_EINVAL},
                   {t->url, NULL, "k1", NULL, KV_EINVAL},  {t->url, NULL, NULL, g_k1, KV_EINVAL},
                   {t->url, NULL, "env:KVT_MAC_UNSET", NULL, KV_EINVAL},
                   {t->url, NULL, missing, NULL, -ENOENT},
                   {t->url, NULL, g_k1, missing, -ENOENT},
                   {t->url, "0123456789012345678901234567890123456789012345678901234567890123x",
                    NULL, NULL, KV_EINVAL}};
        for (unsigned i = 0; i < sizeof bad / sizeof *bad; i++) {
            kv_config_t c = cfg(bad[i].url, bad[i].ns, bad[i].mac, bad[i].prev);
            c.prefix_remote_timeout_ms = bad[i].url ? 2000 : 0;
            uint64_t live = kv_mem_live_bytes();
            CHECK_EQ(kv_store_create(&c, &s), bad[i].rc);
            CHECK_EQ(kv_mem_live_bytes(), live);
        }
        CHECK(s == NULL);
        /* the store keeps copies of the strings, not the key */
        char ns[8] = "dep", mac[256];
        snprintf(mac, sizeof mac, "%s", g_k1);
        kv_config_t c = cfg(t->url, ns, mac, NULL), back;
        s = kvt_pfx_store(&c);
        ns[0] = 'X', mac[0] = 'X';
        CHECK_OK(kv_store_config(s, &back));
        CHECK(back.prefix_remote_ns && strcmp(back.prefix_remote_ns, "dep") == 0);
        CHECK(back.prefix_remote_mac && strcmp(back.prefix_remote_mac, g_k1) == 0);
        CHECK(back.prefix_remote_mac_prev == NULL);
        kv_store_destroy(s);
    }
    /* round trip under one key */
    kv_store_t *a = mk(t->url, "depA", g_k1, NULL);
    publish(a, p);
    CHECK_EQ(count_keys(t, "depA:*"), 8);
    CHECK_EQ(fetch(t->url, "depA", g_k1, NULL, p, &st), 112);
    CHECK_EQ(st.prefix_remote_hits, 7);
    CHECK_EQ(st.prefix_remote_bad + st.prefix_remote_unauth, 0);
    /* key prefixes: another deployment sees nothing (absent, not bad) */
    CHECK_EQ(fetch(t->url, "depB", g_k1, NULL, p, &st), 0);
    CHECK_EQ(st.prefix_remote_bad + st.prefix_remote_errors, 0);
    kv_store_t *b = mk(t->url, "depB", g_k1, NULL);
    publish(b, q);
    CHECK_EQ(count_keys(t, "depA:*"), 8);
    CHECK_EQ(count_keys(t, "depB:*"), 8);
    CHECK_EQ(count_keys(t, "kvp:*"), 0);
    CHECK_EQ(fetch(t->url, "depA", g_k1, NULL, q, &st), 0);
    CHECK_EQ(fetch(t->url, "depB", g_k1, NULL, q, &st), 112);
    kv_store_destroy(b);
    /* readers without the key or with another key: nothing, counted (the
     * fetch asks for the 7 keys in one batch: each value refused counts) */
    CHECK_EQ(fetch(t->url, "depA", NULL, NULL, p, &st), 0);
    CHECK_EQ(st.prefix_remote_bad, 7);
    CHECK_EQ(st.prefix_remote_unauth, 7);
    CHECK_EQ(fetch(t->url, "depA", g_k2, NULL, p, &st), 0);
    CHECK_EQ(st.prefix_remote_unauth, 7);
    /* an unkeyed writer's values: a keyed reader refuses them */
    kv_store_t *u = mk(t->url, "depU", NULL, NULL);
    publish(u, p);
    kv_store_destroy(u);
    CHECK_EQ(fetch(t->url, "depU", NULL, NULL, p, &st), 112);
    CHECK_EQ(fetch(t->url, "depU", g_k1, NULL, p, &st), 0);
    CHECK_EQ(st.prefix_remote_unauth, 7);
    /* one byte of two values changed in the server (one of them is not the
     * last node, which the n - 1 cap never fetches): the match stops before
     * the first, every matched token right */
    tamper(t, "depA:*", 3, KV_REC_FRAME_SIGNED_BYTES + 700);
    tamper(t, "depA:*", 4, KV_REC_FRAME_SIGNED_BYTES + 700);
    uint32_t m = fetch(t->url, "depA", g_k1, NULL, p, &st);
    CHECK(m < 112 && m % 16 == 0);
    CHECK_EQ(st.prefix_remote_hits, m / 16);
    CHECK(st.prefix_remote_bad >= 1 && st.prefix_remote_bad <= 2);
    CHECK_EQ(st.prefix_remote_unauth, st.prefix_remote_bad);
    printf("two values tampered: %u of 112 tokens matched, %llu values refused\n", m,
           (unsigned long long)st.prefix_remote_bad);
    for (size_t i = 0; i < 8; i++)
        tamper(t, "depA:*", i, KV_REC_FRAME_SIGNED_BYTES + 100 + i);
    CHECK_EQ(fetch(t->url, "depA", g_k1, NULL, p, &st), 0);
    CHECK_EQ(st.prefix_remote_unauth, 7);
    publish(a, p); /* (a's host tier has the nodes: publishes nothing new) */
    kv_store_destroy(a);
    /* rotation: K1's values are in the server (depR); readers move to K2 with
     * K1 as previous, then writers; then K1 is removed */
    a = mk(t->url, "depR", g_k1, NULL);
    publish(a, p);
    kv_store_destroy(a);
    CHECK_EQ(fetch(t->url, "depR", g_k2, g_k1, p, &st), 112); /* readers first */
    CHECK_EQ(st.prefix_remote_unauth, 0);
    a = mk(t->url, "depR", g_k2, g_k1); /* writers: new values signed with K2 */
    publish(a, q);
    kv_store_destroy(a);
    CHECK_EQ(fetch(t->url, "depR", g_k1, NULL, q, &st), 0); /* (not readable under K1) */
    CHECK_EQ(st.prefix_remote_unauth, 7);
    CHECK_EQ(fetch(t->url, "depR", g_k2, g_k1, q, &st), 112);
    CHECK_EQ(fetch(t->url, "depR", g_k2, NULL, q, &st), 112); /* previous removed */
    CHECK_EQ(fetch(t->url, "depR", g_k2, NULL, p, &st), 0);   /* K1's values refused */
    CHECK_EQ(st.prefix_remote_bad, 7);
    CHECK_EQ(st.prefix_remote_unauth, 7);
    /* allocation failures: a keyed store's create, a keyed fetching match */
    kv_config_t c = cfg(t->url, "depR", g_k2, g_k1);
    uint32_t n;
    for (n = 1; n < 1000; n++) {
        kv_store_t *s = NULL;
        uint64_t live = kv_mem_live_bytes();
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
    printf("keyed store create: %u allocations failed in turn\n", n - 1);
    CHECK(n > 10);
    for (n = 1; n < 5000; n++) {
        kv_store_t *s = mk(t->url, "depR", g_k2, g_k1);
        kv_seq_id_t sq;
        CHECK_OK(kv_seq_create(s, &sq));
        kv_fault_arm(n);
        int rc = kv_seq_prefix_match(s, sq, q, NTOK, NULL, 0, &m);
        int fired = kv_fault_fired();
        kv_fault_arm(0);
        CHECK(rc == 0 || (fired && rc == KV_ENOMEM));
        if (rc == 0)
            CHECK(holds(s, sq, q, m));
        CHECK_EQ(kvt_pfx_stats(s).prefix_remote_unauth, 0);
        CHECK_OK(kv_store_check(s));
        kv_store_destroy(s);
        if (!fired) {
            CHECK_EQ(m, 112);
            break;
        }
    }
    printf("keyed fetch: %u allocations failed in turn\n", n - 1);
    CHECK(n > 10);
    /* a Redis ACL limiting the connection's user (the default user: the
     * client does not authenticate) to one key prefix and the commands the
     * client sends (docs/prefix.md, "Deployments"): that prefix's stores
     * share; another prefix's store gets nothing (its GETs are refused with
     * -NOPERM: counted denied, never values nor errors). Last: the test's own
     * commands are limited too. */
    redisReply *acl = kv_tredis_cmd(t, 0, "ACL SETUSER default resetkeys ~depACL:* -@all "
                                          "+get +set +exists +cluster|slots +asking");
    CHECK(acl && acl->type == REDIS_REPLY_STATUS);
    freeReplyObject(acl);
    a = mk(t->url, "depACL", g_k1, NULL);
    publish(a, p);
    CHECK_EQ(kvt_pfx_stats(a).prefix_remote_put, 8);
    kv_store_destroy(a);
    CHECK_EQ(fetch(t->url, "depACL", g_k1, NULL, p, &st), 112);
    CHECK_EQ(st.prefix_remote_errors, 0);
    CHECK_EQ(fetch(t->url, "depR", g_k2, NULL, q, &st), 0); /* 112 before the ACL */
    CHECK(st.prefix_remote_denied >= 1);
    CHECK_EQ(st.prefix_remote_errors + st.prefix_remote_bad, 0);
}

int main(void)
{
    snprintf(g_dir, sizeof g_dir, "/tmp/kvt_mac_XXXXXX");
    if (!mkdtemp(g_dir)) {
        perror("mkdtemp");
        return 1;
    }
    char hx[300];
    mk_key_file(g_k1, sizeof g_k1, "k1", HEX1);
    snprintf(hx, sizeof hx, "\r\n  %s\r\n", HEX2);
    mk_key_file(g_k2, sizeof g_k2, "k2", hx);
    snprintf(hx, sizeof hx, "%s\n", HEX3);
    mk_key_file(g_k3, sizeof g_k3, "k3", hx);
    test_secret();
    static kv_tredis_t t; /* static: the atexit handler reads it */
    kv_tredis_start(&t, "single");
    test_client(&t);
    test_store(&t);
    kv_tredis_stop(&t);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", g_dir);
    return kv_test_end();
}
