/* SPDX-License-Identifier: MIT */
/*
 * test_cuda_pages.h — random pages and page lists for the CUDA backend's
 * tests (header-only, tests only): pages of every format written through
 * the C format code (store, kv_fmt_merged_put), lists mixing formats and
 * variants (MERGED read as either layer, INT plain or rotated) with ragged
 * lengths, some pages shared between lists (as CoW forks and MERGED pairs
 * share them). Pages are host memory (aligned_alloc)
 * owned by the tcp_lists_t; aborts if memory runs out (test code only).
 */
#ifndef TEST_CUDA_PAGES_H
#define TEST_CUDA_PAGES_H

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/kv_backend.h"
#include "kv_test.h"
#include "formats/kv_fmt_merged.h"
#include "formats/kv_format.h"

static inline void *tcp_xalloc(size_t n)
{
    void *p = aligned_alloc(256, (n + 255) / 256 * 256);
    if (!p)
        abort();
    return p;
}

/* A page of format fmt (MERGED: directions dirf) holding n tokens of random
 * data (INT: whole groups are stored, n may end inside the last one),
 * stored as variant var (INT 1: rotated rows, kv_format_to_variant; else
 * ignored). */
static inline void tcp_fill_page(void *page, const kv_page_geom_t *g,
                                 uint32_t fmt, uint32_t dirf, uint32_t var,
                                 uint32_t n, uint64_t *rng)
{
    const uint32_t d = g->head_dim;
    memset(page, 0, g->page_bytes);
    if (fmt == KV_FMT_MERGED) {
        float *ek = tcp_xalloc(2 * d * sizeof(float)), *ev = ek + d;
        kv_fmt_merged_init(page, g, dirf);
        for (uint32_t s = 0; s < n; s++) {
            double nk = 0, nv = 0;
            for (uint32_t c = 0; c < d; c++) {
                ek[c] = kv_test_randf(rng);
                ev[c] = kv_test_randf(rng);
                nk += (double)ek[c] * ek[c];
                nv += (double)ev[c] * ev[c];
            }
            for (uint32_t c = 0; c < d; c++) {
                ek[c] = (float)(ek[c] / sqrt(nk));
                ev[c] = (float)(ev[c] / sqrt(nv));
            }
            const float norms[4] = {
                4.0f + 2.0f * kv_test_randf(rng),
                4.0f + 2.0f * kv_test_randf(rng), 3.0f + kv_test_randf(rng),
                s % 7 == 3 ? 0.0f : 3.0f + kv_test_randf(rng)};
            kv_fmt_merged_put(page, g, s, ek, ev, norms);
        }
        free(ek);
        return;
    }
    const kv_format_traits_t *tr = kv_format_get(fmt);
    const uint32_t m = fmt == KV_FMT_FP16 ? n : (n + 15) / 16 * 16;
    float *k = tcp_xalloc((size_t)2 * m * d * sizeof(float));
    float *v = k + (size_t)m * d;
    for (size_t i = 0; i < (size_t)m * d; i++) {
        k[i] = 2.0f * kv_test_randf(rng);
        v[i] = kv_test_randf(rng);
    }
    if (m >= 16) /* a constant key channel and value group: exact decode */
        for (uint32_t t = 0; t < 16; t++) {
            k[(size_t)t * d + 5] = 0.375f;
            for (uint32_t c = 16; c < 32 && c < d; c++)
                v[(size_t)t * d + c] = -1.25f;
        }
    kv_format_to_variant(fmt, var, g, m, k, v);
    tr->store(page, g, 0, m, KV_DTYPE_F32, k, v, d);
    free(k);
}

/* Lists in CSR form, as a backend receives them. */
typedef struct tcp_lists {
    uint32_t n_lists, n_pages;
    uint32_t *indptr;      /* [n_lists + 1]                   */
    uint32_t *seq_len;     /* [n_lists]                       */
    kv_kern_page_t *pages; /* [n_pages]                       */
    void **owned;          /* [n_owned] pages to free         */
    uint32_t n_owned;
} tcp_lists_t;

/* Format choices for tcp_make_lists: TCP_FMT_MIX or TCP_FMT_ONLY(format),
 * optionally | TCP_ROT_SOME or TCP_ROT_ALL (INT pages rotated). */
#define TCP_FMT_MIX 0u /* every format, MERGED both variants */
#define TCP_FMT_ONLY(f) (1u + (f))
#define TCP_ROT_SOME 0x100u /* INT pages: variant 0 or 1 (rotated) at random */
#define TCP_ROT_ALL 0x200u  /* INT pages: all rotated (variant 1)         */

/* n_lists lists of lengths len[i] of random pages. mix: a format choice
 * above. Every third list starts with the first page of the list before it
 * (shared, read alike). */
static inline void tcp_make_lists(tcp_lists_t *L, const kv_page_geom_t *g,
                                  uint32_t n_lists, const uint32_t *len,
                                  uint32_t mix, uint64_t *rng)
{
    memset(L, 0, sizeof *L);
    uint64_t cap = 0;
    for (uint32_t i = 0; i < n_lists; i++)
        cap += len[i] + 1;
    L->n_lists = n_lists;
    L->indptr = tcp_xalloc((n_lists + 1) * sizeof(uint32_t));
    L->seq_len = tcp_xalloc(n_lists * sizeof(uint32_t));
    L->pages = tcp_xalloc(cap * sizeof(kv_kern_page_t));
    L->owned = tcp_xalloc(cap * sizeof(void *));
    for (uint32_t i = 0; i < n_lists; i++) {
        L->indptr[i] = L->n_pages;
        L->seq_len[i] = len[i];
        uint32_t have = 0;
        if (i % 3 == 2 && i > 0) { /* share the previous list's first page */
            kv_kern_page_t pg = L->pages[L->indptr[i - 1]];
            if (pg.n_tokens <= len[i]) {
                L->pages[L->n_pages++] = pg;
                have = pg.n_tokens;
            }
        }
        while (have < len[i]) {
            const uint32_t fm = mix & 0xffu;
            uint32_t fmt = fm == TCP_FMT_MIX
                               ? (uint32_t)(kv_test_rand(rng) % 4)
                               : fm - 1;
            uint32_t dirf = kv_test_rand(rng) % 2 ? KV_FMT_INT4 : KV_FMT_FP16;
            const int rot = fmt != KV_FMT_MERGED &&
                            kv_format_variants(fmt, g) > 1; /* INT, 2^k dims */
            uint32_t var = 0;
            if (rot && (mix & TCP_ROT_ALL))
                var = 1;
            else if (rot && (mix & TCP_ROT_SOME))
                var = (uint32_t)(kv_test_rand(rng) % 2);
            uint32_t tpp = fmt == KV_FMT_MERGED
                               ? kv_fmt_merged_capacity(g, dirf)
                               : kv_format_get(fmt)->tokens_per_page(g);
            uint32_t n = 1 + (uint32_t)(kv_test_rand(rng) % tpp);
            if (kv_test_rand(rng) % 2)
                n = tpp; /* full pages are the common case */
            if (n > len[i] - have)
                n = len[i] - have;
            void *page = tcp_xalloc(g->page_bytes);
            tcp_fill_page(page, g, fmt, dirf, var, n, rng);
            /* a MERGED page's layer is drawn after the fill, as it was
             * before TCP_ROT_*: lists without them draw the same numbers */
            if (fmt == KV_FMT_MERGED)
                var = (uint32_t)(kv_test_rand(rng) % 2);
            L->owned[L->n_owned++] = page;
            L->pages[L->n_pages++] = (kv_kern_page_t){
                .data = page, .n_tokens = n, .format = fmt, .variant = var};
            have += n;
        }
    }
    L->indptr[n_lists] = L->n_pages;
}

static inline void tcp_free_lists(tcp_lists_t *L)
{
    for (uint32_t i = 0; i < L->n_owned; i++)
        free(L->owned[i]);
    free(L->indptr);
    free(L->seq_len);
    free(L->pages);
    free(L->owned);
    memset(L, 0, sizeof *L);
}

/* Compare x[n] against ref[n]: every |x - ref| <= tol * max|ref| (FP32
 * results of two backends; NaN fails). Counts one pass or failure. */
/* Largest error / max |ref| of tcp_check_close so far, by what was
 * compared (printed by tcp_report): [0] outputs of calls without a forced
 * split, [1] outputs of split-K calls ("part=64" or "split" in the label:
 * attention partials + the reduce kernel), [2] statistics. */
static double tcp_max_rel[3];

/* Which CUDA runs this: "emulated" in the emulation build (docs/gpu.md,
 * tests cuda_emu/...: kernels/cuda/ compiled as host C++), else "device". */
#ifdef KV_CUDA_EMU
#define TCP_CUDA_KIND "emulated (kernels/cuda/emu on the CPU, not a GPU)"
#else
#define TCP_CUDA_KIND "device"
#endif

static inline void tcp_report(const char *prog, int selfcheck)
{
    printf("%s: CUDA backend %s; largest error vs the CPU backend, relative "
           "to max |ref|: outputs %.3g, split-K outputs %.3g, statistics "
           "%.3g\n",
           prog, selfcheck ? "replaced by the CPU backend (selfcheck)"
                           : TCP_CUDA_KIND,
           tcp_max_rel[0], tcp_max_rel[1], tcp_max_rel[2]);
}

static inline void tcp_check_close(const float *x, const float *ref, size_t n,
                                   double tol, const char *what)
{
    double mag = 1e-30, err = 0;
    size_t at = 0;
    for (size_t i = 0; i < n; i++)
        mag = fmax(mag, fabs(ref[i]));
    for (size_t i = 0; i < n; i++) {
        double e = isfinite(x[i]) ? fabs((double)x[i] - ref[i]) : INFINITY;
        if (e > err) {
            err = e;
            at = i;
        }
    }
    const int cat = strstr(what, "stats")     ? 2
                    : strstr(what, "part=64") || strstr(what, "split") ? 1
                                                                    : 0;
    if (err / mag > tcp_max_rel[cat])
        tcp_max_rel[cat] = err / mag;
    if (err <= tol * mag) {
        kv_test_pass_++;
    } else {
        kv_test_fail_++;
        fprintf(stderr, "%s: error %g at %zu (%g vs %g), max |ref| %g\n", what,
                err, at, (double)x[at], (double)ref[at], mag);
    }
}

#endif /* TEST_CUDA_PAGES_H */
