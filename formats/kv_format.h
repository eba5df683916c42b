/*
 * kv_format.h — the page-format traits table.
 *
 * Every page format (kv_format_t in kvpage.h; the numbers never change) has
 * one entry in kv_format_table, built with designated initialisers. Code that
 * handles pages of any format goes through the entry, never a switch on the
 * format: tokens per page, decoding tokens to FP32 (what attention and
 * read-back use), writing tokens (only formats that take appends), and,
 * optionally, attention's two inner steps computed from the encoded tokens
 * directly (q . k and sum p * v; attention falls back to load without them).
 *
 * A page's byte layout is specified at the top of its format's header
 * (kv_fmt_fp16.h, ...). This header depends on nothing but kvpage.h.
 */
#ifndef KV_FORMAT_H
#define KV_FORMAT_H

#include <stddef.h>
#include <stdint.h>

#include "kvpage/kvpage.h"

/* Page geometry shared by every page of a store. */
typedef struct kv_page_geom {
    uint32_t head_dim;   /* elements per K or V row */
    uint32_t page_bytes; /* bytes per page          */
} kv_page_geom_t;

typedef struct kv_format_traits {
    const char *name;        /* "fp16", ...                              */
    const char *bits_note;   /* e.g. "FP16 = 16 bits/element"            */
    /* Tokens one page holds (0 if head_dim/page_bytes cannot hold one). */
    uint32_t (*tokens_per_page)(const kv_page_geom_t *g);
    /* Decode tokens [t0, t0+n) of a page to FP32 rows. k, v: [n][head_dim];
     * either may be NULL to skip it. */
    void (*load)(const void *page, const kv_page_geom_t *g, uint32_t t0,
                 uint32_t n, float *k, float *v);
    /* Write tokens [t0, t0+n) of a page from rows of dtype. Row r of K is
     * at k + r * src_stride elements (same for v). NULL for formats that are
     * written only by conversion. Inputs are already validated (finite,
     * within range of the format). */
    void (*store)(void *page, const kv_page_geom_t *g, uint32_t t0, uint32_t n,
                  kv_dtype_t dtype, const void *k, const void *v,
                  size_t src_stride);
    /* Copy tokens [s0, s0+n) of page src to [d0, d0+n) of page dst (same
     * format; src == dst allowed when d0 <= s0). NULL if not supported. */
    void (*copy)(void *dst, uint32_t d0, const void *src, uint32_t s0,
                 uint32_t n, const kv_page_geom_t *g);
    /* Formats whose pages are shared by lists that read them differently
     * (MERGED: one page serves a layer pair, variant 0 = the pair's lower
     * layer l-1, 1 = layer l) decode through this instead of load; load
     * then reads variant 0. NULL for every other format (all lists read
     * its pages alike). Call kv_format_load() rather than either member. */
    void (*load_variant)(const void *page, const kv_page_geom_t *g,
                         uint32_t variant, uint32_t t0, uint32_t n, float *k,
                         float *v);
    /* Optional attention straight from the encoded tokens, for formats
     * whose encoding makes that cheaper than load + FP32 arithmetic (INT4,
     * INT2: no FP32 rows are written). NULL for the others; set both or
     * neither, never together with load_variant. Over tokens [t0, t0+n) of
     * a page, for query rows r < n_rows (k^, v^: the values load decodes):
     *   attn_score: s[r*s_stride + i] = sum_c q[r*q_stride + c] * k^_{t0+i}[c]
     *   attn_accum: acc[r*acc_stride + c] +=
     *                   sum_{i<n} p[r*p_stride + i] * v^_{t0+i}[c]
     * for i < n, c < head_dim. FP32 sums in the format's own order: they
     * agree with the same sums over load's rows to FP32 rounding, not bit
     * for bit. Deterministic: the same inputs give the same bits, whatever
     * the CPU's vector ISA. */
    void (*attn_score)(const void *page, const kv_page_geom_t *g, uint32_t t0,
                       uint32_t n, const float *q, size_t q_stride,
                       uint32_t n_rows, float *s, size_t s_stride);
    void (*attn_accum)(const void *page, const kv_page_geom_t *g, uint32_t t0,
                       uint32_t n, const float *p, size_t p_stride,
                       uint32_t n_rows, float *acc, size_t acc_stride);
} kv_format_traits_t;

extern const kv_format_traits_t kv_format_table[KV_FMT_COUNT];

/* The traits of format f, or NULL if f is unknown or not implemented yet. */
const kv_format_traits_t *kv_format_get(uint32_t f);

/* Decode tokens [t0, t0+n) of a page of format fmt (a registered format)
 * as seen by a list whose page entry has the given variant (kv_page.h:
 * kv_page_ent_variant; kv_kern_page_t.variant; 0 for pages read alike by
 * every list). k, v: [n][head_dim] or NULL. The one call every reader uses
 * (attention, read-back, compaction, conversions). */
static inline void kv_format_load(uint32_t fmt, uint32_t variant,
                                  const void *page, const kv_page_geom_t *g,
                                  uint32_t t0, uint32_t n, float *k, float *v)
{
    const kv_format_traits_t *tr = &kv_format_table[fmt];
    if (tr->load_variant)
        tr->load_variant(page, g, variant, t0, n, k, v);
    else
        tr->load(page, g, t0, n, k, v);
}

#endif /* KV_FORMAT_H */
