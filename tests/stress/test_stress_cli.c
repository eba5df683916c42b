/* SPDX-License-Identifier: MIT */
/*
 * test_stress_cli.c — the pieces of `kvpage stress` (tools/kvpage/stress_*.c,
 * from the kvtool library): the length distributions and generators, the
 * policy mix and the checks it derives, the verifier against planted
 * corruption (a shadow altered after append, a wrong position, a changed
 * value, a lossy format checked as exact, an evicting list checked as
 * complete, a fork that diverged, a failed call that changed something, a
 * sequence freed behind the driver's back, a leaked sequence), and the
 * driver: a short fixed-seed run is clean, routinely out of pages, and
 * deterministic (same seed, same op counts).
 */
#include <string.h>

#include "kv_test.h"
#include "tools/kvpage/stress_driver.h"
#include "tools/kvpage/stress_gen.h"
#include "tools/kvpage/stress_mix.h"
#include "tools/kvpage/stress_shadow.h"
#include "tools/kvpage/stress_verify.h"
#include "test_stress_util.h"

#define NL 2
#define NKV 2
#define HD 32

static void test_dist(void)
{
    stress_dist_t d;
    char err[256];
    uint64_t rng = 7;
    uint32_t len[2];
    CHECK_OK(stress_dist_parse("sharegpt", &d, err, sizeof err));
    CHECK(fabs(stress_dist_mean(&d, 0) - 161.0) < 0.01);
    CHECK(fabs(stress_dist_mean(&d, 1) - 338.0) < 0.01);
    double sum[2] = {0, 0};
    const int n = 200000;
    int in_range = 1;
    for (int i = 0; i < n; i++) {
        stress_dist_sample(&d, &rng, len);
        for (int j = 0; j < 2; j++) {
            sum[j] += len[j];
            in_range &= len[j] >= 4 && len[j] <= STRESS_SHAREGPT_MAX;
        }
    }
    CHECK(in_range);
    CHECK(fabs(sum[0] / n - 161.0) < 161.0 * 0.02);
    CHECK(fabs(sum[1] / n - 338.0) < 338.0 * 0.02);

    CHECK_OK(stress_dist_parse("fixed:100,7", &d, err, sizeof err));
    stress_dist_sample(&d, &rng, len);
    CHECK_EQ(len[0], 100);
    CHECK_EQ(len[1], 7);
    CHECK_OK(stress_dist_parse("uniform:3-5,10-10", &d, err, sizeof err));
    int seen[6] = {0};
    for (int i = 0; i < 1000; i++) {
        stress_dist_sample(&d, &rng, len);
        CHECK(len[0] >= 3 && len[0] <= 5 && len[1] == 10);
        if (len[0] <= 5)
            seen[len[0]] = 1;
    }
    CHECK(seen[3] && seen[4] && seen[5]);
    const char *bad[] = {"bogus", "fixed:0,5", "fixed:5", "fixed:5,", "uniform:5-3,1-2",
                         "uniform:1,2", "fixed:-1,2", "fixed:99999,1", "uniform:1-2,3"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        err[0] = 0;
        CHECK(stress_dist_parse(bad[i], &d, err, sizeof err) == -1);
        CHECK(strstr(err, bad[i]) != NULL);
    }
}

static void test_gen(void)
{
    uint64_t rng = 3, total = 0;
    for (int i = 0; i < 100000; i++)
        total += stress_rng_poisson(&rng, 0.5);
    CHECK(fabs((double)total / 100000 - 0.5) < 0.02);

    float k[HD], v[HD], k2[HD], v2[HD];
    stress_gen_token(1, 5, 1, 0, 17, HD, k, v);
    stress_gen_token(1, 5, 1, 0, 17, HD, k2, v2);
    CHECK(!memcmp(k, k2, sizeof k) && !memcmp(v, v2, sizeof v));
    stress_gen_token(1, 6, 1, 0, 17, HD, k2, v2); /* another origin */
    CHECK(memcmp(k, k2, sizeof k) != 0);
    int exact = 1;
    for (int j = 0; j < HD; j++)
        exact &= fabsf(k[j]) <= 1.0f && k[j] * 1024.0f == floorf(k[j] * 1024.0f) &&
                 fabsf(v[j]) <= 1.0f && v[j] * 1024.0f == floorf(v[j] * 1024.0f);
    CHECK(exact);
    CHECK_EQ(stress_gen_half(1.0f), 0x3C00);
    CHECK_EQ(stress_gen_half(-0.5f), 0xB800);
    CHECK_EQ(stress_gen_half(1.0f / 1024), 0x1400);
    CHECK_EQ(stress_gen_half(-1023.0f / 1024), 0xBBFE);
    CHECK_EQ(stress_gen_half(0.0f), 0x0000);
    CHECK_EQ(stress_gen_half(ldexpf(3.0f, -24)), 0x0003); /* subnormal */
}

static void test_mix(void)
{
    stress_mix_t m;
    char err[512];
    CHECK_OK(stress_mix_parse("none|kivi2|h2o:hh=0.1,rw=0.1+cam|minicache|streamingllm+int2"
                              "|snapkv+int4|minikv",
                              4, &m, err, sizeof err));
    CHECK_EQ(m.n, 7);
    CHECK(m.pol[0].policy == NULL && !strcmp(m.pol[0].spec, "none"));
    CHECK(m.pol[0].chk.bits == 0 && !m.pol[0].chk.select && m.pol[0].chk.merge_hi == 0);
    CHECK(m.pol[1].chk.bits == 2 && !m.pol[1].chk.select && !m.pol[1].chk.drift);
    CHECK(m.pol[2].chk.select && m.pol[2].chk.cam && m.pol[2].chk.bits == 0);
    CHECK(m.pol[3].chk.merge_lo == 2 && m.pol[3].chk.merge_hi == 4 && !m.pol[3].chk.select);
    CHECK(m.pol[4].chk.select && m.pol[4].chk.drift && m.pol[4].chk.bits == 2);
    CHECK(m.pol[5].chk.select && !m.pol[5].chk.drift && m.pol[5].chk.bits == 4);
    CHECK(m.pol[6].chk.select && !m.pol[6].chk.drift && m.pol[6].chk.bits == 2);
    CHECK(stress_check_merged(&m.pol[3].chk, 3) && !stress_check_merged(&m.pol[3].chk, 1));
    stress_mix_destroy(&m);
    stress_check_t c;
    kv_policy_t *mc[2] = {NULL, NULL};
    CHECK_OK(kv_policy_parse("minicache:from=0.25,t=0.6", &mc[0], NULL, 0));
    CHECK_OK(kv_policy_parse("minicache:from=0.5", &mc[1], NULL, 0));
    stress_check_derive(mc[0], 5, &c); /* S = 1: pairs (1,2), (3,4) */
    CHECK(c.merge_lo == 1 && c.merge_hi == 5);
    stress_check_derive(mc[1], 5, &c); /* S = 2: pair (2,3), layer 4 alone */
    CHECK(c.merge_lo == 2 && c.merge_hi == 4);
    kv_policy_destroy(mc[0]);
    kv_policy_destroy(mc[1]);
    const char *bad[] = {"", "none||kivi2", "bogus", "kivi2|", "h2o:hh=2.5"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        CHECK(stress_mix_parse(bad[i], 4, &m, err, sizeof err) == -1);
    /* the bound is the KIVI error of one group spanning [-1, 1] */
    CHECK(stress_check_qbound(2) > 1.0 / 3 && stress_check_qbound(2) < 1.0 / 3 + 0.003);
    CHECK(stress_check_qbound(4) > 1.0 / 15 && stress_check_qbound(4) < 1.0 / 15 + 0.002);
}

/* ---- the verifier against planted corruption ------------------------------ */

typedef struct vt {
    kv_store_t *st;
    stress_verifier_t vf;
    stress_check_t exact, sel, int2, merge;
} vt_t;

static void vt_open(vt_t *t, uint32_t pool)
{
    kv_config_t cfg = kv_config_default();
    cfg.n_layers = NL;
    cfg.n_q_heads = 2 * NKV;
    cfg.n_kv_heads = NKV;
    cfg.head_dim = HD;
    cfg.host_pages = pool;
    cfg.max_seqs = 16;
    cfg.n_threads = 1;
    memset(t, 0, sizeof *t);
    CHECK_OK(kv_store_create(&cfg, &t->st));
    CHECK_OK(stress_verifier_init(&t->vf, t->st, 42, NULL));
    t->sel.select = 1;
    t->int2.bits = 2;
    t->merge.merge_lo = 0;
    t->merge.merge_hi = 2;
}

static void vt_close(vt_t *t)
{
    stress_verifier_destroy(&t->vf);
    kv_store_destroy(t->st);
}

/* Append n tokens to one layer of s as the shadow says. */
static int vt_append_layer(vt_t *t, stress_shadow_t *s, uint32_t l, uint32_t n)
{
    static float k[64 * NKV * HD], v[64 * NKV * HD];
    static int32_t pos[64];
    stress_shadow_values(s, t->vf.seed, l, n, NKV, HD, k, v, pos);
    int rc = kv_append(t->st, s->id, l, n, KV_DTYPE_F32, k, v, pos);
    if (rc == 0)
        stress_shadow_append(s, l, n);
    return rc;
}

/* Append n tokens to every layer of s as the shadow says; bump (if >= 0)
 * adds 0.5 to element 0 of that token's key at layer 0, head 0; shift (if
 * >= 0) gives that token of layer 0 the next token's position. */
static int vt_append(vt_t *t, stress_shadow_t *s, uint32_t n, int bump, int shift)
{
    static float k[512 * NKV * HD], v[512 * NKV * HD];
    static int32_t pos[512];
    for (uint32_t l = 0; l < NL; l++) {
        stress_shadow_values(s, t->vf.seed, l, n, NKV, HD, k, v, pos);
        if (l == 0 && bump >= 0)
            k[(size_t)bump * NKV * HD] += 0.5f;
        if (l == 0 && shift >= 0)
            pos[shift]++;
        int rc = kv_append(t->st, s->id, l, n, KV_DTYPE_F32, k, v, pos);
        if (rc)
            return rc;
        stress_shadow_append(s, l, n);
    }
    return 0;
}

static stress_shadow_t vt_seq(vt_t *t, uint64_t origin, const stress_check_t *chk)
{
    stress_shadow_t s;
    kv_seq_id_t id = 0;
    CHECK_OK(kv_seq_create(t->st, &id));
    stress_shadow_init(&s, id, origin, NL, chk);
    return s;
}

static void test_verify_contents(void)
{
    vt_t t;
    vt_open(&t, 256);
    stress_shadow_t a = vt_seq(&t, 1, &t.exact);
    CHECK_OK(vt_append(&t, &a, 40, -1, -1));
    CHECK_OK(vt_append(&t, &a, 1, -1, -1));
    CHECK_EQ(stress_verify_seq(&t.vf, &a), 0);
    CHECK_EQ(t.vf.violations, 0);
    CHECK(t.vf.tokens == 41u * NL * NKV);

    stress_shadow_t bad = a; /* shadow altered after append: another origin */
    bad.lineage[0].origin = 2;
    CHECK(stress_verify_seq(&t.vf, &bad) > 0);
    bad = a; /* the shadow claims one token more */
    bad.next[1]++;
    CHECK_EQ(stress_verify_seq(&t.vf, &bad), NKV);
    bad = a; /* another seed */
    t.vf.seed = 43;
    CHECK(stress_verify_seq(&t.vf, &a) > 0);
    t.vf.seed = 42;

    stress_shadow_t b = vt_seq(&t, 3, &t.exact); /* a changed value */
    CHECK_OK(vt_append(&t, &b, 20, 7, -1));
    CHECK_EQ(stress_verify_seq(&t.vf, &b), 1);
    stress_shadow_t c = vt_seq(&t, 4, &t.sel); /* a wrong position, also under selection */
    CHECK_OK(vt_append(&t, &c, 20, -1, 5));     /* (both heads of layer 0) */
    CHECK_EQ(stress_verify_seq(&t.vf, &c), NKV);
    c.chk = &t.exact;
    CHECK_EQ(stress_verify_seq(&t.vf, &c), NKV);

    /* eviction: fine under selection, a violation for a policy that keeps all */
    stress_shadow_t e = vt_seq(&t, 5, &t.sel);
    CHECK_OK(vt_append(&t, &e, 30, -1, -1));
    const uint32_t keep[] = {0, 2, 5, 29};
    CHECK_OK(kv_compact(t.st, e.id, 1, 1, keep, 4));
    CHECK_EQ(stress_verify_seq(&t.vf, &e), 0);
    e.chk = &t.exact;
    CHECK_EQ(stress_verify_seq(&t.vf, &e), 1);

    /* the store-wide check sees every live sequence; one missing = a leak */
    const stress_shadow_t *live[] = {&a, &b, &c, &e};
    e.chk = &t.sel;
    c.chk = &t.sel;
    uint64_t v0 = t.vf.violations;
    CHECK_EQ(stress_verify_store(&t.vf, live, 4), 1 + NKV); /* b's value, c's positions */
    CHECK_EQ(stress_verify_store(&t.vf, live, 3), 3 + NKV); /* e leaked: count, tokens */
    CHECK(t.vf.violations > v0);
    vt_close(&t);
}

static void test_verify_formats(void)
{
    vt_t t;
    vt_open(&t, 512);
    /* KIVI-2: within the bound, and far from exact */
    kv_policy_t *pol = NULL;
    CHECK_OK(kv_policy_parse("kivi2", &pol, NULL, 0));
    stress_shadow_t q = vt_seq(&t, 1, &t.int2);
    CHECK_OK(kv_seq_set_policy(t.st, q.id, pol));
    kv_policy_destroy(pol);
    CHECK_OK(vt_append(&t, &q, 300, -1, -1));
    kv_stats_t st = {.struct_size = sizeof st};
    CHECK_OK(kv_store_stats(t.st, &st));
    CHECK(st.pages_by_format[KV_FMT_INT2] > 0);
    CHECK_EQ(stress_verify_seq(&t.vf, &q), 0);
    CHECK(t.vf.max_err[2] > 0.1 && t.vf.max_err[2] <= stress_check_qbound(2));
    q.chk = &t.exact;
    CHECK_EQ(stress_verify_seq(&t.vf, &q), NL * NKV);

    /* MiniCache merge of layers (0, 1): positions reordered, norms kept */
    stress_shadow_t m = vt_seq(&t, 2, &t.merge);
    CHECK_OK(vt_append(&t, &m, 64, -1, -1));
    CHECK_OK(kv_seq_merge_layers(t.st, m.id, 1, NULL));
    CHECK_OK(kv_store_stats(t.st, &st));
    CHECK(st.pages_by_format[KV_FMT_MERGED] > 0);
    uint64_t norm0 = t.vf.by_norm;
    CHECK_EQ(stress_verify_seq(&t.vf, &m), 0);
    CHECK(t.vf.by_norm > norm0);
    m.chk = &t.exact;
    CHECK(stress_verify_seq(&t.vf, &m) > 0);
    vt_close(&t);
}

static void test_verify_fork_and_failures(void)
{
    vt_t t;
    vt_open(&t, 64);
    stress_shadow_t p = vt_seq(&t, 1, &t.exact), ch;
    CHECK_OK(vt_append(&t, &p, 24, -1, -1));
    kv_seq_id_t cid;
    CHECK_OK(kv_seq_fork(t.st, p.id, &cid));
    CHECK_OK(stress_shadow_fork(&p, cid, 2, &ch));
    CHECK_EQ(stress_verify_same(&t.vf, p.id, cid), 0);
    CHECK_OK(vt_append(&t, &ch, 3, -1, -1)); /* the child's own tokens: origin 2 */
    CHECK_EQ(stress_verify_seq(&t.vf, &ch), 0);
    CHECK_EQ(stress_verify_seq(&t.vf, &p), 0);
    CHECK_EQ(stress_shadow_origin(&ch, 23), 1);
    CHECK_EQ(stress_shadow_origin(&ch, 24), 2);
    CHECK_EQ(stress_verify_same(&t.vf, p.id, cid), NL * NKV); /* they diverged */

    /* a failed call that changed nothing passes; a change is caught */
    stress_snap_take(&t.vf, &p);
    CHECK_EQ(stress_verify_unchanged(&t.vf, &p), 0);
    stress_snap_take(&t.vf, &p);
    stress_shadow_t behind = p; /* appended without telling the snapshot */
    CHECK_OK(vt_append(&t, &behind, 1, -1, -1));
    CHECK_EQ(stress_verify_unchanged(&t.vf, &p), 2 + NL * NKV); /* stats, lengths, lists */

    /* run the pool dry: the failing append must leave everything as it was */
    stress_shadow_t big = vt_seq(&t, 3, &t.exact);
    int rc = 0;
    for (int i = 0; i < 200 && !rc; i++) {
        stress_snap_take(&t.vf, &big);
        rc = vt_append_layer(&t, &big, (uint32_t)i % NL, 16);
    }
    CHECK_EQ(rc, KV_ENOMEM);
    uint64_t v0 = t.vf.violations;
    CHECK_EQ(stress_verify_unchanged(&t.vf, &big), 0);
    CHECK_EQ(t.vf.violations, v0);

    /* leaks: one sequence left behind is reported, none once all are freed */
    CHECK_OK(kv_seq_free(t.st, p.id));
    CHECK_OK(kv_seq_free(t.st, cid));
    CHECK(stress_verify_empty(&t.vf, 0) > 0);
    kv_stats_t st = {.struct_size = sizeof st};
    CHECK_OK(kv_seq_free(t.st, big.id));
    CHECK_OK(kv_store_stats(t.st, &st));
    uint64_t l0 = t.vf.leaks;
    CHECK_EQ(stress_verify_empty(&t.vf, st.meta_bytes), 0);
    CHECK_EQ(stress_verify_empty(&t.vf, st.meta_bytes - 8), 1); /* metadata kept */
    CHECK_EQ(t.vf.leaks, l0 + 1);
    vt_close(&t);
}

/* ---- the driver ------------------------------------------------------------ */

static void test_driver(void)
{
    const char *mix = "none|kivi2|h2o:hh=0.1,rw=0.1+cam|minicache+int4|snapkv+int4";
    run_result_t a = tsu_run(mix, 1, 15000, NULL, 0, 0), b = tsu_run(mix, 1, 15000, NULL, 0, 0),
                 c = tsu_run(mix, 2, 15000, NULL, 0, 0);
    CHECK_EQ(a.violations, 0);
    CHECK_EQ(a.leaks, 0);
    CHECK_EQ(c.violations, 0);
    CHECK(a.ops >= 15000);
    CHECK(a.alloc_failures > 0);                 /* out of pages is routine */
    CHECK(a.ev_count[STRESS_EV_PREEMPTED] > 0);  /* and handled by preemption */
    CHECK(a.ev_count[STRESS_EV_FINISHED] > 0);
    CHECK(a.op_count[STRESS_OP_FORK] > 0);
    CHECK(a.op_count[STRESS_OP_SET_POLICY] > 0);
    CHECK(!memcmp(&a, &b, sizeof a));            /* same seed, same run */
    CHECK(memcmp(a.op_count, c.op_count, sizeof a.op_count) != 0);

    /* a sequence freed behind the driver's back, and one leaked into the store */
    stress_cfg_t cfg;
    stress_mix_t m;
    stress_driver_t d;
    char err[512];
    tsu_cfg(&cfg, &m, "none", 3, NULL, 0, 0);
    CHECK_OK(stress_driver_create(&cfg, &d, NULL, err, sizeof err));
    while (d.n_live < 2)
        stress_driver_step(&d);
    CHECK_EQ(stress_driver_verify(&d), 0);
    int victim = -1;
    for (uint32_t i = 0; i <= cfg.max_seqs && victim < 0; i++)
        victim = d.slots[i].used ? (int)i : -1;
    CHECK_OK(kv_seq_free(d.st, d.slots[victim].sh.id));
    CHECK(stress_driver_verify(&d) > 0);
    d.slots[victim].used = 0; /* forget it, then leak a new one */
    d.n_live--;
    kv_seq_id_t leaked;
    CHECK_OK(kv_seq_create(d.st, &leaked));
    stress_driver_finish(&d);
    CHECK(d.vf.leaks > 0);
    stress_driver_destroy(&d);
    stress_mix_destroy(&m);
}

int main(void)
{
    test_dist();
    test_gen();
    test_mix();
    test_verify_contents();
    test_verify_formats();
    test_verify_fork_and_failures();
    test_driver();
    return kv_test_end();
}
