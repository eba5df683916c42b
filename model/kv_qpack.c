/* SPDX-License-Identifier: MIT */
/*
 * kv_qpack.c — packing weight matrices into packs of 8 rows and the matmul
 * over them (layout and arithmetic in kv_quant.h): Q4_1 / Q8_0 weights take
 * integer dot products against activations quantized once per call
 * (kv_q_xblk_t), F16 / F32 weights FP32 FMAs.
 *
 * The work is split into units of KV_Q_GROUP packs (32 rows) run on the
 * model's workers (kv_workers_run, kvpage.h); the split depends on
 * the matrices only, and each output is computed entirely within one unit in
 * the order fixed by kv_quant.h, so the thread count never changes a result.
 * The scalar path (no AVX2) is the same arithmetic written plainly; it is
 * also the readable definition of the packed layouts. The quantized copy of
 * x is owned by the call (on its stack when small, else malloc'd).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kv_gguf.h"
#include "kv_quant.h"
#include "kv_quant_simd.h"

#define KV_Q_GROUP 4 /* packs per work unit */

size_t kv_q_pack_block_bytes(uint32_t type)
{
    switch (type) {
    case KV_GGML_Q4_1: return 160;
    case KV_GGML_Q8_0: return 272;
    case KV_GGML_F16: return 512;
    case KV_GGML_F32: return 1024;
    default: return 0;
    }
}

/* Where the code of row i (0..7), column c (0..31) lies in the codes of a
 * Q4_1 / Q8_0 pack block (the layout in kv_quant.h): its byte, and for Q4_1
 * the shift of its nibble in that byte. */
static size_t code_pos(uint32_t type, int i, int c, int *shift)
{
    const int cp = c / 2, e = 2 * i + (c & 1);
    if (type == KV_GGML_Q4_1) { /* nibble cp % 4 of word 16 * (cp / 4) + e */
        *shift = 4 * (cp & 1);
        return 2 * (size_t)(16 * (cp / 4) + e) + (size_t)((cp & 3) >> 1);
    }
    *shift = 0; /* Q8_0: byte cp % 2 of word 16 * (cp / 2) + e */
    return 2 * (size_t)(16 * (cp / 2) + e) + (size_t)(cp & 1);
}

/* Code of row i, column c of a Q4_1 (0..15) / Q8_0 (-128..127) pack block
 * (blk: the block, the codes after its 16 / 32 bytes of scales). */
static int code_at(uint32_t type, const uint8_t *blk, int i, int c)
{
    int sh;
    const size_t at = code_pos(type, i, c, &sh);
    if (type == KV_GGML_Q4_1)
        return (blk[32 + at] >> sh) & 15;
    return (int8_t)blk[16 + at];
}

/* Copy row i (0..7) of a pack from one file-layout block of 32 values. */
static void pack_row(uint32_t type, const uint8_t *src, uint8_t *dst, int i)
{
    int sh;
    switch (type) {
    case KV_GGML_Q4_1:
        memcpy(dst + 2 * i, src, 2);          /* d */
        memcpy(dst + 16 + 2 * i, src + 2, 2); /* m */
        for (int c = 0; c < 32; c++) {        /* file: c < 16 low nibbles, then high */
            const int q = (src[4 + c % 16] >> (4 * (c / 16))) & 15;
            const size_t at = code_pos(type, i, c, &sh);
            dst[32 + at] = (uint8_t)(dst[32 + at] | q << sh);
        }
        break;
    case KV_GGML_Q8_0:
        memcpy(dst + 2 * i, src, 2);
        for (int c = 0; c < 32; c++)
            dst[16 + code_pos(type, i, c, &sh)] = src[2 + c];
        break;
    case KV_GGML_F16:
        for (int k = 0; k < 32; k++)
            memcpy(dst + 16 * k + 2 * i, src + 2 * k, 2);
        break;
    default: /* F32 */
        for (int k = 0; k < 32; k++)
            memcpy(dst + 32 * k + 4 * i, src + 4 * k, 4);
        break;
    }
}

int kv_q_pack(kv_q_mat_t *m)
{
    if (!m || !m->data)
        return KV_EINVAL;
    if (m->packed)
        return 0;
    const size_t bb = kv_q_pack_block_bytes(m->type);
    const uint32_t nb = m->cols / 32, npk = (m->rows + 7) / 8;
    const size_t src_bb = kv_q_row_bytes(m->type, 32);
    if (!bb || !src_bb || m->cols % 32)
        return KV_EINVAL;
    uint8_t *pk = calloc((size_t)npk * nb, bb);
    if (!pk)
        return KV_ENOMEM;
    const uint8_t *data = m->data;
    for (uint32_t r = 0; r < m->rows; r++)
        for (uint32_t b = 0; b < nb; b++)
            pack_row(m->type, data + (size_t)r * m->row_bytes + (size_t)b * src_bb,
                     pk + ((size_t)(r / 8) * nb + b) * bb, (int)(r % 8));
    m->packed = pk;
    m->pack_stride = (size_t)nb * bb;
    return 0;
}

void kv_q_mat_release(kv_q_mat_t *m)
{
    if (!m)
        return;
    free(m->packed);
    m->packed = NULL;
    m->pack_stride = 0;
}

static int is_int_type(uint32_t type)
{
    return type == KV_GGML_Q4_1 || type == KV_GGML_Q8_0;
}

/* F16 / F32: weight of row i (0..7) at column k of a pack block. */
static float unpack1(uint32_t type, const uint8_t *blk, int k, int i)
{
    if (type == KV_GGML_F16) {
        uint16_t h;
        memcpy(&h, blk + 16 * k + 2 * i, 2);
        return kv_q_half_to_float(h);
    }
    float f;
    memcpy(&f, blk + 32 * k + 4 * i, 4);
    return f;
}

static void packed_fp_scalar(const kv_q_mat_t *w, uint32_t p0, uint32_t p1, const float *x,
                             uint32_t n, float *y, size_t ldy)
{
    const size_t bb = kv_q_pack_block_bytes(w->type);
    for (uint32_t p = p0; p < p1; p++)
        for (int i = 0; i < 8 && 8 * p + (uint32_t)i < w->rows; i++)
            for (uint32_t t = 0; t < n; t++) {
                const float *xt = x + (size_t)t * w->cols;
                float acc = 0;
                for (uint32_t k = 0; k < w->cols; k++)
                    acc += xt[k] * unpack1(w->type, w->packed + p * w->pack_stride +
                                                        (k / 32) * bb, (int)(k % 32), i);
                y[(size_t)t * ldy + 8 * p + (uint32_t)i] = acc;
            }
}

/* The block sum s of kv_q_xblk_t: 8 lanes, then the fixed tree. */
static float block_sum(const float *x)
{
    float l[8] = {0};
    for (int k = 0; k < 32; k += 8)
        for (int j = 0; j < 8; j++)
            l[j] += x[k + j];
    return ((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7]));
}

/* Scalar twin of kv_q_quant_x_avx2 (the definition in kv_quant_simd.h). */
static void quant_x_scalar(const float *x, kv_q_xblk_t *xq, size_t n)
{
    for (size_t b = 0; b < n / 32; b++, x += 32) {
        float amax = 0;
        for (int j = 0; j < 32; j++)
            amax = fabsf(x[j]) > amax ? fabsf(x[j]) : amax;
        const float d = amax / 32767.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        xq[b].d = d;
        xq[b].s = block_sum(x);
        for (int j = 0; j < 32; j++) {
            float v = nearbyintf(x[j] * id); /* NaN input: code 0 */
            xq[b].q[j] = (int16_t)(v > 32767.0f ? 32767 : v < -32767.0f ? -32767 : v == v ? v : 0);
        }
    }
}

/* Scalar twin of kv_q_packed_int_avx2: the integer contract of kv_quant.h. */
static void packed_int_scalar(const kv_q_mat_t *w, uint32_t p0, uint32_t p1,
                              const kv_q_xblk_t *xq, uint32_t n, float *y, size_t ldy)
{
    const size_t bb = kv_q_pack_block_bytes(w->type);
    const uint32_t nb = w->cols / 32;
    const int q41 = w->type == KV_GGML_Q4_1;
    for (uint32_t p = p0; p < p1; p++)
        for (uint32_t i = 0; i < 8 && 8 * p + i < w->rows; i++)
            for (uint32_t t = 0; t < n; t++) {
                const kv_q_xblk_t *xt = xq + (size_t)t * nb;
                float acc = 0;
                for (uint32_t b = 0; b < nb; b++) {
                    const uint8_t *blk = w->packed + p * w->pack_stride + b * bb;
                    uint16_t h;
                    memcpy(&h, blk + 2 * i, 2);
                    const float dw = kv_q_half_to_float(h);
                    int32_t isum = 0;
                    for (int j = 0; j < 32; j++)
                        isum += code_at(w->type, blk, (int)i, j) * xt[b].q[j];
                    acc = fmaf(dw * xt[b].d, (float)isum, acc);
                    if (q41) {
                        memcpy(&h, blk + 16 + 2 * i, 2);
                        acc = fmaf(kv_q_half_to_float(h), xt[b].s, acc);
                    }
                }
                y[(size_t)t * ldy + 8 * p + i] = acc;
            }
}

#define KV_Q_MAX_MANY 8

typedef struct mm_job {
    const kv_q_mat_t *const *w;
    float *const *y;
    const size_t *ldy;
    uint32_t count;
    uint32_t first[KV_Q_MAX_MANY + 1]; /* first work unit of each matrix */
    const float *x;                    /* [n][cols] (F16 / F32 weights)  */
    const kv_q_xblk_t *xq;             /* [n][cols / 32] (Q4_1 / Q8_0)   */
    uint32_t n;
    int simd;
} mm_job_t;

static void mm_unit(void *arg, size_t u, uint32_t worker)
{
    (void)worker;
    const mm_job_t *j = arg;
    uint32_t i = 0;
    while (u >= j->first[i + 1])
        i++;
    const kv_q_mat_t *m = j->w[i];
    const uint32_t npk = (m->rows + 7) / 8;
    uint32_t p0 = ((uint32_t)u - j->first[i]) * KV_Q_GROUP;
    uint32_t p1 = p0 + KV_Q_GROUP < npk ? p0 + KV_Q_GROUP : npk;
    if (is_int_type(m->type)) {
        if (j->simd)
            kv_q_packed_int_avx2(m->type, m->packed, m->pack_stride, m->cols, m->rows, p0, p1,
                                 j->xq, j->n, j->y[i], j->ldy[i]);
        else
            packed_int_scalar(m, p0, p1, j->xq, j->n, j->y[i], j->ldy[i]);
    } else if (j->simd) {
        kv_q_packed_avx2(m->type, m->packed, m->pack_stride, m->cols, m->rows, p0, p1, j->x,
                         j->n, j->y[i], j->ldy[i]);
    } else {
        packed_fp_scalar(m, p0, p1, j->x, j->n, j->y[i], j->ldy[i]);
    }
}

/* Quantized copies of x up to this size live on the stack (decode steps). */
#define KV_Q_XQ_STACK 256

int kv_q_matmul_many(const kv_q_mat_t *const *w, float *const *y, const size_t *ldy,
                     uint32_t count, const float *x, uint32_t n,
                     kv_workers_t *workers, uint32_t n_threads)
{
    if (!w || !y || !ldy || !x || !count || count > KV_Q_MAX_MANY)
        return KV_EINVAL;
    mm_job_t j = {.w = w, .y = y, .ldy = ldy, .count = count, .x = x, .n = n,
                  .simd = kv_q_have_avx2()};
    int any_int = 0;
    for (uint32_t i = 0; i < count; i++) {
        if (!w[i] || !w[i]->packed || !y[i] || ldy[i] < w[i]->rows || w[i]->cols != w[0]->cols)
            return KV_EINVAL;
        uint32_t npk = (w[i]->rows + 7) / 8;
        j.first[i + 1] = j.first[i] + (npk + KV_Q_GROUP - 1) / KV_Q_GROUP;
        any_int |= is_int_type(w[i]->type);
    }
    if (!n)
        return 0;
    /* The activations quantized once, for every matrix and every unit. */
    const size_t nblk = (size_t)n * (w[0]->cols / 32);
    kv_q_xblk_t stack_xq[KV_Q_XQ_STACK], *xq = NULL;
    if (any_int) {
        xq = nblk <= KV_Q_XQ_STACK ? stack_xq : malloc(nblk * sizeof *xq);
        if (!xq)
            return KV_ENOMEM;
        if (j.simd)
            kv_q_quant_x_avx2(x, xq, nblk * 32);
        else
            quant_x_scalar(x, xq, nblk * 32);
        j.xq = xq;
    }
    kv_workers_run(workers, n_threads, j.first[count], mm_unit, &j);
    if (xq != stack_xq)
        free(xq);
    return 0;
}

int kv_q_matmul(const kv_q_mat_t *w, const float *x, uint32_t n, float *y, size_t ldy,
                kv_workers_t *workers, uint32_t n_threads)
{
    return kv_q_matmul_many(&w, &y, &ldy, 1, x, n, workers, n_threads);
}

size_t kv_q_mat_bytes(const kv_q_mat_t *m)
{
    return m ? (size_t)(m->rows + 7) / 8 * (m->cols / 32) * kv_q_pack_block_bytes(m->type) : 0;
}

/* Scalar twin of kv_q_dot_avx2: 8 lanes over k, the same reduction tree. */
static float dot_scalar(const float *a, const float *b, size_t n)
{
    float l[8] = {0};
    for (size_t k = 0; k < n; k += 8)
        for (int j = 0; j < 8; j++)
            l[j] += a[k + j] * b[k + j];
    return ((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7]));
}

float kv_q_dot_f32(const float *a, const float *b, size_t n)
{
    return kv_q_have_avx2() ? kv_q_dot_avx2(a, b, n) : dot_scalar(a, b, n);
}
