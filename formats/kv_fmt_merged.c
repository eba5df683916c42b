/* SPDX-License-Identifier: MIT */
/*
 * kv_fmt_merged.c — the MERGED page format (kv_fmt_merged.h; layout in
 * kv_fmt_layout.h).
 *
 * Encodes and decodes one merged page: header, FP32 magnitudes, and K/V
 * direction rows in FP16 or INT4. The SLERP and retention math lives in the
 * merge kernel (kernels/cpu/kv_cpu_convert.c); this file only stores a
 * slot's directions and norms (kv_fmt_merged_put) and restores tokens
 * (load). put and load decode directions through the same function, so the
 * norm put divides by is exactly the norm load multiplies back. Callers
 * validate ranges (slot < capacity, t0 + n <= used slots) and values; these
 * functions only assert. No state, no allocation (at most 4 KiB of stack).
 */
#include "kv_fmt_merged.h"

#include <assert.h>
#include <math.h>
#include <string.h>

#include "kv_fmt_codec.h"

/* Header as stored (16 bytes, kv_fmt_layout.h). */
typedef struct merged_header {
    uint32_t dir_format; /* KV_FMT_FP16 or KV_FMT_INT4 */
    uint32_t head_dim;
    uint32_t reserved[2];
} merged_header_t;

_Static_assert(sizeof(merged_header_t) == KV_FMT_MERGED_HEADER,
               "header is 16 bytes");

uint32_t kv_fmt_merged_capacity(const kv_page_geom_t *g, uint32_t dir_format)
{
    return g ? kv_fmt_merged_layout(g->head_dim, g->page_bytes, dir_format).cap
             : 0;
}

static kv_fmt_merged_layout_t layout_of(const kv_page_geom_t *g,
                                        uint32_t dir_format)
{
    return kv_fmt_merged_layout(g->head_dim, g->page_bytes, dir_format);
}

uint32_t kv_fmt_merged_tokens_per_page(const kv_page_geom_t *g)
{
    uint32_t a = kv_fmt_merged_capacity(g, KV_FMT_FP16);
    uint32_t b = kv_fmt_merged_capacity(g, KV_FMT_INT4);
    return a > b ? a : b;
}

void kv_fmt_merged_init(void *page, const kv_page_geom_t *g,
                        uint32_t dir_format)
{
    assert(kv_fmt_merged_capacity(g, dir_format) > 0);
    merged_header_t h = {.dir_format = dir_format, .head_dim = g->head_dim};
    memcpy(page, &h, sizeof h);
}

uint32_t kv_fmt_merged_dir_format(const void *page, const kv_page_geom_t *g)
{
    merged_header_t h;
    memcpy(&h, page, sizeof h);
    if (h.head_dim != g->head_dim || h.reserved[0] || h.reserved[1] ||
        kv_fmt_merged_capacity(g, h.dir_format) == 0)
        return UINT32_MAX;
    return h.dir_format;
}

/* ---- direction rows ------------------------------------------------------ */

/* INT4 row pieces (kv_fmt_layout.h). */
static uint32_t *row_codes(uint8_t *row) { return (uint32_t *)(void *)row; }
static kv_half_t *row_scale(uint8_t *row, uint32_t d)
{
    return (kv_half_t *)(void *)(row + kv_fmt_merged_int4_scale(d));
}
static kv_half_t *row_min(uint8_t *row, uint32_t d)
{
    return (kv_half_t *)(void *)(row + kv_fmt_merged_int4_min(d));
}

/* Encode e[0..d) into an INT4 row: each group of 16 channels is quantized
 * as an INT value group is (kv_fmt_codec_quantize16, see spec). */
static void int4_encode(const float *e, uint32_t d, uint8_t *row)
{
    uint32_t *codes = row_codes(row);
    kv_half_t *hs = row_scale(row, d), *hm = row_min(row, d);
    for (uint32_t g = 0; g < d / 16u; g++)
        kv_fmt_codec_quantize16(4u, e + 16u * g, 1, codes + 2u * g, 1, hs + g,
                                hm + g);
}

/* Decode one direction row to out[0..d). The one decoder of put and load. */
static void dir_decode(const uint8_t *row, uint32_t d, uint32_t dir_format,
                       float *out)
{
    if (dir_format == KV_FMT_FP16) {
        kv_half_to_float_n((const kv_half_t *)(const void *)row, out, d);
        return;
    }
    const uint32_t *codes = row_codes((uint8_t *)row);
    const kv_half_t *hs = row_scale((uint8_t *)row, d);
    const kv_half_t *hm = row_min((uint8_t *)row, d);
    for (uint32_t g = 0; g < d / 16u; g++) {
        const float s = kv_fmt_codec_h2f(hs[g]), m = kv_fmt_codec_h2f(hm[g]);
        kv_fmt_codec_int4_word8(codes[2u * g], s, m, out + 16u * g);
        kv_fmt_codec_int4_word8(codes[2u * g + 1u], s, m, out + 16u * g + 8u);
    }
}

/* o[0..d) *= mag (d a multiple of 16; fixed inner width: vectorized). */
static void scale_row(float *o, uint32_t d, float mag)
{
    for (uint32_t c = 0; c < d; c += 16, o += 16)
        for (uint32_t j = 0; j < 16; j++)
            o[j] *= mag;
}

/* Encode a direction row; returns the norm of the row as decoded. */
static double dir_put(const float *e, uint32_t d, uint32_t dir_format,
                      uint8_t *row)
{
    float dec[KV_FMT_MAX_DIM];
    if (dir_format == KV_FMT_FP16)
        kv_half_from_float_n(e, (kv_half_t *)(void *)row, d);
    else
        int4_encode(e, d, row);
    dir_decode(row, d, dir_format, dec);
    double ss = 0.0;
    for (uint32_t c = 0; c < d; c++)
        ss += (double)dec[c] * dec[c];
    return sqrt(ss);
}

void kv_fmt_merged_put(void *page, const kv_page_geom_t *g, uint32_t slot,
                       const float *ek, const float *ev, const float norms[4])
{
    const uint32_t d = g->head_dim;
    const uint32_t df = kv_fmt_merged_dir_format(page, g);
    assert(df != UINT32_MAX);
    const kv_fmt_merged_layout_t l = layout_of(g, df);
    assert(slot < l.cap);
    uint8_t *p = page;
    double nk = dir_put(ek, d, df, p + kv_fmt_merged_dir(&l, 0, slot));
    double nv = dir_put(ev, d, df, p + kv_fmt_merged_dir(&l, 1, slot));
    float mag[KV_FMT_MERGED_MAGS];
    for (uint32_t w = 0; w < 2; w++) {
        mag[w] = nk > 0.0 ? (float)((double)norms[w] / nk) : 0.0f;
        mag[2 + w] = nv > 0.0 ? (float)((double)norms[2 + w] / nv) : 0.0f;
    }
    memcpy(p + kv_fmt_merged_mag(&l, slot, 0), mag, sizeof mag);
}

/* ---- load ---------------------------------------------------------------- */

/* Rows [t0, t0+n) of one half (K: which 0, V: which 1) of variant w. */
static void load_half(const uint8_t *p, const kv_fmt_merged_layout_t *l,
                      uint32_t d, uint32_t df, uint32_t w, uint32_t which,
                      uint32_t t0, uint32_t n, float *out)
{
    if (df == KV_FMT_FP16) /* rows are contiguous: one bulk conversion */
        kv_half_to_float_n(
            (const kv_half_t *)(const void *)(p + kv_fmt_merged_dir(l, which, t0)),
            out, (size_t)n * d);
    for (uint32_t i = 0; i < n; i++) {
        uint32_t t = t0 + i;
        float *o = out + (size_t)i * d;
        float mag;
        memcpy(&mag, p + kv_fmt_merged_mag(l, t, 2u * which + w), sizeof mag);
        if (df != KV_FMT_FP16)
            dir_decode(p + kv_fmt_merged_dir(l, which, t), d, df, o);
        scale_row(o, d, mag);
    }
}

void kv_fmt_merged_load_variant(const void *page, const kv_page_geom_t *g,
                                uint32_t variant, uint32_t t0, uint32_t n,
                                float *k, float *v)
{
    /* the hot path: the header was validated when the page was written
     * and by kv_page_table_check; here it is only asserted */
    merged_header_t h;
    memcpy(&h, page, sizeof h);
    const uint32_t df = h.dir_format;
    assert(kv_fmt_merged_dir_format(page, g) == df && variant <= 1);
    const kv_fmt_merged_layout_t l = layout_of(g, df);
    assert((uint64_t)t0 + n <= l.cap);
    (void)l.cap;
    if (k)
        load_half(page, &l, g->head_dim, df, variant & 1u, 0, t0, n, k);
    if (v)
        load_half(page, &l, g->head_dim, df, variant & 1u, 1, t0, n, v);
}

void kv_fmt_merged_load(const void *page, const kv_page_geom_t *g, uint32_t t0,
                        uint32_t n, float *k, float *v)
{
    kv_fmt_merged_load_variant(page, g, 0, t0, n, k, v);
}

/* Bits per element from the layout: a slot serves 2 layers x 2D elements
 * (K, V) with 2 direction rows of R bytes and the magnitudes, so one layer's
 * share is 4R/D + 2 x (magnitude bytes)/D bits: FP16 directions 8 + 32/D,
 * INT4 3 + 32/D (computed as those two terms, exact for R = 2D, 3D/4). */
int kv_fmt_merged_cost(const kv_page_geom_t *g, uint32_t sub, kv_format_cost_t *out)
{
    const uint32_t d = g->head_dim, r = kv_fmt_merged_row(d, sub);
    if (r == 0)
        return -1;
    const double mag_bytes = KV_FMT_MERGED_MAGS * sizeof(float);
    *out = (kv_format_cost_t){.bits = 4.0 * r / d + 2.0 * mag_bytes / d,
                              .group = sub == KV_FMT_INT4 ? KV_FMT_INT_GROUP : 0,
                              .tokens_per_page = kv_fmt_merged_capacity(g, sub)};
    return 0;
}

const kv_format_traits_t kv_fmt_merged = KV_FMT_MERGED_TRAITS;
