/* SPDX-License-Identifier: MIT */
/*
 * kv_test_kern.h — the fixture the kernel-level attention tests share
 * (test_attn_cpu, test_attn_mixed, test_attn_codes): lists of FP16, INT4 and
 * INT2 pages built in test-owned buffers through each format's traits (no
 * page table), with the values each list decodes to, laid out as a
 * kv_test_layout_t describes (a test states its layout, it does not build
 * pages itself); and one case (kv_test_run_decode / kv_test_run_prefill):
 * a call over such lists on one or more backends, checked for identical
 * bits across backends and against the dense reference of kv_test_attn.h
 * over the decoded values.
 *
 * Invariants of a kv_test_lists_t: list i's tokens lie in pages
 * [indptr[i], indptr[i+1]) in order, each page holding n_tokens >= 1 of
 * them; k[i], v[i] ([seq_len[i]][head_dim]) are what those pages decode to
 * (each page through its own format's load), so quantization error never
 * enters a comparison; k0, v0 (when asked for) are the values the pages
 * were stored from. Unused page bytes are 0xff (NaN halfs), so a kernel
 * that reads past n_tokens gives NaN. The lists own every buffer (calloc)
 * until kv_test_lists_free. Allocation failure exits 2 (test code only).
 */
#ifndef KV_TEST_KERN_H
#define KV_TEST_KERN_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/kv_backend.h"
#include "kv_test.h"
#include "kv_test_attn.h"
#include "formats/kv_fmt_fp16.h"
#include "formats/kv_fmt_int.h"

/* calloc that never returns NULL (0 counts as 1). */
static inline void *kv_test_xcalloc(size_t n, size_t sz)
{
    void *p = calloc(n ? n : 1, sz ? sz : 1);
    if (!p) {
        fprintf(stderr, "out of memory\n");
        exit(2);
    }
    return p;
}

/* The traits of FP16, INT4 or INT2 (the objects themselves, not the table:
 * pages can be built even where the table lacks a format). */
static inline const kv_format_traits_t *kv_test_traits(uint32_t fmt)
{
    return fmt == KV_FMT_INT2   ? &kv_fmt_int2
           : fmt == KV_FMT_INT4 ? &kv_fmt_int4
                                : &kv_fmt_fp16;
}

/* Random FP16-valued rows for ns tokens (k, v: [ns][d]): K = kscale * U,
 * V = U, U uniform in [-1, 1). With `shapes`, some 16-token K channel runs
 * and V channel groups are constant and some tokens are 100x wider, so that
 * constant groups (scale 0) and wide ones both occur in INT pages. */
static inline void kv_test_fill_kv(float *k, float *v, uint32_t ns,
                                   uint32_t d, float kscale, int shapes,
                                   uint64_t *s)
{
    for (uint32_t t = 0; t < ns; t++) {
        float wide = shapes && t % 16 == 5 ? 100.0f : 1.0f;
        for (uint32_t c = 0; c < d; c++) {
            float kx = kscale * kv_test_randf(s) * wide;
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

/* A page of format fmt holding n tokens from kv_test_fill_kv (INT: whole
 * groups stored, the last one partly used when n % 16), stored as variant
 * `variant` (INT: 1 = rotated, kv_format_to_variant before the store). kd,
 * vd ([n][d]): its rows as kv_format_load decodes them for that variant;
 * k0, v0 (if not NULL, [n][d]): the values given (before any rotation).
 * Unused page bytes are 0xff. The caller frees the page. */
static inline void *kv_test_make_page(uint32_t fmt, uint32_t variant,
                                      const kv_page_geom_t *g,
                                      uint32_t n, float kscale, int shapes,
                                      uint64_t *s, float *kd, float *vd,
                                      float *k0, float *v0)
{
    const kv_format_traits_t *tr = kv_test_traits(fmt);
    const uint32_t d = g->head_dim;
    const uint32_t ns = fmt == KV_FMT_FP16 ? n : (n + 15) / 16 * 16;
    float *k = kv_test_xcalloc((size_t)ns * d, sizeof *k);
    float *v = kv_test_xcalloc((size_t)ns * d, sizeof *v);
    kv_test_fill_kv(k, v, ns, d, kscale, shapes, s);
    void *page = kv_test_xcalloc(g->page_bytes, 1);
    memset(page, 0xff, g->page_bytes);
    if (k0)
        memcpy(k0, k, (size_t)n * d * sizeof *k);
    if (v0)
        memcpy(v0, v, (size_t)n * d * sizeof *v);
    kv_format_to_variant(fmt, variant, g, ns, k, v);
    tr->store(page, g, 0, ns, KV_DTYPE_F32, k, v, d);
    kv_format_load(fmt, variant, page, g, 0, n, kd, vd);
    free(k);
    free(v);
    return page;
}

/* ---- page lists ------------------------------------------------------- */

/* How a case's lists are laid out and filled. Page j of list i: while the
 * list's first lead_tok tokens (rounded down to whole 16-token groups) are
 * not placed, a lead_fmt page holding a random multiple of 16 tokens
 * (partly filled pages in the middle); then pages of the formats in fmts
 * in turn, each full but the list's last, or (ragged) holding 1..T tokens
 * at random. Per page the layout draws first, then the page's data. */
typedef struct kv_test_layout {
    uint32_t d, page_bytes;      /* head_dim, bytes per page                */
    const uint32_t *lens;        /* [lists] tokens                          */
    const char *fmts;            /* '0' FP16, '1' INT4, '2' INT2, '?' one   */
                                 /* of the three at random                  */
    int by_list;                 /* page j of list i: fmts[(i + j) % len]   */
                                 /* (else fmts[j % len])                    */
    int ragged;                  /* random page fill                        */
    int shapes;                  /* odd pages: kv_test_fill_kv's shapes     */
    float kscale;                /* K = kscale * U[-1, 1)                   */
    int originals;               /* keep k0, v0 (the control)               */
    uint32_t lead_fmt, lead_tok; /* leading tokens in lead_fmt pages        */
    int rot;                     /* INT pages stored rotated (variant 1)    */
} kv_test_layout_t;

typedef struct kv_test_lists {
    kv_page_geom_t geom;
    uint32_t n;                    /* lists                                */
    uint32_t *indptr;              /* [n + 1] into pages                   */
    uint32_t *seq_len;             /* [n] tokens                           */
    kv_kern_page_t *pages;         /* [indptr[n]]                          */
    float **k, **v;                /* [n] of [seq_len][d]: decoded         */
    float **k0, **v0;              /* [n] of [seq_len][d]: stored; NULL    */
                                   /* unless the layout asks for them      */
    uint32_t by_fmt[KV_FMT_COUNT]; /* pages per format                     */
} kv_test_lists_t;

/* Page j of list i, which starts at token t of len: *fmt and its tokens. */
static inline uint32_t kv_test_layout_page(const kv_test_layout_t *lo,
                                           const kv_page_geom_t *g,
                                           uint32_t i, uint32_t j,
                                           uint32_t t, uint32_t len,
                                           uint64_t *s, uint32_t *fmt)
{
    const uint32_t lead = (lo->lead_tok < len ? lo->lead_tok : len) / 16 * 16;
    if (t < lead) {
        uint32_t tpp = kv_test_traits(lo->lead_fmt)->tokens_per_page(g);
        uint32_t n = 16 * (1 + (uint32_t)(kv_test_rand(s) % (tpp / 16)));
        *fmt = lo->lead_fmt;
        return n < lead - t ? n : lead - t;
    }
    const char c = lo->fmts[(j + (lo->by_list ? i : 0)) % strlen(lo->fmts)];
    *fmt = c == '?' ? (uint32_t)(kv_test_rand(s) % 3) : (uint32_t)(c - '0');
    if (*fmt != KV_FMT_FP16 && *fmt != KV_FMT_INT4 && *fmt != KV_FMT_INT2) {
        fprintf(stderr, "kv_test_layout: bad format '%c'\n", c);
        exit(2);
    }
    uint32_t tpp = kv_test_traits(*fmt)->tokens_per_page(g);
    uint32_t n = lo->ragged ? 1 + (uint32_t)(kv_test_rand(s) % tpp) : tpp;
    return n < len - t ? n : len - t;
}

/* n lists laid out by lo (lo->lens[0..n)). */
static inline void kv_test_lists_build(kv_test_lists_t *L, uint32_t n,
                                       const kv_test_layout_t *lo,
                                       uint64_t *s)
{
    const uint32_t d = lo->d;
    memset(L, 0, sizeof *L);
    L->geom = (kv_page_geom_t){.head_dim = d, .page_bytes = lo->page_bytes};
    L->n = n;
    size_t max_pages = 0;
    for (uint32_t i = 0; i < n; i++)
        max_pages += lo->lens[i];
    L->indptr = kv_test_xcalloc(n + 1, sizeof *L->indptr);
    L->seq_len = kv_test_xcalloc(n, sizeof *L->seq_len);
    L->pages = kv_test_xcalloc(max_pages, sizeof *L->pages);
    L->k = kv_test_xcalloc(n, sizeof *L->k);
    L->v = kv_test_xcalloc(n, sizeof *L->v);
    if (lo->originals) {
        L->k0 = kv_test_xcalloc(n, sizeof *L->k0);
        L->v0 = kv_test_xcalloc(n, sizeof *L->v0);
    }
    uint32_t np = 0;
    for (uint32_t i = 0; i < n; i++) {
        const uint32_t len = lo->lens[i];
        L->indptr[i] = np;
        L->seq_len[i] = len;
        L->k[i] = kv_test_xcalloc((size_t)len * d, sizeof(float));
        L->v[i] = kv_test_xcalloc((size_t)len * d, sizeof(float));
        if (L->k0) {
            L->k0[i] = kv_test_xcalloc((size_t)len * d, sizeof(float));
            L->v0[i] = kv_test_xcalloc((size_t)len * d, sizeof(float));
        }
        for (uint32_t t = 0, j = 0, fmt; t < len; j++) {
            uint32_t m = kv_test_layout_page(lo, &L->geom, i, j, t, len, s,
                                             &fmt);
            const size_t at = (size_t)t * d;
            const uint32_t var = lo->rot && fmt != KV_FMT_FP16;
            void *page = kv_test_make_page(
                fmt, var, &L->geom, m, lo->kscale, lo->shapes && j % 2, s,
                L->k[i] + at, L->v[i] + at, L->k0 ? L->k0[i] + at : NULL,
                L->v0 ? L->v0[i] + at : NULL);
            L->pages[np++] = (kv_kern_page_t){
                .data = page, .n_tokens = m, .format = fmt, .variant = var};
            L->by_fmt[fmt]++;
            t += m;
        }
    }
    L->indptr[n] = np;
}

static inline void kv_test_lists_free(kv_test_lists_t *L)
{
    for (uint32_t e = 0; e < L->indptr[L->n]; e++)
        free((void *)L->pages[e].data);
    for (uint32_t i = 0; i < L->n; i++) {
        free(L->k[i]);
        free(L->v[i]);
        if (L->k0) {
            free(L->k0[i]);
            free(L->v0[i]);
        }
    }
    free(L->indptr);
    free(L->seq_len);
    free(L->pages);
    free(L->k);
    free(L->v);
    free(L->k0);
    free(L->v0);
    memset(L, 0, sizeof *L);
}

/* CHECK: the lists hold pages of every format the layout names ('?': all
 * three; the lead format when lead_tok >= 16). */
static inline void kv_test_lists_check_formats(const kv_test_lists_t *L,
                                               const kv_test_layout_t *lo)
{
    int ok = lo->lead_tok < 16 || L->by_fmt[lo->lead_fmt] > 0;
    for (const char *c = lo->fmts; *c; c++)
        ok &= *c == '?' ? L->by_fmt[KV_FMT_FP16] && L->by_fmt[KV_FMT_INT4] &&
                              L->by_fmt[KV_FMT_INT2]
                        : L->by_fmt[*c - '0'] > 0;
    if (!ok)
        fprintf(stderr, "lists: pages by format %u %u %u, layout \"%s\"\n",
                L->by_fmt[KV_FMT_FP16], L->by_fmt[KV_FMT_INT4],
                L->by_fmt[KV_FMT_INT2], lo->fmts);
    CHECK(ok);
}

/* The longest list's tokens. */
static inline uint32_t kv_test_lists_max_len(const kv_test_lists_t *L)
{
    uint32_t m = 0;
    for (uint32_t i = 0; i < L->n; i++)
        m = L->seq_len[i] > m ? L->seq_len[i] : m;
    return m;
}

/* Output row `row` (of out, query row `row` of q) against dense attention
 * over the first n tokens of list li: into e->out, and, when the lists
 * keep their originals, e->control (the same over the stored values); the
 * reference probabilities are added to rst (if not NULL). ref: [d]. */
static inline void kv_test_check_attn_row(const kv_test_lists_t *L,
                                          uint32_t li, uint32_t n,
                                          const float *q, const float *out,
                                          size_t row, double scale,
                                          double *ref, double *rst,
                                          kv_test_attn_errs_t *e)
{
    const uint32_t d = L->geom.head_dim;
    kv_test_dense_row(L->k[li], L->v[li], d, n, q + row * d, scale, ref, rst);
    e->out = fmax(e->out, kv_test_rel_err(out + row * d, ref, d));
    if (L->k0) {
        kv_test_dense_row(L->k0[li], L->v0[li], d, n, q + row * d, scale,
                          ref, NULL);
        e->control = fmax(e->control, kv_test_rel_err(out + row * d, ref, d));
    }
}

/* ---- one case: a call on several backends, checked -------------------- */

/* One case: its lists and the buffers of one call on n_be backends. */
typedef struct kv_test_case {
    kv_test_lists_t L;
    uint32_t n_be;
    uint32_t stride;  /* statistics row: the longest list + a pad       */
    size_t nout, nst; /* floats of one backend's output, statistics    */
    float *q;         /* [nout] qscale * U[-1, 1)                      */
    float *out;       /* [n_be][nout]                                  */
    float *st;        /* [n_be][nst = lists * stride], KV_TEST_SENTINEL */
                      /* before the call                               */
    double *ref;      /* [d] a reference row                           */
    double *rst;      /* [stride] reference probabilities              */
} kv_test_case_t;

/* n_lists lists laid out by lo (drawn from seed), their formats checked,
 * then q for q_rows query rows; statistics rows max len + pad wide. */
static inline void kv_test_case_open(kv_test_case_t *k,
                                     const kv_test_layout_t *lo,
                                     uint32_t n_lists, uint32_t n_be,
                                     size_t q_rows, uint32_t pad,
                                     float qscale, uint64_t seed)
{
    uint64_t s = seed;
    memset(k, 0, sizeof *k);
    kv_test_lists_build(&k->L, n_lists, lo, &s);
    kv_test_lists_check_formats(&k->L, lo);
    k->n_be = n_be;
    k->stride = kv_test_lists_max_len(&k->L) + pad;
    k->nout = q_rows * lo->d;
    k->nst = (size_t)n_lists * k->stride;
    k->q = kv_test_xcalloc(k->nout, sizeof *k->q);
    for (size_t j = 0; j < k->nout; j++)
        k->q[j] = kv_test_randf(&s) * qscale;
    k->out = kv_test_xcalloc(n_be * k->nout, sizeof *k->out);
    k->st = kv_test_xcalloc(n_be * k->nst, sizeof *k->st);
    for (size_t j = 0; j < n_be * k->nst; j++)
        k->st[j] = KV_TEST_SENTINEL;
    k->ref = kv_test_xcalloc(lo->d, sizeof *k->ref);
    k->rst = kv_test_xcalloc(k->stride, sizeof *k->rst);
}

/* CHECK: every backend's output and statistics equal be[0]'s bit for bit. */
static inline void kv_test_case_same(const kv_test_case_t *k)
{
    for (uint32_t x = 1; x < k->n_be; x++) {
        CHECK(memcmp(k->out + x * k->nout, k->out,
                     k->nout * sizeof *k->out) == 0);
        CHECK(memcmp(k->st + x * k->nst, k->st, k->nst * sizeof *k->st) == 0);
    }
}

static inline void kv_test_case_close(kv_test_case_t *k)
{
    kv_test_lists_free(&k->L);
    free(k->q);
    free(k->out);
    free(k->st);
    free(k->ref);
    free(k->rst);
}

/* A decode call over batch * nkv lists (list b * nkv + h). */
typedef struct kv_test_decode {
    const char *name;
    uint32_t batch, nq, nkv;
    uint32_t part;       /* partition_tokens (0 = default)     */
    uint32_t stats_mask; /* bit b: batch row b wants stats     */
    float qscale;        /* q = qscale * U[-1, 1)              */
} kv_test_decode_t;

/* One decode case: lists laid out by lo (drawn from seed, then q), their
 * formats checked; decode on each of be[0..n_be) with scale 1/sqrt(d) and
 * statistics rows max len + 3 wide. Checks: every call returns 0; every
 * backend's outputs and statistics equal be[0]'s bit for bit; be[0]'s
 * against the dense reference (kv_test_attn_report, with the control when
 * the layout keeps originals): statistics of the rows that asked for them
 * sum the group's G heads (total G), the other rows' stay untouched. */
static inline void kv_test_run_decode(const kv_backend_t *be, uint32_t n_be,
                                      const kv_test_layout_t *lo,
                                      const kv_test_decode_t *c,
                                      uint64_t seed)
{
    kv_test_case_t k;
    kv_test_case_open(&k, lo, c->batch * c->nkv, n_be,
                      (size_t)c->batch * c->nq, 3, c->qscale, seed);
    const kv_test_lists_t *L = &k.L;
    const uint32_t G = c->nq / c->nkv, stride = k.stride;
    const size_t sfl = (size_t)c->nkv * stride; /* one batch row's stats */
    float **sp = kv_test_xcalloc(c->batch, sizeof *sp);
    kv_attn_decode_params_t p = {
        .geom = L->geom, .batch = c->batch, .n_q_heads = c->nq,
        .n_kv_heads = c->nkv, .indptr = L->indptr, .pages = L->pages,
        .seq_len = L->seq_len, .q = k.q, .stats = c->stats_mask ? sp : NULL,
        .stats_stride = stride, .scale = 1.0f / sqrtf((float)lo->d),
        .partition_tokens = c->part,
    };
    for (uint32_t x = 0; x < n_be; x++) {
        for (uint32_t b = 0; b < c->batch; b++)
            sp[b] = c->stats_mask & (1u << b) ? k.st + x * k.nst + b * sfl
                                              : NULL;
        p.out = k.out + x * k.nout;
        CHECK_OK(be[x].ops->attn_decode(be[x].ctx, &p));
    }
    kv_test_case_same(&k);
    kv_test_attn_errs_t e = {0};
    for (uint32_t b = 0; b < c->batch; b++)
        for (uint32_t h = 0; h < c->nkv; h++) {
            const uint32_t li = b * c->nkv + h;
            memset(k.rst, 0, stride * sizeof *k.rst);
            for (uint32_t g = 0; g < G; g++)
                kv_test_check_attn_row(L, li, L->seq_len[li], k.q, k.out,
                                       (size_t)b * c->nq + (size_t)h * G + g,
                                       p.scale, k.ref, k.rst, &e);
            kv_test_check_stats(k.st + b * sfl + (size_t)h * stride,
                                c->stats_mask & (1u << b) ? k.rst : NULL,
                                L->seq_len[li], stride, G, &e);
        }
    kv_test_attn_report("decode", c->name, &e, L->k0 != NULL);
    free(sp);
    kv_test_case_close(&k);
}

/* A prefill call over nkv lists: their last n_new tokens are the rows. */
typedef struct kv_test_prefill {
    const char *name;
    uint32_t nq, nkv;
    uint32_t n_new, row0; /* new rows; the first one counted for stats */
    int stats;            /* ask for statistics                       */
    float qscale;         /* q = qscale * U[-1, 1)                    */
} kv_test_prefill_t;

/* One causal prefill case, like kv_test_run_decode (statistics rows max
 * len + 2 wide): row i of list h attends to its first len - n_new + i + 1
 * tokens; statistics sum rows row0.. of the group (total G * (n_new -
 * row0)), or stay untouched without stats. */
static inline void kv_test_run_prefill(const kv_backend_t *be, uint32_t n_be,
                                       const kv_test_layout_t *lo,
                                       const kv_test_prefill_t *c,
                                       uint64_t seed)
{
    kv_test_case_t k;
    kv_test_case_open(&k, lo, c->nkv, n_be, (size_t)c->n_new * c->nq, 2,
                      c->qscale, seed);
    const kv_test_lists_t *L = &k.L;
    const uint32_t G = c->nq / c->nkv, stride = k.stride;
    kv_attn_prefill_params_t p = {
        .geom = L->geom, .n_q_heads = c->nq, .n_kv_heads = c->nkv,
        .indptr = L->indptr, .pages = L->pages, .seq_len = L->seq_len,
        .n_new = c->n_new, .q = k.q, .stats_stride = stride,
        .stats_row0 = c->row0, .scale = 1.0f / sqrtf((float)lo->d),
    };
    for (uint32_t x = 0; x < n_be; x++) {
        p.out = k.out + x * k.nout;
        p.stats = c->stats ? k.st + x * k.nst : NULL;
        CHECK_OK(be[x].ops->attn_prefill(be[x].ctx, &p));
    }
    kv_test_case_same(&k);
    kv_test_attn_errs_t e = {0};
    for (uint32_t h = 0; h < c->nkv; h++) {
        const uint32_t len = L->seq_len[h], base = len - c->n_new;
        memset(k.rst, 0, stride * sizeof *k.rst);
        for (uint32_t i = 0; i < c->n_new; i++)
            for (uint32_t g = 0; g < G; g++)
                kv_test_check_attn_row(L, h, base + i + 1, k.q, k.out,
                                       (size_t)i * c->nq + (size_t)h * G + g,
                                       p.scale, k.ref,
                                       i >= c->row0 ? k.rst : NULL, &e);
        kv_test_check_stats(k.st + (size_t)h * stride, c->stats ? k.rst : NULL,
                            len, stride, (double)G * (c->n_new - c->row0),
                            &e);
    }
    kv_test_attn_report("prefill", c->name, &e, L->k0 != NULL);
    kv_test_case_close(&k);
}

#endif /* KV_TEST_KERN_H */
