/* SPDX-License-Identifier: MIT */
/*
 * test_eval_report.c — the ratio columns of `kvpage eval`'s report
 * (tools/kvpage/eval_report.c, from the kvtool library with the task
 * module it names tasks with). Needs no model file.
 *
 * A synthetic report: fp16, an evicting policy (h2o: 4x fewer bytes, all
 * FP16) and a quantizing one (kivi2: 4x fewer bytes, 4x denser), perplexity
 * on two texts with different fp16 bytes and passkey at two contexts.
 * Checks: `ratio` is the fp16 cell of the same task/ctx/text over the
 * cell's bytes (4x for both policies, 1x for fp16; the ctx-2048 and text-1
 * cells use their own fp16 cells), `ratio_held` is fp16_bytes / kv_bytes
 * (1x for h2o, 4x for kivi2), in the JSON, the summary table, the
 * perplexity and retrieval tables; a cell without an fp16 counterpart
 * shows "-". Also: 95% Wilson intervals against independently computed
 * values, ΔPPL mean/min/max over texts (JSON summary, Markdown), the
 * haystack and interval of each retrieval cell, and the plot's bars.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kv_test.h"
#include "tools/kvpage/kv_cli.h"
#include "tools/kvpage/eval_hay.h"
#include "tools/kvpage/eval_report.h"
#include "tools/kvpage/eval_task.h"

static const char *const POLICIES[] = {"fp16", "h2o", "kivi2"};

/* fp16 bytes of each cell: ppl text 0, ppl text 1, passkey 1024, 2048 */
static const uint64_t FP16_KV[4] = {4000, 8000, 1600, 3200};

static uint32_t fill(eval_result_t *res)
{
    uint32_t n = 0;
    for (uint32_t p = 0; p < 3; p++)
        for (uint32_t c = 0; c < 4; c++) {
            eval_result_t *x = &res[n++];
            memset(x, 0, sizeof *x);
            x->policy = p;
            x->task = c < 2 ? EVAL_RES_PPL : (int)EVAL_TASK_PASSKEY;
            x->text = c < 2 ? c : 0;
            x->ctx = c < 2 ? 1152 : (c == 2 ? 1024 : 2048);
            x->value = c < 2 ? 10.0 + p * (c + 1.0) : 1.0; /* ΔPPL: p on a, 2p on b */
            x->n_items = x->n_correct = c < 2 ? 0 : 3;
            x->kv_bytes = p == 0 ? FP16_KV[c] : FP16_KV[c] / 4;
            x->fp16_bytes = p == 2 ? FP16_KV[c] : x->kv_bytes; /* kivi2 4x denser */
            x->formats = 1u << (p == 2 ? KV_FMT_INT2 : KV_FMT_FP16);
        }
    /* one h2o cell at a ctx fp16 never ran */
    res[n] = res[4 + 3];
    res[n].ctx = 4096;
    return n + 1;
}

static char *render(int (*w)(FILE *, const eval_report_t *), const eval_report_t *r)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (!f)
        exit(2);
    CHECK_OK(w(f, r));
    fclose(f);
    return buf;
}

int main(void)
{
    eval_result_t res[16];
    eval_text_t texts[2] = {{.name = "a", .path = "/a", .sha256 = "00"},
                            {.name = "b", .path = "/b", .sha256 = "11"}};
    eval_hay_t hay = {.kind = EVAL_HAY_FILLER};
    eval_report_t r = {.model = "m", .policies = POLICIES, .n_policies = 3,
                       .texts = texts, .n_texts = 2, .results = res, .hays = &hay,
                       .n_hays = 1};
    r.n_results = fill(res);

    /* Wilson intervals (z = 1.96), against values computed independently */
    static const struct { uint32_t k, n; double lo, hi; } W[] = {
        {3, 3, 0.4385, 1.0}, {9, 9, 0.7009, 1.0}, {5, 10, 0.2366, 0.7634},
        {20, 20, 0.8389, 1.0}, {0, 20, 0.0, 0.1611}, {19, 20, 0.7639, 0.9911},
        {1, 4, 0.0456, 0.6994}, {0, 0, 0.0, 1.0}};
    for (size_t i = 0; i < sizeof W / sizeof W[0]; i++) {
        double lo, hi;
        eval_wilson(W[i].k, W[i].n, &lo, &hi);
        CHECK(fabs(lo - W[i].lo) < 5e-5 && fabs(hi - W[i].hi) < 5e-5);
    }

    CHECK(eval_report_ratio(&r, &res[0]) == 1.0);
    for (uint32_t i = 4; i < 12; i++)
        CHECK(eval_report_ratio(&r, &res[i]) == 4.0);
    CHECK(eval_report_ratio_held(&res[4]) == 1.0 && eval_report_ratio_held(&res[8]) == 4.0);
    CHECK(eval_report_ratio(&r, &res[12]) == 0.0);

    char *js = render(eval_report_json, &r);
    CHECK(strstr(js, "\"policy\":\"h2o\",\"task\":\"ppl\",\"ctx\":1152,\"value\":11,"
                     "\"text\":\"a\",\"nll\":0.000000,\"dppl\":1,\"kv_bytes\":1000,"
                     "\"fp16_bytes\":1000,\"meta_bytes\":0,\"ratio\":4.0000,"
                     "\"ratio_held\":1.0000") != NULL);
    CHECK(strstr(js, "\"policy\":\"kivi2\",\"task\":\"passkey\",\"ctx\":2048,\"value\":1,"
                     "\"haystack\":\"filler\",\"items\":3,\"correct\":3,"
                     "\"ci95\":[0.4385,1.0000],\"kv_bytes\":800,\"fp16_bytes\":3200,"
                     "\"meta_bytes\":0,\"ratio\":4.0000,\"ratio_held\":4.0000") != NULL);
    CHECK(strstr(js, "\"ctx\":4096,\"value\":1,\"haystack\":\"filler\",\"items\":3,"
                     "\"correct\":3,\"ci95\":[0.4385,1.0000],\"kv_bytes\":800,"
                     "\"fp16_bytes\":800,\"meta_bytes\":0,\"ratio\":0.0000") != NULL);
    /* per policy: ΔPPL over the two texts (1 and 2), passkey over 9 items */
    CHECK(strstr(js, "\"summary\":[{\"policy\":\"fp16\",\"kv_bytes\":4000,\"ratio\":1.0000,"
                     "\"dppl\":{\"mean\":0,\"min\":0,\"max\":0,\"texts\":2}") != NULL);
    CHECK(strstr(js, "{\"policy\":\"h2o\",\"kv_bytes\":1000,\"ratio\":4.0000,"
                     "\"dppl\":{\"mean\":1.5,\"min\":1,\"max\":2,\"texts\":2},"
                     "\"passkey\":{\"correct\":9,\"items\":9,\"acc\":1.0000,"
                     "\"ci95\":[0.7009,1.0000]},\"retrieval\":{\"correct\":9,\"items\":9,") != NULL);
    CHECK(strstr(js, "\"dppl\":{\"mean\":3,\"min\":2,\"max\":4,\"texts\":2}") != NULL);
    free(js);

    char *md = render(eval_report_md, &r);
    CHECK(strstr(md, "| policy | KV bytes | ratio vs fp16 | held ratio (formats held) |") != NULL);
    CHECK(strstr(md, "| fp16 | 4000 | 1.00x | 1.00x (FP16 = 16 bits/element) |") != NULL);
    CHECK(strstr(md, "| h2o | 1000 | 4.00x | 1.00x (FP16 = 16 bits/element) |") != NULL);
    CHECK(strstr(md, "| kivi2 | 1000 | 4.00x | 4.00x (INT2 g16 = 4 bits/element) |") != NULL);
    CHECK(strstr(md, "| h2o | 1000 | 4.00x | 1.00x (FP16 = 16 bits/element) | +1.5000 "
                     "[+1.0000, +2.0000] (2) | 1.00 [0.70, 1.00] | - | - |") != NULL);
    CHECK(strstr(md, "| h2o | /b | 11… | 12.0000 | +2.0000 | 0.00000 | 2000 | 2000 | 4.00x |") !=
          NULL);
    CHECK(strstr(md, "| h2o | passkey | filler | 2048 | 3 / 3 | 1.00 [0.44, 1.00] | 800 | 4.00x "
                     "| 1.00x |") != NULL);
    CHECK(strstr(md, "| h2o | passkey | filler | 4096 | 3 / 3 | 1.00 [0.44, 1.00] | 800 | - | "
                     "1.00x |") != NULL);
    free(md);

    /* the plot: a bar per point (ΔPPL min..max, Wilson), both panels */
    char *svg = render(eval_report_svg, &r);
    CHECK(strstr(svg, "bar min..max over texts") != NULL && strstr(svg, "95% Wilson") != NULL);
    size_t bars = 0;
    for (const char *q = svg; (q = strstr(q, "stroke=\"#1f6fb4\"")); q++)
        bars++; /* only the bars are drawn in that colour */
    CHECK_EQ(bars, 6); /* 3 policies x 2 panels */
    free(svg);
    return kv_test_end();
}
