/* SPDX-License-Identifier: MIT */
/*
 * eval_report.h — the results of `kvpage eval` and their three renderings:
 * JSON (machines), a Markdown table (people), an SVG plot of quality against
 * KV bytes (self-contained, hand-written).
 *
 * The report borrows every array and string (the caller owns them and keeps
 * them alive while writing). Writers return 0 or -errno of the failed write.
 * Ratios: `ratio` is the fp16 policy's KV bytes for the same task, ctx (and
 * text) over the cell's; `ratio_held` is the cell's fp16_bytes / kv_bytes
 * (eval_report.c). policies[0] must be "fp16".
 *
 * Spread: each accuracy comes with its 95% Wilson interval (eval_wilson);
 * ΔPPL (policy - fp16 on the same text) with its mean, min and max over
 * the texts.
 */
#ifndef EVAL_REPORT_H
#define EVAL_REPORT_H

#include <stdint.h>
#include <stdio.h>

#include "eval_hay.h"
#include "kvpage/kvpage.h"

#define EVAL_RES_PPL (-1) /* eval_result_t.task for perplexity; else eval_task_kind_t */

typedef struct eval_text {
    const char *name;      /* as given to --texts                          */
    char path[512];        /* the file read                                */
    char sha256[65];       /* lowercase hex of the whole file              */
    uint64_t bytes;        /* file size                                    */
    uint32_t tokens;       /* tokens of the whole file                     */
} eval_text_t;

/* One (policy, task, ctx[, text]) cell. Byte counts: kv_store_stats at the
 * end of each item's prefill + decode (one sequence in the store), averaged
 * over the cell's items. */
typedef struct eval_result {
    uint32_t policy;       /* index into eval_report_t.policies            */
    int task;              /* EVAL_RES_PPL or an eval_task_kind_t          */
    uint32_t ctx;          /* ppl: P + G; retrieval: the token budget      */
    uint32_t text;         /* ppl: index into texts                        */
    uint32_t hay;          /* retrieval: index into hays                   */
    double value;          /* ppl: perplexity; retrieval: accuracy 0..1    */
    double nll;            /* ppl: mean NLL (nats) over the G tokens       */
    uint32_t n_items, n_correct; /* retrieval                              */
    uint64_t kv_bytes, fp16_bytes, meta_bytes;
    uint32_t formats;      /* bit f set: pages of kv_format_t f were held  */
} eval_result_t;

/* One retrieval item of one policy. */
typedef struct eval_item_rec {
    uint32_t policy;
    int task;
    uint32_t ctx;          /* the budget                                    */
    uint32_t tokens;       /* prompt tokens it got                          */
    uint32_t depth_pct;    /* where the asked fact sits                     */
    uint32_t question;     /* which question of the context (0-based)       */
    uint32_t hay;          /* index into hays                               */
    int ok;                /* exact match                                   */
    char expect[64];       /* the answer                                    */
    char got[96];          /* the generated text (truncated)                */
} eval_item_rec_t;

/* Per-layer relative error of the attention output against FP16. */
typedef struct eval_fidelity {
    uint32_t policy;
    uint32_t text;
    uint32_t rows;         /* decode rows compared                          */
    const double *rel_err; /* [n_layers]                                    */
} eval_fidelity_t;

typedef struct eval_report {
    const char *model;               /* path of the GGUF                   */
    const char *model_sha256;        /* pinned hash, or NULL               */
    const char *const *policies;     /* [n_policies]; 0 is "fp16"          */
    uint32_t n_policies;
    uint32_t n_layers;
    uint64_t seed;
    uint32_t ppl_prefill, ppl_gen, threads;
    double wall_s;
    const eval_text_t *texts;
    uint32_t n_texts;
    const eval_result_t *results;
    uint32_t n_results;
    const eval_item_rec_t *items;
    uint32_t n_items;
    const eval_fidelity_t *fidelity;
    uint32_t n_fidelity;
    const eval_hay_t *hays;          /* retrieval haystacks                 */
    uint32_t n_hays;
    uint32_t items_per_cell;         /* --items                             */
    int shared;                      /* 1: prompt passes were shared        */
    const char *setting;             /* retrieval: "query-agnostic" or      */
                                     /* "query-aware"; NULL: no retrieval   */
    uint32_t questions;              /* retrieval questions per context     */
} eval_report_t;

/* The cell ratios (file comment of eval_report.c): `ratio`, KV bytes of the
 * fp16 policy (index 0) for x's task, ctx (and text or
 * haystack) over x's KV bytes,
 * and `ratio_held`, fp16_bytes / kv_bytes of the cell; 0 when there is no
 * such cell or no bytes. */
double eval_report_ratio(const eval_report_t *r, const eval_result_t *x);
double eval_report_ratio_held(const eval_result_t *x);

/* The 95% Wilson score interval of k successes in n trials (z = 1.96):
 * [lo, hi] within [0, 1]; n == 0 gives [0, 1]. */
void eval_wilson(uint32_t k, uint32_t n, double *lo, double *hi);

int eval_report_json(FILE *f, const eval_report_t *r);
int eval_report_md(FILE *f, const eval_report_t *r);
int eval_report_svg(FILE *f, const eval_report_t *r);

#endif /* EVAL_REPORT_H */
