/* SPDX-License-Identifier: MIT */
/*
 * kv_fmt_int.c — the INT4 and INT2 page formats (kv_fmt_int.h; layout in
 * kv_fmt_layout.h).
 *
 * One implementation for both formats, parameterized by the bits per code
 * (4 or 2), a constant in each inlined instance of the code. Quantization
 * is kv_fmt_codec_quantize16, dequantization kv_fmt_codec_dequant's value
 * (kv_fmt_codec.h: the definitions the CPU attention steps and the CUDA
 * kernels share).
 *
 * Loads are what read-back, compaction and conversions use (attention reads
 * INT pages through the kernels' own steps, kernels/cpu/kv_cpu_fmt_int.c).
 * A group's FP16 scale/min are converted with one bulk call; its codes are
 * decoded with shifts, masks, an exact multiply and an add (one rounding,
 * kv_fmt_codec_dequant's value) on 8-lane GNU C vectors (half a group): K
 * channel blocks keep their scale, min and code words in registers across
 * the group's tokens; a V group broadcasts its code word and shifts each
 * lane by its own amount. Portable C: the compiler lowers the vectors to
 * whatever the target has; no CPU dispatch.
 *
 * Stores quantize whole groups: t0 and n must be multiples of 16 (asserted;
 * in NDEBUG builds a misaligned store writes nothing). Callers validate
 * ranges and values (finite, |x| <= 65504) as for every format. Stack use:
 * at most 16 KiB (load) / 4 KiB (store) of FP32 scratch, no allocation, no
 * state.
 */
#include "kv_fmt_int.h"

#include <assert.h>
#include <string.h>

#include "kv_fmt_codec.h"
#include "kv_fmt_rot.h"

/* Operations as written (GCC contracts nothing under -std=c11; clang would,
 * per statement). */
#ifdef __clang__
#pragma STDC FP_CONTRACT OFF
#endif

/* GNU C (GCC >= 9 or Clang): vector extensions, always_inline. */
#define KV_INT_INLINE static inline __attribute__((always_inline))

/* Largest head_dim (kv_fmt_layout.h): bounds the stack buffer of one
 * group's scale/min decoded to FP32 (4 x 1024 floats). */
#define KV_INT_MAX_DIM KV_FMT_MAX_DIM
/* Channels quantized per pass of a store (stack buffer [16][CHUNK]). */
#define KV_INT_CHUNK 64u

static uint32_t int_tokens_per_page(const kv_page_geom_t *g, uint32_t bits)
{
    return g ? kv_fmt_int_tpp(g->head_dim, g->page_bytes, bits) : 0;
}

/* ---- load ---------------------------------------------------------------- */

/* 8 lanes = half a quantization group. GNU C vector types: the compiler maps
 * them to what the target has (2 x SSE2, 1 x AVX2). The _m variants are for
 * memory operands that are only 4-byte aligned (a vector type aliases its
 * element type, so they access float / uint32_t arrays legally). */
typedef float kv_int_f32x8 __attribute__((vector_size(32)));
typedef int32_t kv_int_i32x8 __attribute__((vector_size(32)));
typedef uint32_t kv_int_u32x8 __attribute__((vector_size(32)));
typedef float kv_int_f32x8_m __attribute__((vector_size(32), aligned(4)));
typedef uint32_t kv_int_u32x8_m __attribute__((vector_size(32), aligned(4)));

/* Store x^ = q * scale + min (8 lanes) to p: the product is exact, so this
 * is kv_fmt_codec_dequant's value, rounded once. A macro, not a function:
 * 32-byte vectors passed by value change the ABI between targets
 * (-Wpsabi), and passed by address they would be pinned to the stack on
 * SSE2. */
#define KV_INT_DEQUANT(p, q, s, m)                                          \
    do {                                                                    \
        kv_int_f32x8 x_ =                                                   \
            __builtin_convertvector((kv_int_i32x8)(q), kv_int_f32x8);       \
        x_ = x_ * (s);                                                      \
        x_ = x_ + (m);                                                      \
        *(kv_int_f32x8_m *)(p) = x_;                                        \
    } while (0)

/* K rows lo..hi-1 of one group block, out row i = token lo + i, from the
 * group's K scale/min ps/pm [D] (FP32). Channel blocks of 16 outer, tokens
 * inner: a block's scale, min and code words stay in registers while its
 * tokens are decoded (shift, mask, convert, multiply, add). */
KV_INT_INLINE void decode_k(const uint32_t *codes, const float *ps,
                            const float *pm, uint32_t d, uint32_t bits,
                            uint32_t lo, uint32_t hi, float *out)
{
    const uint32_t per = 32u / bits, mask = (1u << bits) - 1u;
    for (uint32_t c = 0; c < d; c += 16) { /* two vectors per pass */
        const kv_int_f32x8 s0 = *(const kv_int_f32x8_m *)(ps + c);
        const kv_int_f32x8 s1 = *(const kv_int_f32x8_m *)(ps + c + 8);
        const kv_int_f32x8 m0 = *(const kv_int_f32x8_m *)(pm + c);
        const kv_int_f32x8 m1 = *(const kv_int_f32x8_m *)(pm + c + 8);
        const uint32_t *wp = codes + (lo / per) * d + c;
        kv_int_u32x8 w0 = *(const kv_int_u32x8_m *)wp;
        kv_int_u32x8 w1 = *(const kv_int_u32x8_m *)(wp + 8);
        for (uint32_t t = lo; t < hi; t++) {
            const uint32_t sh = bits * (t % per);
            float *o = out + (size_t)(t - lo) * d + c;
            if (t % per == 0) { /* next word plane (INT4: token 8) */
                wp = codes + (t / per) * d + c;
                w0 = *(const kv_int_u32x8_m *)wp;
                w1 = *(const kv_int_u32x8_m *)(wp + 8);
            }
            KV_INT_DEQUANT(o, (w0 >> sh) & mask, s0, m0);
            KV_INT_DEQUANT(o + 8, (w1 >> sh) & mask, s1, m1);
        }
    }
}

/* V rows lo..hi-1 of one group block, out row i = token lo + i, from the
 * group's V scale/min ps/pm [16][D/16] (FP32). Each half (8 channels) of a
 * 16-channel group is one vector: its code word broadcast to the lanes, lane
 * j shifted right by bits * ((8h + j) % per). */
KV_INT_INLINE void decode_v(const uint32_t *codes, const float *ps,
                            const float *pm, uint32_t d, uint32_t bits,
                            uint32_t lo, uint32_t hi, float *out)
{
    const uint32_t per = 32u / bits, mask = (1u << bits) - 1u;
    const uint32_t nw = bits / 2u, ng = d / 16u; /* words/group, groups */
    const kv_int_u32x8 zero = {0};
    const kv_int_f32x8 one = (kv_int_f32x8){0} + 1.0f;
    kv_int_u32x8 sh0, sh1; /* constants once unrolled */
    for (uint32_t j = 0; j < 8; j++) {
        sh0[j] = bits * (j % per);
        sh1[j] = bits * ((8u + j) % per);
    }
    for (uint32_t t = lo; t < hi; t++) {
        float *o = out + (size_t)(t - lo) * d;
        for (uint32_t cg = 0; cg < ng; cg++) {
            const uint32_t *w = codes + ((size_t)t * ng + cg) * nw;
            /* one * x broadcasts x exactly (also -0) */
            const kv_int_f32x8 sv = one * ps[t * ng + cg];
            const kv_int_f32x8 mv = one * pm[t * ng + cg];
            KV_INT_DEQUANT(o + (size_t)cg * 16, ((zero + w[0]) >> sh0) & mask,
                           sv, mv);
            KV_INT_DEQUANT(o + (size_t)cg * 16 + 8,
                           ((zero + w[8u / per]) >> sh1) & mask, sv, mv);
        }
    }
}

/* Tokens [t0, t0+n) of a page, group by group. The FP16 scale/min of a
 * group (K then V, adjacent in the block) are converted to FP32 with one
 * call, then its codes are decoded. */
KV_INT_INLINE void int_load_body(uint32_t bits, const void *page,
                                 const kv_page_geom_t *g, uint32_t t0,
                                 uint32_t n, float *k, float *v)
{
    const uint32_t d = g->head_dim;
    assert((uint64_t)t0 + n <= int_tokens_per_page(g, bits));
    const kv_fmt_int_layout_t l = kv_fmt_int_layout(d, bits);
    /* [4][d]: K scale, K min, V scale, V min of the current group */
    float par[4 * KV_INT_MAX_DIM];
    const uint32_t p0 = k ? 0 : 2, p1 = v ? 4 : 2; /* rows of par needed */
    const uint32_t par_off = k ? l.k_scale : l.v_scale;
    uint32_t t = t0, end = t0 + n;
    while (t < end) {
        uint32_t grp = t / KV_FMT_INT_GROUP, lo = t % KV_FMT_INT_GROUP;
        uint32_t hi = KV_FMT_INT_GROUP;
        if (end - grp * KV_FMT_INT_GROUP < hi)
            hi = end - grp * KV_FMT_INT_GROUP;
        const uint8_t *blk = (const uint8_t *)page + (size_t)grp * l.group_bytes;
        size_t row = (size_t)(t - t0) * d;
        kv_half_to_float_n((const kv_half_t *)(const void *)(blk + par_off),
                           par + (size_t)p0 * d, (size_t)(p1 - p0) * d);
        if (k)
            decode_k((const uint32_t *)(const void *)(blk + l.k_codes), par,
                     par + d, d, bits, lo, hi, k + row);
        if (v)
            decode_v((const uint32_t *)(const void *)(blk + l.v_codes),
                     par + 2 * (size_t)d, par + 3 * (size_t)d, d, bits, lo, hi,
                     v + row);
        t += hi - lo;
    }
}

/* ---- store --------------------------------------------------------------- */

/* dst[0..cnt) = source row r, channels c0..c0+cnt-1, as FP32. */
static void src_row(kv_dtype_t dtype, const void *src, size_t stride,
                    uint32_t r, uint32_t c0, uint32_t cnt, float *dst)
{
    size_t at = (size_t)r * stride + c0;
    if (dtype == KV_DTYPE_F32) {
        memcpy(dst, (const float *)src + at, cnt * sizeof *dst);
    } else {
        assert(dtype == KV_DTYPE_F16);
        kv_half_to_float_n((const kv_half_t *)src + at, dst, cnt);
    }
}

/* One group block from source rows r0..r0+15. */
KV_INT_INLINE void encode_group(uint32_t bits, uint8_t *blk,
                                const kv_fmt_int_layout_t *l, uint32_t d,
                                kv_dtype_t dtype, const void *k,
                                const void *v, size_t stride, uint32_t r0)
{
    const uint32_t nw = bits / 2u, ng = d / 16u;
    float buf[16][KV_INT_CHUNK];
    if (k) {
        uint32_t *codes = (uint32_t *)(void *)(blk + l->k_codes);
        kv_half_t *ks = (kv_half_t *)(void *)(blk + l->k_scale);
        kv_half_t *km = (kv_half_t *)(void *)(blk + l->k_min);
        for (uint32_t c0 = 0; c0 < d; c0 += KV_INT_CHUNK) {
            uint32_t cw = d - c0 < KV_INT_CHUNK ? d - c0 : KV_INT_CHUNK;
            for (uint32_t j = 0; j < 16; j++)
                src_row(dtype, k, stride, r0 + j, c0, cw, buf[j]);
            for (uint32_t c = 0; c < cw; c++)
                kv_fmt_codec_quantize16(bits, &buf[0][c], KV_INT_CHUNK,
                                        codes + c0 + c, d, ks + c0 + c,
                                        km + c0 + c);
        }
    }
    if (v) {
        uint32_t *codes = (uint32_t *)(void *)(blk + l->v_codes);
        kv_half_t *vs = (kv_half_t *)(void *)(blk + l->v_scale);
        kv_half_t *vm = (kv_half_t *)(void *)(blk + l->v_min);
        for (uint32_t j = 0; j < 16; j++)
            for (uint32_t c0 = 0; c0 < d; c0 += KV_INT_CHUNK) {
                uint32_t cw = d - c0 < KV_INT_CHUNK ? d - c0 : KV_INT_CHUNK;
                src_row(dtype, v, stride, r0 + j, c0, cw, buf[0]);
                for (uint32_t c = 0; c < cw; c += 16) {
                    size_t gi = (size_t)j * ng + (c0 + c) / 16u;
                    kv_fmt_codec_quantize16(bits, &buf[0][c], 1,
                                            codes + gi * nw, 1, vs + gi,
                                            vm + gi);
                }
            }
    }
}

/* Whole groups [t0, t0+n); inlined into each entry (bits a constant). */
KV_INT_INLINE void int_store(uint32_t bits, void *page,
                             const kv_page_geom_t *g, uint32_t t0, uint32_t n,
                             kv_dtype_t dtype, const void *k, const void *v,
                             size_t src_stride)
{
    const uint32_t d = g->head_dim;
    if (t0 % KV_FMT_INT_GROUP != 0 || n % KV_FMT_INT_GROUP != 0 ||
        (uint64_t)t0 + n > int_tokens_per_page(g, bits) || src_stride < d) {
        assert(0 && "INT store: t0, n must be whole groups within the page");
        return; /* NDEBUG: write nothing */
    }
    const kv_fmt_int_layout_t l = kv_fmt_int_layout(d, bits);
    for (uint32_t r = 0; r < n; r += KV_FMT_INT_GROUP) {
        uint8_t *blk = (uint8_t *)page +
                       (size_t)((t0 + r) / KV_FMT_INT_GROUP) * l.group_bytes;
        encode_group(bits, blk, &l, d, dtype, k, v, src_stride, r);
    }
}

/* ---- the entries ----------------------------------------------------------- */

uint32_t kv_fmt_int4_tokens_per_page(const kv_page_geom_t *g)
{
    return int_tokens_per_page(g, 4u);
}
uint32_t kv_fmt_int2_tokens_per_page(const kv_page_geom_t *g)
{
    return int_tokens_per_page(g, 2u);
}

/* Bits per element from the layout: a group block holds 16 tokens of K and
 * V, 2 x 16 x D elements (b bits of code + 32 bits of scale/min per 16). */
static int int_cost(const kv_page_geom_t *g, uint32_t bits, uint32_t sub,
                    kv_format_cost_t *out)
{
    if (sub != KV_FMT_FP16)
        return -1;
    const uint32_t d = g->head_dim;
    *out = (kv_format_cost_t){
        .bits = 8.0 * KV_FMT_INT_GROUP_BYTES(d, bits) /
                (2.0 * KV_FMT_INT_GROUP * d),
        .group = KV_FMT_INT_GROUP,
        .tokens_per_page = int_tokens_per_page(g, bits)};
    return 0;
}
int kv_fmt_int4_cost(const kv_page_geom_t *g, uint32_t sub,
                     kv_format_cost_t *out)
{
    return int_cost(g, 4u, sub, out);
}
int kv_fmt_int2_cost(const kv_page_geom_t *g, uint32_t sub,
                     kv_format_cost_t *out)
{
    return int_cost(g, 2u, sub, out);
}

void kv_fmt_int4_load(const void *page, const kv_page_geom_t *g, uint32_t t0,
                      uint32_t n, float *k, float *v)
{
    int_load_body(4u, page, g, t0, n, k, v);
}
void kv_fmt_int2_load(const void *page, const kv_page_geom_t *g, uint32_t t0,
                      uint32_t n, float *k, float *v)
{
    int_load_body(2u, page, g, t0, n, k, v);
}

void kv_fmt_int4_store(void *page, const kv_page_geom_t *g, uint32_t t0,
                       uint32_t n, kv_dtype_t dtype, const void *k,
                       const void *v, size_t src_stride)
{
    int_store(4u, page, g, t0, n, dtype, k, v, src_stride);
}
void kv_fmt_int2_store(void *page, const kv_page_geom_t *g, uint32_t t0,
                       uint32_t n, kv_dtype_t dtype, const void *k,
                       const void *v, size_t src_stride)
{
    int_store(2u, page, g, t0, n, dtype, k, v, src_stride);
}

/* ---- rotated pages (variant 1) ------------------------------------------- */

uint32_t kv_fmt_int_variants(const kv_page_geom_t *g)
{
    return g && kv_fmt_rot_ok(g->head_dim) ? 2u : 1u;
}

void kv_fmt_int_to_variant(const kv_page_geom_t *g, uint32_t variant,
                           uint32_t n, float *k, float *v)
{
    if (variant != 1u)
        return;
    if (k)
        kv_fmt_rot_fwd_rows(k, n, g->head_dim, g->head_dim);
    if (v)
        kv_fmt_rot_fwd_rows(v, n, g->head_dim, g->head_dim);
}

static void int_load_variant(uint32_t bits, const void *page,
                             const kv_page_geom_t *g, uint32_t variant,
                             uint32_t t0, uint32_t n, float *k, float *v)
{
    int_load_body(bits, page, g, t0, n, k, v);
    if (variant == 1u) {
        if (k)
            kv_fmt_rot_inv_rows(k, n, g->head_dim, g->head_dim);
        if (v)
            kv_fmt_rot_inv_rows(v, n, g->head_dim, g->head_dim);
    }
}

void kv_fmt_int4_load_variant(const void *page, const kv_page_geom_t *g,
                              uint32_t variant, uint32_t t0, uint32_t n,
                              float *k, float *v)
{
    int_load_variant(4u, page, g, variant, t0, n, k, v);
}
void kv_fmt_int2_load_variant(const void *page, const kv_page_geom_t *g,
                              uint32_t variant, uint32_t t0, uint32_t n,
                              float *k, float *v)
{
    int_load_variant(2u, page, g, variant, t0, n, k, v);
}

const kv_format_traits_t kv_fmt_int4 = KV_FMT_INT4_TRAITS;
const kv_format_traits_t kv_fmt_int2 = KV_FMT_INT2_TRAITS;
