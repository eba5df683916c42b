/*
 * kv_half.c — IEEE binary16 <-> binary32 conversion (see kv_half.h).
 *
 * Scalar paths are pure integer bit manipulation: half -> float is exact
 * (subnormal halfs become normal floats; a signalling NaN comes out quiet,
 * as F16C does it), float -> half rounds to nearest,
 * ties to even, overflows to +-Inf, and keeps NaN a NaN (quiet bit set, top
 * payload bits kept). The bulk paths use F16C (vcvtph2ps / vcvtps2ph with
 * round-to-nearest-even) in functions compiled for that target and chosen
 * once at run time; F16C converts exactly like the scalar code, so both give
 * bit-identical results (test_half checks every half and many floats).
 * No state besides the one-time CPU feature probe.
 */
#include "kv_half.h"

#include <stdatomic.h>
#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define KV_HALF_X86 1
#endif

static inline uint32_t f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static inline float f32_from_bits(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

float kv_half_to_float(kv_half_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t man = h & 0x3ffu;

    if (exp == 0x1fu) /* Inf, or NaN: quieted (as F16C does), payload kept */
        return f32_from_bits(sign | 0x7f800000u | (man << 13) |
                             (man ? 0x400000u : 0u));
    if (exp != 0)     /* normal */
        return f32_from_bits(sign | ((exp + 112u) << 23) | (man << 13));
    if (man == 0)     /* +-0 */
        return f32_from_bits(sign);
    /* subnormal: man * 2^-24, normalize */
    uint32_t e = 113u; /* biased float exponent of 2^-14 */
    while (!(man & 0x400u)) {
        man <<= 1;
        e--;
    }
    return f32_from_bits(sign | (e << 23) | ((man & 0x3ffu) << 13));
}

kv_half_t kv_half_from_float(float f)
{
    uint32_t u = f32_bits(f);
    uint32_t sign = (u >> 16) & 0x8000u;
    uint32_t exp = (u >> 23) & 0xffu;
    uint32_t man = u & 0x7fffffu;

    if (exp == 0xffu) { /* Inf or NaN */
        if (man == 0)
            return (kv_half_t)(sign | 0x7c00u);
        return (kv_half_t)(sign | 0x7e00u | (man >> 13)); /* quiet NaN */
    }
    int32_t e = (int32_t)exp - 127 + 15; /* half biased exponent */
    if (e >= 0x1f)                       /* overflow */
        return (kv_half_t)(sign | 0x7c00u);
    if (e <= 0) {
        /* subnormal half (or zero): value = mant24 * 2^(exp-150); the half
         * unit is 2^-24, so shift right by (1 - e) + 13 = 14 - e. */
        if (e < -10) /* below half of the smallest subnormal: rounds to 0 */
            return (kv_half_t)sign;
        uint32_t m = man | 0x800000u;
        uint32_t shift = (uint32_t)(14 - e);
        uint32_t q = m >> shift;
        uint32_t rem = m & ((1u << shift) - 1u);
        uint32_t halfway = 1u << (shift - 1);
        if (rem > halfway || (rem == halfway && (q & 1u)))
            q++; /* may carry into the smallest normal: still correct */
        return (kv_half_t)(sign | q);
    }
    uint32_t h = ((uint32_t)e << 10) | (man >> 13);
    uint32_t rem = man & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u)))
        h++; /* carry may reach exponent 0x1f: that is +-Inf, correct */
    return (kv_half_t)(sign | h);
}

static void to_float_scalar(const kv_half_t *src, float *dst, size_t n)
{
    for (size_t i = 0; i < n; i++)
        dst[i] = kv_half_to_float(src[i]);
}

static void from_float_scalar(const float *src, kv_half_t *dst, size_t n)
{
    for (size_t i = 0; i < n; i++)
        dst[i] = kv_half_from_float(src[i]);
}

#ifdef KV_HALF_X86
__attribute__((target("avx2,fma,f16c"))) static void
to_float_f16c(const kv_half_t *src, float *dst, size_t n)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m128i h = _mm_loadu_si128((const __m128i *)(const void *)(src + i));
        _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(h));
    }
    for (; i < n; i++)
        dst[i] = kv_half_to_float(src[i]);
}

__attribute__((target("avx2,fma,f16c"))) static void
from_float_f16c(const float *src, kv_half_t *dst, size_t n)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(src + i),
                                    _MM_FROUND_TO_NEAREST_INT);
        _mm_storeu_si128((__m128i *)(void *)(dst + i), h);
    }
    for (; i < n; i++)
        dst[i] = kv_half_from_float(src[i]);
}

/* 1 if the CPU has F16C (and AVX2/FMA, which the target attribute lets the
 * compiler use). Probed once; a race only repeats the same probe. */
static int have_f16c(void)
{
    static _Atomic int cached = -1;
    int c = atomic_load_explicit(&cached, memory_order_relaxed);
    if (c < 0) {
        __builtin_cpu_init();
        c = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#ifndef __clang__ /* older clang has no "f16c" here; AVX2 CPUs all have it */
        c = c && __builtin_cpu_supports("f16c");
#endif
        atomic_store_explicit(&cached, c, memory_order_relaxed);
    }
    return c;
}
#endif

void kv_half_to_float_n(const kv_half_t *src, float *dst, size_t n)
{
#ifdef KV_HALF_X86
    if (have_f16c()) {
        to_float_f16c(src, dst, n);
        return;
    }
#endif
    to_float_scalar(src, dst, n);
}

void kv_half_from_float_n(const float *src, kv_half_t *dst, size_t n)
{
#ifdef KV_HALF_X86
    if (have_f16c()) {
        from_float_f16c(src, dst, n);
        return;
    }
#endif
    from_float_scalar(src, dst, n);
}
