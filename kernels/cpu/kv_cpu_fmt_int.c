/* SPDX-License-Identifier: MIT */
/*
 * kv_cpu_fmt_int.c — CPU attention straight from INT4/INT2 codes: the
 * score and accum steps of the kernels-side format table (kv_cpu.h,
 * kv_cpu_fmt_ops_t) for the two INT formats. Compiled once per build
 * (kv_cpu_simd.h); no FP32 rows are written.
 *
 * Over tokens [t0, t0+n) of a page, for query rows r < n_rows (k^, v^: the
 * values the format's load decodes, x^ = kv_fmt_codec_dequant(code, scale,
 * min) = code * scale + min):
 *   score: s[r*s_stride + i] = sum_c q[r*q_stride + c] * k^_{t0+i}[c]
 *   accum: acc[r*acc_stride + c] += sum_{i<n} p[r*p_stride + i] * v^_{t0+i}[c]
 * Method (layout: formats/kv_fmt_layout.h):
 *   score (keys: scale/min per channel c of a 16-token group), in the
 *     code domain, per group:
 *       q . k^_t = sum_c (q[c] * scale_c) * code_ct  +  sum_c q[c] * min_c
 *     lanes = tokens of the group; per channel the group's codes are
 *     unpacked once for all rows (a shift per lane, mask, convert) and each
 *     row adds qs[c] * code (qs = q * scale, once per row and group; one
 *     chain per row and block, channels in order); the second sum (bias) is
 *     one 8-lane FMA chain over the channels, then a fixed horizontal sum,
 *     added once at the end. A one-hot q gives exactly the decoded value
 *     (scale * code is exact in FP32).
 *   accum (values: scale/min per token and 16-channel group): lanes =
 *     channels of one token's group; v^ = code * scale + min (one rounding,
 *     as the load), and each row's partial sum for the block adds p[t] * v^
 *     (tokens in order; a few channel blocks at a time), then is added to
 *     acc. (The code-domain form, sum_t (p_t scale_t) code + sum_t p_t min_t,
 *     measured slower: its per-row products cost about as much as the sums
 *     when a group has 16 channels and a GQA group 3 rows;
 *     docs/results/benchmarks.md.)
 * The unpacked codes are shared by up to four query rows (a GQA group).
 * Attention sees the bits kv_read sees (tests/unit/test_attn_codes.c:
 * one-hot q and p). Every lane runs the same FP32 operation sequence
 * whatever the build (the bias chains are 8 lanes in every build), so all
 * builds give identical bits. Stack: about 24 KiB (FP32 scale/min and qs of
 * one group); no allocation, no state.
 */
#include <assert.h>
#include <string.h>

#include "kv_cpu.h"
#include "kv_cpu_simd.h"

/* Query rows sharing one unpacking of the codes, and V channel blocks per
 * pass: what the registers hold (16 vector registers in the SSE2/AVX2
 * builds, 32 with AVX-512). None of it changes a lane's operations. */
#if defined(__AVX512F__)
#define INT_ROWS 4u
#define INT_CB   4u
#elif defined(__AVX2__)
#define INT_ROWS 4u
#define INT_CB   2u
#else
#define INT_ROWS 1u
#define INT_CB   1u
#endif
#define INT_UNROLL _Pragma("GCC unroll 4")

#define INT_BODY static inline __attribute__((always_inline))

/* x = block blk of the 16 codes of one group member as FP32: K, one
 * channel (INT4 word planes `stride` apart); V, one token's 16-channel
 * group (adjacent words). */
INT_BODY void codes_f(kv_vb_t *x, const uint32_t *w, size_t stride,
                      uint32_t blk, const kv_vbu_t *sh, uint32_t bits)
{
    kv_vbu_t c;
    kv_vb_codes(&c, w, stride, blk, sh, bits);
    kv_vb_cvt(x, &c);
}

/* x = block blk of the 16 dequantized codes of one group member: K, one
 * channel (INT4 word planes D apart); V, one token's 16-channel group
 * (adjacent words). */
INT_BODY void dequant(kv_vb_t *x, const uint32_t *w, size_t stride,
                      uint32_t blk, const kv_vbu_t *sh, uint32_t bits,
                      float scale, float min)
{
    kv_vbu_t c;
    kv_vb_codes(&c, w, stride, blk, sh, bits);
    kv_vb_dequant(x, &c, scale, min);
}

/* Walking a token range group by group: the page's layout, the lane
 * shifts, the current group's scale/min as FP32 (K or V), and, for the
 * score, per-row products of the group: qs = q * scale [R][D], bias [R]. */
typedef struct int_walk {
    kv_fmt_int_layout_t l;
    uint32_t d, bits, which;        /* which: 0 keys, 1 values          */
    kv_vbu_t sh[KV_VB_PER_GROUP];
    float par[2 * KV_FMT_MAX_DIM];  /* scale [n], min [n] of the group  */
    float pre[INT_ROWS * KV_FMT_MAX_DIM];
    float bias[INT_ROWS];
} int_walk_t;

/* Logits of R query rows for the 16 tokens of one group:
 * out[r][b] lane j = q_r . k^_(b*W + j) = sum_c qs_r[c] code_c + bias_r
 * (qs_r = w->pre + r * d, bias_r = w->bias[r]). */
INT_BODY void score_group(const int_walk_t *w, const uint32_t *codes,
                          uint32_t R, kv_vb_t out[][KV_VB_PER_GROUP])
{
    const uint32_t d = w->d, bits = w->bits;
    kv_vb_t a[INT_ROWS][KV_VB_PER_GROUP];
    INT_UNROLL
    for (uint32_t r = 0; r < R; r++)
        for (uint32_t b = 0; b < KV_VB_PER_GROUP; b++)
            kv_vb_zero(&a[r][b]);
    for (uint32_t c = 0; c < d; c++) {
        kv_vb_t x[KV_VB_PER_GROUP];
        for (uint32_t b = 0; b < KV_VB_PER_GROUP; b++)
            codes_f(&x[b], codes + c, d, b, &w->sh[b], bits);
        INT_UNROLL
        for (uint32_t r = 0; r < R; r++) {
            const float qs = w->pre[r * d + c];
            for (uint32_t b = 0; b < KV_VB_PER_GROUP; b++)
                kv_vb_fma_s(&a[r][b], qs, &x[b]);
        }
    }
    INT_UNROLL
    for (uint32_t r = 0; r < R; r++)
        for (uint32_t b = 0; b < KV_VB_PER_GROUP; b++) {
            out[r][b] = a[r][b];
            kv_vb_add_s(&out[r][b], w->bias[r]);
        }
}

/* acc row r (at acc + r * as) += sum over tokens lo..hi-1 of one group block
 * of p_r[t] * v^_t on the C channel blocks cb0 .. cb0+C-1 (KV_VB_W channels
 * each), for R rows (R, C constants: R * C partial sums in registers, each
 * a chain over the tokens in order); p row r at pr[r], its element 0 =
 * token lo. vs/vm: the group's V scale/min (FP32, [16][D/16]). */
INT_BODY void accum_block(const uint32_t *codes, const float *vs,
                          const float *vm, uint32_t ng, const kv_vbu_t *sh,
                          uint32_t bits, uint32_t lo, uint32_t hi,
                          const float *const *pr, uint32_t R, uint32_t C,
                          uint32_t cb0, float *acc, size_t as)
{
    const uint32_t nw = bits / 2u;
    kv_vb_t a[INT_ROWS][INT_CB];
    INT_UNROLL
    for (uint32_t r = 0; r < R; r++)
        INT_UNROLL
        for (uint32_t k = 0; k < C; k++)
            kv_vb_zero(&a[r][k]);
    for (uint32_t i = lo; i < hi; i++) {
        kv_vb_t x[INT_CB];
        INT_UNROLL
        for (uint32_t k = 0; k < C; k++) {
            const uint32_t cb = cb0 + k, cg = cb / KV_VB_PER_GROUP;
            const uint32_t blk = cb % KV_VB_PER_GROUP;
            const size_t pi = (size_t)i * ng + cg; /* (token, group) */
            dequant(&x[k], codes + pi * nw, 1, blk, &sh[blk], bits, vs[pi],
                    vm[pi]);
        }
        INT_UNROLL
        for (uint32_t r = 0; r < R; r++) {
            const float pv = pr[r][i - lo];
            INT_UNROLL
            for (uint32_t k = 0; k < C; k++)
                kv_vb_fma_s(&a[r][k], pv, &x[k]);
        }
    }
    INT_UNROLL
    for (uint32_t r = 0; r < R; r++)
        INT_UNROLL
        for (uint32_t k = 0; k < C; k++) {
            float *o = acc + r * as + KV_VB_W * (cb0 + k);
            kv_vb_t y;
            kv_vb_ld(&y, o);
            kv_vb_add(&y, &a[r][k]);
            kv_vb_st(o, &y);
        }
}

/* accum_block over all channel blocks of a group block: INT_CB at a time,
 * then single ones. */
INT_BODY void accum_group(const uint32_t *codes, const float *vs,
                          const float *vm, uint32_t d, const kv_vbu_t *sh,
                          uint32_t bits, uint32_t lo, uint32_t hi,
                          const float *p, size_t ps, uint32_t R, float *acc,
                          size_t as)
{
    const uint32_t ng = d / 16u, nb = d / KV_VB_W;
    const float *pr[INT_ROWS];
    INT_UNROLL
    for (uint32_t r = 0; r < R; r++)
        pr[r] = p + r * ps;
    uint32_t cb = 0;
    for (; INT_CB > 1 && cb + INT_CB <= nb; cb += INT_CB)
        accum_block(codes, vs, vm, ng, sh, bits, lo, hi, pr, R, INT_CB, cb,
                    acc, as);
    for (; cb < nb; cb++)
        accum_block(codes, vs, vm, ng, sh, bits, lo, hi, pr, R, 1, cb, acc,
                    as);
}

/* Rows r0 .. r0+nr-1 (nr <= INT_ROWS) of one group: R a constant in each
 * case, so the partial sums stay in registers. */
#define INT_ROW_CASES(call)                                                  \
    switch (nr) {                                                            \
    case 4: call(4u); break;                                                 \
    case 3: call(3u); break;                                                 \
    case 2: call(2u); break;                                                 \
    default: call(1u); break;                                                \
    }

INT_BODY void walk_init(int_walk_t *w, uint32_t bits, uint32_t which,
                        const kv_page_geom_t *g, uint32_t t0, uint32_t n)
{
    w->d = g->head_dim;
    w->bits = bits;
    w->which = which;
    assert((uint64_t)t0 + n <= kv_fmt_int_tpp(w->d, g->page_bytes, bits));
    (void)t0;
    (void)n;
    w->l = kv_fmt_int_layout(w->d, bits);
    for (uint32_t b = 0; b < KV_VB_PER_GROUP; b++)
        kv_vb_shifts(&w->sh[b], bits, b);
}

/* The group of token t of a range ending at `end`: the range's tokens in
 * it, lo..hi-1 (group-relative), its scale/min to w->par, and its code
 * words (K or V) returned. */
INT_BODY const uint32_t *walk_group(int_walk_t *w, const void *page,
                                    uint32_t t, uint32_t end, uint32_t *lo,
                                    uint32_t *hi)
{
    const uint32_t grp = t / KV_FMT_INT_GROUP, g0 = grp * KV_FMT_INT_GROUP;
    *lo = t - g0;
    *hi = end - g0 < KV_FMT_INT_GROUP ? end - g0 : KV_FMT_INT_GROUP;
    const uint8_t *blk = (const uint8_t *)page + (size_t)grp * w->l.group_bytes;
    kv_cpu_half_to_float(
        (const uint16_t *)(const void *)(blk + (w->which ? w->l.v_scale
                                                         : w->l.k_scale)),
        w->par, 2 * (size_t)w->d);
    return (const uint32_t *)(const void *)(blk + (w->which ? w->l.v_codes
                                                            : w->l.k_codes));
}

/* Score: qs = q * scale per channel and bias = sum_c q[c] * min_c (an
 * 8-lane chain over the channels, then kv_v8f_hsum) for nr rows of q. */
INT_BODY void score_prep(int_walk_t *w, const float *q, size_t qs,
                         uint32_t nr)
{
    const uint32_t d = w->d;
    const float *ks = w->par, *km = w->par + d;
    for (uint32_t r = 0; r < nr; r++) {
        const float *qr = q + r * qs;
        kv_v8f b = kv_v8f_set1(0.0f);
        for (uint32_t c = 0; c < d; c += 8) {
            const kv_v8f qv = kv_v8f_ld(qr + c), mv = kv_v8f_ld(km + c);
            const kv_v8f x = qv * kv_v8f_ld(ks + c);
            kv_v8f_st(w->pre + r * d + c, &x);
            kv_v8f_fma(&b, &qv, &mv);
        }
        w->bias[r] = kv_v8f_hsum(&b);
    }
}

INT_BODY void int_score(uint32_t bits, const void *page,
                        const kv_page_geom_t *g, uint32_t t0, uint32_t n,
                        const float *q, size_t q_stride, uint32_t n_rows,
                        float *s, size_t s_stride)
{
    int_walk_t w;
    walk_init(&w, bits, 0, g, t0, n);
    for (uint32_t t = t0, lo, hi; t < t0 + n; t += hi - lo) {
        const uint32_t *codes = walk_group(&w, page, t, t0 + n, &lo, &hi);
        for (uint32_t r0 = 0; r0 < n_rows; r0 += INT_ROWS) {
            const uint32_t nr = n_rows - r0 < INT_ROWS ? n_rows - r0 : INT_ROWS;
            kv_vb_t lg[INT_ROWS][KV_VB_PER_GROUP];
            score_prep(&w, q + r0 * q_stride, q_stride, nr);
#define INT_SCORE(R) score_group(&w, codes, R, lg)
            INT_ROW_CASES(INT_SCORE)
#undef INT_SCORE
            for (uint32_t r = 0; r < nr; r++) {
                float *o = s + (r0 + r) * s_stride + (t - t0);
                if (lo == 0 && hi == KV_FMT_INT_GROUP) {
                    for (uint32_t b = 0; b < KV_VB_PER_GROUP; b++)
                        kv_vb_st(o + b * KV_VB_W, &lg[r][b]);
                } else {
                    float tmp[KV_FMT_INT_GROUP];
                    for (uint32_t b = 0; b < KV_VB_PER_GROUP; b++)
                        kv_vb_st(tmp + b * KV_VB_W, &lg[r][b]);
                    memcpy(o, tmp + lo, (hi - lo) * sizeof *tmp);
                }
            }
        }
    }
}

INT_BODY void int_accum(uint32_t bits, const void *page,
                        const kv_page_geom_t *g, uint32_t t0, uint32_t n,
                        const float *p, size_t p_stride, uint32_t n_rows,
                        float *acc, size_t acc_stride)
{
    int_walk_t w;
    walk_init(&w, bits, 1, g, t0, n);
    const uint32_t d = w.d;
    for (uint32_t t = t0, lo, hi; t < t0 + n; t += hi - lo) {
        const uint32_t *codes = walk_group(&w, page, t, t0 + n, &lo, &hi);
        for (uint32_t r0 = 0; r0 < n_rows; r0 += INT_ROWS) {
            const uint32_t nr = n_rows - r0 < INT_ROWS ? n_rows - r0 : INT_ROWS;
#define INT_ACCUM(R)                                                         \
    accum_group(codes, w.par, w.par + d, d, w.sh, bits, lo, hi,              \
                p + r0 * p_stride + (t - t0), p_stride, R,                   \
                acc + r0 * acc_stride, acc_stride)
            INT_ROW_CASES(INT_ACCUM)
#undef INT_ACCUM
        }
    }
}

/* The entries of this build (kv_cpu.h), bits a constant in each. */
void KV_CPU_SYM(kv_cpu_int4_score)(const void *page, const kv_page_geom_t *g,
                                   uint32_t t0, uint32_t n, const float *q,
                                   size_t qs, uint32_t nr, float *s, size_t ss)
{
    int_score(4u, page, g, t0, n, q, qs, nr, s, ss);
}
void KV_CPU_SYM(kv_cpu_int2_score)(const void *page, const kv_page_geom_t *g,
                                   uint32_t t0, uint32_t n, const float *q,
                                   size_t qs, uint32_t nr, float *s, size_t ss)
{
    int_score(2u, page, g, t0, n, q, qs, nr, s, ss);
}
void KV_CPU_SYM(kv_cpu_int4_accum)(const void *page, const kv_page_geom_t *g,
                                   uint32_t t0, uint32_t n, const float *p,
                                   size_t ps, uint32_t nr, float *acc,
                                   size_t as)
{
    int_accum(4u, page, g, t0, n, p, ps, nr, acc, as);
}
void KV_CPU_SYM(kv_cpu_int2_accum)(const void *page, const kv_page_geom_t *g,
                                   uint32_t t0, uint32_t n, const float *p,
                                   size_t ps, uint32_t nr, float *acc,
                                   size_t as)
{
    int_accum(2u, page, g, t0, n, p, ps, nr, acc, as);
}
