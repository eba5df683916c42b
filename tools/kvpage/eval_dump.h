/* SPDX-License-Identifier: MIT */
/*
 * eval_dump.h — `kvpage eval --dump-items`: the retrieval items exactly as
 * `kvpage eval` would run them, one JSON object per line (JSON Lines), for
 * other implementations to run the same inputs (bench/kvpress_compare.py).
 *
 * A line is one context: its task, haystack, ctx budget, index in its cell,
 * the generator's spec (seed, depth, units), the context's text and its
 * token ids through the end of the context (chat template included, as
 * kv_tok_chat_split cuts them), and per question its text, answer prefix,
 * expected answer, answer budget and the token ids that follow the context
 * (question, end of the user turn, assistant header, answer prefix). The
 * ids are those `kvpage eval` feeds the model, so a reader needs no
 * tokenizer of its own; the text is there to read and for scoring.
 *
 * Ownership: nothing is kept; the caller owns every argument.
 * Errors: 0, or -1 when the stream is in error after the write.
 */
#ifndef EVAL_DUMP_H
#define EVAL_DUMP_H

#include <stdint.h>
#include <stdio.h>

#include "eval_task.h"

/* One item's prompts: ids[qi] ([n[qi]]) per question, the first n_head of
 * each the context's (the same in every question). */
typedef struct eval_dump_ids {
    const int32_t *ids[EVAL_QUESTIONS];
    uint32_t n[EVAL_QUESTIONS];
    uint32_t n_head;
} eval_dump_ids_t;

/* Write item index k of the cell (spec->kind, ctx, hay_name) as one line. */
int eval_dump_item(FILE *f, const eval_item_spec_t *spec, const char *hay_name, uint32_t ctx,
                   uint32_t k, const eval_item_t *it, const eval_dump_ids_t *ids);

#endif /* EVAL_DUMP_H */
