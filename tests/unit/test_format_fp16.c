/* SPDX-License-Identifier: MIT */
/*
 * test_format_fp16.c — the FP16 page format and the traits table.
 *
 * Checks: kv_format_get gives the FP16 entry (same functions as kv_fmt_fp16),
 * NULL for unknown formats and for table entries not filled in yet;
 * geometry (tokens per page, 0 when a page cannot hold one token); the byte
 * layout matches kv_fmt_fp16.h (K rows at offset 0, V rows at 2*T*D); store/load
 * of FP32 rows round-trips within FP16 rounding (and equals
 * kv_half_from_float exactly), FP16 rows bit-exactly, both with a source
 * stride larger than head_dim; loads of sub-ranges and of K or V alone;
 * store writes only its own rows; copy between pages and in-place
 * overlapping copy (d0 < s0) as memmove would.
 */
#include <string.h>

#include "kv_test.h"
#include "formats/kv_fmt_fp16.h"

static void test_table(void)
{
    const kv_format_traits_t *t = kv_format_get(KV_FMT_FP16);
    CHECK(t != NULL);
    if (!t)
        return;
    CHECK(t == &kv_format_table[KV_FMT_FP16]);
    CHECK(strcmp(t->name, "fp16") == 0);
    CHECK(strcmp(t->name, kv_fmt_fp16.name) == 0);
    CHECK(t->bits_note != NULL);
    CHECK(t->tokens_per_page == kv_fmt_fp16.tokens_per_page);
    CHECK(t->load == kv_fmt_fp16.load);
    CHECK(t->store == kv_fmt_fp16.store);
    CHECK(t->copy == kv_fmt_fp16.copy);
    /* other formats: an entry is reachable iff it is filled in (formats
     * slot in over time), and a filled entry has its functions */
    for (uint32_t f = 0; f < KV_FMT_COUNT; f++) {
        const kv_format_traits_t *e = kv_format_get(f);
        CHECK((e == NULL) == (kv_format_table[f].name == NULL));
        if (e)
            CHECK(e->tokens_per_page && e->load && e->bits_note);
    }
    CHECK(kv_format_get(KV_FMT_COUNT) == NULL);
    CHECK(kv_format_get(0xffffffffu) == NULL);
}

static void test_geometry(void)
{
    const kv_format_traits_t *t = &kv_fmt_fp16;
    kv_page_geom_t g = {.head_dim = 64, .page_bytes = 4096};
    CHECK_EQ(t->tokens_per_page(&g), 16);
    g = (kv_page_geom_t){.head_dim = 128, .page_bytes = 8192};
    CHECK_EQ(t->tokens_per_page(&g), 16);
    g = (kv_page_geom_t){.head_dim = 64, .page_bytes = 4096 + 255};
    CHECK_EQ(t->tokens_per_page(&g), 16);
    g = (kv_page_geom_t){.head_dim = 64, .page_bytes = 4096 + 256};
    CHECK_EQ(t->tokens_per_page(&g), 17);
    g = (kv_page_geom_t){.head_dim = 64, .page_bytes = 255};
    CHECK_EQ(t->tokens_per_page(&g), 0);
    g = (kv_page_geom_t){.head_dim = 64, .page_bytes = 256};
    CHECK_EQ(t->tokens_per_page(&g), 1);
    g = (kv_page_geom_t){.head_dim = 0, .page_bytes = 4096};
    CHECK_EQ(t->tokens_per_page(&g), 0);
    g = (kv_page_geom_t){.head_dim = 1024, .page_bytes = 0xffffffc0u};
    CHECK_EQ(t->tokens_per_page(&g), 0xffffffc0u / 4096u);
}

/* Fill a [n][stride] FP32 source with random values (padding = garbage). */
static void fill(float *x, size_t n, uint64_t *s)
{
    for (size_t i = 0; i < n; i++)
        x[i] = kv_test_randf(s) * 8.0f;
}

static void test_store_load(uint32_t d, uint32_t page_bytes)
{
    const kv_format_traits_t *t = &kv_fmt_fp16;
    kv_page_geom_t g = {.head_dim = d, .page_bytes = page_bytes};
    uint32_t tpp = t->tokens_per_page(&g);
    size_t stride = d + 5;
    uint64_t s = 1234 + d;
    uint8_t *page = calloc(page_bytes, 1);
    float *k = malloc(sizeof(float) * tpp * stride);
    float *v = malloc(sizeof(float) * tpp * stride);
    float *ko = malloc(sizeof(float) * tpp * d);
    float *vo = malloc(sizeof(float) * tpp * d);
    kv_half_t *kh = malloc(sizeof(kv_half_t) * tpp * stride);
    kv_half_t *vh = malloc(sizeof(kv_half_t) * tpp * stride);
    if (!page || !k || !v || !ko || !vo || !kh || !vh) {
        CHECK(0);
        goto out;
    }
    memset(page, 0x5a, page_bytes);
    fill(k, (size_t)tpp * stride, &s);
    fill(v, (size_t)tpp * stride, &s);

    /* FP32 rows a..tpp-1 with a stride, then rows 0..a-1 */
    uint32_t a = tpp / 2, n = tpp - a;
    t->store(page, &g, a, n, KV_DTYPE_F32, k + a * stride, v + a * stride,
             stride);
    /* rows 0..a-1 untouched so far (when a > 0) */
    if (a > 0)
        CHECK_EQ(((uint16_t *)page)[0], 0x5a5a);
    t->store(page, &g, 0, a, KV_DTYPE_F32, k, v, stride);
    /* bytes past 4*T*D untouched */
    for (size_t i = 4u * tpp * d; i < page_bytes; i++)
        CHECK_EQ(page[i], 0x5a);

    /* layout: K row r at r*d halfs, V row r at (tpp + r)*d halfs */
    long bad = 0;
    const kv_half_t *ph = (const kv_half_t *)page;
    for (uint32_t r = 0; r < tpp; r++)
        for (uint32_t j = 0; j < d; j++) {
            if (ph[(size_t)r * d + j] != kv_half_from_float(k[r * stride + j]))
                bad++;
            if (ph[((size_t)tpp + r) * d + j] !=
                kv_half_from_float(v[r * stride + j]))
                bad++;
            if (kv_fp16_k(page, &g, tpp, r) != ph + (size_t)r * d ||
                kv_fp16_v(page, &g, tpp, r) != ph + ((size_t)tpp + r) * d)
                bad++;
        }
    CHECK_EQ(bad, 0);

    /* full load: within half rounding of the source */
    t->load(page, &g, 0, tpp, ko, vo);
    bad = 0;
    for (uint32_t r = 0; r < tpp; r++)
        for (uint32_t j = 0; j < d; j++) {
            float x = k[r * stride + j], y = v[r * stride + j];
            if (fabsf(ko[r * d + j] - x) > fabsf(x) * 0x1p-11f + 0x1p-24f)
                bad++;
            if (fabsf(vo[r * d + j] - y) > fabsf(y) * 0x1p-11f + 0x1p-24f)
                bad++;
        }
    CHECK_EQ(bad, 0);

    /* sub-range load, K only and V only */
    if (tpp >= 4) {
        memset(ko, 0, sizeof(float) * tpp * d);
        memset(vo, 0, sizeof(float) * tpp * d);
        t->load(page, &g, 1, 2, ko, NULL);
        t->load(page, &g, 3, 1, NULL, vo);
        bad = 0;
        for (uint32_t j = 0; j < d; j++) {
            if (ko[j] != kv_half_to_float(ph[1 * d + j]) ||
                ko[d + j] != kv_half_to_float(ph[2 * d + j]) ||
                vo[j] != kv_half_to_float(ph[((size_t)tpp + 3) * d + j]))
                bad++;
            if (ko[2 * d + j] != 0.0f || vo[d + j] != 0.0f)
                bad++;
        }
        CHECK_EQ(bad, 0);
    }

    /* FP16 rows with a stride: bit exact */
    for (size_t i = 0; i < (size_t)tpp * stride; i++) {
        kh[i] = (kv_half_t)(kv_test_rand(&s) & 0x7bff); /* finite */
        vh[i] = (kv_half_t)((kv_test_rand(&s) & 0x7bff) | 0x8000);
    }
    t->store(page, &g, 0, tpp, KV_DTYPE_F16, kh, vh, stride);
    bad = 0;
    for (uint32_t r = 0; r < tpp; r++)
        for (uint32_t j = 0; j < d; j++)
            if (ph[(size_t)r * d + j] != kh[r * stride + j] ||
                ph[((size_t)tpp + r) * d + j] != vh[r * stride + j])
                bad++;
    CHECK_EQ(bad, 0);
    /* contiguous FP16 (stride == d) */
    {
        /* rows 0..tpp-1 from contiguous rows starting at source row tpp-1 of
         * the strided buffer (reads tpp*d <= its tpp*stride elements) */
        const kv_half_t *k0 = kh + (tpp - 1), *v0 = vh + (tpp - 1);
        t->store(page, &g, 0, tpp, KV_DTYPE_F16, k0, v0, d);
        CHECK(memcmp(ph, k0, (size_t)tpp * d * 2) == 0);
        CHECK(memcmp(ph + (size_t)tpp * d, v0, (size_t)tpp * d * 2) == 0);
    }

out:
    free(page);
    free(k);
    free(v);
    free(ko);
    free(vo);
    free(kh);
    free(vh);
}

static void test_copy(void)
{
    const kv_format_traits_t *t = &kv_fmt_fp16;
    kv_page_geom_t g = {.head_dim = 64, .page_bytes = 4096};
    uint32_t tpp = t->tokens_per_page(&g), d = 64;
    size_t nh = (size_t)2 * tpp * d;
    kv_half_t a[16 * 64 * 2], b[16 * 64 * 2], want[16 * 64 * 2];
    uint64_t s = 99;
    for (size_t i = 0; i < nh; i++) {
        a[i] = (kv_half_t)kv_test_rand(&s);
        b[i] = (kv_half_t)kv_test_rand(&s);
    }
    /* between pages: b[3..8) = a[10..15) */
    memcpy(want, b, sizeof b);
    memcpy(want + 3 * d, a + 10 * d, 5 * d * 2);
    memcpy(want + (tpp + 3) * d, a + (tpp + 10) * d, 5 * d * 2);
    t->copy(b, 3, a, 10, 5, &g);
    CHECK(memcmp(b, want, sizeof b) == 0);

    /* in place, overlapping: a[1..11) = a[4..14) */
    memcpy(want, a, sizeof a);
    memmove(want + 1 * d, want + 4 * d, 10 * d * 2);
    memmove(want + (tpp + 1) * d, want + (tpp + 4) * d, 10 * d * 2);
    t->copy(a, 1, a, 4, 10, &g);
    CHECK(memcmp(a, want, sizeof a) == 0);

    /* in place, d0 == s0: no change */
    t->copy(a, 2, a, 2, 7, &g);
    CHECK(memcmp(a, want, sizeof a) == 0);
    /* n == 0: no change */
    memcpy(want, b, sizeof b);
    t->copy(b, 0, a, 0, 0, &g);
    CHECK(memcmp(b, want, sizeof b) == 0);
}

int main(void)
{
    test_table();
    test_geometry();
    test_store_load(64, 4096);
    test_store_load(128, 8192);
    test_store_load(16, 64 * 16 + 64); /* 17 tokens, unused tail bytes */
    test_store_load(64, 256);          /* 1 token per page */
    test_copy();
    return kv_test_end();
}
