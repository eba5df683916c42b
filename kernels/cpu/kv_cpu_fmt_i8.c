/* SPDX-License-Identifier: MIT */
/*
 * kv_cpu_fmt_i8.c — APPROXIMATE INT4/INT2 attention with 8-bit integer dot
 * products: the score and accum steps of the kernels-side format table
 * (kv_cpu.h) that a store created with KV_CONFIG_INT8_ATTN runs instead of
 * the exact ones (kv_cpu_fmt_int.c). x86 with AVX-512 VNNI and VBMI only
 * (compiled once, with those flags; kv_cpu_isa.c says whether the CPU runs
 * it). Same contract as the exact steps (kv_cpu.h, kv_cpu_score_fn /
 * kv_cpu_accum_fn) except for the rounding below; no allocation, no state;
 * stack about 50 KiB at head_dim 1024 (default thread stacks).
 *
 * Why: the exact steps convert every code to FP32 and multiply-add it once
 * per query row, so INT2 costs about as many instructions per element as
 * FP16 and runs only ~1.3x faster although it reads 4x fewer bytes. Here
 * one vpdpbusd multiplies 64 codes by 64 int8 weights and adds them in
 * fours, and the codes are unpacked 64 at a time (vpermb + vpmultishiftqb +
 * and). The price is one rounding of the FP32 side of each product to
 * 8 bits, as llama.cpp does when it quantizes q to q8 for its quantized K
 * cache.
 *
 * Score (keys: scale s_c and min m_c per channel c of a 16-token group):
 *   q . k^_t = sum_c (q_c s_c) code_ct + sum_c q_c m_c
 *   Per query row and group, a_c = q_c s_c is rounded to int8 with the
 *   row's own step S = max_c |a_c| / 127: a_c ~ S round(a_c / S). The
 *   integer sum over channels is exact (int32), then
 *   logit = S * sum_c round(a_c / S) code_ct + bias (bias in FP32).
 *   Error per logit: at most S/2 * sum_c code_ct (<= S/2 * L * D); one
 *   large |q_c s_c| (an outlier channel) makes S coarse for the rest.
 * Accum (values: scale s_tg and min m_tg per token t and 16-channel group
 *   g): sum_t p_t v^_tc = sum_t (p_t s_tg) code_tc + sum_t p_t m_tg.
 *   Over a window of at most 4 groups (64 tokens) of the call, the weight
 *   w_tg = p_t s_tg is rounded to int8 with the step W_g = pmax * smax_g /
 *   127 (pmax: the row's largest p in the window, smax_g: channel group g's
 *   largest scale in it); int32 sums over the window's tokens, then acc_c
 *   += W_g * sum + sum_t p_t m_tg (FP32). A token whose weight is below
 *   W_g / 2 adds only its min term: attention spread thinly is where this
 *   path differs most from the exact one.
 * The window, groups and rounding depend only on the call's arguments, so
 * the results are deterministic and independent of threads; they differ
 * from kv_read's floats by the roundings above: on SmolLM2 (1K context)
 * the attention output's error against FP16 grows from 0.31 to 0.33 for
 * INT2 (KIVI-2) and from 0.049 to 0.070 for INT4 (docs/results.md). tests/unit/test_attn_i8.c checks every step against
 * a scalar model of this method.
 *
 * Unpacking (layout: formats/kv_fmt_layout.h). vpdpbusd lane i adds 4
 * products of bytes 4i..4i+3. Score: lanes = the group's 16 tokens, bytes =
 * 4 channels; accum: lanes = a channel group's 16 channels, bytes = 4
 * tokens. A byte permute (vpermb / vpermt2b) puts in each 64-bit word the
 * 4 source bytes holding its 2 lanes' codes, vpmultishiftqb moves each code
 * to the bottom of its byte, and a mask clears the rest. The tables below
 * are those permutes, written as formulas of the byte position p.
 */
#include "kv_cpu.h"

/* Only the build with the file's own flags (CMakeLists.txt: kvpage_cpu_i8,
 * x86) has the body; a build of every source with plain flags (the fuzz
 * build) gets none, and nothing calls it there (KV_CPU_X86 unset). */
#if defined(__AVX512BW__) && defined(__AVX512VNNI__) && defined(__AVX512VBMI__)

#include <assert.h>
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#include "formats/kv_fmt_layout.h"

#define I8_BODY static inline __attribute__((always_inline))
#define I8_ROWS 4u        /* query rows per pass (int32 sums in registers) */
#define I8_WIN  4u        /* accum: groups per quantization window         */
#define I8_G    KV_FMT_INT_GROUP
/* Loops over rows, outputs and channel groups are unrolled so that the
 * int32 sums they index stay in registers. */
#define I8_UNROLL _Pragma("GCC unroll 4")

/* ---- unpacking tables: [bits == 4][...][64 bytes] -------------------------
 * Output byte p: 64-bit word i = p/8, its lane s = (p/4)%2, byte j = p%4.
 * Score, output k (channels 4k..4k+3 of a 16-channel block), lane = token
 * t = 2i+s, byte j = channel 4k+j: the code sits in K word plane t/P
 * (P = 32/b codes per word; planes 64 bytes apart in the two permute
 * sources), word 4k+j, byte (t%P)/(8/b), bits b*(t%(8/b)).
 * Accum, output m (channel group m of a 16-byte chunk of each of 4 token
 * rows, rows 16 bytes apart), lane = channel c = 2i+s, byte j = token j:
 * chunk byte 16j + 2b*m + (c*b)/8, bits (c*b)%8. Lanes 2i and 2i+1 share
 * their source byte, so the permute index uses t = 2i (c = 2i). */
#define I8_X8(M, b, k, o)                                                    \
    M(o + 0, b, k), M(o + 1, b, k), M(o + 2, b, k), M(o + 3, b, k),          \
        M(o + 4, b, k), M(o + 5, b, k), M(o + 6, b, k), M(o + 7, b, k)
#define I8_X64(M, b, k)                                                      \
    {I8_X8(M, b, k, 0),  I8_X8(M, b, k, 8),  I8_X8(M, b, k, 16),             \
     I8_X8(M, b, k, 24), I8_X8(M, b, k, 32), I8_X8(M, b, k, 40),             \
     I8_X8(M, b, k, 48), I8_X8(M, b, k, 56)}
#define I8_I(p)  ((p) / 8)
#define I8_S(p)  (((p) / 4) % 2)
#define I8_J(p)  ((p) % 4)
#define I8_KIDX(p, b, k)                                                     \
    (64 * ((2 * I8_I(p)) / (32 / (b))) + 4 * (4 * (k) + I8_J(p)) +           \
     ((2 * I8_I(p)) % (32 / (b))) / (8 / (b)))
#define I8_KCTL(p, b, k)                                                     \
    (8 * I8_J(p) + (b) * ((2 * I8_I(p) + I8_S(p)) % (8 / (b))))
#define I8_VIDX(p, b, m)                                                     \
    ((16 * I8_J(p) + 2 * (b) * (m) + (2 * I8_I(p) * (b)) / 8) % 64)
#define I8_VCTL(p, b, m)                                                     \
    (8 * I8_J(p) + ((2 * I8_I(p) + I8_S(p)) * (b)) % 8)

static const uint8_t k_idx[2][4][64] __attribute__((aligned(64))) = {
    {I8_X64(I8_KIDX, 2, 0), I8_X64(I8_KIDX, 2, 1), I8_X64(I8_KIDX, 2, 2),
     I8_X64(I8_KIDX, 2, 3)},
    {I8_X64(I8_KIDX, 4, 0), I8_X64(I8_KIDX, 4, 1), I8_X64(I8_KIDX, 4, 2),
     I8_X64(I8_KIDX, 4, 3)},
};
static const uint8_t k_ctl[2][64] __attribute__((aligned(64))) = {
    I8_X64(I8_KCTL, 2, 0), I8_X64(I8_KCTL, 4, 0)};
/* INT4 chunks hold 2 channel groups (outputs 2, 3 unused). */
static const uint8_t v_idx[2][4][64] __attribute__((aligned(64))) = {
    {I8_X64(I8_VIDX, 2, 0), I8_X64(I8_VIDX, 2, 1), I8_X64(I8_VIDX, 2, 2),
     I8_X64(I8_VIDX, 2, 3)},
    {I8_X64(I8_VIDX, 4, 0), I8_X64(I8_VIDX, 4, 1), I8_X64(I8_VIDX, 4, 0),
     I8_X64(I8_VIDX, 4, 1)},
};
static const uint8_t v_ctl[2][64] __attribute__((aligned(64))) = {
    I8_X64(I8_VCTL, 2, 0), I8_X64(I8_VCTL, 4, 0)};

/* The codes of x moved to the bottom of their bytes (ctl), the rest
 * cleared (mask). */
I8_BODY __m512i i8_extract(__m512i x, __m512i ctl, __m512i mask)
{
    return _mm512_and_si512(_mm512_multishift_epi64_epi8(ctl, x), mask);
}

/* 16 binary16 values at h to FP32. */
I8_BODY __m512 i8_h16(const uint16_t *h)
{
    return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(const void *)h));
}

/* Broadcast of the 4 bytes at p. */
I8_BODY __m512i i8_b4(const int8_t *p)
{
    int32_t v;
    memcpy(&v, p, sizeof v);
    return _mm512_set1_epi32(v);
}

/* {sum a, sum b, sum c, sum d} (max: the maxima instead). */
I8_BODY __m128 i8_red4(__m512 a, __m512 b, __m512 c, __m512 d, int max)
{
#define I8_OP(x, y) (max ? _mm512_max_ps(x, y) : _mm512_add_ps(x, y))
    const __m512 ab = I8_OP(_mm512_unpacklo_ps(a, b), _mm512_unpackhi_ps(a, b));
    const __m512 cd = I8_OP(_mm512_unpacklo_ps(c, d), _mm512_unpackhi_ps(c, d));
    /* per 128-bit lane: {a, b, c, d} partials */
    __m512 x = I8_OP(_mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(ab),
                                                         _mm512_castps_pd(cd))),
                     _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(ab),
                                                         _mm512_castps_pd(cd))));
    x = I8_OP(x, _mm512_shuffle_f32x4(x, x, _MM_SHUFFLE(1, 0, 3, 2)));
    x = I8_OP(x, _mm512_shuffle_f32x4(x, x, _MM_SHUFFLE(2, 3, 0, 1)));
#undef I8_OP
    return _mm512_castps512_ps128(x);
}

/* Lanes lo..hi-1 of a 16-lane vector. */
I8_BODY __mmask16 i8_lanes(uint32_t lo, uint32_t hi)
{
    return (__mmask16)(((1u << hi) - 1u) & ~((1u << lo) - 1u));
}

/* ---- score ---------------------------------------------------------------- */

/* R rows of q for one group (scale sc, min mn: FP32 [d]): qi[r] =
 * round(q_r * sc / S_r) as int8, step[r] = S_r = max_c |q_r * sc| / 127
 * (0: all products 0), bias[r] = sum_c q_r * mn. */
I8_BODY void score_prep(const float *q, size_t qs, uint32_t R,
                        const float *sc, const float *mn, uint32_t d,
                        int8_t qi[][KV_FMT_MAX_DIM], float *step, float *bias)
{
    __m512 mx[I8_ROWS], b[I8_ROWS];
    I8_UNROLL
    for (uint32_t r = 0; r < I8_ROWS; r++)
        mx[r] = b[r] = _mm512_setzero_ps();
    for (uint32_t c = 0; c < d; c += 16) {
        const __m512 s = _mm512_loadu_ps(sc + c), m = _mm512_loadu_ps(mn + c);
        I8_UNROLL
        for (uint32_t r = 0; r < R; r++) {
            const __m512 qv = _mm512_loadu_ps(q + r * qs + c);
            mx[r] = _mm512_max_ps(mx[r], _mm512_abs_ps(_mm512_mul_ps(qv, s)));
            b[r] = _mm512_fmadd_ps(qv, m, b[r]);
        }
    }
    float mv[4];
    _mm_storeu_ps(mv, i8_red4(mx[0], mx[1], mx[2], mx[3], 1));
    _mm_storeu_ps(bias, i8_red4(b[0], b[1], b[2], b[3], 0));
    __m512 inv[I8_ROWS];
    I8_UNROLL
    for (uint32_t r = 0; r < R; r++) {
        inv[r] = _mm512_set1_ps(mv[r] > 0.0f ? 127.0f / mv[r] : 0.0f);
        step[r] = mv[r] / 127.0f;
    }
    for (uint32_t c = 0; c < d; c += 16) {
        const __m512 s = _mm512_loadu_ps(sc + c);
        I8_UNROLL
        for (uint32_t r = 0; r < R; r++) {
            const __m512 a = _mm512_mul_ps(_mm512_loadu_ps(q + r * qs + c), s);
            _mm_storeu_si128((__m128i *)(void *)(qi[r] + c),
                             _mm512_cvtepi32_epi8(_mm512_cvtps_epi32(_mm512_mul_ps(a, inv[r]))));
        }
    }
}

/* Logits of R rows for the 16 tokens of one group (codes: its K words):
 * out[r] lane t = S_r * sum_c qi_r[c] code_ct + bias_r. */
I8_BODY void score_dots(const uint32_t *codes, uint32_t d, uint32_t bits,
                        int8_t qi[][KV_FMT_MAX_DIM], uint32_t R,
                        const float *step, const float *bias, __m512 *out)
{
    const uint32_t bi = bits == 4u;
    const __m512i ctl = _mm512_load_si512(k_ctl[bi]);
    const __m512i mask = _mm512_set1_epi8((char)((1u << bits) - 1u));
    __m512i a[I8_ROWS][2];
    I8_UNROLL
    for (uint32_t r = 0; r < R; r++)
        a[r][0] = a[r][1] = _mm512_setzero_si512();
    for (uint32_t c = 0; c < d; c += 16) {
        const __m512i w0 = _mm512_loadu_si512(codes + c);
        const __m512i w1 = bits == 4u ? _mm512_loadu_si512(codes + d + c) : w0;
        I8_UNROLL
        for (uint32_t k = 0; k < 4; k++) {
            const __m512i idx = _mm512_load_si512(k_idx[bi][k]);
            const __m512i x = i8_extract(
                bits == 4u ? _mm512_permutex2var_epi8(w0, idx, w1)
                           : _mm512_permutexvar_epi8(idx, w0),
                ctl, mask);
            I8_UNROLL
            for (uint32_t r = 0; r < R; r++)
                a[r][k & 1] = _mm512_dpbusd_epi32(a[r][k & 1], x,
                                                  i8_b4(qi[r] + c + 4 * k));
        }
    }
    I8_UNROLL
    for (uint32_t r = 0; r < R; r++)
        out[r] = _mm512_fmadd_ps(
            _mm512_cvtepi32_ps(_mm512_add_epi32(a[r][0], a[r][1])),
            _mm512_set1_ps(step[r]), _mm512_set1_ps(bias[r]));
}

I8_BODY void i8_score(uint32_t bits, const void *page, const kv_page_geom_t *g,
                     uint32_t t0, uint32_t n, const float *q, size_t q_stride,
                     uint32_t n_rows, float *s, size_t s_stride)
{
    const uint32_t d = g->head_dim;
    assert((uint64_t)t0 + n <= kv_fmt_int_tpp(d, g->page_bytes, bits));
    const kv_fmt_int_layout_t l = kv_fmt_int_layout(d, bits);
    float par[2 * KV_FMT_MAX_DIM] __attribute__((aligned(64)));
    int8_t qi[I8_ROWS][KV_FMT_MAX_DIM] __attribute__((aligned(64)));
    for (uint32_t t = t0; t < t0 + n;) {
        const uint32_t grp = t / I8_G, g0 = grp * I8_G, lo = t - g0;
        const uint32_t hi = t0 + n - g0 < I8_G ? t0 + n - g0 : I8_G;
        const uint8_t *blk = (const uint8_t *)page + (size_t)grp * l.group_bytes;
        const uint16_t *h = (const uint16_t *)(const void *)(blk + l.k_scale);
        for (uint32_t c = 0; c < (l.v_scale - l.k_scale) / 2u; c += 16) /* K scale, K min */
            _mm512_store_ps(par + c, i8_h16(h + c));
        const uint32_t *codes = (const uint32_t *)(const void *)(blk + l.k_codes);
        for (uint32_t r0 = 0; r0 < n_rows; r0 += I8_ROWS) {
            const uint32_t nr = n_rows - r0 < I8_ROWS ? n_rows - r0 : I8_ROWS;
            float step[I8_ROWS], bias[I8_ROWS];
            __m512 lg[I8_ROWS];
            const float *qr = q + r0 * q_stride;
#define I8_SCORE(R)                                                          \
    score_prep(qr, q_stride, R, par, par + d, d, qi, step, bias);            \
    score_dots(codes, d, bits, qi, R, step, bias, lg)
            switch (nr) { /* R a constant in each: sums stay in registers */
            case 4: I8_SCORE(4); break;
            case 3: I8_SCORE(3); break;
            case 2: I8_SCORE(2); break;
            default: I8_SCORE(1); break;
            }
#undef I8_SCORE
            for (uint32_t r = 0; r < nr; r++) {
                float *o = s + (r0 + r) * s_stride + (t - t0);
                if (lo == 0 && hi == I8_G) {
                    _mm512_storeu_ps(o, lg[r]);
                } else {
                    float tmp[I8_G];
                    _mm512_storeu_ps(tmp, lg[r]);
                    memcpy(o, tmp + lo, (hi - lo) * sizeof *tmp);
                }
            }
        }
        t = g0 + hi;
    }
}

/* ---- accum ---------------------------------------------------------------- */

/* The V parameters of a window: per group i and channel group c, the 16
 * tokens' scale (then, once smax is known, scale * 127 / smax_c) and min
 * as FP32 vectors (lanes outside the call's range 0), and smax_c. */
typedef struct i8_vwin {
    uint32_t n;                       /* groups in the window, 1..I8_WIN    */
    uint32_t grp0;                    /* its first group                    */
    uint32_t lo[I8_WIN], hi[I8_WIN];  /* tokens of the range in group i     */
    float smax[KV_FMT_MAX_DIM / 16 + 4]; /* + 4: written 4 at a time */
    float sc[I8_WIN][KV_FMT_MAX_DIM] __attribute__((aligned(64)));
    float mn[I8_WIN][KV_FMT_MAX_DIM] __attribute__((aligned(64)));
} i8_vwin_t;

/* The 16 tokens x 4 channel groups c0..c0+3 of a [16][ng] binary16 array
 * (ng a multiple of 4) transposed to FP32 [4][16] at out, lanes outside k 0:
 * the 16 x 4 halves gathered token-major into 128 bytes, then one
 * two-source word permute per pair of channel groups. */
I8_BODY void vwin_t4(const uint16_t *h, uint32_t ng, uint32_t c0, __mmask16 k,
                     float *out)
{
    __m512i z0, z1;
    if (ng == 4u) {
        z0 = _mm512_loadu_si512(h);
        z1 = _mm512_loadu_si512(h + 32);
    } else { /* 8 bytes at h + t * ng + c0 for each token t */
        const int64_t st = 2 * (int64_t)ng; /* bytes per token */
        const __m512i off = _mm512_set_epi64(7 * st, 6 * st, 5 * st, 4 * st,
                                             3 * st, 2 * st, st, 0);
        const uint16_t *b = h + c0;
        z0 = _mm512_i64gather_epi64(off, (const void *)b, 1);
        z1 = _mm512_i64gather_epi64(off, (const void *)(b + 8 * (size_t)ng), 1);
    }
    for (uint32_t j = 0; j < 2; j++) {
        /* lane 16m + t = half 4t + 2j + m */
        const __m512i idx = _mm512_add_epi16(
            _mm512_set_epi16(61, 57, 53, 49, 45, 41, 37, 33, 29, 25, 21, 17, 13, 9, 5, 1,
                             60, 56, 52, 48, 44, 40, 36, 32, 28, 24, 20, 16, 12, 8, 4, 0),
            _mm512_set1_epi16((short)(2 * j)));
        const __m512i x = _mm512_permutex2var_epi16(z0, idx, z1);
        _mm512_store_ps(out + 32 * j,
                        _mm512_maskz_mov_ps(k, _mm512_cvtph_ps(_mm512_castsi512_si256(x))));
        _mm512_store_ps(out + 32 * j + 16,
                        _mm512_maskz_mov_ps(k, _mm512_cvtph_ps(_mm512_extracti64x4_epi64(x, 1))));
    }
}

/* w->sc[i] and w->mn[i] for group i of the window: the [16][ng] binary16
 * arrays of the page transposed to [ng][16] FP32, lanes outside lo..hi 0. */
I8_BODY void vwin_group(i8_vwin_t *w, const uint8_t *blk,
                        const kv_fmt_int_layout_t *l, uint32_t ng, uint32_t i)
{
    const uint16_t *hs = (const uint16_t *)(const void *)(blk + l->v_scale);
    const uint16_t *hm = (const uint16_t *)(const void *)(blk + l->v_min);
    const __mmask16 k = i8_lanes(w->lo[i], w->hi[i]);
    if (ng % 4u == 0) {
        for (uint32_t c = 0; c < ng; c += 4) {
            vwin_t4(hs, ng, c, k, w->sc[i] + 16 * c);
            vwin_t4(hm, ng, c, k, w->mn[i] + 16 * c);
        }
        return;
    }
    uint16_t ts[I8_G], tm[I8_G]; /* head_dim not a multiple of 64 */
    for (uint32_t c = 0; c < ng; c++) {
        for (uint32_t t = 0; t < I8_G; t++) {
            ts[t] = hs[t * ng + c];
            tm[t] = hm[t * ng + c];
        }
        _mm512_store_ps(w->sc[i] + 16 * c, _mm512_maskz_mov_ps(k, i8_h16(ts)));
        _mm512_store_ps(w->mn[i] + 16 * c, _mm512_maskz_mov_ps(k, i8_h16(tm)));
    }
}

/* Int8 weights of R rows over the window: wq[r][i][16c + t] = round(p_t
 * s_tc / W_rc), W_rc = pmax_r * smax_c / 127 (to wstep[r][c]); the min term
 * sum_t p_t m_tc to wbias[r][c]. p row r at pr[r], its element 0 = the
 * window's first token (token lo[0] of group 0). */
I8_BODY void accum_weights(const i8_vwin_t *w, uint32_t ng,
                           const float *const *pr, uint32_t R,
                           int8_t (*wq)[I8_WIN][KV_FMT_MAX_DIM],
                           float (*wstep)[KV_FMT_MAX_DIM / 16],
                           float (*wbias)[KV_FMT_MAX_DIM / 16])
{
    I8_UNROLL
    for (uint32_t r = 0; r < R; r++) {
        __m512 p[I8_WIN], mx = _mm512_setzero_ps();
        for (uint32_t i = 0, off = 0; i < w->n; off += w->hi[i] - w->lo[i], i++) {
            if (w->lo[i] == 0 && w->hi[i] == I8_G) {
                p[i] = _mm512_loadu_ps(pr[r] + off);
            } else {
                float tmp[I8_G] = {0};
                memcpy(tmp + w->lo[i], pr[r] + off,
                       (w->hi[i] - w->lo[i]) * sizeof *tmp);
                p[i] = _mm512_loadu_ps(tmp);
            }
            mx = _mm512_max_ps(mx, p[i]);
        }
        const float pmax = _mm512_reduce_max_ps(mx);
        const __m512 inv = _mm512_set1_ps(pmax > 0.0f ? 1.0f / pmax : 0.0f);
        for (uint32_t i = 0; i < w->n; i++)
            p[i] = _mm512_mul_ps(p[i], inv); /* p / pmax */
        for (uint32_t c0 = 0; c0 < ng; c0 += 4) {
            __m512 b[4];
            I8_UNROLL
            for (uint32_t m = 0; m < 4; m++) {
                const uint32_t c = c0 + m;
                b[m] = _mm512_setzero_ps();
                if (c >= ng)
                    continue;
                for (uint32_t i = 0; i < w->n; i++) {
                    const __m512 x = _mm512_mul_ps(p[i], _mm512_load_ps(w->sc[i] + 16 * c));
                    _mm_storeu_si128((__m128i *)(void *)(wq[r][i] + 16 * c),
                                     _mm512_cvtepi32_epi8(_mm512_cvtps_epi32(x)));
                    b[m] = _mm512_fmadd_ps(p[i], _mm512_load_ps(w->mn[i] + 16 * c), b[m]);
                }
                wstep[r][c] = pmax * w->smax[c] * (1.0f / 127.0f);
            }
            float bs[4];
            _mm_storeu_ps(bs, i8_red4(b[0], b[1], b[2], b[3], 0));
            for (uint32_t m = 0; m < 4 && c0 + m < ng; m++)
                wbias[r][c0 + m] = bs[m] * pmax; /* b summed p / pmax */
        }
    }
}

/* acc row r (at acc + r * as) += the window's sum for R rows, channel
 * groups c0 .. c0+nc-1 (nc <= 8/bits, the 16-byte chunk's groups; all
 * 8/bits are computed, wq being 0 past the last group). */
I8_BODY void accum_dots(const i8_vwin_t *w, const uint8_t *page,
                        const kv_fmt_int_layout_t *l, uint32_t ng,
                        uint32_t bits, uint32_t c0, uint32_t nc, uint32_t R,
                        int8_t (*wq)[I8_WIN][KV_FMT_MAX_DIM],
                        float (*wstep)[KV_FMT_MAX_DIM / 16],
                        float (*wbias)[KV_FMT_MAX_DIM / 16], float *acc,
                        size_t as)
{
    const uint32_t bi = bits == 4u, row = 2u * bits * ng; /* bytes/token */
    const __m512i ctl = _mm512_load_si512(v_ctl[bi]);
    const __m512i mask = _mm512_set1_epi8((char)((1u << bits) - 1u));
    const uint32_t NC = 8u / bits;
    __m512i a[I8_ROWS][4];
    I8_UNROLL
    for (uint32_t r = 0; r < R; r++)
        I8_UNROLL
        for (uint32_t m = 0; m < NC; m++)
            a[r][m] = _mm512_setzero_si512();
    for (uint32_t i = 0; i < w->n; i++) {
        const uint8_t *vc = page + (size_t)(w->grp0 + i) * l->group_bytes +
                            l->v_codes + 2u * bits * c0;
        for (uint32_t t = 0; t < I8_G; t += 4) { /* 4 token rows */
            const uint8_t *rw = vc + (size_t)t * row;
            __m512i ch;
            if (row == 16u) {
                ch = _mm512_loadu_si512(rw);
            } else {
                ch = _mm512_castsi128_si512(_mm_loadu_si128((const __m128i *)(const void *)rw));
                ch = _mm512_inserti32x4(ch, _mm_loadu_si128((const __m128i *)(const void *)(rw + row)), 1);
                ch = _mm512_inserti32x4(ch, _mm_loadu_si128((const __m128i *)(const void *)(rw + 2 * row)), 2);
                ch = _mm512_inserti32x4(ch, _mm_loadu_si128((const __m128i *)(const void *)(rw + 3 * row)), 3);
            }
            I8_UNROLL
            for (uint32_t m = 0; m < NC; m++) {
                const __m512i x = i8_extract(
                    _mm512_permutexvar_epi8(_mm512_load_si512(v_idx[bi][m]), ch),
                    ctl, mask);
                I8_UNROLL
                for (uint32_t r = 0; r < R; r++)
                    a[r][m] = _mm512_dpbusd_epi32(
                        a[r][m], x, i8_b4(wq[r][i] + 16 * (c0 + m) + t));
            }
        }
    }
    I8_UNROLL
    for (uint32_t r = 0; r < R; r++)
        for (uint32_t m = 0; m < nc; m++) {
            float *o = acc + r * as + 16 * (c0 + m);
            const __m512 y = _mm512_add_ps(_mm512_loadu_ps(o),
                                           _mm512_set1_ps(wbias[r][c0 + m]));
            _mm512_storeu_ps(o, _mm512_fmadd_ps(_mm512_cvtepi32_ps(a[r][m]),
                                                _mm512_set1_ps(wstep[r][c0 + m]),
                                                y));
        }
}

/* The window's rows r0 .. r0+R-1. */
I8_BODY void accum_rows(const i8_vwin_t *w, const uint8_t *page,
                        const kv_fmt_int_layout_t *l, uint32_t ng,
                        uint32_t bits, const float *const *pr, uint32_t R,
                        float *acc, size_t as)
{
    int8_t wq[I8_ROWS][I8_WIN][KV_FMT_MAX_DIM] __attribute__((aligned(64)));
    float wstep[I8_ROWS][KV_FMT_MAX_DIM / 16], wbias[I8_ROWS][KV_FMT_MAX_DIM / 16];
    accum_weights(w, ng, pr, R, wq, wstep, wbias);
    const uint32_t per = 8u / bits; /* channel groups per 16-byte chunk */
    const uint32_t pad = (ng + per - 1) / per * per;
    for (uint32_t r = 0; r < R && pad > ng; r++)
        for (uint32_t i = 0; i < w->n; i++)
            memset(wq[r][i] + 16 * ng, 0, 16 * (pad - ng));
    for (uint32_t c0 = 0; c0 < ng; c0 += per) {
        const uint32_t nc = ng - c0 < per ? ng - c0 : per;
        accum_dots(w, page, l, ng, bits, c0, nc, R, wq, wstep, wbias, acc, as);
    }
}

I8_BODY void i8_accum(uint32_t bits, const void *page, const kv_page_geom_t *g,
                     uint32_t t0, uint32_t n, const float *p, size_t p_stride,
                     uint32_t n_rows, float *acc, size_t acc_stride)
{
    const uint32_t d = g->head_dim, ng = d / 16u;
    assert((uint64_t)t0 + n <= kv_fmt_int_tpp(d, g->page_bytes, bits));
    const kv_fmt_int_layout_t l = kv_fmt_int_layout(d, bits);
    i8_vwin_t w;
    for (uint32_t t = t0; t < t0 + n;) {
        /* the window: up to I8_WIN groups from t's */
        const uint32_t wt = t;
        w.grp0 = t / I8_G;
        w.n = 0;
        while (t < t0 + n && w.n < I8_WIN) {
            const uint32_t g0 = (w.grp0 + w.n) * I8_G;
            w.lo[w.n] = t - g0;
            w.hi[w.n] = t0 + n - g0 < I8_G ? t0 + n - g0 : I8_G;
            vwin_group(&w, (const uint8_t *)page + (size_t)(w.grp0 + w.n) * l.group_bytes,
                       &l, ng, w.n);
            t = g0 + w.hi[w.n];
            w.n++;
        }
        for (uint32_t c0 = 0; c0 < ng; c0 += 4) {
            __m512 mx[4];
            I8_UNROLL
            for (uint32_t m = 0; m < 4; m++) {
                mx[m] = _mm512_setzero_ps();
                for (uint32_t i = 0; c0 + m < ng && i < w.n; i++)
                    mx[m] = _mm512_max_ps(mx[m], _mm512_abs_ps(_mm512_load_ps(
                                                     w.sc[i] + 16 * (c0 + m))));
            }
            _mm_storeu_ps(w.smax + c0, i8_red4(mx[0], mx[1], mx[2], mx[3], 1));
        }
        for (uint32_t c = 0; c < ng; c++) {
            const float sm = w.smax[c];
            const __m512 k = _mm512_set1_ps(sm > 0.0f ? 127.0f / sm : 0.0f);
            for (uint32_t i = 0; i < w.n; i++)
                _mm512_store_ps(w.sc[i] + 16 * c,
                                _mm512_mul_ps(_mm512_load_ps(w.sc[i] + 16 * c), k));
        }
        for (uint32_t r0 = 0; r0 < n_rows; r0 += I8_ROWS) {
            const uint32_t nr = n_rows - r0 < I8_ROWS ? n_rows - r0 : I8_ROWS;
            const float *pr[I8_ROWS];
            for (uint32_t r = 0; r < nr; r++)
                pr[r] = p + (r0 + r) * p_stride + (wt - t0);
            float *ar = acc + r0 * acc_stride;
            switch (nr) {
            case 4: accum_rows(&w, page, &l, ng, bits, pr, 4, ar, acc_stride); break;
            case 3: accum_rows(&w, page, &l, ng, bits, pr, 3, ar, acc_stride); break;
            case 2: accum_rows(&w, page, &l, ng, bits, pr, 2, ar, acc_stride); break;
            default: accum_rows(&w, page, &l, ng, bits, pr, 1, ar, acc_stride); break;
            }
        }
    }
}

/* ---- the entries (kv_cpu.h) ----------------------------------------------- */

void kv_cpu_i8_int4_score(const void *page, const kv_page_geom_t *g,
                          uint32_t t0, uint32_t n, const float *q, size_t qs,
                          uint32_t nr, float *s, size_t ss)
{
    i8_score(4u, page, g, t0, n, q, qs, nr, s, ss);
}
void kv_cpu_i8_int2_score(const void *page, const kv_page_geom_t *g,
                          uint32_t t0, uint32_t n, const float *q, size_t qs,
                          uint32_t nr, float *s, size_t ss)
{
    i8_score(2u, page, g, t0, n, q, qs, nr, s, ss);
}
void kv_cpu_i8_int4_accum(const void *page, const kv_page_geom_t *g,
                          uint32_t t0, uint32_t n, const float *p, size_t ps,
                          uint32_t nr, float *acc, size_t as)
{
    i8_accum(4u, page, g, t0, n, p, ps, nr, acc, as);
}
void kv_cpu_i8_int2_accum(const void *page, const kv_page_geom_t *g,
                          uint32_t t0, uint32_t n, const float *p, size_t ps,
                          uint32_t nr, float *acc, size_t as)
{
    i8_accum(2u, page, g, t0, n, p, ps, nr, acc, as);
}

#else
typedef int kv_cpu_fmt_i8_unbuilt_t; /* ISO C: no empty translation unit */
#endif
