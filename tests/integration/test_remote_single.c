/* SPDX-License-Identifier: MIT */
/*
 * test_remote_single.c — the remote tier client against one real
 * redis-server (started by this test on a free loopback port):
 *   - round trips of every size class (0 B .. 1 MiB, a SmolLM2 block of
 *     360 KiB), gathered payloads, format tags, batches of 500, EXISTS, TTL;
 *   - misses and a too-small buffer;
 *   - corrupt values written with hiredis under the client's key (random
 *     bytes, empty, each header field wrong with a valid crc, a flipped
 *     payload bit, truncation, another key's value, another namespace, a
 *     list): each a miss, counted corrupt, the caller's buffer untouched;
 *   - the server SIGKILLed in the middle of a run and restarted: errors
 *     while it is down (each call within its timeout), hits again after;
 *   - the server SIGSTOPped: -ETIMEDOUT within the timeout, not a hang;
 *     SIGCONT: served again;
 *   - allocation failures in every call.
 */
#include <errno.h>
#include <pthread.h>
#include <signal.h>

#include "alloc/kv_mem.h"
#include "kv_test_redis.h"
#include "kv_test_remote.h"
#include "util/kv_crc32c.h"
#include "util/kv_le.h"

static kv_tredis_t srv;

static void test_roundtrip(void)
{
    kv_remote_t *r = kv_tr_client(srv.url, "t1", 2000);
    size_t sizes[] = {0, 1, 63, 4096, 30 * 3 * 4096, 1u << 20};
    enum { NS = 6 };
    for (int i = 0; i < NS; i++)
        CHECK_OK(kv_tr_set(r, 100 + i, sizes[i]));
    for (int i = 0; i < NS; i++) {
        size_t len = 99;
        CHECK_OK(kv_tr_get(r, 100 + i, sizes[i] + 10, &len));
        CHECK_EQ(len, sizes[i]);
    }
    /* a payload given in pieces reads back as one */
    uint8_t a[1000], b[3000];
    kv_tr_fill(a, sizeof a, 7);
    uint8_t whole[4000];
    kv_tr_fill(whole, sizeof whole, 7);
    memcpy(b, whole + 1000, sizeof b);
    struct iovec v[3] = {{a, sizeof a}, {NULL, 0}, {b, sizeof b}};
    kv_remote_set_t s = {.key = kv_tr_key(7), .format = 7, .iov = v, .iovcnt = 3};
    CHECK_EQ(kv_remote_set(r, &s, 1), 1);
    CHECK_OK(kv_tr_get(r, 7, 4000, NULL));

    /* misses; a buffer too small: KV_ERANGE, length told, buffer untouched */
    size_t len = 0;
    CHECK_EQ(kv_tr_get(r, 999999, 100, NULL), KV_ENOENT);
    uint8_t small[100];
    memset(small, 0xAB, sizeof small);
    kv_remote_get_t g = {.key = kv_tr_key(103), .dst = small, .cap = sizeof small};
    CHECK_EQ(kv_remote_get(r, &g, 1), 0);
    CHECK_EQ(g.status, KV_ERANGE);
    CHECK_EQ(g.len, 4096);
    CHECK(small[0] == 0xAB && small[99] == 0xAB);
    CHECK_EQ(kv_tr_get(r, 100, 0, &len), 0); /* an empty blob needs no buffer */

    /* a pipelined batch of 500 blobs of 4 KiB, and EXISTS over them */
    enum { NB = 500 };
    static uint8_t bufs[NB][4096];
    static struct iovec iv[NB];
    static kv_remote_set_t sets[NB];
    static kv_remote_get_t gets[NB];
    static kv_remote_key_t keys[NB + 1];
    static int ex[NB + 1];
    for (int i = 0; i < NB; i++) {
        kv_tr_fill(bufs[i], 4096, 1000 + i);
        iv[i] = (struct iovec){bufs[i], 4096};
        sets[i] = (kv_remote_set_t){.key = kv_tr_key(1000 + i), .format = 1000u + i,
                                    .iov = &iv[i], .iovcnt = 1};
        keys[i] = kv_tr_key(1000 + i);
    }
    keys[NB] = kv_tr_key(5000);
    CHECK_EQ(kv_remote_set(r, sets, NB), NB);
    memset(bufs, 0, sizeof bufs);
    for (int i = 0; i < NB; i++)
        gets[i] = (kv_remote_get_t){.key = kv_tr_key(1000 + i), .dst = bufs[i], .cap = 4096};
    CHECK_EQ(kv_remote_get(r, gets, NB), NB);
    int good = 0;
    for (int i = 0; i < NB; i++)
        good += gets[i].status == 0 && gets[i].len == 4096 &&
                gets[i].format == 1000u + i && kv_tr_is(bufs[i], 4096, 1000 + i);
    CHECK_EQ(good, NB);
    CHECK_EQ(kv_remote_exists(r, keys, ex, NB + 1), NB);
    CHECK_EQ(ex[0], 1);
    CHECK_EQ(ex[NB], 0);

    kv_remote_stats_t st;
    CHECK_OK(kv_remote_stats(r, &st));
    CHECK_EQ(st.gets, st.hits + st.misses);
    CHECK_EQ(st.sets, st.stored);
    CHECK_EQ(st.errors + st.timeouts + st.corrupt, 0);
    CHECK(st.bytes_in >= (uint64_t)NB * 4096 + (1u << 20));
    CHECK_EQ(st.connects, 1);
    kv_remote_destroy(r);

    /* the same hash in another namespace is another key */
    r = kv_tr_client(srv.url, "t2", 2000);
    CHECK_EQ(kv_tr_get(r, 103, 8192, NULL), KV_ENOENT);
    kv_remote_destroy(r);

    /* TTL */
    kv_remote_config_t cfg = {.url = srv.url, .ns = "ttl", .ttl_ms = 300};
    CHECK_OK(kv_remote_create(&cfg, &r));
    CHECK_OK(kv_tr_set(r, 1, 10));
    char key[128];
    kv_remote_key_t k1 = kv_tr_key(1);
    kv_remote_key_string("ttl", &k1, key, sizeof key);
    redisReply *rep = kv_tredis_cmd(&srv, 0, "PTTL %s", key);
    CHECK(rep && rep->type == REDIS_REPLY_INTEGER && rep->integer > 0 && rep->integer <= 300);
    if (rep)
        freeReplyObject(rep);
    usleep(600 * 1000);
    CHECK_EQ(kv_tr_get(r, 1, 100, NULL), KV_ENOENT);
    kv_remote_destroy(r);
}

/* Write value (n bytes) under key(id) in namespace ns with hiredis. */
static void raw_put(const char *ns, uint64_t id, const void *value, size_t n)
{
    char key[128];
    kv_remote_key_t k = kv_tr_key(id);
    int kl = kv_remote_key_string(ns, &k, key, sizeof key);
    const char *argv[3] = {"SET", key, value};
    size_t lens[3] = {3, (size_t)kl, n};
    redisReply *rep = kv_tredis_argv(&srv, 0, 3, argv, lens);
    CHECK(rep && rep->type == REDIS_REPLY_STATUS);
    if (rep)
        freeReplyObject(rep);
}

/* A framed value of blob id (n payload bytes) into v; returns its length. */
static size_t frame(const char *ns, uint64_t id, uint64_t key_id, size_t n, uint8_t *v)
{
    kv_tr_fill(v + 64, n, id);
    struct iovec io = {v + 64, n};
    kv_remote_key_t k = kv_tr_key(key_id);
    CHECK_OK(kv_remote_frame_header(ns, &k, (uint32_t)id, &io, 1, n, v));
    return 64 + n;
}

static void recrc(uint8_t *v, size_t n)
{
    kv_le_put32(v + 60, kv_crc32c(kv_crc32c(0, v, 60), v + 64, n - 64));
}

static void test_corrupt(void)
{
    kv_remote_t *r = kv_tr_client(srv.url, "cx", 2000);
    static uint8_t v[64 + 5000];
    enum { N = 5000 };
    size_t n;
    int cases = 0;
    uint64_t id = 1;
    /* first, a good value reads back */
    n = frame("cx", id, id, N, v);
    raw_put("cx", id, v, n);
    CHECK_OK(kv_tr_get(r, id, N, NULL));

    uint8_t junk[100];
    kv_tr_fill(junk, sizeof junk, 3);
    raw_put("cx", ++id, junk, sizeof junk), cases++;                /* random bytes */
    raw_put("cx", ++id, "", 0), cases++;                            /* empty        */
    n = frame("cx", id + 1, id + 1, N, v), v[64 + 1234] ^= 4;       /* payload bit  */
    raw_put("cx", ++id, v, n), cases++;
    n = frame("cx", id + 1, id + 1, N, v), v[0] = 'X', recrc(v, n); /* magic        */
    raw_put("cx", ++id, v, n), cases++;
    n = frame("cx", id + 1, id + 1, N, v), v[4] = 2, recrc(v, n);   /* version      */
    raw_put("cx", ++id, v, n), cases++;
    n = frame("cx", id + 1, id + 1, N, v), v[6] = 32, recrc(v, n);  /* header size  */
    raw_put("cx", ++id, v, n), cases++;
    n = frame("cx", id + 1, id + 1, N, v), kv_le_put32(v + 16, N - 1), recrc(v, n); /* length */
    raw_put("cx", ++id, v, n), cases++;
    n = frame("cx", id + 1, id + 1, N, v), kv_le_put32(v + 20, 1), recrc(v, n); /* length hi */
    raw_put("cx", ++id, v, n), cases++;
    n = frame("cx", id + 1, id + 1, N, v), kv_le_put32(v + 56, 1), recrc(v, n); /* reserved */
    raw_put("cx", ++id, v, n), cases++;
    n = frame("cx", id + 1, id + 1, N, v), v[60] ^= 1;              /* crc          */
    raw_put("cx", ++id, v, n), cases++;
    n = frame("cx", id + 1, id + 1, N, v);                          /* truncated    */
    raw_put("cx", ++id, v, n - 1), cases++;
    n = frame("cx", id + 1, 1, N, v); /* a valid value of key 1 under another key */
    raw_put("cx", ++id, v, n), cases++;
    n = frame("other", id + 1, id + 1, N, v);                       /* namespace    */
    raw_put("cx", ++id, v, n), cases++;
    char key[128];
    kv_remote_key_t k = kv_tr_key(++id);
    kv_remote_key_string("cx", &k, key, sizeof key);
    redisReply *rep = kv_tredis_cmd(&srv, 0, "RPUSH %s a b", key);  /* a list      */
    CHECK(rep && rep->type == REDIS_REPLY_INTEGER);
    if (rep)
        freeReplyObject(rep);
    cases++;

    static uint8_t dst[N + 100];
    kv_remote_get_t g[32];
    for (uint64_t i = 2; i <= id; i++)
        g[i - 2] = (kv_remote_get_t){.key = kv_tr_key(i), .dst = dst, .cap = sizeof dst};
    memset(dst, 0xEE, sizeof dst);
    CHECK_EQ(kv_remote_get(r, g, (size_t)cases), 0);
    int miss = 0;
    for (int i = 0; i < cases; i++)
        miss += g[i].status == KV_ENOENT;
    CHECK_EQ(miss, cases);
    int untouched = 1;
    for (size_t j = 0; j < sizeof dst; j++)
        untouched &= dst[j] == 0xEE;
    CHECK(untouched);
    kv_remote_stats_t st;
    CHECK_OK(kv_remote_stats(r, &st));
    CHECK_EQ(st.corrupt, (uint64_t)cases);
    CHECK_EQ(st.errors, 0);
    /* the connection is still good after all that */
    CHECK_OK(kv_tr_get(r, 1, N, NULL));
    kv_remote_destroy(r);
}

static _Atomic int get_started;

static void *killer(void *arg)
{
    while (!get_started)
        usleep(100);
    usleep(*(int *)arg);
    kv_tredis_signal(&srv, 0, SIGKILL);
    return NULL;
}

/* Calls while the server is killed and restarted: never a wrong payload
 * (kv_tr_get checks every hit), errors while down, hits again after. The
 * first kill lands in the middle of a batch of 64 blobs of 360 KiB. */
static void test_kill_restart(void)
{
    kv_remote_t *r = kv_tr_client(srv.url, "kr", 500);
    enum { NB = 64, SZ = 30 * 3 * 4096 };
    uint8_t *big = malloc((size_t)NB * SZ);
    struct iovec iv[NB];
    kv_remote_set_t sets[NB];
    kv_remote_get_t gets[NB];
    for (int i = 0; i < NB; i++) {
        kv_tr_fill(big + (size_t)i * SZ, SZ, 50000 + i);
        iv[i] = (struct iovec){big + (size_t)i * SZ, SZ};
        sets[i] = (kv_remote_set_t){.key = kv_tr_key(50000 + i), .format = 50000u + i,
                                    .iov = &iv[i], .iovcnt = 1};
    }
    CHECK_EQ(kv_remote_set(r, sets, NB), NB);
    int delay_us = 2000, rounds = 0, partial = 0, wrong = 0, other = 0;
    pthread_t th;
    pthread_create(&th, NULL, killer, &delay_us);
    for (int hits = NB; hits == NB && rounds < 10000; rounds++) {
        memset(big, 0, (size_t)NB * SZ);
        for (int i = 0; i < NB; i++)
            gets[i] = (kv_remote_get_t){.key = kv_tr_key(50000 + i),
                                        .dst = big + (size_t)i * SZ, .cap = SZ};
        get_started = 1;
        hits = kv_remote_get(r, gets, NB);
        for (int i = 0; i < NB; i++) {
            if (gets[i].status == 0)
                wrong += !kv_tr_is(big + (size_t)i * SZ, SZ, 50000 + i);
            else
                other += gets[i].status != KV_EIO;
        }
        partial += hits > 0 && hits < NB;
    }
    pthread_join(th, NULL);
    free(big);
    CHECK_EQ(wrong, 0);
    CHECK_EQ(other, 0);
    fprintf(stderr, "killed during batch %d (%s)\n", rounds,
            partial ? "in the middle of one" : "between batches");
    usleep(100 * 1000);
    CHECK_OK(kv_tredis_restart(&srv, 0));

    double worst = 0;
    int down_errors = 0, after_hits = 0;
    for (int it = 0; it < 60; it++) {
        if (it == 20)
            CHECK_OK(kv_tredis_signal(&srv, 0, SIGKILL));
        if (it == 40) {
            usleep(100 * 1000);
            CHECK_OK(kv_tredis_restart(&srv, 0));
        }
        double t0 = kv_tr_now();
        int s1 = kv_tr_set(r, 10000 + it, 4096);
        int s2 = kv_tr_get(r, 10000 + it, 4096, NULL);
        double dt = kv_tr_now() - t0;
        worst = dt > worst ? dt : worst;
        if (it >= 21 && it < 40) {
            down_errors += s1 == KV_EIO && s2 == KV_EIO;
        }
        if (it >= 45)
            after_hits += s1 == 0 && s2 == 0;
        usleep(20 * 1000);
    }
    CHECK_EQ(down_errors, 19);
    CHECK_EQ(after_hits, 15);
    CHECK(worst < 2 * 0.5 + 0.5); /* two calls, each bounded by 0.5 s */
    kv_remote_stats_t st;
    CHECK_OK(kv_remote_stats(r, &st));
    CHECK(st.errors >= 38);
    CHECK(st.connect_failures >= 1);
    CHECK(st.connects >= 2);
    kv_remote_destroy(r);
}

static void test_stopped(void)
{
    kv_remote_t *r = kv_tr_client(srv.url, "st", 300);
    CHECK_OK(kv_tr_set(r, 1, 4096));
    CHECK_OK(kv_tredis_signal(&srv, 0, SIGSTOP));
    double t0 = kv_tr_now();
    CHECK_EQ(kv_tr_get(r, 1, 4096, NULL), -ETIMEDOUT);
    double dt = kv_tr_now() - t0;
    CHECK(dt >= 0.25 && dt < 0.3 + 0.5);
    /* a new connection to a stopped server: accepted by the kernel, silent */
    kv_remote_t *r2 = kv_tr_client(srv.url, "st", 300);
    t0 = kv_tr_now();
    int rc = kv_tr_set(r2, 2, 4096);
    dt = kv_tr_now() - t0;
    CHECK_EQ(rc, -ETIMEDOUT);
    CHECK(dt < 0.3 + 0.5);
    kv_remote_stats_t st;
    CHECK_OK(kv_remote_stats(r, &st));
    CHECK_EQ(st.timeouts, 1);
    CHECK_OK(kv_tredis_signal(&srv, 0, SIGCONT));
    int back = 0;
    for (int i = 0; i < 50 && !back; i++) {
        back = kv_tr_get(r, 1, 4096, NULL) == 0;
        usleep(20 * 1000);
    }
    CHECK(back);
    kv_remote_destroy(r2);
    kv_remote_destroy(r);
}

/* The n-th allocation fails in each call, n = 1, 2, ... until the call
 * succeeds: an error (call or key status), never a crash or a leak. */
static void test_alloc_failures(void)
{
    uint64_t live = kv_mem_live_bytes();
    kv_remote_config_t cfg = {.url = srv.url, .ns = "af"};
    kv_tr_create_failures(&cfg);
    for (int call = 0; call < 3; call++) {
        int done = 0, failures = 0;
        for (uint64_t n = 1; n < 64 && !done; n++) {
            kv_remote_t *r = kv_tr_client(srv.url, "af", 2000); /* fresh: all allocs */
            uint8_t buf[4096];
            kv_tr_fill(buf, sizeof buf, 3);
            struct iovec v = {buf, sizeof buf};
            kv_remote_set_t s = {.key = kv_tr_key(3), .format = 3, .iov = &v, .iovcnt = 1};
            kv_remote_get_t g = {.key = kv_tr_key(3), .dst = buf, .cap = sizeof buf};
            kv_remote_key_t k = kv_tr_key(3);
            int ex = -1;
            kv_fault_arm(n);
            int rc = call == 0 ? kv_remote_set(r, &s, 1)
                   : call == 1 ? kv_remote_get(r, &g, 1) : kv_remote_exists(r, &k, &ex, 1);
            int fired = kv_fault_fired();
            kv_fault_arm(0);
            int st = call == 0 ? s.status : call == 1 ? g.status : ex;
            if (fired) {
                failures++;
                CHECK(rc == KV_ENOMEM || (rc == 0 && (st == KV_ENOMEM || st == KV_EIO)));
            } else {
                CHECK_EQ(rc, 1);
                done = 1;
            }
            /* a failed set stored nothing; later calls find the blob */
            CHECK_EQ(kv_tr_get(r, 3, 4096, NULL), call == 0 && !done ? KV_ENOENT : 0);
            kv_remote_destroy(r);
        }
        CHECK(done);
        CHECK(failures >= 1);
    }
    CHECK_EQ(kv_mem_live_bytes(), live);
}

int main(void)
{
    kv_tredis_start(&srv, "single");
    test_roundtrip();
    test_corrupt();
    test_stopped();
    test_alloc_failures();
    test_kill_restart();
    kv_tredis_stop(&srv);
    return kv_test_end();
}
