/* SPDX-License-Identifier: MIT */
/*
 * kv_cpu_score.c — KVzip's scoring on the CPU (kv_backend.h,
 * kv_zip_score_params_t): per query row and q head a softmax over the keys
 * the row sees, and a running maximum of the probability each chunk key
 * received.
 *
 * The work is units of (kv head, block of ZIP_ROWS rows) on the backend's
 * workers; each worker keeps its own maxima [n_kv_heads][n_chunk] in its
 * scratch, folded into the caller's scores once every unit is done. A
 * maximum does not depend on the order it is taken in, and every
 * probability is computed the same way whichever worker computes it, so
 * the scores do not depend on the thread count. The caller's scores change
 * only after the scratch was allocated (KV_ENOMEM leaves them as they were).
 *
 * Cost per row and q head: n dot products of head_dim (4 x 4 FP32 lanes), n
 * exponentials (expf), n_chunk compares, n = the keys the row sees.
 */
#include <math.h>

#include "alloc/kv_mem.h"
#include "kv_cpu.h"
#include "kv_cpu_score.h"
#include "kv_cpu_simd.h"

#define ZIP_ROWS 16u /* rows of one unit */

typedef struct zip_job {
    const kv_zip_score_params_t *p;
    float *scratch;   /* [workers][per]: logits [n_keys], then maxima */
    size_t per;       /* floats per worker                            */
    uint32_t n_blk;   /* row blocks per kv head                       */
} zip_job_t;

/* The dot product of the contract: four 4-lane accumulators over 16
 * elements at a time (native SSE width in every x86-64 build, so they stay
 * in registers), summed in a fixed tree; the tail in order. */
static float zip_dot(const float *a, const float *b, uint32_t n)
{
    kv_v4f s0 = {0}, s1 = {0}, s2 = {0}, s3 = {0}, x, y;
    uint32_t i = 0;
#define ZIP_ACC(acc, o)                                                       \
    memcpy(&x, a + i + (o), sizeof x);                                        \
    memcpy(&y, b + i + (o), sizeof y);                                        \
    acc += x * y
    for (; i + 16 <= n; i += 16) {
        ZIP_ACC(s0, 0);
        ZIP_ACC(s1, 4);
        ZIP_ACC(s2, 8);
        ZIP_ACC(s3, 12);
    }
#undef ZIP_ACC
    const kv_v4f t = (s0 + s1) + (s2 + s3);
    float s = (t[0] + t[1]) + (t[2] + t[3]);
    for (; i < n; i++)
        s += a[i] * b[i];
    return s;
}

static void zip_unit(void *arg, size_t u, uint32_t worker)
{
    const zip_job_t *j = arg;
    const kv_zip_score_params_t *p = j->p;
    const uint32_t D = p->head_dim, Hq = p->n_q_heads, G = Hq / p->n_kv_heads;
    const uint32_t h = (uint32_t)(u / j->n_blk), r0 = (uint32_t)(u % j->n_blk) * ZIP_ROWS;
    const uint32_t r1 = p->n_rows - r0 < ZIP_ROWS ? p->n_rows : r0 + ZIP_ROWS;
    float *logit = j->scratch + worker * j->per;
    float *mx = logit + p->n_keys + (size_t)h * p->n_chunk;
    const float *k = p->k + (size_t)h * p->n_keys * D;
    for (uint32_t r = r0; r < r1; r++) {
        const uint32_t n = p->n_vis0 + r;
        for (uint32_t g = h * G; g < h * G + G; g++) {
            const float *q = p->q + ((size_t)r * Hq + g) * D;
            float m = -INFINITY;
            for (uint32_t t = 0; t < n; t++) {
                logit[t] = p->scale * zip_dot(q, k + (size_t)t * D, D);
                m = logit[t] > m ? logit[t] : m;
            }
            double z = 0;
            for (uint32_t t = 0; t < n; t++) {
                logit[t] = expf(logit[t] - m);
                z += logit[t];
            }
            const float inv = (float)(1.0 / z);
            const float *e = logit + p->n_sink;
            for (uint32_t t = 0; t < p->n_chunk; t++) {
                const float pr = e[t] * inv;
                mx[t] = pr > mx[t] ? pr : mx[t];
            }
        }
    }
}

int kv_cpu_zip_score(void *ctx, const kv_zip_score_params_t *p)
{
    if (!p || !p->q || !p->k || !p->score || !p->head_dim || !p->n_kv_heads ||
        p->n_q_heads % p->n_kv_heads || !(p->scale > 0) ||
        p->n_vis0 < p->n_sink + p->n_chunk ||
        (p->n_rows && p->n_vis0 + p->n_rows - 1 > p->n_keys))
        return KV_EINVAL;
    if (!p->n_rows || !p->n_chunk)
        return 0;
    kv_workers_t *workers = ctx ? ((kv_cpu_t *)ctx)->workers : NULL;
    const uint32_t W = kv_workers_size(workers), H = p->n_kv_heads;
    zip_job_t j = {.p = p, .per = p->n_keys + (size_t)H * p->n_chunk,
                   .n_blk = (p->n_rows + ZIP_ROWS - 1) / ZIP_ROWS};
    if (!(j.scratch = kv_mem_calloc((size_t)W * j.per, sizeof(float))))
        return KV_ENOMEM;
    kv_cpu_run(workers, (size_t)H * j.n_blk, zip_unit, &j);
    for (uint32_t w = 0; w < W; w++)
        for (uint32_t h = 0; h < H; h++) {
            const float *mx = j.scratch + w * j.per + p->n_keys + (size_t)h * p->n_chunk;
            float *sc = p->score[h];
            for (uint32_t t = 0; t < p->n_chunk; t++)
                sc[t] = mx[t] > sc[t] ? mx[t] : sc[t];
        }
    kv_mem_free(j.scratch, (size_t)W * j.per * sizeof(float));
    return 0;
}
