/* SPDX-License-Identifier: MIT */
/*
 * test_policy_methods.c — each method on synthetic prompts with known
 * answers (tests/unit/test_policy_env.h plants "hot" keys every query
 * attends to): H2O, MiniKV and SnapKV keep the planted heavy hitter; SnapKV
 * keeps exactly the pooled neighbourhood (kernel 7) of it; MiniKV stores its
 * kept tokens INT2, freezes them while decoding, and its pyramid gives each
 * layer 2h - h/p .. h/p (mean h); StreamingLLM keeps sinks + the recent
 * window at every step; SimLayerKV trims a synthetic lazy layer (attention
 * on the sinks) and not a busy one, in both modes, and not when the list is
 * <= sink + w; CaM with the mask forced to 1 adds V_e/m to the m oldest
 * window tokens and with a fixed seed is reproducible; MiniCache merges the
 * pairs from L/2 on (and new decode tokens every 16); KIVI converts.
 */
#include <string.h>

#include "store/kv_policy_int.h"
#include "pages/kv_page.h"
#include "test_policy_env.h"

static uint32_t count_fmt(const pe_t *e, kv_seq_id_t seq, uint32_t l, uint32_t fmt)
{
    uint32_t n = 0;
    for (uint32_t h = 0; h < e->H; h++) {
        const kv_page_list_t *li = kv_page_list_get(e->s->pt, seq, l, h);
        for (uint32_t i = 0; i < li->n_ents; i++)
            n += li->ents[i].format == fmt;
    }
    return n;
}

static void test_h2o(void)
{
    pe_t e;
    CHECK_OK(pe_open(&e, 2, 2, 3, 0, 256));
    e.hot[0][0] = 37, e.hot[1][0] = 53;
    kv_seq_id_t s;
    CHECK_OK(pe_seq(&e, "h2o:hh=4,rw=8", &s));
    CHECK_OK(pe_prefill(&e, s, 100));
    CHECK_EQ(pe_len(&e, s, 0, 0), 100); /* nothing before prefill end */
    CHECK_OK(kv_seq_prefill_end(e.s, s));
    for (int step = 0; step <= 5; step++) {
        for (uint32_t l = 0; l < 2; l++)
            for (uint32_t h = 0; h < 2; h++) {
                CHECK_EQ(pe_len(&e, s, l, h), 12);
                CHECK(pe_has(&e, s, l, h, l ? 53 : 37));
                CHECK(!pe_has(&e, s, l, h, l ? 37 : 53));
                for (int32_t p = 0; p < 8; p++) /* the recent window */
                    CHECK(pe_has(&e, s, l, h, 99 + step - p));
            }
        if (step < 5)
            CHECK_OK(pe_step(&e, s, 100 + step));
    }
    CHECK_OK(kv_store_check(e.s));
    kv_store_destroy(e.s);
}

static void test_minikv(void)
{
    pe_t e;
    CHECK_OK(pe_open(&e, 2, 1, 2, 16, 256));
    e.hot[0][0] = 21, e.hot[1][0] = 90;
    kv_seq_id_t s;
    CHECK_OK(pe_seq(&e, "minikv:hh=0.1,rw=0.1", &s));
    CHECK_OK(pe_prefill(&e, s, 160));
    CHECK_OK(kv_seq_prefill_end(e.s, s));
    for (uint32_t l = 0; l < 2; l++) {
        CHECK_EQ(pe_len(&e, s, l, 0), 32);
        CHECK(pe_has(&e, s, l, 0, l ? 90 : 21));
        CHECK(count_fmt(&e, s, l, KV_FMT_INT2) > 0);
        CHECK_EQ(count_fmt(&e, s, l, KV_FMT_FP16), 0); /* 32 % 16 = 0 left FP16 */
    }
    for (int i = 0; i < 3; i++)
        CHECK_OK(pe_step(&e, s, 160 + i));
    CHECK_EQ(pe_len(&e, s, 0, 0), 35); /* frozen: nothing evicted */
    CHECK(pe_has(&e, s, 0, 0, 21));
    kv_store_destroy(e.s);

    /* Pyramid: layer l keeps round(pyramid(h)) + rw. */
    CHECK_OK(pe_open(&e, 4, 1, 2, 0, 512));
    CHECK_OK(pe_seq(&e, "minikv:hh=0.2,rw=0.1,pyramid=7", &s));
    CHECK_OK(pe_prefill(&e, s, 200));
    CHECK_OK(kv_seq_prefill_end(e.s, s));
    uint32_t sum = 0;
    for (uint32_t l = 0; l < 4; l++) {
        uint32_t n = pe_len(&e, s, l, 0);
        CHECK_EQ(n, kv_pol_pyramid(40, 7, l, 4) + 20);
        sum += n - 20;
        if (l)
            CHECK(n < pe_len(&e, s, l - 1, 0));
    }
    CHECK_EQ(pe_len(&e, s, 0, 0), 74 + 20); /* 2h - h/7 = 74.3 */
    CHECK_EQ(pe_len(&e, s, 3, 0), 6 + 20);  /* h/7 = 5.7 */
    CHECK(sum >= 4 * 40 - 2 && sum <= 4 * 40 + 2);
    kv_store_destroy(e.s);
}

static void test_snapkv(void)
{
    pe_t e;
    CHECK_OK(pe_open(&e, 1, 2, 2, 0, 256));
    e.hot[0][0] = 40;
    kv_seq_id_t s;
    CHECK_OK(pe_seq(&e, "snapkv:w=8,k=7,c=15", &s));
    CHECK_OK(pe_prefill(&e, s, 100));
    CHECK_OK(kv_seq_prefill_end(e.s, s));
    for (uint32_t h = 0; h < 2; h++) {
        CHECK_EQ(pe_len(&e, s, 0, h), 15);
        for (int32_t p = 37; p <= 43; p++) /* the pooled neighbourhood */
            CHECK(pe_has(&e, s, 0, h, p));
        for (int32_t p = 92; p < 100; p++)
            CHECK(pe_has(&e, s, 0, h, p));
    }
    CHECK_OK(pe_step(&e, s, 100)); /* prompt-only: decode keeps everything */
    CHECK_EQ(pe_len(&e, s, 0, 0), 16);
    kv_store_destroy(e.s);
}

static void test_streaming(void)
{
    pe_t e;
    CHECK_OK(pe_open(&e, 2, 1, 1, 0, 256));
    kv_seq_id_t s;
    CHECK_OK(pe_seq(&e, "streamingllm:sink=4,recent=10", &s));
    CHECK_OK(pe_prefill(&e, s, 50));
    CHECK_OK(kv_seq_prefill_end(e.s, s));
    for (int step = 0; step < 3; step++) {
        CHECK_EQ(pe_len(&e, s, 1, 0), 14);
        for (int32_t p = 0; p < 4; p++)
            CHECK(pe_has(&e, s, 1, 0, p));
        for (int32_t p = 40 + step; p < 50 + step; p++)
            CHECK(pe_has(&e, s, 1, 0, p));
        CHECK(!pe_has(&e, s, 1, 0, 39 + step));
        CHECK_OK(pe_step(&e, s, 50 + step));
    }
    kv_store_destroy(e.s);
}

static void test_simlayerkv(const char *spec, int steps)
{
    pe_t e;
    CHECK_OK(pe_open(&e, 2, 2, 2, 0, 256));
    for (int i = 0; i < 4; i++)
        e.hot[0][i] = i; /* layer 0 looks at its sinks: lazy */
    e.hot[1][0] = 50;    /* layer 1 looks at the middle: busy */
    kv_seq_id_t s, short_s;
    CHECK_OK(pe_seq(&e, spec, &s));
    CHECK_OK(pe_prefill(&e, s, 100));
    CHECK_OK(kv_seq_prefill_end(e.s, s));
    for (int i = 0; i < steps; i++)
        CHECK_OK(pe_step(&e, s, 100 + i));
    uint32_t n0 = pe_len(&e, s, 0, 0), n1 = pe_len(&e, s, 1, 1);
    CHECK_EQ(n0, 12);
    CHECK_EQ(n1, 100 + (uint32_t)steps);
    CHECK(pe_has(&e, s, 0, 1, 0) && pe_has(&e, s, 0, 1, 3));
    CHECK_OK(pe_step(&e, s, 100 + steps)); /* lazy stays trimmed */
    CHECK_EQ(pe_len(&e, s, 0, 0), 12);
    CHECK_EQ(pe_len(&e, s, 1, 0), 101 + (uint32_t)steps);
    /* Length <= sink + w: no trim. */
    CHECK_OK(pe_seq(&e, spec, &short_s));
    CHECK_OK(pe_prefill(&e, short_s, 10));
    CHECK_OK(kv_seq_prefill_end(e.s, short_s));
    CHECK_OK(pe_step(&e, short_s, 10));
    CHECK_EQ(pe_len(&e, short_s, 0, 0), 11);
    CHECK_OK(kv_store_check(e.s));
    kv_store_destroy(e.s);
}

static void read_v(const pe_t *e, kv_seq_id_t s, uint32_t l, uint32_t h, uint32_t n, float *v)
{
    CHECK_OK(kv_read(e->s, s, l, h, 0, n, NULL, v, NULL));
}

static void test_cam(void)
{
    pe_t e;
    CHECK_OK(pe_open(&e, 1, 2, 1, 0, 256));
    kv_policy_t *p;
    CHECK_OK(kv_policy_parse("streamingllm:sink=2,recent=6+cam:m=3", &p, NULL, 0));
    kv_pol_test_cam_force(p, 1);
    kv_seq_id_t s;
    CHECK_OK(kv_seq_create(e.s, &s));
    CHECK_OK(kv_seq_set_policy(e.s, s, p));
    kv_policy_destroy(p);
    CHECK_OK(pe_prefill(&e, s, 8));
    CHECK_OK(kv_seq_prefill_end(e.s, s)); /* 8 = sink + recent: nothing evicted */
    float before[2][9 * PE_D], after[2][8 * PE_D];
    CHECK_OK(pe_step(&e, s, 8)); /* evicts index 2 into old 3, 4, 5 */
    /* Reference values: the token values as appended (FP16-rounded). */
    float k[2 * PE_D], v[2 * PE_D];
    for (int32_t t = 0; t < 9; t++) {
        pe_token(&e, 0, t, k, v);
        for (uint32_t h = 0; h < 2; h++)
            for (uint32_t d = 0; d < PE_D; d++)
                before[h][t * PE_D + d] = v[h * PE_D + d];
    }
    int32_t want_pos[8] = {0, 1, 3, 4, 5, 6, 7, 8};
    for (uint32_t h = 0; h < 2; h++) {
        CHECK_EQ(pe_len(&e, s, 0, h), 8);
        read_v(&e, s, 0, h, 8, after[h]);
        int32_t pos[8];
        CHECK_OK(kv_read(e.s, s, 0, h, 0, 8, NULL, NULL, pos));
        double err = 0;
        for (uint32_t i = 0; i < 8; i++) {
            CHECK_EQ(pos[i], want_pos[i]);
            for (uint32_t d = 0; d < PE_D; d++) {
                float want = before[h][want_pos[i] * PE_D + d];
                if (i >= 2 && i < 5)
                    want += before[h][2 * PE_D + d] / 3.0f;
                double de = fabs(after[h][i * PE_D + d] - want);
                err = de > err ? de : err;
            }
        }
        CHECK(err < 2e-3);
    }
    kv_store_destroy(e.s);

    /* Prefill end, mask forced: evicted 2..5 merge in order into the next 2
     * tokens each, values travelling on; the window 6..9 keeps the result. */
    CHECK_OK(pe_open(&e, 1, 1, 1, 0, 256));
    CHECK_OK(kv_policy_parse("streamingllm:sink=2,recent=4+cam:m=2", &p, NULL, 0));
    kv_pol_test_cam_force(p, 1);
    CHECK_OK(kv_seq_create(e.s, &s));
    CHECK_OK(kv_seq_set_policy(e.s, s, p));
    kv_policy_destroy(p);
    CHECK_OK(pe_prefill(&e, s, 10));
    CHECK_OK(kv_seq_prefill_end(e.s, s));
    float vr[10][PE_D], got[6 * PE_D];
    for (int32_t t = 0; t < 10; t++) {
        pe_token(&e, 0, t, k, v);
        memcpy(vr[t], v, sizeof vr[t]);
    }
    for (int ev = 2; ev <= 5; ev++)
        for (int j = ev + 1; j <= ev + 2; j++)
            for (uint32_t d = 0; d < PE_D; d++)
                vr[j][d] += vr[ev][d] / 2.0f;
    CHECK_EQ(pe_len(&e, s, 0, 0), 6);
    read_v(&e, s, 0, 0, 6, got);
    double err2 = 0;
    for (int i = 0; i < 6; i++) {
        int t = i < 2 ? i : i + 4;
        for (uint32_t d = 0; d < PE_D; d++) {
            double de = fabs(got[i * PE_D + d] - vr[t][d]);
            err2 = de > err2 ? de : err2;
        }
    }
    CHECK(err2 < 4e-3);
    kv_store_destroy(e.s);

    /* Seeded: two sequences with the same seed end identical. */
    CHECK_OK(pe_open(&e, 1, 2, 2, 0, 512));
    e.hot[0][0] = 5;
    kv_seq_id_t a, b;
    CHECK_OK(pe_seq(&e, "h2o:hh=4,rw=8+cam:m=4,seed=5", &a));
    CHECK_OK(pe_seq(&e, "h2o:hh=4,rw=8+cam:m=4,seed=5", &b));
    CHECK_OK(pe_prefill(&e, a, 64));
    CHECK_OK(pe_prefill(&e, b, 64));
    CHECK_OK(kv_seq_prefill_end(e.s, a));
    CHECK_OK(kv_seq_prefill_end(e.s, b));
    for (int i = 0; i < 4; i++) {
        CHECK_OK(pe_step(&e, a, 64 + i));
        CHECK_OK(pe_step(&e, b, 64 + i));
    }
    static float va[12 * PE_D], vb[12 * PE_D], plain[12 * PE_D];
    read_v(&e, a, 0, 1, 12, va);
    read_v(&e, b, 0, 1, 12, vb);
    CHECK(memcmp(va, vb, sizeof va) == 0);
    /* and CaM changed something against the appended values */
    int32_t pos[12];
    CHECK_OK(kv_read(e.s, a, 0, 1, 0, 12, NULL, NULL, pos));
    for (int i = 0; i < 12; i++) {
        float kk[2 * PE_D], vv[2 * PE_D];
        pe_token(&e, 0, pos[i], kk, vv);
        memcpy(plain + i * PE_D, vv + PE_D, PE_D * sizeof(float));
    }
    double diff = 0;
    for (int i = 0; i < 12 * (int)PE_D; i++)
        diff += fabs(va[i] - plain[i]);
    CHECK(diff > 0.01);
    kv_store_destroy(e.s);
}

static void test_minicache(void)
{
    pe_t e;
    CHECK_OK(pe_open(&e, 8, 1, 2, 0, 1024));
    kv_seq_id_t s;
    CHECK_OK(pe_seq(&e, "minicache:from=0.5,every=16", &s));
    CHECK_OK(pe_prefill(&e, s, 40));
    CHECK_OK(kv_seq_prefill_end(e.s, s));
    for (uint32_t l = 0; l < 8; l++)
        CHECK_EQ(count_fmt(&e, s, l, KV_FMT_MERGED) > 0, l >= 4);
    const kv_page_list_t *li;
    for (int i = 0; i < 16; i++) {
        CHECK_OK(pe_step(&e, s, 40 + i));
        /* every=16: nothing merged before the 16th new token */
        li = kv_page_list_get(e.s->pt, s, 5, 0);
        if (i < 15)
            CHECK(li->ents[li->n_ents - 1].format == KV_FMT_FP16 &&
                  li->ents[li->n_ents - 1].flags == 0);
    }
    /* 16 new tokens in both layers of each pair: merged too. */
    li = kv_page_list_get(e.s->pt, s, 5, 0);
    CHECK(li->ents[li->n_ents - 1].format != KV_FMT_FP16 ||
          li->ents[li->n_ents - 1].flags != 0);
    li = kv_page_list_get(e.s->pt, s, 3, 0);
    CHECK_EQ(li->ents[li->n_ents - 1].format, KV_FMT_FP16);
    CHECK_OK(kv_store_check(e.s));
    kv_stats_t st = {.struct_size = sizeof st};
    CHECK_OK(kv_store_stats(e.s, &st));
    CHECK(st.pages_by_format[KV_FMT_MERGED] > 0);
    kv_store_destroy(e.s);

    /* +int4: lower layers KIVI-4, merged directions INT4. */
    CHECK_OK(pe_open(&e, 4, 1, 2, 16, 1024));
    CHECK_OK(pe_seq(&e, "minicache+int4:r=16", &s));
    CHECK_OK(pe_prefill(&e, s, 40));
    CHECK_OK(kv_seq_prefill_end(e.s, s));
    CHECK(count_fmt(&e, s, 0, KV_FMT_INT4) > 0);
    CHECK(count_fmt(&e, s, 3, KV_FMT_MERGED) > 0);
    CHECK_EQ(count_fmt(&e, s, 3, KV_FMT_INT4), 0);
    kv_store_destroy(e.s);
}

static void test_kivi(void)
{
    pe_t e;
    CHECK_OK(pe_open(&e, 2, 1, 1, 16, 256));
    kv_seq_id_t s;
    CHECK_OK(pe_seq(&e, "kivi4:r=16", &s));
    CHECK_OK(pe_prefill(&e, s, 40));
    CHECK(count_fmt(&e, s, 1, KV_FMT_INT4) > 0); /* during the prompt already */
    CHECK_OK(kv_seq_prefill_end(e.s, s));
    CHECK_EQ(pe_len(&e, s, 1, 0), 40);
    kv_policy_t *p;
    CHECK_OK(kv_policy_parse("kivi2:r=32", &p, NULL, 0));
    CHECK_OK(kv_seq_create(e.s, &s));
    CHECK_EQ(kv_seq_set_policy(e.s, s, p), KV_ENOTSUP); /* r != store's R */
    kv_policy_destroy(p);
    kv_store_destroy(e.s);
}

int main(void)
{
    test_h2o();
    test_minikv();
    test_snapkv();
    test_streaming();
    test_simlayerkv("simlayerkv:w=8,delta=0.9", 1);
    test_simlayerkv("simlayerkv:w=8,delta=0.9,mode=prefill", 0);
    test_cam();
    test_minicache();
    test_kivi();
    return kv_test_end();
}
