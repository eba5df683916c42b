/* SPDX-License-Identifier: MIT */
/*
 * kv_offload_stage.c — staging runs (see kv_offload_stage.h).
 *
 * First fit from a roving cursor over a bitmap: I/Os finish roughly in the
 * order they started, so the cursor usually lands on a free stretch at once.
 * Worst case one pass over the bitmap (a few thousand units).
 */
#include "offload/kv_offload_stage.h"

#include <assert.h>
#include <string.h>

#include "alloc/kv_mem.h"
#include "kvpage/kvpage.h"

static int kv_stage_bit(const kv_offload_stage_t *st, uint32_t u)
{
    return (int)((st->used[u / 64] >> (u % 64)) & 1u);
}

static void kv_stage_set(kv_offload_stage_t *st, uint32_t first, uint32_t n, int on)
{
    for (uint32_t u = first; u < first + n; u++) {
        assert(kv_stage_bit(st, u) != on);
        if (on)
            st->used[u / 64] |= 1ull << (u % 64);
        else
            st->used[u / 64] &= ~(1ull << (u % 64));
    }
}

int kv_offload_stage_init(kv_offload_stage_t *st, uint32_t unit_bytes, uint32_t units,
                          uint32_t align)
{
    memset(st, 0, sizeof *st);
    st->unit_bytes = unit_bytes;
    st->units = units; /* before any allocation: fini sizes blocks by it */
    size_t bytes = (size_t)unit_bytes * units;
    st->raw_bytes = bytes + align;
    st->raw = kv_mem_alloc(st->raw_bytes);
    st->used = kv_mem_calloc((units + 63u) / 64u, sizeof *st->used);
    if (!st->raw || !st->used) {
        kv_offload_stage_fini(st);
        return KV_ENOMEM;
    }
    uintptr_t p = ((uintptr_t)st->raw + align - 1u) & ~(uintptr_t)(align - 1u);
    st->base = (uint8_t *)p;
    memset(st->base, 0, bytes); /* touch it now, not on the I/O path */
    return 0;
}

void kv_offload_stage_fini(kv_offload_stage_t *st)
{
    kv_mem_free(st->raw, st->raw_bytes);
    if (st->used)
        kv_mem_free(st->used, ((st->units + 63u) / 64u) * sizeof *st->used);
    memset(st, 0, sizeof *st);
}

int64_t kv_offload_stage_alloc(kv_offload_stage_t *st, uint32_t want, uint32_t *got)
{
    assert(want >= 1);
    if (st->n_used == st->units)
        return -1;
    uint32_t best = 0, best_len = 0, u = st->cursor, seen = 0;
    if (u >= st->units)
        u = 0;
    while (seen < st->units) {
        if (kv_stage_bit(st, u)) {
            u++;
            seen++;
            if (u == st->units)
                u = 0;
            continue;
        }
        /* a free run starting at u (runs do not wrap around the end) */
        uint32_t len = 0;
        while (u + len < st->units && len < want && !kv_stage_bit(st, u + len))
            len++;
        if (len > best_len) {
            best = u;
            best_len = len;
            if (len == want)
                break;
        }
        u += len;
        seen += len;
        if (u >= st->units)
            u = 0;
    }
    assert(best_len >= 1);
    kv_stage_set(st, best, best_len, 1);
    st->n_used += best_len;
    st->cursor = best + best_len;
    *got = best_len;
    return best;
}

void kv_offload_stage_free(kv_offload_stage_t *st, uint32_t first, uint32_t n)
{
    assert(first + n <= st->units && n <= st->n_used);
    kv_stage_set(st, first, n, 0);
    st->n_used -= n;
}
