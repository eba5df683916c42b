/* SPDX-License-Identifier: MIT */
/*
 * kv_quant_simd.h — internal: the AVX2+FMA+F16C kernels behind kv_quant.h
 * and their run-time switch. On other CPUs (or compilers) kv_q_have_avx2()
 * returns 0 and the scalar versions in kv_qpack.c / kv_quant.c run; the AVX2
 * functions are then never called (they exist as stubs off x86-64).
 */
#ifndef KV_QUANT_SIMD_H
#define KV_QUANT_SIMD_H

#include <stddef.h>
#include <stdint.h>

/* One block of 32 activations quantized for the integer matmul
 * (kv_quant.h): x_j ~= d * q_j with d = max|x_j| / 32767 and
 * q_j = round-to-nearest-even(x_j * (1 / d)) (all 0 when the block is 0);
 * s = the exact block sum of x_j in the fixed order of kv_q_dot_f32's lanes
 * (lane j mod 8 in increasing j, then the same tree). */
typedef struct kv_q_xblk {
    float d;        /* scale                      */
    float s;        /* sum of the 32 FP32 values  */
    int16_t q[32];  /* codes, -32767..32767       */
} kv_q_xblk_t;

/* 1 when the CPU has AVX2, FMA and F16C (cached after the first call) and
 * the SIMD path was not switched off. */
int kv_q_have_avx2(void);

/* Tests: switch the SIMD path off (0) or back on (1, if the CPU has it).
 * Not thread-safe: call while no matmul runs. */
void kv_q_set_simd(int on);

/* nb blocks of Q4_1 (20 bytes) / Q8_0 (34 bytes) to 32 * nb floats. */
void kv_q_deq_q4_1_avx2(const uint8_t *b, float *y, size_t nb);
void kv_q_deq_q8_0_avx2(const uint8_t *b, float *y, size_t nb);

float kv_q_dot_avx2(const float *a, const float *b, size_t n);

/* n values (a multiple of 32) of x to n / 32 blocks (same bits as the
 * scalar kv_q_quant_x in kv_qpack.c). */
void kv_q_quant_x_avx2(const float *x, kv_q_xblk_t *xq, size_t n);

/* Integer packed matmul (Q4_1 / Q8_0 weights, see kv_quant.h) for the packs
 * [p0, p1) against n quantized activation rows of cols / 32 blocks each:
 * y[t * ldy + r]. Same bits as the scalar version in kv_qpack.c. */
void kv_q_packed_int_avx2(uint32_t type, const uint8_t *packed, size_t stride, uint32_t cols,
                          uint32_t rows, uint32_t p0, uint32_t p1, const kv_q_xblk_t *xq,
                          uint32_t n, float *y, size_t ldy);

/* FP32 packed matmul (F16 / F32 weights) for rows [8 * p0, 8 * p1) of a packed matrix (see kv_quant.h):
 * y[t * ldy + r] for t < n, r < rows. */
void kv_q_packed_avx2(uint32_t type, const uint8_t *packed, size_t stride, uint32_t cols,
                      uint32_t rows, uint32_t p0, uint32_t p1, const float *x, uint32_t n,
                      float *y, size_t ldy);

#endif /* KV_QUANT_SIMD_H */
