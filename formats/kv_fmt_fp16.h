/* SPDX-License-Identifier: MIT */
/*
 * kv_fmt_fp16.h — the FP16 page format (KV_FMT_FP16 = 0).
 *
 * Byte layout (kv_fmt_layout.h): K rows [T][D] then V rows [T][D] of IEEE
 * binary16, token-major, T = floor(page_bytes / (4 * D)); no header: the
 * page table records the format and how many of the T rows are in use
 * (rows 0..n-1).
 *
 * This is the only format kv_append writes; the newest tokens of every list
 * sit in an FP16 tail page.
 */
#ifndef KV_FMT_FP16_H
#define KV_FMT_FP16_H

#include "kv_fmt_layout.h"
#include "kv_format.h"
#include "kv_half.h"

_Static_assert(sizeof(kv_half_t) == 2, "FP16 element must be 2 bytes");

/* The traits entry (also reachable as kv_format_table[KV_FMT_FP16]). */
extern const kv_format_traits_t kv_fmt_fp16;

uint32_t kv_fmt_fp16_tokens_per_page(const kv_page_geom_t *g);
void kv_fmt_fp16_load(const void *page, const kv_page_geom_t *g, uint32_t t0,
                      uint32_t n, float *k, float *v);
void kv_fmt_fp16_store(void *page, const kv_page_geom_t *g, uint32_t t0,
                       uint32_t n, kv_dtype_t dtype, const void *k,
                       const void *v, size_t src_stride);
void kv_fmt_fp16_copy(void *dst, uint32_t d0, const void *src, uint32_t s0,
                      uint32_t n, const kv_page_geom_t *g);
int kv_fmt_fp16_cost(const kv_page_geom_t *g, uint32_t sub, kv_format_cost_t *out);

/* The entry's initialiser: kv_fmt_fp16 and kv_format_table both use it. */
#define KV_FMT_FP16_TRAITS                                                  \
    {                                                                       \
        .name = "fp16", .bits_note = "FP16 = 16 bits/element",              \
        .tokens_per_page = kv_fmt_fp16_tokens_per_page,                     \
        .load = kv_fmt_fp16_load, .store = kv_fmt_fp16_store,               \
        .copy = kv_fmt_fp16_copy, .cost = kv_fmt_fp16_cost,                 \
    }

/* Pointers to token t's K and V rows in an FP16 page. */
static inline kv_half_t *kv_fp16_k(void *page, const kv_page_geom_t *g,
                                   uint32_t tpp, uint32_t t)
{
    (void)tpp;
    return (kv_half_t *)(void *)((char *)page +
                                 kv_fmt_fp16_k_row(g->head_dim, t));
}
static inline kv_half_t *kv_fp16_v(void *page, const kv_page_geom_t *g,
                                   uint32_t tpp, uint32_t t)
{
    return (kv_half_t *)(void *)((char *)page +
                                 kv_fmt_fp16_v_row(g->head_dim, tpp, t));
}

#endif /* KV_FMT_FP16_H */
