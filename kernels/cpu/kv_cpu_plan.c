/*
 * kv_cpu_plan.c — bookkeeping shared by the decode and prefill drivers:
 * locating token ranges in page lists and per-call scratch carving.
 *
 * Scratch is sized in a first pass over the same carving code that later
 * hands it out (base == NULL while sizing), so the two cannot disagree; it is
 * one kv_mem block per call (so failure injection and leak accounting see
 * it), aligned to KV_CPU_ALIGN.
 */
#include <assert.h>
#include <string.h>

#include "alloc/kv_mem.h"
#include "kv_cpu.h"

void kv_kern_cpu_split(const kv_kern_page_t *pages, uint32_t len,
                       uint32_t part, kv_kern_cpu_span_t *out)
{
    assert(part > 0 && len > 0);
    uint32_t pi = 0, off = 0, at = 0; /* token `at` is token off of page pi */
    for (uint32_t k = 0, t0 = 0; t0 < len; k++) {
        uint32_t t1 = len - t0 > part ? t0 + part : len;
        while (at < t0) { /* advance to token t0 (t0 < len: pi stays valid) */
            uint32_t left = pages[pi].n_tokens - off;
            if (t0 - at < left) {
                off += t0 - at;
                at = t0;
            } else {
                at += left;
                pi++;
                off = 0;
            }
        }
        out[k] = (kv_kern_cpu_span_t){.pages = pages, .page0 = pi,
                                      .off0 = off, .t_begin = t0,
                                      .t_end = t1};
        t0 = t1;
    }
}

void *kv_kern_cpu_take(kv_kern_cpu_arena_t *a, size_t n)
{
    size_t at = a->used;
    a->used += (n + KV_CPU_ALIGN - 1) / KV_CPU_ALIGN * KV_CPU_ALIGN;
    return a->base ? a->base + at : NULL;
}

int kv_kern_cpu_arena_alloc(kv_kern_cpu_arena_t *a)
{
    a->block_bytes = a->used + KV_CPU_ALIGN;
    a->block = kv_mem_alloc(a->block_bytes);
    if (!a->block)
        return KV_ENOMEM;
    uintptr_t p = (uintptr_t)a->block;
    a->base = (char *)((p + KV_CPU_ALIGN - 1) & ~(uintptr_t)(KV_CPU_ALIGN - 1));
    a->used = 0;
    return 0;
}

void kv_kern_cpu_arena_free(kv_kern_cpu_arena_t *a)
{
    kv_mem_free(a->block, a->block_bytes);
    a->block = NULL;
    a->base = NULL;
}
