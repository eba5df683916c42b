/* SPDX-License-Identifier: MIT */
/*
 * test_format_merged.c — the MERGED page format (formats/kv_fmt_merged.h) and
 * the CPU conversion kernels (kernels/cpu/kv_cpu_convert.c) at kernel
 * level: no page table, pages in test-owned buffers.
 *
 * Checks:
 *   - the entry: name, note, store/copy NULL, load_variant set (and NULL
 *     for the other formats); kv_format_load dispatches on the variant;
 *   - geometry: capacity = floor((page_bytes - 16) / (16 + 2R)) for FP16
 *     and INT4 directions (R = 2D, 3D/4), tokens_per_page the larger, 0 for
 *     bad head_dim / dir format / tiny pages; the header round trip and a
 *     corrupted header rejected;
 *   - layout: every loaded element equals a scalar decoder written here
 *     from the spec (header, mags [T][4] at 16, K rows, V rows; INT4 codes
 *     nibble c%8 of word c/8, scale/min), bit for bit, both variants;
 *   - put/load: restored norms equal the given norms (relative 1e-6) for
 *     both direction formats; directions within FP16 / INT4 precision;
 *     zero directions and zero norms restore to exact zeros;
 *   - convert kernel: FP16 runs (page size not a multiple of 16 tokens, an
 *     offset into the first page) -> INT2/INT4 at a group-aligned dst_off
 *     equal, bit for bit, each 16-token group stored by the format itself;
 *     INT pages -> FP16 equal the FP16 rounding of their decoded values;
 *     slots outside the written range untouched; bad params (misaligned
 *     INT counts, short destinations, unknown formats, bad variants)
 *     rejected with nothing written;
 *   - merge kernels: SLERP with t = 0.5 equals the normalized average
 *     direction, other t the test's own SLERP (double); restored norms
 *     equal the originals (1e-5) for every merged token of both layers, K
 *     and V, FP16 and INT4 directions; zero vectors (one or both layers)
 *     and antiparallel pairs give no NaN (zero stays exactly zero);
 *     retention equals the rule computed here (gamma 0: none, gamma 1: all
 *     but the minimum-distance tokens, gamma 0.05 with well separated
 *     angles), union of K and V; retained originals land in the FP16
 *     pages of each layer bit-exactly and in order; merged slots in order.
 */
#include <string.h>

#include "alloc/kv_mem.h"
#include "kernels/cpu/kv_cpu_convert.h"
#include "kernels/kv_backend.h"
#include "kv_test.h"
#include "formats/kv_fmt_fp16.h"
#include "formats/kv_fmt_int.h"
#include "formats/kv_fmt_merged.h"

#define PI 3.14159265358979323846

static void *xcalloc(size_t n, size_t sz)
{
    void *p = calloc(n ? n : 1, sz ? sz : 1);
    if (!p) {
        fprintf(stderr, "out of memory\n");
        exit(2);
    }
    return p;
}

static float h16(float x) { return kv_half_to_float(kv_half_from_float(x)); }

static int all_finite(const float *x, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (!isfinite(x[i]))
            return 0;
    return 1;
}

static double norm(const float *x, uint32_t d)
{
    double s = 0;
    for (uint32_t i = 0; i < d; i++)
        s += (double)x[i] * x[i];
    return sqrt(s);
}

/* ---- entry and geometry --------------------------------------------------- */

static void test_entry(void)
{
    const kv_format_traits_t *e = kv_format_get(KV_FMT_MERGED);
    CHECK(e != NULL);
    if (!e)
        return;
    CHECK(strcmp(e->name, "merged") == 0);
    CHECK(strcmp(e->bits_note, kv_fmt_merged.bits_note) == 0);
    CHECK(strstr(e->bits_note, "bits/element") != NULL);
    CHECK(e->load == kv_fmt_merged.load);
    CHECK(e->load_variant == kv_fmt_merged.load_variant);
    CHECK(e->load_variant != NULL && e->store == NULL && e->copy == NULL);
    CHECK(e->tokens_per_page == kv_fmt_merged.tokens_per_page);
    /* below MERGED, only INT formats have variants (bit 0: rotated) */
    for (uint32_t f = 0; f < KV_FMT_MERGED; f++)
        CHECK(kv_format_get(f) &&
              (kv_format_get(f)->load_variant == NULL) ==
                  (f != KV_FMT_INT4 && f != KV_FMT_INT2));
}

static void test_geometry(void)
{
    for (uint32_t d = 16; d <= 256; d *= 2)
        for (uint32_t pb = 1024; pb <= 65536; pb = pb * 3 / 2 / 64 * 64) {
            kv_page_geom_t g = {.head_dim = d, .page_bytes = pb};
            uint32_t cf = (pb - 16) / (16 + 4 * d);
            uint32_t ci = (pb - 16) / (16 + 3 * d / 2);
            CHECK_EQ(kv_fmt_merged_capacity(&g, KV_FMT_FP16), cf);
            CHECK_EQ(kv_fmt_merged_capacity(&g, KV_FMT_INT4), ci);
            CHECK_EQ(kv_fmt_merged.tokens_per_page(&g), ci > cf ? ci : cf);
            CHECK_EQ(kv_fmt_merged_capacity(&g, KV_FMT_INT2), 0);
        }
    kv_page_geom_t g = {.head_dim = 64, .page_bytes = 4096};
    CHECK_EQ(kv_fmt_merged_capacity(&g, KV_FMT_FP16), 15);
    CHECK_EQ(kv_fmt_merged_capacity(&g, KV_FMT_INT4), 36);
    g.head_dim = 40; /* not a multiple of 16 */
    CHECK_EQ(kv_fmt_merged.tokens_per_page(&g), 0);
    g = (kv_page_geom_t){.head_dim = 64, .page_bytes = 256}; /* < 1 slot */
    CHECK_EQ(kv_fmt_merged_capacity(&g, KV_FMT_FP16), 0);
    CHECK_EQ(kv_fmt_merged_capacity(&g, KV_FMT_INT4), 2); /* 240 / 112 */
    CHECK_EQ(kv_fmt_merged_capacity(NULL, KV_FMT_FP16), 0);

    /* header */
    g = (kv_page_geom_t){.head_dim = 64, .page_bytes = 4096};
    uint8_t *page = xcalloc(4096, 1);
    kv_fmt_merged_init(page, &g, KV_FMT_INT4);
    CHECK_EQ(kv_fmt_merged_dir_format(page, &g), KV_FMT_INT4);
    uint32_t w;
    memcpy(&w, page, 4);
    CHECK_EQ(w, KV_FMT_INT4);
    memcpy(&w, page + 4, 4);
    CHECK_EQ(w, 64);
    kv_fmt_merged_init(page, &g, KV_FMT_FP16);
    CHECK_EQ(kv_fmt_merged_dir_format(page, &g), KV_FMT_FP16);
    kv_page_geom_t g2 = {.head_dim = 128, .page_bytes = 4096};
    CHECK_EQ(kv_fmt_merged_dir_format(page, &g2), UINT32_MAX);
    page[8] = 1; /* reserved byte */
    CHECK_EQ(kv_fmt_merged_dir_format(page, &g), UINT32_MAX);
    page[8] = 0;
    page[0] = 2; /* INT2 directions do not exist */
    CHECK_EQ(kv_fmt_merged_dir_format(page, &g), UINT32_MAX);
    free(page);
}

/* ---- a scalar decoder from the spec -------------------------------------- */

static float rdf(const uint8_t *p)
{
    float f;
    memcpy(&f, p, 4);
    return f;
}
static float rdh(const uint8_t *p)
{
    kv_half_t h;
    memcpy(&h, p, 2);
    return kv_half_to_float(h);
}

/* Element c of half `which` (0 K, 1 V) of slot t, variant w. */
static float spec_elem(const uint8_t *page, uint32_t d, uint32_t pb,
                       uint32_t t, uint32_t w, uint32_t which, uint32_t c)
{
    uint32_t df, hd;
    memcpy(&df, page, 4);
    memcpy(&hd, page + 4, 4);
    uint32_t R = df == 0 ? 2 * d : d / 2 + d / 4;
    uint32_t T = (pb - 16) / (16 + 2 * R);
    float mag = rdf(page + 16 + 16 * t + 4 * (2 * which + w));
    const uint8_t *row = page + 16 + 16 * T + (size_t)which * T * R +
                         (size_t)t * R;
    float e;
    if (df == 0) {
        e = rdh(row + 2 * c);
    } else {
        uint32_t word;
        memcpy(&word, row + 4 * (c / 8), 4);
        float q = (float)((word >> (4 * (c % 8))) & 15u);
        float s = rdh(row + d / 2 + 2 * (c / 16));
        float m = rdh(row + d / 2 + d / 8 + 2 * (c / 16));
        float x = q * s;
        e = x + m;
    }
    return e * mag;
}

static void random_unit(uint64_t *s, float *e, uint32_t d)
{
    double n = 0;
    for (uint32_t c = 0; c < d; c++) {
        e[c] = kv_test_randf(s);
        n += (double)e[c] * e[c];
    }
    for (uint32_t c = 0; c < d; c++)
        e[c] = (float)(e[c] / sqrt(n));
}

static void test_put_load(void)
{
    uint64_t s = 77;
    for (uint32_t df = 0; df <= 1; df++)
        for (uint32_t d = 16; d <= 128; d *= 2) {
            const uint32_t pb = 64 * d * 3;
            kv_page_geom_t g = {.head_dim = d, .page_bytes = pb};
            uint32_t cap = kv_fmt_merged_capacity(&g, df);
            uint8_t *page = xcalloc(pb, 1);
            float *ek = xcalloc((size_t)cap * d, 4), *ev = xcalloc((size_t)cap * d, 4);
            float (*nr)[4] = xcalloc(cap, sizeof *nr);
            kv_fmt_merged_init(page, &g, df);
            for (uint32_t t = 0; t < cap; t++) {
                random_unit(&s, ek + (size_t)t * d, d);
                random_unit(&s, ev + (size_t)t * d, d);
                for (int j = 0; j < 4; j++) /* wide range of norms */
                    nr[t][j] = (float)(exp(10.0 * kv_test_randf(&s)) * 100.0);
                if (t == 3) { /* a zero direction and zero norms */
                    memset(ek + (size_t)t * d, 0, d * 4);
                    nr[t][0] = nr[t][1] = 0.0f;
                }
                if (t == 4)
                    nr[t][2] = 0.0f; /* zero norm, nonzero direction */
                kv_fmt_merged_put(page, &g, t, ek + (size_t)t * d,
                                  ev + (size_t)t * d, nr[t]);
            }
            float *k = xcalloc((size_t)cap * d, 4), *v = xcalloc((size_t)cap * d, 4);
            double worst_norm = 0, worst_dir = 0;
            int spec_ok = 1, zeros_ok = 1;
            for (uint32_t w = 0; w < 2; w++) {
                kv_format_load(KV_FMT_MERGED, w, page, &g, 0, cap, k, v);
                CHECK(all_finite(k, (size_t)cap * d) && all_finite(v, (size_t)cap * d));
                for (uint32_t t = 0; t < cap; t++)
                    for (uint32_t which = 0; which < 2; which++) {
                        const float *x = (which ? v : k) + (size_t)t * d;
                        const float *e = (which ? ev : ek) + (size_t)t * d;
                        double want = nr[t][2 * which + w], got = norm(x, d);
                        for (uint32_t c = 0; c < d; c++)
                            spec_ok &= x[c] == spec_elem(page, d, pb, t, w, which, c);
                        if (want == 0.0) {
                            for (uint32_t c = 0; c < d; c++)
                                zeros_ok &= x[c] == 0.0f;
                            continue;
                        }
                        double rel = fabs(got - want) / want;
                        worst_norm = rel > worst_norm ? rel : worst_norm;
                        for (uint32_t c = 0; c < d; c++) {
                            double de = fabs(x[c] / want - e[c]);
                            worst_dir = de > worst_dir ? de : worst_dir;
                        }
                    }
            }
            CHECK(spec_ok);
            CHECK(zeros_ok);
            CHECK(worst_norm < 1e-6);
            /* FP16: <= 2^-11 relative per element of a unit vector (plus
             * the renormalization); INT4: <= scale/2 ~ 2/15/2 of the
             * group's range, itself <= 2 */
            CHECK(worst_dir < (df == 0 ? 2e-3 : 0.08));
            if (worst_norm >= 1e-6 || worst_dir >= (df == 0 ? 2e-3 : 0.08))
                fprintf(stderr, "df %u d %u: norm %g dir %g\n", df, d,
                        worst_norm, worst_dir);
            /* load of a sub-range equals the full load's rows; variant 0 is
             * what the plain load returns */
            float *k2 = xcalloc((size_t)cap * d, 4);
            kv_format_load(KV_FMT_MERGED, 1, page, &g, 2, cap - 3, k2, NULL);
            kv_format_load(KV_FMT_MERGED, 1, page, &g, 0, cap, k, NULL);
            CHECK(memcmp(k2, k + 2 * d, (size_t)(cap - 3) * d * 4) == 0);
            kv_fmt_merged.load(page, &g, 0, cap, k2, NULL);
            kv_format_load(KV_FMT_MERGED, 0, page, &g, 0, cap, k, NULL);
            CHECK(memcmp(k2, k, (size_t)cap * d * 4) == 0);
            free(page), free(ek), free(ev), free(nr), free(k), free(v), free(k2);
        }
}

/* ---- convert kernel -------------------------------------------------------- */

/* n FP16 pages of tpp tokens of random FP16 values; data [n*tpp][d]. */
static void fp16_run(kv_page_geom_t *g, uint32_t n, uint64_t *s, void **pages,
                     kv_kern_page_t *kp, float *k, float *v)
{
    uint32_t tpp = kv_fmt_fp16.tokens_per_page(g), d = g->head_dim;
    for (size_t i = 0; i < (size_t)n * tpp * d; i++) {
        k[i] = h16(kv_test_randf(s) * 3.0f);
        v[i] = h16(kv_test_randf(s));
    }
    for (uint32_t p = 0; p < n; p++) {
        pages[p] = xcalloc(g->page_bytes, 1);
        kv_fmt_fp16.store(pages[p], g, 0, tpp, KV_DTYPE_F32,
                          k + (size_t)p * tpp * d, v + (size_t)p * tpp * d, d);
        kp[p] = (kv_kern_page_t){.data = pages[p], .n_tokens = tpp,
                                 .format = KV_FMT_FP16};
    }
}

static void test_convert(void)
{
    const uint32_t d = 64;
    kv_page_geom_t g = {.head_dim = d, .page_bytes = 64 * 3 * d}; /* 48 FP16 */
    const uint32_t T = kv_fmt_fp16.tokens_per_page(&g), NP = 5;
    uint64_t s = 5;
    void *src[8];
    kv_kern_page_t kp[8];
    float *k = xcalloc((size_t)NP * T * d, 4), *v = xcalloc((size_t)NP * T * d, 4);
    fp16_run(&g, NP, &s, src, kp, k, v);
    kp[NP - 1].n_tokens = 20; /* a partly filled last page */
    const uint32_t total = (NP - 1) * T + 20, off = 7;

    for (uint32_t b = 2; b <= 4; b += 2) {
        const kv_format_traits_t *tr = b == 2 ? &kv_fmt_int2 : &kv_fmt_int4;
        uint32_t fmt = b == 2 ? KV_FMT_INT2 : KV_FMT_INT4;
        uint32_t tpp = tr->tokens_per_page(&g);
        uint32_t n = (total - off) / 16 * 16, dst_off = 32;
        uint32_t nd = (dst_off + n + tpp - 1) / tpp;
        void *dst[8];
        for (uint32_t i = 0; i < nd; i++) {
            dst[i] = xcalloc(g.page_bytes, 1);
            memset(dst[i], 0xA5, g.page_bytes);
        }
        uint8_t *keep0 = xcalloc(g.page_bytes, 1);
        memcpy(keep0, dst[0], g.page_bytes);
        float *scratch = xcalloc(KV_CONVERT_SCRATCH_FLOATS(d), 4);
        kv_convert_params_t p = {.geom = g, .src = kp, .n_src = NP,
                                 .src_off = off, .n_tokens = n,
                                 .dst_format = fmt, .dst = dst, .n_dst = nd,
                                 .dst_off = dst_off, .scratch = scratch};
        /* errors first: nothing written */
        kv_convert_params_t bad = p;
        bad.n_tokens = n - 8;
        CHECK_EQ(kv_cpu_convert(NULL, &bad), KV_EINVAL);
        bad = p, bad.dst_off = 8;
        CHECK_EQ(kv_cpu_convert(NULL, &bad), KV_EINVAL);
        bad = p, bad.n_dst = nd - 1;
        CHECK_EQ(kv_cpu_convert(NULL, &bad), KV_EINVAL);
        bad = p, bad.n_tokens = n + 16 * 40; /* beyond the source run */
        bad.n_dst = nd;
        CHECK_EQ(kv_cpu_convert(NULL, &bad), KV_EINVAL);
        bad = p, bad.dst_format = KV_FMT_MERGED;
        CHECK_EQ(kv_cpu_convert(NULL, &bad), KV_ENOTSUP);
        bad = p, bad.dst_format = 9;
        CHECK_EQ(kv_cpu_convert(NULL, &bad), KV_ENOTSUP);
        kp[1].variant = 1; /* FP16 pages have no variants */
        CHECK_EQ(kv_cpu_convert(NULL, &p), KV_EINVAL);
        kp[1].variant = 0;
        kp[2].format = 9;
        CHECK_EQ(kv_cpu_convert(NULL, &p), KV_ENOTSUP);
        kp[2].format = KV_FMT_FP16;
        CHECK(memcmp(keep0, dst[0], g.page_bytes) == 0);

        CHECK_OK(kv_cpu_convert(NULL, &p));
        /* the first dst_off slots' group blocks are untouched */
        size_t gb = KV_FMT_INT_GROUP_BYTES(d, b);
        CHECK(memcmp(keep0, dst[0], (dst_off / 16) * gb) == 0);
        /* each group equals the format's own store of the same rows */
        uint8_t *ref = xcalloc(g.page_bytes, 1);
        float *a = xcalloc(16 * d, 4), *r = xcalloc(16 * d, 4);
        float *av = xcalloc(16 * d, 4), *rv = xcalloc(16 * d, 4);
        int same = 1;
        for (uint32_t grp = 0; grp < n / 16; grp++) {
            uint32_t slot = dst_off + grp * 16;
            tr->store(ref, &g, 0, 16, KV_DTYPE_F32,
                      k + (size_t)(off + grp * 16) * d,
                      v + (size_t)(off + grp * 16) * d, d);
            tr->load(ref, &g, 0, 16, r, rv);
            tr->load(dst[slot / tpp], &g, slot % tpp, 16, a, av);
            same &= memcmp(a, r, 16 * d * 4) == 0 && memcmp(av, rv, 16 * d * 4) == 0;
        }
        CHECK(same);

        /* back to FP16 (from the INT pages, starting mid-page) */
        kv_kern_page_t ip[8];
        for (uint32_t i = 0; i < nd; i++)
            ip[i] = (kv_kern_page_t){.data = dst[i], .format = fmt,
                                     .n_tokens = i + 1 < nd ? tpp
                                                            : (dst_off + n - 1) % tpp + 1};
        uint32_t n2 = n - 5, nf = (n2 + T - 1) / T;
        void *fd[16];
        for (uint32_t i = 0; i < nf; i++)
            fd[i] = xcalloc(g.page_bytes, 1);
        kv_convert_params_t q = {.geom = g, .src = ip, .n_src = nd,
                                 .src_off = dst_off + 5, .n_tokens = n2,
                                 .dst_format = KV_FMT_FP16, .dst = fd,
                                 .n_dst = nf, .scratch = NULL};
        CHECK_OK(kv_cpu_convert(NULL, &q));
        same = 1;
        float *row = xcalloc(d, 4), *dec = xcalloc(d, 4);
        for (uint32_t t = 0; t < n2; t++) {
            uint32_t slot = dst_off + 5 + t;
            tr->load(dst[slot / tpp], &g, slot % tpp, 1, dec, NULL);
            kv_fmt_fp16.load(fd[t / T], &g, t % T, 1, row, NULL);
            for (uint32_t c = 0; c < d; c++)
                same &= row[c] == h16(dec[c]);
        }
        CHECK(same);
        for (uint32_t i = 0; i < nf; i++)
            free(fd[i]);
        for (uint32_t i = 0; i < nd; i++)
            free(dst[i]);
        free(keep0), free(scratch), free(ref), free(a), free(r), free(av);
        free(rv), free(row), free(dec);
    }
    /* FP16 -> FP16 across pages with an offset: a plain copy */
    {
        void *fd[8];
        for (uint32_t i = 0; i < 3; i++)
            fd[i] = xcalloc(g.page_bytes, 1);
        kv_convert_params_t q = {.geom = g, .src = kp, .n_src = NP,
                                 .src_off = 13, .n_tokens = 100,
                                 .dst_format = KV_FMT_FP16, .dst = fd,
                                 .n_dst = 3, .dst_off = 40};
        CHECK_OK(kv_cpu_convert(NULL, &q));
        float *row = xcalloc(d, 4);
        int same = 1;
        for (uint32_t t = 0; t < 100; t++) {
            uint32_t slot = 40 + t;
            kv_fmt_fp16.load(fd[slot / T], &g, slot % T, 1, row, NULL);
            same &= memcmp(row, k + (size_t)(13 + t) * d, d * 4) == 0;
        }
        CHECK(same);
        free(row);
        for (uint32_t i = 0; i < 3; i++)
            free(fd[i]);
    }
    for (uint32_t i = 0; i < NP; i++)
        free(src[i]);
    free(k), free(v);
}

/* ---- merge kernels --------------------------------------------------------- */

/* The test's SLERP of x0, x1 (double), normalized; zero handling as the
 * spec: a zero vector takes the other's direction. */
static void ref_slerp(const float *x0, const float *x1, uint32_t d, double t,
                      double *e)
{
    double n0 = norm(x0, d), n1 = norm(x1, d), dot = 0;
    for (uint32_t c = 0; c < d; c++)
        dot += (double)x0[c] * x1[c];
    double w0, w1;
    if (n0 == 0 || n1 == 0) {
        w0 = n0 > 0 ? 1 / n0 : 0;
        w1 = n1 > 0 ? 1 / n1 : 0;
    } else {
        double cs = dot / (n0 * n1);
        cs = cs > 1 ? 1 : cs < -1 ? -1 : cs;
        double th = acos(cs), sn = sin(th);
        w0 = sn < 1e-6 ? 1 - t : sin((1 - t) * th) / sn;
        w1 = sn < 1e-6 ? t : sin(t * th) / sn;
        w0 /= n0, w1 /= n1;
    }
    double ss = 0;
    for (uint32_t c = 0; c < d; c++) {
        e[c] = w0 * x0[c] + w1 * x1[c];
        ss += e[c] * e[c];
    }
    for (uint32_t c = 0; c < d; c++)
        e[c] = ss > 0 ? e[c] / sqrt(ss) : 0;
}

static double ref_angle(const float *x0, const float *x1, uint32_t d)
{
    double n0 = norm(x0, d), n1 = norm(x1, d), dot = 0;
    if (n0 == 0 || n1 == 0)
        return 0;
    for (uint32_t c = 0; c < d; c++)
        dot += (double)x0[c] * x1[c];
    double cs = dot / (n0 * n1);
    return acos(cs > 1 ? 1 : cs < -1 ? -1 : cs);
}

/* A layer pair of n tokens in FP16 pages: data [2][n][d] K and V. */
typedef struct pair {
    kv_page_geom_t g;
    uint32_t n, np;
    float *k[2], *v[2];
    void **pages[2];
    kv_kern_page_t *kp[2];
} pair_t;

static void pair_pages(pair_t *p)
{
    uint32_t T = kv_fmt_fp16.tokens_per_page(&p->g), d = p->g.head_dim;
    p->np = (p->n + T - 1) / T;
    for (int j = 0; j < 2; j++) {
        /* everything an FP16 value, as stored data is */
        for (size_t i = 0; i < (size_t)p->n * d; i++) {
            p->k[j][i] = h16(p->k[j][i]);
            p->v[j][i] = h16(p->v[j][i]);
        }
        p->pages[j] = xcalloc(p->np, sizeof(void *));
        p->kp[j] = xcalloc(p->np, sizeof(kv_kern_page_t));
        for (uint32_t i = 0; i < p->np; i++) {
            uint32_t cnt = p->n - i * T < T ? p->n - i * T : T;
            p->pages[j][i] = xcalloc(p->g.page_bytes, 1);
            kv_fmt_fp16.store(p->pages[j][i], &p->g, 0, cnt, KV_DTYPE_F32,
                              p->k[j] + (size_t)i * T * d,
                              p->v[j] + (size_t)i * T * d, d);
            p->kp[j][i] = (kv_kern_page_t){.data = p->pages[j][i],
                                           .n_tokens = cnt,
                                           .format = KV_FMT_FP16};
        }
    }
}

static void pair_alloc(pair_t *p, uint32_t d, uint32_t n)
{
    memset(p, 0, sizeof *p);
    p->g = (kv_page_geom_t){.head_dim = d, .page_bytes = 64 * d};
    p->n = n;
    for (int j = 0; j < 2; j++) {
        p->k[j] = xcalloc((size_t)n * d, 4);
        p->v[j] = xcalloc((size_t)n * d, 4);
    }
}

static void pair_free(pair_t *p)
{
    for (int j = 0; j < 2; j++) {
        for (uint32_t i = 0; i < p->np; i++)
            free(p->pages[j][i]);
        free(p->pages[j]), free(p->kp[j]), free(p->k[j]), free(p->v[j]);
    }
}

/* Result of a merge: restored K/V of both layers per token (merged from the
 * MERGED pages, retained from the ret pages), and the retain marks. */
typedef struct merged {
    uint8_t *ret;
    float *k[2], *v[2]; /* [n][d] */
    uint32_t n_ret;
    int ret_exact;      /* retained tokens restored bit-exactly */
} merged_t;

static int run_merge(pair_t *p, float t, float gamma, uint32_t df, merged_t *m)
{
    const uint32_t d = p->g.head_dim, n = p->n;
    const uint32_t mcap = kv_fmt_merged_capacity(&p->g, df);
    const uint32_t T = kv_fmt_fp16.tokens_per_page(&p->g);
    memset(m, 0, sizeof *m);
    m->ret = xcalloc(n, 1);
    kv_merge_params_t mp = {.geom = p->g,
                            .src = {p->kp[0], p->kp[1]},
                            .n_src = {p->np, p->np},
                            .n_tokens = n, .t = t, .gamma = gamma,
                            .dir_format = df, .retain = m->ret};
    int rc = kv_cpu_merge_select(NULL, &mp);
    if (rc)
        return rc;
    for (uint32_t i = 0; i < n; i++)
        m->n_ret += m->ret[i];
    uint32_t nm = n - m->n_ret, nmp = (nm + mcap - 1) / mcap;
    uint32_t nrp = (m->n_ret + T - 1) / T;
    void **mpg = xcalloc(nmp + 1, sizeof(void *));
    void **rp[2] = {xcalloc(nrp + 1, sizeof(void *)),
                    xcalloc(nrp + 1, sizeof(void *))};
    for (uint32_t i = 0; i < nmp; i++)
        mpg[i] = xcalloc(p->g.page_bytes, 1);
    for (int j = 0; j < 2; j++)
        for (uint32_t i = 0; i < nrp; i++)
            rp[j][i] = xcalloc(p->g.page_bytes, 1);
    mp.dst = mpg, mp.n_dst = nmp;
    mp.ret[0] = rp[0], mp.ret[1] = rp[1];
    mp.n_ret[0] = mp.n_ret[1] = nrp;
    /* short destinations are refused */
    if (nmp) {
        mp.n_dst = nmp - 1;
        CHECK_EQ(kv_cpu_merge(NULL, &mp), KV_EINVAL);
        mp.n_dst = nmp;
    }
    rc = kv_cpu_merge(NULL, &mp);
    if (rc)
        return rc;
    m->ret_exact = 1;
    for (int j = 0; j < 2; j++) {
        m->k[j] = xcalloc((size_t)n * d, 4);
        m->v[j] = xcalloc((size_t)n * d, 4);
        uint32_t mi = 0, ri = 0;
        for (uint32_t i = 0; i < n; i++) {
            float *ko = m->k[j] + (size_t)i * d, *vo = m->v[j] + (size_t)i * d;
            if (m->ret[i]) {
                kv_fmt_fp16.load(rp[j][ri / T], &p->g, ri % T, 1, ko, vo);
                m->ret_exact &= memcmp(ko, p->k[j] + (size_t)i * d, d * 4) == 0 &&
                                memcmp(vo, p->v[j] + (size_t)i * d, d * 4) == 0;
                ri++;
            } else {
                CHECK_EQ(kv_fmt_merged_dir_format(mpg[mi / mcap], &p->g), df);
                kv_format_load(KV_FMT_MERGED, (uint32_t)j, mpg[mi / mcap],
                               &p->g, mi % mcap, 1, ko, vo);
                mi++;
            }
        }
    }
    for (uint32_t i = 0; i < nmp; i++)
        free(mpg[i]);
    for (int j = 0; j < 2; j++) {
        for (uint32_t i = 0; i < nrp; i++)
            free(rp[j][i]);
        free(rp[j]);
    }
    free(mpg);
    return 0;
}

static void merged_free(merged_t *m)
{
    free(m->ret);
    for (int j = 0; j < 2; j++)
        free(m->k[j]), free(m->v[j]);
}

/* Worst relative norm error of restored merged tokens vs originals. */
static double norm_err(const pair_t *p, const merged_t *m)
{
    double worst = 0;
    const uint32_t d = p->g.head_dim;
    for (int j = 0; j < 2; j++)
        for (uint32_t i = 0; i < p->n; i++)
            for (int h = 0; h < 2; h++) {
                const float *x = (h ? p->v[j] : p->k[j]) + (size_t)i * d;
                const float *y = (h ? m->v[j] : m->k[j]) + (size_t)i * d;
                double a = norm(x, d), b = norm(y, d);
                double e = a > 0 ? fabs(a - b) / a : b;
                worst = e > worst ? e : worst;
            }
    return worst;
}

/* Random pairs: layer l = layer l-1 rotated a little plus noise. */
static void test_merge_random(void)
{
    uint64_t s = 31;
    for (uint32_t df = 0; df <= 1; df++)
        for (uint32_t d = 16; d <= 128; d *= 2) {
            pair_t p;
            pair_alloc(&p, d, 101);
            for (size_t i = 0; i < (size_t)p.n * d; i++) {
                float a = kv_test_randf(&s) * 4, b = kv_test_randf(&s);
                p.k[0][i] = a;
                p.k[1][i] = a * 1.5f + 0.8f * kv_test_randf(&s);
                p.v[0][i] = b;
                p.v[1][i] = b * 0.5f + 0.5f * kv_test_randf(&s);
            }
            pair_pages(&p);
            const float ts[3] = {0.5f, 0.6f, 0.25f};
            for (int ti = 0; ti < 3; ti++) {
                merged_t m;
                CHECK_OK(run_merge(&p, ts[ti], 0.05f, df, &m));
                CHECK(m.ret_exact);
                CHECK(m.n_ret >= 1 && m.n_ret < p.n / 2);
                double ne = norm_err(&p, &m);
                CHECK(ne < 1e-5);
                /* directions: restored / |x| vs the reference SLERP */
                double worst = 0;
                double *e = xcalloc(d, sizeof(double));
                double avg_worst = 0;
                for (uint32_t i = 0; i < p.n; i++) {
                    if (m.ret[i])
                        continue;
                    for (int h = 0; h < 2; h++) {
                        const float *x0 = (h ? p.v[0] : p.k[0]) + (size_t)i * d;
                        const float *x1 = (h ? p.v[1] : p.k[1]) + (size_t)i * d;
                        ref_slerp(x0, x1, d, ts[ti], e);
                        for (int j = 0; j < 2; j++) {
                            const float *y = (h ? m.v[j] : m.k[j]) + (size_t)i * d;
                            double ny = norm(y, d);
                            for (uint32_t c = 0; c < d; c++) {
                                double de = fabs(y[c] / ny - e[c]);
                                worst = de > worst ? de : worst;
                            }
                        }
                        if (ts[ti] == 0.5f) { /* normalized average */
                            double n0 = norm(x0, d), n1 = norm(x1, d), sa = 0;
                            double *avg = xcalloc(d, sizeof(double));
                            for (uint32_t c = 0; c < d; c++) {
                                avg[c] = x0[c] / n0 + x1[c] / n1;
                                sa += avg[c] * avg[c];
                            }
                            const float *y = (h ? m.v[0] : m.k[0]) + (size_t)i * d;
                            double ny = norm(y, d);
                            for (uint32_t c = 0; c < d; c++) {
                                double de = fabs(y[c] / ny - avg[c] / sqrt(sa));
                                avg_worst = de > avg_worst ? de : avg_worst;
                            }
                            free(avg);
                        }
                    }
                }
                double tol = df == 0 ? 1e-3 : 0.06;
                CHECK(worst < tol);
                CHECK(avg_worst < tol);
                if (worst >= tol || avg_worst >= tol || ne >= 1e-5)
                    fprintf(stderr, "df %u d %u t %g: dir %g avg %g norm %g\n",
                            df, d, ts[ti], worst, avg_worst, ne);
                free(e);
                merged_free(&m);
            }
            pair_free(&p);
        }
}

/* Designed angles: K of token i is rotated by theta_i between the layers
 * (V by a second set), so the retention rule can be checked exactly. */
static void test_retention(void)
{
    const uint32_t d = 64, n = 60;
    pair_t p;
    pair_alloc(&p, d, n);
    uint64_t s = 9;
    double thk[64], thv[64];
    for (uint32_t i = 0; i < n; i++) {
        /* distinct angles 0.2 .. 2.6 rad, spaced >= 0.04 apart */
        thk[i] = 0.2 + 0.04 * ((i * 37) % n);
        thv[i] = 0.2 + 0.04 * ((i * 13 + 5) % n);
        for (int h = 0; h < 2; h++) {
            float *u = xcalloc(d, 4), *w = xcalloc(d, 4);
            random_unit(&s, u, d);
            random_unit(&s, w, d);
            double dot = 0;
            for (uint32_t c = 0; c < d; c++)
                dot += (double)u[c] * w[c];
            double nw = 0;
            for (uint32_t c = 0; c < d; c++) {
                w[c] = (float)(w[c] - dot * u[c]);
                nw += (double)w[c] * w[c];
            }
            double th = h ? thv[i] : thk[i];
            float *x0 = (h ? p.v[0] : p.k[0]) + (size_t)i * d;
            float *x1 = (h ? p.v[1] : p.k[1]) + (size_t)i * d;
            for (uint32_t c = 0; c < d; c++) {
                x0[c] = 2.0f * u[c];
                x1[c] = (float)(3.0 * (cos(th) * u[c] + sin(th) * w[c] / sqrt(nw)));
            }
            free(u), free(w);
        }
    }
    pair_pages(&p);
    /* the angles as stored (FP16 rounding moves them by ~1e-3) */
    double dk[64], dv[64], lo[2] = {9, 9}, hi[2] = {-1, -1};
    for (uint32_t i = 0; i < n; i++) {
        dk[i] = ref_angle(p.k[0] + i * d, p.k[1] + i * d, d) / PI;
        dv[i] = ref_angle(p.v[0] + i * d, p.v[1] + i * d, d) / PI;
        lo[0] = fmin(lo[0], dk[i]), hi[0] = fmax(hi[0], dk[i]);
        lo[1] = fmin(lo[1], dv[i]), hi[1] = fmax(hi[1], dv[i]);
    }
    const float gammas[4] = {0.0f, 0.05f, 0.3f, 1.0f};
    for (int gi = 0; gi < 4; gi++) {
        merged_t m;
        CHECK_OK(run_merge(&p, 0.6f, gammas[gi], KV_FMT_FP16, &m));
        uint32_t want_n = 0, same = 1;
        for (uint32_t i = 0; i < n; i++) {
            int want = dk[i] > hi[0] - gammas[gi] * (hi[0] - lo[0]) ||
                       dv[i] > hi[1] - gammas[gi] * (hi[1] - lo[1]);
            want_n += want;
            same &= (m.ret[i] != 0) == want;
        }
        CHECK(same);
        CHECK_EQ(m.n_ret, want_n);
        if (gammas[gi] == 0.0f)
            CHECK_EQ(m.n_ret, 0);
        if (gammas[gi] == 0.05f) /* 5% of 2.36 rad: the top ~3 of each */
            CHECK(m.n_ret >= 2 && m.n_ret <= 8);
        if (gammas[gi] == 1.0f) /* all but a token minimal in K and V:  */
            CHECK_EQ(m.n_ret, n); /* the K-min and V-min tokens differ */
        CHECK(m.ret_exact);
        CHECK(norm_err(&p, &m) < 1e-5);
        merged_free(&m);
    }
    /* equal distances everywhere: nothing is "most distinct" */
    for (uint32_t i = 0; i < n; i++) {
        memcpy(p.k[1] + i * d, p.k[0], d * 4);
        memcpy(p.k[0] + i * d, p.k[0], d * 4);
        memcpy(p.v[1] + i * d, p.v[0], d * 4);
        memcpy(p.v[0] + i * d, p.v[0], d * 4);
    }
    pair_free(&p);
    pair_alloc(&p, d, n);
    for (size_t i = 0; i < (size_t)n * d; i++) {
        p.k[0][i] = p.k[1][i] = (float)(i % d) - 30.0f;
        p.v[0][i] = p.v[1][i] = 1.0f;
    }
    pair_pages(&p);
    merged_t m;
    CHECK_OK(run_merge(&p, 0.6f, 1.0f, KV_FMT_FP16, &m));
    CHECK_EQ(m.n_ret, 0);
    merged_free(&m);
    pair_free(&p);
}

/* Zero vectors and antiparallel pairs. */
static void test_degenerate(void)
{
    const uint32_t d = 32, n = 8;
    uint64_t s = 4;
    for (uint32_t df = 0; df <= 1; df++)
        for (int ti = 0; ti < 2; ti++) {
            float t = ti ? 0.6f : 0.5f;
            pair_t p;
            pair_alloc(&p, d, n);
            float *u = xcalloc(d, 4);
            for (uint32_t i = 0; i < n; i++) {
                random_unit(&s, u, d);
                for (uint32_t c = 0; c < d; c++) {
                    float a = 3 * u[c];
                    float *k0 = p.k[0] + i * d + c, *k1 = p.k[1] + i * d + c;
                    float *v0 = p.v[0] + i * d + c, *v1 = p.v[1] + i * d + c;
                    switch (i % 4) {
                    case 0: *k0 = 0, *k1 = a, *v0 = a, *v1 = 0; break;  /* one zero */
                    case 1: *k0 = 0, *k1 = 0, *v0 = 0, *v1 = 0; break;  /* both */
                    case 2: *k0 = a, *k1 = -a, *v0 = -a, *v1 = 2 * a; break; /* anti */
                    default: *k0 = a, *k1 = a, *v0 = a, *v1 = 0.5f * a; break; /* same */
                    }
                }
            }
            pair_pages(&p);
            merged_t m;
            CHECK_OK(run_merge(&p, t, 0.0f, df, &m)); /* merge every token */
            CHECK_EQ(m.n_ret, 0);
            int finite = 1, zeros = 1;
            for (int j = 0; j < 2; j++) {
                finite &= all_finite(m.k[j], (size_t)n * d) &&
                          all_finite(m.v[j], (size_t)n * d);
                for (uint32_t i = 0; i < n; i++)
                    for (uint32_t c = 0; c < d; c++) {
                        /* an original zero restores to exactly zero */
                        if (p.k[j][i * d + c] == 0 && norm(p.k[j] + i * d, d) == 0)
                            zeros &= m.k[j][i * d + c] == 0.0f;
                        if (norm(p.v[j] + i * d, d) == 0)
                            zeros &= m.v[j][i * d + c] == 0.0f;
                    }
            }
            CHECK(finite);
            CHECK(zeros);
            CHECK(norm_err(&p, &m) < 1e-5);
            /* one zero layer: the other restores to its own direction */
            double worst = 0;
            for (uint32_t i = 0; i < n; i += 4)
                for (uint32_t c = 0; c < d; c++) {
                    worst = fmax(worst, fabs(m.k[1][i * d + c] - p.k[1][i * d + c]));
                    worst = fmax(worst, fabs(m.v[0][i * d + c] - p.v[0][i * d + c]));
                }
            CHECK(worst < (df == 0 ? 1e-2 : 0.5));
            /* parallel pair: both restore to themselves */
            worst = 0;
            for (uint32_t i = 3; i < n; i += 4)
                for (int j = 0; j < 2; j++)
                    for (uint32_t c = 0; c < d; c++)
                        worst = fmax(worst, fabs(m.k[j][i * d + c] - p.k[j][i * d + c]));
            CHECK(worst < (df == 0 ? 1e-2 : 0.5));
            merged_free(&m);
            pair_free(&p);
            free(u);
        }
}

static void test_merge_errors(void)
{
    pair_t p;
    pair_alloc(&p, 64, 20);
    uint64_t s = 3;
    for (size_t i = 0; i < 20 * 64; i++) {
        p.k[0][i] = kv_test_randf(&s), p.k[1][i] = kv_test_randf(&s);
        p.v[0][i] = kv_test_randf(&s), p.v[1][i] = kv_test_randf(&s);
    }
    pair_pages(&p);
    uint8_t ret[21];
    memset(ret, 7, sizeof ret);
    kv_merge_params_t ok = {.geom = p.g, .src = {p.kp[0], p.kp[1]},
                            .n_src = {p.np, p.np}, .n_tokens = 20, .t = 0.6f,
                            .gamma = 0.05f, .dir_format = KV_FMT_FP16,
                            .retain = ret};
    kv_merge_params_t b = ok;
    b.t = 1.5f;
    CHECK_EQ(kv_cpu_merge_select(NULL, &b), KV_EINVAL);
    b = ok, b.gamma = NAN;
    CHECK_EQ(kv_cpu_merge_select(NULL, &b), KV_EINVAL);
    b = ok, b.gamma = -0.1f;
    CHECK_EQ(kv_cpu_merge_select(NULL, &b), KV_EINVAL);
    b = ok, b.dir_format = KV_FMT_INT2;
    CHECK_EQ(kv_cpu_merge_select(NULL, &b), KV_ENOTSUP);
    b = ok, b.n_tokens = 21; /* beyond the source */
    CHECK_EQ(kv_cpu_merge_select(NULL, &b), KV_EINVAL);
    b = ok, b.n_tokens = 0;
    CHECK_EQ(kv_cpu_merge_select(NULL, &b), KV_EINVAL);
    b = ok, b.retain = NULL;
    CHECK_EQ(kv_cpu_merge_select(NULL, &b), KV_EINVAL);
    b = ok, b.geom.head_dim = 40;
    CHECK_EQ(kv_cpu_merge_select(NULL, &b), KV_EINVAL);
    CHECK_EQ(kv_cpu_merge(NULL, &ok), KV_EINVAL); /* no destinations */
    for (size_t i = 0; i < sizeof ret; i++)
        CHECK_EQ(ret[i], 7);
    /* select allocates its angles: an allocation failure changes nothing */
    kv_fault_arm(1);
    CHECK_EQ(kv_cpu_merge_select(NULL, &ok), KV_ENOMEM);
    kv_fault_arm(0);
    CHECK_EQ(ret[0], 7);
    CHECK_OK(kv_cpu_merge_select(NULL, &ok));
    CHECK_EQ(ret[20], 7);
    pair_free(&p);
    CHECK_EQ(kv_cpu_convert(NULL, NULL), KV_EINVAL);
    CHECK_EQ(kv_cpu_merge(NULL, NULL), KV_EINVAL);
}

int main(void)
{
    uint64_t mem0 = kv_mem_live_bytes();
    test_entry();
    test_geometry();
    test_put_load();
    test_convert();
    test_merge_random();
    test_retention();
    test_degenerate();
    test_merge_errors();
    CHECK_EQ(kv_mem_live_bytes(), mem0);
    return kv_test_end();
}
