/* SPDX-License-Identifier: MIT */
/*
 * kv_quant_avx2.c — AVX2+FMA kernels for kv_quant (see kv_quant_simd.h).
 *
 * Compiled with per-function target attributes so the rest of the build
 * stays baseline x86-64; called only after kv_q_have_avx2() said yes.
 * Row dequantization of the file layout (the embedding lookup, norms), the
 * fixed-order FP32 dot of the dense attention path, the activation
 * quantizer and the packed matmul kernels: integer (vpmaddwd) for Q4_1 /
 * Q8_0, FP32 FMA for F16 / F32 (layouts and arithmetic contract in
 * kv_quant.h). Type numbers are the ggml ones (0 F32, 1 F16, 3 Q4_1, 8 Q8_0).
 * There is no AVX-512 variant yet: the machines this was measured on had
 * none to check it against (docs/results/benchmarks.md, issue 32).
 */
#include "kv_quant_simd.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <cpuid.h>
#include <immintrin.h>
#include <string.h>

#define AVX2 __attribute__((target("avx2,fma,f16c")))

static int simd_state = -1; /* -1 unknown, 0 off, 1 on */

/* CPUID: AVX2 (leaf 7 ebx bit 5), FMA (leaf 1 ecx 12), F16C (ecx 29), and
 * the OS saving YMM state (OSXSAVE ecx 27, XCR0 bits 1-2). Written with
 * cpuid.h rather than __builtin_cpu_supports, which not every compiler
 * knows "f16c" for. */
static int cpu_has_avx2(void)
{
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d))
        return 0;
    const unsigned need1 = (1u << 12) | (1u << 27) | (1u << 28) | (1u << 29);
    if ((c & need1) != need1)
        return 0;
    unsigned xlo, xhi;
    __asm__ volatile("xgetbv" : "=a"(xlo), "=d"(xhi) : "c"(0));
    if ((xlo & 6u) != 6u)
        return 0;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d))
        return 0;
    return (b >> 5) & 1u;
}

int kv_q_have_avx2(void)
{
    if (simd_state < 0)
        simd_state = cpu_has_avx2();
    return simd_state;
}

void kv_q_set_simd(int on) { simd_state = on && cpu_has_avx2(); }

AVX2 static inline float half1(const uint8_t *p)
{
    uint16_t h;
    memcpy(&h, p, 2);
    return _cvtsh_ss(h);
}

AVX2 void kv_q_deq_q4_1_avx2(const uint8_t *b, float *y, size_t nb)
{
    const __m128i lo_mask = _mm_set1_epi8(0x0f);
    for (size_t i = 0; i < nb; i++, b += 20, y += 32) {
        __m256 d = _mm256_set1_ps(half1(b)), m = _mm256_set1_ps(half1(b + 2));
        __m128i raw = _mm_loadu_si128((const __m128i *)(b + 4));
        __m128i lo = _mm_and_si128(raw, lo_mask);
        __m128i hi = _mm_and_si128(_mm_srli_epi16(raw, 4), lo_mask);
        __m128i parts[4] = {lo, _mm_srli_si128(lo, 8), hi, _mm_srli_si128(hi, 8)};
        for (int j = 0; j < 4; j++) {
            __m256 q = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(parts[j]));
            _mm256_storeu_ps(y + 8 * j, _mm256_add_ps(_mm256_mul_ps(q, d), m));
        }
    }
}

AVX2 void kv_q_deq_q8_0_avx2(const uint8_t *b, float *y, size_t nb)
{
    for (size_t i = 0; i < nb; i++, b += 34, y += 32) {
        __m256 d = _mm256_set1_ps(half1(b));
        for (int j = 0; j < 4; j++) {
            __m128i q8 = _mm_loadl_epi64((const __m128i *)(b + 2 + 8 * j));
            __m256 q = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q8));
            _mm256_storeu_ps(y + 8 * j, _mm256_mul_ps(q, d));
        }
    }
}

/* The fixed reduction tree: ((l0+l4)+(l2+l6)) + ((l1+l5)+(l3+l7)). */
AVX2 static inline float hsum(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
    return _mm_cvtss_f32(s);
}

AVX2 float kv_q_dot_avx2(const float *a, const float *b, size_t n)
{
    __m256 acc = _mm256_setzero_ps();
    for (size_t k = 0; k < n; k += 8)
        acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + k), _mm256_loadu_ps(b + k), acc);
    return hsum(acc);
}

/* ---- packed matmul ------------------------------------------------------
 * A kernel computes P packs (8 rows each) x T activation rows over all
 * columns: per column k it decodes the P packs' 8 weights once (one register
 * each) and does P x T FMAs with the broadcast x[t][k]. Everything is
 * inlined with P, T and the type constant, so each (type, P, T) becomes its
 * own loop with the accumulators in registers. Per output the operations
 * are the same for every (P, T): that is the batch invariance. */

#define KINLINE static inline __attribute__((always_inline, target("avx2,fma,f16c")))

/* F16 / F32: the 8 rows' weights at column k of a pack block. */
KINLINE __m256 kdeq(uint32_t type, const uint8_t *blk, int k)
{
    if (type == 1) /* F16 */
        return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(blk + 16 * k)));
    return _mm256_loadu_ps((const float *)(blk + 32 * k)); /* F32 */
}

KINLINE size_t kblock_bytes(uint32_t type)
{
    return type == 1 ? 512 : 1024;
}

/* P packs starting at pk (stride apart) x T rows of x; results into
 * y[t * ldy + 8 * p + i] for rows 8 * p + i < nrows (relative). */
KINLINE void kern(uint32_t type, const uint8_t *pk, size_t stride, int P, const float *x,
                  size_t ldx, int T, uint32_t cols, float *y, size_t ldy, uint32_t nrows)
{
    __m256 acc[4][8];
    const size_t bb = kblock_bytes(type);
#pragma GCC unroll 4
    for (int p = 0; p < P; p++)
#pragma GCC unroll 8
        for (int t = 0; t < T; t++)
            acc[p][t] = _mm256_setzero_ps();
    for (uint32_t b = 0; b < cols / 32; b++) {
        const float *xb = x + (size_t)b * 32;
        for (int k = 0; k < 32; k++) {
            __m256 w[4];
#pragma GCC unroll 4
            for (int p = 0; p < P; p++)
                w[p] = kdeq(type, pk + p * stride + b * bb, k);
#pragma GCC unroll 8
            for (int t = 0; t < T; t++) {
                __m256 bx = _mm256_broadcast_ss(xb + t * ldx + k);
#pragma GCC unroll 4
                for (int p = 0; p < P; p++)
                    acc[p][t] = _mm256_fmadd_ps(bx, w[p], acc[p][t]);
            }
        }
    }
#pragma GCC unroll 4
    for (int p = 0; p < P; p++)
#pragma GCC unroll 8
        for (int t = 0; t < T; t++) {
            float tmp[8];
            _mm256_storeu_ps(tmp, acc[p][t]);
            for (uint32_t i = 0; i < 8 && 8 * (uint32_t)p + i < nrows; i++)
                y[t * ldy + 8 * p + i] = tmp[i];
        }
}

/* One type: packs [p0, p1) in groups of 4 for 1-2 activation rows (decode),
 * one pack at a time for 8 rows at once (prefill), remainders smaller. */
KINLINE void packed_typed(uint32_t type, const uint8_t *packed, size_t stride, uint32_t cols,
                          uint32_t rows, uint32_t p0, uint32_t p1, const float *x, uint32_t n,
                          float *y, size_t ldy)
{
    const size_t ldx = cols;
    if (n <= 2) {
        uint32_t p = p0;
        for (; p + 4 <= p1; p += 4) {
            const uint8_t *pk = packed + p * stride;
            float *yp = y + 8 * p;
            uint32_t nr = rows - 8 * p;
            if (n == 1)
                kern(type, pk, stride, 4, x, ldx, 1, cols, yp, ldy, nr);
            else
                kern(type, pk, stride, 4, x, ldx, 2, cols, yp, ldy, nr);
        }
        for (; p < p1; p++) {
            const uint8_t *pk = packed + p * stride;
            if (n == 1)
                kern(type, pk, stride, 1, x, ldx, 1, cols, y + 8 * p, ldy, rows - 8 * p);
            else
                kern(type, pk, stride, 1, x, ldx, 2, cols, y + 8 * p, ldy, rows - 8 * p);
        }
        return;
    }
    for (uint32_t p = p0; p < p1; p++) {
        const uint8_t *pk = packed + p * stride;
        uint32_t nr = rows - 8 * p;
        uint32_t t = 0;
        for (; t + 8 <= n; t += 8)
            kern(type, pk, stride, 1, x + t * ldx, ldx, 8, cols, y + t * ldy + 8 * p, ldy, nr);
        const float *xt = x + t * ldx;
        float *yt = y + t * ldy + 8 * p;
        switch (n - t) {
        case 7: kern(type, pk, stride, 1, xt, ldx, 7, cols, yt, ldy, nr); break;
        case 6: kern(type, pk, stride, 1, xt, ldx, 6, cols, yt, ldy, nr); break;
        case 5: kern(type, pk, stride, 1, xt, ldx, 5, cols, yt, ldy, nr); break;
        case 4: kern(type, pk, stride, 1, xt, ldx, 4, cols, yt, ldy, nr); break;
        case 3: kern(type, pk, stride, 1, xt, ldx, 3, cols, yt, ldy, nr); break;
        case 2: kern(type, pk, stride, 1, xt, ldx, 2, cols, yt, ldy, nr); break;
        case 1: kern(type, pk, stride, 1, xt, ldx, 1, cols, yt, ldy, nr); break;
        default: break;
        }
    }
}

AVX2 void kv_q_packed_avx2(uint32_t type, const uint8_t *packed, size_t stride, uint32_t cols,
                           uint32_t rows, uint32_t p0, uint32_t p1, const float *x, uint32_t n,
                           float *y, size_t ldy)
{
    if (type == 1)
        packed_typed(1, packed, stride, cols, rows, p0, p1, x, n, y, ldy);
    else
        packed_typed(0, packed, stride, cols, rows, p0, p1, x, n, y, ldy);
}

/* ---- integer matmul (Q4_1 / Q8_0 weights, quantized activations) -------
 * Per pack block and activation row: the codes of each column pair come
 * out of the block's 16-bit words with shifts as 16 int16 lanes, row i's
 * two columns in lanes 2i, 2i + 1 (kv_quant.h's packed layout); vpmaddwd
 * with the pair's two activations broadcast gives row i's partial sum in
 * int32 lane i, so the 16 pairs' products add up to one vector holding the
 * 8 rows' exact sums with no horizontal reduction. Then two FMAs per block
 * in FP32 with the rows in the lanes (kv_quant.h's order). */

AVX2 void kv_q_quant_x_avx2(const float *x, kv_q_xblk_t *xq, size_t n)
{
    const __m256 sign = _mm256_set1_ps(-0.0f);
    for (size_t b = 0; b < n / 32; b++, x += 32) {
        __m256 v[4], mx = _mm256_setzero_ps(), sum = _mm256_setzero_ps();
        for (int j = 0; j < 4; j++) {
            v[j] = _mm256_loadu_ps(x + 8 * j);
            mx = _mm256_max_ps(mx, _mm256_andnot_ps(sign, v[j]));
            sum = _mm256_add_ps(sum, v[j]);
        }
        __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
        m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        m4 = _mm_max_ss(m4, _mm_shuffle_ps(m4, m4, 1));
        const float d = _mm_cvtss_f32(m4) / 32767.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        xq[b].d = d;
        xq[b].s = hsum(sum);
        const __m256 iv = _mm256_set1_ps(id);
        for (int j = 0; j < 4; j += 2) { /* round to nearest even (MXCSR default) */
            __m256i lo = _mm256_cvtps_epi32(_mm256_mul_ps(v[j], iv));
            __m256i hi = _mm256_cvtps_epi32(_mm256_mul_ps(v[j + 1], iv));
            __m256i q16 = _mm256_permute4x64_epi64(_mm256_packs_epi32(lo, hi), 0xd8);
            _mm256_storeu_si256((__m256i *)(xq[b].q + 8 * j), q16);
        }
    }
}

/* Activations 2 cp and 2 cp + 1 of a block in every int32 lane. */
KINLINE __m256i kpair(const int16_t *q, int cp)
{
    int32_t v;
    memcpy(&v, q + 2 * cp, 4);
    return _mm256_set1_epi32(v);
}

#define KV_Q_PREFETCH 2048 /* bytes ahead of the block being multiplied */

/* One pack (8 rows) against T activation rows (xb: the first row's nb
 * blocks, the next rows nb blocks apart): y[t * ldy + i] for rows i < nr.
 * The codes are widened once per block for the T rows; per output
 * the operations are the same for every T (the batch invariance). */
KINLINE void kint(uint32_t type, const uint8_t *pk, uint32_t nb, const kv_q_xblk_t *xb, int T,
                  float *y, size_t ldy, uint32_t nr)
{
    const size_t bb = type == 3 ? 160 : 272;
    __m256 acc[4];
#pragma GCC unroll 4
    for (int t = 0; t < T; t++)
        acc[t] = _mm256_setzero_ps();
    for (uint32_t b = 0; b < nb; b++, pk += bb) {
        /* The weights stream from memory: ask for them ~2 KiB ahead (past the
         * pack's end too: the next pack follows; prefetches never fault). */
#pragma GCC unroll 5
        for (size_t o = 0; o < bb; o += 64)
            _mm_prefetch((const char *)pk + KV_Q_PREFETCH + o, _MM_HINT_T0);
        /* Two partial sums per activation row (shorter add chains). */
        __m256i isum[4][2];
#pragma GCC unroll 4
        for (int t = 0; t < T; t++)
            isum[t][0] = isum[t][1] = _mm256_setzero_si256();
        if (type == 3) { /* 4 loads of 16 words, 4 nibbles (column pairs) each */
#pragma GCC unroll 4
            for (int L = 0; L < 4; L++) {
                const __m256i raw = _mm256_loadu_si256((const __m256i *)(pk + 32 + 32 * L));
                const __m256i m4 = _mm256_set1_epi16(15);
                const __m256i w[4] = {_mm256_and_si256(raw, m4),
                                      _mm256_and_si256(_mm256_srli_epi16(raw, 4), m4),
                                      _mm256_and_si256(_mm256_srli_epi16(raw, 8), m4),
                                      _mm256_srli_epi16(raw, 12)};
#pragma GCC unroll 4
                for (int k = 0; k < 4; k++)
#pragma GCC unroll 4
                    for (int t = 0; t < T; t++)
                        isum[t][k & 1] = _mm256_add_epi32(
                            isum[t][k & 1],
                            _mm256_madd_epi16(w[k], kpair(xb[(size_t)t * nb + b].q, 4 * L + k)));
            }
        } else { /* Q8_0: 8 loads of 16 words, 2 bytes (column pairs) each */
#pragma GCC unroll 8
            for (int L = 0; L < 8; L++) {
                const __m256i raw = _mm256_loadu_si256((const __m256i *)(pk + 16 + 32 * L));
                const __m256i w[2] = {_mm256_srai_epi16(_mm256_slli_epi16(raw, 8), 8),
                                      _mm256_srai_epi16(raw, 8)};
#pragma GCC unroll 2
                for (int k = 0; k < 2; k++)
#pragma GCC unroll 4
                    for (int t = 0; t < T; t++)
                        isum[t][k] = _mm256_add_epi32(
                            isum[t][k],
                            _mm256_madd_epi16(w[k], kpair(xb[(size_t)t * nb + b].q, 2 * L + k)));
            }
        }
        const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)pk));
#pragma GCC unroll 4
        for (int t = 0; t < T; t++) {
            const kv_q_xblk_t *xt = xb + (size_t)t * nb + b;
            const __m256i isum_t = _mm256_add_epi32(isum[t][0], isum[t][1]);
            acc[t] = _mm256_fmadd_ps(_mm256_mul_ps(dw, _mm256_set1_ps(xt->d)),
                                     _mm256_cvtepi32_ps(isum_t), acc[t]);
            if (type == 3)
                acc[t] = _mm256_fmadd_ps(
                    _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(pk + 16))),
                    _mm256_set1_ps(xt->s), acc[t]);
        }
    }
#pragma GCC unroll 4
    for (int t = 0; t < T; t++) {
        float tmp[8];
        _mm256_storeu_ps(tmp, acc[t]);
        for (uint32_t i = 0; i < 8 && i < nr; i++)
            y[t * ldy + i] = tmp[i];
    }
}

/* Packs [p0, p1) one at a time (its weights stay in L1 across the activation
 * rows), activation rows 4, then 2, then 1 at a time. */
KINLINE void packed_int_typed(uint32_t type, const uint8_t *packed, size_t stride,
                              uint32_t cols, uint32_t rows, uint32_t p0, uint32_t p1,
                              const kv_q_xblk_t *xq, uint32_t n, float *y, size_t ldy)
{
    const uint32_t nb = cols / 32;
    for (uint32_t p = p0; p < p1; p++) {
        const uint8_t *pk = packed + p * stride;
        const uint32_t nr = rows - 8 * p;
        uint32_t t = 0;
        for (; t + 4 <= n; t += 4)
            kint(type, pk, nb, xq + (size_t)t * nb, 4, y + t * ldy + 8 * p, ldy, nr);
        if (t + 2 <= n) {
            kint(type, pk, nb, xq + (size_t)t * nb, 2, y + t * ldy + 8 * p, ldy, nr);
            t += 2;
        }
        if (t < n)
            kint(type, pk, nb, xq + (size_t)t * nb, 1, y + t * ldy + 8 * p, ldy, nr);
    }
}

AVX2 void kv_q_packed_int_avx2(uint32_t type, const uint8_t *packed, size_t stride,
                               uint32_t cols, uint32_t rows, uint32_t p0, uint32_t p1,
                               const kv_q_xblk_t *xq, uint32_t n, float *y, size_t ldy)
{
    if (type == 3)
        packed_int_typed(3, packed, stride, cols, rows, p0, p1, xq, n, y, ldy);
    else
        packed_int_typed(8, packed, stride, cols, rows, p0, p1, xq, n, y, ldy);
}

#else /* not x86-64 GCC/Clang: no SIMD path */

int kv_q_have_avx2(void) { return 0; }
void kv_q_set_simd(int on) { (void)on; }
void kv_q_deq_q4_1_avx2(const uint8_t *b, float *y, size_t nb) { (void)b, (void)y, (void)nb; }
void kv_q_deq_q8_0_avx2(const uint8_t *b, float *y, size_t nb) { (void)b, (void)y, (void)nb; }
float kv_q_dot_avx2(const float *a, const float *b, size_t n)
{
    (void)a, (void)b, (void)n;
    return 0;
}
void kv_q_packed_avx2(uint32_t type, const uint8_t *packed, size_t stride, uint32_t cols,
                      uint32_t rows, uint32_t p0, uint32_t p1, const float *x, uint32_t n,
                      float *y, size_t ldy)
{
    (void)type, (void)packed, (void)stride, (void)cols, (void)rows, (void)p0, (void)p1;
    (void)x, (void)n, (void)y, (void)ldy;
}
void kv_q_quant_x_avx2(const float *x, kv_q_xblk_t *xq, size_t n) { (void)x, (void)xq, (void)n; }
void kv_q_packed_int_avx2(uint32_t type, const uint8_t *packed, size_t stride, uint32_t cols,
                          uint32_t rows, uint32_t p0, uint32_t p1, const kv_q_xblk_t *xq,
                          uint32_t n, float *y, size_t ldy)
{
    (void)type, (void)packed, (void)stride, (void)cols, (void)rows, (void)p0, (void)p1;
    (void)xq, (void)n, (void)y, (void)ldy;
}

#endif
