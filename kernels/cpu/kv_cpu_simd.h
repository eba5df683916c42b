/* SPDX-License-Identifier: MIT */
/*
 * kv_cpu_simd.h — the vector types of the CPU hot loops and the few
 * operations whose instruction is never left to the optimizer.
 *
 * The hot loops (kv_cpu_attend.c, kv_cpu_fmt_int.c, kv_cpu_fmt_load.c) are
 * compiled once per vector ISA, each build in its own translation unit with
 * its own -m flags (CMakeLists.txt: an object library per build), so the
 * macros __AVX2__, __FMA__, __F16C__, __AVX512F__ say what THIS build may
 * use. Arithmetic that GNU C vector extensions express directly (+, -, *,
 * &, >>, compares, conversions) is written that way and lowered by the
 * compiler's vector lowering, the same at every optimization level. The
 * rest is here, one definition per build:
 *
 *   fused multiply-add   an FMA instruction where the build has one, else
 *                        fmaf per lane (the same value: one rounding); never
 *                        a lane loop the vectorizer may or may not merge
 *                        (what such a loop cost at -O3: docs/results/
 *                        benchmarks.md);
 *   binary16 -> FP32     vcvtph2ps where the build has F16C, else the
 *                        exact scalar conversion (kv_fmt_codec_h2f);
 *   blocks               kv_vb_t, the build's native width: 16 lanes
 *                        (one INT quantization group) with AVX-512F, 8
 *                        otherwise; the INT steps work block by block.
 *
 * Every build performs the same FP32 operations in the same order, so all
 * builds give identical bits (tests compare them). Vectors are passed by
 * pointer to helpers that are always inlined, so none crosses a call (GCC's
 * -Wpsabi notes about 32-byte vectors in the SSE2 build do not apply).
 */
#ifndef KV_CPU_SIMD_H
#define KV_CPU_SIMD_H

#include <stdint.h>
#include <string.h>

#include "formats/kv_fmt_codec.h"

#if defined(__AVX2__) || defined(__F16C__) || defined(__AVX512F__)
#include <immintrin.h>
#endif

#pragma GCC diagnostic ignored "-Wpsabi"

/* Same operations in every build: no a*b+c contraction into an FMA (GCC
 * does none under -std=c11; clang would, per statement). */
#ifdef __clang__
#pragma STDC FP_CONTRACT OFF
#endif

#define KV_SIMD static inline __attribute__((always_inline))

typedef float kv_v8f __attribute__((vector_size(32)));
typedef uint32_t kv_v8u __attribute__((vector_size(32)));
typedef int32_t kv_v8i __attribute__((vector_size(32)));
typedef float kv_v4f __attribute__((vector_size(16)));

/* ---- 8 lanes ------------------------------------------------------------- */

KV_SIMD kv_v8f kv_v8f_ld(const float *p)
{
    kv_v8f v;
    memcpy(&v, p, sizeof v);
    return v;
}

KV_SIMD void kv_v8f_st(float *p, const kv_v8f *v)
{
    memcpy(p, v, sizeof *v);
}

/* Broadcast (x itself in every lane, -0 included). */
KV_SIMD kv_v8f kv_v8f_set1(float x)
{
#if defined(__AVX__)
    return (kv_v8f)_mm256_set1_ps(x);
#else
    return (kv_v8f){x, x, x, x, x, x, x, x};
#endif
}

/* *acc += *a * *b lane-wise, rounded once. */
KV_SIMD void kv_v8f_fma(kv_v8f *acc, const kv_v8f *a, const kv_v8f *b)
{
#if defined(__FMA__)
    *acc = (kv_v8f)_mm256_fmadd_ps((__m256)*a, (__m256)*b, (__m256)*acc);
#else
    for (int i = 0; i < 8; i++)
        (*acc)[i] = __builtin_fmaf((*a)[i], (*b)[i], (*acc)[i]);
#endif
}

/* 8 binary16 values at p (any alignment), exactly as FP32. */
KV_SIMD kv_v8f kv_v8f_ld_half(const uint16_t *p)
{
#if defined(__F16C__)
    return (kv_v8f)_mm256_cvtph_ps(
        _mm_loadu_si128((const __m128i *)(const void *)p));
#else
    kv_v8f v;
    for (int i = 0; i < 8; i++)
        v[i] = kv_fmt_codec_h2f(p[i]);
    return v;
#endif
}

/* Sum of the 8 lanes of v, in a fixed order (the same in every build). */
KV_SIMD float kv_v8f_hsum(const kv_v8f *v)
{
    float h[8];
    memcpy(h, v, sizeof h);
    return ((h[0] + h[4]) + (h[2] + h[6])) + ((h[1] + h[5]) + (h[3] + h[7]));
}

/* dst[0..n) = binary16 src[0..n) as FP32 (exact). */
KV_SIMD void kv_cpu_half_to_float(const uint16_t *src, float *dst, size_t n)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const kv_v8f v = kv_v8f_ld_half(src + i);
        kv_v8f_st(dst + i, &v);
    }
    for (; i < n; i++)
        dst[i] = kv_fmt_codec_h2f(src[i]);
}

/* ---- blocks: the native width, for the INT steps ------------------------
 * A block is KV_VB_W lanes: 16 (one quantization group) with AVX-512F, 8
 * (half a group) otherwise. The INT steps work block by block: lanes are
 * tokens (K) or channels (V) of one group. */

#if defined(__AVX512F__)
#define KV_VB_W 16u
typedef __m512 kv_vb_t;
typedef __m512i kv_vbu_t;
#else
#define KV_VB_W 8u
typedef kv_v8f kv_vb_t;
typedef kv_v8u kv_vbu_t;
#endif
#define KV_VB_PER_GROUP (16u / KV_VB_W)

KV_SIMD void kv_vb_zero(kv_vb_t *x)
{
#if defined(__AVX512F__)
    *x = _mm512_setzero_ps();
#else
    *x = kv_v8f_set1(0.0f);
#endif
}

/* *x = *x + *y lane-wise. */
KV_SIMD void kv_vb_add(kv_vb_t *x, const kv_vb_t *y)
{
#if defined(__AVX512F__)
    *x = _mm512_add_ps(*x, *y);
#else
    *x += *y;
#endif
}

/* *acc += a * *x lane-wise, rounded once. */
KV_SIMD void kv_vb_fma_s(kv_vb_t *acc, float a, const kv_vb_t *x)
{
#if defined(__AVX512F__)
    *acc = _mm512_fmadd_ps(_mm512_set1_ps(a), *x, *acc);
#else
    const kv_v8f av = kv_v8f_set1(a);
    kv_v8f_fma(acc, &av, x);
#endif
}

/* KV_VB_W floats to / from p (any alignment). */
KV_SIMD void kv_vb_st(float *p, const kv_vb_t *x)
{
#if defined(__AVX512F__)
    _mm512_storeu_ps(p, *x);
#else
    kv_v8f_st(p, x);
#endif
}

KV_SIMD void kv_vb_ld(kv_vb_t *x, const float *p)
{
#if defined(__AVX512F__)
    *x = _mm512_loadu_ps(p);
#else
    *x = kv_v8f_ld(p);
#endif
}

/* Lane shifts of block `blk` of a group member's 16 codes at `bits` (2 or
 * 4): lane j holds code i = blk * KV_VB_W + j, at bits * (i % P) of its
 * word (P = 32 / bits codes per word). */
KV_SIMD void kv_vb_shifts(kv_vbu_t *sh, uint32_t bits, uint32_t blk)
{
    uint32_t s[KV_VB_W];
    for (uint32_t j = 0; j < KV_VB_W; j++)
        s[j] = bits * ((blk * KV_VB_W + j) % (32u / bits));
    memcpy(sh, s, sizeof s);
}

/* The codes of block `blk` of a group member: code i (i = blk * KV_VB_W +
 * lane) sits in word w[(i / P) * stride] (P = 32 / bits; INT2: one word,
 * INT4: two words `stride` apart) at shift sh (kv_vb_shifts). */
KV_SIMD void kv_vb_codes(kv_vbu_t *c, const uint32_t *w, size_t stride,
                         uint32_t blk, const kv_vbu_t *sh, uint32_t bits)
{
    const uint32_t mask = (1u << bits) - 1u;
#if defined(__AVX512F__)
    (void)blk;
    const __m512i wv =
        bits == 4u ? _mm512_mask_blend_epi32((__mmask16)0xff00u,
                                             _mm512_set1_epi32((int)w[0]),
                                             _mm512_set1_epi32((int)w[stride]))
                   : _mm512_set1_epi32((int)w[0]);
    *c = _mm512_and_si512(_mm512_srlv_epi32(wv, *sh),
                          _mm512_set1_epi32((int)mask));
#else
    const uint32_t word = bits == 4u ? w[blk * stride] : w[0];
    const kv_v8u zero = {0};
    *c = ((zero + word) >> *sh) & mask;
#endif
}

/* x = the codes c as FP32, lane-wise (exact). */
KV_SIMD void kv_vb_cvt(kv_vb_t *x, const kv_vbu_t *c)
{
#if defined(__AVX512F__)
    *x = _mm512_cvtepi32_ps(*c);
#else
    *x = __builtin_convertvector((kv_v8i)*c, kv_v8f);
#endif
}

/* *x = *x + a lane-wise. */
KV_SIMD void kv_vb_add_s(kv_vb_t *x, float a)
{
#if defined(__AVX512F__)
    *x = _mm512_add_ps(*x, _mm512_set1_ps(a));
#else
    *x += kv_v8f_set1(a);
#endif
}

/* x = codes * scale + min lane-wise: kv_fmt_codec_dequant's value (the
 * product is exact, so an FMA and a multiply then an add give the same
 * bits; the portable build uses the latter, no fmaf call). */
KV_SIMD void kv_vb_dequant(kv_vb_t *x, const kv_vbu_t *c, float scale,
                           float min)
{
#if defined(__AVX512F__)
    *x = _mm512_fmadd_ps(_mm512_cvtepi32_ps(*c), _mm512_set1_ps(scale),
                         _mm512_set1_ps(min));
#elif defined(__FMA__)
    const kv_v8f s = kv_v8f_set1(scale);
    const kv_v8f cf = __builtin_convertvector((kv_v8i)*c, kv_v8f);
    *x = kv_v8f_set1(min);
    kv_v8f_fma(x, &cf, &s);
#else
    *x = __builtin_convertvector((kv_v8i)*c, kv_v8f) * kv_v8f_set1(scale);
    *x = *x + kv_v8f_set1(min);
#endif
}

#endif /* KV_CPU_SIMD_H */
