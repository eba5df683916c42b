/* SPDX-License-Identifier: MIT */
/*
 * test_remote_tls.c — the remote tier over TLS ("rediss://") against a real
 * redis-server listening with --tls-port only (--port 0), with certificates
 * this test makes with the openssl command (a CA; a server certificate for
 * IP 127.0.0.1 and DNS localhost; a client certificate; another CA):
 *   - round trips (small, 1 MiB, a batch of 500) with the CA file, by IP and
 *     by name (SNI), with AUTH over TLS, with a client certificate;
 *   - fail closed: another CA, the system store (which does not know ours),
 *     a name the certificate does not carry (127.0.0.2): KV_ETLS, counted,
 *     no byte of a value sent or read;
 *   - rediss:// to a plaintext server: KV_ETLS within the connect timeout,
 *     never a hang past the call's deadline;
 *   - bad inputs: a CA file that does not exist or is not PEM, a key that
 *     does not match the certificate: KV_ETLS at create; a certificate
 *     without a key: KV_EINVAL;
 *   - the store: publish in one, hits in another (prefix_remote_tls_ca);
 *     another CA: kv_store_create fails with KV_ETLS;
 *   - TLS, an ACL user and signed values together: stores with the user's
 *     password from a variable, a key prefix the user is limited to and a
 *     MAC key publish and hit; a store without the MAC key refuses the
 *     values (unauth), one with a wrong password fails with KV_EAUTH;
 *   - allocation failures (the TLS context, a connection);
 *   - the server SIGKILLed under a connected client, then 16 MiB sent on the
 *     dead connection: errors, never SIGPIPE; restarted: served again.
 * Skipped (77) when openssl or redis-server is not installed.
 */
#include <errno.h>
#include <stdlib.h>

#include "alloc/kv_mem.h"
#include "kv_test_prefix.h"
#include "kv_test_redis.h"
#include "kv_test_remote.h"

static kv_tredis_t tls, plain;
static char dir[256], ca[300], other_ca[300], ccert[300], ckey[300], skey[300];

static void make_certs(void)
{
    const char *tmp = getenv("TMPDIR");
    snprintf(dir, sizeof dir, "%s/kvtls.XXXXXX", tmp && *tmp ? tmp : "/tmp");
    CHECK(mkdtemp(dir) != NULL);
    kv_tredis_certs(dir);
    snprintf(ca, sizeof ca, "%s/ca.crt", dir);
    snprintf(other_ca, sizeof other_ca, "%s/other.crt", dir);
    snprintf(ccert, sizeof ccert, "%s/cli.crt", dir);
    snprintf(ckey, sizeof ckey, "%s/cli.key", dir);
    snprintf(skey, sizeof skey, "%s/srv.key", dir);
}

static void start_servers(void)
{
    char sargs[2048], cargs[1024];
    snprintf(sargs, sizeof sargs,
             "--tls-cert-file %s/srv.crt --tls-key-file %s/srv.key --tls-ca-cert-file %s "
             "--tls-auth-clients optional --requirepass tlspw --bind 127.0.0.1 127.0.0.2 "
             "--user mac on >macpw ~dep:* +get +set +exists",
             dir, dir, ca);
    snprintf(cargs, sizeof cargs, "--tls --cacert %s -a tlspw", ca);
    kv_tredis_start_ex(&tls, "single", sargs, cargs, 1, NULL);
    kv_tredis_start(&plain, "single");
}

static char *url_of(const char *host, int port, const char *scheme, char *buf, size_t cap)
{
    snprintf(buf, cap, "%s://:tlspw@%s:%d", scheme, host, port);
    return buf;
}

static int mk(const char *url, const char *ca_file, const char *cert, const char *key,
              kv_remote_t **r)
{
    kv_remote_config_t cfg = {.url = url, .timeout_ms = 2000, .backoff_ms = 20,
                              .backoff_max_ms = 100, .tls_ca_file = ca_file,
                              .tls_cert_file = cert, .tls_key_file = key};
    *r = NULL;
    return kv_remote_create(&cfg, r);
}

static void test_roundtrip(void)
{
    char url[256];
    kv_remote_t *r;
    CHECK_OK(mk(url_of("127.0.0.1", tls.port[0], "rediss", url, sizeof url), ca, NULL, NULL, &r));
    CHECK_OK(kv_remote_probe(r));
    size_t sizes[] = {0, 100, 4096, 1u << 20};
    for (int i = 0; i < 4; i++)
        CHECK_OK(kv_tr_set(r, 10 + i, sizes[i]));
    for (int i = 0; i < 4; i++)
        CHECK_OK(kv_tr_get(r, 10 + i, sizes[i], NULL));
    enum { NB = 500 };
    static uint8_t bufs[NB][4096];
    static struct iovec iv[NB];
    static kv_remote_set_t sets[NB];
    static kv_remote_get_t gets[NB];
    for (int i = 0; i < NB; i++) {
        kv_tr_fill(bufs[i], 4096, 1000 + i);
        iv[i] = (struct iovec){bufs[i], 4096};
        sets[i] = (kv_remote_set_t){.key = kv_tr_key(1000 + i), .format = 1, .iov = &iv[i],
                                    .iovcnt = 1};
    }
    CHECK_EQ(kv_remote_set(r, sets, NB), NB);
    memset(bufs, 0, sizeof bufs);
    for (int i = 0; i < NB; i++)
        gets[i] = (kv_remote_get_t){.key = kv_tr_key(1000 + i), .dst = bufs[i], .cap = 4096};
    CHECK_EQ(kv_remote_get(r, gets, NB), NB);
    int good = 0;
    for (int i = 0; i < NB; i++)
        good += gets[i].status == 0 && kv_tr_is(bufs[i], 4096, 1000 + i);
    CHECK_EQ(good, NB);
    kv_remote_stats_t st = kv_tr_stats(r);
    CHECK_EQ(st.connects, 1);
    CHECK_EQ(st.tls_failures + st.auth_failures + st.errors + st.corrupt, 0);
    kv_remote_destroy(r);

    /* by name (SNI, the certificate's DNS name), with a client certificate */
    CHECK_OK(mk(url_of("localhost", tls.port[0], "rediss", url, sizeof url), ca, ccert, ckey,
                &r));
    CHECK_OK(kv_tr_get(r, 11, 100, NULL));
    kv_remote_destroy(r);
    /* a wrong password over TLS: KV_EAUTH, as in plaintext */
    snprintf(url, sizeof url, "rediss://:nope@127.0.0.1:%d", tls.port[0]);
    CHECK_OK(mk(url, ca, NULL, NULL, &r));
    CHECK_EQ(kv_tr_get(r, 11, 100, NULL), KV_EAUTH);
    CHECK_EQ(kv_tr_stats(r).tls_failures, 0);
    kv_remote_destroy(r);
}

/* A client that must not get through: KV_ETLS at the probe and for a key,
 * counted, within the timeout. */
static void refused(const char *url, const char *ca_file)
{
    kv_remote_t *r;
    CHECK_OK(mk(url, ca_file, NULL, NULL, &r));
    double t0 = kv_tr_now();
    CHECK_EQ(kv_remote_probe(r), KV_ETLS);
    usleep(150 * 1000); /* past the backoff: a second handshake */
    CHECK_EQ(kv_tr_get(r, 11, 100, NULL), KV_ETLS);
    CHECK_EQ(kv_tr_set(r, 99, 100), KV_ETLS); /* (in backoff: still named) */
    CHECK(kv_tr_now() - t0 < 2.0 + 0.15 + 0.5);
    kv_remote_stats_t st = kv_tr_stats(r);
    CHECK(st.tls_failures >= 2);
    CHECK_EQ(st.connects + st.hits + st.stored, 0);
    kv_remote_destroy(r);
}

static void test_fail_closed(void)
{
    char url[256];
    url_of("127.0.0.1", tls.port[0], "rediss", url, sizeof url);
    refused(url, other_ca);                 /* another CA */
    refused(url, NULL);                     /* the system store: ours is not in it */
    refused(url_of("127.0.0.2", tls.port[0], "rediss", url, sizeof url), ca); /* no such name */
    /* rediss:// to a plaintext server: it never answers the handshake */
    refused(url_of("127.0.0.1", plain.port[0], "rediss", url, sizeof url), ca);
    /* and redis:// to a TLS-only server: an error, within the timeout */
    kv_remote_t *r;
    snprintf(url, sizeof url, "redis://127.0.0.1:%d", tls.port[0]);
    CHECK_OK(mk(url, NULL, NULL, NULL, &r));
    double t0 = kv_tr_now();
    int rc = kv_tr_get(r, 11, 100, NULL);
    CHECK(rc == KV_EIO || rc == -ETIMEDOUT);
    CHECK(kv_tr_now() - t0 < 2.5);
    kv_remote_destroy(r);

    /* bad inputs */
    char junk[300], missing[300];
    snprintf(junk, sizeof junk, "%s/junk.pem", dir);
    snprintf(missing, sizeof missing, "%s/missing.pem", dir);
    url_of("127.0.0.1", tls.port[0], "rediss", url, sizeof url);
    CHECK_EQ(mk(url, missing, NULL, NULL, &r), KV_ETLS);
    CHECK_EQ(mk(url, junk, NULL, NULL, &r), KV_ETLS);
    CHECK_EQ(mk(url, ca, ccert, skey, &r), KV_ETLS); /* the key of another certificate */
    CHECK_EQ(mk(url, ca, ccert, NULL, &r), KV_EINVAL);
    CHECK_EQ(mk(url, ca, NULL, ckey, &r), KV_EINVAL);
}

#define NL 2
#define NKV 2
#define HD 32
#define NTOK 64
static const char MODEL[] = "tls-test-model";

int kv_store_prefix_flush(kv_store_t *s, uint32_t timeout_ms); /* store/kv_store_int.h */

/* A prefix-cache store's config over the TLS server at url (rediss://). */
static kv_config_t store_cfg(const char *url)
{
    kv_config_t c = kv_config_default();
    c.n_layers = NL, c.n_q_heads = 4, c.n_kv_heads = NKV, c.head_dim = HD;
    c.host_pages = 128, c.max_seqs = 4, c.n_threads = 1;
    c.prefix_cache = 1, c.prefix_model = MODEL, c.prefix_model_len = sizeof MODEL - 1;
    c.prefix_remote = url;
    c.prefix_remote_timeout_ms = 2000;
    c.prefix_remote_tls_ca = ca;
    return c;
}

/* The tokens a fresh store built from c gets for prompt p from the remote. */
static uint32_t remote_hit(const kv_config_t *c, const int32_t *p, kv_stats_t *st)
{
    kv_store_t *s = kvt_pfx_store(c);
    kv_seq_id_t q;
    uint32_t m = 0;
    CHECK_OK(kv_seq_create(s, &q));
    CHECK_OK(kv_seq_prefix_match(s, q, p, NTOK, NULL, 0, &m));
    *st = kvt_pfx_stats(s);
    kv_store_destroy(s);
    return m;
}

static void test_store(void)
{
    char url[256];
    kv_config_t c = store_cfg(url_of("127.0.0.1", tls.port[0], "rediss", url, sizeof url));
    int32_t p[NTOK];
    kvt_pfx_prompt(p, NTOK, 7);
    kv_store_t *a = kvt_pfx_store(&c), *b = kvt_pfx_store(&c);
    kv_seq_id_t sa, sb;
    uint32_t m = 0;
    CHECK_OK(kv_seq_create(a, &sa));
    CHECK_OK(kvt_pfx_feed(a, sa, p, 0, NTOK, NL, NKV, HD));
    CHECK_EQ(kv_seq_prefix_publish(a, sa, p, NTOK, NULL, 0), NTOK);
    CHECK_OK(kv_store_prefix_flush(a, 5000));
    CHECK_OK(kv_seq_create(b, &sb));
    CHECK_OK(kv_seq_prefix_match(b, sb, p, NTOK, NULL, 0, &m));
    CHECK_EQ(m, NTOK - 16);
    kv_stats_t st = kvt_pfx_stats(b);
    CHECK_EQ(st.prefix_remote_tokens, NTOK - 16);
    CHECK_EQ(st.prefix_remote_tls_failures + st.prefix_remote_denied, 0);
    kv_store_destroy(a);
    kv_store_destroy(b);
    kv_store_t *s = NULL;
    c.prefix_remote_tls_ca = other_ca;
    CHECK_EQ(kv_store_create(&c, &s), KV_ETLS); /* fail closed, at create */
    c.prefix_remote_tls_ca = ca;
    c.prefix_remote_tls_cert = ccert;
    CHECK_EQ(kv_store_create(&c, &s), KV_EINVAL); /* a certificate without its key */
}

static void test_store_signed(void)
{
    char url[256];
    snprintf(url, sizeof url, "rediss://mac@127.0.0.1:%d", tls.port[0]);
    kv_config_t c = store_cfg(url);
    c.prefix_remote_password_env = "KVT_TLS_MAC_PW";
    c.prefix_remote_ns = "dep";
    c.prefix_remote_mac = "env:KVT_TLS_MAC_KEY";
    CHECK_OK(setenv("KVT_TLS_MAC_PW", "macpw", 1));
    CHECK_OK(setenv("KVT_TLS_MAC_KEY",
                    "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff", 1));
    int32_t p[NTOK];
    kvt_pfx_prompt(p, NTOK, 11);
    kv_store_t *a = kvt_pfx_store(&c);
    kv_seq_id_t sa;
    CHECK_OK(kv_seq_create(a, &sa));
    CHECK_OK(kvt_pfx_feed(a, sa, p, 0, NTOK, NL, NKV, HD));
    CHECK_EQ(kv_seq_prefix_publish(a, sa, p, NTOK, NULL, 0), NTOK);
    CHECK_OK(kv_store_prefix_flush(a, 5000));
    kv_stats_t st = kvt_pfx_stats(a);
    CHECK_EQ(st.prefix_remote_put, NTOK / 16);
    CHECK_EQ(st.prefix_remote_denied + st.prefix_remote_auth_failures, 0);
    kv_store_destroy(a);
    /* a second store with the same settings: hits through signed values */
    CHECK_EQ(remote_hit(&c, p, &st), NTOK - 16);
    CHECK_EQ(st.prefix_remote_tokens, NTOK - 16);
    CHECK_EQ(st.prefix_remote_bad + st.prefix_remote_unauth + st.prefix_remote_denied +
                 st.prefix_remote_tls_failures + st.prefix_remote_errors, 0);
    /* without the MAC key the same values are refused: they were signed */
    kv_config_t nokey = c;
    nokey.prefix_remote_mac = NULL;
    CHECK_EQ(remote_hit(&nokey, p, &st), 0);
    CHECK_EQ(st.prefix_remote_unauth, NTOK / 16 - 1); /* the keys of one batch */
    CHECK_EQ(st.prefix_remote_denied, 0);
    /* the user may not read outside its key prefix (the default "kvp") */
    kv_config_t other_ns = c;
    other_ns.prefix_remote_ns = NULL;
    CHECK_EQ(remote_hit(&other_ns, p, &st), 0);
    CHECK(st.prefix_remote_denied > 0);
    /* a wrong password: refused at create */
    kv_store_t *s = NULL;
    CHECK_OK(setenv("KVT_TLS_MAC_PW", "wrong", 1));
    CHECK_EQ(kv_store_create(&c, &s), KV_EAUTH);
    unsetenv("KVT_TLS_MAC_PW");
    unsetenv("KVT_TLS_MAC_KEY");
}

/* The n-th allocation fails in create, and in a first call (connect, TLS
 * handshake): KV_ENOMEM (call or key), never a crash or a leak. */
static void test_alloc_failures(void)
{
    char url[256];
    url_of("127.0.0.1", tls.port[0], "rediss", url, sizeof url);
    kv_remote_config_t cfg = {.url = url, .timeout_ms = 2000, .backoff_ms = 20,
                              .backoff_max_ms = 100, .tls_ca_file = ca};
    kv_tr_create_failures(&cfg);
    CHECK(kv_tr_get_failures(&cfg, 11, 100) >= 2); /* (the SSL connection among them) */
}

static void test_killed(void)
{
    char url[256];
    kv_remote_t *r;
    CHECK_OK(mk(url_of("127.0.0.1", tls.port[0], "rediss", url, sizeof url), ca, NULL, NULL,
                &r));
    CHECK_OK(kv_tr_get(r, 11, 100, NULL)); /* connected */
    CHECK_EQ(kv_tredis_signal(&tls, 0, SIGKILL), 0);
    usleep(200 * 1000);
    enum { NB = 16, SZ = 1 << 20 };
    uint8_t *big = malloc((size_t)NB * SZ);
    static struct iovec iv[NB];
    static kv_remote_set_t sets[NB];
    for (int i = 0; i < NB; i++) {
        kv_tr_fill(big + (size_t)i * SZ, SZ, 500 + i);
        iv[i] = (struct iovec){big + (size_t)i * SZ, SZ};
        sets[i] = (kv_remote_set_t){.key = kv_tr_key(500 + i), .format = 1, .iov = &iv[i],
                                    .iovcnt = 1};
    }
    CHECK_EQ(kv_remote_set(r, sets, NB), 0); /* (a SIGPIPE would have ended the test) */
    CHECK(sets[0].status == KV_EIO || sets[0].status == -ETIMEDOUT);
    CHECK_OK(kv_tredis_restart(&tls, 0));
    int back = 0;
    for (int i = 0; i < 100 && !back; i++) {
        back = kv_remote_set(r, sets, NB) == NB;
        if (!back)
            usleep(20 * 1000);
    }
    CHECK(back);
    CHECK(kv_tr_stats(r).connects >= 2);
    free(big);
    kv_remote_destroy(r);
}

int main(void)
{
    make_certs();
    start_servers();
    test_roundtrip();
    test_fail_closed();
    test_store();
    test_store_signed();
    test_alloc_failures();
    test_killed();
    kv_tredis_stop(&plain);
    kv_tredis_stop(&tls);
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", dir);
    return kv_test_end();
}
