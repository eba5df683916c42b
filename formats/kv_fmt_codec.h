/* SPDX-License-Identifier: MIT */
/*
 * kv_fmt_codec.h — the per-element math of the page formats, one source for
 * the C codecs, the CPU attention steps and the CUDA kernels (kernels/cuda/).
 *
 * Everything here is `static inline` and marked KV_HD (kv_fmt_layout.h:
 * `__host__ __device__` under nvcc, empty in C), so a CUDA kernel and a C
 * loop decode a page with the same operations. Byte offsets come from
 * kv_fmt_layout.h (the one definition of every layout); this header only
 * computes with them, and depends on nothing but that header and
 * <string.h> (cuda_fp16.h under nvcc).
 *
 * One definition of each step:
 *   - binary16: kv_fmt_codec_h2f is exact, kv_fmt_codec_f2h rounds to
 *     nearest even; kv_half.c's conversions are these (the CUDA intrinsics
 *     on the device, which round the same way).
 *   - INT dequantization, x^ = q * scale + min rounded once (q * scale is
 *     exact): kv_fmt_codec_dequant. Every reader of an INT code uses it or
 *     computes the same value: the C load (kv_fmt_int.c), MERGED's INT4
 *     directions (kv_fmt_codec_int4_word8), the CPU attention steps
 *     (kernels/cpu/kv_cpu_fmt_int.c: a vector FMA, or mul + add) and the
 *     CUDA kernels (__fmaf_rn). So kv_read, CPU attention and CUDA see the
 *     same bits for a page (tests/unit/test_format_int.c and
 *     test_attn_codes.c, tests/cuda/test_cuda_host.c check it).
 *   - KIVI quantization: kv_fmt_codec_quantize16 (the INT stores, MERGED's
 *     INT4 directions, the CUDA convert kernel).
 *
 * Bit-exactness (what the tests check): for every format, token and
 * channel, kv_fmt_codec_load8 gives exactly the floats kv_format_load
 * gives; MERGED restores as direction * magnitude (one rounding).
 *
 * Access: 16-byte loads where the layout guarantees 16-byte alignment (FP16
 * rows, INT key code words and key scale/min; page base 16-aligned, head_dim
 * a multiple of 16), 4- and 2-byte loads elsewhere. Callers pass a page
 * pointer (global or shared memory on the device) and the page's geometry.
 */
#ifndef KV_FMT_CODEC_H
#define KV_FMT_CODEC_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#if defined(__CUDACC__)
#include <cuda_fp16.h>
#endif

#include "kv_fmt_layout.h"

/* ---- loads --------------------------------------------------------------- */

/* Four little-endian words from a 16-byte aligned address. */
static inline KV_HD void kv_fmt_codec_ld16(const uint8_t *p, uint32_t w[4])
{
#ifdef __CUDA_ARCH__
    const uint4 u = *(const uint4 *)(const void *)p;
    w[0] = u.x;
    w[1] = u.y;
    w[2] = u.z;
    w[3] = u.w;
#else
    memcpy(w, p, 16);
#endif
}

static inline KV_HD uint32_t kv_fmt_codec_ld32(const uint8_t *p)
{
#ifdef __CUDA_ARCH__
    return *(const uint32_t *)(const void *)p;
#else
    uint32_t w;
    memcpy(&w, p, 4);
    return w;
#endif
}

static inline KV_HD uint16_t kv_fmt_codec_ld16b(const uint8_t *p)
{
#ifdef __CUDA_ARCH__
    return *(const uint16_t *)(const void *)p;
#else
    uint16_t h;
    memcpy(&h, p, 2);
    return h;
#endif
}

static inline KV_HD float kv_fmt_codec_ldf(const uint8_t *p)
{
#ifdef __CUDA_ARCH__
    return *(const float *)(const void *)p;
#else
    float f;
    memcpy(&f, p, 4);
    return f;
#endif
}

/* ---- binary16 ------------------------------------------------------------ */

/* Exact binary16 -> binary32. */
static inline KV_HD float kv_fmt_codec_h2f(uint16_t h)
{
#ifdef __CUDA_ARCH__
    return __half2float(__ushort_as_half(h));
#else
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t e = (h >> 10) & 0x1fu, m = h & 0x3ffu, u;
    float f;
    if (e == 0) {
        f = (float)m * 5.9604644775390625e-8f; /* m * 2^-24, exact */
        memcpy(&u, &f, 4);
        u |= sign;
    } else if (e == 31) { /* Inf, or NaN quieted (as F16C does) */
        u = sign | 0x7f800000u | (m << 13) | (m ? 0x400000u : 0u);
    } else {
        u = sign | ((e + 112u) << 23) | (m << 13);
    }
    memcpy(&f, &u, 4);
    return f;
#endif
}

/* binary32 -> binary16, round to nearest even, overflow to +-Inf. */
static inline KV_HD uint16_t kv_fmt_codec_f2h(float f)
{
#ifdef __CUDA_ARCH__
    return __half_as_ushort(__float2half_rn(f));
#else
    uint32_t u;
    memcpy(&u, &f, 4);
    uint32_t sign = (u >> 16) & 0x8000u, exp = (u >> 23) & 0xffu;
    uint32_t man = u & 0x7fffffu;
    if (exp == 0xffu)
        return (uint16_t)(sign | (man ? 0x7e00u | (man >> 13) : 0x7c00u));
    int32_t e = (int32_t)exp - 112;
    if (e >= 0x1f)
        return (uint16_t)(sign | 0x7c00u);
    if (e <= 0) {
        if (e < -10)
            return (uint16_t)sign;
        uint32_t m = man | 0x800000u, shift = (uint32_t)(14 - e);
        uint32_t q = m >> shift, rem = m & ((1u << shift) - 1u);
        uint32_t half = 1u << (shift - 1);
        if (rem > half || (rem == half && (q & 1u)))
            q++;
        return (uint16_t)(sign | q);
    }
    uint32_t h = ((uint32_t)e << 10) | (man >> 13), rem = man & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u)))
        h++;
    return (uint16_t)(sign | h);
#endif
}

/* Neighbours toward -inf / +inf of a finite binary16. */
static inline KV_HD uint16_t kv_fmt_codec_h_down(uint16_t h)
{
    if (h == 0x0000u)
        return 0x8001u;
    return (h & 0x8000u) ? (uint16_t)(h + 1u) : (uint16_t)(h - 1u);
}
static inline KV_HD uint16_t kv_fmt_codec_h_up(uint16_t h)
{
    if (h == 0x8000u)
        return 0x0001u;
    return (h & 0x8000u) ? (uint16_t)(h - 1u) : (uint16_t)(h + 1u);
}

/* INT dequantization: q * s + m rounded once to FP32, the value of
 * fmaf(q, s, m). q is a code (0..15), s and m binary16 values, so q * s has
 * at most 4 + 11 significant bits and is exact in FP32: the product then
 * the sum round once, like a fused multiply-add. Every form of it (this
 * function, an FMA instruction, mul + add on vectors, __fmaf_rn) gives
 * the same bits on every target (tests/unit/test_format_int.c checks it
 * against fmaf for every code, every finite scale and 186 mins). */
static inline KV_HD float kv_fmt_codec_dequant(uint32_t q, float s, float m)
{
#ifdef __CUDA_ARCH__
    return __fmaf_rn((float)q, s, m);
#else
    const float x = (float)q * s; /* exact */
    return x + m;
#endif
}

static inline KV_HD float kv_fmt_codec_mul(float a, float b)
{
#ifdef __CUDA_ARCH__
    return __fmul_rn(a, b);
#else
    return a * b;
#endif
}

/* ---- decode: 8 channels c0..c0+7 (c0 % 8 == 0) of token t ---------------- */

/* FP16 page; which 0 = K, 1 = V. */
static inline KV_HD void kv_fmt_codec_fp16_load8(const uint8_t *page,
                                                 uint32_t d, uint32_t pb,
                                                 uint32_t t, uint32_t c0,
                                                 uint32_t which, float out[8])
{
    const size_t row = which ? kv_fmt_fp16_v_row(d, kv_fmt_fp16_tpp(d, pb), t)
                             : kv_fmt_fp16_k_row(d, t);
    uint32_t w[4];
    kv_fmt_codec_ld16(page + row + 2u * c0, w);
    for (uint32_t j = 0; j < 8; j++)
        out[j] = kv_fmt_codec_h2f((uint16_t)(w[j / 2u] >> (16u * (j % 2u))));
}

/* INT4/INT2 keys: per channel over the token's group. */
static inline KV_HD void kv_fmt_codec_int_k8(const uint8_t *page, uint32_t d,
                                             uint32_t bits, uint32_t t,
                                             uint32_t c0, float out[8])
{
    const kv_fmt_int_layout_t l = kv_fmt_int_layout(d, bits);
    const uint8_t *blk = page + (size_t)(t / KV_FMT_INT_GROUP) * l.group_bytes;
    const uint32_t lt = t % KV_FMT_INT_GROUP, per = 32u / bits;
    const uint32_t mask = (1u << bits) - 1u, sh = bits * (lt % per);
    uint32_t w[8], s[4], m[4];
    const uint8_t *wp = blk + l.k_codes + ((size_t)(lt / per) * d + c0) * 4u;
    kv_fmt_codec_ld16(wp, w);
    kv_fmt_codec_ld16(wp + 16, w + 4);
    kv_fmt_codec_ld16(blk + l.k_scale + 2u * c0, s);
    kv_fmt_codec_ld16(blk + l.k_min + 2u * c0, m);
    for (uint32_t j = 0; j < 8; j++) {
        const uint32_t sh16 = 16u * (j % 2u);
        out[j] = kv_fmt_codec_dequant(
            (w[j] >> sh) & mask,
            kv_fmt_codec_h2f((uint16_t)(s[j / 2u] >> sh16)),
            kv_fmt_codec_h2f((uint16_t)(m[j / 2u] >> sh16)));
    }
}

/* INT4/INT2 values: per token over groups of 16 channels. */
static inline KV_HD void kv_fmt_codec_int_v8(const uint8_t *page, uint32_t d,
                                             uint32_t bits, uint32_t t,
                                             uint32_t c0, float out[8])
{
    const kv_fmt_int_layout_t l = kv_fmt_int_layout(d, bits);
    const uint8_t *blk = page + (size_t)(t / KV_FMT_INT_GROUP) * l.group_bytes;
    const uint32_t lt = t % KV_FMT_INT_GROUP, per = 32u / bits;
    const uint32_t mask = (1u << bits) - 1u;
    const uint32_t ng = d / 16u, cg = c0 / 16u, hh = (c0 / 8u) % 2u;
    const uint32_t pi = lt * ng + cg; /* (token, channel group) */
    const uint32_t word = kv_fmt_codec_ld32(
        blk + l.v_codes + ((size_t)pi * (bits / 2u) + (8u * hh) / per) * 4u);
    const float s = kv_fmt_codec_h2f(kv_fmt_codec_ld16b(blk + l.v_scale + 2u * pi));
    const float m = kv_fmt_codec_h2f(kv_fmt_codec_ld16b(blk + l.v_min + 2u * pi));
    for (uint32_t j = 0; j < 8; j++)
        out[j] = kv_fmt_codec_dequant(
            (word >> (bits * ((8u * hh + j) % per))) & mask, s, m);
}

/* MERGED INT4 direction rows (kv_fmt_merged.h): the 8 codes of one word
 * (channel j at bits 4j..4j+3) with their group's scale and min, before the
 * magnitude. The C format decodes its rows with this too. */
static inline KV_HD void kv_fmt_codec_int4_word8(uint32_t word, float s,
                                                 float m, float out[8])
{
    for (uint32_t j = 0; j < 8; j++)
        out[j] = kv_fmt_codec_dequant((word >> (4u * j)) & 15u, s, m);
}

/* MERGED page read as variant w (0 = layer l-1, 1 = layer l). */
static inline KV_HD void kv_fmt_codec_merged_load8(const uint8_t *page,
                                                   uint32_t d, uint32_t pb,
                                                   uint32_t w, uint32_t t,
                                                   uint32_t c0, uint32_t which,
                                                   float out[8])
{
    const uint32_t dirf = kv_fmt_codec_ld32(page);
    const kv_fmt_merged_layout_t l = kv_fmt_merged_layout(d, pb, dirf);
    const float mag =
        kv_fmt_codec_ldf(page + kv_fmt_merged_mag(&l, t, 2u * which + w));
    const uint8_t *row = page + kv_fmt_merged_dir(&l, which, t);
    if (dirf == KV_FMT_FP16) {
        uint32_t h[4];
        kv_fmt_codec_ld16(row + 2u * c0, h);
        for (uint32_t j = 0; j < 8; j++)
            out[j] = kv_fmt_codec_mul(
                kv_fmt_codec_h2f((uint16_t)(h[j / 2u] >> (16u * (j % 2u)))),
                mag);
        return;
    }
    const uint32_t g = c0 / 16u;
    const float s = kv_fmt_codec_h2f(
        kv_fmt_codec_ld16b(row + kv_fmt_merged_int4_scale(d) + 2u * g));
    const float m = kv_fmt_codec_h2f(
        kv_fmt_codec_ld16b(row + kv_fmt_merged_int4_min(d) + 2u * g));
    kv_fmt_codec_int4_word8(kv_fmt_codec_ld32(row + 4u * (c0 / 8u)), s, m, out);
    for (uint32_t j = 0; j < 8; j++)
        out[j] = kv_fmt_codec_mul(out[j], mag);
}

/* Any format: 8 channels of K (which 0) or V (which 1) of token t of a page
 * of format fmt read as variant var. */
static inline KV_HD void kv_fmt_codec_load8(uint32_t fmt, uint32_t var,
                                            const uint8_t *page, uint32_t d,
                                            uint32_t pb, uint32_t t,
                                            uint32_t c0, uint32_t which,
                                            float out[8])
{
    switch (fmt) {
    case KV_FMT_INT4:
    case KV_FMT_INT2:
        if (which)
            kv_fmt_codec_int_v8(page, d, kv_fmt_int_bits(fmt), t, c0, out);
        else
            kv_fmt_codec_int_k8(page, d, kv_fmt_int_bits(fmt), t, c0, out);
        return;
    case KV_FMT_MERGED:
        kv_fmt_codec_merged_load8(page, d, pb, var, t, c0, which, out);
        return;
    default:
        kv_fmt_codec_fp16_load8(page, d, pb, t, c0, which, out);
        return;
    }
}

/* 1 if kv_fmt_codec_load8 of a page of format fmt read as variant var gives
 * rotated rows (R k, R v: rotated INT pages, variant 1 of INT4/INT2,
 * formats/kv_fmt_rot.h), which a reader scores with R q or turns back with
 * kv_fmt_rot_inv; 0 if it gives the rows themselves. (kv_format_load
 * un-rotates; load8 decodes the codes as stored.) */
static inline KV_HD int kv_fmt_codec_rotated(uint32_t fmt, uint32_t var)
{
    return (fmt == KV_FMT_INT4 || fmt == KV_FMT_INT2) && var == 1u;
}

/* Byte range [*lo, *hi) of a page that tokens [t0, t0 + n) of format fmt
 * are decoded from, as up to two ranges (FP16: K rows, V rows; INT: their
 * group blocks; MERGED: the whole page, since its header decides where rows
 * are). Every bound is a multiple of 16 when d is and pb is. Returns the
 * number of ranges (1 or 2). */
static inline KV_HD uint32_t kv_fmt_codec_ranges(uint32_t fmt, uint32_t d,
                                                 uint32_t pb, uint32_t t0,
                                                 uint32_t n, uint32_t lo[2],
                                                 uint32_t hi[2])
{
    if (fmt == KV_FMT_FP16) {
        const uint32_t tpp = kv_fmt_fp16_tpp(d, pb);
        lo[0] = (uint32_t)kv_fmt_fp16_k_row(d, t0);
        hi[0] = (uint32_t)kv_fmt_fp16_k_row(d, t0 + n);
        lo[1] = (uint32_t)kv_fmt_fp16_v_row(d, tpp, t0);
        hi[1] = (uint32_t)kv_fmt_fp16_v_row(d, tpp, t0 + n);
        return 2;
    }
    if (fmt == KV_FMT_INT4 || fmt == KV_FMT_INT2) {
        const uint32_t gb = KV_FMT_INT_GROUP_BYTES(d, kv_fmt_int_bits(fmt));
        lo[0] = (t0 / KV_FMT_INT_GROUP) * gb;
        hi[0] = ((t0 + n - 1u) / KV_FMT_INT_GROUP + 1u) * gb;
        return 1;
    }
    lo[0] = 0;
    hi[0] = pb;
    return 1;
}

/* ---- encode -------------------------------------------------------------- */

/* KIVI asymmetric quantization of 16 values x[j * xs] at `bits` (2 or 4):
 * codes into words[w * ws] (w < bits / 2), binary16 scale and min. min
 * rounds toward -inf and scale toward +inf so that min + L * scale >= max;
 * codes use the stored values; a constant group stores scale +-0 (sign of
 * min) and codes 0 (kv_fmt_int.h). */
static inline KV_HD void kv_fmt_codec_quantize16(uint32_t bits, const float *x,
                                                 size_t xs, uint32_t *words,
                                                 size_t ws, uint16_t *hscale,
                                                 uint16_t *hmin)
{
    const uint32_t per = 32u / bits, levels = (1u << bits) - 1u;
    float mn = x[0], mx = x[0];
    for (uint32_t j = 1; j < 16; j++) {
        float e = x[j * xs];
        mn = e < mn ? e : mn;
        mx = e > mx ? e : mx;
    }
    uint16_t hm = kv_fmt_codec_f2h(mn), hs;
    if (mx == mn) {
        hs = (uint16_t)(hm & 0x8000u);
    } else {
        if (kv_fmt_codec_h2f(hm) > mn)
            hm = kv_fmt_codec_h_down(hm);
        double range = (double)mx - (double)kv_fmt_codec_h2f(hm);
        hs = kv_fmt_codec_f2h((float)(range / levels));
        while ((double)kv_fmt_codec_h2f(hs) * levels < range)
            hs = kv_fmt_codec_h_up(hs);
    }
    const float fm = kv_fmt_codec_h2f(hm), fs = kv_fmt_codec_h2f(hs);
    const float top = (float)levels;
    for (uint32_t w = 0; w < bits / 2u; w++) {
        uint32_t word = 0;
        for (uint32_t i = 0; i < per; i++) {
            float q = fs != 0.0f ? (x[(w * per + i) * xs] - fm) / fs : 0.0f;
            q = q < 0.0f ? 0.0f : (q > top ? top : q);
            word |= (uint32_t)(q + 0.5f) << (bits * i);
        }
        words[w * ws] = word;
    }
    *hscale = hs;
    *hmin = hm;
}

#endif /* KV_FMT_CODEC_H */
