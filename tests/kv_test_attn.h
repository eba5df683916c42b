/* SPDX-License-Identifier: MIT */
/*
 * kv_test_attn.h — the dense attention reference the attention tests compare
 * against: one query row over FP32 keys/values, computed in double, with the
 * exact probabilities (for the statistics checks); the row and statistics
 * checks against it, and the verdict (CHECKs) of one call. Header-only, for
 * tests; depends on nothing but kv_test.h (public API level). The
 * kernel-level fixture built on it is kv_test_kern.h.
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

/* ---- statistics and the verdict of one call ------------------------------ */

/* What every statistics entry a call must not write holds before the call. */
#define KV_TEST_SENTINEL 12345.0f

/* Worst errors of one attention call against the dense reference. */
typedef struct kv_test_attn_errs {
    double out;     /* worst norm-wise relative error of an output row     */
    double stats;   /* worst relative error of a token's statistic         */
    double control; /* worst error against a control reference that the    */
                    /* output must NOT match (0 when there is none)        */
    long bad_total; /* statistics rows whose total is off by > 1e-3 rel.   */
    long touched;   /* entries that must hold KV_TEST_SENTINEL and do not  */
} kv_test_attn_errs_t;

/* One statistics row st[stride] against the reference probabilities
 * rst[len] (summed like the call sums them): each entry within 1e-3
 * relative, their total == want within 1e-3 relative, entries past len
 * untouched. rst == NULL: the row asked for no statistics, every entry must
 * be untouched. */
static inline void kv_test_check_stats(const float *st, const double *rst,
                                       uint32_t len, uint32_t stride,
                                       double want, kv_test_attn_errs_t *e)
{
    uint32_t t = 0;
    if (rst) {
        double tot = 0;
        for (; t < len; t++) {
            e->stats = fmax(e->stats, fabs(st[t] - rst[t]) / (rst[t] + 1e-6));
            tot += st[t];
        }
        e->bad_total += fabs(tot - want) > 1e-3 * want;
    }
    for (; t < stride; t++)
        e->touched += st[t] != KV_TEST_SENTINEL;
}

/* The checks of one call (what, name: for the message): outputs and
 * statistics within 1e-3, totals right, nothing touched that must not be;
 * with `control`, also e->control >= 1e-2 (the output is far from the
 * control reference). */
static inline void kv_test_attn_report(const char *what, const char *name,
                                       const kv_test_attn_errs_t *e,
                                       int control)
{
    if (e->out > 1e-3 || e->stats > 1e-3 || e->bad_total || e->touched ||
        (control && !(e->control >= 1e-2)))
        fprintf(stderr,
                "%s %s: out err %.3g, stats err %.3g, control %.3g, bad "
                "totals %ld, touched %ld\n",
                what, name, e->out, e->stats, e->control, e->bad_total,
                e->touched);
    CHECK(e->out <= 1e-3);
    CHECK(e->stats <= 1e-3);
    if (control)
        CHECK(e->control >= 1e-2);
    CHECK_EQ(e->bad_total, 0);
    CHECK_EQ(e->touched, 0);
}

#endif /* KV_TEST_ATTN_H */
