/* SPDX-License-Identifier: MIT */
/*
 * kv_bench_util.h — small helpers shared by kvbench-hash and kvbench-remote:
 * a monotonic clock in seconds, the median of a sample (sorts it), and a
 * deterministic PRNG (splitmix64) for inputs.
 */
#ifndef KV_BENCH_UTIL_H
#define KV_BENCH_UTIL_H

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>

static inline double kv_bench_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static inline int kv_bench_cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The median of v[0..n-1] (n >= 1); sorts v. */
static inline double kv_bench_median(double *v, size_t n)
{
    qsort(v, n, sizeof *v, kv_bench_cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static inline uint64_t kv_bench_rand(uint64_t *s)
{
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

#endif /* KV_BENCH_UTIL_H */
