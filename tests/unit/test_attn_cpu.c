/*
 * test_attn_cpu.c — the CPU backend's decode and prefill attention against a
 * naive dense implementation (double-precision softmax over the decoded K/V).
 *
 * Pages are FP16 pages built in test-owned buffers through the fmt_fp16
 * traits (no page table). Checks, for decode: one and many sequences with
 * ragged lengths (incl. 1), GQA 9/3, 8/8, 32/8, head_dim 64 and 128, last
 * pages partly filled, partly filled pages in the middle, pages larger than
 * the kernel's tile (several chunks per page), contexts long enough for many
 * partitions (default size and 16, 17, 1000), large logits (stability),
 * lists whose leading pages are INT4/INT2 (partly filled) followed by FP16
 * pages (the same loop serves every format; skipped if not built);
 * for prefill: with and without earlier pages, different list lengths per
 * head, several row blocks, n_new 1. Outputs: norm-wise relative error of
 * every row <= 1e-3. Statistics (decode: some batch rows only; prefill:
 * rows stats_row0..): each token's probability summed over the group's heads
 * (and rows) within 1e-3, the total over tokens == G * rows, entries past a
 * list's length and rows without stats untouched. Identical bits with 1 and 2
 * threads and with the generic and AVX2 loop builds; identical bits from
 * several threads calling one 3-worker backend at once (the worker pool
 * serves one call, the others run on their callers). Bad parameters give
 * their error and leave out/stats untouched; an allocation failure gives
 * KV_ENOMEM, writes nothing and leaks nothing.
 */
#include <pthread.h>
#include <string.h>

#include "alloc/kv_mem.h"
#include "kernels/cpu/kv_cpu.h"
#include "kernels/kv_backend.h"
#include "kv_test.h"
#include "kv_test_attn.h"
#include "pages/fmt_fp16.h"

#define SENTINEL 12345.0f

/* Lists of FP16 pages plus the dense decoded K/V of every list. */
typedef struct fixture {
    kv_page_geom_t geom;
    uint32_t n_lists;
    uint32_t *indptr;      /* [n_lists + 1]           */
    uint32_t *seq_len;     /* [n_lists]               */
    kv_kern_page_t *pages; /* [indptr[n_lists]]       */
    float **k, **v;        /* [n_lists] of [len][D]   */
} fixture_t;

static void *xcalloc(size_t n, size_t sz)
{
    void *p = calloc(n ? n : 1, sz ? sz : 1);
    if (!p) {
        fprintf(stderr, "out of memory\n");
        exit(2);
    }
    return p;
}

/* Lists of lens[i] tokens. The first qtok tokens of each list (rounded down
 * to whole 16-token groups) go to pages of format qfmt (a random multiple of
 * 16 tokens each: partly filled pages in the middle), stored from FP32
 * through the format's traits; the dense reference holds what the format
 * decodes to. The rest are FP16 pages: ragged = filled with 1..T tokens at
 * random, else full but the last. */
static void fixture_build_q(fixture_t *f, uint32_t d, uint32_t page_bytes,
                            uint32_t n_lists, const uint32_t *lens, int ragged,
                            float kscale, uint64_t *s, uint32_t qfmt,
                            uint32_t qtok)
{
    memset(f, 0, sizeof *f);
    f->geom = (kv_page_geom_t){.head_dim = d, .page_bytes = page_bytes};
    f->n_lists = n_lists;
    uint32_t tpp = kv_fmt_fp16.tokens_per_page(&f->geom);
    const kv_format_traits_t *qt = qtok ? kv_format_get(qfmt) : NULL;
    uint32_t qtpp = qt ? qt->tokens_per_page(&f->geom) : 0;
    uint32_t rows = tpp > qtpp ? tpp : qtpp;
    size_t max_pages = 0;
    for (uint32_t i = 0; i < n_lists; i++)
        max_pages += lens[i];
    f->indptr = xcalloc(n_lists + 1, sizeof *f->indptr);
    f->seq_len = xcalloc(n_lists, sizeof *f->seq_len);
    f->pages = xcalloc(max_pages, sizeof *f->pages);
    f->k = xcalloc(n_lists, sizeof *f->k);
    f->v = xcalloc(n_lists, sizeof *f->v);
    kv_half_t *kh = xcalloc((size_t)rows * d, sizeof *kh);
    kv_half_t *vh = xcalloc((size_t)rows * d, sizeof *vh);
    float *kf = xcalloc((size_t)rows * d, sizeof *kf);
    float *vf = xcalloc((size_t)rows * d, sizeof *vf);
    uint32_t np = 0;
    for (uint32_t i = 0; i < n_lists; i++) {
        uint32_t len = lens[i];
        uint32_t qend = qtpp ? (qtok < len ? qtok : len) / 16 * 16 : 0;
        f->indptr[i] = np;
        f->seq_len[i] = len;
        f->k[i] = xcalloc((size_t)len * d, sizeof(float));
        f->v[i] = xcalloc((size_t)len * d, sizeof(float));
        for (uint32_t t = 0; t < len;) {
            void *page = xcalloc(page_bytes, 1);
            memset(page, 0xff, page_bytes); /* unused rows: NaN halfs */
            uint32_t n, fmt = KV_FMT_FP16;
            if (t < qend) {
                n = 16 * (1 + (uint32_t)(kv_test_rand(s) % (qtpp / 16)));
                n = n < qend - t ? n : qend - t;
                for (size_t j = 0; j < (size_t)n * d; j++) {
                    kf[j] = kv_test_randf(s) * kscale;
                    vf[j] = kv_test_randf(s);
                }
                qt->store(page, &f->geom, 0, n, KV_DTYPE_F32, kf, vf, d);
                qt->load(page, &f->geom, 0, n, f->k[i] + (size_t)t * d,
                         f->v[i] + (size_t)t * d);
                fmt = qfmt;
            } else {
                n = ragged ? 1 + (uint32_t)(kv_test_rand(s) % tpp) : tpp;
                n = n < len - t ? n : len - t;
                for (size_t j = 0; j < (size_t)n * d; j++) {
                    kh[j] = kv_half_from_float(kv_test_randf(s) * kscale);
                    vh[j] = kv_half_from_float(kv_test_randf(s));
                    f->k[i][(size_t)t * d + j] = kv_half_to_float(kh[j]);
                    f->v[i][(size_t)t * d + j] = kv_half_to_float(vh[j]);
                }
                kv_fmt_fp16.store(page, &f->geom, 0, n, KV_DTYPE_F16, kh, vh,
                                  d);
            }
            f->pages[np++] = (kv_kern_page_t){.data = page, .n_tokens = n,
                                              .format = fmt};
            t += n;
        }
    }
    f->indptr[n_lists] = np;
    free(kh);
    free(vh);
    free(kf);
    free(vf);
}

static void fixture_build(fixture_t *f, uint32_t d, uint32_t page_bytes,
                          uint32_t n_lists, const uint32_t *lens, int ragged,
                          float kscale, uint64_t *s)
{
    fixture_build_q(f, d, page_bytes, n_lists, lens, ragged, kscale, s,
                    KV_FMT_FP16, 0);
}

static void fixture_free(fixture_t *f)
{
    for (uint32_t e = 0; e < f->indptr[f->n_lists]; e++)
        free((void *)f->pages[e].data);
    for (uint32_t i = 0; i < f->n_lists; i++) {
        free(f->k[i]);
        free(f->v[i]);
    }
    free(f->indptr);
    free(f->seq_len);
    free(f->pages);
    free(f->k);
    free(f->v);
}

static kv_backend_t be1, be2; /* 1 and 2 threads */

/* ---- decode ------------------------------------------------------------- */

typedef struct dcase {
    const char *name;
    uint32_t batch, nq, nkv, d, page_bytes;
    const uint32_t *lens; /* [batch * nkv] */
    int ragged;
    uint32_t part;
    uint32_t stats_mask;  /* bit b: batch row b wants stats */
    float qscale, kscale;
    uint32_t qfmt, qtok;  /* leading tokens of each list in format qfmt */
} dcase_t;

static void run_decode(const dcase_t *c, uint64_t seed)
{
    uint64_t s = seed;
    fixture_t f;
    uint32_t nl = c->batch * c->nkv, G = c->nq / c->nkv, d = c->d;
    fixture_build_q(&f, d, c->page_bytes, nl, c->lens, c->ragged, c->kscale,
                    &s, c->qfmt, c->qtok);
    size_t nrow = (size_t)c->batch * c->nq;
    float *q = xcalloc(nrow * d, sizeof *q);
    for (size_t j = 0; j < nrow * d; j++)
        q[j] = kv_test_randf(&s) * c->qscale;
    uint32_t stride = 0;
    for (uint32_t i = 0; i < nl; i++)
        stride = f.seq_len[i] > stride ? f.seq_len[i] : stride;
    stride += 3;
    size_t sfl = (size_t)c->nkv * stride;
    float *out1 = xcalloc(nrow * d, sizeof(float));
    float *out2 = xcalloc(nrow * d, sizeof(float));
    float *st1 = xcalloc(c->batch * sfl, sizeof(float));
    float *st2 = xcalloc(c->batch * sfl, sizeof(float));
    float **sp1 = xcalloc(c->batch, sizeof(float *));
    float **sp2 = xcalloc(c->batch, sizeof(float *));
    for (size_t j = 0; j < c->batch * sfl; j++)
        st1[j] = st2[j] = SENTINEL;
    for (uint32_t b = 0; b < c->batch; b++)
        if (c->stats_mask & (1u << b)) {
            sp1[b] = st1 + b * sfl;
            sp2[b] = st2 + b * sfl;
        }
    kv_attn_decode_params_t p = {
        .geom = f.geom, .batch = c->batch, .n_q_heads = c->nq,
        .n_kv_heads = c->nkv, .indptr = f.indptr, .pages = f.pages,
        .seq_len = f.seq_len, .q = q, .out = out1,
        .stats = c->stats_mask ? sp1 : NULL, .stats_stride = stride,
        .scale = 1.0f / sqrtf((float)d), .partition_tokens = c->part,
    };
    int rc1 = be1.ops->attn_decode(be1.ctx, &p);
    p.out = out2;
    p.stats = c->stats_mask ? sp2 : NULL;
    int rc2 = be2.ops->attn_decode(be2.ctx, &p);
    CHECK_OK(rc1);
    CHECK_OK(rc2);
    /* 1 thread == 2 threads, bit for bit */
    CHECK(memcmp(out1, out2, nrow * d * sizeof(float)) == 0);
    CHECK(memcmp(st1, st2, c->batch * sfl * sizeof(float)) == 0);

    double *ref = xcalloc(d, sizeof *ref);
    double *rst = xcalloc(stride, sizeof *rst);
    double worst = 0, worst_st = 0;
    long bad_sum = 0, bad_untouched = 0;
    for (uint32_t b = 0; b < c->batch; b++)
        for (uint32_t h = 0; h < c->nkv; h++) {
            uint32_t li = b * c->nkv + h, len = f.seq_len[li];
            memset(rst, 0, stride * sizeof *rst);
            for (uint32_t g = 0; g < G; g++) {
                size_t row = (size_t)b * c->nq + (size_t)h * G + g;
                kv_test_dense_row(f.k[li], f.v[li], d, len, q + row * d, p.scale, ref, rst);
                double e = kv_test_rel_err(out1 + row * d, ref, d);
                worst = e > worst ? e : worst;
            }
            const float *sb = st1 + b * sfl + (size_t)h * stride;
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
    if (worst > 1e-3 || worst_st > 1e-3)
        fprintf(stderr, "decode %s: out err %.3g stats err %.3g\n", c->name,
                worst, worst_st);
    CHECK(worst <= 1e-3);
    CHECK(worst_st <= 1e-3);
    CHECK_EQ(bad_sum, 0);
    CHECK_EQ(bad_untouched, 0);
    free(ref);
    free(rst);
    free(q);
    free(out1);
    free(out2);
    free(st1);
    free(st2);
    free(sp1);
    free(sp2);
    fixture_free(&f);
}

static void test_decode(void)
{
    static const uint32_t one[] = {1, 1, 1};
    static const uint32_t short3[] = {37, 16, 5};
    static const uint32_t rag[] = {1,  17, 300, 1000, 5,   64, 2,  999,
                                   33, 16, 15,  1,    200, 7,  48, 130};
    static uint32_t long3[3] = {5000, 4999, 4097};
    static uint32_t lens8[8], lens32[4 * 8];
    uint64_t s = 5;
    for (int i = 0; i < 8; i++)
        lens8[i] = 1 + (uint32_t)(kv_test_rand(&s) % 700);
    for (int i = 0; i < 32; i++)
        lens32[i] = 1 + (uint32_t)(kv_test_rand(&s) % 400);
    const dcase_t cases[] = {
        {"len1", 1, 9, 3, 64, 4096, one, 0, 0, 1, 4, 1, 0, 0},
        {"short", 1, 9, 3, 64, 4096, short3, 0, 0, 1, 4, 1, 0, 0},
        {"ragged-batch", 4, 12, 4, 64, 4096, rag, 1, 0, 0x5, 4, 1, 0, 0},
        {"gqa9/3-long", 1, 9, 3, 64, 4096, long3, 0, 0, 1, 4, 1, 0, 0},
        {"part16", 1, 9, 3, 64, 4096, long3, 1, 16, 1, 4, 1, 0, 0},
        {"part17", 1, 9, 3, 64, 4096, long3, 0, 17, 1, 4, 1, 0, 0},
        {"part1000", 1, 9, 3, 64, 4096, long3, 1, 1000, 1, 4, 1, 0, 0},
        {"mha8/8-d128", 1, 8, 8, 128, 8192, lens8, 1, 0, 1, 4, 1, 0, 0},
        {"gqa32/8-d128", 4, 32, 8, 128, 8192, lens32, 0, 100, 0xa, 4, 1, 0,
         0},
        {"page17", 1, 9, 3, 64, 4096 + 256, short3, 1, 0, 1, 4, 1, 0, 0},
        {"bigpage", 1, 9, 3, 64, 65536, long3, 1, 0, 1, 4, 1, 0, 0},
        {"d128-bigpage", 2, 8, 2, 128, 1 << 17, lens8, 1, 333, 0x3, 4, 1, 0,
         0},
        {"big-logits", 1, 9, 3, 64, 4096, long3, 1, 0, 1, 40, 4, 0, 0},
        /* one loop for every format: quantized pages, then FP16 ones */
        {"int2+fp16", 4, 12, 4, 64, 4096, rag, 1, 0, 0x3, 4, 1,
         KV_FMT_INT2, 600},
        {"int4+fp16", 1, 9, 3, 64, 4096, long3, 1, 17, 1, 4, 1,
         KV_FMT_INT4, 4000},
        {"int2-d128", 4, 32, 8, 128, 8192, lens32, 0, 100, 0x5, 4, 1,
         KV_FMT_INT2, 300},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        if (cases[i].qtok && !kv_format_get(cases[i].qfmt)) {
            fprintf(stderr, "note: %s: format %u not built, case skipped\n",
                    cases[i].name, cases[i].qfmt);
            continue;
        }
        run_decode(&cases[i], 100 + i);
    }
}

/* ---- prefill ------------------------------------------------------------ */

typedef struct pcase {
    const char *name;
    uint32_t nq, nkv, d, page_bytes;
    const uint32_t *lens; /* [nkv] */
    uint32_t n_new;
    int ragged, stats;
    uint32_t row0;
    float qscale;
} pcase_t;

static void run_prefill(const pcase_t *c, uint64_t seed)
{
    uint64_t s = seed;
    fixture_t f;
    uint32_t G = c->nq / c->nkv, d = c->d;
    fixture_build(&f, d, c->page_bytes, c->nkv, c->lens, c->ragged, 1, &s);
    size_t nrow = (size_t)c->n_new * c->nq;
    float *q = xcalloc(nrow * d, sizeof *q);
    for (size_t j = 0; j < nrow * d; j++)
        q[j] = kv_test_randf(&s) * c->qscale;
    uint32_t stride = 0;
    for (uint32_t h = 0; h < c->nkv; h++)
        stride = f.seq_len[h] > stride ? f.seq_len[h] : stride;
    stride += 2;
    size_t sfl = (size_t)c->nkv * stride;
    float *out1 = xcalloc(nrow * d, sizeof(float));
    float *out2 = xcalloc(nrow * d, sizeof(float));
    float *st1 = xcalloc(sfl, sizeof(float));
    float *st2 = xcalloc(sfl, sizeof(float));
    for (size_t j = 0; j < sfl; j++)
        st1[j] = st2[j] = SENTINEL;
    kv_attn_prefill_params_t p = {
        .geom = f.geom, .n_q_heads = c->nq, .n_kv_heads = c->nkv,
        .indptr = f.indptr, .pages = f.pages, .seq_len = f.seq_len,
        .n_new = c->n_new, .q = q, .out = out1,
        .stats = c->stats ? st1 : NULL, .stats_stride = stride,
        .stats_row0 = c->row0, .scale = 1.0f / sqrtf((float)d),
    };
    int rc1 = be1.ops->attn_prefill(be1.ctx, &p);
    p.out = out2;
    p.stats = c->stats ? st2 : NULL;
    int rc2 = be2.ops->attn_prefill(be2.ctx, &p);
    CHECK_OK(rc1);
    CHECK_OK(rc2);
    CHECK(memcmp(out1, out2, nrow * d * sizeof(float)) == 0);
    CHECK(memcmp(st1, st2, sfl * sizeof(float)) == 0);

    double *ref = xcalloc(d, sizeof *ref);
    double *rst = xcalloc(stride, sizeof *rst);
    double worst = 0, worst_st = 0;
    long bad_sum = 0, bad_untouched = 0;
    for (uint32_t h = 0; h < c->nkv; h++) {
        uint32_t len = f.seq_len[h], base = len - c->n_new;
        memset(rst, 0, stride * sizeof *rst);
        for (uint32_t i = 0; i < c->n_new; i++)
            for (uint32_t g = 0; g < G; g++) {
                size_t row = (size_t)i * c->nq + (size_t)h * G + g;
                kv_test_dense_row(f.k[h], f.v[h], d, base + i + 1, q + row * d, p.scale, ref,
                          i >= c->row0 ? rst : NULL);
                double e = kv_test_rel_err(out1 + row * d, ref, d);
                worst = e > worst ? e : worst;
            }
        const float *sb = st1 + (size_t)h * stride;
        if (!c->stats) {
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
        double want = (double)G * (c->n_new - c->row0);
        bad_sum += fabs(tot - want) > 1e-3 * want;
        for (uint32_t t = len; t < stride; t++)
            bad_untouched += sb[t] != SENTINEL;
    }
    if (worst > 1e-3 || worst_st > 1e-3)
        fprintf(stderr, "prefill %s: out err %.3g stats err %.3g\n", c->name,
                worst, worst_st);
    CHECK(worst <= 1e-3);
    CHECK(worst_st <= 1e-3);
    CHECK_EQ(bad_sum, 0);
    CHECK_EQ(bad_untouched, 0);
    free(ref);
    free(rst);
    free(q);
    free(out1);
    free(out2);
    free(st1);
    free(st2);
    fixture_free(&f);
}

static void test_prefill(void)
{
    static const uint32_t l100[] = {100, 100, 100};
    static const uint32_t l300[] = {300, 300, 300};
    static const uint32_t diff[] = {200, 150, 181};
    static const uint32_t l130[8] = {130, 130, 130, 130, 130, 130, 130, 130};
    static const uint32_t l90[8] = {90, 95, 100, 90, 91, 92, 93, 94};
    static const uint32_t one[] = {1, 1, 1};
    static const uint32_t l40[] = {40, 41, 42};
    const pcase_t cases[] = {
        {"no-history", 9, 3, 64, 4096, l100, 100, 0, 1, 0, 4},
        {"history", 9, 3, 64, 4096, l300, 70, 1, 1, 0, 4},
        {"diff-lens", 9, 3, 64, 4096, diff, 50, 1, 1, 17, 4},
        {"mha-blocks", 8, 8, 64, 4096, l130, 130, 0, 1, 100, 4},
        {"gqa32/8-d128", 32, 8, 128, 8192, l90, 40, 1, 1, 39, 4},
        {"one", 9, 3, 64, 4096, one, 1, 0, 1, 0, 4},
        {"n_new1", 9, 3, 64, 4096, l300, 1, 1, 1, 0, 4},
        {"no-stats", 9, 3, 64, 4096, l300, 64, 0, 0, 0, 4},
        {"page17-bigq", 9, 3, 64, 4096 + 256, l40, 40, 1, 1, 5, 30},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        run_prefill(&cases[i], 200 + i);
}

/* ---- bad parameters, allocation failure, loop builds -------------------- */

static void test_errors(void)
{
    static const uint32_t lens[] = {40, 33, 1};
    uint64_t s = 77;
    fixture_t f;
    fixture_build(&f, 64, 4096, 3, lens, 1, 1, &s);
    float q[9 * 64], out[9 * 64], keep[9 * 64];
    for (int j = 0; j < 9 * 64; j++)
        q[j] = kv_test_randf(&s);
    for (int j = 0; j < 9 * 64; j++)
        out[j] = keep[j] = SENTINEL;
    float st[3 * 41], *sp[1] = {st};
    for (int j = 0; j < 3 * 41; j++)
        st[j] = SENTINEL;
    const kv_attn_decode_params_t good = {
        .geom = f.geom, .batch = 1, .n_q_heads = 9, .n_kv_heads = 3,
        .indptr = f.indptr, .pages = f.pages, .seq_len = f.seq_len,
        .q = q, .out = out, .stats = sp, .stats_stride = 41, .scale = 0.125f,
    };
    kv_attn_decode_params_t p;
    uint32_t bad_len[3] = {40, 34, 1}, zero_len[3] = {40, 33, 0};
    uint32_t bad_ind[4] = {f.indptr[0], f.indptr[2], f.indptr[1], f.indptr[3]};
    kv_kern_page_t *pg = xcalloc(f.indptr[3], sizeof *pg);
    long changed = 0;
#define EXPECT(rc_want, setup)                                               \
    do {                                                                     \
        p = good;                                                            \
        memcpy(pg, f.pages, f.indptr[3] * sizeof *pg);                       \
        p.pages = pg;                                                        \
        setup;                                                               \
        CHECK_EQ(be2.ops->attn_decode(be2.ctx, &p), rc_want);                \
        changed += memcmp(out, keep, sizeof out) != 0;                       \
        for (int j_ = 0; j_ < 3 * 41; j_++)                                  \
            changed += st[j_] != SENTINEL;                                   \
    } while (0)
    EXPECT(KV_EINVAL, p.q = NULL);
    EXPECT(KV_EINVAL, p.out = NULL);
    EXPECT(KV_EINVAL, p.indptr = NULL);
    EXPECT(KV_EINVAL, p.pages = NULL);
    EXPECT(KV_EINVAL, p.seq_len = NULL);
    EXPECT(KV_EINVAL, p.batch = 0);
    EXPECT(KV_EINVAL, p.n_q_heads = 8);
    EXPECT(KV_EINVAL, p.n_kv_heads = 0);
    EXPECT(KV_EINVAL, p.geom.head_dim = 60);
    EXPECT(KV_EINVAL, p.geom.page_bytes = 256); /* 1 token per page */
    EXPECT(KV_EINVAL, p.scale = 0.0f);
    EXPECT(KV_EINVAL, p.scale = NAN);
    EXPECT(KV_EINVAL, p.scale = INFINITY);
    EXPECT(KV_EINVAL, p.seq_len = bad_len);
    EXPECT(KV_EINVAL, p.seq_len = zero_len);
    EXPECT(KV_EINVAL, p.indptr = bad_ind);
    EXPECT(KV_EINVAL, pg[1].n_tokens = 0);
    EXPECT(KV_EINVAL, pg[1].n_tokens = 17);
    EXPECT(KV_EINVAL, pg[2].data = NULL);
    EXPECT(KV_EINVAL, pg[2].variant = 1); /* FP16 pages have no variants */
    EXPECT(KV_EINVAL, pg[2].variant = 2);
    for (uint32_t fm = 0; fm < KV_FMT_COUNT; fm++) /* not implemented yet */
        if (!kv_format_get(fm))
            EXPECT(KV_ENOTSUP, pg[3].format = fm);
    EXPECT(KV_ENOTSUP, pg[0].format = 99);
    EXPECT(KV_EINVAL, p.stats_stride = 39);
    EXPECT(0, p.stats_stride = 39; p.stats = NULL); /* no stats: fine */
    CHECK_EQ(changed, 1); /* only the last (valid) call wrote out */
    CHECK(kv_backend_cpu_create(0, NULL) == KV_EINVAL);

    /* allocation failure: ENOMEM, nothing written, nothing leaked */
    for (int j = 0; j < 9 * 64; j++)
        out[j] = SENTINEL;
    uint64_t live = kv_mem_live_bytes();
    kv_fault_arm(1);
    p = good;
    CHECK_EQ(be2.ops->attn_decode(be2.ctx, &p), KV_ENOMEM);
    CHECK(kv_fault_fired());
    kv_fault_arm(0);
    CHECK(memcmp(out, keep, sizeof out) == 0);
    for (int j = 0; j < 3 * 41; j++)
        CHECK(st[j] == SENTINEL);
    CHECK_EQ(kv_mem_live_bytes(), live);
    CHECK_OK(be2.ops->attn_decode(be2.ctx, &p));
    CHECK_EQ(kv_mem_live_bytes(), live);

    /* prefill */
    const kv_attn_prefill_params_t pgood = {
        .geom = f.geom, .n_q_heads = 9, .n_kv_heads = 3, .indptr = f.indptr,
        .pages = f.pages, .seq_len = f.seq_len, .n_new = 1, .q = q,
        .out = out, .stats = st, .stats_stride = 41, .stats_row0 = 0,
        .scale = 0.125f,
    };
    kv_attn_prefill_params_t pp;
    for (int j = 0; j < 9 * 64; j++)
        out[j] = SENTINEL;
    for (int j = 0; j < 3 * 41; j++)
        st[j] = SENTINEL;
    changed = 0;
#define PEXPECT(rc_want, setup)                                              \
    do {                                                                     \
        pp = pgood;                                                          \
        setup;                                                               \
        CHECK_EQ(be2.ops->attn_prefill(be2.ctx, &pp), rc_want);              \
        changed += memcmp(out, keep, sizeof out) != 0;                       \
        for (int j_ = 0; j_ < 3 * 41; j_++)                                  \
            changed += st[j_] != SENTINEL;                                   \
    } while (0)
    PEXPECT(KV_EINVAL, pp.n_new = 0);
    PEXPECT(KV_EINVAL, pp.n_new = 2); /* list 2 has 1 token */
    PEXPECT(KV_EINVAL, pp.stats_row0 = 1);
    PEXPECT(KV_EINVAL, pp.stats_stride = 20);
    PEXPECT(KV_EINVAL, pp.q = NULL);
    PEXPECT(KV_EINVAL, pp.n_q_heads = 10);
    PEXPECT(KV_EINVAL, pp.seq_len = bad_len);
    CHECK_EQ(changed, 0);
    kv_fault_arm(1);
    PEXPECT(KV_ENOMEM, (void)0);
    kv_fault_arm(0);
    CHECK_EQ(changed, 0);
    CHECK_EQ(kv_mem_live_bytes(), live);
#undef EXPECT
#undef PEXPECT
    free(pg);
    fixture_free(&f);
}

/* The generic and AVX2 builds of the loops give the same bits. */
static void test_loop_builds(void)
{
    kv_kern_cpu_t *cx = be2.ctx;
    if (strcmp(kv_kern_cpu_loops_avx2.isa, "avx2") != 0 ||
        cx->loops != &kv_kern_cpu_loops_avx2) {
        fprintf(stderr, "note: no AVX2 build on this CPU, one build only\n");
        return;
    }
    static const uint32_t lens[] = {1000, 77, 513};
    uint64_t s = 31;
    fixture_t f;
    fixture_build(&f, 64, 4096, 3, lens, 1, 1, &s);
    float q[9 * 64], o1[9 * 64], o2[9 * 64], s1[3 * 1000], s2[3 * 1000];
    float *sp1[1] = {s1}, *sp2[1] = {s2};
    for (int j = 0; j < 9 * 64; j++)
        q[j] = kv_test_randf(&s) * 4;
    for (int j = 0; j < 3 * 1000; j++)
        s1[j] = s2[j] = SENTINEL;
    kv_attn_decode_params_t p = {
        .geom = f.geom, .batch = 1, .n_q_heads = 9, .n_kv_heads = 3,
        .indptr = f.indptr, .pages = f.pages, .seq_len = f.seq_len, .q = q,
        .out = o1, .stats = sp1, .stats_stride = 1000, .scale = 0.125f,
    };
    CHECK_OK(be2.ops->attn_decode(be2.ctx, &p));
    cx->loops = &kv_kern_cpu_loops_generic;
    p.out = o2;
    p.stats = sp2;
    CHECK_OK(be2.ops->attn_decode(be2.ctx, &p));
    cx->loops = &kv_kern_cpu_loops_avx2;
    CHECK(memcmp(o1, o2, sizeof o1) == 0);
    CHECK(memcmp(s1, s2, sizeof s1) == 0);
    fixture_free(&f);
}

/* Several threads decode on one backend at once; every result must equal
 * the single-threaded one bit for bit. */
typedef struct conc_arg {
    const kv_backend_t *be;
    kv_attn_decode_params_t p; /* out points to this thread's buffer */
    const float *want;
    size_t n;
    int bad;
} conc_arg_t;

static void *conc_main(void *a_)
{
    conc_arg_t *a = a_;
    for (int it = 0; it < 40; it++) {
        memset(a->p.out, 0, a->n * sizeof(float));
        if (a->be->ops->attn_decode(a->be->ctx, &a->p) != 0 ||
            memcmp(a->p.out, a->want, a->n * sizeof(float)) != 0)
            a->bad++;
    }
    return NULL;
}

static void test_concurrent(void)
{
    enum { NT = 3 };
    static const uint32_t lens[] = {3000, 1, 700, 1500, 64, 2};
    uint64_t s = 57;
    fixture_t f;
    fixture_build(&f, 64, 4096, 6, lens, 1, 1, &s);
    kv_backend_t be3;
    CHECK_OK(kv_backend_cpu_create(3, &be3));
    size_t n = 2 * 9 * 64;
    float q[2 * 9 * 64], want[2 * 9 * 64], out[NT][2 * 9 * 64];
    for (size_t j = 0; j < n; j++)
        q[j] = kv_test_randf(&s) * 4;
    kv_attn_decode_params_t p = {
        .geom = f.geom, .batch = 2, .n_q_heads = 9, .n_kv_heads = 3,
        .indptr = f.indptr, .pages = f.pages, .seq_len = f.seq_len, .q = q,
        .out = want, .scale = 0.125f, .partition_tokens = 100,
    };
    CHECK_OK(be1.ops->attn_decode(be1.ctx, &p));
    conc_arg_t args[NT];
    pthread_t th[NT];
    int started = 0;
    for (int i = 0; i < NT; i++) {
        args[i] = (conc_arg_t){.be = &be3, .p = p, .want = want, .n = n};
        args[i].p.out = out[i];
        if (pthread_create(&th[i], NULL, conc_main, &args[i]) == 0)
            started++;
    }
    CHECK_EQ(started, NT);
    for (int i = 0; i < started; i++) {
        pthread_join(th[i], NULL);
        CHECK_EQ(args[i].bad, 0);
    }
    kv_backend_destroy(&be3);
    fixture_free(&f);
}

int main(void)
{
    if (kv_backend_cpu_create(1, &be1) || kv_backend_cpu_create(2, &be2)) {
        fprintf(stderr, "cannot create the CPU backend\n");
        return 1;
    }
    CHECK(strcmp(be1.ops->name, "cpu") == 0);
    test_decode();
    test_prefill();
    test_errors();
    test_loop_builds();
    test_concurrent();
    kv_backend_destroy(&be1);
    kv_backend_destroy(&be2);
    CHECK(be1.ops == NULL);
    kv_backend_destroy(&be1); /* twice: no-op */
    return kv_test_end();
}
