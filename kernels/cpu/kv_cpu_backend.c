/* SPDX-License-Identifier: MIT */
/*
 * kv_cpu_backend.c — the CPU reference backend: context and ops table.
 *
 * The context holds the workers (n_threads workers: the caller plus
 * n_threads - 1 helper threads, started here and joined at destroy) and the
 * best build of the hot loops the CPU runs (kv_cpu_isa.c; every build gives
 * identical results), and the format table its tasks run: that build's,
 * or with KV_BACKEND_INT8 the approximate int8 INT steps
 * (kv_cpu_fmt_i8.c). It is immutable after create; concurrent attention
 * calls each have their own scratch (the workers serve one call at a time,
 * others run on their caller).
 */
#include <string.h>
#include <unistd.h>

#include "alloc/kv_mem.h"
#include "kv_cpu.h"
#include "kv_cpu_convert.h"
#include "kv_cpu_score.h"

#define KV_CPU_MAX_THREADS 1024u

static void cpu_destroy(void *ctx)
{
    kv_cpu_t *cx = ctx;
    if (!cx)
        return;
    kv_workers_destroy(cx->workers);
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
    .zip_score = kv_cpu_zip_score,
};

int kv_backend_cpu_create(uint32_t n_threads, uint32_t flags,
                          kv_backend_t *out)
{
    if (!out || n_threads > KV_CPU_MAX_THREADS || (flags & ~KV_BACKEND_INT8))
        return KV_EINVAL;
    if ((flags & KV_BACKEND_INT8) && !kv_cpu_has_i8())
        return KV_ENOTSUP;
    if (n_threads == 0) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        n_threads = n < 1 ? 1u : n > KV_CPU_MAX_THREADS ? KV_CPU_MAX_THREADS
                                                        : (uint32_t)n;
    }
    kv_cpu_t *cx = kv_mem_alloc(sizeof *cx);
    if (!cx)
        return KV_ENOMEM;
    int rc = kv_workers_create(n_threads, &cx->workers);
    if (rc) {
        kv_mem_free(cx, sizeof *cx);
        return rc;
    }
    uint32_t nb;
    const kv_cpu_loops_t *const *b = kv_cpu_builds(&nb);
    cx->loops = b[nb - 1];
    cx->int8 = (flags & KV_BACKEND_INT8) != 0; /* only where kv_cpu_has_i8 */
#ifdef KV_CPU_X86
    if (cx->int8) {
        memcpy(cx->i8_fmt, cx->loops->fmt, sizeof cx->i8_fmt);
        cx->i8_fmt[KV_FMT_INT4].score = kv_cpu_i8_int4_score;
        cx->i8_fmt[KV_FMT_INT4].accum = kv_cpu_i8_int4_accum;
        cx->i8_fmt[KV_FMT_INT2].score = kv_cpu_i8_int2_score;
        cx->i8_fmt[KV_FMT_INT2].accum = kv_cpu_i8_int2_accum;
    }
#endif
    out->ops = &cpu_ops;
    out->ctx = cx;
    return 0;
}
