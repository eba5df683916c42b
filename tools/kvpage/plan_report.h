/* SPDX-License-Identifier: MIT */
/*
 * plan_report.h — the renderings of a `kvpage plan`: a plain table (people
 * at a terminal), JSON (machines), Markdown, and a self-contained HTML page
 * with inline SVG charts (capacity per policy as bars, KV bytes per token
 * against context as lines; no external resources).
 *
 * Every writer takes the plan (plan_calc.h) and its results in policy
 * order; the first policy is the reference of the "x first" ratios. They
 * borrow everything and return 0 or -errno of a failed write.
 */
#ifndef PLAN_REPORT_H
#define PLAN_REPORT_H

#include <stdint.h>
#include <stdio.h>

#include "plan_calc.h"

int plan_report_table(FILE *f, const plan_t *p, const plan_result_t *r, uint32_t n);
int plan_report_json(FILE *f, const plan_t *p, const plan_result_t *r, uint32_t n);
int plan_report_md(FILE *f, const plan_t *p, const plan_result_t *r, uint32_t n);
int plan_report_html(FILE *f, const plan_t *p, const plan_result_t *r, uint32_t n);

/* Shared by the writers (plan_report.c). */
/* "ΔPPL +0.29 (ctx 1152), passkey 0.67, needle 0.33, vt 0.00" or "n/a". */
void plan_report_quality(const plan_quality_t *q, char *buf, size_t len);
/* The lines above the table (model, GPU and pool, workload), each ending
 * in '\n', with `prefix` before each line. */
void plan_report_setup(FILE *f, const plan_t *p, const char *prefix);
/* The notes below the table (method, per-policy simulation and assumptions). */
void plan_report_notes(FILE *f, const plan_t *p, const plan_result_t *r, uint32_t n,
                       const char *bullet);
const char *plan_report_ctx_method(plan_ctx_method_t m);
/* The "max ctx" cell (seqs 0: "4096 (cap)" when capped at the trained
 * context) or the "seqs@ctx" cell (seqs 1: "-" without a trained context)
 * into buf; returns buf. */
char *plan_report_ctx(const plan_t *p, const plan_result_t *r, int seqs, char buf[32]);

#endif /* PLAN_REPORT_H */
