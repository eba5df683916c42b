/*
 * kv_cpu_backend.c — the CPU reference backend: context and ops table.
 *
 * The context holds the worker pool (n_threads workers: the caller plus
 * n_threads - 1 helper threads, started here and joined at destroy) and the
 * hot-loop build picked once here (AVX2+FMA+F16C when the CPU has them, else
 * the baseline build; both give identical results). It is immutable after
 * create; concurrent attention calls each have their own scratch (the pool
 * serves one call at a time, others run on their caller).
 */
#include <unistd.h>

#include "alloc/kv_mem.h"
#include "kv_cpu.h"
#include "kv_cpu_convert.h"

#define KV_CPU_MAX_THREADS 1024u

static const kv_cpu_loops_t *pick_loops(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    int ok = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#ifndef __clang__ /* older clang has no "f16c" here; AVX2 CPUs all have it */
    ok = ok && __builtin_cpu_supports("f16c");
#endif
    if (ok)
        return &kv_cpu_loops_avx2;
#endif
    return &kv_cpu_loops_generic;
}

static void cpu_destroy(void *ctx)
{
    kv_cpu_t *cx = ctx;
    if (!cx)
        return;
    kv_pool_destroy(cx->pool);
    kv_mem_free(cx, sizeof *cx);
}

static const kv_backend_ops_t cpu_ops = {
    .name = "cpu",
    .attn_decode = kv_cpu_decode,
    .attn_prefill = kv_cpu_prefill,
    .destroy = cpu_destroy,
    .convert = kv_cpu_convert,
    .merge_select = kv_cpu_merge_select,
    .merge = kv_cpu_merge,
};

int kv_backend_cpu_create(uint32_t n_threads, kv_backend_t *out)
{
    if (!out || n_threads > KV_CPU_MAX_THREADS)
        return KV_EINVAL;
    if (n_threads == 0) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        n_threads = n < 1 ? 1u : n > KV_CPU_MAX_THREADS ? KV_CPU_MAX_THREADS
                                                        : (uint32_t)n;
    }
    kv_cpu_t *cx = kv_mem_alloc(sizeof *cx);
    if (!cx)
        return KV_ENOMEM;
    int rc = kv_pool_create(n_threads, &cx->pool);
    if (rc) {
        kv_mem_free(cx, sizeof *cx);
        return rc;
    }
    cx->loops = pick_loops();
    out->ops = &cpu_ops;
    out->ctx = cx;
    return 0;
}
