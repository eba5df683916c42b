/* SPDX-License-Identifier: MIT */
/*
 * kv_fmt_fp16.c — the FP16 page format (kv_fmt_fp16.h; layout in
 * kv_fmt_layout.h).
 *
 * K rows [T][D] then V rows [T][D] of IEEE binary16, T = page_bytes / (4*D).
 * Rows of one half are contiguous, so loads and stores of a token range are
 * single bulk conversions (F16C when present, kv_half.c). Callers validate
 * ranges (t0 + n <= T) and values before calling; these functions only
 * assert. The functions are reached through kv_fmt_fp16 and
 * kv_format_table[KV_FMT_FP16] (kv_format.c).
 */
#include "kv_fmt_fp16.h"

#include <assert.h>
#include <string.h>

uint32_t kv_fmt_fp16_tokens_per_page(const kv_page_geom_t *g)
{
    return g ? kv_fmt_fp16_tpp(g->head_dim, g->page_bytes) : 0;
}

void kv_fmt_fp16_load(const void *page, const kv_page_geom_t *g, uint32_t t0,
                      uint32_t n, float *k, float *v)
{
    uint32_t tpp = kv_fmt_fp16_tokens_per_page(g);
    size_t cnt = (size_t)n * g->head_dim;
    assert((uint64_t)t0 + n <= tpp);
    if (k)
        kv_half_to_float_n(kv_fp16_k((void *)page, g, tpp, t0), k, cnt);
    if (v)
        kv_half_to_float_n(kv_fp16_v((void *)page, g, tpp, t0), v, cnt);
}

/* Write n rows of one half (K or V) starting at dst from src rows that are
 * src_stride elements apart. */
static void store_rows(kv_half_t *dst, uint32_t n, uint32_t d,
                       kv_dtype_t dtype, const void *src, size_t src_stride)
{
    if (dtype == KV_DTYPE_F32) {
        const float *s = src;
        if (src_stride == d) {
            kv_half_from_float_n(s, dst, (size_t)n * d);
            return;
        }
        for (uint32_t r = 0; r < n; r++)
            kv_half_from_float_n(s + r * src_stride, dst + (size_t)r * d, d);
    } else {
        const kv_half_t *s = src;
        assert(dtype == KV_DTYPE_F16);
        if (src_stride == d) {
            memcpy(dst, s, (size_t)n * d * sizeof *dst);
            return;
        }
        for (uint32_t r = 0; r < n; r++)
            memcpy(dst + (size_t)r * d, s + r * src_stride, d * sizeof *dst);
    }
}

void kv_fmt_fp16_store(void *page, const kv_page_geom_t *g, uint32_t t0,
                       uint32_t n, kv_dtype_t dtype, const void *k,
                       const void *v, size_t src_stride)
{
    uint32_t tpp = kv_fmt_fp16_tokens_per_page(g);
    assert((uint64_t)t0 + n <= tpp);
    assert(src_stride >= g->head_dim);
    if (k)
        store_rows(kv_fp16_k(page, g, tpp, t0), n, g->head_dim, dtype, k,
                   src_stride);
    if (v)
        store_rows(kv_fp16_v(page, g, tpp, t0), n, g->head_dim, dtype, v,
                   src_stride);
}

void kv_fmt_fp16_copy(void *dst, uint32_t d0, const void *src, uint32_t s0,
                      uint32_t n, const kv_page_geom_t *g)
{
    uint32_t tpp = kv_fmt_fp16_tokens_per_page(g);
    size_t bytes = (size_t)n * g->head_dim * sizeof(kv_half_t);
    assert((uint64_t)d0 + n <= tpp && (uint64_t)s0 + n <= tpp);
    /* memmove: in-place compaction (dst == src, d0 <= s0) overlaps. */
    memmove(kv_fp16_k(dst, g, tpp, d0), kv_fp16_k((void *)src, g, tpp, s0),
            bytes);
    memmove(kv_fp16_v(dst, g, tpp, d0), kv_fp16_v((void *)src, g, tpp, s0),
            bytes);
}

const kv_format_traits_t kv_fmt_fp16 = KV_FMT_FP16_TRAITS;

int kv_fmt_fp16_cost(const kv_page_geom_t *g, uint32_t sub, kv_format_cost_t *out)
{
    if (sub != KV_FMT_FP16)
        return -1;
    *out = (kv_format_cost_t){.bits = 8.0 * sizeof(kv_half_t), .group = 0,
                              .tokens_per_page = kv_fmt_fp16_tokens_per_page(g)};
    return 0;
}
