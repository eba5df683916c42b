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

/* Packed matmul for rows [8 * p0, 8 * p1) of a packed matrix (see kv_quant.h):
 * y[t * ldy + r] for t < n, r < rows. */
void kv_q_packed_avx2(uint32_t type, const uint8_t *packed, size_t stride, uint32_t cols,
                      uint32_t rows, uint32_t p0, uint32_t p1, const float *x, uint32_t n,
                      float *y, size_t ldy);

#endif /* KV_QUANT_SIMD_H */
