/* SPDX-License-Identifier: MIT */
/*
 * test_cuda_host.c — the host-side parts of the CUDA backend; runs (and can
 * fail) without a GPU:
 *   - formats/kv_fmt_codec.h, the per-element math the kernels decode and
 *     encode with, against the C formats bit for bit: kv_fmt_codec_load8 vs
 *     kv_format_load (whose INT load is its own vector code) on pages of every
 *     format and variant (rotated INT pages: load8 then kv_fmt_rot_inv, as
 *     the kernels un-rotate, and kv_fmt_codec_rotated agreeing with the
 *     traits), groups laid out from kv_fmt_codec_quantize16 vs the INT
 *     stores' pages, and the byte ranges kv_fmt_codec_ranges says a token
 *     range is decoded from. (binary16 is not compared here: kv_half.c calls
 *     the codec's conversions, which tests/unit/test_half.c checks against an
 *     independent reference, all 65536 halfs and rounding edges);
 *   - planning (kv_cuda_plan_build): page dedupe in staged mode, arena
 *     indices and rejected pointers in device mode, work items that tile
 *     every list in order from the right (entry, offset), statistics items
 *     and offsets, the single-pass decision, rows per block, the rotated
 *     flag (set iff a list holds a rotated INT page);
 *   - conversion locations (kv_cuda_convert_locs) and their errors; bad
 *     source pages answered alike by kv_cuda_check_convert and the CPU
 *     kernel (one check: kv_kern_check_run);
 *   - validation and dispatch errors: the CPU checks' errors, KV_ENOTSUP for
 *     head dims and page sizes no kernel was built for, rotated pages and
 *     rotated conversions accepted as the CPU accepts them (bad stored
 *     variants: KV_EINVAL from both), launcher argument errors, and (only
 *     without a GPU) KV_ENOTSUP from create/pool create.
 */
#include <string.h>

#include "kernels/cpu/kv_cpu.h"
#include "kernels/cpu/kv_cpu_convert.h"
#include "kernels/cuda/kv_cuda.h"
#include "kv_test.h"
#include "formats/kv_fmt_codec.h"
#include "formats/kv_fmt_rot.h"
#include "test_cuda_pages.h"

static uint32_t f2u(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

/* kv_fmt_codec_load8 over every token / 8 channels of a page, rows of
 * rotated pages (kv_fmt_codec_rotated) then un-rotated with kv_fmt_rot_inv
 * as the CUDA kernels do == kv_format_load, bit for bit; and the raw load8
 * values the same from a copy holding only the kv_fmt_codec_ranges bytes
 * of a token range (the rest poisoned). */
static void check_page(const void *page, const kv_page_geom_t *g, uint32_t fmt,
                       uint32_t var, uint32_t n, const char *what)
{
    const uint32_t d = g->head_dim;
    float *k = tcp_xalloc((size_t)2 * (n + 1) * d * sizeof(float)),
          *v = k + (size_t)n * d, *rk = v + (size_t)n * d, *rv = rk + d;
    uint8_t *masked = tcp_xalloc(g->page_bytes);
    kv_format_load(fmt, var, page, g, 0, n, k, v);
    const int rot = kv_fmt_codec_rotated(fmt, var);
    CHECK_EQ(rot, var != 0 && kv_format_get(fmt)->to_variant != NULL);
    long bad = 0;
    for (uint32_t t = 0; t < n; t++) {
        for (uint32_t c0 = 0; c0 < d; c0 += 8) {
            kv_fmt_codec_load8(fmt, var, page, d, g->page_bytes, t, c0, 0,
                               rk + c0);
            kv_fmt_codec_load8(fmt, var, page, d, g->page_bytes, t, c0, 1,
                               rv + c0);
        }
        if (rot) {
            kv_fmt_rot_inv(rk, d);
            kv_fmt_rot_inv(rv, d);
        }
        for (uint32_t c = 0; c < d; c++)
            bad += f2u(rk[c]) != f2u(k[(size_t)t * d + c]) ||
                   f2u(rv[c]) != f2u(v[(size_t)t * d + c]);
    }
    if (bad)
        fprintf(stderr, "%s: %ld values differ\n", what, bad);
    CHECK_EQ(bad, 0);
    /* ranges: tokens [t0, t0 + m) decode from the ranges' bytes alone */
    const uint32_t t0 = n / 3, m = n - t0 < 19 ? n - t0 : 19;
    uint32_t lo[2], hi[2];
    uint32_t nr = kv_fmt_codec_ranges(fmt, d, g->page_bytes, t0, m, lo, hi);
    memset(masked, 0xa5, g->page_bytes);
    for (uint32_t x = 0; x < nr; x++) {
        CHECK(lo[x] % 16 == 0 && hi[x] % 16 == 0 && hi[x] <= g->page_bytes);
        memcpy(masked + lo[x], (const uint8_t *)page + lo[x], hi[x] - lo[x]);
    }
    bad = 0;
    for (uint32_t t = t0; t < t0 + m; t++)
        for (uint32_t c0 = 0; c0 < d; c0 += 8)
            for (uint32_t which = 0; which < 2; which++) {
                float o[8], p[8];
                kv_fmt_codec_load8(fmt, var, page, d, g->page_bytes, t, c0,
                                   which, o);
                kv_fmt_codec_load8(fmt, var, masked, d, g->page_bytes, t, c0,
                                   which, p);
                bad += memcmp(o, p, sizeof o) != 0;
            }
    CHECK_EQ(bad, 0);
    free(k);
    free(masked);
}

static void test_decode(void)
{
    static const kv_page_geom_t geoms[] = {
        {64, 4096}, {128, 8192}, {16, 1024}, {32, 3072}, {64, 12288}};
    uint64_t rng = 11;
    for (size_t gi = 0; gi < sizeof geoms / sizeof geoms[0]; gi++) {
        const kv_page_geom_t *g = &geoms[gi];
        void *page = tcp_xalloc(g->page_bytes);
        for (uint32_t fmt = 0; fmt < KV_FMT_COUNT; fmt++)
            for (uint32_t dirf = 0; dirf < (fmt == KV_FMT_MERGED ? 2u : 1u);
                 dirf++) {
                const uint32_t df = dirf ? KV_FMT_INT4 : KV_FMT_FP16;
                uint32_t tpp = fmt == KV_FMT_MERGED
                                   ? kv_fmt_merged_capacity(g, df)
                                   : kv_format_get(fmt)->tokens_per_page(g);
                if (tpp == 0)
                    continue;
                uint32_t n = tpp > 3 ? tpp - 3 : tpp; /* INT: a partial group */
                /* stored variants (INT: plain, rotated) */
                const uint32_t nsv = kv_format_variants(fmt, g);
                for (uint32_t sv = 0; sv < nsv; sv++) {
                    tcp_fill_page(page, g, fmt, df, sv, n, &rng);
                    char what[64];
                    snprintf(what, sizeof what, "d=%u fmt=%u dirf=%u var=%u",
                             g->head_dim, fmt, df, sv);
                    check_page(page, g, fmt, sv, n, what);
                    if (fmt == KV_FMT_MERGED) /* read as either layer */
                        check_page(page, g, fmt, 1, n, what);
                }
            }
        free(page);
    }
}

/* A group encoded through kv_fmt_codec_quantize16, laid out as kv_fmt_int.h says,
 * equals the INT store's page byte for byte. */
static void test_quantize(void)
{
    const kv_page_geom_t g = {64, 4096};
    const uint32_t d = 64;
    uint64_t rng = 5;
    float k[16 * 64], v[16 * 64];
    for (uint32_t fmt = KV_FMT_INT4; fmt <= KV_FMT_INT2; fmt++) {
        const uint32_t bits = fmt == KV_FMT_INT4 ? 4 : 2, nw = bits / 2;
        for (int round = 0; round < 20; round++) {
            for (uint32_t i = 0; i < 16 * d; i++) {
                k[i] = (round + 1) * kv_test_randf(&rng);
                v[i] = kv_test_randf(&rng) * (i % 3 ? 1.0f : 1e-3f);
            }
            if (round % 5 == 0) /* constant groups (also -0) */
                for (uint32_t t = 0; t < 16; t++) {
                    k[t * d + 3] = -0.0f;
                    for (uint32_t c = 32; c < 48; c++)
                        v[t * d + c] = 7.5f;
                }
            uint8_t a[4096], b[4096];
            memset(a, 0, sizeof a);
            memset(b, 0, sizeof b);
            kv_format_get(fmt)->store(a, &g, 0, 16, KV_DTYPE_F32, k, v, d);
            uint32_t *kc = (uint32_t *)(void *)b;
            uint32_t *vc = (uint32_t *)(void *)(b + 2 * bits * d);
            uint16_t *par = (uint16_t *)(void *)(b + 4 * bits * d);
            for (uint32_t c = 0; c < d; c++)
                kv_fmt_codec_quantize16(bits, k + c, d, kc + c, d, par + c,
                                        par + d + c);
            for (uint32_t t = 0; t < 16; t++)
                for (uint32_t cg = 0; cg < d / 16; cg++) {
                    uint32_t gi = t * (d / 16) + cg;
                    kv_fmt_codec_quantize16(bits, v + t * d + 16 * cg, 1,
                                            vc + gi * nw, 1, par + 2 * d + gi,
                                            par + 3 * d + gi);
                }
            CHECK(memcmp(a, b, sizeof a) == 0);
        }
    }
}

/* Walk a list's entries from (e, off) forward by `adv` tokens. */
static void advance(const kv_cuda_ent_t *ents, uint32_t *e, uint32_t *off,
                    uint32_t adv)
{
    while (adv) {
        uint32_t left = KV_CUDA_ENT_N(ents[*e].meta) - *off;
        if (adv < left) {
            *off += adv;
            return;
        }
        adv -= left;
        ++*e;
        *off = 0;
    }
}

/* Items [i0, i1) tile list `list` (tokens [0, len)) in order, each at most
 * `part` tokens, starting at the right entry/offset. */
static int items_ok(const kv_cuda_work_t *w, uint32_t i0, uint32_t i1,
                    const kv_cuda_ent_t *ents, uint32_t list, uint32_t e0,
                    uint32_t e1, uint32_t len, uint32_t part)
{
    uint32_t t = 0, e = e0, off = 0;
    for (uint32_t i = i0; i < i1; i++) {
        if (w[i].list != list || w[i].t_begin != t || w[i].n_tok == 0 ||
            w[i].n_tok > part || w[i].ent0 != e || w[i].off0 != off ||
            w[i].ent_end != e1)
            return 0;
        advance(ents, &e, &off, w[i].n_tok);
        t += w[i].n_tok;
    }
    return t == len;
}

static void test_plan(void)
{
    const kv_page_geom_t g = {64, 4096};
    uint64_t rng = 3;
    uint32_t len[7] = {1, 700, 33, 1500, 16, 999, 64};
    tcp_lists_t L;
    tcp_make_lists(&L, &g, 7, len, TCP_FMT_MIX, &rng);
    uint8_t want[7] = {1, 0, 1, 1, 0, 0, 1};
    kv_cuda_plan_in_t in = {.mode = KV_CUDA_DECODE,
                            .geom = g,
                            .n_q_heads = 7,
                            .n_kv_heads = 7,
                            .n_lists = 7,
                            .n_new = 1,
                            .indptr = L.indptr,
                            .pages = L.pages,
                            .seq_len = L.seq_len,
                            .stats = want,
                            .partition = 128,
                            .n_sm = 132};
    kv_cuda_plan_t pl;
    CHECK_OK(kv_cuda_plan_build(&in, &pl));
    CHECK_EQ(pl.n_ents, L.n_pages);
    CHECK_EQ(pl.n_rows, 1);
    CHECK_EQ(pl.rows_blk, 4);
    CHECK_EQ(pl.n_rg, 1);
    CHECK_EQ(pl.single_pass, 0);
    /* staged: every entry's page is its host page; each page once */
    uint32_t distinct = 0;
    for (uint32_t e = 0; e < L.n_pages; e++) {
        CHECK(pl.ents[e].page < pl.n_upload &&
              pl.upload[pl.ents[e].page] == L.pages[e].data);
        CHECK_EQ(KV_CUDA_ENT_N(pl.ents[e].meta), L.pages[e].n_tokens);
        CHECK_EQ(KV_CUDA_ENT_FMT(pl.ents[e].meta), L.pages[e].format);
        CHECK_EQ(KV_CUDA_ENT_VAR(pl.ents[e].meta), L.pages[e].variant);
        int seen = 0;
        for (uint32_t f = 0; f < e; f++)
            seen |= L.pages[f].data == L.pages[e].data;
        distinct += !seen;
    }
    CHECK_EQ(pl.n_upload, distinct);
    CHECK(distinct < L.n_pages); /* lists 2 and 5 share a page */
    CHECK_EQ(pl.rotated, 0); /* MERGED variant 1 is not a rotation */
    uint64_t so = 0;
    uint32_t s = 0;
    for (uint32_t i = 0; i < 7; i++) {
        CHECK(items_ok(pl.work, pl.list_work[i], pl.list_work[i + 1], pl.ents,
                       i, L.indptr[i], L.indptr[i + 1], len[i], 128));
        if (want[i]) {
            CHECK_EQ(pl.stats_off[i], so);
            uint32_t n = (len[i] + 63) / 64;
            CHECK(items_ok(pl.stile, s, s + n, pl.ents, i, L.indptr[i],
                           L.indptr[i + 1], len[i], 64));
            s += n;
            so += len[i];
        } else {
            CHECK(pl.stats_off[i] == UINT64_MAX);
        }
    }
    CHECK_EQ(pl.list_work[7], pl.n_work);
    CHECK_EQ(s, pl.n_stile);
    CHECK_EQ(pl.n_stats, so);
    kv_cuda_plan_free(&pl);

    /* a partition covering the longest list: single pass, one item per
     * list; the default one here: KV_CUDA_MIN_PART (little work) */
    in.partition = 1500;
    CHECK_OK(kv_cuda_plan_build(&in, &pl));
    CHECK_EQ(pl.single_pass, 1);
    CHECK_EQ(pl.n_work, 7);
    kv_cuda_plan_free(&pl);
    in.partition = 0;
    CHECK_OK(kv_cuda_plan_build(&in, &pl));
    CHECK_EQ(pl.partition, KV_CUDA_MIN_PART);
    uint32_t nw = 0;
    for (int i = 0; i < 7; i++)
        nw += (len[i] + KV_CUDA_MIN_PART - 1) / KV_CUDA_MIN_PART;
    CHECK_EQ(pl.n_work, nw);
    CHECK_EQ(pl.single_pass, 0);
    kv_cuda_plan_free(&pl);

    /* prefill rows: n_new * G rows, in blocks of 8 past 4 */
    in.mode = KV_CUDA_PREFILL;
    in.n_q_heads = 21; /* G = 3 */
    in.n_new = 3;
    in.stats = NULL;
    CHECK_OK(kv_cuda_plan_build(&in, &pl));
    CHECK_EQ(pl.n_rows, 9);
    CHECK_EQ(pl.rows_blk, 8);
    CHECK_EQ(pl.n_rg, 2);
    CHECK_EQ(pl.n_stile, 0);
    kv_cuda_plan_free(&pl);

    /* device mode: arena indices; a pointer outside the arena, or inside
     * but not at a page start, is KV_EINVAL */
    const uint32_t n_dev = 64;
    uint8_t *arena = tcp_xalloc((size_t)n_dev * g.page_bytes);
    kv_kern_page_t dp[3] = {
        {.data = arena + 5 * 4096, .n_tokens = 16, .format = KV_FMT_FP16},
        {.data = arena + 63 * 4096, .n_tokens = 64, .format = KV_FMT_INT2},
        {.data = arena + 5 * 4096, .n_tokens = 3, .format = KV_FMT_FP16}};
    uint32_t ip[3] = {0, 2, 3}, dl[2] = {80, 3};
    kv_cuda_plan_in_t din = {.mode = KV_CUDA_DECODE,
                             .geom = g,
                             .n_q_heads = 8,
                             .n_kv_heads = 2,
                             .n_lists = 2,
                             .n_new = 1,
                             .indptr = ip,
                             .pages = dp,
                             .seq_len = dl,
                             .dev_base = arena,
                             .dev_pages = n_dev};
    CHECK_OK(kv_cuda_plan_build(&din, &pl));
    CHECK_EQ(pl.n_upload, 0);
    CHECK_EQ(pl.ents[0].page, 5);
    CHECK_EQ(pl.ents[1].page, 63);
    CHECK_EQ(pl.ents[2].page, 5);
    kv_cuda_plan_free(&pl);
    dp[1].data = arena + 64 * 4096;
    CHECK_EQ(kv_cuda_plan_build(&din, &pl), KV_EINVAL);
    dp[1].data = arena + 62 * 4096 + 64;
    CHECK_EQ(kv_cuda_plan_build(&din, &pl), KV_EINVAL);
    free(arena);
    tcp_free_lists(&L);

    /* the rotated flag: set iff some entry of the call is a rotated INT
     * page (the ROT kernels), whatever else the lists hold */
    static const struct {
        uint32_t mix, want;
    } rots[] = {{TCP_FMT_ONLY(KV_FMT_INT4) | TCP_ROT_ALL, 1},
                {TCP_FMT_ONLY(KV_FMT_INT2) | TCP_ROT_ALL, 1},
                {TCP_FMT_MIX | TCP_ROT_ALL, 1},
                {TCP_FMT_ONLY(KV_FMT_INT4), 0},
                {TCP_FMT_ONLY(KV_FMT_MERGED), 0}};
    for (size_t c = 0; c < sizeof rots / sizeof rots[0]; c++) {
        tcp_make_lists(&L, &g, 7, len, rots[c].mix, &rng);
        in.pages = L.pages;
        in.indptr = L.indptr;
        in.seq_len = L.seq_len;
        CHECK_OK(kv_cuda_plan_build(&in, &pl));
        CHECK_EQ(pl.rotated, rots[c].want);
        kv_cuda_plan_free(&pl);
        /* one rotated page among plain ones: the last list's last page */
        for (uint32_t e = 0; e < L.n_pages; e++)
            if (L.pages[e].format != KV_FMT_MERGED)
                L.pages[e].variant = 0;
        kv_kern_page_t *last = &L.pages[L.n_pages - 1];
        last->format = KV_FMT_INT2; /* read as codes: the bytes don't matter */
        last->variant = 1;
        last->n_tokens = 1;
        L.seq_len[6] = 0;
        for (uint32_t e = L.indptr[6]; e < L.n_pages; e++)
            L.seq_len[6] += L.pages[e].n_tokens;
        CHECK_OK(kv_cuda_plan_build(&in, &pl));
        CHECK_EQ(pl.rotated, 1);
        kv_cuda_plan_free(&pl);
        tcp_free_lists(&L);
    }

    /* default partition: a multiple of 64, at least the minimum, growing
     * with the work */
    uint32_t p1 = kv_cuda_default_partition(1000, 1, 132);
    uint32_t p2 = kv_cuda_default_partition(1u << 24, 1, 132);
    uint32_t p3 = kv_cuda_default_partition(1u << 24, 8, 132);
    CHECK_EQ(p1, KV_CUDA_MIN_PART);
    CHECK(p2 % 64 == 0 && p2 >= (1u << 24) / 1056 && p3 > p2);
}

static void test_convert_locs(void)
{
    const kv_page_geom_t g = {64, 4096}; /* FP16 16, INT4 32, INT2 64 */
    uint8_t buf[3][16];
    kv_kern_page_t src[3] = {{.data = buf[0], .n_tokens = 5},
                             {.data = buf[1], .n_tokens = 16},
                             {.data = buf[2], .n_tokens = 9}};
    void *dst[2] = {buf[0], buf[1]};
    kv_convert_params_t p = {.geom = g,
                             .src = src,
                             .n_src = 3,
                             .src_off = 7,
                             .n_tokens = 20,
                             .dst_format = KV_FMT_FP16,
                             .dst = dst,
                             .n_dst = 2,
                             .dst_off = 10};
    uint32_t sl[60], dl[60];
    CHECK_OK(kv_cuda_convert_locs(&p, sl, dl));
    CHECK(sl[0] == 1 && sl[1] == 2);    /* token 7 = page 1 token 2   */
    CHECK(sl[26] == 1 && sl[27] == 15); /* call token 13               */
    CHECK(sl[28] == 2 && sl[29] == 0);  /* call token 14: next page    */
    CHECK(dl[0] == 0 && dl[1] == 10 && dl[10] == 0 && dl[11] == 15);
    CHECK(dl[12] == 1 && dl[13] == 0 && dl[38] == 1 && dl[39] == 13);
    p.n_tokens = 24; /* the run holds 30 - 7 = 23 tokens */
    CHECK_EQ(kv_cuda_convert_locs(&p, sl, dl), KV_EINVAL);
    p.n_tokens = 23;
    p.n_dst = 1; /* 6 slots */
    CHECK_EQ(kv_cuda_convert_locs(&p, sl, dl), KV_EINVAL);
    /* check_convert: INT needs whole groups; unknown destination format */
    p.n_dst = 2;
    p.dst_format = KV_FMT_INT4;
    CHECK_EQ(kv_cuda_check_convert(&p), KV_EINVAL);
    p.dst_format = KV_FMT_MERGED;
    CHECK_EQ(kv_cuda_check_convert(&p), KV_ENOTSUP);
    /* bad source pages: the same answer from the CUDA planner and the CPU
     * kernel (one check, kv_kern_check_run); nothing is read or written */
    p.dst_format = KV_FMT_FP16;
    p.n_tokens = 20;
    CHECK_OK(kv_cuda_check_convert(&p));
    static const struct {
        uint32_t page, what, value;
        int want;
    } bad[] = {
        {0, 0, 0, KV_EINVAL},   /* data NULL           */
        {1, 1, 0, KV_EINVAL},   /* no tokens           */
        {2, 1, 17, KV_EINVAL},  /* more than a page    */
        {1, 2, 1, KV_EINVAL},   /* variant 1 on FP16   */
        {2, 3, 9, KV_ENOTSUP},  /* unknown format      */
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        kv_kern_page_t keep = src[bad[i].page];
        kv_kern_page_t *x = &src[bad[i].page];
        if (bad[i].what == 0)
            x->data = NULL;
        else if (bad[i].what == 1)
            x->n_tokens = bad[i].value;
        else if (bad[i].what == 2)
            x->variant = bad[i].value;
        else
            x->format = bad[i].value;
        CHECK_EQ(kv_cuda_check_convert(&p), bad[i].want);
        CHECK_EQ(kv_cpu_convert(NULL, &p), bad[i].want);
        *x = keep;
    }
    /* the destination's stored variant: rotated INT (1) accepted as the CPU
     * accepts it (not run here: the buffers are not pages), any variant a
     * format does not store KV_EINVAL from both */
    static const struct {
        kv_page_geom_t g; /* the source pages hold up to 16 FP16 tokens */
        uint32_t fmt, var;
        int want;
    } dv[] = {
        {{64, 4096}, KV_FMT_INT4, 1, 0},
        {{128, 8192}, KV_FMT_INT2, 1, 0},
        {{64, 4096}, KV_FMT_FP16, 1, KV_EINVAL},
        {{64, 4096}, KV_FMT_INT4, 2, KV_EINVAL},
        {{96, 6144}, KV_FMT_INT4, 1, KV_EINVAL}, /* not a power of two */
    };
    p.n_tokens = 16;
    p.src_off = 0;
    p.dst_off = 0;
    for (size_t i = 0; i < sizeof dv / sizeof dv[0]; i++) {
        p.geom = dv[i].g;
        p.dst_format = dv[i].fmt;
        p.dst_variant = dv[i].var;
        CHECK_EQ(kv_cuda_check_convert(&p), dv[i].want);
        if (dv[i].want)
            CHECK_EQ(kv_cpu_convert(NULL, &p), dv[i].want);
    }
    p.geom = g;
    p.dst_variant = 0;
    p.src = NULL;
    CHECK_EQ(kv_cuda_check_convert(&p), KV_EINVAL);
    CHECK_EQ(kv_cpu_convert(NULL, &p), KV_EINVAL);
}

static void test_checks(void)
{
    CHECK_EQ(kv_cuda_head_dim_ok(64), 1);
    CHECK_EQ(kv_cuda_head_dim_ok(128), 1);
    CHECK_EQ(kv_cuda_head_dim_ok(96), 0);
    CHECK_EQ(kv_cuda_head_dim_ok(256), 0);
    CHECK_EQ(kv_cuda_page_bytes_ok(4096, 64), 0);
    CHECK_EQ(kv_cuda_page_bytes_ok(4096 + 32, 64), KV_ENOTSUP);
    CHECK_EQ(kv_cuda_page_bytes_ok(65536, 64), KV_ENOTSUP);
    CHECK_EQ(kv_cuda_page_bytes_ok(256, 128), KV_ENOTSUP);
    CHECK_EQ(kv_cuda_rows_per_block(3), 4);
    CHECK_EQ(kv_cuda_rows_per_block(5), 8);

    uint8_t page[4096] __attribute__((aligned(64)));
    memset(page, 0, sizeof page);
    kv_kern_page_t pg = {.data = page, .n_tokens = 4, .format = KV_FMT_FP16};
    uint32_t ip[2] = {0, 1}, len = 4;
    float q[8 * 64], out[8 * 64];
    kv_attn_decode_params_t d = {.geom = {32, 4096},
                                 .batch = 1,
                                 .n_q_heads = 8,
                                 .n_kv_heads = 1,
                                 .indptr = ip,
                                 .pages = &pg,
                                 .seq_len = &len,
                                 .q = q,
                                 .out = out,
                                 .scale = 0.125f};
    CHECK_OK(kv_kern_check_decode(&d)); /* fine for the CPU ...    */
    CHECK_EQ(kv_cuda_check_decode(&d), KV_ENOTSUP); /* no D=32 kernel */
    d.geom.head_dim = 64;
    CHECK_OK(kv_cuda_check_decode(&d));
    d.n_kv_heads = 3; /* 8 q heads: not a multiple, as the CPU says */
    CHECK_EQ(kv_cuda_check_decode(&d), KV_EINVAL);
    d.n_kv_heads = 1;
    pg.format = 9;
    CHECK_EQ(kv_cuda_check_decode(&d), KV_ENOTSUP);
    pg.format = KV_FMT_FP16;
    len = 5; /* pages hold 4 */
    CHECK_EQ(kv_cuda_check_decode(&d), KV_EINVAL);
    len = 4;
    /* rotated INT pages are read (no longer KV_ENOTSUP); a variant the
     * format does not store is KV_EINVAL, as the CPU says */
    static const struct {
        uint32_t fmt, var;
        int want;
    } vars[] = {{KV_FMT_INT4, 1, 0},
                {KV_FMT_INT2, 1, 0},
                {KV_FMT_INT4, 2, KV_EINVAL},
                {KV_FMT_FP16, 1, KV_EINVAL}};
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) {
        pg.format = vars[i].fmt;
        pg.variant = vars[i].var;
        CHECK_EQ(kv_kern_check_decode(&d), vars[i].want);
        CHECK_EQ(kv_cuda_check_decode(&d), vars[i].want);
    }
    pg.format = KV_FMT_FP16;
    pg.variant = 0;
    kv_attn_prefill_params_t pf = {.geom = {64, 4096},
                                   .n_q_heads = 8,
                                   .n_kv_heads = 1,
                                   .indptr = ip,
                                   .pages = &pg,
                                   .seq_len = &len,
                                   .n_new = 4,
                                   .q = q,
                                   .out = out,
                                   .scale = 0.125f};
    CHECK_OK(kv_cuda_check_prefill(&pf));
    pg.format = KV_FMT_INT2; /* rotated, for prefill too */
    pg.variant = 1;
    CHECK_OK(kv_cuda_check_prefill(&pf));
    pg.format = KV_FMT_FP16;
    pg.variant = 0;
    pf.geom.page_bytes = 65536; /* valid, but more than a stage holds */
    CHECK_EQ(kv_cuda_check_prefill(&pf), KV_ENOTSUP);

    /* launchers refuse bad arguments before touching the device */
    kv_cuda_attn_args_t a = {.mode = KV_CUDA_DECODE,
                             .head_dim = 96,
                             .page_bytes = 6144,
                             .n_q_heads = 4,
                             .n_kv_heads = 1,
                             .n_lists = 1,
                             .n_rows = 4,
                             .rows_blk = 4,
                             .n_rg = 1,
                             .n_work = 1};
    CHECK_EQ(kv_cuda_attn_launch(&a, NULL), KV_ENOTSUP); /* dispatch */
    a.head_dim = 64;
    a.n_rg = 2;
    CHECK_EQ(kv_cuda_attn_launch(&a, NULL), KV_EINVAL);
    a.n_rg = 1;
    a.rows_blk = 8;
    CHECK_EQ(kv_cuda_attn_launch(&a, NULL), KV_EINVAL);
    a.rows_blk = 4;
    a.page_bytes = 6144 + 16;
    CHECK_EQ(kv_cuda_attn_launch(&a, NULL), KV_ENOTSUP);
    kv_cuda_convert_args_t c = {.head_dim = 64,
                                .page_bytes = 4096,
                                .dst_format = KV_FMT_INT2,
                                .n_tokens = 17};
    CHECK_EQ(kv_cuda_convert_launch(&c, NULL), KV_EINVAL);
    c.dst_format = KV_FMT_MERGED;
    CHECK_EQ(kv_cuda_convert_launch(&c, NULL), KV_EINVAL);
    /* stored variant 1 is rotated INT, at a power-of-two head_dim only */
    c.n_tokens = 16;
    c.dst_variant = 1;
    c.dst_format = KV_FMT_FP16;
    CHECK_EQ(kv_cuda_convert_launch(&c, NULL), KV_EINVAL);
    c.dst_format = KV_FMT_INT4;
    c.dst_variant = 2;
    CHECK_EQ(kv_cuda_convert_launch(&c, NULL), KV_EINVAL);
    c.dst_variant = 1;
    c.head_dim = 96;
    c.page_bytes = 6144;
    CHECK_EQ(kv_cuda_convert_launch(&c, NULL), KV_EINVAL);
    c.head_dim = 64;
    c.page_bytes = 4096;
    c.dst_variant = 0;
    c.dst_format = KV_FMT_FP16;
    c.head_dim = 96;
    c.page_bytes = 6144;
    CHECK_EQ(kv_cuda_convert_launch(&c, NULL), KV_ENOTSUP);

    kv_cuda_config_t cfg = {.device = 0};
    kv_backend_t b = {0};
    cfg.device = -1;
    CHECK_EQ(kv_backend_cuda_create(&cfg, &b), KV_EINVAL);
    cfg.device = 0;
    cfg.device_pages = 16;
    cfg.page_bytes = 100;
    CHECK_EQ(kv_backend_cuda_create(&cfg, &b), KV_EINVAL);
    CHECK(kv_backend_cuda_pool(&b) == NULL);
    if (kv_cuda_device_count() == 0) { /* what CI sees */
        cfg.page_bytes = 4096;
        CHECK_EQ(kv_backend_cuda_create(&cfg, &b), KV_ENOTSUP);
        CHECK(b.ops == NULL);
        kv_cuda_pool_t *pool = NULL;
        int rc = kv_cuda_pool_create(4096, 16, 4, NULL, &pool);
        CHECK(rc == KV_ENOTSUP || rc == KV_EIO);
        CHECK(pool == NULL);
        printf("no GPU: device-side checks are in tests/cuda/test_cuda_attn.c"
               " and test_cuda_convert.c\n");
    }
}

int main(void)
{
    test_decode();
    test_quantize();
    test_plan();
    test_convert_locs();
    test_checks();
    return kv_test_end();
}
