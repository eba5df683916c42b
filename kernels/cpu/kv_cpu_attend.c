/* SPDX-License-Identifier: MIT */
/*
 * kv_cpu_attend.c — the hot loops of the CPU backend (see kv_cpu.h).
 *
 * One source, compiled once per build (kv_cpu_simd.h: portable, AVX2 with
 * FMA and F16C, AVX-512F; kv_cpu_isa.c picks the best the CPU runs). Every
 * build performs the same FP32 operations in the same order, so they give
 * identical results: the multiply-adds of the dot products and of the V
 * accumulation are fused (kv_v8f_fma: one rounding; an FMA instruction, or
 * fmaf per lane in the portable build) and nothing else is.
 *
 * Per chunk of a page (at most one tile of tokens), for the query rows that
 * see tokens of it: logits = q . k (q is pre-scaled), an online-softmax
 * update per row (running max m, sum l, accumulator acc), acc += p * v. The
 * per-format part is reached through this build's format table
 * (kv_cpu_loops_t.fmt), in one of two ways: formats read as codes (INT4,
 * INT2) compute q . k and sum p * v straight from their encoded tokens for
 * all the rows at once (unpacking shared by a GQA group; no FP32 tiles);
 * the others are decoded by the table's load (FP16, MERGED: exactly the
 * floats kv_format_load gives, for the list's variant of a shared page) to
 * FP32 K and V tiles, and the dot products and the V accumulation below run
 * per row over the tiles. The softmax step is the same code either way.
 * exp is a vectorized polynomial (relative error 2.6e-7) that returns
 * exactly 0 below -87; arguments are always <= 0 here (a logit minus a
 * running max or a log-sum-exp).
 *
 * Scratch (per thread, from the caller): K tile, V tile (KV_CPU_TILE_FLOATS
 * each), then one row of tile_stride floats per query row for logits/probs
 * (the stats pass over a format read as codes puts blocks of rows' logits
 * in the tiles instead). A row's probabilities past its visible tokens are
 * exactly 0 up to the chunk's end.
 * A row's logits are padded with -inf up to a whole vector, so padding
 * lanes get probability exactly 0; the logits themselves come four tokens at
 * a time (q loaded once per four; a short group repeats its last token).
 */
#include <assert.h>
#include <math.h>
#include <string.h>

#include "formats/kv_fmt_rot.h"
#include "kv_cpu.h"
#include "kv_cpu_simd.h"

#define KV_CPU_BODY static inline __attribute__((always_inline))

_Static_assert(KV_CPU_VW == 8, "the loops are written for 8-float vectors");

/* Store the 8-lane value v (an expression) to p. */
#define KV_CPU_ST(p, v)                                                     \
    do {                                                                    \
        const kv_v8f st_ = (v);                                             \
        kv_v8f_st((p), &st_);                                               \
    } while (0)

/* *a = lane-wise max(*a, p[0..8)) (keeps *a on ties and NaN). */
KV_CPU_BODY void vmax_in(kv_v8f *a, const float *p)
{
    kv_v8f b = kv_v8f_ld(p);
    kv_v8u m = (kv_v8u)(b > *a);
    *a = (kv_v8f)(((kv_v8u)b & m) | ((kv_v8u)*a & ~m));
}

/* Horizontal max of 8 lanes (the sum: kv_v8f_hsum, kv_cpu_simd.h). */
KV_CPU_BODY float vhmax(const kv_v8f *v)
{
    float h[8];
    memcpy(h, v, sizeof h);
    float a = h[0] > h[4] ? h[0] : h[4], b = h[1] > h[5] ? h[1] : h[5];
    float c = h[2] > h[6] ? h[2] : h[6], d = h[3] > h[7] ? h[3] : h[7];
    a = a > c ? a : c;
    b = b > d ? b : d;
    return a > b ? a : b;
}

/* exp(src[i] - sub) for i < 8, for arguments <= 0 (larger ones are clamped
 * to 88); exactly 0 below -87 so that 2^n below stays a normal number.
 * Max relative error 2.6e-7 over [-87, 0] (checked exhaustively). */
KV_CPU_BODY kv_v8f vexp(const float *src, float sub)
{
    kv_v8f x = kv_v8f_ld(src) - kv_v8f_set1(sub);
    const kv_v8f magic = kv_v8f_set1(12582912.0f); /* 1.5 * 2^23: round to int */
    kv_v8u dead = (kv_v8u)(x < kv_v8f_set1(-87.0f)); /* all ones where true */
    kv_v8u big = (kv_v8u)(x > kv_v8f_set1(88.0f));
    x = (kv_v8f)(((kv_v8u)x & ~big) | ((kv_v8u)kv_v8f_set1(88.0f) & big));
    kv_v8f t = x * kv_v8f_set1(1.44269504088896341f) + magic;
    kv_v8f n = t - magic;
    kv_v8f r = x - n * kv_v8f_set1(0.693359375f);  /* ln2 hi (exact product) */
    r = r - n * kv_v8f_set1(-2.12194440e-4f);      /* ln2 lo                 */
    kv_v8f p = kv_v8f_set1(1.0f / 720.0f);
    p = p * r + kv_v8f_set1(1.0f / 120.0f);
    p = p * r + kv_v8f_set1(1.0f / 24.0f);
    p = p * r + kv_v8f_set1(1.0f / 6.0f);
    p = p * r + kv_v8f_set1(0.5f);
    p = p * r + kv_v8f_set1(1.0f);
    p = p * r + kv_v8f_set1(1.0f);
    kv_v8u e = ((kv_v8u)t - (kv_v8u)magic) << 23; /* n * 2^23, mod 2^32 */
    return (kv_v8f)(((kv_v8u)p + e) & ~dead);
}

/* *a_i += *s * x_i lane-wise, fused, for the vectors x_i at p0 .. p3 (all
 * four loaded first): four independent FMA chains. */
KV_CPU_BODY void vfma4_in(kv_v8f *a0, kv_v8f *a1, kv_v8f *a2, kv_v8f *a3,
                          const kv_v8f *s, const float *p0, const float *p1,
                          const float *p2, const float *p3)
{
    kv_v8f x0 = kv_v8f_ld(p0), x1 = kv_v8f_ld(p1), x2 = kv_v8f_ld(p2), x3 = kv_v8f_ld(p3);
    kv_v8f_fma(a0, s, &x0);
    kv_v8f_fma(a1, s, &x1);
    kv_v8f_fma(a2, s, &x2);
    kv_v8f_fma(a3, s, &x3);
}

/* The four horizontal sums of a, b, c, d: {sum a, sum b, sum c, sum d}
 * written to out[0..3]. Shuffles stay inside 128-bit halves. */
KV_CPU_BODY void vhsum4(const kv_v8f *a, const kv_v8f *b, const kv_v8f *c,
                        const kv_v8f *d, float *out)
{
    kv_v8f x = __builtin_shufflevector(*a, *b, 0, 8, 1, 9, 4, 12, 5, 13) +
               __builtin_shufflevector(*a, *b, 2, 10, 3, 11, 6, 14, 7, 15);
    kv_v8f y = __builtin_shufflevector(*c, *d, 0, 8, 1, 9, 4, 12, 5, 13) +
               __builtin_shufflevector(*c, *d, 2, 10, 3, 11, 6, 14, 7, 15);
    kv_v8f z = __builtin_shufflevector(x, y, 0, 1, 8, 9, 4, 5, 12, 13) +
               __builtin_shufflevector(x, y, 2, 3, 10, 11, 6, 7, 14, 15);
    const kv_v4f h = __builtin_shufflevector(z, z, 0, 1, 2, 3) +
                     __builtin_shufflevector(z, z, 4, 5, 6, 7);
    memcpy(out, &h, sizeof h);
}

/* s[i] = q . k_i for i < nv (k_i = kt + i*d, d a multiple of 8). Tokens go
 * four at a time so q is loaded once per four; a short last group repeats
 * its last token, so every logit comes from the same operation sequence.
 * Each token has two accumulators (even and odd vectors of the row, summed
 * at the end): eight independent FMA chains hide the FMA latency. */
KV_CPU_BODY void logits_row(const float *q, const float *kt, uint32_t nv,
                            uint32_t d, float *s)
{
    for (uint32_t i = 0; i < nv; i += 4) {
        const float *k0 = kt + (size_t)i * d;
        const float *k1 = i + 1 < nv ? k0 + d : k0;
        const float *k2 = i + 2 < nv ? k0 + 2 * (size_t)d : k1;
        const float *k3 = i + 3 < nv ? k0 + 3 * (size_t)d : k2;
        kv_v8f a0 = kv_v8f_set1(0.0f), a1 = a0, a2 = a0, a3 = a0;
        kv_v8f b0 = a0, b1 = a0, b2 = a0, b3 = a0;
        uint32_t j = 0;
        for (; j + 2 * KV_CPU_VW <= d; j += 2 * KV_CPU_VW) {
            const uint32_t jw = j + KV_CPU_VW;
            kv_v8f qv = kv_v8f_ld(q + j), qw = kv_v8f_ld(q + jw);
            vfma4_in(&a0, &a1, &a2, &a3, &qv, k0 + j, k1 + j, k2 + j, k3 + j);
            vfma4_in(&b0, &b1, &b2, &b3, &qw, k0 + jw, k1 + jw, k2 + jw,
                     k3 + jw);
        }
        if (j < d) { /* d an odd multiple of 8 */
            kv_v8f qv = kv_v8f_ld(q + j);
            vfma4_in(&a0, &a1, &a2, &a3, &qv, k0 + j, k1 + j, k2 + j, k3 + j);
        }
        a0 += b0;
        a1 += b1;
        a2 += b2;
        a3 += b3;
        float r[4];
        if (i + 4 <= nv) { /* a whole block: straight to s */
            vhsum4(&a0, &a1, &a2, &a3, s + i);
        } else {
            vhsum4(&a0, &a1, &a2, &a3, r);
            memcpy(s + i, r, (nv - i) * sizeof *r);
        }
    }
}

/* acc[0..d) += sum over i < nv of p[i] * v_i (v_i = vt + i*d). Per pass
 * over the tokens, 32 floats of acc in two sets of four accumulators (even
 * tokens into the first, which starts from acc, odd into the second, which
 * starts from 0; acc = first + second at the end): eight independent FMA
 * chains hide the FMA latency. */
KV_CPU_BODY void accumulate(float *acc, const float *p, const float *vt,
                            uint32_t nv, uint32_t d)
{
    uint32_t j = 0;
    for (; j + 4 * KV_CPU_VW <= d; j += 4 * KV_CPU_VW) {
        kv_v8f a0 = kv_v8f_ld(acc + j), a1 = kv_v8f_ld(acc + j + 8);
        kv_v8f a2 = kv_v8f_ld(acc + j + 16), a3 = kv_v8f_ld(acc + j + 24);
        kv_v8f b0 = kv_v8f_set1(0.0f), b1 = b0, b2 = b0, b3 = b0;
        const float *v = vt + j;
        uint32_t i = 0;
        for (; i + 2 <= nv; i += 2, v += 2 * (size_t)d) {
            const float *w = v + d;
            kv_v8f pi = kv_v8f_set1(p[i]), pn = kv_v8f_set1(p[i + 1]);
            vfma4_in(&a0, &a1, &a2, &a3, &pi, v, v + 8, v + 16, v + 24);
            vfma4_in(&b0, &b1, &b2, &b3, &pn, w, w + 8, w + 16, w + 24);
        }
        if (i < nv) {
            kv_v8f pi = kv_v8f_set1(p[i]);
            vfma4_in(&a0, &a1, &a2, &a3, &pi, v, v + 8, v + 16, v + 24);
        }
        KV_CPU_ST(acc + j, a0 + b0);
        KV_CPU_ST(acc + j + 8, a1 + b1);
        KV_CPU_ST(acc + j + 16, a2 + b2);
        KV_CPU_ST(acc + j + 24, a3 + b3);
    }
    for (; j < d; j += KV_CPU_VW) {
        kv_v8f a = kv_v8f_ld(acc + j);
        for (uint32_t i = 0; i < nv; i++) {
            kv_v8f pi = kv_v8f_set1(p[i]), x = kv_v8f_ld(vt + (size_t)i * d + j);
            kv_v8f_fma(&a, &pi, &x);
        }
        KV_CPU_ST(acc + j, a);
    }
}

/* Tokens of the chunk starting at list token t0 (n tokens) that row r sees. */
KV_CPU_BODY uint32_t row_visible(const kv_cpu_task_t *t, uint32_t r,
                                 uint32_t t0, uint32_t n)
{
    uint64_t lim = (uint64_t)t->lim0 + r / t->group;
    if (lim > t->span.t_end)
        lim = t->span.t_end;
    if (lim <= t0)
        return 0;
    return lim - t0 < n ? (uint32_t)(lim - t0) : n;
}

/* Pad s[nv ..] to a whole vector with -inf (exp gives 0); returns the
 * padded length. */
KV_CPU_BODY uint32_t pad_row(float *s, uint32_t nv)
{
    const uint32_t nvr = (nv + KV_CPU_VW - 1) / KV_CPU_VW * KV_CPU_VW;
    for (uint32_t i = nv; i < nvr; i++)
        s[i] = -INFINITY;
    return nvr;
}

/* One row's online-softmax step over its nv logits s[0..nv) of the chunk
 * starting at list token t0: records them (task->logits), updates m, l and
 * rescales acc, and turns s into probabilities, padded with zeros to a whole
 * vector (returns the padded length). */
KV_CPU_BODY uint32_t softmax_row(const kv_cpu_task_t *t, uint32_t r,
                                 uint32_t t0, uint32_t nv, float *s)
{
    const uint32_t d = t->geom->head_dim;
    float *acc = t->acc + (size_t)r * d;
    if (t->logits)
        memcpy(t->logits + r * t->logits_stride + t0, s, nv * sizeof *s);

    const uint32_t nvr = pad_row(s, nv);
    kv_v8f mx8 = kv_v8f_ld(s);
    for (uint32_t i = KV_CPU_VW; i < nvr; i += KV_CPU_VW)
        vmax_in(&mx8, s + i);
    float mx = vhmax(&mx8);
    float m = t->m[r];
    if (mx > m) {
        if (m != -INFINITY) { /* else l and acc are still 0 */
            float c = expf(m - mx);
            t->l[r] *= c;
            for (uint32_t j = 0; j < d; j += KV_CPU_VW)
                KV_CPU_ST(acc + j, kv_v8f_ld(acc + j) * kv_v8f_set1(c));
        }
        m = mx;
        t->m[r] = m;
    }
    kv_v8f sum = kv_v8f_set1(0.0f);
    for (uint32_t i = 0; i < nvr; i += KV_CPU_VW) {
        kv_v8f e = vexp(s + i, m);
        KV_CPU_ST(s + i, e);
        sum += e;
    }
    t->l[r] += kv_v8f_hsum(&sum);
    return nvr;
}

/* The first row that sees tokens of the chunk at list token t0 (n tokens),
 * or n_rows: rows see a prefix that grows with the row. */
KV_CPU_BODY uint32_t first_row(const kv_cpu_task_t *t, uint32_t t0,
                               uint32_t n)
{
    uint32_t r = 0;
    while (r < t->n_rows && row_visible(t, r, t0, n) == 0)
        r++;
    return r;
}

/* A chunk: n tokens of page pg from its token off (list tokens t0..),
 * seen by rows r0 .. n_rows-1; ops its format's entry in this build's
 * format table. */
typedef struct chunk {
    const kv_kern_page_t *pg;
    const kv_cpu_fmt_ops_t *ops;
    uint32_t off, t0, n, r0;
} chunk_t;

/* The ops of page pg in the task's format table. */
KV_CPU_BODY const kv_cpu_fmt_ops_t *page_ops(const kv_cpu_task_t *t,
                                             const kv_kern_page_t *pg)
{
    return &t->fmt[pg->format];
}

/* The chunk's tokens to FP32 K and V tiles (either may be NULL). */
KV_CPU_BODY void load_chunk(const kv_page_geom_t *g, const chunk_t *c,
                            float *kt, float *vt)
{
    c->ops->load(c->pg->data, g, c->pg->variant, c->off, c->n, kt, vt);
}

/* Rotated INT pages (kv_cpu_fmt_ops_t.rotated): 1 if the chunk's codes are
 * of rotated rows. */
KV_CPU_BODY int chunk_rotated(const chunk_t *c)
{
    return c->ops->read == KV_CPU_READ_CODES &&
           ((c->ops->rotated >> c->pg->variant) & 1u);
}

/* rq[r] = R q[r] for n rows of d (rq: the scratch after the logits rows). */
KV_CPU_BODY const float *rotate_q(const float *q, uint32_t n, uint32_t d,
                                  float *rq)
{
    memcpy(rq, q, (size_t)n * d * sizeof *rq);
    kv_fmt_rot_fwd_rows(rq, n, d, d);
    return rq;
}

/* acc[r] += R^T sum[r] for n rows of d (sum: the rotated sums, clobbered). */
KV_CPU_BODY void add_unrotated(float *acc, float *sum, uint32_t n, uint32_t d)
{
    kv_fmt_rot_inv_rows(sum, n, d, d);
    for (size_t i = 0; i < (size_t)n * d; i += KV_CPU_VW)
        KV_CPU_ST(acc + i, kv_v8f_ld(acc + i) + kv_v8f_ld(sum + i));
}

/* Online-softmax step of the chunk for its rows: logits (the format's score
 * step for all rows at once when it is read as codes, else its load to the
 * tiles and q . k per row), the per-row softmax update, then sum p * v (the
 * accum step for all rows, else per row over the V tile). */
KV_CPU_BODY void attend_chunk(const kv_cpu_task_t *t, const chunk_t *c,
                              float *scratch)
{
    const kv_page_geom_t *g = t->geom;
    const uint32_t d = g->head_dim, ts = kv_cpu_tile_stride(d), nr = t->n_rows - c->r0;
    float *kt = scratch, *vt = scratch + KV_CPU_TILE_FLOATS;
    float *srow = vt + KV_CPU_TILE_FLOATS;
    float *rq = srow + (size_t)t->n_rows * ts; /* [nr][d]: rotated pages */
    assert(t->n_rows <= t->scratch_rows);
    const int codes = c->ops->read == KV_CPU_READ_CODES;
    const int rot = chunk_rotated(c);
    const float *q = t->q + (size_t)c->r0 * d;
    if (codes)
        c->ops->score(c->pg->data, g, c->off, c->n,
                      rot ? rotate_q(q, nr, d, rq) : q, d, nr,
                      srow + (size_t)c->r0 * ts, ts);
    else
        load_chunk(g, c, kt, vt);
    for (uint32_t r = c->r0; r < t->n_rows; r++) {
        const uint32_t nv = row_visible(t, r, c->t0, c->n);
        float *s = srow + (size_t)r * ts;
        if (!codes)
            logits_row(t->q + (size_t)r * d, kt, nv, d, s);
        const uint32_t nvr = softmax_row(t, r, c->t0, nv, s);
        if (!codes)
            accumulate(t->acc + (size_t)r * d, s, vt, nv, d);
        else if (nvr < c->n) /* tokens the row does not see: p = 0 */
            memset(s + nvr, 0, (c->n - nvr) * sizeof *s);
    }
    if (codes && rot) {
        memset(rq, 0, (size_t)nr * d * sizeof *rq);
        c->ops->accum(c->pg->data, g, c->off, c->n,
                      srow + (size_t)c->r0 * ts, ts, nr, rq, d);
        add_unrotated(t->acc + (size_t)c->r0 * d, rq, nr, d);
    } else if (codes) {
        c->ops->accum(c->pg->data, g, c->off, c->n,
                      srow + (size_t)c->r0 * ts, ts, nr,
                      t->acc + (size_t)c->r0 * d, d);
    }
}

/* Statistics of the chunk: stats[t0 + i] += exp(logit - lse[r]) over its
 * rows in order. With the score step, blocks of rows are scored at once into
 * the (then unused) tiles; else K is loaded to its tile and each row's
 * logits go to the first logits row. */
KV_CPU_BODY void stats_chunk(const kv_cpu_task_t *t, const chunk_t *c,
                             float *scratch)
{
    const kv_page_geom_t *g = t->geom;
    const uint32_t d = g->head_dim, ts = kv_cpu_tile_stride(d);
    float *kt = scratch, *srow = scratch + 2 * KV_CPU_TILE_FLOATS;
    /* Rotated pages: a block of rows' rotated q after the one logits row
     * (n_rows may exceed the rows the scratch holds: the block is capped) */
    float *rq = srow + ts;
    const int codes = c->ops->read == KV_CPU_READ_CODES;
    const int rot = chunk_rotated(c);
    uint32_t blk = codes ? 2 * KV_CPU_TILE_FLOATS / ts : t->n_rows;
    if (rot && blk > t->scratch_rows)
        blk = t->scratch_rows;
    if (!codes)
        load_chunk(g, c, kt, NULL);
    for (uint32_t rb = c->r0; rb < t->n_rows; rb += blk) {
        const uint32_t nb = t->n_rows - rb < blk ? t->n_rows - rb : blk;
        const float *q = t->q + (size_t)rb * d;
        if (codes)
            c->ops->score(c->pg->data, g, c->off, c->n,
                          rot ? rotate_q(q, nb, d, rq) : q, d, nb, kt, ts);
        for (uint32_t r = rb; r < rb + nb; r++) {
            const uint32_t nv = row_visible(t, r, c->t0, c->n);
            float *s = codes ? kt + (size_t)(r - rb) * ts : srow;
            if (!codes)
                logits_row(t->q + (size_t)r * d, kt, nv, d, s);
            pad_row(s, nv);
            for (uint32_t i = 0; i < nv; i += KV_CPU_VW)
                KV_CPU_ST(s + i, vexp(s + i, t->lse[r]));
            for (uint32_t i = 0; i < nv; i++)
                t->stats[c->t0 + i] += s[i];
        }
    }
}

/* Prefetch page pj of the span (its first token is list token tok; none
 * past the span's end) to L2 while the chunk before it is computed, if it
 * is read as codes: the pages of a list are not adjacent in memory, and an
 * INT page is computed in less time than the hardware prefetcher takes to
 * ramp up on it. (For pages read as rows it measured slower:
 * docs/results/benchmarks.md.) */
KV_CPU_BODY void prefetch_page(const kv_cpu_task_t *t, uint32_t pj,
                               uint32_t tok)
{
    if (tok >= t->span.t_end)
        return;
    const kv_kern_page_t *pg = &t->span.pages[pj];
    if (page_ops(t, pg)->read != KV_CPU_READ_CODES)
        return;
    for (uint32_t b = 0; b < t->geom->page_bytes; b += 64)
        __builtin_prefetch((const char *)pg->data + b, 0, 2);
}

/* Walk the span chunk by chunk (a chunk never crosses a page nor holds more
 * tokens than a tile) and run the attend or (`stats_mode`) the stats step
 * of each chunk that some row sees. */
KV_CPU_BODY void walk(const kv_cpu_task_t *t, float *scratch,
                      int stats_mode)
{
    const uint32_t tt = kv_cpu_tile_tokens(t->geom->head_dim);
    const kv_cpu_span_t *sp = &t->span;
    uint32_t pi = sp->page0, off = sp->off0;

    for (uint32_t t0 = sp->t_begin; t0 < sp->t_end;) {
        chunk_t c = {.pg = &sp->pages[pi], .off = off, .t0 = t0};
        c.ops = page_ops(t, c.pg);
        c.n = c.pg->n_tokens - off;
        if (c.n > sp->t_end - t0)
            c.n = sp->t_end - t0;
        if (c.n > tt)
            c.n = tt;
        if (off + c.n == c.pg->n_tokens) /* the next chunk's page */
            prefetch_page(t, pi + 1, t0 + c.n);
        c.r0 = first_row(t, t0, c.n);
        if (c.r0 < t->n_rows && stats_mode)
            stats_chunk(t, &c, scratch);
        else if (c.r0 < t->n_rows)
            attend_chunk(t, &c, scratch);
        t0 += c.n;
        off += c.n;
        if (off == c.pg->n_tokens) {
            pi++;
            off = 0;
        }
    }
}

KV_CPU_BODY void attend_body(const kv_cpu_task_t *t, float *scratch)
{
    walk(t, scratch, 0);
}

KV_CPU_BODY void stats_body(const kv_cpu_task_t *t, float *scratch)
{
    memset(t->stats + t->span.t_begin, 0,
           (size_t)(t->span.t_end - t->span.t_begin) * sizeof(float));
    walk(t, scratch, 1);
}

KV_CPU_BODY void stats_from_logits_body(const kv_cpu_task_t *t)
{
    for (uint32_t t0 = t->span.t_begin; t0 < t->span.t_end;
         t0 += KV_CPU_VW) {
        uint32_t nb = t->span.t_end - t0;
        nb = nb < KV_CPU_VW ? nb : KV_CPU_VW;
        kv_v8f sum = kv_v8f_set1(0.0f);
        for (uint32_t r = 0; r < t->n_rows; r++) {
            const float *x = t->logits + r * t->logits_stride + t0;
            float v[KV_CPU_VW];
            for (uint32_t i = 0; i < KV_CPU_VW; i++)
                v[i] = i < nb ? x[i] : -INFINITY;
            sum += vexp(v, t->lse[r]);
        }
        memcpy(t->stats + t0, &sum, nb * sizeof(float));
    }
}

/* This build's entry points and its table. */
static void attend_entry(const kv_cpu_task_t *t, float *s)
{
    attend_body(t, s);
}
static void stats_entry(const kv_cpu_task_t *t, float *s)
{
    stats_body(t, s);
}
static void stats_from_logits_entry(const kv_cpu_task_t *t)
{
    stats_from_logits_body(t);
}

#define KV_CPU_STR_(x) #x
#define KV_CPU_STR(x) KV_CPU_STR_(x)

const kv_cpu_loops_t KV_CPU_SYM(kv_cpu_loops) = {
    .isa = KV_CPU_STR(KV_CPU_BUILD),
    .attend = attend_entry,
    .stats = stats_entry,
    .stats_from_logits = stats_from_logits_entry,
    .fmt = {
        [KV_FMT_FP16] = {.read = KV_CPU_READ_ROWS,
                         .load = KV_CPU_SYM(kv_cpu_fp16_load)},
        [KV_FMT_INT4] = {.read = KV_CPU_READ_CODES, .rotated = 1u << 1,
                         .score = KV_CPU_SYM(kv_cpu_int4_score),
                         .accum = KV_CPU_SYM(kv_cpu_int4_accum)},
        [KV_FMT_INT2] = {.read = KV_CPU_READ_CODES, .rotated = 1u << 1,
                         .score = KV_CPU_SYM(kv_cpu_int2_score),
                         .accum = KV_CPU_SYM(kv_cpu_int2_accum)},
        [KV_FMT_MERGED] = {.read = KV_CPU_READ_ROWS,
                           .load = KV_CPU_SYM(kv_cpu_merged_load)},
    },
};
