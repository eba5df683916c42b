/* SPDX-License-Identifier: MIT */
/*
 * test_remote_auth.c — authentication of the remote tier against real
 * redis-server processes (started by this test on free loopback ports):
 *   - an ACL server (the default user off; "app" may GET/SET/EXISTS only
 *     keys kvp:*, "ro" only GET/EXISTS them, "esc" has a password that
 *     needs %-escapes in a url, "admin" sets up the test):
 *       right password (url form "user:pass@"): stored and hit, nothing
 *       refused; wrong password: kv_remote_probe and every key KV_EAUTH,
 *       counted (auth_failures, denied), not errors, also while the node is
 *       in backoff; no password: KV_EAUTH (-NOAUTH); a write or a key the
 *       user may not touch: KV_EAUTH (-NOPERM), counted; the server killing
 *       our connection: the next call reconnects and authenticates again;
 *   - a requirepass server: the legacy "AUTH password" form (":pass@" and
 *     cfg.password); two passwords, or a user without one: KV_EINVAL;
 *   - a 3-master cluster with requirepass: every node (discovered, not in
 *     the url) authenticated; after a slot moved, a MOVED to a node not
 *     connected yet too;
 *   - the store: password from a file and from an environment variable
 *     (publish in one store, hits in another); a wrong one: kv_store_create
 *     fails with KV_EAUTH; bad inputs named (missing file -ENOENT, unset or
 *     empty variable, both sources, url and file, TLS files on redis://);
 *     a user that may not SET: publishes refused, counted in
 *     prefix_remote_denied (never a silent drop);
 *   - kv_remote_url_redact never prints a password;
 *   - allocation failures in create and in a call that connects and AUTHs.
 */
#include <errno.h>
#include <signal.h>
#include <stdlib.h>

#include "alloc/kv_mem.h"
#include "kv_test_prefix.h"
#include "kv_test_redis.h"
#include "kv_test_remote.h"

static kv_tredis_t acl, legacy, cl;

#define ACL_ARGS                                                                 \
    "--user default off --user admin on >adminpw ~* &* +@all "                   \
    "--user app on >apppw ~kvp:* +get +set +exists "                             \
    "--user ro on >ropw ~kvp:* +get +exists "                                    \
    "--user esc on >p@ss:w,1% ~kvp:* +get +set +exists"

static char *url_of(const kv_tredis_t *t, const char *cred, char *buf, size_t cap)
{
    snprintf(buf, cap, "redis://%s%s127.0.0.1:%d", cred ? cred : "", cred ? "@" : "",
             t->port[0]);
    return buf;
}

static kv_remote_t *client(const char *url, const char *password)
{
    kv_remote_config_t cfg = {.url = url, .timeout_ms = 2000, .backoff_ms = 20,
                              .backoff_max_ms = 100, .password = password};
    kv_remote_t *r = NULL;
    CHECK_OK(kv_remote_create(&cfg, &r));
    return r;
}

static void test_acl(void)
{
    char url[256];
    /* the right password */
    kv_remote_t *r = client(url_of(&acl, "app:apppw", url, sizeof url), NULL);
    CHECK_OK(kv_remote_probe(r));
    CHECK_OK(kv_tr_set(r, 1, 1000));
    CHECK_OK(kv_tr_get(r, 1, 1000, NULL));
    kv_remote_stats_t st = kv_tr_stats(r);
    CHECK_EQ(st.hits, 1);
    CHECK_EQ(st.auth_failures + st.denied + st.errors, 0);
    /* the server drops our connection: the next call connects and AUTHs again */
    redisReply *k = kv_tredis_cmd(&acl, 0, "CLIENT KILL USER app");
    CHECK(k && k->type == REDIS_REPLY_INTEGER && k->integer >= 1);
    freeReplyObject(k);
    CHECK_OK(kv_tr_get(r, 1, 1000, NULL));
    st = kv_tr_stats(r);
    CHECK_EQ(st.connects, 2);
    CHECK_EQ(st.auth_failures + st.denied, 0);
    /* a key outside the user's pattern: -NOPERM, a named refusal */
    kv_remote_destroy(r);
    kv_remote_config_t cfg = {.url = url, .ns = "other", .timeout_ms = 2000};
    CHECK_OK(kv_remote_create(&cfg, &r));
    CHECK_EQ(kv_tr_get(r, 1, 1000, NULL), KV_EAUTH);
    CHECK_EQ(kv_tr_set(r, 2, 10), KV_EAUTH);
    st = kv_tr_stats(r);
    CHECK_EQ(st.denied, 2);
    CHECK_EQ(st.errors + st.corrupt, 0);
    kv_remote_destroy(r);

    /* a user that may only read: SET refused, GET served */
    r = client(url_of(&acl, "ro:ropw", url, sizeof url), NULL);
    CHECK_OK(kv_tr_get(r, 1, 1000, NULL));
    CHECK_EQ(kv_tr_set(r, 3, 10), KV_EAUTH);
    int ex = -1;
    kv_remote_key_t k3 = kv_tr_key(3);
    CHECK_EQ(kv_remote_exists(r, &k3, &ex, 1), 0);
    CHECK_EQ(ex, 0); /* (nothing was stored) */
    CHECK_EQ(kv_tr_stats(r).denied, 1);
    kv_remote_destroy(r);

    /* a wrong password: refused at the probe and for every key, also while
     * the node is in backoff; counted, not errors */
    r = client(url_of(&acl, "app:wrong", url, sizeof url), NULL);
    CHECK_EQ(kv_remote_probe(r), KV_EAUTH);
    CHECK_EQ(kv_tr_get(r, 1, 1000, NULL), KV_EAUTH); /* (in backoff) */
    usleep(150 * 1000);
    CHECK_EQ(kv_tr_get(r, 1, 1000, NULL), KV_EAUTH); /* (tried again) */
    st = kv_tr_stats(r);
    CHECK(st.auth_failures >= 2);
    CHECK_EQ(st.denied, 2);
    CHECK_EQ(st.hits + st.errors, 0);
    kv_remote_destroy(r);

    /* no password for a server that wants one: -NOAUTH */
    r = client(url_of(&acl, NULL, url, sizeof url), NULL);
    CHECK_EQ(kv_remote_probe(r), KV_EAUTH);
    CHECK_EQ(kv_tr_get(r, 1, 1000, NULL), KV_EAUTH);
    CHECK(kv_tr_stats(r).auth_failures >= 1);
    kv_remote_destroy(r);

    /* a password with '@', ':', ',' and '%' in the url, %-escaped */
    r = client(url_of(&acl, "esc:p%40ss%3Aw%2C1%25", url, sizeof url), NULL);
    CHECK_OK(kv_tr_get(r, 1, 1000, NULL));
    kv_remote_destroy(r);
    /* ... and given as cfg.password, with the user in the url */
    r = client(url_of(&acl, "esc", url, sizeof url), "p@ss:w,1%");
    CHECK_OK(kv_tr_get(r, 1, 1000, NULL));
    kv_remote_destroy(r);
}

static void test_legacy(void)
{
    char url[256];
    kv_remote_t *r = client(url_of(&legacy, ":legacypw", url, sizeof url), NULL);
    CHECK_OK(kv_tr_set(r, 5, 100));
    CHECK_OK(kv_tr_get(r, 5, 100, NULL));
    kv_remote_destroy(r);
    r = client(url_of(&legacy, NULL, url, sizeof url), "legacypw");
    CHECK_OK(kv_tr_get(r, 5, 100, NULL));
    kv_remote_destroy(r);
    r = client(url_of(&legacy, ":nope", url, sizeof url), NULL);
    CHECK_EQ(kv_tr_get(r, 5, 100, NULL), KV_EAUTH);
    kv_remote_destroy(r);

    /* bad inputs */
    kv_remote_config_t cfg = {.url = url_of(&legacy, ":a", url, sizeof url), .password = "b"};
    CHECK_EQ(kv_remote_create(&cfg, &r), KV_EINVAL); /* two passwords */
    cfg = (kv_remote_config_t){.url = url_of(&legacy, "user", url, sizeof url)};
    CHECK_EQ(kv_remote_create(&cfg, &r), KV_EINVAL); /* a user without one */
    const char *bad[] = {"redis://u:@h:1", "redis://@h:1", "redis://u:p%4@h:1",
                         "redis://u:p%00@h:1", "redis://h:1,u:p@h:2", "redis://u:p q@h:1",
                         "redis://h:1,rediss://h:2", "rediss://h:1,redis://h:2"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        cfg = (kv_remote_config_t){.url = bad[i], .password = NULL};
        CHECK_EQ(kv_remote_create(&cfg, &r), KV_EINVAL);
    }
    char longpw[700];
    memset(longpw, 'x', sizeof longpw - 1);
    longpw[sizeof longpw - 1] = 0;
    cfg = (kv_remote_config_t){.url = "redis://h:1", .password = longpw};
    CHECK_EQ(kv_remote_create(&cfg, &r), KV_ERANGE);
    cfg = (kv_remote_config_t){.url = "redis://h:1", .tls_ca_file = "/x"};
    CHECK_EQ(kv_remote_create(&cfg, &r), KV_EINVAL); /* TLS files, plaintext url */
}

static void test_redact(void)
{
    char b[256];
    struct { const char *in, *out; } t[] = {
        {"redis://app:s3cret@h:1", "redis://app:***@h:1"},
        {"redis://:s3cret@h:1,h:2", "redis://:***@h:1,h:2"},
        {"rediss://u:a@b@c@h:1", "rediss://u:***@h:1"}, /* (unparsable: still hidden) */
        {"redis://h:1,redis://x:pw@h:2", "redis://h:***@h:2"}, /* (refused: hidden wide) */
        {"redis://u:p,w@h:1", "redis://u:***@h:1"},
        {"redis://user@h:1", "redis://user@h:1"},
        {"redis://h:1", "redis://h:1"},
    };
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) {
        int n = kv_remote_url_redact(t[i].in, b, sizeof b);
        CHECK_EQ(n, (int)strlen(t[i].out));
        CHECK(!strcmp(b, t[i].out));
    }
    CHECK_EQ(kv_remote_url_redact("redis://a:pw@h:1", b, 12), 17);
    CHECK(!strcmp(b, "redis://a:*")); /* truncated, never the password */
}

static void test_cluster(void)
{
    char url[256];
    snprintf(url, sizeof url, "redis://:clpw@127.0.0.1:%d", cl.port[0]);
    kv_remote_t *r = client(url, NULL);
    enum { N = 64 };
    for (int i = 0; i < N; i++)
        CHECK_OK(kv_tr_set(r, 100 + i, 64));
    int hits = 0;
    for (int i = 0; i < N; i++)
        hits += kv_tr_get(r, 100 + i, 64, NULL) == 0;
    CHECK_EQ(hits, N);
    kv_remote_stats_t st = kv_tr_stats(r);
    CHECK_EQ(st.connects, 3); /* the seed and the two nodes its slot map named */
    CHECK_EQ(st.auth_failures + st.denied + st.errors, 0);
    kv_remote_destroy(r);
    /* MOVED to a node this client never connected to: it connects and
     * authenticates there too. Key K is on node 0 (the seed); the client
     * touches node 0 only, then K's slot moves to node 1. */
    uint64_t id = 1000;
    char key[128], ida[64] = "", idb[64] = "";
    for (;; id++) {
        kv_remote_key_t kk = kv_tr_key(id);
        kv_remote_key_string("kvp", &kk, key, sizeof key);
        redisReply *e = kv_tredis_cmd(&cl, 0, "EXISTS %s", key);
        int mine = e && e->type == REDIS_REPLY_INTEGER;
        freeReplyObject(e);
        if (mine)
            break;
    }
    uint32_t slot = kv_remote_slot(key, strlen(key));
    r = client(url, NULL);
    CHECK_OK(kv_tr_set(r, id, 64));
    CHECK_EQ(kv_tr_stats(r).connects, 1);
    for (int i = 0; i < 2; i++) {
        redisReply *e = kv_tredis_cmd(&cl, i, "CLUSTER MYID");
        CHECK(e && e->type == REDIS_REPLY_STRING && e->len < 64);
        if (e && e->type == REDIS_REPLY_STRING && e->len < 64)
            memcpy(i ? idb : ida, e->str, e->len + 1);
        freeReplyObject(e);
    }
    const char *steps[][2] = {{"1", "CLUSTER SETSLOT %u IMPORTING %s"},
                              {"0", "CLUSTER SETSLOT %u MIGRATING %s"}};
    for (int i = 0; i < 2; i++) {
        redisReply *e = kv_tredis_cmd(&cl, steps[i][0][0] - '0', steps[i][1], slot,
                                      i ? idb : ida);
        CHECK(e && e->type == REDIS_REPLY_STATUS);
        freeReplyObject(e);
    }
    redisReply *e = kv_tredis_cmd(&cl, 0, "MIGRATE 127.0.0.1 %d %b 0 5000 AUTH clpw KEYS %s",
                                  cl.port[1], "", (size_t)0, key);
    CHECK(e && e->type == REDIS_REPLY_STATUS);
    freeReplyObject(e);
    for (int i = 0; i < 3; i++) {
        e = kv_tredis_cmd(&cl, i, "CLUSTER SETSLOT %u NODE %s", slot, idb);
        CHECK(e && e->type == REDIS_REPLY_STATUS);
        freeReplyObject(e);
    }
    CHECK_OK(kv_tr_get(r, id, 64, NULL));
    st = kv_tr_stats(r);
    CHECK_EQ(st.moved + st.asked, 1);
    CHECK_EQ(st.connects, 2);
    CHECK_EQ(st.auth_failures + st.denied + st.errors, 0);
    kv_remote_destroy(r);
    /* a wrong password: refused by the seed, and no node is used */
    snprintf(url, sizeof url, "redis://:bad@127.0.0.1:%d", cl.port[0]);
    r = client(url, NULL);
    CHECK_EQ(kv_remote_probe(r), KV_EAUTH);
    CHECK_EQ(kv_tr_get(r, 100, 64, NULL), KV_EAUTH);
    kv_remote_destroy(r);
}

/* ---- the store ---------------------------------------------------------- */

#define NL 2
#define NKV 2
#define HD 32
#define NTOK 64
static const char MODEL[] = "auth-test-model";

static kv_config_t store_cfg(const char *url)
{
    kv_config_t c = kv_config_default();
    c.n_layers = NL, c.n_q_heads = 4, c.n_kv_heads = NKV, c.head_dim = HD;
    c.host_pages = 128, c.max_seqs = 4, c.n_threads = 1;
    c.prefix_cache = 1, c.prefix_model = MODEL, c.prefix_model_len = sizeof MODEL - 1;
    c.prefix_remote = url;
    c.prefix_remote_timeout_ms = 2000;
    return c;
}

int kv_store_prefix_flush(kv_store_t *s, uint32_t timeout_ms); /* store/kv_store_int.h */

/* Publish p from a store made of ca, match it in one made of cb: tokens. */
static uint32_t share(const kv_config_t *ca, const kv_config_t *cb, const int32_t *p)
{
    kv_store_t *a = kvt_pfx_store(ca), *b = kvt_pfx_store(cb);
    kv_seq_id_t sa, sb;
    uint32_t m = 0;
    CHECK_OK(kv_seq_create(a, &sa));
    CHECK_OK(kvt_pfx_feed(a, sa, p, 0, NTOK, NL, NKV, HD));
    CHECK_EQ(kv_seq_prefix_publish(a, sa, p, NTOK, NULL, 0), NTOK);
    CHECK_OK(kv_store_prefix_flush(a, 5000));
    CHECK_OK(kv_seq_create(b, &sb));
    CHECK_OK(kv_seq_prefix_match(b, sb, p, NTOK, NULL, 0, &m));
    kv_stats_t st = kvt_pfx_stats(b);
    CHECK_EQ(st.prefix_remote_tokens, m);
    CHECK_EQ(st.prefix_remote_denied + st.prefix_remote_auth_failures, 0);
    kv_store_destroy(a);
    kv_store_destroy(b);
    return m;
}

static void test_store(void)
{
    char url[256], url2[256], file[128], bad_file[128];
    const char *tmp = getenv("TMPDIR") && *getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
    snprintf(file, sizeof file, "%s/kvauth.%d.pw", tmp, (int)getpid());
    snprintf(bad_file, sizeof bad_file, "%s/kvauth.%d.bad", tmp, (int)getpid());
    FILE *f = fopen(file, "w");
    CHECK(f && fputs("apppw\r\nnot part of it\n", f) >= 0);
    fclose(f);
    f = fopen(bad_file, "w");
    CHECK(f && fputs("wrong\n", f) >= 0);
    fclose(f);
    int32_t p[NTOK];
    kvt_pfx_prompt(p, NTOK, 31);

    /* file and environment variable: a publish in one store, hits in another */
    /* url: ca and cb, all along; url2: the others */
    kv_config_t ca = store_cfg(url_of(&acl, "app", url, sizeof url)), cb = ca;
    ca.prefix_remote_password_file = file;
    setenv("KV_TEST_REMOTE_PW", "apppw", 1);
    cb.prefix_remote_password_env = "KV_TEST_REMOTE_PW";
    CHECK_EQ(share(&ca, &cb, p), NTOK - 16);
    kv_store_t *s = kvt_pfx_store(&ca);
    kv_config_t got;
    CHECK_OK(kv_store_config(s, &got));
    CHECK(got.prefix_remote_password_file != file &&
          !strcmp(got.prefix_remote_password_file, file)); /* the store's copy */
    kv_store_destroy(s);

    /* a wrong password, and none: the store is not created */
    kv_config_t c = ca;
    c.prefix_remote_password_file = bad_file;
    CHECK_EQ(kv_store_create(&c, &s), KV_EAUTH);
    c = store_cfg(url_of(&acl, NULL, url2, sizeof url2));
    CHECK_EQ(kv_store_create(&c, &s), KV_EAUTH);
    /* bad inputs, named */
    c = ca;
    c.prefix_remote_password_file = "/nonexistent/kvpage.pw";
    CHECK_EQ(kv_store_create(&c, &s), -ENOENT);
    c = cb;
    c.prefix_remote_password_env = "KV_TEST_REMOTE_UNSET";
    unsetenv("KV_TEST_REMOTE_UNSET");
    CHECK_EQ(kv_store_create(&c, &s), KV_EINVAL);
    setenv("KV_TEST_REMOTE_EMPTY", "", 1);
    c.prefix_remote_password_env = "KV_TEST_REMOTE_EMPTY";
    CHECK_EQ(kv_store_create(&c, &s), KV_EINVAL);
    c = ca;
    c.prefix_remote_password_env = "KV_TEST_REMOTE_PW";
    CHECK_EQ(kv_store_create(&c, &s), KV_EINVAL); /* both sources */
    c = store_cfg(url_of(&acl, "app:apppw", url2, sizeof url2));
    c.prefix_remote_password_file = file;
    CHECK_EQ(kv_store_create(&c, &s), KV_EINVAL); /* url and file */
    c = ca;
    c.prefix_remote_tls_ca = file;
    CHECK_EQ(kv_store_create(&c, &s), KV_EINVAL); /* TLS files, redis:// */
    c = ca;
    c.prefix_remote = NULL;
    CHECK_EQ(kv_store_create(&c, &s), KV_EINVAL); /* no remote */
    kv_estimate_t est;
    CHECK_EQ(kv_config_estimate(&c, &est), KV_EINVAL);

    /* a user that may not SET: created (it may read), its publishes refused
     * and counted, none in errors */
    c = store_cfg(url_of(&acl, "ro:ropw", url2, sizeof url2));
    s = kvt_pfx_store(&c);
    kv_seq_id_t q;
    int32_t p2[NTOK];
    kvt_pfx_prompt(p2, NTOK, 32);
    CHECK_OK(kv_seq_create(s, &q));
    CHECK_OK(kvt_pfx_feed(s, q, p2, 0, NTOK, NL, NKV, HD));
    CHECK_EQ(kv_seq_prefix_publish(s, q, p2, NTOK, NULL, 0), NTOK);
    CHECK_OK(kv_store_prefix_flush(s, 5000));
    kv_stats_t st = kvt_pfx_stats(s);
    CHECK_EQ(st.prefix_remote_put, NTOK / 16);
    CHECK_EQ(st.prefix_remote_denied, NTOK / 16);
    CHECK_EQ(st.prefix_remote_errors, 0);
    kv_store_destroy(s);

    /* the password changed under a running store: fetches refused, counted
     * as such (not errors, not a cold cache) */
    s = kvt_pfx_store(&ca);
    redisReply *r = kv_tredis_cmd(&acl, 0, "ACL SETUSER app resetpass >newpw");
    CHECK(r && r->type == REDIS_REPLY_STATUS);
    freeReplyObject(r);
    r = kv_tredis_cmd(&acl, 0, "CLIENT KILL USER app");
    freeReplyObject(r);
    kv_seq_id_t q2;
    uint32_t m = 99;
    CHECK_OK(kv_seq_create(s, &q2));
    CHECK_OK(kv_seq_prefix_match(s, q2, p, NTOK, NULL, 0, &m));
    CHECK_EQ(m, 0);
    st = kvt_pfx_stats(s);
    CHECK(st.prefix_remote_denied >= 1);
    CHECK(st.prefix_remote_auth_failures >= 1);
    CHECK_EQ(st.prefix_remote_errors, 0);
    kv_store_destroy(s);
    r = kv_tredis_cmd(&acl, 0, "ACL SETUSER app resetpass >apppw");
    freeReplyObject(r);
    unlink(file);
    unlink(bad_file);
}

/* The n-th allocation fails in create, and in a first call (connect, AUTH):
 * KV_ENOMEM (call or key), never a crash or a leak; then the call works. */
static void test_alloc_failures(void)
{
    char url[256];
    url_of(&acl, "app:apppw", url, sizeof url);
    kv_remote_config_t cfg = {.url = url, .timeout_ms = 2000};
    kv_tr_create_failures(&cfg);
    kv_tr_get_failures(&cfg, 1, 1000);
}

int main(void)
{
    kv_tredis_start_ex(&acl, "single", ACL_ARGS, "--user admin --pass adminpw", 0,
                       "admin adminpw");
    kv_tredis_start_ex(&legacy, "single", "--requirepass legacypw", "-a legacypw", 0, "legacypw");
    kv_tredis_start_ex(&cl, "cluster", "--requirepass clpw --masterauth clpw", "-a clpw", 0,
                       "clpw");
    test_acl();
    test_legacy();
    test_redact();
    test_cluster();
    test_store();
    test_alloc_failures();
    kv_tredis_stop(&cl);
    kv_tredis_stop(&legacy);
    kv_tredis_stop(&acl);
    return kv_test_end();
}
