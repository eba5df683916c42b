/*
 * kv_test_attn.h — the dense attention reference the attention tests compare
 * against: one query row over FP32 keys/values, computed in double, with the
 * exact probabilities (for the statistics checks). Header-only, for tests.
 */
#ifndef KV_TEST_ATTN_H
#define KV_TEST_ATTN_H

#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "kv_test.h"

/* Dense attention of query q[d] over tokens [0, n) of k, v ([n][d] rows):
 * out[d] = sum_t p_t v_t with p = softmax(scale * q.k_t), and, when stats is
 * not NULL, stats[t] += p_t. Aborts if its scratch cannot be allocated
 * (test code only). */
static inline void kv_test_dense_row(const float *k, const float *v, uint32_t d,
                                    uint32_t n, const float *q, double scale,
                                    double *out, double *stats)
{
    double *p = malloc((n ? n : 1) * sizeof *p), mx = -INFINITY, sum = 0;
    if (!p)
        abort();
    for (uint32_t t = 0; t < n; t++) {
        double s = 0;
        for (uint32_t j = 0; j < d; j++)
            s += (double)q[j] * k[(size_t)t * d + j];
        p[t] = s * scale;
        mx = p[t] > mx ? p[t] : mx;
    }
    for (uint32_t t = 0; t < n; t++)
        sum += (p[t] = exp(p[t] - mx));
    for (uint32_t j = 0; j < d; j++)
        out[j] = 0;
    for (uint32_t t = 0; t < n; t++) {
        p[t] /= sum;
        for (uint32_t j = 0; j < d; j++)
            out[j] += p[t] * v[(size_t)t * d + j];
        if (stats)
            stats[t] += p[t];
    }
    free(p);
}

/* Norm-wise relative error of a row x[d] against ref[d]; +inf if x holds a
 * non-finite value. */
static inline double kv_test_rel_err(const float *x, const double *ref, uint32_t d)
{
    double num = 0, den = 0;
    for (uint32_t j = 0; j < d; j++) {
        if (!isfinite(x[j]))
            return INFINITY;
        num += (x[j] - ref[j]) * (x[j] - ref[j]);
        den += ref[j] * ref[j];
    }
    return sqrt(num) / (sqrt(den) + 1e-30);
}

/* Check an output row x[d] against ref[d]: max |x - ref| <= tol * max(|ref|,
 * 1e-3), all finite. Counts a pass or a failure (printing what and the
 * errors); *worst (if not NULL) keeps the largest relative error seen. */
static inline void kv_test_check_row(const float *x, const double *ref, uint32_t d,
                                     double tol, double *worst, const char *what,
                                     uint32_t head)
{
    double err = 0, mag = 1e-3;
    for (uint32_t j = 0; j < d; j++) {
        err = isfinite(x[j]) ? fmax(err, fabs(x[j] - ref[j])) : INFINITY;
        mag = fmax(mag, fabs(ref[j]));
    }
    if (worst)
        *worst = fmax(*worst, err / mag);
    if (!(err <= tol * mag)) {
        kv_test_fail_++;
        fprintf(stderr, "%s: q head %u: error %g vs |ref| %g\n", what, head, err, mag);
    } else {
        kv_test_pass_++;
    }
}

#endif /* KV_TEST_ATTN_H */
