/* SPDX-License-Identifier: MIT */
/*
 * test_attn_codes.c — attention computed straight from INT4/INT2 codes (the
 * score / accum steps of the CPU kernels' format table,
 * kernels/cpu/kv_cpu_fmt_int.c) and the attention loop's use of them
 * (kernels/cpu/kv_cpu_attend.c).
 *
 * Step level, for INT4 and INT2, head_dim 16, 64 and 128, pages with
 * constant and wide groups: every token range (whole page, inside one
 * group, across group edges, single tokens) and 1..9 query rows (blocks of
 * four rows and their remainders) with row strides wider than the data:
 *   - score against q . k over the rows the format's load decodes (the
 *     per-token path), summed in double: |error| <= 1e-5 * sum |q_c k_c|;
 *   - accum (adds to acc) likewise: |error| <= 1e-5 * (|acc| +
 *     sum |p_i v_ic|);
 *   - nothing outside the rows / tokens / channels asked for is written;
 *   - every build the CPU runs (portable, AVX2, AVX-512) gives the same bits;
 *   - attention sees the bits kv_read sees: score with a one-hot query row
 *     (q = e_c) gives exactly channel c of the rows the format's load
 *     decodes, and accum with one-hot probabilities (p = e_i, acc = 0)
 *     exactly token i's decoded V row, in every build (one INT
 *     dequantization, kv_fmt_codec_dequant).
 * Kernel level (CPU backend), lists mixing FP16, INT4 and INT2 pages with
 * partly used pages and groups, each case with and without shapes: decode
 * (GQA groups of 1, 3, 4 and 5 query heads, so that row blocks of four have
 * every remainder; split-K partitions that start inside 16-token groups) and
 * causal prefill whose new rows lie inside INT pages (rows see different
 * prefixes of one chunk), with statistics: every output row within 1e-3
 * (norm-wise relative) of dense attention in double over the decoded values,
 * statistics per token within 1e-3 relative, their total == q rows counted,
 * entries past a list untouched. The kernels' format table, in every build:
 * INT4/INT2 are read as codes (both steps), FP16 and MERGED as rows.
 * Pages, lists, calls and their checks: the shared fixture kv_test_kern.h.
 */
#include <string.h>

#include "formats/kv_fmt_int.h"
#include "kernels/cpu/kv_cpu.h"
#include "kv_test.h"
#include "kv_test_kern.h"

/* ---- the traits table ------------------------------------------------ */

static void test_table(void)
{
    uint32_t nb = 0;
    const kv_cpu_loops_t *const *b = kv_cpu_builds(&nb);
    CHECK(nb >= 1 && strcmp(b[0]->isa, "portable") == 0);
    for (uint32_t i = 0; i < nb; i++)
        for (uint32_t f = 0; f < KV_FMT_COUNT; f++) {
            const kv_cpu_fmt_ops_t *o = &b[i]->fmt[f];
            const int codes = f == KV_FMT_INT4 || f == KV_FMT_INT2;
            CHECK_EQ(o->read, codes ? KV_CPU_READ_CODES : KV_CPU_READ_ROWS);
            CHECK((o->score != NULL) == codes && (o->accum != NULL) == codes);
            CHECK((o->load != NULL) == !codes);
        }
    printf("attention builds usable: %u, best %s\n", nb, b[nb - 1]->isa);
}

/* ---- the two steps against the per-token path --------------------------- */

typedef struct step_errs {
    double score, accum;   /* worst error / bound                         */
    long outside;          /* writes outside the rows/tokens/channels     */
    long builds_differ;    /* results of a build != the best build's      */
} step_errs_t;

/* *worst = max(*worst, |got - ref| / (1e-5 * mag)), ref = base + sum_j x_j y_j
 * and mag = |base| + sum_j |x_j y_j| in double (j < m; x, y strided). */
static void worse(float got, double base, const float *x, size_t xs,
                  const float *y, size_t ys, uint32_t m, double *worst)
{
    double ref = base, mag = fabs(base) + 1e-30;
    for (uint32_t j = 0; j < m; j++) {
        double t = (double)x[j * xs] * y[j * ys];
        ref += t;
        mag += fabs(t);
    }
    double err = isfinite(got) ? fabs(got - ref) / (1e-5 * mag) : INFINITY;
    *worst = err > *worst ? err : *worst;
}

/* Score and accumulate tokens [t0, t0+n) of one page for nr rows with every
 * build; checks against the decoded rows kd, vd ([T][d]). */
static void check_range(uint32_t fmt, const kv_page_geom_t *g,
                        const void *page, const float *kd, const float *vd,
                        uint32_t t0, uint32_t n, uint32_t nr, uint64_t *s,
                        step_errs_t *e)
{
    const uint32_t d = g->head_dim, qs = d + 5, ss = n + 3, as = d + 7;
    float *q = kv_test_xcalloc((size_t)nr * qs, sizeof *q);
    float *p = kv_test_xcalloc((size_t)nr * ss, sizeof *p);
    float *acc0 = kv_test_xcalloc((size_t)nr * as, sizeof *acc0);
    for (size_t j = 0; j < (size_t)nr * qs; j++)
        q[j] = kv_test_randf(s);
    for (size_t j = 0; j < (size_t)nr * ss; j++) /* some exact zeros */
        p[j] = j % 3 == 1 ? 0.0f : 0.5f + 0.5f * kv_test_randf(s);
    for (size_t j = 0; j < (size_t)nr * as; j++)
        acc0[j] = kv_test_randf(s);
    uint32_t ni = 0;
    const kv_cpu_loops_t *const *im = kv_cpu_builds(&ni);
    /* [ni] results, one extra row each to catch writes past n_rows */
    float *sc = kv_test_xcalloc((size_t)ni * (nr + 1) * ss, sizeof *sc);
    float *ac = kv_test_xcalloc((size_t)ni * (nr + 1) * as, sizeof *ac);
    for (uint32_t b = 0; b < ni; b++) {
        float *sb = sc + (size_t)b * (nr + 1) * ss;
        float *ab = ac + (size_t)b * (nr + 1) * as;
        for (size_t j = 0; j < (size_t)(nr + 1) * ss; j++)
            sb[j] = KV_TEST_SENTINEL;
        for (size_t j = 0; j < (size_t)(nr + 1) * as; j++)
            ab[j] = j < (size_t)nr * as && j % as < d ? acc0[j]
                                                      : KV_TEST_SENTINEL;
        im[b]->fmt[fmt].score(page, g, t0, n, q, qs, nr, sb, ss);
        im[b]->fmt[fmt].accum(page, g, t0, n, p, ss, nr, ab, as);
    }
    const float *sbest = sc + (size_t)(ni - 1) * (nr + 1) * ss;
    const float *abest = ac + (size_t)(ni - 1) * (nr + 1) * as;
    for (uint32_t b = 0; b + 1 < ni; b++) {
        e->builds_differ +=
            memcmp(sc + (size_t)b * (nr + 1) * ss, sbest,
                   (size_t)(nr + 1) * ss * sizeof *sc) != 0;
        e->builds_differ +=
            memcmp(ac + (size_t)b * (nr + 1) * as, abest,
                   (size_t)(nr + 1) * as * sizeof *ac) != 0;
    }
    for (uint32_t r = 0; r <= nr; r++) {
        for (uint32_t i = 0; i < ss; i++) {
            float got = sbest[(size_t)r * ss + i];
            if (r == nr || i >= n)
                e->outside += got != KV_TEST_SENTINEL;
            else /* q_r . k_(t0+i) */
                worse(got, 0.0, q + (size_t)r * qs, 1,
                      kd + (size_t)(t0 + i) * d, 1, d, &e->score);
        }
        for (uint32_t c = 0; c < as; c++) {
            float got = abest[(size_t)r * as + c];
            if (r == nr || c >= d)
                e->outside += got != KV_TEST_SENTINEL;
            else /* acc0 + sum_i p_r[i] v_(t0+i)[c] */
                worse(got, acc0[(size_t)r * as + c], p + (size_t)r * ss, 1,
                      vd + (size_t)t0 * d + c, d, n, &e->accum);
        }
    }
    free(q);
    free(p);
    free(acc0);
    free(sc);
    free(ac);
}

static void test_steps(uint32_t fmt, uint32_t d, uint64_t seed)
{
    uint64_t s = seed;
    const uint32_t bits = fmt == KV_FMT_INT2 ? 2 : 4;
    /* 3 groups and change: the page holds 48 tokens */
    kv_page_geom_t g = {.head_dim = d,
                        .page_bytes = 3 * KV_FMT_INT_GROUP_BYTES(d, bits) +
                                      100};
    const uint32_t T = kv_test_traits(fmt)->tokens_per_page(&g);
    CHECK_EQ(T, 48);
    float *kd = kv_test_xcalloc((size_t)T * d, sizeof *kd);
    float *vd = kv_test_xcalloc((size_t)T * d, sizeof *vd);
    void *page =
        kv_test_make_page(fmt, 0, &g, T, 4.0f, 1, &s, kd, vd, NULL, NULL);
    static const uint32_t ranges[][2] = {
        {0, 48}, {0, 1}, {5, 1}, {3, 13}, {15, 2}, {16, 16},
        {7, 41}, {47, 1}, {17, 30}, {31, 2}, {0, 16}, {9, 7},
    };
    static const uint32_t rows[] = {1, 2, 3, 4, 5, 8, 9};
    step_errs_t e = {0};
    for (size_t i = 0; i < sizeof ranges / sizeof ranges[0]; i++)
        for (size_t j = 0; j < sizeof rows / sizeof rows[0]; j++)
            check_range(fmt, &g, page, kd, vd, ranges[i][0], ranges[i][1],
                        rows[j], &s, &e);
    if (e.score > 1 || e.accum > 1 || e.outside || e.builds_differ)
        fprintf(stderr,
                "steps %s d=%u: score err/bound %.3g, accum err/bound %.3g, "
                "outside %ld, builds differ %ld\n",
                kv_test_traits(fmt)->name, d, e.score, e.accum, e.outside,
                e.builds_differ);
    CHECK(e.score <= 1.0);
    CHECK(e.accum <= 1.0);
    CHECK_EQ(e.outside, 0);
    CHECK_EQ(e.builds_differ, 0);
    free(page);
    free(kd);
    free(vd);
}

/* Score with q = e_c gives k^_t[c], accum with p = e_i (acc 0) gives v^_i,
 * bit for bit, for every token and channel of the page and every build:
 * the steps dequantize as the format's load does. */
static void test_same_bits(uint32_t fmt, uint32_t d, uint64_t seed)
{
    uint64_t s = seed;
    const uint32_t bits = fmt == KV_FMT_INT2 ? 2 : 4;
    kv_page_geom_t g = {.head_dim = d,
                        .page_bytes = 2 * KV_FMT_INT_GROUP_BYTES(d, bits)};
    const uint32_t T = kv_test_traits(fmt)->tokens_per_page(&g);
    float *kd = kv_test_xcalloc((size_t)T * d, sizeof *kd);
    float *vd = kv_test_xcalloc((size_t)T * d, sizeof *vd);
    void *page =
        kv_test_make_page(fmt, 0, &g, T, 4.0f, 1, &s, kd, vd, NULL, NULL);
    float *q = kv_test_xcalloc((size_t)d * d, sizeof *q);     /* [d][d] */
    float *sc = kv_test_xcalloc((size_t)d * T, sizeof *sc);   /* [d][T] */
    float *p = kv_test_xcalloc((size_t)T * T, sizeof *p);     /* [T][T] */
    float *ac = kv_test_xcalloc((size_t)T * d, sizeof *ac);   /* [T][d] */
    for (uint32_t c = 0; c < d; c++)
        q[(size_t)c * d + c] = 1.0f;
    for (uint32_t i = 0; i < T; i++)
        p[(size_t)i * T + i] = 1.0f;
    uint32_t ni = 0;
    const kv_cpu_loops_t *const *im = kv_cpu_builds(&ni);
    long differ = 0;
    for (uint32_t b = 0; b < ni; b++) {
        memset(ac, 0, (size_t)T * d * sizeof *ac);
        im[b]->fmt[fmt].score(page, &g, 0, T, q, d, d, sc, T);
        im[b]->fmt[fmt].accum(page, &g, 0, T, p, T, T, ac, d);
        for (uint32_t t = 0; t < T; t++)
            for (uint32_t c = 0; c < d; c++) {
                const float ks = sc[(size_t)c * T + t] + 0.0f;
                const float kl = kd[(size_t)t * d + c] + 0.0f;
                const float va = ac[(size_t)t * d + c] + 0.0f;
                const float vl = vd[(size_t)t * d + c] + 0.0f;
                differ += memcmp(&ks, &kl, sizeof ks) != 0;
                differ += memcmp(&va, &vl, sizeof va) != 0;
            }
    }
    if (differ)
        fprintf(stderr, "same bits %s d=%u: %ld elements differ\n",
                kv_test_traits(fmt)->name, d, differ);
    CHECK_EQ(differ, 0);
    free(page);
    free(kd);
    free(vd);
    free(q);
    free(sc);
    free(p);
    free(ac);
}

/* ---- the backend over mixed lists ------------------------------------ */

typedef struct acase {
    const char *name;
    uint32_t nq, nkv, d, page_bytes;
    const uint32_t *lens; /* decode: [nkv] (batch 1); prefill: [nkv] */
    const char *fmts;
    int ragged;
    uint32_t part;        /* decode: partition_tokens (0 = default)      */
    uint32_t n_new, row0; /* prefill: new rows, first counted for stats  */
} acase_t;

static kv_backend_t be;

/* Page j of list i has format fmts[(j + i) % strlen(fmts)] (digits '0'
 * FP16, '1' INT4, '2' INT2), with `shapes` data with shapes on odd pages
 * and, when ragged, a random fill (INT pages then often end inside a group);
 * K scaled by 4, q by 2. Every case runs with and without shapes: their 100x
 * wide K tokens take nearly all the softmax weight, so that with shapes alone
 * the other tokens hardly count (a kernel dropping each span's last token
 * passed 6 of the 10 cases); without, every token does. */
static kv_test_layout_t layout(const acase_t *c, int shapes)
{
    return (kv_test_layout_t){
        .d = c->d, .page_bytes = c->page_bytes, .lens = c->lens,
        .fmts = c->fmts, .by_list = 1, .ragged = c->ragged, .shapes = shapes,
        .kscale = 4};
}

static void run_decode(const acase_t *c, int shapes, uint64_t seed)
{
    const kv_test_layout_t lo = layout(c, shapes);
    char name[64];
    snprintf(name, sizeof name, "%s%s", c->name, shapes ? "+shapes" : "");
    const kv_test_decode_t run = {.name = name, .batch = 1, .nq = c->nq,
                                  .nkv = c->nkv, .part = c->part,
                                  .stats_mask = 0x1, .qscale = 2};
    kv_test_run_decode(&be, 1, &lo, &run, seed);
}

static void run_prefill(const acase_t *c, int shapes, uint64_t seed)
{
    const kv_test_layout_t lo = layout(c, shapes);
    char name[64];
    snprintf(name, sizeof name, "%s%s", c->name, shapes ? "+shapes" : "");
    const kv_test_prefill_t run = {.name = name, .nq = c->nq,
                                   .nkv = c->nkv, .n_new = c->n_new,
                                   .row0 = c->row0, .stats = 1, .qscale = 2};
    kv_test_run_prefill(&be, 1, &lo, &run, seed);
}

static void test_backend(void)
{
    static const uint32_t l3[] = {700, 333, 1001}, l1[] = {777};
    static const uint32_t l2[] = {250, 190}, l4[] = {640, 47, 300, 129};
    const acase_t dec[] = {
        /* name, nq, nkv, d, page, lens, fmts, ragged, part */
        {"gqa9/3-int2", 9, 3, 64, 4096, l3, "2", 0, 0, 0, 0},
        {"gqa9/3-mixed", 9, 3, 64, 4096, l3, "0212", 1, 0, 0, 0},
        {"gqa8/2-part40", 8, 2, 64, 4096, l2, "12", 1, 40, 0, 0},
        {"gqa5/1-part17", 5, 1, 64, 4096, l1, "21", 1, 17, 0, 0},
        {"mha4/4-d128", 4, 4, 128, 8192, l4, "201", 1, 0, 0, 0},
        {"gqa9/3-d128", 9, 3, 128, 8192, l3, "1", 0, 100, 0, 0},
    };
    for (int shapes = 0; shapes <= 1; shapes++)
        for (size_t i = 0; i < sizeof dec / sizeof dec[0]; i++)
            run_decode(&dec[i], shapes, 500 + i);
    static const uint32_t p3[] = {400, 257, 330}, p1[] = {300};
    const acase_t pre[] = {
        /* the new rows' tokens lie in INT pages: rows of one chunk see
         * different prefixes of it */
        {"int2-rows-in-chunk", 9, 3, 64, 4096, p3, "2", 0, 0, 70, 0},
        {"mixed-ragged", 9, 3, 64, 4096, p3, "0212", 1, 0, 150, 40},
        {"gqa5/1-int4", 5, 1, 64, 4096, p1, "1", 1, 0, 33, 32},
        {"d128-gqa8/2", 8, 2, 128, 8192, l2, "21", 1, 0, 45, 0},
    };
    for (int shapes = 0; shapes <= 1; shapes++)
        for (size_t i = 0; i < sizeof pre / sizeof pre[0]; i++)
            run_prefill(&pre[i], shapes, 600 + i);
}

int main(void)
{
    if (kv_backend_cpu_create(2, 0, &be)) {
        fprintf(stderr, "cannot create the CPU backend\n");
        return 1;
    }
    test_table();
    static const uint32_t dims[] = {16, 64, 128};
    for (size_t i = 0; i < sizeof dims / sizeof dims[0]; i++) {
        test_steps(KV_FMT_INT4, dims[i], 100 + i);
        test_steps(KV_FMT_INT2, dims[i], 200 + i);
        test_same_bits(KV_FMT_INT4, dims[i], 300 + i);
        test_same_bits(KV_FMT_INT2, dims[i], 400 + i);
    }
    test_backend();
    kv_backend_destroy(&be);
    return kv_test_end();
}
