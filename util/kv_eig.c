/* SPDX-License-Identifier: MIT */
/*
 * kv_eig.c — symmetric eigen-decomposition (kv_eig.h).
 *
 * 1. Householder tridiagonalization. For k = 0 .. n-3 the reflection
 *    H_k = I - 2 v v^T (unit v over rows k+1 .. n-1) maps column k below
 *    the diagonal to (alpha, 0, ..); the trailing block is updated as
 *    A22 -= 2 (v q^T + q v^T), q = p - (v^T p) v, p = A22 v. v is kept in
 *    column k below the diagonal (the zeros it makes), p in work[k+1 ..]
 *    (those entries of the off-diagonal are not known yet), a contiguous
 *    copy of v in work[n ..]. d = the diagonal goes to w, e[j] = T[j][j+1]
 *    to work[0 .. n).
 * 2. Q = H_0 H_1 .. H_{n-3}, built in place from the last reflection to
 *    the first: before step k, the block a[k+1..][k+1..] holds
 *    H_{k+1} .. H_{n-3} (identity on its first row and column); step k
 *    applies H_k from the left and makes row and column k those of I. The
 *    reflections still to apply sit in columns < k + 1, outside the block.
 * 3. Implicit QL with Wilkinson shifts on (d, e), each plane rotation
 *    applied to columns i, i+1 of Q; an off-diagonal entry counts as zero
 *    once |e[m]| <= DBL_EPSILON max_i (|d[i]| + |e[i]|): relative to the
 *    matrix, not to its neighbours, or a cluster of eigenvalues at the
 *    rounding level (a rank-deficient Gram matrix has many) never
 *    converges. Eigenvalues are exact to about DBL_EPSILON ||A||.
 *    Q is transposed first, so the rotations run along rows.
 * 4. The rows of Q^T are then the eigenvectors: sorted by eigenvalue.
 */
#include "util/kv_eig.h"

#include <float.h>
#include <math.h>

#define KV_EIG_MAX_ITER 60

/* Step 1: reduce the symmetric a (both triangles) to (d, e); vt: n
 * doubles (the reflection's vector, contiguous). */
static void eig_tridiag(uint32_t n, double *a, double *d, double *e, double *vt)
{
    for (uint32_t k = 0; k + 2 < n; k++) {
        uint32_t m = n - k - 1; /* rows k+1 .. n-1 */
        double *col = a + (size_t)(k + 1) * n + k; /* x_i at col[i * n] */
        double nx = 0.0, tail = 0.0;
        for (uint32_t i = 0; i < m; i++) {
            double x = col[(size_t)i * n];
            vt[i] = x;
            nx += x * x;
            if (i)
                tail += x * x;
        }
        if (tail == 0.0) { /* already tridiagonal here: H_k = I (v = 0) */
            e[k] = col[0];
            col[0] = 0.0;
            continue;
        }
        nx = sqrt(nx);
        double alpha = vt[0] >= 0.0 ? -nx : nx;
        double un = sqrt(2.0 * nx * nx + 2.0 * fabs(vt[0]) * nx); /* ||x - alpha e1|| */
        vt[0] -= alpha;
        for (uint32_t i = 0; i < m; i++) {
            vt[i] /= un;
            col[(size_t)i * n] = vt[i];
        }
        e[k] = alpha;
        /* p = A22 v, K = v^T p, q = p - K v (q in p) */
        double *p = e + k + 1, kk = 0.0;
        for (uint32_t i = 0; i < m; i++) {
            const double *row = a + (size_t)(k + 1 + i) * n + (k + 1);
            double s = 0.0;
            for (uint32_t j = 0; j < m; j++)
                s += row[j] * vt[j];
            p[i] = s;
            kk += s * vt[i];
        }
        for (uint32_t i = 0; i < m; i++)
            p[i] -= kk * vt[i];
        for (uint32_t i = 0; i < m; i++) {
            double *row = a + (size_t)(k + 1 + i) * n + (k + 1);
            double vi = 2.0 * vt[i], qi = 2.0 * p[i];
            for (uint32_t j = 0; j < m; j++)
                row[j] -= vi * p[j] + qi * vt[j];
        }
    }
    for (uint32_t j = 0; j < n; j++)
        d[j] = a[(size_t)j * n + j];
    if (n >= 2)
        e[n - 2] = a[(size_t)(n - 1) * n + (n - 2)];
    e[n - 1] = 0.0;
}

/* Step 2: a = Q from the reflections kept in a's columns; vt: n doubles.
 * The sums s = v^T B of step k go to row k right of the diagonal (free
 * until that row is made I's), so every inner loop runs along rows. */
static void eig_accumulate(uint32_t n, double *a, double *vt)
{
    for (uint32_t i = n >= 2 ? n - 2 : 0; i < n; i++)
        for (uint32_t j = n >= 2 ? n - 2 : 0; j < n; j++)
            a[(size_t)i * n + j] = i == j;
    for (uint32_t k = n >= 2 ? n - 2 : 0; k-- > 0;) {
        uint32_t m = n - k - 1;
        double *s = a + (size_t)k * n + k + 1;
        for (uint32_t i = 0; i < m; i++) {
            vt[i] = a[(size_t)(k + 1 + i) * n + k];
            s[i] = 0.0;
        }
        for (uint32_t i = 0; i < m; i++) { /* s = v^T B */
            const double *bi = a + (size_t)(k + 1 + i) * n + (k + 1);
            double vi = vt[i];
            for (uint32_t j = 0; vi != 0.0 && j < m; j++)
                s[j] += vi * bi[j];
        }
        for (uint32_t i = 0; i < m; i++) { /* B -= 2 v s */
            double *bi = a + (size_t)(k + 1 + i) * n + (k + 1);
            double f = 2.0 * vt[i];
            for (uint32_t j = 0; f != 0.0 && j < m; j++)
                bi[j] -= f * s[j];
        }
        for (uint32_t j = k; j < n; j++)
            a[(size_t)k * n + j] = a[(size_t)j * n + k] = j == k;
    }
}

/* Step 3: eigenvalues of (d, e) into d; rotations applied to z's rows
 * (z = Q^T, so its rows end as the eigenvectors) when z is not NULL. 0, or
 * -2 without convergence. */
static int eig_ql(uint32_t n, double *d, double *e, double *z)
{
    double norm = 0.0; /* max |d_i| + |e_i|: the scale of "negligible" */
    for (uint32_t i = 0; i < n; i++)
        norm = fmax(norm, fabs(d[i]) + fabs(e[i]));
    for (uint32_t l = 0; l < n; l++) {
        for (int iter = 0;; iter++) {
            uint32_t m = l;
            for (; m + 1 < n; m++)
                if (fabs(e[m]) <= DBL_EPSILON * norm)
                    break;
            if (m == l)
                break;
            if (iter == KV_EIG_MAX_ITER)
                return -2;
            double g = (d[l + 1] - d[l]) / (2.0 * e[l]);
            double r = hypot(g, 1.0);
            g = d[m] - d[l] + e[l] / (g + copysign(r, g));
            double s = 1.0, c = 1.0, p = 0.0;
            int split = 0;
            for (uint32_t i = m; i-- > l;) {
                double f = s * e[i], b = c * e[i];
                r = hypot(f, g);
                e[i + 1] = r;
                if (r == 0.0) { /* e[i] underflowed: the matrix splits */
                    d[i + 1] -= p;
                    e[m] = 0.0;
                    split = 1;
                    break;
                }
                s = f / r;
                c = g / r;
                g = d[i + 1] - p;
                r = (d[i] - g) * s + 2.0 * c * b;
                p = s * r;
                d[i + 1] = g + p;
                g = c * r - b;
                if (z) {
                    double *zi = z + (size_t)i * n, *zj = zi + n;
                    for (uint32_t k = 0; k < n; k++) {
                        double t = zj[k];
                        zj[k] = s * zi[k] + c * t;
                        zi[k] = c * zi[k] - s * t;
                    }
                }
            }
            if (split)
                continue;
            d[l] -= p;
            e[l] = g;
            e[m] = 0.0;
        }
    }
    return 0;
}

/* The whole decomposition, or the eigenvalues only (vectors 0: a is left
 * holding the reduction's scratch). */
static int eig_run(uint32_t n, double *a, double *w, double *work, int vectors)
{
    if (!n)
        return -1;
    for (uint32_t i = 0; i < n; i++)
        for (uint32_t j = 0; j <= i; j++)
            if (!isfinite(a[(size_t)i * n + j]))
                return -1;
    for (uint32_t i = 0; i < n; i++)
        for (uint32_t j = 0; j < i; j++)
            a[(size_t)j * n + i] = a[(size_t)i * n + j];
    eig_tridiag(n, a, w, work, work + n);
    if (vectors) {
        eig_accumulate(n, a, work + n);
        for (uint32_t i = 0; i < n; i++) /* Q -> Q^T: QL rotates rows */
            for (uint32_t j = 0; j < i; j++) {
                double t = a[(size_t)i * n + j];
                a[(size_t)i * n + j] = a[(size_t)j * n + i];
                a[(size_t)j * n + i] = t;
            }
    }
    int rc = eig_ql(n, w, work, vectors ? a : NULL);
    if (rc)
        return rc;
    for (uint32_t i = 0; i < n; i++)
        if (!isfinite(w[i]))
            return -2;
    for (uint32_t i = 0; i + 1 < n; i++) { /* selection sort, descending */
        uint32_t best = i;
        for (uint32_t j = i + 1; j < n; j++)
            if (w[j] > w[best])
                best = j;
        if (best == i)
            continue;
        double t = w[i];
        w[i] = w[best];
        w[best] = t;
        double *ri = a + (size_t)i * n, *rb = a + (size_t)best * n;
        for (uint32_t j = 0; vectors && j < n; j++) {
            t = ri[j];
            ri[j] = rb[j];
            rb[j] = t;
        }
    }
    return 0;
}

int kv_eig_sym(uint32_t n, double *a, double *w, double *work)
{
    return eig_run(n, a, w, work, 1);
}

int kv_eig_values(uint32_t n, double *a, double *w, double *work)
{
    return eig_run(n, a, w, work, 0);
}

void kv_eig_gram(const float *x, uint32_t t, uint32_t f, size_t stride, double *g)
{
    for (size_t i = 0; i < (size_t)f * f; i++)
        g[i] = 0.0;
    for (uint32_t r = 0; r < t; r++) {
        const float *row = x + (size_t)r * stride;
        for (uint32_t i = 0; i < f; i++) {
            double xi = row[i];
            if (xi == 0.0)
                continue;
            double *gi = g + (size_t)i * f;
            for (uint32_t j = 0; j <= i; j++)
                gi[j] += xi * (double)row[j];
        }
    }
    for (uint32_t i = 0; i < f; i++)
        for (uint32_t j = 0; j < i; j++)
            g[(size_t)j * f + i] = g[(size_t)i * f + j];
}

uint32_t kv_eig_rank(const double *w, uint32_t n, double frac)
{
    double total = 0.0;
    for (uint32_t i = 0; i < n; i++)
        total += w[i] > 0.0 ? w[i] : 0.0;
    if (total <= 0.0)
        return 0;
    double kept = 0.0, goal = frac * total;
    for (uint32_t r = 0; r < n; r++) {
        kept += w[r] > 0.0 ? w[r] : 0.0;
        if (kept >= goal)
            return r + 1;
    }
    return n;
}
