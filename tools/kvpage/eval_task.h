/* SPDX-License-Identifier: MIT */
/*
 * eval_task.h — the retrieval items of `kvpage eval`, as text: generators for
 * passkey retrieval, multi-key needle-in-a-haystack and RULER-style variable
 * tracking, the fitting of an item to a token budget, and the exact-match
 * scorer. No model here: token counts come from a caller's callback, so the
 * whole file is testable without the GGUF (tests/model/test_eval_task.c).
 *
 * Invariants: an item is a pure function of its spec (kind, seed, n_units,
 * depth); the same spec gives byte-identical text on every machine (splitmix64,
 * no locale, no floating point in placement) and haystack. The haystack
 * (eval_hay.h) gives the units: the filler's five sentences cycled from the
 * first, or a real text's sentences from a start the seed picks (wrapping
 * around at its end).
 *
 * An item is a context asked one or two questions (eval_item_spec_t.
 * questions): `kvpage eval` either appends each question after the context
 * was compressed (query-agnostic) or prefills context + question whole
 * (query-aware).
 *
 * Ownership: eval_item_t owns its user text (malloc); eval_item_free frees it.
 * Errors: 0 or a negative KV_E* code; on error *out is left empty (user NULL).
 */
#ifndef EVAL_TASK_H
#define EVAL_TASK_H

#include <stddef.h>
#include <stdint.h>

#include "eval_hay.h"

typedef enum eval_task_kind {
    EVAL_TASK_PASSKEY = 0, /* one 5-digit key at depth d                   */
    EVAL_TASK_NEEDLE  = 1, /* EVAL_NEEDLES key/value needles, one asked    */
    EVAL_TASK_VT      = 2, /* chain X1 = v, X2 = X1, ...; name all of them */
    EVAL_TASK_COUNT   = 3,
} eval_task_kind_t;

#define EVAL_NEEDLES 4u    /* needles in a needle item                       */
#define EVAL_VT_VARS 5u    /* variables in a variable-tracking chain          */
#define EVAL_ANSWER_MAX 64 /* bytes of eval_question_t.answer, NUL included   */
#define EVAL_QUESTIONS 2u  /* most questions asked of one context             */

typedef struct eval_item_spec {
    eval_task_kind_t kind;
    uint64_t seed;      /* everything random (keys, names, other needles)     */
    const eval_hay_t *hay; /* the haystack's units; NULL: the filler       */
    uint32_t n_units;   /* haystack units (sentences) in the item             */
    uint32_t depth_pct; /* 0..100: where the first question's needle          */
                        /* (passkey, needle) or chain start (vt) sits         */
    uint32_t questions; /* questions asked of the context, 1..EVAL_QUESTIONS  */
                        /* (0 counts as 1). With 1 the item is the classic    */
                        /* one; with 2 a second fact is planted (passkey: a   */
                        /* vault number at depth +-50; needle: the question   */
                        /* asks a second of its needles; vt: a second chain   */
                        /* from depth +-50) and asked separately              */
} eval_item_spec_t;

/* One question about the context, and its answer. */
typedef struct eval_question {
    char text[192];               /* appended to the context in the user turn, */
                                  /* separator ("\n\n") included, NUL-ended   */
    char prime[160];              /* assistant's answer prefix (after the chat */
                                  /* template), NUL-terminated                 */
    char answer[EVAL_ANSWER_MAX]; /* passkey/needle: the digits; vt: the names */
                                  /* separated by single spaces                */
    uint32_t max_new;             /* tokens worth generating for the answer    */
    uint32_t depth_pct;           /* where its fact sits (0..100)              */
} eval_question_t;

/* An item: a context (instruction + haystack) and the questions asked of
 * it. The user message of question i is user + q[i].text. */
typedef struct eval_item {
    char *user;                   /* the context, NUL-terminated (malloc)      */
    size_t user_len;              /* bytes                                     */
    eval_question_t q[EVAL_QUESTIONS];
    uint32_t n_q;                 /* questions in q, >= 1                      */
} eval_item_t;

/* The task's name as used on the command line and in reports
 * ("passkey", "needle", "vt"); NULL outside the enum. */
const char *eval_task_name(eval_task_kind_t kind);
/* The kind named by name[0..len), or KV_EINVAL. */
int eval_task_parse(const char *name, size_t len, eval_task_kind_t *out);

/* Build the item of spec. Errors: KV_EINVAL (NULL, kind, depth > 100),
 * KV_ENOMEM. */
int eval_item_make(const eval_item_spec_t *spec, eval_item_t *out);
void eval_item_free(eval_item_t *it);

/* Tokens the longest whole prompt of it takes (chat template + context +
 * question + prime, over its questions), or a negative KV_E* code. */
typedef long (*eval_count_fn)(void *user, const eval_item_t *it);

/* Make the item of spec with the most filler units whose prompt takes at most
 * target tokens (spec->n_units is ignored; the chosen value is written back
 * into spec). Errors: those of make and count, KV_ERANGE (target too small
 * for the item without filler). */
int eval_item_fit(eval_item_spec_t *spec, uint32_t target, eval_count_fn count,
                  void *user, eval_item_t *out, uint32_t *n_tokens);

/* 1 if gen[0..len) answers q exactly, else 0. passkey/needle: the first run
 * of digits in gen equals the key; vt: every chain variable appears in gen
 * as a whole word (letters/digits not adjacent). */
int eval_item_score(const eval_question_t *q, const char *gen, size_t len);

/* splitmix64: the generators' random stream (also for deriving item seeds). */
uint64_t eval_mix64(uint64_t *state);

#endif /* EVAL_TASK_H */
