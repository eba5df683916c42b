/* SPDX-License-Identifier: MIT */
/*
 * test_remote_pub.c — the remote tier's publisher (kv_remote_pub_*) against
 * a real redis-server started by this test:
 *   - 2000 blobs put, flushed, all readable, counters add up;
 *   - the server SIGSTOPped: puts never block (each returns in far less than
 *     the client's timeout), the queue fills to its bound and further puts
 *     are dropped and counted (KV_ELIMIT); flush times out; after SIGCONT
 *     the queued blobs are stored;
 *   - the byte bound drops a blob that would exceed it;
 *   - destroy with blobs still queued (server stopped again): returns within
 *     the client's timeout, discards and counts them, leaks nothing
 *     (kv_mem_live_bytes; LSan in the sanitizer build);
 *   - bad input and allocation failures in create and put.
 */
#include <errno.h>
#include <signal.h>

#include "alloc/kv_mem.h"
#include "kv_test_redis.h"
#include "kv_test_remote.h"

static kv_tredis_t srv;

static kv_remote_pub_t *pub(const char *ns, uint32_t items, uint64_t bytes, uint32_t timeout)
{
    kv_remote_config_t cfg = {.url = srv.url, .ns = ns, .timeout_ms = timeout,
                              .backoff_ms = 20, .backoff_max_ms = 100};
    kv_remote_pub_t *p = NULL;
    CHECK_OK(kv_remote_pub_create(&cfg, items, bytes, 32, &p));
    return p;
}

static int put(kv_remote_pub_t *p, uint64_t id, size_t n)
{
    uint8_t buf[8192];
    kv_tr_fill(buf, n, id);
    struct iovec v = {buf, n};
    kv_remote_key_t k = kv_tr_key(id);
    return kv_remote_pub_put(p, &k, (uint32_t)id, &v, 1);
}

static void test_publish(void)
{
    uint64_t live = kv_mem_live_bytes();
    kv_remote_pub_t *p = pub("p1", 4096, 0, 2000); /* room for all 2000 */
    for (uint64_t i = 0; i < 2000; i++)
        CHECK_OK(put(p, i, 1000 + i % 3000));
    CHECK_OK(kv_remote_pub_flush(p, 10000));
    kv_remote_t *r = kv_tr_client(srv.url, "p1", 2000);
    int good = 0;
    for (uint64_t i = 0; i < 2000; i++) {
        size_t len = 0;
        good += kv_tr_get(r, i, 8192, &len) == 0 && len == 1000 + i % 3000;
    }
    CHECK_EQ(good, 2000);
    kv_remote_destroy(r);
    kv_remote_pub_stats_t st;
    CHECK_OK(kv_remote_pub_stats(p, &st));
    CHECK_EQ(st.queued, 2000);
    CHECK_EQ(st.published, 2000);
    CHECK_EQ(st.dropped + st.failed + st.queue_items + st.queue_bytes, 0);
    CHECK_EQ(st.client.stored, 2000);
    kv_remote_pub_destroy(p);
    CHECK_EQ(kv_mem_live_bytes(), live);
}

static void test_full_queue(void)
{
    uint64_t live = kv_mem_live_bytes();
    kv_remote_pub_t *p = pub("p2", 8, 0, 500);
    CHECK_OK(put(p, 0, 100)); /* connects before the server stops */
    CHECK_OK(kv_remote_pub_flush(p, 5000));
    CHECK_OK(kv_tredis_signal(&srv, 0, SIGSTOP));
    double worst = 0;
    int queued = 0, dropped = 0, other = 0;
    for (uint64_t i = 1; i <= 100; i++) {
        double t0 = kv_tr_now();
        int rc = put(p, i, 4096);
        double dt = kv_tr_now() - t0;
        worst = dt > worst ? dt : worst;
        queued += rc == 0;
        dropped += rc == KV_ELIMIT;
        other += rc != 0 && rc != KV_ELIMIT;
    }
    CHECK(worst < 0.1); /* never waits for the server (timeout 0.5 s) */
    CHECK(queued >= 8 && queued <= 8 + 32 + 1); /* the queue, and one batch in flight */
    CHECK_EQ(queued + dropped, 100);
    CHECK_EQ(other, 0);
    CHECK_EQ(kv_remote_pub_flush(p, 100), -ETIMEDOUT);
    kv_remote_pub_stats_t st;
    CHECK_OK(kv_remote_pub_stats(p, &st));
    CHECK_EQ(st.dropped, (uint64_t)dropped);
    CHECK(st.queue_items <= 8);
    CHECK_OK(kv_tredis_signal(&srv, 0, SIGCONT));
    /* what was queued goes out (some of it may have timed out meanwhile) */
    CHECK_OK(kv_remote_pub_flush(p, 10000));
    CHECK_OK(kv_remote_pub_stats(p, &st));
    CHECK_EQ(st.published + st.failed, (uint64_t)queued + 1);
    CHECK(st.published >= 1);
    CHECK_EQ(st.queue_items, 0);
    /* queued again: the blob goes out now that the server is back */
    usleep(150 * 1000); /* past the backoff */
    CHECK_OK(put(p, 500, 10));
    CHECK_OK(kv_remote_pub_flush(p, 5000));
    kv_remote_t *r = kv_tr_client(srv.url, "p2", 2000);
    CHECK_OK(kv_tr_get(r, 500, 100, NULL));
    kv_remote_destroy(r);

    /* the byte bound */
    kv_remote_pub_t *q = pub("p3", 1000, 10000, 500);
    CHECK_OK(kv_tredis_signal(&srv, 0, SIGSTOP));
    int rc1 = put(q, 1, 6000), rc2 = put(q, 2, 6000), rc3 = put(q, 3, 6000);
    CHECK_OK(rc1);
    CHECK(rc2 == KV_ELIMIT || rc3 == KV_ELIMIT); /* (the first may be in flight) */

    /* destroy with blobs queued, the server silent: bounded, nothing leaks */
    for (uint64_t i = 600; i < 620; i++)
        put(p, i, 4096);
    double t0 = kv_tr_now();
    kv_remote_pub_destroy(p);
    kv_remote_pub_destroy(q);
    double dt = kv_tr_now() - t0;
    CHECK(dt < 2 * 0.5 + 0.5);
    CHECK_OK(kv_tredis_signal(&srv, 0, SIGCONT));
    CHECK_EQ(kv_mem_live_bytes(), live);
}

static void test_bad_input(void)
{
    kv_remote_config_t cfg = {.url = srv.url};
    kv_remote_pub_t *p = NULL;
    CHECK_EQ(kv_remote_pub_create(&cfg, 0, 0, 0, NULL), KV_EINVAL);
    CHECK_EQ(kv_remote_pub_create(NULL, 0, 0, 0, &p), KV_EINVAL);
    CHECK_EQ(kv_remote_pub_create(&cfg, (1u << 20) + 1, 0, 0, &p), KV_ERANGE);
    CHECK_EQ(kv_remote_pub_create(&cfg, 0, 0, KV_REMOTE_MAX_BATCH + 1, &p), KV_ERANGE);
    cfg.url = "http://x:1";
    CHECK_EQ(kv_remote_pub_create(&cfg, 0, 0, 0, &p), KV_EINVAL);
    CHECK(p == NULL);
    p = pub("p4", 0, 0, 1000);
    kv_remote_key_t k = kv_tr_key(1);
    struct iovec v = {NULL, 5}, big = {(void *)&k, (size_t)KV_REMOTE_MAX_PAYLOAD + 1};
    CHECK_EQ(kv_remote_pub_put(NULL, &k, 0, NULL, 0), KV_EINVAL);
    CHECK_EQ(kv_remote_pub_put(p, NULL, 0, NULL, 0), KV_EINVAL);
    CHECK_EQ(kv_remote_pub_put(p, &k, 0, NULL, 1), KV_EINVAL);
    CHECK_EQ(kv_remote_pub_put(p, &k, 0, &v, 1), KV_EINVAL);
    CHECK_EQ(kv_remote_pub_put(p, &k, 0, &v, -1), KV_EINVAL);
    CHECK_EQ(kv_remote_pub_put(p, &k, 0, &big, 1), KV_ERANGE);
    CHECK_OK(kv_remote_pub_put(p, &k, 0, NULL, 0)); /* an empty blob is fine */
    CHECK_EQ(kv_remote_pub_flush(NULL, 10), KV_EINVAL);
    kv_remote_pub_stats_t st;
    CHECK_EQ(kv_remote_pub_stats(NULL, &st), KV_EINVAL);
    CHECK_EQ(kv_remote_pub_stats(p, NULL), KV_EINVAL);
    kv_remote_pub_destroy(p);
    kv_remote_pub_destroy(NULL);
}

static void test_alloc_failures(void)
{
    uint64_t live = kv_mem_live_bytes();
    kv_remote_config_t cfg = {.url = srv.url, .ns = "p5"};
    int ok = 0, failures = 0;
    for (uint64_t n = 1; n < 64 && !ok; n++) {
        kv_remote_pub_t *p = NULL;
        kv_fault_arm(n);
        int rc = kv_remote_pub_create(&cfg, 0, 0, 0, &p);
        int fired = kv_fault_fired();
        kv_fault_arm(0);
        if (fired) {
            CHECK_EQ(rc, KV_ENOMEM);
            CHECK(p == NULL);
            failures++;
        } else {
            CHECK_OK(rc);
            ok = 1;
            /* a put whose copy cannot be allocated is dropped and counted */
            kv_fault_arm(1);
            CHECK_EQ(put(p, 1, 100), KV_ENOMEM);
            kv_fault_arm(0);
            kv_remote_pub_stats_t st;
            CHECK_OK(kv_remote_pub_stats(p, &st));
            CHECK_EQ(st.dropped, 1);
            CHECK_OK(put(p, 2, 100));
            CHECK_OK(kv_remote_pub_flush(p, 5000));
        }
        kv_remote_pub_destroy(p);
        CHECK_EQ(kv_mem_live_bytes(), live);
    }
    CHECK(ok);
    CHECK(failures >= 5);
}

int main(void)
{
    kv_tredis_start(&srv, "single");
    test_publish();
    test_full_queue();
    test_bad_input();
    test_alloc_failures();
    kv_tredis_stop(&srv);
    return kv_test_end();
}
