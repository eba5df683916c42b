/* SPDX-License-Identifier: MIT */
/*
 * kv_fmt_int.h — the INT4 and INT2 page formats (KV_FMT_INT4 = 1,
 * KV_FMT_INT2 = 2): KIVI/MiniKV asymmetric quantization in groups of 16.
 *
 * Quantization (b = bits, 2 or 4; L = 2^b - 1 levels above zero):
 *   KEYS   per channel, over a group of 16 consecutive tokens;
 *   VALUES per token,   over a group of 16 consecutive channels.
 *   scale = (max - min) / L, q = round(clamp((x - min) / scale, 0, L)),
 *   x^ = q * scale + min in FP32 (q * scale is exact, so the value is
 *   rounded once, as a fused multiply-add: kv_fmt_codec_dequant, the one
 *   definition every reader uses).
 *   scale and min are stored as IEEE binary16. min is rounded toward -inf
 *   and scale toward +inf, and codes are computed with the STORED values,
 *   so |x - x^| <= stored scale / 2 (up to FP32 rounding) for every element
 *   of a group whose values differ. A constant group (max == min) stores
 *   min = fp16(x) (round to nearest), scale = +-0 with the sign of min, and
 *   codes 0: it decodes bit-exactly to fp16(x), also -0 (x itself when x is
 *   an FP16 value, as appended data is).
 *
 * Byte layout and code packing: kv_fmt_layout.h (16-token group blocks of
 * GB = 2D(2b + 4) bytes, codes then scale/min; T = 16 * floor(page_bytes /
 * GB), 0 if D is not a multiple of 16 in 16..1024). Per 16 tokens: INT2
 * 16*D bytes, INT4 24*D, FP16 64*D, so an INT2 page holds exactly 4x the
 * tokens of an FP16 page of the same page_bytes and INT4 8/3x when
 * page_bytes is a multiple of 192*D (otherwise floor). Cost per element: b
 * bits of code + 32 bits of scale/min per 16 elements = b + 2 bits: INT2 g16
 * = 4 bits/element (4x smaller than FP16, not 8x), INT4 g16 = 6. The page
 * must be at least 4-byte aligned (pool pages are).
 *
 * Reading (load): any token range [t0, t0+n) within the page (not only
 * whole groups), decoded to FP32 rows. Writing (store): PRECONDITION t0 and
 * n multiples of 16 (whole groups are quantized at once); a misaligned call asserts in debug builds
 * and writes nothing in NDEBUG builds. Inputs must be finite and within FP16
 * range (callers validate, as for every format); src_stride >= D. A list
 * tail that is not a whole group stays FP16 (KIVI), or the caller pads it.
 * copy is NULL: compaction decodes and re-encodes.
 *
 * Variant 1 (rotated, kv_fmt_rot.h): the page stores R k and R v instead
 * of k and v (same layout, same bytes per token); load_variant(1) gives
 * R^T of the decoded rows. Which variant a page is, is its page entry's
 * (pages/kv_page.h: bit 0 of the entry's flags; page files record it), not
 * the page's bytes: page files written before rotation existed read as
 * variant 0.
 *
 * Attention reads the codes directly (kernels/cpu/kv_cpu_fmt_int.c, the
 * CUDA kernels) with the same dequantization, so it sees the floats load
 * gives.
 */
#ifndef KV_FMT_INT_H
#define KV_FMT_INT_H

#include <stdint.h>

#include "kv_fmt_layout.h"
#include "kv_format.h"
#include "kv_half.h"

/* The traits entries (also kv_format_table[KV_FMT_INT4 / KV_FMT_INT2]). */
extern const kv_format_traits_t kv_fmt_int4;
extern const kv_format_traits_t kv_fmt_int2;

/* The per-format functions behind the entries (kv_fmt_int.c). */
uint32_t kv_fmt_int4_tokens_per_page(const kv_page_geom_t *g);
uint32_t kv_fmt_int2_tokens_per_page(const kv_page_geom_t *g);
int kv_fmt_int4_cost(const kv_page_geom_t *g, uint32_t sub,
                     kv_format_cost_t *out);
int kv_fmt_int2_cost(const kv_page_geom_t *g, uint32_t sub,
                     kv_format_cost_t *out);
void kv_fmt_int4_load(const void *page, const kv_page_geom_t *g, uint32_t t0,
                      uint32_t n, float *k, float *v);
void kv_fmt_int2_load(const void *page, const kv_page_geom_t *g, uint32_t t0,
                      uint32_t n, float *k, float *v);
void kv_fmt_int4_store(void *page, const kv_page_geom_t *g, uint32_t t0,
                       uint32_t n, kv_dtype_t dtype, const void *k,
                       const void *v, size_t src_stride);
void kv_fmt_int2_store(void *page, const kv_page_geom_t *g, uint32_t t0,
                       uint32_t n, kv_dtype_t dtype, const void *k,
                       const void *v, size_t src_stride);
/* Rotated pages (variant 1, kv_fmt_rot.h; head_dim a power of two): the
 * same bytes, of rows rotated by R before quantization. load_variant 1
 * decodes and applies R^T, so readers get rows in the original space (with
 * the rounding of the rotation on top of the quantization's). */
void kv_fmt_int4_load_variant(const void *page, const kv_page_geom_t *g,
                              uint32_t variant, uint32_t t0, uint32_t n,
                              float *k, float *v);
void kv_fmt_int2_load_variant(const void *page, const kv_page_geom_t *g,
                              uint32_t variant, uint32_t t0, uint32_t n,
                              float *k, float *v);
uint32_t kv_fmt_int_variants(const kv_page_geom_t *g);
void kv_fmt_int_to_variant(const kv_page_geom_t *g, uint32_t variant,
                           uint32_t n, float *k, float *v);

/* Initialisers of the two entries, for kv_format_table (kv_format.c) and
 * for kv_fmt_int4 / kv_fmt_int2 themselves: one definition of each entry.
 * KV_FMT_INT_TRAITS(b, note): the entry of INT<b> (b: 4 or 2). */
#define KV_FMT_INT_TRAITS(b, note)                                          \
    {                                                                       \
        .name = "int" #b, .bits_note = note,                                \
        .tokens_per_page = kv_fmt_int##b##_tokens_per_page,                 \
        .load = kv_fmt_int##b##_load, .store = kv_fmt_int##b##_store,       \
        .copy = NULL, .load_variant = kv_fmt_int##b##_load_variant,         \
        .variants = kv_fmt_int_variants,                                    \
        .to_variant = kv_fmt_int_to_variant, .cost = kv_fmt_int##b##_cost,  \
    }
#define KV_FMT_INT4_TRAITS KV_FMT_INT_TRAITS(4, "INT4 g16 = 6 bits/element")
#define KV_FMT_INT2_TRAITS KV_FMT_INT_TRAITS(2, "INT2 g16 = 4 bits/element")

#endif /* KV_FMT_INT_H */
