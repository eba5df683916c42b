/* SPDX-License-Identifier: MIT */
/*
 * test_eig.c — util/kv_eig: the symmetric eigen-decomposition against its
 * definition (A v = lambda v, orthonormal rows, descending order, trace
 * kept) on random, diagonal, repeated-eigenvalue, rank-deficient and
 * tiny matrices; the Gram matrix against a direct double sum; the energy
 * rank on known spectra; bad input refused with the matrix untouched.
 */
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kv_test.h"
#include "util/kv_eig.h"

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;

static double urand(void) /* [-1, 1) */
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (double)(rng_state >> 11) / (double)(1ull << 52) - 1.0;
}

/* Check a decomposition (v rows, w) of the symmetric a0 [n][n]: residual
 * ||A v - w v|| and orthonormality within tol * (1 + max |w|), order. */
static void check_decomp(uint32_t n, const double *a0, const double *v, const double *w,
                         double tol)
{
    double scale = 1.0, trace = 0.0, wsum = 0.0;
    for (uint32_t j = 0; j < n; j++) {
        scale = fmax(scale, fabs(w[j]));
        trace += a0[(size_t)j * n + j];
        wsum += w[j];
    }
    double worst_res = 0.0, worst_orth = 0.0;
    int ordered = 1;
    for (uint32_t j = 0; j < n; j++) {
        const double *vj = v + (size_t)j * n;
        for (uint32_t i = 0; i < n; i++) {
            double s = 0.0;
            for (uint32_t k = 0; k < n; k++)
                s += a0[(size_t)i * n + k] * vj[k];
            worst_res = fmax(worst_res, fabs(s - w[j] * vj[i]));
        }
        for (uint32_t k = 0; k <= j; k++) {
            double s = 0.0;
            for (uint32_t i = 0; i < n; i++)
                s += vj[i] * v[(size_t)k * n + i];
            worst_orth = fmax(worst_orth, fabs(s - (k == j)));
        }
        if (j && w[j] > w[j - 1])
            ordered = 0;
    }
    CHECK(worst_res <= tol * scale);
    CHECK(worst_orth <= tol);
    CHECK(ordered);
    CHECK(fabs(trace - wsum) <= tol * scale * n);
    if (worst_res > tol * scale || worst_orth > tol)
        fprintf(stderr, "n=%u residual %.3g orthogonality %.3g\n", n, worst_res, worst_orth);
}

/* Decompose a copy of a0 (lower triangle only given: the upper is garbage)
 * and check it. */
static void run_case(uint32_t n, const double *a0, double tol)
{
    double *a = malloc((size_t)n * n * sizeof *a), *w = malloc(n * sizeof *w),
           *work = malloc(2 * n * sizeof *work);
    if (!a || !w || !work)
        exit(1);
    for (uint32_t i = 0; i < n; i++)
        for (uint32_t j = 0; j < n; j++)
            a[(size_t)i * n + j] = j <= i ? a0[(size_t)i * n + j] : 1e30; /* unread */
    CHECK_EQ(kv_eig_sym(n, a, w, work), 0);
    check_decomp(n, a0, a, w, tol);
    /* the values alone: the same to rounding */
    double *w2 = malloc(n * sizeof *w2);
    if (!w2)
        exit(1);
    for (uint32_t i = 0; i < n; i++)
        for (uint32_t j = 0; j <= i; j++)
            a[(size_t)i * n + j] = a0[(size_t)i * n + j];
    CHECK_EQ(kv_eig_values(n, a, w2, work), 0);
    double worst = 0.0, scale = 1.0;
    for (uint32_t j = 0; j < n; j++) {
        worst = fmax(worst, fabs(w2[j] - w[j]));
        scale = fmax(scale, fabs(w[j]));
    }
    CHECK(worst <= tol * scale);
    free(w2);
    free(a);
    free(w);
    free(work);
}

static double *random_sym(uint32_t n)
{
    double *a = malloc((size_t)n * n * sizeof *a);
    if (!a)
        exit(1);
    for (uint32_t i = 0; i < n; i++)
        for (uint32_t j = 0; j <= i; j++)
            a[(size_t)i * n + j] = a[(size_t)j * n + i] = urand();
    return a;
}

int main(void)
{
    /* random symmetric matrices of several sizes */
    static const uint32_t sizes[] = {1, 2, 3, 4, 7, 16, 65, 200};
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
        double *a = random_sym(sizes[s]);
        run_case(sizes[s], a, 1e-10);
        free(a);
    }

    /* diagonal (already tridiagonal everywhere: no reflection) */
    {
        enum { N = 9 };
        double a[N * N] = {0};
        for (int i = 0; i < N; i++)
            a[i * N + i] = (double)((i * 5) % N) - 3.0;
        run_case(N, a, 1e-12);
    }
    /* a repeated eigenvalue: I + u u^T (eigenvalues 1+|u|^2, then 1 x (n-1)) */
    {
        enum { N = 12 };
        double a[N * N], u[N];
        for (int i = 0; i < N; i++)
            u[i] = urand();
        for (int i = 0; i < N; i++)
            for (int j = 0; j < N; j++)
                a[i * N + j] = u[i] * u[j] + (i == j);
        run_case(N, a, 1e-11);
    }
    /* rank-deficient Gram matrix: 5 rows of 30 features -> 25 zero
     * eigenvalues, and the energy rank of a known spectrum */
    {
        enum { T = 5, F = 30 };
        float x[T * F];
        for (int i = 0; i < T * F; i++)
            x[i] = (float)urand();
        double g[F * F], direct = 0.0;
        kv_eig_gram(x, T, F, F, g);
        for (int t = 0; t < T; t++)
            direct += (double)x[t * F + 3] * x[t * F + 17];
        CHECK(fabs(g[3 * F + 17] - direct) < 1e-12 && g[3 * F + 17] == g[17 * F + 3]);
        double w[F], work[2 * F];
        double a[F * F];
        memcpy(a, g, sizeof a);
        CHECK_EQ(kv_eig_sym(F, a, w, work), 0);
        check_decomp(F, g, a, w, 1e-10);
        int zeros = 0;
        for (int j = 0; j < F; j++)
            zeros += fabs(w[j]) < 1e-10 * w[0];
        CHECK_EQ(zeros, F - T);
        CHECK(kv_eig_rank(w, F, 1.0 - 1e-12) <= T);
    }
    /* a large rank-deficient Gram matrix with channels of very different
     * scales (as K rows have): 200 rows of 900 features, 700 eigenvalues
     * at the rounding level of the largest (a convergence test relative to
     * neighbouring diagonal entries never ends on these) */
    {
        enum { T = 200, F = 900 };
        float *x = malloc(sizeof(float) * T * F);
        double *g = malloc(sizeof(double) * F * F), *a = malloc(sizeof(double) * F * F);
        double w[F], work[2 * F];
        if (!x || !g || !a)
            exit(1);
        for (int t = 0; t < T; t++)
            for (int f = 0; f < F; f++)
                x[t * F + f] = (float)(urand() * (f % 7 == 0 ? 300.0 : f % 3 == 0 ? 1e-2 : 1.0));
        kv_eig_gram(x, T, F, F, g);
        memcpy(a, g, sizeof(double) * F * F);
        CHECK_EQ(kv_eig_sym(F, a, w, work), 0);
        check_decomp(F, g, a, w, 1e-10);
        memcpy(a, g, sizeof(double) * F * F);
        CHECK_EQ(kv_eig_values(F, a, w, work), 0);
        free(x);
        free(g);
        free(a);
    }
    {
        const double w[] = {4.0, 3.0, 2.0, 1.0, -1e-17};
        CHECK_EQ(kv_eig_rank(w, 5, 0.4), 1);  /* 4/10 */
        CHECK_EQ(kv_eig_rank(w, 5, 0.41), 2); /* 7/10 */
        CHECK_EQ(kv_eig_rank(w, 5, 0.95), 4);
        CHECK_EQ(kv_eig_rank(w, 5, 1.0), 4);
        const double zero[] = {0.0, 0.0};
        CHECK_EQ(kv_eig_rank(zero, 2, 0.9), 0);
    }
    /* bad input: n = 0, NaN, Inf -> -1 and the matrix unchanged */
    {
        double a[4] = {1.0, 9.0, NAN, 2.0}, w[2], work[4];
        CHECK_EQ(kv_eig_sym(0, a, w, work), -1);
        CHECK_EQ(kv_eig_sym(2, a, w, work), -1);
        CHECK(a[1] == 9.0 && isnan(a[2]));
        a[2] = INFINITY;
        CHECK_EQ(kv_eig_sym(2, a, w, work), -1);
        a[2] = 0.5; /* upper triangle (9.0) ignored */
        CHECK_EQ(kv_eig_sym(2, a, w, work), 0);
        double ref[4] = {1.0, 0.5, 0.5, 2.0};
        check_decomp(2, ref, a, w, 1e-14);
    }
    return kv_test_end();
}
