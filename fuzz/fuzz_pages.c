/* SPDX-License-Identifier: MIT */
/*
 * fuzz_pages.c — libFuzzer target for every page format's decoder on
 * hostile bytes (pages arriving from a page file or, later, a shared remote
 * tier), through the format traits table (formats/kv_format.h: load,
 * kv_format_load) and the CPU kernels' format table (kernels/cpu/kv_cpu.h,
 * portable build: the row decoders, and score / accum where a format is read
 * from its codes).
 *
 * Input: byte 0 picks the format (mod KV_FMT_COUNT) and, for MERGED, the
 * variant and whether a valid header is stamped first; byte 1 the geometry
 * (head_dim 16..128, page_bytes from one token to 16 KiB); bytes 2..3 a
 * token range; the rest is the page (repeated to fill it), in a heap block
 * of exactly page_bytes so ASan sees any read past it. A MERGED page is
 * decoded only after kv_fmt_merged_dir_format accepts its header (the
 * store's contract: MERGED loads only assert it); INT4, INT2 and FP16 have
 * no header: every byte pattern is a page.
 * Properties: decoding never reads outside the page or hits undefined
 * behaviour (ASan, UBSan), is deterministic (two decodes agree bit for
 * bit), a token range decodes to exactly those rows of the whole page, K
 * alone and V alone equal the K and V of a joint decode, FP16 copy moves
 * tokens bit-exactly, a kernels-side row decoder gives exactly
 * kv_format_load's floats, and the encoded-domain attention steps of INT4/INT2
 * agree with dot products over the decoded rows wherever those are finite.
 * Build and run: fuzz/build.sh (see fuzz/README.md).
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "formats/kv_fmt_merged.h"
#include "formats/kv_format.h"
#include "kernels/cpu/kv_cpu.h"

#define MAX_D 128u
#define MAX_T 512u

static void check(int cond, const char *what)
{
    if (!cond) {
        fprintf(stderr, "fuzz_pages: property failed: %s\n", what);
        abort();
    }
}

static float g_k[MAX_T * MAX_D], g_v[MAX_T * MAX_D], g_k2[MAX_T * MAX_D], g_v2[MAX_T * MAX_D];

static int all_finite(const float *x, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (!isfinite(x[i]) || fabsf(x[i]) > 1e18f)
            return 0;
    return 1;
}

/* attn_score/attn_accum against load's rows (2 query rows). */
static void check_attn(const kv_cpu_fmt_ops_t *ops, uint32_t fmt, const void *page,
                       const kv_page_geom_t *g, uint32_t t0, uint32_t n, const uint8_t *seed)
{
    enum { R = 2 };
    const uint32_t d = g->head_dim;
    static float q[R * MAX_D], s[R * MAX_T], p[R * MAX_T], acc[R * MAX_D];
    for (uint32_t i = 0; i < R * d; i++)
        q[i] = (float)((int)seed[i % 7] - 128) / 64.0f;
    for (uint32_t i = 0; i < R * n; i++)
        p[i] = (float)(seed[(i + 3) % 7]) / 255.0f;
    memset(acc, 0, sizeof acc);
    ops->score(page, g, t0, n, q, d, R, s, n);
    ops->accum(page, g, t0, n, p, n, R, acc, d);
    kv_format_load(fmt, 0, page, g, t0, n, g_k2, g_v2);
    if (!all_finite(g_k2, (size_t)n * d) || !all_finite(g_v2, (size_t)n * d))
        return; /* hostile scales: only memory safety is asked */
    for (uint32_t r = 0; r < R; r++) {
        for (uint32_t i = 0; i < n; i++) {
            double ref = 0, mag = 0;
            for (uint32_t c = 0; c < d; c++) {
                ref += (double)q[r * d + c] * g_k2[(size_t)i * d + c];
                mag += fabs((double)q[r * d + c] * g_k2[(size_t)i * d + c]);
            }
            check(fabs(s[r * n + i] - ref) <= 1e-4 * mag + 1e-30, "attn_score = q . load(k)");
        }
        for (uint32_t c = 0; c < d; c++) {
            double ref = 0, mag = 0;
            for (uint32_t i = 0; i < n; i++) {
                ref += (double)p[r * n + i] * g_v2[(size_t)i * d + c];
                mag += fabs((double)p[r * n + i] * g_v2[(size_t)i * d + c]);
            }
            check(fabs(acc[r * d + c] - ref) <= 1e-4 * mag + 1e-30, "attn_accum = p . load(v)");
        }
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 4)
        return 0;
    static const uint32_t dims[4] = {16, 32, 64, 128};
    const uint32_t fmt = data[0] % KV_FMT_COUNT, variant = (data[0] >> 3) & 1u;
    const int stamp = (data[0] >> 4) & 1, dir_int4 = (data[0] >> 5) & 1;
    kv_page_geom_t g = {.head_dim = dims[data[1] & 3u]};
    /* page_bytes: a multiple of 64 from 4 * head_dim (one FP16 token) up */
    uint32_t min_pb = (4u * g.head_dim + 63u) & ~63u;
    g.page_bytes = min_pb + 64u * (uint32_t)(data[1] >> 2) * (g.head_dim / 16u);
    if (g.page_bytes > 16384u)
        g.page_bytes = 16384u;
    const kv_format_traits_t *tr = kv_format_get(fmt);
    if (!tr)
        return 0;
    uint32_t tpp = tr->tokens_per_page(&g);
    uint8_t *page = malloc(g.page_bytes);
    if (!page)
        return 0;
    const uint8_t *body = data + 4;
    size_t nb = size - 4;
    for (uint32_t i = 0; i < g.page_bytes; i++)
        page[i] = nb ? body[i % nb] : 0;
    if (fmt == KV_FMT_MERGED) {
        uint32_t df = dir_int4 ? KV_FMT_INT4 : KV_FMT_FP16;
        if (stamp && kv_fmt_merged_capacity(&g, df) > 0)
            kv_fmt_merged_init(page, &g, df);
        df = kv_fmt_merged_dir_format(page, &g);
        tpp = df == UINT32_MAX ? 0 : kv_fmt_merged_capacity(&g, df);
    }
    if (tpp == 0 || tpp > MAX_T) {
        free(page);
        return 0; /* no token fits, or the header is refused: never decoded */
    }
    /* the whole page, twice */
    kv_format_load(fmt, variant, page, &g, 0, tpp, g_k, g_v);
    kv_format_load(fmt, variant, page, &g, 0, tpp, g_k2, g_v2);
    const size_t rows = (size_t)tpp * g.head_dim * sizeof(float);
    check(!memcmp(g_k, g_k2, rows) && !memcmp(g_v, g_v2, rows), "decoding is deterministic");
    /* a range of it, K alone, V alone */
    uint32_t t0 = data[2] % tpp, n = 1 + data[3] % (tpp - t0);
    const size_t off = (size_t)t0 * g.head_dim, len = (size_t)n * g.head_dim * sizeof(float);
    kv_format_load(fmt, variant, page, &g, t0, n, g_k2, NULL);
    check(!memcmp(g_k2, g_k + off, len), "a range of K = those rows of the page");
    kv_format_load(fmt, variant, page, &g, t0, n, NULL, g_v2);
    check(!memcmp(g_v2, g_v + off, len), "a range of V = those rows of the page");
    if (tr->copy) { /* FP16: tokens moved to the front of a second page */
        uint8_t *dst = calloc(1, g.page_bytes);
        if (dst) {
            tr->copy(dst, 0, page, t0, n, &g);
            kv_format_load(fmt, 0, dst, &g, 0, n, g_k2, g_v2);
            check(!memcmp(g_k2, g_k + off, len) && !memcmp(g_v2, g_v + off, len),
                  "copy moves tokens bit-exactly");
            free(dst);
        }
    }
    const kv_cpu_fmt_ops_t *ops = &kv_cpu_loops_portable.fmt[fmt];
    if (ops->read == KV_CPU_READ_ROWS) {
        ops->load(page, &g, variant, t0, n, g_k2, g_v2);
        check(!memcmp(g_k2, g_k + off, len) && !memcmp(g_v2, g_v + off, len),
              "the kernels' row decoder = kv_format_load");
    } else if (size >= 11) {
        check_attn(ops, fmt, page, &g, t0, n, data + 4);
    }
    free(page);
    return 0;
}
