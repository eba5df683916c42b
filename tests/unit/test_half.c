/* SPDX-License-Identifier: MIT */
/*
 * test_half.c — binary16 <-> binary32 conversion (formats/kv_half.c).
 *
 * Checks: every one of the 65536 halfs converts to the float a reference
 * decoder (ldexp of the fields, computed independently here) gives and back
 * to itself (NaNs stay NaN with sign kept); float -> half against a reference
 * rounder in double (nearest, ties to even) on ties, subnormals, overflow and
 * random floats; the bulk (possibly F16C) versions equal the scalar ones bit
 * for bit on random and edge inputs of lengths that are not multiples of 8.
 */
#include <string.h>

#include "kv_test.h"
#include "formats/kv_half.h"

static uint32_t bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}
static float from_bits(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* Reference decode from the field definitions. */
static double ref_half_value(uint16_t h)
{
    int s = h >> 15, e = (h >> 10) & 31, m = h & 1023;
    double v = e == 0 ? ldexp(m, -24) : ldexp(1024 + m, e - 25);
    return s ? -v : v;
}

/* Reference encode of a finite float by exhaustive rounding in double:
 * candidates are representable halfs; pick nearest, ties to even mantissa. */
static uint16_t ref_half_from(float f)
{
    double x = fabs((double)f);
    uint16_t sign = signbit(f) ? 0x8000 : 0;
    if (x >= 65520.0) /* halfway between 65504 and 65536 rounds to Inf */
        return sign | 0x7c00;
    /* binary search the largest half magnitude <= x */
    int lo = 0, hi = 0x7bff;
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (ref_half_value((uint16_t)mid) <= x)
            lo = mid;
        else
            hi = mid - 1;
    }
    double a = ref_half_value((uint16_t)lo);
    if (a == x)
        return sign | (uint16_t)lo;
    double b = ref_half_value((uint16_t)(lo + 1));
    double da = x - a, db = b - x;
    int pick = da < db ? lo : db < da ? lo + 1 : ((lo & 1) ? lo + 1 : lo);
    return sign | (uint16_t)pick;
}

static void test_exhaustive_half(void)
{
    long bad_val = 0, bad_rt = 0, bad_nan = 0;
    for (uint32_t i = 0; i < 65536; i++) {
        uint16_t h = (uint16_t)i;
        float f = kv_half_to_float(h);
        int is_nan = ((h >> 10) & 31) == 31 && (h & 1023);
        if (is_nan) {
            uint16_t back = kv_half_from_float(f);
            if (!isnan(f) || !(((back >> 10) & 31) == 31 && (back & 1023)) ||
                (back & 0x8000) != (h & 0x8000))
                bad_nan++;
            continue;
        }
        int is_inf = ((h >> 10) & 31) == 31;
        double want = is_inf ? ((h & 0x8000) ? -INFINITY : INFINITY)
                             : ref_half_value(h);
        if ((double)f != want || !!signbit(f) != !!signbit(want))
            bad_val++;
        if (kv_half_from_float(f) != h)
            bad_rt++;
    }
    CHECK_EQ(bad_val, 0);
    CHECK_EQ(bad_rt, 0);
    CHECK_EQ(bad_nan, 0);
}

static void test_rounding(void)
{
    /* 1 + 2^-11 is halfway between 1 and 1+2^-10: ties to even -> 1. */
    CHECK_EQ(kv_half_from_float(1.0f + 0x1p-11f), 0x3c00);
    /* 1 + 3*2^-11 halfway between 1+2^-10 (odd) and 1+2^-9: -> even up. */
    CHECK_EQ(kv_half_from_float(1.0f + 3 * 0x1p-11f), 0x3c02);
    /* just above halfway rounds up */
    CHECK_EQ(kv_half_from_float(1.0f + 0x1p-11f + 0x1p-20f), 0x3c01);
    /* overflow */
    CHECK_EQ(kv_half_from_float(65504.0f), 0x7bff);
    CHECK_EQ(kv_half_from_float(65519.0f), 0x7bff);
    CHECK_EQ(kv_half_from_float(65520.0f), 0x7c00);
    CHECK_EQ(kv_half_from_float(-1e10f), 0xfc00);
    CHECK_EQ(kv_half_from_float(INFINITY), 0x7c00);
    CHECK_EQ(kv_half_from_float(-INFINITY), 0xfc00);
    CHECK(isnan(kv_half_to_float(kv_half_from_float(NAN))));
    /* subnormals: smallest is 2^-24; half of it ties to 0 (even), more
     * than half rounds up, 1.5 * 2^-24 ties to 2 * 2^-24 */
    CHECK_EQ(kv_half_from_float(0x1p-24f), 0x0001);
    CHECK_EQ(kv_half_from_float(0x1p-25f), 0x0000);
    CHECK_EQ(kv_half_from_float(0x1.0001p-25f), 0x0001);
    CHECK_EQ(kv_half_from_float(0x1.8p-24f), 0x0002);
    CHECK_EQ(kv_half_from_float(-0x1p-26f), 0x8000);
    CHECK_EQ(kv_half_from_float(-0.0f), 0x8000);
    /* largest subnormal rounding into the smallest normal */
    CHECK_EQ(kv_half_from_float(0x1.ff8p-15f), 0x03ff);
    CHECK_EQ(kv_half_from_float(0x1.ffap-15f), 0x03ff);
    CHECK_EQ(kv_half_from_float(0x1.ffcp-15f), 0x0400);
    CHECK_EQ(kv_half_from_float(0x1p-14f), 0x0400);
    /* float subnormal input -> 0 */
    CHECK_EQ(kv_half_from_float(from_bits(0x00000001u)), 0x0000);

    /* every float exactly halfway between adjacent halfs, and 1 ulp around */
    long bad = 0;
    for (uint32_t h = 0; h < 0x7bff; h++) {
        double a = ref_half_value((uint16_t)h);
        double b = ref_half_value((uint16_t)(h + 1));
        float mid = (float)((a + b) / 2); /* exact in float */
        uint16_t want = (h & 1) ? (uint16_t)(h + 1) : (uint16_t)h;
        if (kv_half_from_float(mid) != want)
            bad++;
        if (kv_half_from_float(-mid) != (want | 0x8000))
            bad++;
        float up = from_bits(bits(mid) + 1), dn = from_bits(bits(mid) - 1);
        if (kv_half_from_float(up) != h + 1 || kv_half_from_float(dn) != h)
            bad++;
    }
    CHECK_EQ(bad, 0);
}

static void test_random_floats(void)
{
    uint64_t s = 42;
    long bad = 0;
    for (int i = 0; i < 400000; i++) {
        /* random bit patterns over the half-relevant exponent range */
        uint32_t u = (uint32_t)kv_test_rand(&s);
        uint32_t e = 100 + (u % 45); /* 2^-27 .. 2^17 */
        u = (u & 0x807fffffu) | (e << 23);
        float f = from_bits(u);
        if (kv_half_from_float(f) != ref_half_from(f))
            bad++;
    }
    CHECK_EQ(bad, 0);
}

static void test_bulk(void)
{
    enum { N = 4099 };
    static float f[N], fs[N], fb[N + 1];
    static uint16_t h[N], hs[N], hb[N + 1];
    uint64_t s = 7;
    const float edge[] = {0.0f, -0.0f, 1.0f, 65504.0f, 65520.0f, -65520.0f,
                          0x1p-24f, 0x1p-25f, 0x1.8p-24f, 0x1.ffep-15f,
                          INFINITY, -INFINITY, NAN, 1.0f + 0x1p-11f,
                          from_bits(0x7fa00001u) /* signalling NaN */};
    size_t ne = sizeof edge / sizeof edge[0];
    for (size_t i = 0; i < N; i++) {
        if (i < ne) {
            f[i] = edge[i];
        } else {
            uint32_t u = (uint32_t)kv_test_rand(&s);
            f[i] = (i % 3) ? kv_test_randf(&s) * 70000.0f : from_bits(u);
        }
        h[i] = (uint16_t)kv_test_rand(&s);
    }
    const size_t lens[] = {0, 1, 7, 8, 9, 15, 17, 64, 1001, N};
    for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++) {
        size_t n = lens[li];
        long bad_h = 0, bad_f = 0;
        memset(hb, 0xab, sizeof hb);
        memset(fb, 0xab, sizeof fb);
        kv_half_from_float_n(f, hb, n);
        kv_half_to_float_n(h, fb, n);
        for (size_t i = 0; i < n; i++) {
            hs[i] = kv_half_from_float(f[i]);
            fs[i] = kv_half_to_float(h[i]);
            if (hs[i] != hb[i])
                bad_h++;
            if (bits(fs[i]) != bits(fb[i]))
                bad_f++;
        }
        CHECK_EQ(bad_h, 0);
        CHECK_EQ(bad_f, 0);
        /* nothing past n written */
        CHECK_EQ(hb[n], 0xabab);
        CHECK_EQ(bits(fb[n]), 0xababababu);
    }
    /* all 65536 halfs through the bulk path */
    static uint16_t all[65536], back[65536];
    static float allf[65536];
    for (uint32_t i = 0; i < 65536; i++)
        all[i] = (uint16_t)i;
    kv_half_to_float_n(all, allf, 65536);
    kv_half_from_float_n(allf, back, 65536);
    long bad = 0;
    for (uint32_t i = 0; i < 65536; i++) {
        if (bits(allf[i]) != bits(kv_half_to_float(all[i])))
            bad++;
        if (back[i] != kv_half_from_float(allf[i]))
            bad++;
    }
    CHECK_EQ(bad, 0);
}

int main(void)
{
    test_exhaustive_half();
    test_rounding();
    test_random_floats();
    test_bulk();
    return kv_test_end();
}
