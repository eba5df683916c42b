/* SPDX-License-Identifier: MIT */
/*
 * kv_eig.h — eigen-decomposition of a symmetric matrix, and what a low-rank
 * basis needs from it: the Gram matrix of a set of rows and the smallest
 * rank that keeps a fraction of their energy. Cross-layer shared bases
 * (xKV) are the top eigenvectors of the Gram matrix X^T X of the
 * concatenated K (or V) rows X [T][F] of a group of layers: its eigenvalues
 * are the squared singular values of X, so the energy ||X||_F^2 kept by the
 * top r of them is what a rank-r projection keeps.
 *
 * Method: Householder reduction to tridiagonal form with the reflections
 * accumulated, then the implicit QL iteration with Wilkinson shifts on the
 * tridiagonal matrix (each Givens rotation applied to the accumulated
 * vectors); all in double. O(n^3) time, no allocation: the caller passes
 * the matrix (overwritten by the eigenvectors) and 2n doubles of work.
 *
 * Deterministic (a fixed order of operations); thread-safe (no state).
 * util/ may be used by every module (tests/check_deps.sh).
 */
#ifndef KV_EIG_H
#define KV_EIG_H

#include <stddef.h>
#include <stdint.h>

/* Eigen-decomposition of the symmetric matrix a [n][n] (row-major; only the
 * lower triangle, a[i][j] with j <= i, is read). On success a holds the
 * eigenvectors as ROWS, a[j][0..n) the unit eigenvector of w[j], and w [n]
 * the eigenvalues in descending order; eigenvectors of a repeated
 * eigenvalue are an orthonormal basis of its space. work: 2n doubles.
 * Returns 0, -1 for n == 0 or an input with NaN/Inf (a unchanged), or -2
 * when the iteration did not converge or produced a non-finite value (60
 * sweeps per eigenvalue; not seen on finite input; a and w then hold no
 * meaningful result). Eigenvalues are accurate to about DBL_EPSILON times
 * the largest |eigenvalue|. */
int kv_eig_sym(uint32_t n, double *a, double *w, double *work);

/* The eigenvalues only (w, descending; the same values kv_eig_sym gives to
 * rounding), about 4x faster; a is overwritten with scratch. Same returns. */
int kv_eig_values(uint32_t n, double *a, double *w, double *work);

/* The Gram matrix g [f][f] = x^T x of the rows x [t][f] (row r at x + r *
 * stride floats), in double, full (both triangles written). */
void kv_eig_gram(const float *x, uint32_t t, uint32_t f, size_t stride, double *g);

/* The smallest r such that the r largest of the eigenvalues w [n]
 * (descending; negative ones, rounding of a positive semidefinite matrix,
 * count as 0) sum to at least frac (0..1] of all: 0 when they are all 0. */
uint32_t kv_eig_rank(const double *w, uint32_t n, double frac);

#endif /* KV_EIG_H */
