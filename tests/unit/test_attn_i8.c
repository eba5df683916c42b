/* SPDX-License-Identifier: MIT */
/*
 * test_attn_i8.c — the approximate int8 INT attention steps
 * (kernels/cpu/kv_cpu_fmt_i8.c) and KV_CONFIG_INT8_ATTN.
 *
 * Everywhere: unknown backend flags are KV_EINVAL; on a CPU without AVX-512
 * VNNI + VBMI the flag is KV_ENOTSUP for the backend and for
 * kv_store_create, and the rest is skipped (exit 77).
 * Step level, INT4 and INT2, head_dim 16..192 (every path of the V
 * parameter transpose: 4 channel groups, multiples of 4, others), pages
 * with constant and wide groups, token ranges inside a group, across group
 * edges, over more than one 4-group window, single tokens; 1..9 rows with
 * strides wider than the data, probability rows that are all 0 or have
 * zeros: each result against a scalar model of the method written here
 * from the page layout (formats/kv_fmt_layout.h) and the rounding rules of
 * the file's header: the same int8 values (the same FP32 products,
 * rounded to nearest even), integer sums, then FP32 within 1e-5 relative
 * of the model in double. So a wrong unpacking table, window or scale
 * fails. Nothing outside the rows / tokens / channels asked for is
 * written.
 * Store level (public API, 3 kv heads x 3 query heads, head_dim 64): INT2
 * and INT4 lists read with the flag give decode and prefill outputs within
 * 0.15 (INT2) / 0.1 (INT4) norm-wise of the exact path's, bit-identical
 * for 1 and 2 threads; FP16 lists give the exact path's bits.
 */
#include <math.h>
#include <string.h>

#include "formats/kv_fmt_int.h"
#include "kernels/cpu/kv_cpu.h"
#include "kv_test.h"
#include "kv_test_kern.h"

/* ---- the model of the method -------------------------------------------- */

/* Code of (token t, channel c) of the 16-token group at blk: K (v 0) or V. */
static uint32_t code_at(const uint8_t *blk, const kv_fmt_int_layout_t *l,
                        uint32_t d, uint32_t bits, int v, uint32_t t,
                        uint32_t c)
{
    const uint32_t P = 32u / bits;
    const uint32_t *w =
        (const uint32_t *)(const void *)(blk + (v ? l->v_codes : l->k_codes));
    uint32_t word, j;
    if (!v) {
        word = (t / P) * d + c;
        j = t % P;
    } else {
        word = (t * (d / 16u) + c / 16u) * (bits / 2u) + (c % 16u) / P;
        j = (c % 16u) % P;
    }
    return (w[word] >> (bits * j)) & ((1u << bits) - 1u);
}

static float half_at(const uint8_t *blk, uint32_t off, uint32_t i)
{
    uint16_t h;
    memcpy(&h, blk + off + 2u * i, sizeof h);
    return kv_half_to_float(h);
}

/* out[r * n + i] (double) for tokens t0 + i, rows r < nr: per group and
 * row, a_c = q_c * s_c, S = max |a_c| / 127, round(a_c / S) as the int8,
 * then S * sum + sum_c q_c * m_c; mag the magnitude the error is relative
 * to. */
static void model_score(const uint8_t *page, const kv_page_geom_t *g,
                        uint32_t bits, uint32_t t0, uint32_t n,
                        const float *q, size_t qs, uint32_t nr, double *out,
                        double *mag)
{
    const uint32_t d = g->head_dim;
    const kv_fmt_int_layout_t l = kv_fmt_int_layout(d, bits);
    for (uint32_t r = 0; r < nr; r++)
        for (uint32_t i = 0; i < n; i++) {
            const uint32_t t = t0 + i, grp = t / 16u;
            const uint8_t *blk = page + (size_t)grp * l.group_bytes;
            const float *qr = q + r * qs;
            float m = 0.0f;
            for (uint32_t c = 0; c < d; c++) {
                const float a = fabsf(qr[c] * half_at(blk, l.k_scale, c));
                m = a > m ? a : m;
            }
            const float inv = m > 0.0f ? 127.0f / m : 0.0f, S = m / 127.0f;
            long dot = 0;
            double bias = 0, bmag = 0;
            for (uint32_t c = 0; c < d; c++) {
                const float a = qr[c] * half_at(blk, l.k_scale, c);
                dot += (long)nearbyintf(a * inv) *
                       (long)code_at(blk, &l, d, bits, 0, t % 16u, c);
                bias += (double)qr[c] * half_at(blk, l.k_min, c);
                bmag += fabs((double)qr[c] * half_at(blk, l.k_min, c));
            }
            out[r * n + i] = (double)S * (double)dot + bias;
            mag[r * n + i] = fabs((double)S * (double)dot) + bmag;
        }
}

/* acc[r * as + c] += the model's sum (double out[r * d + c] = the added
 * part, mag its magnitude): windows of up to 4 groups from t0's; per
 * channel group smax = max |scale| over the window's tokens, per row
 * pmax = max p; w = round((p / pmax) * (s * 127 / smax)); W = pmax * smax
 * / 127; W * sum_t w code + sum_t p m. */
static void model_accum(const uint8_t *page, const kv_page_geom_t *g,
                        uint32_t bits, uint32_t t0, uint32_t n,
                        const float *p, size_t ps, uint32_t nr, double *out,
                        double *mag)
{
    const uint32_t d = g->head_dim, ng = d / 16u;
    const kv_fmt_int_layout_t l = kv_fmt_int_layout(d, bits);
    memset(out, 0, (size_t)nr * d * sizeof *out);
    memset(mag, 0, (size_t)nr * d * sizeof *mag);
    for (uint32_t w0 = t0; w0 < t0 + n;) {
        const uint32_t g0 = w0 / 16u;
        uint32_t w1 = (g0 + 4u) * 16u; /* window: tokens w0 .. w1-1 */
        w1 = w1 < t0 + n ? w1 : t0 + n;
        for (uint32_t cg = 0; cg < ng; cg++) {
            float smax = 0.0f;
            for (uint32_t t = w0; t < w1; t++) {
                const uint8_t *blk = page + (size_t)(t / 16u) * l.group_bytes;
                const float s = fabsf(half_at(blk, l.v_scale, (t % 16u) * ng + cg));
                smax = s > smax ? s : smax;
            }
            const float k = smax > 0.0f ? 127.0f / smax : 0.0f;
            for (uint32_t r = 0; r < nr; r++) {
                const float *pr = p + r * ps + (w0 - t0);
                float pmax = 0.0f;
                for (uint32_t t = w0; t < w1; t++)
                    pmax = pr[t - w0] > pmax ? pr[t - w0] : pmax;
                const float inv = pmax > 0.0f ? 1.0f / pmax : 0.0f;
                const float W = pmax * smax * (1.0f / 127.0f);
                for (uint32_t j = 0; j < 16; j++) {
                    const uint32_t c = 16u * cg + j;
                    long dot = 0;
                    double bias = 0, bmag = 0;
                    for (uint32_t t = w0; t < w1; t++) {
                        const uint8_t *blk = page + (size_t)(t / 16u) * l.group_bytes;
                        const uint32_t pi = (t % 16u) * ng + cg;
                        const float pn = pr[t - w0] * inv;
                        const float x = pn * (half_at(blk, l.v_scale, pi) * k);
                        dot += (long)nearbyintf(x) *
                               (long)code_at(blk, &l, d, bits, 1, t % 16u, c);
                        bias += (double)pr[t - w0] * half_at(blk, l.v_min, pi);
                        bmag += fabs((double)pr[t - w0] * half_at(blk, l.v_min, pi));
                    }
                    out[r * d + c] += (double)W * (double)dot + bias;
                    mag[r * d + c] += fabs((double)W * (double)dot) + bmag;
                }
            }
        }
        w0 = w1;
    }
}

/* ---- the steps against the model ------------------------------------------- */

#define CANARY (-12345.0f)

static void check_steps(uint32_t bits, uint32_t d, uint64_t *rs)
{
    const uint32_t fmt = bits == 4u ? KV_FMT_INT4 : KV_FMT_INT2;
    const kv_page_geom_t g = {.head_dim = d, .page_bytes = 24u * d * 16u};
    const uint32_t T = kv_fmt_int_tpp(d, g.page_bytes, bits);
    const kv_cpu_score_fn score = bits == 4u ? kv_cpu_i8_int4_score
                                             : kv_cpu_i8_int2_score;
    const kv_cpu_accum_fn accum = bits == 4u ? kv_cpu_i8_int4_accum
                                             : kv_cpu_i8_int2_accum;
    float *kd = kv_test_xcalloc((size_t)T * d, sizeof *kd);
    float *vd = kv_test_xcalloc((size_t)T * d, sizeof *vd);
    uint8_t *page = kv_test_make_page(fmt, 0, &g, T, 3.0f, 1, rs, kd, vd,
                                      NULL, NULL);
    /* ranges: whole page, inside a group, across one edge, single tokens,
     * more than one window from inside a group */
    const uint32_t ranges[][2] = {{0, T},  {3, 9},      {13, 7}, {16, 1},
                                  {T - 1, 1}, {5, T - 11}, {31, 70}};
    const uint32_t MR = 9, QS = d + 5, PS = T + 3, AS = d + 7;
    float *q = kv_test_xcalloc((size_t)MR * QS, sizeof *q);
    float *p = kv_test_xcalloc((size_t)MR * PS, sizeof *p);
    float *s = kv_test_xcalloc((size_t)MR * PS, sizeof *s);
    float *acc = kv_test_xcalloc((size_t)MR * AS, sizeof *acc);
    double *ref = kv_test_xcalloc((size_t)MR * (T > d ? T : d), sizeof *ref);
    double *mag = kv_test_xcalloc((size_t)MR * (T > d ? T : d), sizeof *mag);
    long bad = 0, outside = 0;
    for (size_t x = 0; x < sizeof ranges / sizeof ranges[0]; x++) {
        const uint32_t t0 = ranges[x][0], n = ranges[x][1];
        if (t0 + n > T || n == 0)
            continue;
        for (uint32_t nr = 1; nr <= MR; nr += nr < 5 ? 1 : 4) {
            for (uint32_t i = 0; i < MR * QS; i++)
                q[i] = kv_test_randf(rs);
            for (uint32_t i = 0; i < MR * PS; i++) {
                const float u = 0.5f * (kv_test_randf(rs) + 1.0f);
                p[i] = i % 7 == 2 ? 0.0f : u * u * u; /* zeros, small ones */
            }
            if (nr > 2) /* a row that sees nothing */
                memset(p + PS, 0, PS * sizeof *p);
            for (uint32_t i = 0; i < MR * PS; i++)
                s[i] = CANARY;
            score(page, &g, t0, n, q, QS, nr, s, PS);
            model_score(page, &g, bits, t0, n, q, QS, nr, ref, mag);
            for (uint32_t r = 0; r < MR; r++)
                for (uint32_t i = 0; i < PS; i++) {
                    const float got = s[r * PS + i];
                    if (r >= nr || i >= n) {
                        outside += got != CANARY;
                        continue;
                    }
                    const double e = fabs(got - ref[r * n + i]);
                    if (!(e <= 1e-5 * mag[r * n + i] + 1e-6)) {
                        if (bad++ < 5)
                            fprintf(stderr, "score b%u d%u [%u,+%u) rows %u: r%u t%u %g vs %g\n",
                                    bits, d, t0, n, nr, r, i, got, ref[r * n + i]);
                    }
                }
            for (uint32_t i = 0; i < MR * AS; i++)
                acc[i] = i % AS < d ? 0.25f * kv_test_randf(rs) : CANARY;
            float *acc0 = kv_test_xcalloc((size_t)MR * AS, sizeof *acc0);
            memcpy(acc0, acc, (size_t)MR * AS * sizeof *acc);
            accum(page, &g, t0, n, p, PS, nr, acc, AS);
            model_accum(page, &g, bits, t0, n, p, PS, nr, ref, mag);
            for (uint32_t r = 0; r < MR; r++)
                for (uint32_t c = 0; c < AS; c++) {
                    const float got = acc[r * AS + c];
                    if (r >= nr || c >= d) {
                        outside += memcmp(&got, &acc0[r * AS + c], sizeof got) != 0;
                        continue;
                    }
                    const double want = acc0[r * AS + c] + ref[r * d + c];
                    const double e = fabs(got - want);
                    if (!(e <= 1e-5 * (mag[r * d + c] + fabs(want)) + 1e-6)) {
                        if (bad++ < 5)
                            fprintf(stderr, "accum b%u d%u [%u,+%u) rows %u: r%u c%u %g vs %g\n",
                                    bits, d, t0, n, nr, r, c, got, want);
                    }
                }
            free(acc0);
        }
    }
    CHECK_EQ(bad, 0);
    CHECK_EQ(outside, 0);
    free(q), free(p), free(s), free(acc), free(ref), free(mag);
    free(kd), free(vd), free(page);
}

/* ---- through the store ------------------------------------------------------- */

#define SH_Q 9u
#define SH_KV 3u
#define SH_D 64u

static kv_store_t *make_store(uint32_t fmt, uint32_t flags, uint32_t threads)
{
    kv_config_t c = kv_config_default();
    c.n_layers = 1, c.n_q_heads = SH_Q, c.n_kv_heads = SH_KV, c.head_dim = SH_D;
    c.host_pages = 512, c.n_threads = threads, c.flags = flags;
    c.kv_format = fmt, c.residual = 16;
    kv_store_t *st = NULL;
    CHECK_OK(kv_store_create(&c, &st));
    return st;
}

/* ||a - b|| / ||b|| */
static double rel(const float *a, const float *b, size_t n)
{
    double e = 0, m = 0;
    for (size_t i = 0; i < n; i++) {
        e += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
        m += (double)b[i] * b[i];
    }
    return sqrt(e / (m > 0 ? m : 1));
}

/* decode and prefill over ctx tokens of format fmt: with the flag (1 and
 * 2 threads: identical bits) against without. */
static void check_store(uint32_t fmt, uint32_t ctx, double tol, uint64_t *rs)
{
    kv_store_t *st[3] = {make_store(fmt, 0, 2),
                         make_store(fmt, KV_CONFIG_INT8_ATTN, 1),
                         make_store(fmt, KV_CONFIG_INT8_ATTN, 2)};
    const size_t kn = (size_t)ctx * SH_KV * SH_D, nn = 40;
    float *k = kv_test_xcalloc(kn, sizeof *k), *v = kv_test_xcalloc(kn, sizeof *v);
    for (size_t i = 0; i < kn; i++) {
        k[i] = 2.0f * kv_test_randf(rs) + (i % SH_D == 7 ? 6.0f : 0.0f);
        v[i] = kv_test_randf(rs);
    }
    float *q = kv_test_xcalloc(nn * SH_Q * SH_D, sizeof *q);
    for (size_t i = 0; i < nn * SH_Q * SH_D; i++)
        q[i] = kv_test_randf(rs);
    float *out[3];
    kv_seq_id_t seq[3];
    for (int j = 0; j < 3; j++) {
        out[j] = kv_test_xcalloc(nn * SH_Q * SH_D, sizeof *out[j]);
        CHECK_OK(kv_seq_create(st[j], &seq[j]));
        CHECK_OK(kv_append(st[j], seq[j], 0, ctx, KV_DTYPE_F32, k, v, NULL));
        kv_decode_t dq = {.layer = 0, .batch = 1, .seqs = &seq[j], .q = q, .out = out[j]};
        CHECK_OK(kv_attn_decode(st[j], &dq));
    }
    const size_t on = SH_Q * SH_D;
    const double e_dec = rel(out[1], out[0], on);
    CHECK(memcmp(out[1], out[2], on * sizeof *out[1]) == 0);
    if (fmt == KV_FMT_FP16)
        CHECK(memcmp(out[1], out[0], on * sizeof *out[1]) == 0);
    else
        CHECK(e_dec > 0 && e_dec <= tol);
    for (int j = 0; j < 3; j++) {
        kv_prefill_t pf = {.layer = 0, .seq = seq[j], .n_new = (uint32_t)nn, .q = q,
                           .out = out[j]};
        CHECK_OK(kv_attn_prefill(st[j], &pf));
    }
    const double e_pre = rel(out[1], out[0], nn * on);
    CHECK(memcmp(out[1], out[2], nn * on * sizeof *out[1]) == 0);
    if (fmt == KV_FMT_FP16)
        CHECK(memcmp(out[1], out[0], nn * on * sizeof *out[1]) == 0);
    else
        CHECK(e_pre > 0 && e_pre <= tol);
    printf("store %s ctx %u: int8 vs exact, decode %.4f prefill %.4f (norm-wise)\n",
           kv_format_note((kv_format_t)fmt), ctx, e_dec, e_pre);
    for (int j = 0; j < 3; j++) {
        free(out[j]);
        kv_store_destroy(st[j]);
    }
    free(k), free(v), free(q);
}

int main(void)
{
    kv_backend_t be;
    CHECK(kv_backend_cpu_create(1, 0x2u, &be) == KV_EINVAL);
    if (!kv_cpu_has_i8()) {
        CHECK(kv_backend_cpu_create(1, KV_BACKEND_INT8, &be) == KV_ENOTSUP);
        kv_config_t c = kv_config_default();
        c.n_layers = 1, c.n_q_heads = 1, c.n_kv_heads = 1, c.head_dim = 64;
        c.host_pages = 8, c.flags = KV_CONFIG_INT8_ATTN;
        kv_store_t *st = NULL;
        CHECK(kv_store_create(&c, &st) == KV_ENOTSUP && st == NULL);
        if (kv_test_end())
            return 1;
        KV_TEST_SKIP("this CPU lacks AVX-512 VNNI + VBMI (KV_ENOTSUP checked)");
    }
    CHECK_OK(kv_backend_cpu_create(1, KV_BACKEND_INT8, &be));
    kv_backend_destroy(&be);
    uint64_t rs = 0x1d8;
    static const uint32_t dims[] = {16, 32, 48, 64, 128, 192};
    for (uint32_t b = 2; b <= 4; b += 2)
        for (size_t i = 0; i < sizeof dims / sizeof dims[0]; i++)
            check_steps(b, dims[i], &rs);
    check_store(KV_FMT_INT2, 700, 0.15, &rs);
    check_store(KV_FMT_INT4, 700, 0.10, &rs);
    check_store(KV_FMT_FP16, 300, 0.0, &rs);
    return kv_test_end();
}
