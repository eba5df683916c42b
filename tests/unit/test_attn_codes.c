/*
 * test_attn_codes.c — attention computed straight from INT4/INT2 codes (the
 * traits' attn_score / attn_accum, fmt_int.c) and the attention loop's use
 * of them (kernels/cpu/kv_cpu_attend.c).
 *
 * Step level, for INT4 and INT2, head_dim 16, 64 and 128, pages with
 * constant and wide groups: every token range (whole page, inside one
 * group, across group edges, single tokens) and 1..9 query rows (blocks of
 * four rows and their remainders) with row strides wider than the data:
 *   - attn_score against q . k over the rows the format's load decodes (the
 *     per-token path), summed in double: |error| <= 1e-5 * sum |q_c k_c|;
 *   - attn_accum (adds to acc) likewise: |error| <= 1e-5 * (|acc| +
 *     sum |p_i v_ic|);
 *   - nothing outside the rows / tokens / channels asked for is written;
 *   - every build the CPU runs (portable, AVX2, AVX-512) gives the same bits.
 * Kernel level (CPU backend), lists mixing FP16, INT4 and INT2 pages with
 * partly used pages and groups: decode (GQA groups of 1, 3, 4 and 5 query
 * heads, so that row blocks of four have every remainder; split-K partitions
 * that start inside 16-token groups) and causal prefill whose new rows lie
 * inside INT pages (rows see different prefixes of one chunk), with
 * statistics: every output row within 1e-3 (norm-wise relative) of dense
 * attention in double over the decoded values, statistics per token within
 * 1e-3 relative, their total == q rows counted, entries past a list
 * untouched. The traits table: INT4/INT2 have both steps, FP16 and MERGED
 * neither (never both a step and load_variant).
 */
#include <string.h>

#include "kernels/kv_backend.h"
#include "kv_test.h"
#include "kv_test_attn.h"
#include "pages/fmt_fp16.h"
#include "pages/fmt_int.h"

#define SENTINEL 12345.0f

static void *xcalloc(size_t n, size_t sz)
{
    void *p = calloc(n ? n : 1, sz ? sz : 1);
    if (!p) {
        fprintf(stderr, "out of memory\n");
        exit(2);
    }
    return p;
}

static const kv_format_traits_t *traits_of(uint32_t fmt)
{
    return fmt == KV_FMT_INT2   ? &kv_fmt_int2
           : fmt == KV_FMT_INT4 ? &kv_fmt_int4
                                : &kv_fmt_fp16;
}

/* Random FP16 values for ns tokens (K and V rows [ns][d]); with `shapes`,
 * some 16-token K channel runs and V channel groups are constant and some
 * tokens are 100x wider, so that constant groups (scale 0) and wide ones
 * both occur. */
static void fill_kv(float *k, float *v, uint32_t ns, uint32_t d, int shapes,
                    uint64_t *s)
{
    for (uint32_t t = 0; t < ns; t++) {
        float wide = shapes && t % 16 == 5 ? 100.0f : 1.0f;
        for (uint32_t c = 0; c < d; c++) {
            float kx = 4.0f * kv_test_randf(s) * wide;
            float vx = kv_test_randf(s) * wide;
            if (shapes && c % 7 == 3) /* constant K channel in the group */
                kx = (float)(c % 5) - 2.0f;
            if (shapes && (c / 16 + t) % 5 == 0) /* constant V group */
                vx = 0.5f * (float)(t % 3);
            k[(size_t)t * d + c] = kv_half_to_float(kv_half_from_float(kx));
            v[(size_t)t * d + c] = kv_half_to_float(kv_half_from_float(vx));
        }
    }
}

/* A page of format fmt holding n tokens (INT: whole groups stored, the
 * last one partly used when n % 16); kd, vd: its rows as load decodes them
 * ([n][d]). Unused page bytes are 0xff (NaN halfs). */
static void *make_page(uint32_t fmt, const kv_page_geom_t *g, uint32_t n,
                       int shapes, uint64_t *s, float *kd, float *vd)
{
    const kv_format_traits_t *tr = traits_of(fmt);
    const uint32_t d = g->head_dim;
    uint32_t ns = fmt == KV_FMT_FP16 ? n : (n + 15) / 16 * 16;
    float *k = xcalloc((size_t)ns * d, sizeof *k);
    float *v = xcalloc((size_t)ns * d, sizeof *v);
    fill_kv(k, v, ns, d, shapes, s);
    void *page = xcalloc(g->page_bytes, 1);
    memset(page, 0xff, g->page_bytes);
    tr->store(page, g, 0, ns, KV_DTYPE_F32, k, v, d);
    tr->load(page, g, 0, n, kd, vd);
    free(k);
    free(v);
    return page;
}

/* ---- the traits table ------------------------------------------------ */

static void test_table(void)
{
    for (uint32_t f = 0; f < KV_FMT_COUNT; f++) {
        const kv_format_traits_t *e = kv_format_get(f);
        if (!e)
            continue;
        CHECK((e->attn_score == NULL) == (e->attn_accum == NULL));
        CHECK(!(e->attn_score && e->load_variant));
    }
    CHECK(kv_format_get(KV_FMT_INT4)->attn_score == kv_fmt_int4_attn_score);
    CHECK(kv_format_get(KV_FMT_INT4)->attn_accum == kv_fmt_int4_attn_accum);
    CHECK(kv_format_get(KV_FMT_INT2)->attn_score == kv_fmt_int2_attn_score);
    CHECK(kv_format_get(KV_FMT_INT2)->attn_accum == kv_fmt_int2_attn_accum);
    CHECK(kv_format_get(KV_FMT_FP16)->attn_score == NULL);
    CHECK(kv_format_get(KV_FMT_MERGED)->attn_score == NULL);
    uint32_t ni = 0;
    const kv_fmt_int_attn_impl_t *im = kv_fmt_int_attn_impls(&ni);
    CHECK(ni >= 1 && strcmp(im[0].isa, "portable") == 0);
    printf("attn from codes: %u builds usable, best %s\n", ni,
           im[ni - 1].isa);
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
    const uint32_t fi = fmt == KV_FMT_INT2; /* impl index: [0] INT4 */
    float *q = xcalloc((size_t)nr * qs, sizeof *q);
    float *p = xcalloc((size_t)nr * ss, sizeof *p);
    float *acc0 = xcalloc((size_t)nr * as, sizeof *acc0);
    for (size_t j = 0; j < (size_t)nr * qs; j++)
        q[j] = kv_test_randf(s);
    for (size_t j = 0; j < (size_t)nr * ss; j++) /* some exact zeros */
        p[j] = j % 3 == 1 ? 0.0f : 0.5f + 0.5f * kv_test_randf(s);
    for (size_t j = 0; j < (size_t)nr * as; j++)
        acc0[j] = kv_test_randf(s);
    uint32_t ni = 0;
    const kv_fmt_int_attn_impl_t *im = kv_fmt_int_attn_impls(&ni);
    /* [ni] results, one extra row each to catch writes past n_rows */
    float *sc = xcalloc((size_t)ni * (nr + 1) * ss, sizeof *sc);
    float *ac = xcalloc((size_t)ni * (nr + 1) * as, sizeof *ac);
    for (uint32_t b = 0; b < ni; b++) {
        float *sb = sc + (size_t)b * (nr + 1) * ss;
        float *ab = ac + (size_t)b * (nr + 1) * as;
        for (size_t j = 0; j < (size_t)(nr + 1) * ss; j++)
            sb[j] = SENTINEL;
        for (size_t j = 0; j < (size_t)(nr + 1) * as; j++)
            ab[j] = j < (size_t)nr * as && j % as < d ? acc0[j] : SENTINEL;
        im[b].score[fi](page, g, t0, n, q, qs, nr, sb, ss);
        im[b].accum[fi](page, g, t0, n, p, ss, nr, ab, as);
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
                e->outside += got != SENTINEL;
            else /* q_r . k_(t0+i) */
                worse(got, 0.0, q + (size_t)r * qs, 1,
                      kd + (size_t)(t0 + i) * d, 1, d, &e->score);
        }
        for (uint32_t c = 0; c < as; c++) {
            float got = abest[(size_t)r * as + c];
            if (r == nr || c >= d)
                e->outside += got != SENTINEL;
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
    const uint32_t T = traits_of(fmt)->tokens_per_page(&g);
    CHECK_EQ(T, 48);
    float *kd = xcalloc((size_t)T * d, sizeof *kd);
    float *vd = xcalloc((size_t)T * d, sizeof *vd);
    void *page = make_page(fmt, &g, T, 1, &s, kd, vd);
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
                traits_of(fmt)->name, d, e.score, e.accum, e.outside,
                e.builds_differ);
    CHECK(e.score <= 1.0);
    CHECK(e.accum <= 1.0);
    CHECK_EQ(e.outside, 0);
    CHECK_EQ(e.builds_differ, 0);
    free(page);
    free(kd);
    free(vd);
}

/* ---- the backend over mixed lists ------------------------------------ */

/* Page lists with the decoded values of each list ([len][d]). */
typedef struct lists {
    kv_page_geom_t geom;
    uint32_t n;
    uint32_t *indptr, *len;
    kv_kern_page_t *pages;
    float **k, **v;
    uint32_t by_fmt[3]; /* pages per format */
} lists_t;

/* n lists of lens[i] tokens; page j of a list has format fmts[j % nf]
 * (digits '0' FP16, '1' INT4, '2' INT2) and, when ragged, a random fill
 * (INT pages then often end inside a group). */
static void lists_build(lists_t *L, uint32_t d, uint32_t page_bytes,
                        uint32_t n, const uint32_t *lens, const char *fmts,
                        int ragged, uint64_t *s)
{
    memset(L, 0, sizeof *L);
    L->geom = (kv_page_geom_t){.head_dim = d, .page_bytes = page_bytes};
    L->n = n;
    size_t maxp = 0;
    for (uint32_t i = 0; i < n; i++)
        maxp += lens[i];
    L->indptr = xcalloc(n + 1, sizeof *L->indptr);
    L->len = xcalloc(n, sizeof *L->len);
    L->pages = xcalloc(maxp, sizeof *L->pages);
    L->k = xcalloc(n, sizeof *L->k);
    L->v = xcalloc(n, sizeof *L->v);
    const size_t nf = strlen(fmts);
    uint32_t np = 0;
    for (uint32_t i = 0; i < n; i++) {
        L->indptr[i] = np;
        L->len[i] = lens[i];
        L->k[i] = xcalloc((size_t)lens[i] * d, sizeof(float));
        L->v[i] = xcalloc((size_t)lens[i] * d, sizeof(float));
        for (uint32_t t = 0, j = 0; t < lens[i]; j++) {
            uint32_t fmt = (uint32_t)(fmts[(j + i) % nf] - '0');
            uint32_t T = traits_of(fmt)->tokens_per_page(&L->geom);
            uint32_t m = ragged ? 1 + (uint32_t)(kv_test_rand(s) % T) : T;
            m = m < lens[i] - t ? m : lens[i] - t;
            void *pg = make_page(fmt, &L->geom, m, (j % 2) != 0, s,
                                 L->k[i] + (size_t)t * d,
                                 L->v[i] + (size_t)t * d);
            L->pages[np++] = (kv_kern_page_t){.data = pg, .n_tokens = m,
                                              .format = fmt};
            L->by_fmt[fmt]++;
            t += m;
        }
    }
    L->indptr[n] = np;
}

static void lists_free(lists_t *L)
{
    for (uint32_t e = 0; e < L->indptr[L->n]; e++)
        free((void *)L->pages[e].data);
    for (uint32_t i = 0; i < L->n; i++) {
        free(L->k[i]);
        free(L->v[i]);
    }
    free(L->indptr);
    free(L->len);
    free(L->pages);
    free(L->k);
    free(L->v);
}

/* Worst errors of one call against the dense reference. */
typedef struct attn_errs {
    double out, stats;
    long bad_total, touched;
} attn_errs_t;

/* Statistics of one list (st, stride entries) against the reference rst:
 * relative error per token, total == want, entries past len untouched. */
static void check_stats(const float *st, const double *rst, uint32_t len,
                        uint32_t stride, double want, attn_errs_t *e)
{
    double tot = 0;
    for (uint32_t t = 0; t < len; t++) {
        double err = fabs(st[t] - rst[t]) / (rst[t] + 1e-6);
        e->stats = err > e->stats ? err : e->stats;
        tot += st[t];
    }
    e->bad_total += fabs(tot - want) > 1e-3 * want;
    for (uint32_t t = len; t < stride; t++)
        e->touched += st[t] != SENTINEL;
}

static void report(const char *what, const char *name, const attn_errs_t *e)
{
    if (e->out > 1e-3 || e->stats > 1e-3 || e->bad_total || e->touched)
        fprintf(stderr,
                "%s %s: out err %.3g, stats err %.3g, bad totals %ld, "
                "touched %ld\n",
                what, name, e->out, e->stats, e->bad_total, e->touched);
    CHECK(e->out <= 1e-3);
    CHECK(e->stats <= 1e-3);
    CHECK_EQ(e->bad_total, 0);
    CHECK_EQ(e->touched, 0);
}

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

static void run_decode(const acase_t *c, uint64_t seed)
{
    uint64_t s = seed;
    lists_t L;
    const uint32_t d = c->d, G = c->nq / c->nkv;
    lists_build(&L, d, c->page_bytes, c->nkv, c->lens, c->fmts, c->ragged,
                &s);
    CHECK(L.by_fmt[KV_FMT_INT4] + L.by_fmt[KV_FMT_INT2] > 0);
    uint32_t stride = 0;
    for (uint32_t h = 0; h < c->nkv; h++)
        stride = L.len[h] > stride ? L.len[h] : stride;
    stride += 3;
    float *q = xcalloc((size_t)c->nq * d, sizeof *q);
    float *out = xcalloc((size_t)c->nq * d, sizeof *out);
    float *st = xcalloc((size_t)c->nkv * stride, sizeof *st);
    for (size_t j = 0; j < (size_t)c->nq * d; j++)
        q[j] = 2.0f * kv_test_randf(&s);
    for (size_t j = 0; j < (size_t)c->nkv * stride; j++)
        st[j] = SENTINEL;
    float *stp[1] = {st};
    kv_attn_decode_params_t p = {
        .geom = L.geom, .batch = 1, .n_q_heads = c->nq,
        .n_kv_heads = c->nkv, .indptr = L.indptr, .pages = L.pages,
        .seq_len = L.len, .q = q, .out = out, .stats = stp,
        .stats_stride = stride, .scale = 1.0f / sqrtf((float)d),
        .partition_tokens = c->part,
    };
    int rc = be.ops->attn_decode(be.ctx, &p);
    CHECK_OK(rc);
    double *ref = xcalloc(d, sizeof *ref), *rst = xcalloc(stride, sizeof *rst);
    attn_errs_t e = {0};
    for (uint32_t h = 0; rc == 0 && h < c->nkv; h++) {
        memset(rst, 0, stride * sizeof *rst);
        for (uint32_t gq = 0; gq < G; gq++) {
            size_t row = (size_t)h * G + gq;
            kv_test_dense_row(L.k[h], L.v[h], d, L.len[h], q + row * d,
                              p.scale, ref, rst);
            double err = kv_test_rel_err(out + row * d, ref, d);
            e.out = err > e.out ? err : e.out;
        }
        check_stats(st + (size_t)h * stride, rst, L.len[h], stride, G, &e);
    }
    if (rc == 0)
        report("decode", c->name, &e);
    free(ref);
    free(rst);
    free(q);
    free(out);
    free(st);
    lists_free(&L);
}

static void run_prefill(const acase_t *c, uint64_t seed)
{
    uint64_t s = seed;
    lists_t L;
    const uint32_t d = c->d, G = c->nq / c->nkv;
    lists_build(&L, d, c->page_bytes, c->nkv, c->lens, c->fmts, c->ragged,
                &s);
    uint32_t stride = 0;
    for (uint32_t h = 0; h < c->nkv; h++)
        stride = L.len[h] > stride ? L.len[h] : stride;
    stride += 2;
    const size_t nrow = (size_t)c->n_new * c->nq;
    float *q = xcalloc(nrow * d, sizeof *q);
    float *out = xcalloc(nrow * d, sizeof *out);
    float *st = xcalloc((size_t)c->nkv * stride, sizeof *st);
    for (size_t j = 0; j < nrow * d; j++)
        q[j] = 2.0f * kv_test_randf(&s);
    for (size_t j = 0; j < (size_t)c->nkv * stride; j++)
        st[j] = SENTINEL;
    kv_attn_prefill_params_t p = {
        .geom = L.geom, .n_q_heads = c->nq, .n_kv_heads = c->nkv,
        .indptr = L.indptr, .pages = L.pages, .seq_len = L.len,
        .n_new = c->n_new, .q = q, .out = out, .stats = st,
        .stats_stride = stride, .stats_row0 = c->row0,
        .scale = 1.0f / sqrtf((float)d),
    };
    int rc = be.ops->attn_prefill(be.ctx, &p);
    CHECK_OK(rc);
    double *ref = xcalloc(d, sizeof *ref), *rst = xcalloc(stride, sizeof *rst);
    attn_errs_t e = {0};
    for (uint32_t h = 0; rc == 0 && h < c->nkv; h++) {
        const uint32_t base = L.len[h] - c->n_new;
        memset(rst, 0, stride * sizeof *rst);
        for (uint32_t i = 0; i < c->n_new; i++)
            for (uint32_t gq = 0; gq < G; gq++) {
                size_t row = (size_t)i * c->nq + (size_t)h * G + gq;
                kv_test_dense_row(L.k[h], L.v[h], d, base + i + 1,
                                  q + row * d, p.scale, ref,
                                  i >= c->row0 ? rst : NULL);
                double err = kv_test_rel_err(out + row * d, ref, d);
                e.out = err > e.out ? err : e.out;
            }
        check_stats(st + (size_t)h * stride, rst, L.len[h], stride,
                    (double)G * (c->n_new - c->row0), &e);
    }
    if (rc == 0)
        report("prefill", c->name, &e);
    free(ref);
    free(rst);
    free(q);
    free(out);
    free(st);
    lists_free(&L);
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
    for (size_t i = 0; i < sizeof dec / sizeof dec[0]; i++)
        run_decode(&dec[i], 500 + i);
    static const uint32_t p3[] = {400, 257, 330}, p1[] = {300};
    const acase_t pre[] = {
        /* the new rows' tokens lie in INT pages: rows of one chunk see
         * different prefixes of it */
        {"int2-rows-in-chunk", 9, 3, 64, 4096, p3, "2", 0, 0, 70, 0},
        {"mixed-ragged", 9, 3, 64, 4096, p3, "0212", 1, 0, 150, 40},
        {"gqa5/1-int4", 5, 1, 64, 4096, p1, "1", 1, 0, 33, 32},
        {"d128-gqa8/2", 8, 2, 128, 8192, l2, "21", 1, 0, 45, 0},
    };
    for (size_t i = 0; i < sizeof pre / sizeof pre[0]; i++)
        run_prefill(&pre[i], 600 + i);
}

int main(void)
{
    if (kv_backend_cpu_create(2, &be)) {
        fprintf(stderr, "cannot create the CPU backend\n");
        return 1;
    }
    test_table();
    static const uint32_t dims[] = {16, 64, 128};
    for (size_t i = 0; i < sizeof dims / sizeof dims[0]; i++) {
        test_steps(KV_FMT_INT4, dims[i], 100 + i);
        test_steps(KV_FMT_INT2, dims[i], 200 + i);
    }
    test_backend();
    kv_backend_destroy(&be);
    return kv_test_end();
}
