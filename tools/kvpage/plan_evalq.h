/* SPDX-License-Identifier: MIT */
/*
 * plan_evalq.h — the quality cost `kvpage plan` shows beside a policy,
 * read from the JSON reports of `kvpage eval` (tools/kvpage/eval_report.c,
 * e.g. docs/results/eval-1k-all.json).
 *
 * Only what is needed is read, by a small JSON scanner: the top-level
 * "model" (the GGUF path the evaluation ran on) and, in "results", each
 * row's "policy", "task" ("ppl", "passkey", "needle", "vt"), "ctx", "text"
 * and "value" (perplexity, or accuracy 0..1). Everything else is skipped.
 * A row belongs to a policy when its spec parses to the same canonical
 * spec (kv_policy_describe), so "kivi2" matches "kivi2:r=128".
 *
 * Quality of one policy in one report: the perplexity and its difference
 * to the fp16 row of the same text and ctx (averaged over texts), and the
 * mean accuracy of each retrieval task over its ctx rows.
 *
 * Ownership: plan_evalq_file_t owns its rows (plan_evalq_free). Errors are
 * 0 / -1 (malformed JSON, out of memory); nothing is printed.
 */
#ifndef PLAN_EVALQ_H
#define PLAN_EVALQ_H

#include <stddef.h>
#include <stdint.h>

#define PLAN_EVALQ_TASKS 3 /* passkey, needle, vt */

typedef struct plan_evalq_row {
    char policy[256];
    char task[16];
    char text[64];
    double ctx, value;
} plan_evalq_row_t;

typedef struct plan_evalq_file {
    char model[512];           /* top-level "model"                      */
    plan_evalq_row_t *rows;    /* [n_rows], owned                        */
    size_t n_rows;
} plan_evalq_file_t;

typedef struct plan_quality {
    int have;                  /* 0: no result for this policy (n/a)     */
    char file[256];            /* the report's file name                 */
    int have_ppl;
    double ppl_ctx;            /* prefill + scored tokens of the ppl rows */
    double ppl, delta_ppl;     /* mean over texts; delta vs fp16         */
    int have_acc[PLAN_EVALQ_TASKS];
    double acc[PLAN_EVALQ_TASKS]; /* passkey, needle, vt: mean accuracy  */
} plan_quality_t;

extern const char *const plan_evalq_tasks[PLAN_EVALQ_TASKS];

/* Parse a NUL-terminated JSON report. 0, or -1 (out is then empty). */
int plan_evalq_parse(const char *json, plan_evalq_file_t *out);
void plan_evalq_free(plan_evalq_file_t *f);

/* Quality of the policy whose canonical spec is canon in report f
 * (q->have = 0 when f has no row of it). file is copied into q->file. */
void plan_evalq_quality(const plan_evalq_file_t *f, const char *file, const char *canon,
                        plan_quality_t *q);

/* Over the files eval-*.json in dir, newest (modification time, then name
 * descending) first: the quality from the first report that ran on `model`
 * (its "model" path contains the name, case-insensitively) and has a
 * perplexity for the policy; failing that, the first that has any result
 * for it. q->have = 0 when none does (or dir cannot be read). */
void plan_evalq_find(const char *dir, const char *model, const char *canon,
                     plan_quality_t *q);

#endif /* PLAN_EVALQ_H */
