/* SPDX-License-Identifier: MIT */
/*
 * test_api_info.c — the numbers the API gives tools: kv_format_info (bits
 * per element, group size, tokens per page), kv_policy_value (one key of a
 * parsed policy), kv_policy_info (what a policy resolves to) and
 * kv_pressure_check (a ladder's error code and message).
 *
 *   - kv_format_info: every format at head_dim 64 and 128 against the
 *     kv_format_note figures and the page layouts by hand; tokens per page
 *     against a store (FP16 from kv_stats, INT2/INT4 by the pages a
 *     quantized list takes); every bad input (NULL, unknown format or
 *     direction format, each geometry kv_store_create refuses) is an error
 *     that leaves *out alone.
 *   - kv_policy_value: given and default values of every kind of key
 *     (amount, integer, 64-bit integer, real, named value); every bad input.
 *   - kv_policy_info: methods, formats, budgets by hand; and against the
 *     store: after kv_seq_prefill_end every list holds min(budget, T)
 *     tokens (the mean over layers for a MiniKV pyramid); bad inputs.
 *   - kv_pressure_check: every bad ladder class with kv_store_create's code
 *     and a message naming the part; valid ladders give 0 and "".
 */
#include <string.h>

#include "../unit/test_policy_env.h"

/* ---- kv_format_info ------------------------------------------------------------ */

static void test_format_info(void)
{
    static const struct {
        kv_format_t fmt, dir;
        uint32_t hd;
        double bits;
        uint32_t group, tpp; /* default page: 64 * head_dim bytes */
    } want[] = {
        {KV_FMT_FP16, KV_FMT_FP16, 64, 16, 0, 16},
        {KV_FMT_FP16, KV_FMT_FP16, 128, 16, 0, 16},
        /* INT4: 16 tokens take 24 D bytes, 2 groups fit in 64 D */
        {KV_FMT_INT4, KV_FMT_FP16, 64, 6, 16, 32},
        {KV_FMT_INT2, KV_FMT_FP16, 128, 4, 16, 64},
        /* MERGED: (64 D - 16) / (16 + 4 D) slots, (64 D - 16) / (16 + 1.5 D) */
        {KV_FMT_MERGED, KV_FMT_FP16, 64, 8.5, 0, 15},
        {KV_FMT_MERGED, KV_FMT_INT4, 64, 3.5, 16, 36},
        {KV_FMT_MERGED, KV_FMT_FP16, 128, 8.25, 0, 15},
        {KV_FMT_MERGED, KV_FMT_INT4, 128, 3.25, 16, 39},
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        kv_format_info_t fi;
        CHECK_OK(kv_format_info(want[i].fmt, want[i].dir, want[i].hd, 0, &fi));
        CHECK(fi.bits_per_element == want[i].bits);
        CHECK_EQ(fi.group_size, want[i].group);
        CHECK_EQ(fi.tokens_per_page, want[i].tpp);
        CHECK(fi.note && !strcmp(fi.note, kv_format_note(want[i].fmt)));
    }
    kv_format_info_t fi;
    CHECK_OK(kv_format_info(KV_FMT_INT2, KV_FMT_FP16, 64, 0, &fi));
    CHECK(!strcmp(fi.name, "int2"));
    /* an explicit page size; one FP16 token per page holds no INT group */
    CHECK_OK(kv_format_info(KV_FMT_FP16, KV_FMT_FP16, 64, 8192, &fi));
    CHECK_EQ(fi.tokens_per_page, 32);
    CHECK_OK(kv_format_info(KV_FMT_INT4, KV_FMT_FP16, 64, 256, &fi));
    CHECK_EQ(fi.tokens_per_page, 0);

    /* bad input: an error, *out untouched */
    static const struct {
        int fmt, dir;
        uint32_t hd, pb;
        int rc;
    } bad[] = {
        {KV_FMT_COUNT, KV_FMT_FP16, 64, 0, KV_EINVAL}, {99, KV_FMT_FP16, 64, 0, KV_EINVAL},
        {-1, KV_FMT_FP16, 64, 0, KV_EINVAL},
        {KV_FMT_FP16, KV_FMT_INT4, 64, 0, KV_EINVAL}, /* no directions */
        {KV_FMT_INT4, KV_FMT_INT2, 64, 0, KV_EINVAL},
        {KV_FMT_MERGED, KV_FMT_INT2, 64, 0, KV_EINVAL}, /* INT4/FP16 only */
        {KV_FMT_MERGED, KV_FMT_MERGED, 64, 0, KV_EINVAL},
        {KV_FMT_MERGED, 77, 64, 0, KV_EINVAL},
        {KV_FMT_FP16, KV_FMT_FP16, 0, 0, KV_ERANGE},   {KV_FMT_FP16, KV_FMT_FP16, 8, 0, KV_ERANGE},
        {KV_FMT_FP16, KV_FMT_FP16, 72, 0, KV_ERANGE},  {KV_FMT_INT2, KV_FMT_FP16, 2048, 0, KV_ERANGE},
        {KV_FMT_FP16, KV_FMT_FP16, 64, 100, KV_ERANGE}, /* not a multiple of 64 */
        {KV_FMT_FP16, KV_FMT_FP16, 64, 192, KV_ERANGE}, /* < one FP16 token */
        {KV_FMT_FP16, KV_FMT_FP16, 64, 2u << 20, KV_ERANGE},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        memset(&fi, 0xab, sizeof fi);
        kv_format_info_t before = fi;
        int rc = kv_format_info((kv_format_t)bad[i].fmt, (kv_format_t)bad[i].dir, bad[i].hd,
                                bad[i].pb, &fi);
        if (rc != bad[i].rc)
            fprintf(stderr, "  bad case %zu: %d\n", i, rc);
        CHECK_EQ(rc, bad[i].rc);
        CHECK(!memcmp(&fi, &before, sizeof fi));
    }
    CHECK_EQ(kv_format_info(KV_FMT_FP16, KV_FMT_FP16, 64, 0, NULL), KV_EINVAL);
}

/* Pages a list of n tokens converted to fmt takes (KIVI residual 16, all
 * converted but n mod 16): counted with kv_stats on a one-list store. */
static uint64_t pages_of(kv_format_t fmt, uint32_t n, uint64_t *fp16_tail)
{
    kv_config_t c = kv_config_default();
    c.n_layers = 1, c.n_kv_heads = 1, c.n_q_heads = 1, c.head_dim = 64;
    c.host_pages = 256, c.n_threads = 1, c.residual = 16;
    kv_store_t *s = NULL;
    kv_seq_id_t q;
    static float k[1024 * 64];
    for (uint32_t i = 0; i < n * 64u; i++)
        k[i] = (float)(i % 97) / 97.0f;
    uint64_t pages = 0;
    kv_stats_t st = {.struct_size = sizeof st};
    if (!kv_store_create(&c, &s) && !kv_seq_create(s, &q) &&
        !kv_append(s, q, 0, n, KV_DTYPE_F32, k, k, NULL) && !kv_seq_set_format(s, q, 0, fmt) &&
        !kv_seq_quantize(s, q, 0, 0) && !kv_store_stats(s, &st)) {
        pages = st.pages_by_format[fmt];
        *fp16_tail = st.pages_by_format[KV_FMT_FP16];
    }
    kv_store_destroy(s);
    return pages;
}

static void test_format_pages(void)
{
    kv_format_info_t fi;
    uint64_t tail = 99;
    /* 640 tokens: FP16 tpp from the store's own stats */
    kv_config_t c = kv_config_default();
    c.n_layers = 1, c.n_kv_heads = 1, c.n_q_heads = 1, c.head_dim = 64, c.host_pages = 4;
    kv_store_t *s;
    kv_stats_t st = {.struct_size = sizeof st};
    CHECK_OK(kv_store_create(&c, &s));
    CHECK_OK(kv_store_stats(s, &st));
    CHECK_OK(kv_format_info(KV_FMT_FP16, KV_FMT_FP16, 64, 0, &fi));
    CHECK_EQ(fi.tokens_per_page, st.fp16_tokens_per_page);
    kv_store_destroy(s);
    const kv_format_t fmts[2] = {KV_FMT_INT4, KV_FMT_INT2};
    for (int i = 0; i < 2; i++) {
        CHECK_OK(kv_format_info(fmts[i], KV_FMT_FP16, 64, 0, &fi));
        uint64_t got = pages_of(fmts[i], 640, &tail);
        CHECK_EQ(got, (640 + fi.tokens_per_page - 1) / fi.tokens_per_page);
        CHECK_EQ(tail, 0);
    }
}

/* ---- kv_policy_value -------------------------------------------------------------- */

static kv_policy_t *parse(const char *spec)
{
    kv_policy_t *p = NULL;
    char err[256];
    int rc = kv_policy_parse(spec, &p, err, sizeof err);
    if (rc)
        fprintf(stderr, "  '%s': %s\n", spec, err);
    CHECK_OK(rc);
    return p;
}

static double value(const kv_policy_t *p, const char *m, const char *k)
{
    double v = -12345;
    CHECK_OK(kv_policy_value(p, m, k, &v));
    return v;
}

static void test_policy_value(void)
{
    kv_policy_t *p = parse("h2o:hh=256+cam:seed=18446744073709551615");
    if (!p)
        return;
    CHECK(value(p, "h2o", "hh") == 256);  /* tokens, as given */
    CHECK(value(p, "h2o", "rw") == 0.1);  /* default fraction */
    CHECK(value(p, "cam", "m") == 16);
    CHECK(value(p, "cam", "seed") == 18446744073709551615.0);
    double v = 7;
    CHECK_EQ(kv_policy_value(p, "minikv", "hh", &v), KV_ENOENT); /* not in it */
    CHECK_EQ(kv_policy_value(p, "int4", "r", &v), KV_ENOENT);
    CHECK_EQ(kv_policy_value(p, "h2o", "w", &v), KV_EINVAL);     /* not h2o's */
    CHECK_EQ(kv_policy_value(p, "h2o", "", &v), KV_EINVAL);
    CHECK_EQ(kv_policy_value(p, "bogus", "hh", &v), KV_EINVAL);
    CHECK_EQ(kv_policy_value(p, "H2O", "hh", &v), KV_EINVAL);
    CHECK_EQ(kv_policy_value(p, "h2o", "hh=", &v), KV_EINVAL);
    CHECK_EQ(kv_policy_value(NULL, "h2o", "hh", &v), KV_EINVAL);
    CHECK_EQ(kv_policy_value(p, NULL, "hh", &v), KV_EINVAL);
    CHECK_EQ(kv_policy_value(p, "h2o", NULL, &v), KV_EINVAL);
    CHECK_EQ(kv_policy_value(p, "h2o", "hh", NULL), KV_EINVAL);
    CHECK(v == 7); /* never written on error */
    kv_policy_destroy(p);

    p = parse("simlayerkv:mode=prefill,delta=0.25+kivi4:r=64");
    if (p) {
        CHECK(value(p, "simlayerkv", "mode") == 1); /* decode 0, prefill 1 */
        CHECK(value(p, "simlayerkv", "delta") == 0.25);
        CHECK(value(p, "simlayerkv", "w") == 1024);
        CHECK(value(p, "kivi4", "r") == 64);
        kv_policy_destroy(p);
    }
    p = parse("fp16");
    if (p) {
        CHECK_EQ(kv_policy_value(p, "fp16", "r", &v), KV_EINVAL); /* fp16 has no keys */
        kv_policy_destroy(p);
    }
}

/* ---- kv_policy_info ---------------------------------------------------------------- */

static kv_policy_info_t info(const char *spec, uint32_t L, uint32_t T)
{
    kv_policy_info_t o;
    memset(&o, 0xab, sizeof o);
    kv_policy_t *p = parse(spec);
    if (p)
        CHECK_OK(kv_policy_info(p, L, T, &o));
    kv_policy_destroy(p);
    return o;
}

static void test_policy_info(void)
{
    kv_policy_info_t o = info("fp16", 30, 1000);
    CHECK_EQ(o.methods, KV_POLICY_FP16);
    CHECK(o.format == KV_FMT_FP16 && o.residual == 0 && !o.evicts);
    CHECK(o.budget == 1000 && o.kept_fraction == 1.0);
    CHECK(o.lazy_window == 0 && o.merge_first == 30 && o.merge_pairs == 0 &&
          o.merge_every == 0 && o.merge_dir_format == KV_FMT_FP16);

    o = info("kivi2:r=64", 30, 1000);
    CHECK(o.methods == KV_POLICY_KIVI2 && o.format == KV_FMT_INT2 && o.residual == 64);

    o = info("minikv", 30, 1000); /* hh 0.25 + rw 0.25, INT2 */
    CHECK_EQ(o.methods, KV_POLICY_MINIKV);
    CHECK(o.format == KV_FMT_INT2 && o.residual == 0 && !o.evicts);
    CHECK(o.budget == 500 && o.kept_fraction == 0.5);
    o = info("minikv:hh=0.25,rw=0.25,pyramid=7+int4", 30, 1000);
    CHECK(o.format == KV_FMT_INT4 && o.residual == 128 && o.budget == 500);

    o = info("h2o:hh=0.1,rw=0.001", 8, 100); /* rw rounds to 0: keeps 1 */
    CHECK(o.evicts && o.budget == 11);
    CHECK(fabs(o.kept_fraction - 0.11) < 1e-12);
    o = info("h2o:hh=64,rw=64", 8, 100); /* budget above the prompt */
    CHECK(o.budget == 128 && o.kept_fraction == 1.0);
    o = info("streamingllm:sink=4,recent=0.2", 8, 1000);
    CHECK(o.evicts && o.budget == 204);
    o = info("snapkv:c=0.2+int2", 8, 1000);
    CHECK(!o.evicts && o.budget == 200 && o.format == KV_FMT_INT2);
    o = info("h2o+cam", 8, 0); /* empty prompt: the minimum */
    CHECK(o.methods == (KV_POLICY_H2O | KV_POLICY_CAM) && o.budget == 1 &&
          o.kept_fraction == 1.0);

    o = info("simlayerkv:w=256,sink=8+minikv", 30, 4000);
    CHECK(o.lazy_window == 264 && !o.lazy_at_prefill && o.budget == 2000);
    o = info("simlayerkv:mode=prefill", 30, 4000);
    CHECK(o.lazy_window == 1028 && o.lazy_at_prefill && o.budget == 4000);

    o = info("minicache", 30, 100); /* from 0.5: pairs (15,16) .. (27,28) */
    CHECK(o.merge_first == 15 && o.merge_pairs == 7 && o.merge_every == 16);
    CHECK(o.format == KV_FMT_FP16 && o.merge_dir_format == KV_FMT_FP16);
    o = info("minicache:from=0.25,every=128+int4", 5, 100); /* S = 1: (1,2), (3,4) */
    CHECK(o.merge_first == 1 && o.merge_pairs == 2 && o.merge_every == 128);
    CHECK(o.format == KV_FMT_INT4 && o.merge_dir_format == KV_FMT_INT4);
    o = info("minicache:from=1", 4, 100);
    CHECK(o.merge_first == 4 && o.merge_pairs == 0);

    kv_policy_t *p = parse("h2o");
    kv_policy_info_t x;
    memset(&x, 0x5a, sizeof x);
    kv_policy_info_t before = x;
    CHECK_EQ(kv_policy_info(NULL, 8, 100, &x), KV_EINVAL);
    CHECK_EQ(kv_policy_info(p, 8, 100, NULL), KV_EINVAL);
    CHECK_EQ(kv_policy_info(p, 0, 100, &x), KV_ERANGE);
    CHECK_EQ(kv_policy_info(p, 4097, 100, &x), KV_ERANGE);
    CHECK(!memcmp(&x, &before, sizeof x));
    CHECK_OK(kv_policy_info(p, 4096, UINT32_MAX, &x));
    kv_policy_destroy(p);
}

/* The store keeps min(budget, T) tokens of every list at prefill end. */
static void test_policy_info_store(void)
{
    static const char *const specs[] = {
        "h2o:hh=0.1,rw=0.1", "h2o:hh=20,rw=0.001", "streamingllm:sink=4,recent=0.25",
        "snapkv:w=8,c=0.3",  "minikv:hh=0.2,rw=0.1", "minikv:hh=0.2,rw=0.1,pyramid=3",
        "snapkv:c=500",
    };
    const uint32_t L = 4, T = 300;
    for (size_t i = 0; i < sizeof specs / sizeof specs[0]; i++) {
        pe_t e;
        kv_seq_id_t q;
        CHECK_OK(pe_open(&e, L, 2, 2, 128, 4096));
        CHECK_OK(pe_seq(&e, specs[i], &q));
        CHECK_OK(pe_prefill(&e, q, T));
        CHECK_OK(kv_seq_prefill_end(e.s, q));
        kv_policy_info_t o = info(specs[i], L, T);
        uint32_t want = o.budget < T ? o.budget : T, sum = 0;
        for (uint32_t l = 0; l < L; l++)
            for (uint32_t h = 0; h < e.H; h++) {
                uint32_t n = pe_len(&e, q, l, h);
                sum += n;
                if (!strstr(specs[i], "pyramid"))
                    CHECK_EQ(n, want);
            }
        double mean = (double)sum / (L * e.H);
        if (fabs(mean - want) > 0.5)
            fprintf(stderr, "  %s: mean kept %.2f, budget %u\n", specs[i], mean, want);
        CHECK(fabs(mean - want) <= 0.5); /* pyramid: rounding per layer */
        CHECK(fabs(o.kept_fraction - (double)want / T) < 1e-12);
        kv_store_destroy(e.s);
    }
}

/* ---- kv_pressure_check ------------------------------------------------------------- */

static void test_pressure_check(void)
{
    static const struct {
        const char *ladder;
        int rc;
        const char *names; /* the message names this */
    } cases[] = {
        {"int8", KV_EINVAL, "unknown step 'int8'"},
        {"int4,int4", KV_EINVAL, "'int4' given twice"},
        {"int2,int4", KV_EINVAL, "'int4' out of order"},
        {"int4,", KV_EINVAL, "empty step"},
        {",int4", KV_EINVAL, "empty step"},
        {"int4:sink=1", KV_EINVAL, "int4 takes no keys"},
        {"int4,sink=1", KV_EINVAL, "sink=1"},
        {"evict:", KV_EINVAL, "evict"},
        {"evict:foo=1", KV_EINVAL, "unknown key 'foo'"},
        {"evict:sink", KV_EINVAL, "'sink' is not key=value"},
        {"evict:sink=-1", KV_EINVAL, "sink=-1"},
        {"evict:sink=+1", KV_EINVAL, "sink=+1"},
        {"evict:sink=4,sink=5", KV_EINVAL, "'sink' given twice"},
        {"evict:recent=0", KV_ERANGE, "recent=0: expected an integer in [1, 16777216]"},
        {"evict:sink=65536", KV_ERANGE, "sink=65536"},
        {"evict:recent=99999999999999999999", KV_ERANGE, "recent=9999"},
        {"offload:sink=1", KV_EINVAL, "offload takes no keys"},
        {"int4,offload", KV_EINVAL, "'offload' out of order"},
    };
    char err[256];
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        strcpy(err, "x");
        int rc = kv_pressure_check(cases[i].ladder, err, sizeof err);
        CHECK_EQ(rc, cases[i].rc);
        if (!strstr(err, cases[i].names))
            fprintf(stderr, "  ladder '%s': message '%s' lacks '%s'\n", cases[i].ladder, err,
                    cases[i].names);
        CHECK(strstr(err, cases[i].names) != NULL);
        /* kv_store_create answers the same code */
        kv_config_t c = kv_config_default();
        c.n_layers = 1, c.n_kv_heads = 1, c.n_q_heads = 1, c.head_dim = 16;
        c.host_pages = 8, c.n_threads = 1, c.pressure = cases[i].ladder;
        kv_store_t *s = NULL;
        CHECK_EQ(kv_store_create(&c, &s), cases[i].rc);
        CHECK(s == NULL);
        CHECK_EQ(kv_pressure_check(cases[i].ladder, NULL, 0), cases[i].rc);
        char tiny[4];
        CHECK_EQ(kv_pressure_check(cases[i].ladder, tiny, sizeof tiny), cases[i].rc);
        CHECK(strlen(tiny) == 3); /* truncated, terminated */
    }
    static const char *const good[] = {NULL, "", "offload", "int4", "evict",
                                       "offload,int4,int2,evict:sink=0,recent=16777216",
                                       "evict:recent=1,sink=65535"};
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
        strcpy(err, "x");
        CHECK_OK(kv_pressure_check(good[i], err, sizeof err));
        CHECK(err[0] == '\0');
    }
}

int main(void)
{
    test_format_info();
    test_format_pages();
    test_policy_value();
    test_policy_info();
    test_policy_info_store();
    test_pressure_check();
    return kv_test_end();
}
