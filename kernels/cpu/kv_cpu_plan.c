/* SPDX-License-Identifier: MIT */
/*
 * kv_cpu_plan.c — bookkeeping shared by the decode and prefill drivers:
 * locating token ranges of page lists, the per-thread scratch size (the
 * scratch itself comes from the backend-neutral arena, kernels/kv_kern.h).
 */
#include <assert.h>

#include "kv_cpu.h"

void kv_cpu_split(const kv_kern_page_t *pages, uint32_t len,
                       uint32_t part, kv_cpu_span_t *out)
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
        out[k] = (kv_cpu_span_t){.pages = pages, .page0 = pi,
                                      .off0 = off, .t_begin = t0,
                                      .t_end = t1};
        t0 = t1;
    }
}

size_t kv_cpu_thread_floats(uint32_t head_dim, uint32_t max_rows)
{
    /* tiles, a row of logits per query row, a head_dim row per query row
     * (rotated pages: q rotated, then the rotated sum p * v) */
    return 2u * (size_t)KV_CPU_TILE_FLOATS +
           (size_t)(max_rows ? max_rows : 1) *
               (kv_cpu_tile_stride(head_dim) + head_dim);
}
