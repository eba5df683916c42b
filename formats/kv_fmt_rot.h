/* SPDX-License-Identifier: MIT */
/*
 * kv_fmt_rot.h — the rotation of rotated INT pages (variant 1 of KV_FMT_INT4
 * and KV_FMT_INT2, kv_fmt_int.h): one definition, shared by the C codecs,
 * the CPU attention steps and the CUDA kernels (KV_HD).
 *
 * For head_dim D a power of two (16..KV_FMT_MAX_DIM), the rotation is the
 * orthogonal matrix
 *     R = H_D S / sqrt(D)
 * where S = diag(s_0 .. s_{D-1}) is a fixed +-1 sign diagonal and H_D the
 * Sylvester Hadamard matrix (H_1 = [1], H_2n = [[H, H], [H, -H]]); R is
 * applied to every K and V row of a page before INT quantization (QuaRot,
 * and llama.cpp's rotated quantized cache): a channel with large outliers
 * is spread over all D channels, so a group's range shrinks and so does its
 * quantization error. R^T = S H_D / sqrt(D) undoes it. Scores and sums stay
 * exact in exact arithmetic: q . k = (R q) . (R k) and
 * sum p_i v_i = R^T sum p_i (R v_i).
 *
 * The signs come from a documented seed, the same for every page, head and
 * store (page files depend on them: they never change):
 *     h = (c + 1) * 0x9E3779B1 (mod 2^32); h ^= h >> 16; h *= 0x85EBCA6B;
 *     h ^= h >> 13; s_c = -1 if h & 1 else +1.
 * The transform is the in-place fast Walsh-Hadamard butterfly (D log2 D
 * additions), then one multiplication by 1/sqrt(D) per element. In FP32 it
 * is orthogonal up to rounding: R^T R x = x within a few ulps per element
 * (tests/unit/test_format_rot.c).
 */
#ifndef KV_FMT_ROT_H
#define KV_FMT_ROT_H

#include <stdint.h>

#include "kv_fmt_layout.h"

/* 1 if head_dim d can be rotated (a power of two in 16..KV_FMT_MAX_DIM). */
static inline KV_HD int kv_fmt_rot_ok(uint32_t d)
{
    return d >= 16u && d <= KV_FMT_MAX_DIM && (d & (d - 1u)) == 0;
}

/* s_c: +1.0f or -1.0f. */
static inline KV_HD float kv_fmt_rot_sign(uint32_t c)
{
    uint32_t h = (c + 1u) * 0x9E3779B1u;
    h ^= h >> 16;
    h *= 0x85EBCA6Bu;
    h ^= h >> 13;
    return (h & 1u) ? -1.0f : 1.0f;
}

/* 1/sqrt(d) for d = 2^e a power of two: 2^(-e/2), times 1/sqrt(2) in
 * FP32 when e is odd (no libm: the same value on host and device). */
static inline KV_HD float kv_fmt_rot_scale(uint32_t d)
{
    float sc = 1.0f;
    uint32_t e = 0;
    while ((1u << e) < d)
        e++;
    for (uint32_t i = 0; i < e / 2u; i++)
        sc *= 0.5f;
    return (e & 1u) ? sc * 0.70710678118654752f : sc;
}

/* x <- H_D x (unnormalized butterfly), d a power of two. */
static inline KV_HD void kv_fmt_rot_wht(float *x, uint32_t d)
{
    for (uint32_t len = 1; len < d; len <<= 1)
        for (uint32_t i = 0; i < d; i += len << 1)
            for (uint32_t j = i; j < i + len; j++) {
                const float a = x[j], b = x[j + len];
                x[j] = a + b;
                x[j + len] = a - b;
            }
}

/* x <- R x (to the rotated space). */
static inline KV_HD void kv_fmt_rot_fwd(float *x, uint32_t d)
{
    for (uint32_t c = 0; c < d; c++)
        x[c] *= kv_fmt_rot_sign(c);
    kv_fmt_rot_wht(x, d);
    const float sc = kv_fmt_rot_scale(d);
    for (uint32_t c = 0; c < d; c++)
        x[c] *= sc;
}

/* x <- R^T x (back from the rotated space). */
static inline KV_HD void kv_fmt_rot_inv(float *x, uint32_t d)
{
    kv_fmt_rot_wht(x, d);
    const float sc = kv_fmt_rot_scale(d);
    for (uint32_t c = 0; c < d; c++)
        x[c] *= sc * kv_fmt_rot_sign(c);
}

/* Rows: n rows of d floats, row r at x + r * stride. */
static inline KV_HD void kv_fmt_rot_fwd_rows(float *x, uint32_t n,
                                             size_t stride, uint32_t d)
{
    for (uint32_t r = 0; r < n; r++)
        kv_fmt_rot_fwd(x + (size_t)r * stride, d);
}
static inline KV_HD void kv_fmt_rot_inv_rows(float *x, uint32_t n,
                                             size_t stride, uint32_t d)
{
    for (uint32_t r = 0; r < n; r++)
        kv_fmt_rot_inv(x + (size_t)r * stride, d);
}

#endif /* KV_FMT_ROT_H */
