/* SPDX-License-Identifier: MIT */
/*
 * kv_format.h — the page-format traits table.
 *
 * Every page format (kv_format_t in kvpage.h; the numbers never change) has
 * one entry in kv_format_table, built with designated initialisers. Code that
 * handles pages of any format goes through the entry, never a switch on the
 * format: tokens per page, decoding tokens to FP32 (what read-back,
 * compaction and conversions use), writing tokens (only formats that take
 * appends), copying tokens. How a compute backend reads a format fast is
 * the backend's business (the CPU's own table: kernels/cpu/kv_cpu.h), as
 * ggml keeps type traits apart from backend ops.
 *
 * formats/ is the bottom module: it depends on nothing of kvpage but the
 * public types of kvpage.h. Every page's byte layout is defined once, in
 * kv_fmt_layout.h; what the bytes mean is specified in each format's header
 * (kv_fmt_fp16.h, kv_fmt_int.h, kv_fmt_merged.h). All code here is portable
 * C (no CPU dispatch): the speed-critical paths are the kernels'.
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

/* What an element of a format costs (kv_format_info, for tools). */
typedef struct kv_format_cost {
    double bits;              /* per element of one list's K or V: codes,   */
                              /* scales, norms; page rounding aside         */
    uint32_t group;           /* elements sharing one scale/min; 0: none    */
    uint32_t tokens_per_page; /* 0: a page holds none                       */
} kv_format_cost_t;

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
    /* Variants a page of this format may be stored as (INT4/INT2: 1 =
     * rotated, kv_fmt_rot.h; the bytes are the format's, of rows rotated
     * before encoding): how many there are at geometry g (>= 1), and the
     * transform of FP32 rows (k, v: [n][head_dim], either NULL) into the
     * space variant `variant` stores, applied before store; its load_variant
     * undoes it, so every reader sees the original rows. NULL: variant 0
     * only (a MERGED page's variants are its readers', not its bytes'). */
    uint32_t (*variants)(const kv_page_geom_t *g);
    void (*to_variant)(const kv_page_geom_t *g, uint32_t variant, uint32_t n,
                       float *k, float *v);
    /* The cost at geometry g (a valid store geometry) of variant `sub` of
     * the encoding, derived from the page layout: MERGED's sub is its
     * directions' format (KV_FMT_FP16 or KV_FMT_INT4), its bits one layer's
     * share of the pair; every other format has sub KV_FMT_FP16 only.
     * 0, or -1 for a sub the format does not have. */
    int (*cost)(const kv_page_geom_t *g, uint32_t sub, kv_format_cost_t *out);
} kv_format_traits_t;

extern const kv_format_traits_t kv_format_table[KV_FMT_COUNT];

/* The traits of format f, or NULL if f is unknown or not implemented yet. */
const kv_format_traits_t *kv_format_get(uint32_t f);

/* Decode tokens [t0, t0+n) of a page of format fmt (a registered format)
 * as seen by a list whose page entry has the given variant (kv_page.h:
 * kv_page_ent_variant; kv_kern_page_t.variant; 0 for pages read alike by
 * every list). k, v: [n][head_dim] or NULL. The one call every reader in C
 * uses (read-back, compaction, conversions; the CPU kernels' own decoders
 * give exactly these floats). */
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

/* Variants a page of format fmt (a registered format) may be stored as at
 * geometry g: 1 if the format stores one way only. */
static inline uint32_t kv_format_variants(uint32_t fmt, const kv_page_geom_t *g)
{
    const kv_format_traits_t *tr = &kv_format_table[fmt];
    return tr->variants ? tr->variants(g) : 1u;
}

/* FP32 rows (k, v: [n][head_dim], either NULL) to the space in which
 * format fmt stores variant `variant` (a stored variant < kv_format_variants;
 * 0 changes nothing): what a conversion applies before the format's store. */
static inline void kv_format_to_variant(uint32_t fmt, uint32_t variant,
                                        const kv_page_geom_t *g, uint32_t n,
                                        float *k, float *v)
{
    const kv_format_traits_t *tr = &kv_format_table[fmt];
    if (variant && tr->to_variant)
        tr->to_variant(g, variant, n, k, v);
}

#endif /* KV_FORMAT_H */
