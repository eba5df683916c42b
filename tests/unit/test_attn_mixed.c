/*
 * test_attn_mixed.c — CPU backend attention over page lists that mix the
 * FP16, INT4 and INT2 formats (kernel level, no page table).
 *
 * Pages are built in test-owned buffers through each format's traits from
 * random data; a list's pages take formats at random (or in a fixed
 * pattern), INT pages sometimes with a partly used last group. The
 * reference is dense attention in double precision over the DECODED values
 * (each page decoded with its own format's load), so quantization error does
 * not enter the comparison. Checks, for decode (GQA 9/3 and 8/2, head_dim 64
 * and 128, the default partition size and small ones that start partitions
 * inside pages and inside 16-token groups, a batch with ragged lengths incl.
 * 1) and prefill (with history, several row blocks): norm-wise relative
 * error of every output row <= 1e-3; statistics per token (summed over the
 * group's q heads and the counted rows) within 1e-3 relative, their total ==
 * G * rows, entries past a list untouched. A control: the same lists read
 * as the original (unquantized) data differ from the output by far more
 * than 1e-3, so the INT pages really were decoded as INT.
 *
 * Needs KV_FMT_INT4 / KV_FMT_INT2 in kv_format_table (the backend finds a
 * page's load through kv_format_get): otherwise the backend answers
 * KV_ENOTSUP and the test fails.
 */
#include <string.h>

#include "kernels/kv_backend.h"
#include "kv_test.h"
#include "kv_test_attn.h"
#include "pages/fmt_fp16.h"
#include "pages/fmt_int.h"

#define SENTINEL 12345.0f

static const kv_format_traits_t *traits_of(uint32_t fmt)
{
    return fmt == KV_FMT_INT2   ? &kv_fmt_int2
           : fmt == KV_FMT_INT4 ? &kv_fmt_int4
                                : &kv_fmt_fp16;
}

static void *xcalloc(size_t n, size_t sz)
{
    void *p = calloc(n ? n : 1, sz ? sz : 1);
    if (!p) {
        fprintf(stderr, "out of memory\n");
        exit(2);
    }
    return p;
}

/* Lists of mixed-format pages, with the decoded and the original K/V. */
typedef struct fixture {
    kv_page_geom_t geom;
    uint32_t n_lists;
    uint32_t *indptr;      /* [n_lists + 1]                          */
    uint32_t *seq_len;     /* [n_lists]                              */
    kv_kern_page_t *pages; /* [indptr[n_lists]]                      */
    float **k, **v;        /* [n_lists] of [len][D]: decoded values  */
    float **k0, **v0;      /* [n_lists] of [len][D]: original values */
    uint32_t n_by_fmt[3];  /* pages per format                       */
} fixture_t;

/* pattern < 0: each page's format at random; else page j of a list has
 * format (j + pattern) % 3. Page fill: full, or (ragged) 1..T tokens. */
static void fixture_build(fixture_t *f, uint32_t d, uint32_t page_bytes,
                          uint32_t n_lists, const uint32_t *lens, int ragged,
                          int pattern, float kscale, uint64_t *s)
{
    memset(f, 0, sizeof *f);
    f->geom = (kv_page_geom_t){.head_dim = d, .page_bytes = page_bytes};
    f->n_lists = n_lists;
    size_t max_pages = 0;
    for (uint32_t i = 0; i < n_lists; i++)
        max_pages += lens[i];
    f->indptr = xcalloc(n_lists + 1, sizeof *f->indptr);
    f->seq_len = xcalloc(n_lists, sizeof *f->seq_len);
    f->pages = xcalloc(max_pages, sizeof *f->pages);
    f->k = xcalloc(n_lists, sizeof *f->k);
    f->v = xcalloc(n_lists, sizeof *f->v);
    f->k0 = xcalloc(n_lists, sizeof *f->k0);
    f->v0 = xcalloc(n_lists, sizeof *f->v0);
    uint32_t max_tpp = kv_fmt_int2.tokens_per_page(&f->geom);
    float *ks = xcalloc((size_t)max_tpp * d, sizeof(float));
    float *vs = xcalloc((size_t)max_tpp * d, sizeof(float));
    uint32_t np = 0;
    for (uint32_t i = 0; i < n_lists; i++) {
        uint32_t len = lens[i];
        f->indptr[i] = np;
        f->seq_len[i] = len;
        f->k[i] = xcalloc((size_t)len * d, sizeof(float));
        f->v[i] = xcalloc((size_t)len * d, sizeof(float));
        f->k0[i] = xcalloc((size_t)len * d, sizeof(float));
        f->v0[i] = xcalloc((size_t)len * d, sizeof(float));
        for (uint32_t t = 0, j = 0; t < len; j++) {
            uint32_t fmt = pattern < 0 ? (uint32_t)(kv_test_rand(s) % 3)
                                       : (j + (uint32_t)pattern) % 3;
            const kv_format_traits_t *tr = traits_of(fmt);
            uint32_t tpp = tr->tokens_per_page(&f->geom);
            uint32_t n = ragged ? 1 + (uint32_t)(kv_test_rand(s) % tpp) : tpp;
            n = n < len - t ? n : len - t;
            /* INT stores take whole groups: fill up to the next group */
            uint32_t ns = fmt == KV_FMT_FP16 ? n : (n + 15) / 16 * 16;
            for (size_t e = 0; e < (size_t)ns * d; e++) {
                /* FP16 values, as appended data is */
                ks[e] = kv_half_to_float(
                    kv_half_from_float(kv_test_randf(s) * kscale));
                vs[e] = kv_half_to_float(kv_half_from_float(kv_test_randf(s)));
            }
            void *page = xcalloc(page_bytes, 1);
            memset(page, 0xff, page_bytes); /* unused bytes: NaN halfs */
            tr->store(page, &f->geom, 0, ns, KV_DTYPE_F32, ks, vs, d);
            /* the reference: this page decoded by its own format */
            tr->load(page, &f->geom, 0, n, f->k[i] + (size_t)t * d,
                     f->v[i] + (size_t)t * d);
            memcpy(f->k0[i] + (size_t)t * d, ks, (size_t)n * d * sizeof(float));
            memcpy(f->v0[i] + (size_t)t * d, vs, (size_t)n * d * sizeof(float));
            f->pages[np++] = (kv_kern_page_t){.data = page, .n_tokens = n,
                                              .format = fmt};
            f->n_by_fmt[fmt]++;
            t += n;
        }
    }
    f->indptr[n_lists] = np;
    free(ks);
    free(vs);
}

static void fixture_free(fixture_t *f)
{
    for (uint32_t e = 0; e < f->indptr[f->n_lists]; e++)
        free((void *)f->pages[e].data);
    for (uint32_t i = 0; i < f->n_lists; i++) {
        free(f->k[i]);
        free(f->v[i]);
        free(f->k0[i]);
        free(f->v0[i]);
    }
    free(f->indptr);
    free(f->seq_len);
    free(f->pages);
    free(f->k);
    free(f->v);
    free(f->k0);
    free(f->v0);
}

static kv_backend_t be;

/* ---- decode ------------------------------------------------------------- */

typedef struct dcase {
    const char *name;
    uint32_t batch, nq, nkv, d, page_bytes;
    const uint32_t *lens; /* [batch * nkv] */
    int ragged, pattern;
    uint32_t part;        /* partition_tokens (0 = default) */
    uint32_t stats_mask;  /* bit b: batch row b wants stats */
} dcase_t;

static void run_decode(const dcase_t *c, uint64_t seed)
{
    uint64_t s = seed;
    fixture_t f;
    uint32_t nl = c->batch * c->nkv, G = c->nq / c->nkv, d = c->d;
    fixture_build(&f, d, c->page_bytes, nl, c->lens, c->ragged, c->pattern,
                  4.0f, &s);
    /* the lists do mix the three formats */
    CHECK(f.n_by_fmt[KV_FMT_FP16] > 0 && f.n_by_fmt[KV_FMT_INT4] > 0 &&
          f.n_by_fmt[KV_FMT_INT2] > 0);
    size_t nrow = (size_t)c->batch * c->nq;
    float *q = xcalloc(nrow * d, sizeof *q);
    for (size_t j = 0; j < nrow * d; j++)
        q[j] = kv_test_randf(&s);
    uint32_t stride = 0;
    for (uint32_t i = 0; i < nl; i++)
        stride = f.seq_len[i] > stride ? f.seq_len[i] : stride;
    stride += 3;
    size_t sfl = (size_t)c->nkv * stride;
    float *out = xcalloc(nrow * d, sizeof(float));
    float *st = xcalloc(c->batch * sfl, sizeof(float));
    float **sp = xcalloc(c->batch, sizeof(float *));
    for (size_t j = 0; j < c->batch * sfl; j++)
        st[j] = SENTINEL;
    for (uint32_t b = 0; b < c->batch; b++)
        if (c->stats_mask & (1u << b))
            sp[b] = st + b * sfl;
    kv_attn_decode_params_t p = {
        .geom = f.geom, .batch = c->batch, .n_q_heads = c->nq,
        .n_kv_heads = c->nkv, .indptr = f.indptr, .pages = f.pages,
        .seq_len = f.seq_len, .q = q, .out = out,
        .stats = c->stats_mask ? sp : NULL, .stats_stride = stride,
        .scale = 1.0f / sqrtf((float)d), .partition_tokens = c->part,
    };
    int rc = be.ops->attn_decode(be.ctx, &p);
    CHECK_OK(rc);

    double *ref = xcalloc(d, sizeof *ref);
    double *rst = xcalloc(stride, sizeof *rst);
    double worst = 0, worst_st = 0, control = 0;
    long bad_sum = 0, bad_untouched = 0;
    for (uint32_t b = 0; rc == 0 && b < c->batch; b++)
        for (uint32_t h = 0; h < c->nkv; h++) {
            uint32_t li = b * c->nkv + h, len = f.seq_len[li];
            memset(rst, 0, stride * sizeof *rst);
            for (uint32_t g = 0; g < G; g++) {
                size_t row = (size_t)b * c->nq + (size_t)h * G + g;
                kv_test_dense_row(f.k[li], f.v[li], d, len, q + row * d, p.scale, ref,
                          rst);
                double e = kv_test_rel_err(out + row * d, ref, d);
                worst = e > worst ? e : worst;
                kv_test_dense_row(f.k0[li], f.v0[li], d, len, q + row * d, p.scale,
                          ref, NULL);
                e = kv_test_rel_err(out + row * d, ref, d);
                control = e > control ? e : control;
            }
            const float *sb = st + b * sfl + (size_t)h * stride;
            if (!(c->stats_mask & (1u << b))) {
                for (uint32_t t = 0; t < stride; t++)
                    bad_untouched += sb[t] != SENTINEL;
                continue;
            }
            double tot = 0;
            for (uint32_t t = 0; t < len; t++) {
                double e = fabs(sb[t] - rst[t]) / (rst[t] + 1e-6);
                worst_st = e > worst_st ? e : worst_st;
                tot += sb[t];
            }
            bad_sum += fabs(tot - G) > 1e-3 * G;
            for (uint32_t t = len; t < stride; t++)
                bad_untouched += sb[t] != SENTINEL;
        }
    if (worst > 1e-3 || worst_st > 1e-3 || control < 1e-2)
        fprintf(stderr, "decode %s: out err %.3g stats err %.3g control %.3g\n",
                c->name, worst, worst_st, control);
    CHECK(rc == 0 && worst <= 1e-3);
    CHECK(rc == 0 && worst_st <= 1e-3);
    CHECK(rc == 0 && control >= 1e-2);
    CHECK_EQ(bad_sum, 0);
    CHECK_EQ(bad_untouched, 0);
    free(ref);
    free(rst);
    free(q);
    free(out);
    free(st);
    free(sp);
    fixture_free(&f);
}

static void test_decode(void)
{
    static const uint32_t l3[] = {700, 333, 1001};
    static const uint32_t rag[] = {1, 250, 64, 17, 900, 130};
    static const uint32_t l4[] = {1500, 47, 640, 1111};
    const dcase_t cases[] = {
        /* name, batch, nq, nkv, d, page, lens, ragged, pattern, part, stats */
        {"gqa9/3-full", 1, 9, 3, 64, 4096, l3, 0, 0, 0, 0x1},
        {"gqa9/3-random", 1, 9, 3, 64, 4096, l3, 1, -1, 0, 0x1},
        {"part17", 1, 9, 3, 64, 4096, l3, 1, -1, 17, 0x1},
        {"part100", 1, 9, 3, 64, 12288, l3, 0, 1, 100, 0x1},
        {"batch2-ragged", 2, 9, 3, 64, 4096, rag, 1, -1, 0, 0x2},
        {"d128-gqa8/2", 2, 8, 2, 128, 8192, l4, 1, -1, 50, 0x3},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        run_decode(&cases[i], 300 + i);
}

/* ---- prefill ------------------------------------------------------------ */

typedef struct pcase {
    const char *name;
    uint32_t nq, nkv, d, page_bytes;
    const uint32_t *lens; /* [nkv] */
    uint32_t n_new;
    int ragged, pattern;
    uint32_t row0;
} pcase_t;

static void run_prefill(const pcase_t *c, uint64_t seed)
{
    uint64_t s = seed;
    fixture_t f;
    uint32_t G = c->nq / c->nkv, d = c->d;
    fixture_build(&f, d, c->page_bytes, c->nkv, c->lens, c->ragged,
                  c->pattern, 4.0f, &s);
    CHECK(f.n_by_fmt[KV_FMT_FP16] > 0 && f.n_by_fmt[KV_FMT_INT4] > 0 &&
          f.n_by_fmt[KV_FMT_INT2] > 0);
    size_t nrow = (size_t)c->n_new * c->nq;
    float *q = xcalloc(nrow * d, sizeof *q);
    for (size_t j = 0; j < nrow * d; j++)
        q[j] = kv_test_randf(&s);
    uint32_t stride = 0;
    for (uint32_t h = 0; h < c->nkv; h++)
        stride = f.seq_len[h] > stride ? f.seq_len[h] : stride;
    stride += 2;
    size_t sfl = (size_t)c->nkv * stride;
    float *out = xcalloc(nrow * d, sizeof(float));
    float *st = xcalloc(sfl, sizeof(float));
    for (size_t j = 0; j < sfl; j++)
        st[j] = SENTINEL;
    kv_attn_prefill_params_t p = {
        .geom = f.geom, .n_q_heads = c->nq, .n_kv_heads = c->nkv,
        .indptr = f.indptr, .pages = f.pages, .seq_len = f.seq_len,
        .n_new = c->n_new, .q = q, .out = out, .stats = st,
        .stats_stride = stride, .stats_row0 = c->row0,
        .scale = 1.0f / sqrtf((float)d),
    };
    int rc = be.ops->attn_prefill(be.ctx, &p);
    CHECK_OK(rc);

    double *ref = xcalloc(d, sizeof *ref);
    double *rst = xcalloc(stride, sizeof *rst);
    double worst = 0, worst_st = 0;
    long bad_sum = 0, bad_untouched = 0;
    for (uint32_t h = 0; rc == 0 && h < c->nkv; h++) {
        uint32_t len = f.seq_len[h], base = len - c->n_new;
        memset(rst, 0, stride * sizeof *rst);
        for (uint32_t i = 0; i < c->n_new; i++)
            for (uint32_t g = 0; g < G; g++) {
                size_t row = (size_t)i * c->nq + (size_t)h * G + g;
                kv_test_dense_row(f.k[h], f.v[h], d, base + i + 1, q + row * d,
                          p.scale, ref, i >= c->row0 ? rst : NULL);
                double e = kv_test_rel_err(out + row * d, ref, d);
                worst = e > worst ? e : worst;
            }
        const float *sb = st + (size_t)h * stride;
        double tot = 0;
        for (uint32_t t = 0; t < len; t++) {
            double e = fabs(sb[t] - rst[t]) / (rst[t] + 1e-6);
            worst_st = e > worst_st ? e : worst_st;
            tot += sb[t];
        }
        double want = (double)G * (c->n_new - c->row0);
        bad_sum += fabs(tot - want) > 1e-3 * want;
        for (uint32_t t = len; t < stride; t++)
            bad_untouched += sb[t] != SENTINEL;
    }
    if (worst > 1e-3 || worst_st > 1e-3)
        fprintf(stderr, "prefill %s: out err %.3g stats err %.3g\n", c->name,
                worst, worst_st);
    CHECK(rc == 0 && worst <= 1e-3);
    CHECK(rc == 0 && worst_st <= 1e-3);
    CHECK_EQ(bad_sum, 0);
    CHECK_EQ(bad_untouched, 0);
    free(ref);
    free(rst);
    free(q);
    free(out);
    free(st);
    fixture_free(&f);
}

static void test_prefill(void)
{
    static const uint32_t l3[] = {400, 257, 330};
    static const uint32_t l2[] = {300, 300};
    const pcase_t cases[] = {
        /* name, nq, nkv, d, page, lens, n_new, ragged, pattern, row0 */
        {"history", 9, 3, 64, 4096, l3, 70, 1, -1, 0},
        {"blocks", 9, 3, 64, 4096, l3, 200, 0, 2, 150},
        {"d128", 8, 2, 128, 8192, l2, 33, 1, -1, 32},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        run_prefill(&cases[i], 400 + i);
}

int main(void)
{
    if (kv_backend_cpu_create(2, &be)) {
        fprintf(stderr, "cannot create the CPU backend\n");
        return 1;
    }
    /* the backend reads a page through kv_format_get(format)->load */
    CHECK(kv_format_get(KV_FMT_INT4) != NULL);
    CHECK(kv_format_get(KV_FMT_INT2) != NULL);
    test_decode();
    test_prefill();
    kv_backend_destroy(&be);
    return kv_test_end();
}
