/*
 * kv_half.c — IEEE binary16 <-> binary32 conversion (see kv_half.h).
 *
 * The scalar conversions are kv_fmt_codec_h2f / kv_fmt_codec_f2h of
 * kv_fmt_codec.h, the one definition the page formats and the CUDA kernels
 * share: bit manipulation; half -> float is exact (subnormal halfs become
 * normal floats; a signalling NaN comes out quiet, as F16C does it), float
 * -> half rounds to nearest, ties to even, overflows to +-Inf, and keeps NaN
 * a NaN (quiet bit set, top payload bits kept). The bulk paths use F16C
 * (vcvtph2ps / vcvtps2ph with round-to-nearest-even) in functions compiled
 * for that target and chosen once at run time; F16C converts exactly like
 * the scalar code, so both give bit-identical results (test_half checks
 * every half and many floats against a reference computed in the test).
 * No state besides the one-time CPU feature probe.
 */
#include "kv_half.h"

#include <stdatomic.h>

#include "kv_fmt_codec.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define KV_HALF_X86 1
#endif

float kv_half_to_float(kv_half_t h)
{
    return kv_fmt_codec_h2f(h);
}

kv_half_t kv_half_from_float(float f)
{
    return kv_fmt_codec_f2h(f);
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
