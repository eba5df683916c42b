/* SPDX-License-Identifier: MIT */
/*
 * kv_test_remote.h — helpers of the remote tier's tests: deterministic keys
 * and payloads, one-blob set/get, a client for a url with short timeouts,
 * and the allocation-failure loops every client configuration runs.
 */
#ifndef KV_TEST_REMOTE_H
#define KV_TEST_REMOTE_H

#include <string.h>
#include <time.h>

#include "alloc/kv_mem.h"
#include "kv_test.h"
#include "remote/kv_remote.h"

static inline kv_remote_key_t kv_tr_key(uint64_t id)
{
    kv_remote_key_t k;
    uint64_t s = id * 0x9E3779B97F4A7C15ull + 17;
    for (int i = 0; i < 32; i += 8) {
        uint64_t v = kv_test_rand(&s);
        memcpy(k.hash + i, &v, 8);
    }
    return k;
}

/* Payload byte j of blob id. */
static inline uint8_t kv_tr_byte(uint64_t id, size_t j)
{
    return (uint8_t)(id * 131 + j * 7 + (j >> 8));
}

static inline void kv_tr_fill(uint8_t *p, size_t n, uint64_t id)
{
    for (size_t j = 0; j < n; j++)
        p[j] = kv_tr_byte(id, j);
}

static inline int kv_tr_is(const uint8_t *p, size_t n, uint64_t id)
{
    for (size_t j = 0; j < n; j++)
        if (p[j] != kv_tr_byte(id, j))
            return 0;
    return 1;
}

static inline double kv_tr_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static inline kv_remote_t *kv_tr_client(const char *url, const char *ns, uint32_t timeout_ms)
{
    kv_remote_config_t cfg = {.url = url, .ns = ns, .timeout_ms = timeout_ms,
                              .backoff_ms = 20, .backoff_max_ms = 200};
    kv_remote_t *r = NULL;
    CHECK_OK(kv_remote_create(&cfg, &r));
    return r;
}

/* r's counters (kv_remote_stats, checked to succeed). */
static inline kv_remote_stats_t kv_tr_stats(const kv_remote_t *r)
{
    kv_remote_stats_t st;
    CHECK_OK(kv_remote_stats(r, &st));
    return st;
}

/* Store blob id (n bytes, format id) under key(id); the status. */
static inline int kv_tr_set(kv_remote_t *r, uint64_t id, size_t n)
{
    uint8_t *p = malloc(n ? n : 1);
    kv_tr_fill(p, n, id);
    struct iovec v = {p, n};
    kv_remote_set_t s = {.key = kv_tr_key(id), .format = (uint32_t)id, .iov = &v, .iovcnt = 1};
    int rc = kv_remote_set(r, &s, 1);
    free(p);
    return rc == 1 ? 0 : rc < 0 ? rc : s.status;
}

/* Fetch key(id) into a buffer of cap bytes: the status; *len the length.
 * A hit must carry blob id's bytes and format (checked here). */
static inline int kv_tr_get(kv_remote_t *r, uint64_t id, size_t cap, size_t *len)
{
    uint8_t *p = malloc(cap ? cap : 1);
    kv_remote_get_t g = {.key = kv_tr_key(id), .dst = cap ? p : NULL, .cap = cap};
    int rc = kv_remote_get(r, &g, 1);
    if (rc == 1) {
        CHECK(g.status == 0 && kv_tr_is(p, g.len, id));
        CHECK_EQ(g.format, (uint32_t)id);
    }
    free(p);
    if (len)
        *len = g.len;
    return rc < 0 ? rc : g.status;
}

/* The n-th allocation of kv_remote_create(cfg) fails, n = 1, 2, ... until
 * it succeeds: KV_ENOMEM and no client each time, nothing leaked. Returns
 * the failures (checked >= 1). */
static inline int kv_tr_create_failures(const kv_remote_config_t *cfg)
{
    const uint64_t live = kv_mem_live_bytes();
    int failures = 0, created = 0;
    for (uint64_t n = 1; n < 100 && !created; n++) {
        kv_remote_t *r = NULL;
        kv_fault_arm(n);
        int rc = kv_remote_create(cfg, &r);
        int fired = kv_fault_fired();
        kv_fault_arm(0);
        CHECK(fired ? rc == KV_ENOMEM && !r : rc == 0);
        failures += fired;
        created = !fired;
        kv_remote_destroy(r);
        CHECK_EQ(kv_mem_live_bytes(), live);
    }
    CHECK(created && failures >= 1);
    return failures;
}

/* On a fresh client of cfg each time (so its first call connects, and
 * authenticates or shakes hands as cfg says), the n-th allocation of a get
 * of blob id (cap bytes; stored before) fails, n = 1, 2, ... until the get
 * succeeds: KV_ENOMEM, or the key's status KV_ENOMEM / KV_EIO, never a
 * refusal counted as AUTH or TLS; the next get on that client works; nothing
 * leaked. Returns the failures (checked >= 1). */
static inline int kv_tr_get_failures(const kv_remote_config_t *cfg, uint64_t id, size_t cap)
{
    const uint64_t live = kv_mem_live_bytes();
    int failures = 0, done = 0;
    uint8_t *buf = malloc(cap);
    CHECK(buf != NULL);
    for (uint64_t n = 1; n < 100 && !done && buf; n++) {
        kv_remote_t *r = NULL;
        CHECK_OK(kv_remote_create(cfg, &r));
        kv_remote_get_t g = {.key = kv_tr_key(id), .dst = buf, .cap = cap};
        kv_fault_arm(n);
        int rc = kv_remote_get(r, &g, 1);
        int fired = kv_fault_fired();
        kv_fault_arm(0);
        if (fired) {
            failures++;
            CHECK(rc == KV_ENOMEM || (rc == 0 && (g.status == KV_ENOMEM || g.status == KV_EIO)));
        } else {
            CHECK_EQ(rc, 1);
            done = 1;
        }
        const kv_remote_stats_t st = kv_tr_stats(r);
        CHECK_EQ(st.auth_failures, 0);
        CHECK_EQ(st.tls_failures, 0);
        CHECK_OK(kv_tr_get(r, id, cap, NULL)); /* and then it works */
        kv_remote_destroy(r);
    }
    free(buf);
    CHECK(done && failures >= 1);
    CHECK_EQ(kv_mem_live_bytes(), live);
    return failures;
}

#endif /* KV_TEST_REMOTE_H */
