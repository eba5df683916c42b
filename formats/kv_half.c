/* SPDX-License-Identifier: MIT */
/*
 * kv_half.c — IEEE binary16 <-> binary32 conversion (see kv_half.h).
 *
 * The scalar conversions are kv_fmt_codec_h2f / kv_fmt_codec_f2h of
 * kv_fmt_codec.h, the one definition the page formats, the CPU kernels and
 * the CUDA kernels share: bit manipulation; half -> float is exact
 * (subnormal halfs become normal floats; a signalling NaN comes out quiet,
 * as F16C does it), float -> half rounds to nearest, ties to even,
 * overflows to +-Inf, and keeps NaN a NaN (quiet bit set, top payload bits
 * kept). The bulk versions loop over them: portable C, no CPU dispatch (the
 * CPU kernels convert the rows attention reads with F16C themselves,
 * kernels/cpu/kv_cpu_simd.h, and give the same bits). test_half checks every
 * half and many floats against a reference computed in the test. No state.
 */
#include "kv_half.h"

#include "kv_fmt_codec.h"

float kv_half_to_float(kv_half_t h)
{
    return kv_fmt_codec_h2f(h);
}

kv_half_t kv_half_from_float(float f)
{
    return kv_fmt_codec_f2h(f);
}

void kv_half_to_float_n(const kv_half_t *src, float *dst, size_t n)
{
    for (size_t i = 0; i < n; i++)
        dst[i] = kv_fmt_codec_h2f(src[i]);
}

void kv_half_from_float_n(const float *src, kv_half_t *dst, size_t n)
{
    for (size_t i = 0; i < n; i++)
        dst[i] = kv_fmt_codec_f2h(src[i]);
}
