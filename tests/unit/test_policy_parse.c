/* SPDX-License-Identifier: MIT */
/*
 * test_policy_parse.c — policy strings: every example of the issue parses,
 * describe() round-trips, bad strings are KV_EINVAL with a message naming
 * the offending method/key, invalid compositions are rejected; and the pure
 * helpers: pyramid budgets (mean = h, linear from 2h - h/p to h/p), SnapKV
 * max-pooling, top-k with ties.
 */
#include <string.h>

#include "store/kv_policy_int.h"
#include "kv_test.h"

static void good(const char *spec)
{
    kv_policy_t *p = NULL, *q = NULL;
    char err[256], d1[512], d2[512];
    int rc = kv_policy_parse(spec, &p, err, sizeof err);
    CHECK_OK(rc);
    if (rc) {
        fprintf(stderr, "  spec '%s': %s\n", spec, err);
        return;
    }
    CHECK_OK(kv_policy_describe(p, d1, sizeof d1));
    CHECK_OK(kv_policy_parse(d1, &q, err, sizeof err));
    if (q) {
        CHECK_OK(kv_policy_describe(q, d2, sizeof d2));
        CHECK(strcmp(d1, d2) == 0);
        CHECK(memcmp(p, q, sizeof *p) == 0);
    }
    char tiny[4];
    CHECK_EQ(kv_policy_describe(p, tiny, sizeof tiny), KV_ERANGE);
    kv_policy_destroy(p);
    kv_policy_destroy(q);
}

static void bad(const char *spec, const char *must_name)
{
    kv_policy_t *p = (kv_policy_t *)0x1;
    char err[256] = "";
    CHECK_EQ(kv_policy_parse(spec, &p, err, sizeof err), KV_EINVAL);
    CHECK(p == (kv_policy_t *)0x1); /* untouched */
    if (!strstr(err, must_name))
        fprintf(stderr, "  spec '%s': message '%s' lacks '%s'\n", spec, err, must_name);
    CHECK(strstr(err, must_name) != NULL);
}

int main(void)
{
    static const char *const ok[] = {
        "fp16", "kivi2", "kivi4", "kivi4:r=128", "int2", "int4",
        "streamingllm", "streamingllm:sink=4,recent=256", "h2o", "h2o:hh=0.1,rw=0.1",
        "h2o:hh=256,rw=64", "snapkv:w=32,k=7,c=1024", "snapkv:c=0.2",
        "minikv:hh=0.25,rw=0.25,pyramid=7", "minikv:hh=0.25,rw=0.25",
        "simlayerkv:delta=0.9,w=1024+int4", "simlayerkv:mode=prefill,w=16",
        "h2o:hh=0.1,rw=0.1+cam:m=16", "streamingllm:recent=64+cam:m=8,seed=7",
        "minicache:from=0.5,t=0.6,gamma=0.05+int4", "minicache",
        "simlayerkv+minikv:hh=0.2", "h2o+int4", "snapkv+int2", "streamingllm+kivi2",
    };
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++)
        good(ok[i]);
    /* MiniCache's decode merge interval defaults to 16 tokens (docs/policies.md) */
    kv_policy_t *mc = NULL;
    char mc_err[128], mc_d[512];
    CHECK_OK(kv_policy_parse("minicache", &mc, mc_err, sizeof mc_err));
    if (mc) {
        CHECK_OK(kv_policy_describe(mc, mc_d, sizeof mc_d));
        CHECK(strstr(mc_d, "every=16") != NULL);
        kv_policy_destroy(mc);
    }

    bad("", "empty");
    bad("foo", "foo");
    bad("h2o:hx=0.1", "hx");
    bad("h2o:hh=1.5", "hh");
    bad("h2o:hh=-1", "hh");
    bad("h2o:hh", "hh");
    bad("snapkv:k=6", "k=6");
    bad("snapkv:w=0", "w=0");
    bad("kivi4:r=100", "r=100");
    bad("simlayerkv:delta=1.5", "delta");
    bad("simlayerkv:mode=both", "mode");
    bad("minicache:t=2", "t=2");
    bad("cam:m=16", "cam");
    bad("snapkv+cam", "cam");
    bad("h2o+cam+int4", "cam");
    bad("h2o+snapkv", "snapkv");
    bad("int2+int4", "int4");
    bad("h2o+h2o", "h2o");
    bad("fp16+int4", "fp16");
    bad("minicache+h2o", "minicache");
    bad("minicache+int2", "minicache");
    bad("h2o+", "empty");
    bad("h2o:", "h2o");
    bad("h2o:hh=0.1,hh=0.2", "'hh' given twice"); /* a key at most once */
    bad("snapkv:w=8,k=3,w=8", "'w' given twice");
    bad("h2o:hh=0.1,rw=0.1,", "h2o");
    CHECK_EQ(kv_policy_parse(NULL, NULL, NULL, 0), KV_EINVAL);

    /* Defaults land where docs/policies.md puts them. */
    kv_policy_t *p;
    CHECK_OK(kv_policy_parse("minikv", &p, NULL, 0));
    CHECK(p->hh.is_ratio && p->hh.v == 0.25 && p->recent.v == 0.25);
    CHECK_EQ(p->fmt, KV_FMT_INT2);
    kv_policy_destroy(p);
    CHECK_OK(kv_policy_parse("h2o:hh=256", &p, NULL, 0));
    CHECK(!p->hh.is_ratio && p->hh.v == 256 && p->recent.is_ratio && p->recent.v == 0.1);
    CHECK_EQ(kv_pol_amount(p->hh, 1000), 256);
    CHECK_EQ(kv_pol_amount(p->recent, 1000), 100);
    kv_policy_destroy(p);

    /* Pyramid: endpoints 2h - h/p and h/p, linear, mean h. */
    const uint32_t L = 30, h = 700, pdiv = 7;
    double sum = 0;
    for (uint32_t l = 0; l < L; l++) {
        uint32_t b = kv_pol_pyramid(h, pdiv, l, L);
        double want = (2.0 * h - h / 7.0) + (h / 7.0 - (2.0 * h - h / 7.0)) * l / (L - 1);
        CHECK(fabs(b - want) <= 0.5);
        if (l)
            CHECK(b <= kv_pol_pyramid(h, pdiv, l - 1, L));
        sum += b;
    }
    CHECK_EQ(kv_pol_pyramid(h, pdiv, 0, L), 1300);
    CHECK_EQ(kv_pol_pyramid(h, pdiv, L - 1, L), 100);
    CHECK(fabs(sum / L - h) <= 0.5);
    CHECK_EQ(kv_pol_pyramid(h, 0, 5, L), h);

    /* Max-pool, kernel 3 and 7, clipped at the edges. */
    float in[8] = {0, 5, 0, 0, 0, 0, 0, 9}, out[8];
    kv_pol_maxpool(in, 8, 3, out);
    float want3[8] = {5, 5, 5, 0, 0, 0, 9, 9};
    for (int i = 0; i < 8; i++)
        CHECK(out[i] == want3[i]);
    kv_pol_maxpool(in, 8, 7, out);
    float want7[8] = {5, 5, 5, 5, 9, 9, 9, 9};
    for (int i = 0; i < 8; i++)
        CHECK(out[i] == want7[i]);

    /* Top-k: highest scores, ties to the lower index, window appended. */
    float sc[6] = {1, 3, 3, 0, 3, 2};
    uint32_t keep[8], scr[16];
    uint32_t n = kv_pol_topk_keep(sc, 6, 8, 2, keep, scr);
    CHECK_EQ(n, 4);
    CHECK(keep[0] == 1 && keep[1] == 2 && keep[2] == 6 && keep[3] == 7);
    n = kv_pol_topk_keep(sc, 6, 6, 5, keep, scr); /* evict one: index 3 */
    CHECK_EQ(n, 5);
    CHECK(keep[0] == 0 && keep[1] == 1 && keep[2] == 2 && keep[3] == 4 && keep[4] == 5);
    float tie[4] = {1, 1, 1, 1};
    n = kv_pol_topk_keep(tie, 4, 4, 3, keep, scr); /* ties: evict the highest index */
    CHECK(n == 3 && keep[2] == 2);
    return kv_test_end();
}
