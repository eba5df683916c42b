/* SPDX-License-Identifier: MIT */
/*
 * kv_quant.h — the weight formats of the model file and math over them.
 *
 * Block formats exactly as ggml defines them (little-endian, packed):
 *   F32   1 value,  4 bytes.
 *   F16   1 value,  2 bytes (IEEE binary16).
 *   Q8_0  32 values, 34 bytes: { f16 d; int8 qs[32] }          x_j = d * qs[j]
 *   Q4_1  32 values, 20 bytes: { f16 d; f16 m; uint8 qs[16] }  x_j = d * q_j + m,
 *         q_j = qs[j] & 15 for j < 16, qs[j-16] >> 4 for j >= 16.
 * A matrix of `rows` x `cols` is stored row-major: row r is row_bytes at
 * data + r * row_bytes (ggml's ne[0] = cols, ne[1] = rows).
 *
 * For kv_q_matmul a matrix is repacked once (kv_q_pack), still quantized
 * (same bytes per weight), in packs of 8 rows. Packed layout: ceil(rows/8)
 * packs (rows past `rows` are zero), each cols/32 pack blocks of:
 *   Q4_1 (160 B): f16 d[8], f16 m[8], then 64 little-endian 16-bit words
 *                 of codes: nibble k (bits 4k..4k+3) of word 16 L + e holds
 *                 row e / 2, column 2 (4 L + k) + e % 2 (L < 4, e < 16, k < 4);
 *   Q8_0 (272 B): f16 d[8], then 128 16-bit words of int8 codes: byte k of
 *                 word 16 L + e holds row e / 2, column 2 (2 L + k) + e % 2
 *                 (L < 8, k < 2);
 *                 so one 16-bit lane per (row, column) of a column pair
 *                 comes out of a word with shifts, the 8 rows side by side;
 *   F16  (512 B): for k = 0..31 f16 w[8];   F32 (1 KiB): for k f32 w[8]
 *                 (8 rows interleaved: one SIMD register per column).
 *
 * Arithmetic (the contract the tests check).
 * Q4_1 and Q8_0 weights: integer dot products. Each activation row is
 * quantized once per call, per block of 32 columns, to int16 codes qx with a
 * scale dx (kv_q_xblk_t in kv_quant_simd.h: dx = max|x| / 32767,
 * qx = round-to-even(x / dx)), keeping sx, the block's exact FP32 sum. Then,
 * over blocks b in increasing order, starting from 0:
 *   a = dw_b * dx_b;  acc = fma(a, (float)isum_b, acc)
 *   Q4_1 only:        acc = fma(m_b, sx_b, acc)
 * where isum_b = sum_j q_j * qx_j is an exact int32. The activation rounding
 * is the only approximation: |y - exact| <= sum_b |dw_b| * dx_b / 2 *
 * sum_j |q_j|, at most 1/65534 of sum |w x| (~1e-5 seen). llama.cpp rounds
 * activations to int8 instead (1/254): on SmolLM2-135M, whose activations
 * have large outliers within a block, that moved the perplexity of
 * GPL-3 (1000 + 128 tokens) from 30.7671 to 31.5826, int16 to 30.7760.
 * F16 and F32 weights: y[t][r] = sum over k in increasing k of
 *   fma(x[t][k], w[r][k], acc) from 0, in FP32.
 * Neither depends on the batch size n, on which other rows are computed, or
 * on the thread count, so results are bit-identical across all of those: a
 * token's logits are the same whether it is prefilled in a chunk or decoded
 * alone. AVX2 (+FMA, F16C) is used when the CPU has it (checked at run time);
 * the scalar fallback computes the same integer sums and the same fmaf
 * sequence, so for Q4_1 / Q8_0 its results are the same bits (F16 / F32:
 * separate multiply and add, within rounding).
 */
#ifndef KV_QUANT_H
#define KV_QUANT_H

#include <stddef.h>
#include <stdint.h>

#include "kvpage/kvpage.h"

/* A weight matrix: the file's blocks (borrowed) and its packed copy. */
typedef struct kv_q_mat {
    uint32_t type;       /* kv_gguf_ttype_t: F32, F16, Q8_0 or Q4_1        */
    uint32_t rows;       /* output features                                */
    uint32_t cols;       /* input features, a multiple of 32               */
    size_t row_bytes;    /* bytes per row in the file layout               */
    const void *data;    /* [rows][row_bytes], the file layout (borrowed)  */
    uint8_t *packed;     /* [ceil(rows/8)][pack_stride] (kv_q_pack, owned) */
    size_t pack_stride;  /* bytes per pack of 8 rows                       */
} kv_q_mat_t;

/* Can this type be dequantized/multiplied? */
int kv_q_supported(uint32_t type);

/* Bytes of a row of n values of this type (0: unsupported type or n not a
 * multiple of the block). */
size_t kv_q_row_bytes(uint32_t type, size_t n);

/* Decode n values (a multiple of the block) of a file-layout row to FP32. */
int kv_q_dequant_row(uint32_t type, const void *src, float *dst, size_t n);

/* Bind a matrix (not yet packed): checks the type, that cols is a multiple
 * of 32 and that rows x cols fit in nbytes. */
int kv_q_mat_init(kv_q_mat_t *m, uint32_t type, uint32_t rows, uint32_t cols,
                  const void *data, uint64_t nbytes);

/* Build m->packed from m->data (KV_ENOMEM). Idempotent. */
int kv_q_pack(kv_q_mat_t *m);

/* Free the packed copy (the binding stays usable for kv_q_pack again). */
void kv_q_mat_release(kv_q_mat_t *m);

/* y[t][r] = sum_k W[r][k] * x[t][k] for t < n, r < rows (see the top).
 *   x: [n][cols]; y: [n][ldy] (ldy >= rows). The matrix must be packed.
 * Work units of 32 rows run on the workers with at most n_threads threads
 * (workers NULL: the caller alone; n_threads 0: all of them). Returns 0, or
 * KV_EINVAL (unpacked matrix, bad arguments). */
int kv_q_matmul(const kv_q_mat_t *w, const float *x, uint32_t n, float *y, size_t ldy,
                kv_workers_t *workers, uint32_t n_threads);

/* Several matrices of the same cols applied to the same x in one parallel
 * region (fewer thread wake-ups; x quantized once for all of them):
 * y[i] = x w[i]^T with ldy[i], i < count. Same results as count separate
 * kv_q_matmul calls. count <= 8. KV_ENOMEM when the quantized copy of a
 * large x cannot be allocated. */
int kv_q_matmul_many(const kv_q_mat_t *const *w, float *const *y, const size_t *ldy,
                     uint32_t count, const float *x, uint32_t n,
                     kv_workers_t *workers, uint32_t n_threads);

/* binary16 <-> binary32 (round to nearest even; overflow -> inf). */
float kv_q_half_to_float(uint16_t h);
uint16_t kv_q_float_to_half(float f);

/* A dot product of n (a multiple of 8) FP32 values in a fixed order: 8
 * lanes (k mod 8) summed with FMA in increasing k, then the lanes by a fixed
 * tree. Used by the dense attention path. */
float kv_q_dot_f32(const float *a, const float *b, size_t n);

/* Bytes of one pack block (8 rows x 32 columns) of a type; 0 if unsupported. */
size_t kv_q_pack_block_bytes(uint32_t type);

/* Bytes of weights one kv_q_matmul of a single activation row reads (the
 * packed matrix): what a decode step streams from memory per matrix. */
size_t kv_q_mat_bytes(const kv_q_mat_t *m);

#endif /* KV_QUANT_H */
