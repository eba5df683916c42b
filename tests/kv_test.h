/* SPDX-License-Identifier: MIT */
/*
 * kv_test.h — the tiny test harness shared by every test program.
 *
 * CHECK(cond) records a failure (file:line and the condition) and goes on;
 * CHECK_EQ(a, b) prints both integer values; CHECK_OK(expr) expects 0 and
 * prints kv_strerror() otherwise. A test's main ends with `return kv_test_end();`
 * which prints "N passed, N failed" and returns 0, or 1 on any failure.
 * KV_TEST_SKIP(why) exits 77 (CTest "skipped") and is only for a condition
 * that was actually detected (no GPU, no io_uring). kvt_seq_same compares
 * two sequences (of one store or two) bit for bit.
 */
#ifndef KV_TEST_H
#define KV_TEST_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvpage/kvpage.h"

static long kv_test_pass_, kv_test_fail_;

#define CHECK(cond)                                                          \
    do {                                                                     \
        if (cond) {                                                          \
            kv_test_pass_++;                                                 \
        } else {                                                             \
            kv_test_fail_++;                                                 \
            fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, \
                    #cond);                                                  \
        }                                                                    \
    } while (0)

#define CHECK_EQ(a, b)                                                        \
    do {                                                                      \
        long long a_ = (long long)(a), b_ = (long long)(b);                   \
        if (a_ == b_) {                                                       \
            kv_test_pass_++;                                                  \
        } else {                                                              \
            kv_test_fail_++;                                                  \
            fprintf(stderr, "%s:%d: CHECK_EQ failed: %s == %lld, %s == %lld\n", \
                    __FILE__, __LINE__, #a, a_, #b, b_);                      \
        }                                                                     \
    } while (0)

#define CHECK_OK(expr)                                                        \
    do {                                                                      \
        int r_ = (expr);                                                      \
        if (r_ == 0) {                                                        \
            kv_test_pass_++;                                                  \
        } else {                                                              \
            kv_test_fail_++;                                                  \
            fprintf(stderr, "%s:%d: %s returned %d (%s)\n", __FILE__,         \
                    __LINE__, #expr, r_, kv_strerror(r_));                    \
        }                                                                     \
    } while (0)

#define KV_TEST_SKIP(why)                                                     \
    do {                                                                      \
        fprintf(stderr, "skipped: %s\n", why);                                \
        exit(77);                                                             \
    } while (0)

static inline int kv_test_end(void)
{
    printf("%ld passed, %ld failed\n", kv_test_pass_, kv_test_fail_);
    return kv_test_fail_ ? 1 : 0;
}

/* Deterministic PRNG for tests (splitmix64). */
static inline uint64_t kv_test_rand(uint64_t *s)
{
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
/* Uniform float in [-1, 1). */
static inline float kv_test_randf(uint64_t *s)
{
    return (float)((kv_test_rand(s) >> 40) * (1.0 / 8388608.0)) - 1.0f;
}

/* 1 if every list (nl layers x nkv kv heads, head_dim hd) of a in sa and b
 * in sb holds the same tokens: count, K, V and positions, bit for bit (a
 * read that fails: 0). */
static inline int kvt_seq_same(const kv_store_t *sa, kv_seq_id_t a, const kv_store_t *sb,
                               kv_seq_id_t b, uint32_t nl, uint32_t nkv, uint32_t hd)
{
    int same = 1;
    for (uint32_t l = 0; l < nl && same; l++)
        for (uint32_t h = 0; h < nkv && same; h++) {
            uint32_t na = 0, nb = 0;
            if (kv_seq_len(sa, a, l, h, &na) || kv_seq_len(sb, b, l, h, &nb) || na != nb)
                return 0;
            const size_t m = (size_t)na * hd; /* K then V of a, then of b */
            float *k = (float *)malloc((4 * m + 1) * sizeof *k);
            int32_t *p = (int32_t *)malloc((2 * (size_t)na + 1) * sizeof *p);
            same = k && p && !kv_read(sa, a, l, h, 0, na, k, k + m, p) &&
                   !kv_read(sb, b, l, h, 0, nb, k + 2 * m, k + 3 * m, p + na) &&
                   !memcmp(k, k + 2 * m, 2 * m * sizeof *k) &&
                   !memcmp(p, p + na, (size_t)na * sizeof *p);
            free(k);
            free(p);
        }
    return same;
}

#endif /* KV_TEST_H */
