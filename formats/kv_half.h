/* SPDX-License-Identifier: MIT */
/*
 * kv_half.h — IEEE binary16 <-> binary32 conversion.
 *
 * Scalar conversions are exact (half -> float) and round to nearest even
 * (float -> half, overflow to +-Inf, NaN kept NaN); the bulk versions apply
 * them element by element (portable C).
 */
#ifndef KV_HALF_H
#define KV_HALF_H

#include <stddef.h>
#include <stdint.h>

typedef uint16_t kv_half_t;

#define KV_HALF_MAX 65504.0f

float     kv_half_to_float(kv_half_t h);
kv_half_t kv_half_from_float(float f);

/* dst[i] = half_to_float(src[i]) for i < n. */
void kv_half_to_float_n(const kv_half_t *src, float *dst, size_t n);
/* dst[i] = half_from_float(src[i]) for i < n. */
void kv_half_from_float_n(const float *src, kv_half_t *dst, size_t n);

#endif /* KV_HALF_H */
