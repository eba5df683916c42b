/* SPDX-License-Identifier: MIT */
/*
 * kv_quant.c — binary16 conversion and row dequantization of the ggml block
 * formats (layouts in kv_quant.h).
 *
 * Dequantization is exact up to one rounding per value: q * d is exact in
 * FP32 (a 4- or 8-bit integer times an 11-bit mantissa), and Q4_1 adds m
 * with one rounding, so the AVX2 and the scalar versions agree bit for bit.
 */
#include <string.h>

#include "kv_gguf.h"
#include "kv_quant.h"
#include "kv_quant_simd.h"

float kv_q_half_to_float(uint16_t h)
{
    uint32_t s = (uint32_t)(h >> 15) << 31, e = (h >> 10) & 31, m = h & 1023, u;
    if (e == 31) {
        u = s | 0x7f800000u | (m << 13); /* inf / nan */
    } else if (e) {
        u = s | ((e + 112) << 23) | (m << 13);
    } else if (m) { /* subnormal: normalize */
        int sh = 0;
        while (!(m & 1024)) {
            m <<= 1;
            sh++;
        }
        u = s | ((uint32_t)(113 - sh) << 23) | ((m & 1023) << 13);
    } else {
        u = s;
    }
    float f;
    memcpy(&f, &u, 4);
    return f;
}

uint16_t kv_q_float_to_half(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    uint16_t s = (uint16_t)((u >> 16) & 0x8000);
    uint32_t a = u & 0x7fffffffu;
    if (a >= 0x7f800000u) /* inf or nan (keep a quiet nan) */
        return (uint16_t)(s | 0x7c00 | (a > 0x7f800000u ? 0x200 | ((a >> 13) & 0x3ff) : 0));
    if (a >= 0x477ff000u) /* rounds to >= 65520: overflow */
        return (uint16_t)(s | 0x7c00);
    if (a < 0x38800000u) { /* below the smallest normal half: subnormal or 0 */
        if (a < 0x33000000u) /* < 2^-25: rounds to 0 */
            return s;
        uint32_t e = a >> 23, m = (a & 0x7fffffu) | 0x800000u;
        uint32_t shift = 126 - e; /* 14..24 */
        uint32_t q = m >> shift, rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
        if (rem > half || (rem == half && (q & 1)))
            q++;
        return (uint16_t)(s | q);
    }
    uint32_t r = a - 0x38000000u; /* rebias exponent 127 -> 15 */
    uint32_t q = r >> 13, rem = r & 0x1fff;
    if (rem > 0x1000 || (rem == 0x1000 && (q & 1)))
        q++;
    return (uint16_t)(s | q);
}

int kv_q_supported(uint32_t type)
{
    return type == KV_GGML_F32 || type == KV_GGML_F16 || type == KV_GGML_Q8_0 ||
           type == KV_GGML_Q4_1;
}

size_t kv_q_row_bytes(uint32_t type, size_t n)
{
    uint32_t blk = kv_gguf_ttype_block(type);
    if (!kv_q_supported(type) || !blk || n % blk)
        return 0;
    return n / blk * kv_gguf_ttype_block_bytes(type);
}

static float rd_half(const uint8_t *p)
{
    uint16_t h;
    memcpy(&h, p, 2);
    return kv_q_half_to_float(h);
}

static void deq_q4_1_scalar(const uint8_t *b, float *y, size_t nb)
{
    for (size_t i = 0; i < nb; i++, b += 20, y += 32) {
        float d = rd_half(b), m = rd_half(b + 2);
        for (int j = 0; j < 16; j++) {
            y[j] = (float)(b[4 + j] & 15) * d + m;
            y[j + 16] = (float)(b[4 + j] >> 4) * d + m;
        }
    }
}

static void deq_q8_0_scalar(const uint8_t *b, float *y, size_t nb)
{
    for (size_t i = 0; i < nb; i++, b += 34, y += 32) {
        float d = rd_half(b);
        for (int j = 0; j < 32; j++)
            y[j] = (float)(int8_t)b[2 + j] * d;
    }
}

int kv_q_dequant_row(uint32_t type, const void *src, float *dst, size_t n)
{
    if (!src || !dst || !kv_q_row_bytes(type, n))
        return KV_EINVAL;
    const uint8_t *b = src;
    int simd = kv_q_have_avx2();
    switch (type) {
    case KV_GGML_F32:
        memcpy(dst, src, n * 4);
        return 0;
    case KV_GGML_F16:
        for (size_t i = 0; i < n; i++)
            dst[i] = rd_half(b + 2 * i);
        return 0;
    case KV_GGML_Q4_1:
        if (simd)
            kv_q_deq_q4_1_avx2(b, dst, n / 32);
        else
            deq_q4_1_scalar(b, dst, n / 32);
        return 0;
    case KV_GGML_Q8_0:
        if (simd)
            kv_q_deq_q8_0_avx2(b, dst, n / 32);
        else
            deq_q8_0_scalar(b, dst, n / 32);
        return 0;
    default:
        return KV_EINVAL;
    }
}

int kv_q_mat_init(kv_q_mat_t *m, uint32_t type, uint32_t rows, uint32_t cols, const void *data,
                  uint64_t nbytes)
{
    if (!m || !data || !rows || !cols)
        return KV_EINVAL;
    size_t rb = kv_q_row_bytes(type, cols);
    if (!rb || cols % 32)
        return KV_ENOTSUP;
    if ((uint64_t)rows > nbytes / rb)
        return KV_ERANGE;
    *m = (kv_q_mat_t){.type = type, .rows = rows, .cols = cols, .row_bytes = rb, .data = data};
    /* packed stays NULL until kv_q_pack */
    return 0;
}
