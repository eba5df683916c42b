/* SPDX-License-Identifier: MIT */
/*
 * kv_fmt_merged.h — the MERGED page format (KV_FMT_MERGED = 3): MiniCache
 * cross-layer merging of a layer pair (l-1, l) for one kv_head.
 *
 * What a page holds: for each merged token (slot) of the pair, the shared
 * unit direction e_K of its keys and e_V of its values (SLERP of the two
 * layers' directions, computed by the merge kernel, docs/design.md) and four
 * magnitudes. The same page is referenced from BOTH layers' page lists
 * (refcount 2 per sequence); a list reads it as variant 0 (lower layer l-1)
 * or variant 1 (layer l), recorded in the page entry's flags
 * (kv_page.h: KV_PAGE_ENT_UPPER) and passed to load as `variant`:
 *
 *   k^(w) = e^_K * mag[slot][w],  v^(w) = e^_V * mag[slot][2 + w]
 *
 * where e^ is the direction AS STORED (FP16 or INT4, decoded to FP32) and
 * mag[.][w] = ||x^(w)|| / ||e^|| (FP32). Dividing by the stored direction's
 * own norm makes every restored vector keep its original norm to FP32
 * precision, whatever the direction's quantization error. A zero vector
 * stores magnitude 0 (restores to exactly 0, never NaN).
 *
 * Retained tokens (MiniCache keeps the most distinct pairs unmerged) are NOT
 * in the page: their original K/V of each layer sit in ordinary FP16 pages
 * of that layer's own list, entries flagged KV_PAGE_ENT_RETAINED. That flag
 * is the per-token retention mark (at entry granularity: every token of a
 * flagged entry is retained); a merged page holds merged tokens only, so no
 * token is ever read twice and load needs no branch per token.
 *
 * Byte layout (kv_fmt_layout.h): a 16-byte header (dir_format, head_dim),
 * FP32 magnitudes [T][4], then T K direction rows and T V direction rows of
 * R bytes: FP16 directions binary16 [D] (R = 2D); INT4 directions codes,
 * scale and min per group of 16 channels (R = 3D/4), quantized as KIVI
 * values (kv_fmt_int.h): asymmetric min/max per token and group of 16
 * channels, min rounded toward -inf, scale toward +inf, codes from the
 * stored values, so |e - e^| <= scale/2; e^_c = kv_fmt_codec_dequant(q,
 * scale, min); a constant group stores scale +-0 and decodes exactly.
 * T = floor((page_bytes - 16) / (16 + 2R)); 0 if that is < 1.
 *   Per merged token (serving two layers): 4D + 16 bytes with FP16
 *   directions = 8 + 32/D bits per element of one layer's K and V;
 *   1.5D + 16 bytes with INT4 directions = 3 + 32/D bits per element.
 *   Retained tokens cost FP16 (16 bits/element) in each layer.
 *
 * tokens_per_page(g) (the traits entry) is the larger capacity, that of
 * INT4 directions: it bounds n_tokens of any MERGED page; a page's own
 * capacity is kv_fmt_merged_capacity(g, its dir_format). store is NULL
 * (pages are written only by the merge kernel, slot by slot through
 * kv_fmt_merged_put) and so is copy (compaction decodes to FP16).
 */
#ifndef KV_FMT_MERGED_H
#define KV_FMT_MERGED_H

#include <stdint.h>

#include "kv_fmt_layout.h"
#include "kv_format.h"
#include "kv_half.h"

/* The traits entry (also kv_format_table[KV_FMT_MERGED]). */
extern const kv_format_traits_t kv_fmt_merged;

/* Slots a page holds with directions of dir_format (KV_FMT_FP16 or
 * KV_FMT_INT4); 0 for any other format or a geometry that holds none. */
uint32_t kv_fmt_merged_capacity(const kv_page_geom_t *g, uint32_t dir_format);

/* Write the header of an empty merged page (before the first put). */
void kv_fmt_merged_init(void *page, const kv_page_geom_t *g,
                        uint32_t dir_format);

/* The page's direction format, or UINT32_MAX when the header is not a valid
 * one for geometry g (bad dir_format, head_dim or reserved bytes). */
uint32_t kv_fmt_merged_dir_format(const void *page, const kv_page_geom_t *g);

/* Store slot `slot` (< the page's capacity): directions ek, ev [head_dim]
 * (unit vectors, or all zero), and the four norms ||k^(l-1)||, ||k^l||,
 * ||v^(l-1)||, ||v^l|| (finite, >= 0). The directions are encoded in the
 * page's dir_format and the magnitudes divided by the stored directions'
 * norms (see above). */
void kv_fmt_merged_put(void *page, const kv_page_geom_t *g, uint32_t slot,
                       const float *ek, const float *ev, const float norms[4]);

/* The traits functions. */
uint32_t kv_fmt_merged_tokens_per_page(const kv_page_geom_t *g);
int kv_fmt_merged_cost(const kv_page_geom_t *g, uint32_t sub, kv_format_cost_t *out);
void kv_fmt_merged_load(const void *page, const kv_page_geom_t *g, uint32_t t0,
                        uint32_t n, float *k, float *v);
void kv_fmt_merged_load_variant(const void *page, const kv_page_geom_t *g,
                                uint32_t variant, uint32_t t0, uint32_t n,
                                float *k, float *v);

/* Initialiser of the entry, for kv_format_table (kv_format.c) and for
 * kv_fmt_merged itself: one definition. */
#define KV_FMT_MERGED_NOTE                                                  \
    "MERGED = 8 + 32/head_dim bits/element (FP16 directions shared by 2 "  \
    "layers, FP32 norms; INT4 directions: 3 + 32/head_dim), retained "     \
    "tokens FP16"
#define KV_FMT_MERGED_TRAITS                                                \
    {                                                                       \
        .name = "merged", .bits_note = KV_FMT_MERGED_NOTE,                  \
        .tokens_per_page = kv_fmt_merged_tokens_per_page,                   \
        .load = kv_fmt_merged_load, .store = NULL, .copy = NULL,            \
        .load_variant = kv_fmt_merged_load_variant,                         \
        .cost = kv_fmt_merged_cost,                                         \
    }

#endif /* KV_FMT_MERGED_H */
