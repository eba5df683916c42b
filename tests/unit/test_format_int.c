/* SPDX-License-Identifier: MIT */
/*
 * test_format_int.c — the INT4 and INT2 page formats (formats/kv_fmt_int.h).
 *
 * Checks, for b in {2, 4}:
 *   - the entries: names, bits notes, copy NULL; the traits table holds the
 *     same functions once it lists them;
 *   - geometry: tokens per page vs FP16 for head_dim 64/128 and many page
 *     sizes (INT2 exactly 4x, INT4 8/3x on multiples of 192*D, floor
 *     otherwise), 0 when the page or head_dim cannot hold a group; the block
 *     offsets of kv_fmt_int.h and bits/element computed from them (4 and 6);
 *   - packing: a hand-built group (scale 1, min 0, known codes) gives the
 *     exact uint32 words of the spec (code j at bits b*j.., e.g. 0xE4E4E4E4);
 *   - every decoded element equals a scalar decoder written here from the
 *     layout spec, bit for bit (so both load paths follow the spec);
 *   - round trip on random data of varied ranges (tiny, ~1, near 65504,
 *     mixed sign, one outlier): |x - x^| <= stored scale/2 (+ FP32
 *     rounding) for every element, stored min <= group min and
 *     min + L*scale >= group max, scale not more than one FP16 step above
 *     (max - min)/L;
 *   - constant groups (0, -0, subnormal, +-65504, ...) decode bit-exactly;
 *   - loads of ranges not aligned to groups equal the full load's rows and
 *     write nothing past their n rows; K-only and V-only loads;
 *   - store from FP16 rows == store of the same values as FP32 rows, with a
 *     source stride; a store writes only its own groups;
 *   - a store with t0 or n not a multiple of 16 is rejected: it asserts
 *     (checked in a child process) or, in NDEBUG builds, writes nothing.
 */
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "kv_test.h"
#include "formats/kv_fmt_codec.h"
#include "formats/kv_fmt_fp16.h"
#include "formats/kv_fmt_int.h"
#include "util/kv_le.h"

static const kv_format_traits_t *fmt_of(uint32_t bits)
{
    return bits == 2 ? &kv_fmt_int2 : &kv_fmt_int4;
}

static uint32_t tpp_of(uint32_t bits, uint32_t d, uint32_t page_bytes)
{
    kv_page_geom_t g = {.head_dim = d, .page_bytes = page_bytes};
    return fmt_of(bits)->tokens_per_page(&g);
}

/* ---- a scalar decoder written from the layout spec in kv_fmt_int.h -------- */

static float rdh(const uint8_t *p)
{
    kv_half_t h;
    memcpy(&h, p, 2);
    return kv_half_to_float(h);
}

typedef struct ref_q {
    uint32_t q;     /* code                  */
    float s, m;     /* stored scale and min  */
} ref_q_t;

/* K element (token t, channel c) of a page. */
static ref_q_t ref_k(const uint8_t *page, uint32_t d, uint32_t b, uint32_t t,
                     uint32_t c)
{
    uint32_t gb = 2 * d * (2 * b + 4), per = 32 / b, tt = t % 16;
    const uint8_t *blk = page + (size_t)(t / 16) * gb;
    uint32_t w = kv_le_get32(blk + 4 * ((tt / per) * d + c));
    ref_q_t r;
    r.q = (w >> (b * (tt % per))) & ((1u << b) - 1);
    r.s = rdh(blk + 4 * b * d + 2 * c);
    r.m = rdh(blk + 4 * b * d + 2 * d + 2 * c);
    return r;
}

/* V element (token t, channel c) of a page. */
static ref_q_t ref_v(const uint8_t *page, uint32_t d, uint32_t b, uint32_t t,
                     uint32_t c)
{
    uint32_t gb = 2 * d * (2 * b + 4), per = 32 / b, tt = t % 16;
    uint32_t ng = d / 16, nw = b / 2, cg = c / 16, j = c % 16;
    const uint8_t *blk = page + (size_t)(t / 16) * gb;
    uint32_t w = kv_le_get32(blk + 2 * b * d + 4 * ((tt * ng + cg) * nw + j / per));
    ref_q_t r;
    r.q = (w >> (b * (j % per))) & ((1u << b) - 1);
    r.s = rdh(blk + 4 * b * d + 4 * d + 2 * (tt * ng + cg));
    r.m = rdh(blk + 4 * b * d + 6 * d + 2 * (tt * ng + cg));
    return r;
}

/* x^ = q * scale + min rounded once (kv_fmt_int.h). */
static float ref_dec(ref_q_t r)
{
    return fmaf((float)r.q, r.s, r.m);
}

static int same_bits(float a, float b)
{
    return memcmp(&a, &b, sizeof a) == 0;
}

/* ---- the one dequantization ---------------------------------------------- */

/* kv_fmt_codec_dequant (an exact product, then the sum) is the fused
 * multiply-add fmaf(q, s, m) for every code q and every pair of finite
 * binary16 values s, m: s over all of them, m over both signs of every
 * exponent with three mantissas (0, 1, all ones), +-0 included. */
static void test_dequant_fused(void)
{
    long bad = 0, n = 0;
    for (uint32_t hs = 0; hs < 0x10000u; hs++) {
        if ((hs & 0x7c00u) == 0x7c00u) /* Inf, NaN */
            continue;
        const float s = kv_half_to_float((kv_half_t)hs);
        for (uint32_t e = 0; e < 31; e++)
            for (uint32_t mi = 0; mi < 6; mi++) {
                static const uint16_t man[3] = {0, 1, 0x3ff};
                const uint16_t hm = (uint16_t)((mi & 1 ? 0x8000u : 0u) |
                                               (e << 10) | man[mi / 2]);
                const float m = kv_half_to_float(hm);
                for (uint32_t q = 0; q < 16; q++, n++) {
                    const float a = kv_fmt_codec_dequant(q, s, m);
                    const float b = fmaf((float)q, s, m);
                    bad += memcmp(&a, &b, sizeof a) != 0;
                }
            }
    }
    CHECK(n > 80000000);
    CHECK_EQ(bad, 0);
}

/* ---- entries and geometry ------------------------------------------------ */

static void test_entries(void)
{
    CHECK(strcmp(kv_fmt_int4.name, "int4") == 0);
    CHECK(strcmp(kv_fmt_int2.name, "int2") == 0);
    CHECK(strcmp(kv_fmt_int4.bits_note, "INT4 g16 = 6 bits/element") == 0);
    CHECK(strcmp(kv_fmt_int2.bits_note, "INT2 g16 = 4 bits/element") == 0);
    for (uint32_t b = 2; b <= 4; b += 2) {
        const kv_format_traits_t *t = fmt_of(b);
        CHECK(t->tokens_per_page && t->load && t->store);
        CHECK(t->copy == NULL);
        /* once kv_format_table lists the format, it is this entry */
        const kv_format_traits_t *e =
            kv_format_get(b == 2 ? KV_FMT_INT2 : KV_FMT_INT4);
        if (e) {
            CHECK(strcmp(e->name, t->name) == 0);
            CHECK(e->tokens_per_page == t->tokens_per_page);
            CHECK(e->load == t->load && e->store == t->store);
            CHECK(e->copy == NULL);
        }
    }
}

static void test_geometry(void)
{
    kv_page_geom_t g;
    /* the examples: D 64, 4 KiB: INT2 64 tokens vs FP16 16 (4x) */
    g = (kv_page_geom_t){.head_dim = 64, .page_bytes = 4096};
    CHECK_EQ(kv_fmt_fp16.tokens_per_page(&g), 16);
    CHECK_EQ(tpp_of(2, 64, 4096), 64);
    CHECK_EQ(tpp_of(4, 64, 4096), 32); /* floor(4096 / 1536) = 2 groups */
    /* D 64, 12 KiB: INT4 128 vs FP16 48 (8/3x), INT2 192 */
    g.page_bytes = 12288;
    CHECK_EQ(kv_fmt_fp16.tokens_per_page(&g), 48);
    CHECK_EQ(tpp_of(4, 64, 12288), 128);
    CHECK_EQ(tpp_of(2, 64, 12288), 192);
    /* D 128 */
    CHECK_EQ(tpp_of(2, 128, 8192), 64);
    CHECK_EQ(tpp_of(4, 128, 8192), 32);
    CHECK_EQ(tpp_of(4, 128, 24576), 128);
    CHECK_EQ(tpp_of(2, 128, 24576), 192);
    /* INT2 is exactly 4x FP16 on every multiple of 64*D; INT4 8/3x on
     * every multiple of 192*D */
    for (uint32_t d = 16; d <= 256; d *= 2)
        for (uint32_t m = 1; m <= 12; m++) {
            g = (kv_page_geom_t){.head_dim = d, .page_bytes = 64 * d * m};
            CHECK_EQ(tpp_of(2, d, g.page_bytes),
                     4 * kv_fmt_fp16.tokens_per_page(&g));
            g.page_bytes = 192 * d * m;
            CHECK_EQ(3 * tpp_of(4, d, g.page_bytes),
                     8 * kv_fmt_fp16.tokens_per_page(&g));
        }
    /* floor: whole groups only */
    CHECK_EQ(tpp_of(2, 64, 1023), 0);
    CHECK_EQ(tpp_of(2, 64, 1024), 16);
    CHECK_EQ(tpp_of(2, 64, 2047), 16);
    CHECK_EQ(tpp_of(4, 64, 1535), 0);
    CHECK_EQ(tpp_of(4, 64, 1536), 16);
    CHECK_EQ(tpp_of(4, 64, 5000), 48);
    /* head_dim must be a multiple of 16, 16..1024 */
    CHECK_EQ(tpp_of(2, 0, 4096), 0);
    CHECK_EQ(tpp_of(2, 8, 4096), 0);
    CHECK_EQ(tpp_of(4, 72, 1 << 20), 0);
    CHECK_EQ(tpp_of(4, 1040, 1 << 20), 0);
    CHECK_EQ(tpp_of(4, 1024, 24576), 16);
    CHECK_EQ(tpp_of(2, 16, 0xffffffffu), 16 * (0xffffffffu / 256u));

    /* block offsets (kv_fmt_int.h), D = 64: INT2 */
    kv_fmt_int_layout_t l = kv_fmt_int_layout(64, 2);
    CHECK_EQ(l.group_bytes, 1024);
    CHECK_EQ(l.k_codes, 0);
    CHECK_EQ(l.v_codes, 256);
    CHECK_EQ(l.k_scale, 512);
    CHECK_EQ(l.k_min, 640);
    CHECK_EQ(l.v_scale, 768);
    CHECK_EQ(l.v_min, 896);
    l = kv_fmt_int_layout(64, 4);
    CHECK_EQ(l.group_bytes, 1536);
    CHECK_EQ(l.v_codes, 512);
    CHECK_EQ(l.k_scale, 1024);
    CHECK_EQ(l.v_min, 1408);
    /* bits per element: block bits over the 2 * 16 * D elements */
    for (uint32_t b = 2; b <= 4; b += 2)
        for (uint32_t d = 16; d <= 1024; d += 16) {
            l = kv_fmt_int_layout(d, b);
            CHECK_EQ(l.v_min + 2 * d, l.group_bytes);
            CHECK_EQ(l.group_bytes * 8 % (32 * d), 0);
            CHECK_EQ(l.group_bytes * 8 / (32 * d), b + 2);
        }
}

/* ---- packing ------------------------------------------------------------- */

static void test_packing(uint32_t b, uint32_t d)
{
    const kv_format_traits_t *f = fmt_of(b);
    kv_fmt_int_layout_t l = kv_fmt_int_layout(d, b);
    kv_page_geom_t g = {.head_dim = d, .page_bytes = l.group_bytes};
    uint32_t lv = (1u << b) - 1, per = 32 / b, nw = b / 2, ng = d / 16;
    float *k = malloc(sizeof(float) * 16 * d);
    float *v = malloc(sizeof(float) * 16 * d);
    float *ko = malloc(sizeof(float) * 16 * d);
    uint8_t *page = malloc(l.group_bytes);
    if (!k || !v || !ko || !page) {
        CHECK(0);
        goto out;
    }
    /* every K channel and every V group spans 0..L: scale 1, min 0, and the
     * code of each element is its value */
    for (uint32_t t = 0; t < 16; t++)
        for (uint32_t c = 0; c < d; c++) {
            k[t * d + c] = (float)((t + c) % (lv + 1));
            v[t * d + c] = (float)((t + c) % (lv + 1));
        }
    f->store(page, &g, 0, 16, KV_DTYPE_F32, k, v, d);

    /* literal words: K channel 0 holds codes t % (L+1) for t = 0..15, as
     * does V token 0, group 0 for its channels j = 0..15 */
    const uint8_t *kc = page + l.k_codes, *vc = page + l.v_codes;
    if (b == 2) {
        CHECK_EQ(kv_le_get32(kc), 0xE4E4E4E4u);
        CHECK_EQ(kv_le_get32(vc), 0xE4E4E4E4u);
        CHECK_EQ(kv_le_get32(kc + 4), 0x39393939u); /* channel 1: (t+1) % 4 */
    } else {
        CHECK_EQ(kv_le_get32(kc), 0x76543210u);     /* plane 0, channel 0 */
        CHECK_EQ(kv_le_get32(kc + 4 * d), 0xFEDCBA98u); /* plane 1, channel 0 */
        CHECK_EQ(kv_le_get32(vc), 0x76543210u);
        CHECK_EQ(kv_le_get32(vc + 4), 0xFEDCBA98u);
        CHECK_EQ(kv_le_get32(kc + 4), 0x87654321u); /* channel 1: (t+1) % 16 */
    }
    /* every word, built here from the spec */
    long bad = 0;
    for (uint32_t c = 0; c < d; c++)
        for (uint32_t w = 0; w < nw; w++) {
            uint32_t want = 0;
            for (uint32_t i = 0; i < per; i++)
                want |= ((w * per + i + c) % (lv + 1)) << (b * i);
            if (kv_le_get32(kc + 4 * (w * d + c)) != want)
                bad++;
        }
    for (uint32_t t = 0; t < 16; t++)
        for (uint32_t cg = 0; cg < ng; cg++)
            for (uint32_t w = 0; w < nw; w++) {
                uint32_t want = 0;
                for (uint32_t i = 0; i < per; i++)
                    want |= ((t + 16 * cg + w * per + i) % (lv + 1)) << (b * i);
                if (kv_le_get32(vc + 4 * ((t * ng + cg) * nw + w)) != want)
                    bad++;
            }
    /* scale 1.0 (0x3C00) and min 0 everywhere */
    for (uint32_t i = 0; i < d; i++) {
        kv_half_t hs, hm, vs, vm;
        memcpy(&hs, page + l.k_scale + 2 * i, 2);
        memcpy(&hm, page + l.k_min + 2 * i, 2);
        memcpy(&vs, page + l.v_scale + 2 * i, 2);
        memcpy(&vm, page + l.v_min + 2 * i, 2);
        if (hs != 0x3C00 || hm != 0 || vs != 0x3C00 || vm != 0)
            bad++;
    }
    CHECK_EQ(bad, 0);
    /* and decoding gives the values back exactly */
    f->load(page, &g, 0, 16, ko, NULL);
    CHECK(memcmp(ko, k, sizeof(float) * 16 * d) == 0);
    f->load(page, &g, 0, 16, NULL, ko);
    CHECK(memcmp(ko, v, sizeof(float) * 16 * d) == 0);
out:
    free(k);
    free(v);
    free(ko);
    free(page);
}

/* ---- random data: spec decode, error bound, partial loads ---------------- */

/* A random group magnitude: tiny, small, ~1, large, near the FP16 max. */
static float rand_mag(uint64_t *s)
{
    static const float mags[] = {1e-6f, 3e-4f, 0.02f, 1.0f, 30.0f,
                                 900.0f, 20000.0f, 65504.0f};
    return mags[kv_test_rand(s) % (sizeof mags / sizeof mags[0])];
}

/* Fill rows [n][stride] group by group (K: per channel over 16 tokens, V:
 * per token over 16 channels) with values of varied range and sign; a few
 * groups constant, some with one outlier. All within +-65504. */
static void fill_groups(float *k, float *v, uint32_t n, uint32_t d,
                        size_t stride, uint64_t *s)
{
    for (uint32_t g0 = 0; g0 < n; g0 += 16)
        for (uint32_t c = 0; c < d; c++) {
            float mag = rand_mag(s), off = kv_test_randf(s) * mag;
            uint32_t kind = (uint32_t)(kv_test_rand(s) % 8);
            for (uint32_t t = g0; t < g0 + 16; t++) {
                float x = off + kv_test_randf(s) * mag;
                if (kind == 0)
                    x = kv_half_to_float(kv_half_from_float(off));
                if (kind == 1 && t == g0 + 5)
                    x = 1000.0f * (mag > 60.0f ? 60.0f : mag);
                if (x > KV_HALF_MAX)
                    x = KV_HALF_MAX;
                if (x < -KV_HALF_MAX)
                    x = -KV_HALF_MAX;
                k[t * stride + c] = x;
            }
        }
    for (uint32_t t = 0; t < n; t++)
        for (uint32_t c0 = 0; c0 < d; c0 += 16) {
            float mag = rand_mag(s), off = kv_test_randf(s) * mag;
            uint32_t kind = (uint32_t)(kv_test_rand(s) % 8);
            for (uint32_t c = c0; c < c0 + 16; c++) {
                float x = off + kv_test_randf(s) * mag;
                if (kind == 0)
                    x = kv_half_to_float(kv_half_from_float(off));
                if (kind == 1 && c == c0 + 11)
                    x = -1000.0f * (mag > 60.0f ? 60.0f : mag);
                if (x > KV_HALF_MAX)
                    x = KV_HALF_MAX;
                if (x < -KV_HALF_MAX)
                    x = -KV_HALF_MAX;
                v[t * stride + c] = x;
            }
        }
}

/* |x - x^| within the stored scale / 2 (+ FP32 rounding of encode/decode). */
static int within(float x, float xh, ref_q_t r, uint32_t lv)
{
    double tol = 0.5 * r.s + r.s * lv * 1e-6 +
                 1e-6 * (fabs((double)x) + fabs((double)xh));
    return fabs((double)x - (double)xh) <= tol;
}

/* Group checks beyond the element bound: min <= group min, the top code
 * reaches the group max, scale at most one FP16 step above (max-min)/L. */
static long check_group_params(const float *x, size_t xs, ref_q_t r,
                               uint32_t lv)
{
    float mn = x[0], mx = x[0];
    for (uint32_t j = 1; j < 16; j++) {
        mn = x[j * xs] < mn ? x[j * xs] : mn;
        mx = x[j * xs] > mx ? x[j * xs] : mx;
    }
    long bad = 0;
    if (mx == mn)
        return (r.s != 0.0f || r.m != kv_half_to_float(kv_half_from_float(mn)));
    if (r.m > mn)
        bad++;
    if ((double)r.m + (double)lv * r.s < (double)mx)
        bad++;
    double ideal = ((double)mx - r.m) / lv;
    if (r.s > ideal * (1.0 + 1.0 / 512) + 0x1p-24)
        bad++;
    return bad;
}

static void test_random(uint32_t b, uint32_t d, uint32_t page_bytes,
                        uint64_t seed)
{
    const kv_format_traits_t *f = fmt_of(b);
    kv_page_geom_t g = {.head_dim = d, .page_bytes = page_bytes};
    uint32_t tpp = f->tokens_per_page(&g), lv = (1u << b) - 1;
    size_t stride = d + 3, rows = (size_t)tpp + 2; /* +2 sentinel rows */
    uint64_t s = seed;
    float *k = malloc(sizeof(float) * tpp * stride);
    float *v = malloc(sizeof(float) * tpp * stride);
    float *ko = malloc(sizeof(float) * rows * d);
    float *vo = malloc(sizeof(float) * rows * d);
    float *kp = malloc(sizeof(float) * rows * d);
    float *vp = malloc(sizeof(float) * rows * d);
    uint8_t *page = malloc(page_bytes);
    if (!k || !v || !ko || !vo || !kp || !vp || !page || tpp == 0) {
        CHECK(0);
        goto out;
    }
    fill_groups(k, v, tpp, d, stride, &s);
    f->store(page, &g, 0, tpp, KV_DTYPE_F32, k, v, stride);
    f->load(page, &g, 0, tpp, ko, vo);

    long bad_spec = 0, bad_err = 0, bad_par = 0;
    for (uint32_t t = 0; t < tpp; t++)
        for (uint32_t c = 0; c < d; c++) {
            ref_q_t rk = ref_k(page, d, b, t, c), rv = ref_v(page, d, b, t, c);
            float xk = ko[(size_t)t * d + c], xv = vo[(size_t)t * d + c];
            if (!same_bits(xk, ref_dec(rk)) || !same_bits(xv, ref_dec(rv)))
                bad_spec++;
            if (!within(k[t * stride + c], xk, rk, lv) ||
                !within(v[t * stride + c], xv, rv, lv))
                bad_err++;
            if (t % 16 == 0) /* K group of channel c */
                bad_par += check_group_params(k + t * stride + c, stride, rk, lv);
            if (c % 16 == 0) /* V group of token t */
                bad_par += check_group_params(v + t * stride + c, 1, rv, lv);
        }
    CHECK_EQ(bad_spec, 0);
    CHECK_EQ(bad_err, 0);
    CHECK_EQ(bad_par, 0);

    /* ranges not aligned to groups: same rows, nothing written past n */
    const uint32_t ranges[][2] = {{3, 5},  {15, 2}, {7, 30}, {0, 1},
                                  {16, 16}, {1, 47}, {9, 3}};
    long bad_part = 0;
    for (size_t i = 0; i < sizeof ranges / sizeof ranges[0] + 2; i++) {
        uint32_t t0, n;
        if (i < sizeof ranges / sizeof ranges[0]) {
            t0 = ranges[i][0];
            n = ranges[i][1];
        } else if (i == sizeof ranges / sizeof ranges[0]) {
            t0 = tpp - 1, n = 1;
        } else {
            t0 = 17 % tpp, n = tpp - 17 % tpp;
        }
        if (t0 + n > tpp)
            continue;
        for (int which = 0; which < 3; which++) { /* both, K only, V only */
            for (size_t e = 0; e < rows * d; e++)
                kp[e] = vp[e] = -7.0f;
            f->load(page, &g, t0, n, which == 2 ? NULL : kp,
                    which == 1 ? NULL : vp);
            size_t cnt = (size_t)n * d;
            if (which != 2 &&
                memcmp(kp, ko + (size_t)t0 * d, cnt * sizeof(float)) != 0)
                bad_part++;
            if (which != 1 &&
                memcmp(vp, vo + (size_t)t0 * d, cnt * sizeof(float)) != 0)
                bad_part++;
            for (size_t e = (which == 2 ? 0 : cnt); e < rows * d; e++)
                if (kp[e] != -7.0f) {
                    bad_part++;
                    break;
                }
            for (size_t e = (which == 1 ? 0 : cnt); e < rows * d; e++)
                if (vp[e] != -7.0f) {
                    bad_part++;
                    break;
                }
        }
    }
    CHECK_EQ(bad_part, 0);
out:
    free(k);
    free(v);
    free(ko);
    free(vo);
    free(kp);
    free(vp);
    free(page);
}

/* ---- special groups -------------------------------------------------------- */

/* Constant groups decode bit-exactly; an outlier and mixed sign stay within
 * the bound (and the outlier gets the top code). */
static void test_special(uint32_t b, uint32_t d)
{
    static const float consts[] = {0.0f,      -0.0f,    0x1p-24f, -0x1p-24f,
                                   65504.0f,  -65504.0f, 1.5f,    -3.140625f,
                                   0x1.ff8p-15f /* largest subnormal */};
    const uint32_t nc = sizeof consts / sizeof consts[0];
    const kv_format_traits_t *f = fmt_of(b);
    kv_fmt_int_layout_t l = kv_fmt_int_layout(d, b);
    kv_page_geom_t g = {.head_dim = d, .page_bytes = 2 * l.group_bytes};
    uint32_t lv = (1u << b) - 1;
    uint64_t s = 77 + b;
    float *k = malloc(sizeof(float) * 32 * d), *v = malloc(sizeof(float) * 32 * d);
    float *ko = malloc(sizeof(float) * 32 * d), *vo = malloc(sizeof(float) * 32 * d);
    uint8_t *page = malloc(g.page_bytes);
    if (!k || !v || !ko || !vo || !page) {
        CHECK(0);
        goto out;
    }
    for (size_t i = 0; i < (size_t)32 * d; i++)
        k[i] = v[i] = kv_test_randf(&s) * 3.0f;
    /* K: channel c < nc constant over group 0; V: token t < nc constant
     * over channel group 0 */
    for (uint32_t c = 0; c < nc && c < d; c++)
        for (uint32_t t = 0; t < 16; t++)
            k[t * d + c] = consts[c];
    for (uint32_t t = 0; t < nc; t++)
        for (uint32_t c = 0; c < 16; c++)
            v[t * d + c] = consts[t];
    /* group 1: K channel 0 an outlier at token 20, channel 1 mixed sign;
     * V token 16 an outlier at channel 3, token 17 mixed sign */
    for (uint32_t t = 16; t < 32; t++) {
        k[t * d + 0] = 0.25f * kv_test_randf(&s) + 0.5f;
        k[t * d + 1] = (t % 2 ? -5.0f : 7.0f) * (0.5f + 0.5f * (t - 16) / 15);
    }
    k[20 * d + 0] = 1000.0f;
    for (uint32_t c = 0; c < 16; c++) {
        v[16 * d + c] = 0.25f * kv_test_randf(&s);
        v[17 * d + c] = (c % 2 ? -5.0f : 7.0f) * (0.5f + 0.5f * c / 15);
    }
    v[16 * d + 3] = -2000.0f;
    f->store(page, &g, 0, 32, KV_DTYPE_F32, k, v, d);
    f->load(page, &g, 0, 32, ko, vo);

    long bad = 0;
    for (uint32_t i = 0; i < nc; i++)
        for (uint32_t j = 0; j < 16; j++) {
            if (i < d && !same_bits(ko[j * d + i], consts[i]))
                bad++;
            if (!same_bits(vo[i * d + j], consts[i]))
                bad++;
        }
    CHECK_EQ(bad, 0);
    /* the stored scale of a constant group is zero */
    ref_q_t r = ref_k(page, d, b, 0, 4);
    CHECK(r.s == 0.0f && r.q == 0);
    r = ref_v(page, d, b, 6, 0);
    CHECK(r.s == 0.0f && r.q == 0);

    bad = 0;
    for (uint32_t t = 16; t < 32; t++)
        for (uint32_t c = 0; c < 2; c++)
            if (!within(k[t * d + c], ko[t * d + c], ref_k(page, d, b, t, c), lv))
                bad++;
    for (uint32_t t = 16; t < 18; t++)
        for (uint32_t c = 0; c < 16; c++)
            if (!within(v[t * d + c], vo[t * d + c], ref_v(page, d, b, t, c), lv))
                bad++;
    CHECK_EQ(bad, 0);
    CHECK_EQ(ref_k(page, d, b, 20, 0).q, lv); /* outlier: top code */
    CHECK_EQ(ref_v(page, d, b, 16, 3).q, 0);  /* negative outlier: code 0 */
    CHECK(fabsf(ko[20 * d] - 1000.0f) <= ref_k(page, d, b, 20, 0).s / 2);
out:
    free(k);
    free(v);
    free(ko);
    free(vo);
    free(page);
}

/* ---- store ------------------------------------------------------------------ */

static void test_store(uint32_t b, uint32_t d, uint32_t page_bytes)
{
    const kv_format_traits_t *f = fmt_of(b);
    kv_page_geom_t g = {.head_dim = d, .page_bytes = page_bytes};
    kv_fmt_int_layout_t l = kv_fmt_int_layout(d, b);
    uint32_t tpp = f->tokens_per_page(&g);
    size_t stride = d + 5, n = (size_t)tpp * stride;
    uint64_t s = 4242 + d + b;
    float *k = malloc(sizeof(float) * n), *v = malloc(sizeof(float) * n);
    kv_half_t *kh = malloc(sizeof(kv_half_t) * n);
    kv_half_t *vh = malloc(sizeof(kv_half_t) * n);
    float *kc = malloc(sizeof(float) * tpp * d), *vc = malloc(sizeof(float) * tpp * d);
    uint8_t *p1 = malloc(page_bytes), *p2 = malloc(page_bytes);
    uint8_t *p3 = malloc(page_bytes);
    if (!k || !v || !kh || !vh || !kc || !vc || !p1 || !p2 || !p3 || tpp < 32) {
        CHECK(0);
        goto out;
    }
    /* FP16-representable values; padding columns hold garbage */
    fill_groups(k, v, tpp, d, stride, &s);
    for (size_t i = 0; i < n; i++) {
        kh[i] = kv_half_from_float(k[i]);
        vh[i] = kv_half_from_float(v[i]);
        k[i] = kv_half_to_float(kh[i]);
        v[i] = kv_half_to_float(vh[i]);
    }
    memset(p1, 0x11, page_bytes);
    memset(p2, 0x22, page_bytes);
    f->store(p1, &g, 0, tpp, KV_DTYPE_F32, k, v, stride);
    f->store(p2, &g, 0, tpp, KV_DTYPE_F16, kh, vh, stride);
    size_t used = (size_t)(tpp / 16) * l.group_bytes;
    CHECK(memcmp(p1, p2, used) == 0);
    /* contiguous rows (stride == d) give the same page */
    for (uint32_t t = 0; t < tpp; t++) {
        memcpy(kc + (size_t)t * d, k + t * stride, d * sizeof(float));
        memcpy(vc + (size_t)t * d, v + t * stride, d * sizeof(float));
    }
    memset(p3, 0x33, page_bytes);
    f->store(p3, &g, 0, tpp, KV_DTYPE_F32, kc, vc, d);
    CHECK(memcmp(p1, p3, used) == 0);
    /* bytes past the last group untouched */
    long bad = 0;
    for (size_t i = used; i < page_bytes; i++)
        bad += p1[i] != 0x11;
    CHECK_EQ(bad, 0);

    /* a store of group 1 only writes group 1 (same bytes as the full
     * store), K only / V only write only their half */
    memset(p3, 0x5a, page_bytes);
    f->store(p3, &g, 16, 16, KV_DTYPE_F32, k + 16 * stride, v + 16 * stride,
             stride);
    bad = 0;
    for (size_t i = 0; i < page_bytes; i++) {
        int in1 = i >= l.group_bytes && i < 2 * (size_t)l.group_bytes;
        if (in1 ? p3[i] != p1[i] : p3[i] != 0x5a)
            bad++;
    }
    CHECK_EQ(bad, 0);
    memset(p3, 0x5a, page_bytes);
    f->store(p3, &g, 0, 16, KV_DTYPE_F16, kh, NULL, stride);
    bad = 0;
    for (size_t i = 0; i < l.group_bytes; i++) {
        int k_byte = i < l.v_codes || (i >= l.k_scale && i < l.v_scale);
        if (k_byte ? p3[i] != p1[i] : p3[i] != 0x5a)
            bad++;
    }
    CHECK_EQ(bad, 0);
out:
    free(k);
    free(v);
    free(kh);
    free(vh);
    free(kc);
    free(vc);
    free(p1);
    free(p2);
    free(p3);
}

/* A misaligned store (t0 or n not a multiple of 16) is a precondition
 * violation: it asserts, or in NDEBUG builds returns without writing. */
static void test_store_misaligned(uint32_t b)
{
    const kv_format_traits_t *f = fmt_of(b);
    kv_page_geom_t g = {.head_dim = 64, .page_bytes = 12288};
    static float k[64 * 64], v[64 * 64];
    static uint8_t page[12288], before[12288];
    const uint32_t cases[][2] = {{8, 16}, {0, 8}, {16, 17}, {3, 1}};
    uint64_t s = 5;
    for (size_t i = 0; i < 64 * 64; i++)
        k[i] = v[i] = kv_test_randf(&s);
    memset(page, 0x6b, sizeof page);
    memcpy(before, page, sizeof page);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
#ifdef NDEBUG
        f->store(page, &g, cases[i][0], cases[i][1], KV_DTYPE_F32, k, v, 64);
        CHECK(memcmp(page, before, sizeof page) == 0);
#else
        fflush(NULL);
        pid_t pid = fork();
        CHECK(pid >= 0);
        if (pid == 0) {
            int fd = open("/dev/null", O_WRONLY);
            if (fd >= 0)
                dup2(fd, 2); /* the assertion message is expected */
            f->store(page, &g, cases[i][0], cases[i][1], KV_DTYPE_F32, k, v,
                     64);
            _exit(0); /* not reached when the store asserts */
        }
        int st = 0;
        if (pid > 0) {
            CHECK(waitpid(pid, &st, 0) == pid);
            CHECK(WIFSIGNALED(st) && WTERMSIG(st) == SIGABRT);
        }
#endif
    }
    /* an aligned store at the page's last group is accepted */
    f->store(page, &g, f->tokens_per_page(&g) - 16, 16, KV_DTYPE_F32, k, v, 64);
    CHECK(memcmp(page, before, sizeof page) != 0);
}

int main(void)
{
    test_dequant_fused();
    test_entries();
    test_geometry();
    for (uint32_t b = 2; b <= 4; b += 2) {
        test_packing(b, 16);
        test_packing(b, 64);
        test_packing(b, 128);
        test_random(b, 64, 4096, 1 + b);
        test_random(b, 64, 12288, 2 + b);
        test_random(b, 128, 8192, 3 + b);
        test_random(b, 128, 24576, 4 + b);
        test_random(b, 64, 5000, 5 + b); /* unused tail bytes */
        test_random(b, 1024, 2 * 2 * 1024 * (2 * b + 4), 6 + b);
        test_special(b, 64);
        test_special(b, 128);
        test_store(b, 64, 4096 * 3);
        test_store(b, 128, 8192 * 3);
        test_store_misaligned(b);
    }
    return kv_test_end();
}
