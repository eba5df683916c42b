/*
 * kv_fmt_merged.c — the MERGED page format (layout spec in kv_fmt_merged.h).
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

#define MERGED_MAX_DIM 1024u /* the store's head_dim limit */

/* Header as stored (16 bytes). */
typedef struct merged_header {
    uint32_t dir_format; /* KV_FMT_FP16 or KV_FMT_INT4 */
    uint32_t head_dim;
    uint32_t reserved[2];
} merged_header_t;

_Static_assert(sizeof(merged_header_t) == KV_FMT_MERGED_HEADER,
               "header is 16 bytes");

/* Where things are in a page of capacity T. */
typedef struct merged_layout {
    uint32_t cap;     /* T: slots                 */
    uint32_t row;     /* R: bytes per direction row */
    size_t mag;       /* offset of float [T][4]   */
    size_t kdir, vdir; /* offsets of the row arrays */
} merged_layout_t;

static uint32_t row_bytes(uint32_t d, uint32_t dir_format)
{
    if (d < 16 || d > MERGED_MAX_DIM || d % 16 != 0)
        return 0;
    if (dir_format == KV_FMT_FP16)
        return KV_FMT_MERGED_ROW_FP16(d);
    if (dir_format == KV_FMT_INT4)
        return KV_FMT_MERGED_ROW_INT4(d);
    return 0;
}

uint32_t kv_fmt_merged_capacity(const kv_page_geom_t *g, uint32_t dir_format)
{
    if (!g)
        return 0;
    uint32_t r = row_bytes(g->head_dim, dir_format);
    if (r == 0 || g->page_bytes <= KV_FMT_MERGED_HEADER)
        return 0;
    return (g->page_bytes - KV_FMT_MERGED_HEADER) / KV_FMT_MERGED_SLOT(r);
}

static merged_layout_t layout_of(const kv_page_geom_t *g, uint32_t dir_format)
{
    merged_layout_t l;
    l.cap = kv_fmt_merged_capacity(g, dir_format);
    l.row = row_bytes(g->head_dim, dir_format);
    l.mag = KV_FMT_MERGED_HEADER;
    l.kdir = l.mag + (size_t)l.cap * KV_FMT_MERGED_MAGS * sizeof(float);
    l.vdir = l.kdir + (size_t)l.cap * l.row;
    return l;
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

/* INT4 row pieces. */
static uint32_t *row_codes(uint8_t *row) { return (uint32_t *)(void *)row; }
static kv_half_t *row_scale(uint8_t *row, uint32_t d)
{
    return (kv_half_t *)(void *)(row + d / 2u);
}
static kv_half_t *row_min(uint8_t *row, uint32_t d)
{
    return (kv_half_t *)(void *)(row + d / 2u + d / 8u);
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
    float dec[MERGED_MAX_DIM];
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
    const merged_layout_t l = layout_of(g, df);
    assert(slot < l.cap);
    uint8_t *p = page;
    double nk = dir_put(ek, d, df, p + l.kdir + (size_t)slot * l.row);
    double nv = dir_put(ev, d, df, p + l.vdir + (size_t)slot * l.row);
    float mag[KV_FMT_MERGED_MAGS];
    for (uint32_t w = 0; w < 2; w++) {
        mag[w] = nk > 0.0 ? (float)((double)norms[w] / nk) : 0.0f;
        mag[2 + w] = nv > 0.0 ? (float)((double)norms[2 + w] / nv) : 0.0f;
    }
    memcpy(p + l.mag + (size_t)slot * sizeof mag, mag, sizeof mag);
}

/* ---- load ---------------------------------------------------------------- */

/* Rows [t0, t0+n) of one half (K: which 0, V: which 1) of variant w. */
static void load_half(const uint8_t *p, const merged_layout_t *l, uint32_t d,
                      uint32_t df, uint32_t w, uint32_t which, uint32_t t0,
                      uint32_t n, float *out)
{
    const size_t base = which ? l->vdir : l->kdir;
    if (df == KV_FMT_FP16) /* rows are contiguous: one bulk conversion */
        kv_half_to_float_n((const kv_half_t *)(const void *)(p + base) +
                               (size_t)t0 * d,
                           out, (size_t)n * d);
    for (uint32_t i = 0; i < n; i++) {
        uint32_t t = t0 + i;
        float *o = out + (size_t)i * d;
        float mag;
        memcpy(&mag,
               p + l->mag +
                   ((size_t)t * KV_FMT_MERGED_MAGS + 2u * which + w) *
                       sizeof(float),
               sizeof mag);
        if (df != KV_FMT_FP16)
            dir_decode(p + base + (size_t)t * l->row, d, df, o);
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
    const merged_layout_t l = layout_of(g, df);
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

const kv_format_traits_t kv_fmt_merged = KV_FMT_MERGED_TRAITS;
