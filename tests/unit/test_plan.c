/* SPDX-License-Identifier: MIT */
/*
 * test_plan.c — `kvpage plan` (tools/kvpage/plan_*.c, from the kvtool
 * library with the workload generator and policy parser it uses):
 * hand-computed footprints (Llama-2-7B FP16 = 524,288 B/token, SmolLM2-135M
 * FP16 = 23,040), an INT2 list against the formats' 4 bits/element + FP16
 * residual, max_seqs for a hand-computed pool, the exactness the plan
 * relies on (kv heads scale pages exactly, head_dim does not change page
 * counts), the synthetic data steering SimLayerKV's lazy layers and
 * MiniCache's retention, the extrapolated max context against the exact
 * one, what the plan asks the library about a policy, the eval report
 * scanner, the renderings, and bad input.
 */
#include <string.h>

#include "kv_test.h"
#include "tools/kvpage/eval_policy.h"
#include "tools/kvpage/stress_gen.h"
#include "tools/kvpage/plan_preset.h"
#include "tools/kvpage/plan_spec.h"
#include "tools/kvpage/plan_sim.h"
#include "tools/kvpage/plan_closed.h"
#include "tools/kvpage/plan_evalq.h"
#include "tools/kvpage/plan_calc.h"
#include "tools/kvpage/kv_cli.h"
#include "tools/kvpage/plan_report.h"

static plan_spec_t spec(const char *s)
{
    plan_spec_t sp;
    char err[256];
    memset(&sp, 0, sizeof sp);
    CHECK_OK(plan_spec_parse(s, &sp, err, sizeof err));
    return sp;
}

static plan_sim_cfg_t cfg(const plan_spec_t *sp, uint32_t layers, uint32_t q_per_kv,
                          uint32_t head_dim)
{
    return (plan_sim_cfg_t){.layers = layers, .q_per_kv = q_per_kv, .head_dim = head_dim,
                            .policy = sp->ep.policy, .chunk = 512,
                            .lazy_frac = 0.55, .retain_frac = 0.05};
}

/* Llama-2-7B and SmolLM2-135M FP16, by formula and in the store. */
static void test_fp16_bytes_per_token(void)
{
    const plan_model_t *ll = plan_model_find("llama-2-7b"), *sm = plan_model_find("SMOLLM2-135M");
    CHECK(ll && sm);
    if (!ll || !sm)
        return;
    /* 32 layers x 32 kv heads x 128 x (K, V) x 2 bytes = 512 KiB */
    plan_spec_t sp = spec("fp16");
    plan_closed_in_t ci = {ll->layers, ll->kv_heads, ll->head_dim, 0.55, 0.05};
    CHECK(plan_closed_bytes(&ci, sp.ep.policy, 160, 0) / 160 == 524288.0);
    /* 30 x 3 x 64 x 2 x 2 */
    ci = (plan_closed_in_t){sm->layers, sm->kv_heads, sm->head_dim, 0.55, 0.05};
    CHECK(plan_closed_bytes(&ci, sp.ep.policy, 100, 60) / 160 == 23040.0);
    /* measured: 160 tokens fill 10 pages of every list exactly */
    plan_foot_t f;
    plan_sim_cfg_t c = cfg(&sp, sm->layers, sm->q_heads / sm->kv_heads, sm->head_dim);
    CHECK_OK(plan_sim_run(&c, sm->kv_heads, 100, 60, &f));
    CHECK_EQ(f.kv_bytes / 160, 23040);
    CHECK_EQ(f.page_bytes, 64 * 64);
    /* Llama-2-7B: one kv head at head_dim 16, scaled to 32 heads of 8 KiB pages */
    c = cfg(&sp, ll->layers, 1, 16);
    CHECK_OK(plan_sim_run(&c, 1, 160, 0, &f));
    CHECK_EQ(f.pages * ll->kv_heads * (64u * ll->head_dim) / 160, 524288);
    /* 161 + 338 tokens: ceil(499 / 16) = 32 pages per list */
    CHECK_OK(plan_sim_run(&c, 1, 161, 338, &f));
    CHECK_EQ(f.pages, 32u * ll->layers);
    plan_spec_destroy(&sp);
    /* weights: the FP16 size of the parameters the config implies */
    uint64_t p7 = 2ull * 32000 * 4096 + 32ull * (4ull * 4096 * 4096 + 3ull * 4096 * 11008 +
                                                 2 * 4096) + 4096;
    CHECK_EQ(ll->params, p7);
    CHECK_EQ(sm->params, 49152ull * 576 + 30ull * (2 * 576 * 576 + 2 * 576 * 192 +
                                                   3 * 576 * 1536 + 2 * 576) + 576);
}

/* An INT2 list: 4 bits/element for whole residual groups, FP16 for the rest. */
static void test_int2_list(void)
{
    CHECK(plan_closed_bits(KV_FMT_FP16, 0, 64) == 16);
    CHECK(plan_closed_bits(KV_FMT_INT4, 0, 64) == 6);
    CHECK(plan_closed_bits(KV_FMT_INT2, 0, 64) == 4);
    CHECK(plan_closed_bits(KV_FMT_MERGED, 0, 64) == 8.5);
    CHECK(plan_closed_bits(KV_FMT_MERGED, 1, 64) == 3.5);
    plan_spec_t sp = spec("kivi2");
    plan_sim_cfg_t c = cfg(&sp, 1, 1, 64);
    plan_foot_t f;
    /* 300 tokens, R = 128: 256 INT2 (4 pages of 64) + 44 FP16 (3 pages of 16) */
    CHECK_OK(plan_sim_run(&c, 1, 300, 0, &f));
    CHECK_EQ(f.pages, 7);
    CHECK_EQ(f.tokens, 300);
    plan_closed_in_t ci = {1, 1, 64, 0, 0};
    /* 256 x 128 elements x 4 bits + 44 x 128 x 16 bits */
    CHECK(plan_closed_bytes(&ci, sp.ep.policy, 300, 0) == 256 * 128 * 4 / 8 + 44 * 128 * 2);
    /* as decode steps: the same conversions */
    CHECK_OK(plan_sim_run(&c, 1, 100, 200, &f));
    CHECK_EQ(f.pages, 7);
    plan_spec_destroy(&sp);
}

static plan_in_t smol_in(const char *workload)
{
    plan_in_t in = {.model = *plan_model_find("SmolLM2-135M"), .gpu_name = "test",
                    .workload = workload, .samples = 4, .seed = 1, .chunk = 64,
                    .ctx_base = 64, .lazy_frac = 0.55, .retain_frac = 0.05};
    char err[256];
    CHECK(stress_dist_parse(workload, &in.dist, err, sizeof err) == 0);
    return in;
}

/* max_seqs for a pool computed by hand. */
static void test_max_seqs(void)
{
    plan_in_t in = smol_in("fixed:161,338");
    /* 1 GiB x (1 - 0.5) - 1e8 = 436,870,912 B = 106,657 pages of 4 KiB */
    in.gpu_bytes = 1073741824.0, in.reserve = 0.5, in.weights_bytes = 1e8;
    plan_t p;
    CHECK_OK(plan_init(&in, &p));
    CHECK_EQ(p.pool_pages, 106657);
    CHECK_EQ(p.n_samples, 1);
    plan_spec_t sp = spec("fp16");
    plan_result_t r;
    CHECK_OK(plan_policy(&p, &sp, &r));
    /* 499 tokens: 32 pages x 90 lists = 2880 per sequence; 106657 / 2880 */
    CHECK(r.pages_per_seq == 2880);
    CHECK_EQ(r.max_seqs, 37);
    CHECK(r.heads_exact);
    CHECK(r.closed_bytes_per_token == 23040);
    CHECK(r.kv_bytes_per_token == 2880.0 * 4096 / 499);
    CHECK(r.meta_bytes_per_token > 0 && r.bytes_per_token > r.kv_bytes_per_token);
    CHECK(!r.quality.have); /* no eval_dir */
    /* metadata: scaled from 1 and 2 heads, the same as a run with all 3 */
    plan_sim_cfg_t c = plan_sim_cfg(&p, &sp);
    plan_foot_t f3;
    CHECK_OK(plan_sim_run(&c, 3, 161, 338, &f3));
    CHECK(fabs(r.meta_bytes_per_token * 499 - (double)f3.meta_bytes) < 1e-6);
    CHECK_EQ(f3.pages, 2880);
    plan_spec_destroy(&sp);
    /* a target of 40 sequences does not fit, 37 does */
    in.concurrency = 40;
    CHECK_OK(plan_init(&in, &p));
    sp = spec("fp16");
    CHECK_OK(plan_policy(&p, &sp, &r));
    CHECK_EQ(r.fits, 0);
    plan_spec_destroy(&sp);
}

/* kv heads scale pages (and the peak) exactly, metadata affinely; head_dim
 * does not change page counts or metadata without MERGED pages. */
static void test_scaling(void)
{
    const char *specs[] = {"kivi2", "minikv", "minicache+int4", "simlayerkv:w=64",
                           "h2o:hh=0.1,rw=0.1"};
    for (size_t i = 0; i < sizeof specs / sizeof specs[0]; i++) {
        plan_spec_t sp = spec(specs[i]);
        plan_sim_cfg_t c = cfg(&sp, 4, 3, 64);
        plan_foot_t f1, f2, f3;
        CHECK_OK(plan_sim_run(&c, 1, 200, 20, &f1));
        CHECK_OK(plan_sim_run(&c, 2, 200, 20, &f2));
        CHECK_OK(plan_sim_run(&c, 3, 200, 20, &f3));
        CHECK_EQ(f3.pages, 3 * f1.pages);
        CHECK_EQ(f3.peak_pages, 3 * f1.peak_pages);
        CHECK_EQ(f3.meta_bytes, f1.meta_bytes + 2 * (f2.meta_bytes - f1.meta_bytes));
        if (!(plan_spec_methods(sp.ep.policy) & KV_POLICY_MINICACHE)) {
            plan_foot_t g;
            c.head_dim = 16;
            CHECK_OK(plan_sim_run(&c, 3, 200, 20, &g));
            CHECK_EQ(g.pages, f3.pages);
            CHECK_EQ(g.peak_pages, f3.peak_pages);
            CHECK_EQ(g.meta_bytes, f3.meta_bytes);
        }
        plan_spec_destroy(&sp);
    }
}

/* The synthetic data makes exactly the assumed layers lazy and exactly the
 * assumed tokens retained. */
static void test_crafted_data(void)
{
    plan_spec_t sp = spec("simlayerkv:w=64");
    plan_sim_cfg_t c = cfg(&sp, 4, 2, 16);
    plan_foot_t f;
    const double fracs[3] = {0, 0.5, 1};
    const uint64_t held[3] = {4 * 201, 2 * 68 + 2 * 201, 4 * 68}; /* 68 = sink 4 + w 64 */
    for (int i = 0; i < 3; i++) {
        c.lazy_frac = fracs[i];
        CHECK_OK(plan_sim_run(&c, 1, 200, 1, &f));
        CHECK_EQ(f.tokens, held[i]);
    }
    plan_spec_destroy(&sp);
    sp = spec("simlayerkv:w=64,mode=prefill");
    c = cfg(&sp, 4, 2, 16);
    c.lazy_frac = 0.5;
    CHECK_OK(plan_sim_run(&c, 1, 200, 0, &f));
    CHECK_EQ(f.tokens, 2 * 68 + 2 * 200);
    plan_spec_destroy(&sp);
    /* one pair (0, 1), 320 tokens, MERGED with FP16 directions: 15 per 4 KiB page */
    sp = spec("minicache:from=0");
    c = cfg(&sp, 2, 1, 64);
    c.retain_frac = 0;
    CHECK_OK(plan_sim_run(&c, 1, 320, 0, &f));
    CHECK_EQ(f.pages, (320 + 14) / 15);
    c.retain_frac = 0.25; /* 80 retained in both layers: 5 FP16 pages each */
    CHECK_OK(plan_sim_run(&c, 1, 320, 0, &f));
    CHECK_EQ(f.pages, (240 + 14) / 15 + 2 * 5);
    CHECK_EQ(f.tokens, 640);
    plan_spec_destroy(&sp);
    CHECK(plan_sim_pick(1, 4, 0.5) && !plan_sim_pick(0, 4, 0.5) && !plan_sim_pick(0, 4, 0));
}

/* The extrapolated max context never exceeds the exact one and stays close.
 * A 4-layer, 1-kv-head shape keeps the exact bisection cheap. */
static void test_max_ctx(void)
{
    const char *specs[] = {"fp16", "kivi2", "minikv", "simlayerkv:w=16"};
    plan_in_t in = smol_in("fixed:64,32");
    in.model = (plan_model_t){.name = "tiny", .layers = 4, .q_heads = 2, .kv_heads = 1,
                              .head_dim = 16};
    in.gpu_bytes = 160.0 * 1024, in.reserve = 0, in.weights_bytes = 0; /* 160 pages */
    for (size_t i = 0; i < sizeof specs / sizeof specs[0]; i++) {
        plan_t pe, px;
        plan_result_t re, rx;
        plan_spec_t sp = spec(specs[i]);
        in.ctx_base = 128; /* probes at 128 and 256 prompt tokens: extrapolate */
        CHECK_OK(plan_init(&in, &px));
        CHECK_OK(plan_policy(&px, &sp, &rx));
        in.ctx_base = 2048; /* probes beyond the answer: bisection */
        CHECK_OK(plan_init(&in, &pe));
        CHECK_OK(plan_policy(&pe, &sp, &re));
        CHECK_EQ(rx.ctx_method, PLAN_CTX_EXTRAPOLATED);
        CHECK_EQ(re.ctx_method, PLAN_CTX_EXACT);
        CHECK(rx.max_ctx <= re.max_ctx);
        /* the margin (2 pages of each of 4 lists) plus one page of rounding
         * per list, at INT2's 64 tokens per page at most */
        CHECK(re.max_ctx - rx.max_ctx <= 3 * 64);
        /* the exact answer fits and one more prompt token does not */
        plan_sim_cfg_t c = plan_sim_cfg(&pe, &sp);
        plan_foot_t f;
        uint32_t P = (uint32_t)(re.max_ctx - pe.ctx_out);
        CHECK_OK(plan_sim_run(&c, 1, P, pe.ctx_out, &f));
        CHECK(f.peak_pages <= pe.pool_pages);
        CHECK_OK(plan_sim_run(&c, 1, P + 1, pe.ctx_out, &f));
        CHECK(f.peak_pages > pe.pool_pages);
        plan_spec_destroy(&sp);
    }
    /* a pool that does not hold one token of every list */
    in.gpu_bytes = 3.0 * 1024;
    plan_t p;
    plan_result_t r;
    plan_spec_t sp = spec("fp16");
    CHECK_OK(plan_init(&in, &p));
    CHECK_OK(plan_policy(&p, &sp, &r));
    CHECK_EQ(r.ctx_method, PLAN_CTX_NONE);
    CHECK_EQ(r.max_ctx, 0);
    CHECK_EQ(r.max_seqs, 0);
    plan_spec_destroy(&sp);
}

/* What the plan asks the library about a policy (plan_spec_methods,
 * plan_spec_value). */
static void test_spec(void)
{
    plan_spec_t a = spec("minikv:hh=0.25,rw=0.5,pyramid=7"), b = spec("minikv:hh=0.25");
    plan_spec_t c = spec("simlayerkv:mode=decode"), d = spec("simlayerkv:w=1+int4:r=128");
    plan_spec_t e = spec("minicache:from=0.5+int4:r=64"), f = spec("fp16");
    CHECK(plan_spec_value(a.ep.policy, "minikv", "rw", -1) == 0.5);
    CHECK(plan_spec_value(a.ep.policy, "minikv", "pyramid", -1) == 7);
    CHECK(plan_spec_value(b.ep.policy, "minikv", "h", -1) == -1);  /* no such key */
    CHECK(plan_spec_value(b.ep.policy, "h2o", "hh", -1) == -1);    /* not in it */
    CHECK(plan_spec_value(b.ep.policy, "minik", "hh", -1) == -1);  /* no such method */
    CHECK(plan_spec_value(b.ep.policy, "minikv", "rw", -1) == 0.25); /* the default */
    CHECK(plan_spec_value(c.ep.policy, "simlayerkv", "mode", -1) == 0); /* decode */
    CHECK(plan_spec_methods(d.ep.policy) == (KV_POLICY_SIMLAYERKV | KV_POLICY_INT4));
    CHECK(plan_spec_methods(e.ep.policy) == (KV_POLICY_MINICACHE | KV_POLICY_INT4));
    CHECK(plan_spec_methods(f.ep.policy) == KV_POLICY_FP16);
    CHECK(plan_spec_methods(NULL) == 0);
    CHECK(plan_spec_value(NULL, "minikv", "rw", -1) == -1);
    plan_spec_t *all[] = {&a, &b, &c, &d, &e, &f};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        plan_spec_destroy(all[i]);
    plan_spec_t sp = spec("kivi2:r=64");
    CHECK(!strcmp(sp.given, "kivi2:r=64") && !strcmp(sp.ep.spec, "kivi2:r=64"));
    plan_spec_destroy(&sp);
    plan_spec_destroy(&sp); /* twice: a no-op */
}

static const char *report_json =
    "{\"model\":\"/x/SmolLM2-135M-Instruct.Q4_1.gguf\",\"policies\":[\"fp16\",\"kivi2\"],"
    "\"results\":[{\"policy\":\"fp16\",\"task\":\"ppl\",\"ctx\":1152,\"value\":10.5,"
    "\"text\":\"A \\\"q\\\"\",\"formats\":[\"FP16 = 16\"],\"ok\":true,\"x\":null},"
    "{\"policy\":\"kivi2:r=128\",\"task\":\"ppl\",\"ctx\":1152,\"value\":13.0,"
    "\"text\":\"A \\\"q\\\"\"},{\"policy\":\"kivi2\",\"task\":\"passkey\",\"ctx\":1024,"
    "\"value\":0.5},{\"policy\":\"kivi2\",\"task\":\"passkey\",\"ctx\":2048,\"value\":1},"
    "{\"policy\":\"minikv\",\"task\":\"vt\",\"ctx\":1024,\"value\":-2e-1}]}";

static void test_evalq(void)
{
    plan_evalq_file_t f;
    CHECK_OK(plan_evalq_parse(report_json, &f));
    CHECK_EQ(f.n_rows, 5);
    CHECK(strstr(f.model, "SmolLM2-135M") != NULL);
    CHECK(!strcmp(f.rows[0].text, "A \"q\""));
    plan_quality_t q;
    plan_evalq_quality(&f, "r.json", "kivi2:r=128", &q);
    CHECK(q.have && q.have_ppl && q.delta_ppl == 2.5 && q.ppl_ctx == 1152);
    CHECK(q.have_acc[0] && q.acc[0] == 0.75 && !q.have_acc[1] && !q.have_acc[2]);
    char buf[160];
    plan_report_quality(&q, buf, sizeof buf);
    CHECK(!strcmp(buf, "dPPL +2.50 (ctx 1152), passkey 0.75"));
    plan_evalq_quality(&f, "r.json", "kivi4:r=128", &q);
    CHECK(!q.have);
    plan_report_quality(&q, buf, sizeof buf);
    CHECK(!strcmp(buf, "n/a"));
    plan_evalq_free(&f);
    const char *bad[] = {"", "{", "{\"a\":}", "{\"a\":1,}", "[1]", "{\"a\":\"\\x\"}",
                         "{\"a\":1} x", "{\"results\":[{\"ctx\":--1}]}"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        CHECK_EQ(plan_evalq_parse(bad[i], &f), -1);
    plan_evalq_find("/nonexistent-dir", "SmolLM2-135M", "fp16", &q);
    CHECK(!q.have);
}

static char *render(int (*fn)(FILE *, const plan_t *, const plan_result_t *, uint32_t),
                    const plan_t *p, const plan_result_t *r, uint32_t n)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *m = open_memstream(&buf, &len);
    CHECK(m != NULL);
    if (!m)
        return NULL;
    CHECK_OK(fn(m, p, r, n));
    fclose(m);
    return buf;
}

static void test_reports(void)
{
    plan_in_t in = smol_in("uniform:130-260,8-32");
    in.weights_bytes = 2.0 * in.model.params;
    in.gpu_bytes = in.weights_bytes + 16e6, in.reserve = 0; /* 3906 pages: ~700 tokens */
    in.curves = 1;
    plan_t p;
    CHECK_OK(plan_init(&in, &p));
    CHECK_EQ(p.n_samples, 4);
    CHECK(p.mean_prompt >= 130 && p.mean_prompt <= 260 && p.mean_out >= 8 && p.mean_out <= 32);
    CHECK(p.len[0][0] != p.len[1][0] || p.len[0][1] != p.len[1][1] ||
          p.len[0][0] != p.len[2][0]); /* drawn, not fixed */
    plan_spec_t sp[2] = {spec("fp16"), spec("kivi2")};
    plan_result_t r[2];
    CHECK_OK(plan_policy(&p, &sp[0], &r[0]));
    CHECK_OK(plan_policy(&p, &sp[1], &r[1]));
    CHECK(r[0].n_curve >= 2 && r[0].curve[0].ctx == 256);
    /* capacity follows the pages per sequence, hence the page bytes per token */
    for (int i = 0; i < 2; i++) {
        CHECK_EQ(r[i].max_seqs, (uint64_t)floor(p.pool_pages / r[i].pages_per_seq));
        CHECK(fabs(r[i].kv_bytes_per_token * (p.mean_prompt + p.mean_out) /
                   (r[i].pages_per_seq * p.page_bytes) - 1) < 1e-9);
    }
    CHECK(r[1].max_seqs > r[0].max_seqs);
    char *s = render(plan_report_json, &p, r, 2);
    CHECK(s && strstr(s, "{\"model\":\"SmolLM2-135M\"") &&
          strstr(s, "\"results\":[{\"policy\":\"fp16\",\"spec\":\"fp16\",\"bytes_per_token\":") &&
          strstr(s, "\"closed_form_bytes_per_token\":23040.0") &&
          strstr(s, "\"policy\":\"kivi2\",\"spec\":\"kivi2:r=128\"") &&
          strstr(s, "\"quality\":\"n/a\""));
    free(s);
    s = render(plan_report_html, &p, r, 2);
    CHECK(s && strstr(s, "<svg") && strstr(s, "<polyline") && strstr(s, "</html>"));
    CHECK(s && !strstr(s, "<script") && !strstr(s, "src=") && !strstr(s, "href=") &&
          !strstr(s, "@import"));
    free(s);
    s = render(plan_report_md, &p, r, 2);
    CHECK(s && strstr(s, "| `kivi2` |"));
    free(s);
    s = render(plan_report_table, &p, r, 2);
    CHECK(s && strstr(s, "max seqs") && strstr(s, "kivi2"));
    free(s);
    plan_spec_destroy(&sp[0]);
    plan_spec_destroy(&sp[1]);
}

/* Round axes (kv_cli_axis, shared with the eval SVG): 1-2-5 steps, the
 * range widened to whole steps, at most max_steps, short labels. */
static void test_axis(void)
{
    struct { double lo, hi; int max; const char *last; } c[] = {
        {0, 121660, 5, "150000"}, {0, 6741, 6, "8000"}, {0, 1, 5, "1.0"},
        {-0.3, 4.54, 5, "6"}, {0, 0.0123, 4, "0.015"}, {0, 23.5, 5, "25"}, {2, 2, 4, "4.0"},
    };
    for (size_t i = 0; i < sizeof c / sizeof c[0]; i++) {
        kv_cli_axis_t a = kv_cli_axis(c[i].lo, c[i].hi, c[i].max);
        CHECK(a.n <= c[i].max && a.n >= 1);
        CHECK(a.lo <= c[i].lo && a.hi >= c[i].hi);
        double m = a.step / pow(10, floor(log10(a.step) + 1e-9));
        CHECK(fabs(m - 1) < 1e-9 || fabs(m - 2) < 1e-9 || fabs(m - 5) < 1e-9);
        CHECK(fabs(a.lo / a.step - round(a.lo / a.step)) < 1e-9);
        CHECK(fabs(a.hi - (a.lo + a.n * a.step)) < 1e-9 * a.step);
        if (c[i].last) {
            char lab[32];
            kv_cli_axis_label(&a, a.n, 1, lab, sizeof lab);
            CHECK(!strcmp(lab, c[i].last));
            if (strcmp(lab, c[i].last))
                fprintf(stderr, "  axis %zu: last label %s, want %s\n", i, lab, c[i].last);
        }
    }
    kv_cli_axis_t a = kv_cli_axis(0, 121660, 5);
    CHECK(a.step == 50000 && a.hi == 150000 && a.n == 3);
    a = kv_cli_axis(-0.3, 4.54, 5); /* -1..5 in steps of 1 would be 6 steps */
    CHECK(a.step == 2 && a.lo == -2 && a.hi == 6 && kv_cli_axis_tick(&a, 1) == 0);
    char lab[32];
    a = kv_cli_axis(0, 2.4e6, 4);
    kv_cli_axis_label(&a, 1, 1e6, lab, sizeof lab);
    CHECK(a.step == 1e6 && !strcmp(lab, "1"));
    a = kv_cli_axis(0, NAN, 4);
    CHECK(a.lo == 0 && a.hi == 1);
}

static void test_bad_input(void)
{
    CHECK(plan_model_find("llama-9") == NULL && plan_gpu_find("h100") == NULL);
    CHECK(plan_gpu_find("h100-80g") != NULL);
    plan_spec_t sp;
    char err[256] = "";
    CHECK_EQ(plan_spec_parse("bogus", &sp, err, sizeof err), KV_EINVAL);
    CHECK(strstr(err, "bogus") != NULL);
    char longspec[PLAN_SPEC_LEN + 8];
    memset(longspec, 'a', sizeof longspec - 1);
    longspec[sizeof longspec - 1] = 0;
    CHECK_EQ(plan_spec_parse(longspec, &sp, err, sizeof err), KV_ERANGE);
    plan_in_t in = smol_in("fixed:10,10");
    plan_t p;
    in.gpu_bytes = 1e9, in.reserve = 0.5, in.weights_bytes = 6e8; /* no pool left */
    CHECK_EQ(plan_init(&in, &p), KV_ERANGE);
    in.weights_bytes = 0;
    in.model.q_heads = 10; /* not a multiple of 3 kv heads */
    CHECK_EQ(plan_init(&in, &p), KV_EINVAL);
    in.model.q_heads = 9, in.model.head_dim = 40;
    CHECK_EQ(plan_init(&in, &p), KV_EINVAL);
    sp = spec("fp16");
    plan_sim_cfg_t c = cfg(&sp, 2, 1, 16);
    plan_foot_t f;
    CHECK_EQ(plan_sim_run(&c, 1, 0, 4, &f), KV_EINVAL);
    c.retain_frac = 0.6;
    CHECK_EQ(plan_sim_run(&c, 1, 4, 4, &f), KV_EINVAL);
    c.retain_frac = 0;
    CHECK_EQ(plan_sim_run(&c, 0, 4, 4, &f), KV_EINVAL);
    c.layers = 1; /* a pool over the store's limit */
    CHECK_EQ(plan_sim_run(&c, 1024, 1u << 20, 0, &f), KV_ERANGE);
    plan_spec_destroy(&sp);
}

int main(void)
{
    test_fp16_bytes_per_token();
    test_int2_list();
    test_max_seqs();
    test_scaling();
    test_crafted_data();
    test_max_ctx();
    test_spec();
    test_evalq();
    test_reports();
    test_axis();
    test_bad_input();
    return kv_test_end();
}
