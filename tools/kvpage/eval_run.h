/* SPDX-License-Identifier: MIT */
/*
 * eval_run.h — one policy's run over one input in `kvpage eval`: a fresh
 * store holding one sequence under the policy, the prompt's forward pass
 * (its own, or the reference's replayed), kv_seq_prefill_end, then decode
 * steps (teacher-forced or greedy), each followed by kv_seq_step_end.
 *
 * Prompt sharing. The reference (fp16) runs the prompt through the model
 * and records, per layer, the post-RoPE K/V of every prompt row, the
 * queries the sharing policies need and the logits of the last row
 * (eval_prompt_t). A policy whose prompt pass is FP16's exactly
 * (eval_share_t.shares) then skips the model: its fresh sequence gets the
 * recorded K/V appended chunk by chunk, layer by layer, with the same
 * arguments the forward pass gave kv_append, and the attention calls its
 * statistics come from are made again with the recorded queries: every
 * chunk's (all_rows), the last `rows` rows of each layer's last chunk
 * (rows), or none. Every store call that changes the sequence or its
 * policy state is thus made with the same arguments in the same order as
 * in the policy's own forward pass; the attention calls left out change
 * nothing (their outputs went into the model, whose outputs are the
 * reference's). The run ends bit-identical to an unshared one
 * (tests/model/test_eval_share.c checks every sharing class). Before
 * kv_seq_prefill_end a replayed sequence must hold FP16 pages only
 * (KV_ESTATE otherwise: the policy converted while appending, so its
 * prompt pass was not FP16's).
 *
 * Query-agnostic questions: after kv_seq_prefill_end of a context, each
 * question runs in a fork of the sequence (eval_run_fork, eval_run_ask),
 * so one compression serves several questions, as from a cache.
 *
 * Ownership: eval_run_t owns its store and session (eval_run_close; a fork
 * owns its session only, eval_run_close_fork);
 * eval_prompt_t owns its arrays (eval_prompt_free; reused across inputs).
 * Errors: 0 or a negative KV_E* code; a run that failed is still closed by
 * eval_run_close.
 */
#ifndef EVAL_RUN_H
#define EVAL_RUN_H

#include <stdint.h>

#include "eval_policy.h"
#include "kv_model.h"
#include "kv_tok.h"
#include "kvpage/kvpage.h"

typedef struct eval_env {
    const kv_model_t *m;
    const kv_tok_t *tok;  /* KVzip's reconstruction prompts                */
    uint32_t threads;
    uint32_t forks;   /* sequences a run's store holds beside its own     */
                      /* (eval_run_fork; each sized like the run's)       */
} eval_env_t;

typedef struct eval_run {
    const kv_model_t *m;
    const kv_tok_t *tok;
    kv_store_t *st;
    kv_model_session_t *s;
    kv_seq_id_t seq;
    const int32_t *ids;   /* the prompt (borrowed: the caller's, until     */
    uint32_t n;           /* eval_run_prefill_end), n tokens               */
} eval_run_t;


/* The reference's prompt pass, for replays. */
typedef struct eval_prompt {
    uint32_t n;             /* prompt tokens recorded                        */
    uint32_t chunk;         /* rows per forward chunk                        */
    uint32_t q0;            /* first prompt row whose queries are kept       */
    uint32_t L, QD, KD;     /* layers; floats per row of q and of k / v      */
    float *q;               /* [L][n - q0][QD]                               */
    float *k, *v;           /* [L][n][KD]                                    */
    int32_t *pos;           /* [n]                                           */
    float *logits;          /* [vocab] of the last prompt row                */
    size_t cap_q, cap_k, cap_v, cap_pos, cap_logits; /* elements allocated   */
    uint32_t vocab;
} eval_prompt_t;

void eval_prompt_free(eval_prompt_t *rec);

/* The first prompt row whose queries the sharing policies among pols[0..n)
 * need, for a prompt of n_tokens (n_tokens: none). */
uint32_t eval_prompt_q0(const eval_policy_t *pols, uint32_t n, uint32_t n_tokens);

/* Start a run of p over the prompt ids[0..n) in a fresh store for
 * max_tokens tokens, leaving the last row's logits in logits ([vocab]):
 *   replay != NULL and p shares: from the recording (no forward pass);
 *   else its own forward pass, recorded into record (if not NULL) keeping
 *   queries from row record_q0 on. */
int eval_run_start(const eval_env_t *e, const eval_policy_t *p, const int32_t *ids,
                   uint32_t n, uint32_t max_tokens, const eval_prompt_t *replay,
                   eval_prompt_t *record, uint32_t record_q0, float *logits, eval_run_t *r);
void eval_run_close(eval_run_t *r);

#define EVAL_STEPS_OUT 64 /* most tokens a greedy run keeps */

/* A fork of r's sequence in r's store (kv_model_session_fork: pages shared
 * copy-on-write, the policy state forked), for asking one more question of
 * a compressed context: child->st is r's and not owned; close the child
 * with eval_run_close_fork before r. */
int eval_run_fork(const eval_run_t *r, eval_run_t *child);
void eval_run_close_fork(eval_run_t *child);

/* After the prompt (or context): kv_seq_prefill_end under p; under KVzip
 * first its reconstruction passes over the whole prompt, chat template
 * included (kv_model_kvzip_score, KV_MODEL_KVZIP_CHUNK tokens a pass). */
int eval_run_prefill_end(eval_run_t *r, const eval_policy_t *p);

/* Decode steps, each followed by kv_seq_step_end. */
typedef struct eval_steps {
    const int32_t *force;  /* teacher-forced: step i feeds force[i] and scores */
                           /* force[i + 1] (nll); NULL: greedy                 */
    uint32_t n;            /* forced steps, or most tokens generated           */
    const kv_tok_t *tok;   /* greedy: stop before a control token              */
    float *logits;         /* [vocab]: the prompt's logits in (greedy); then   */
                           /* each step's                                      */
    /* Called before step i with the logits so far; nonzero aborts. */
    int (*before)(void *user, uint32_t i, const float *logits);
    void *user;
    double nll;            /* out: summed over the forced steps                */
    int32_t out[EVAL_STEPS_OUT]; /* out: greedy tokens                         */
    uint32_t n_out;
} eval_steps_t;

int eval_run_steps(eval_run_t *r, const eval_policy_t *p, eval_steps_t *s);

/* A question after kv_seq_prefill_end: ids[0..n) through the model as one
 * chunk (its logits into s->logits), one kv_seq_step_end, then greedy
 * eval_run_steps. */
int eval_run_ask(eval_run_t *r, const eval_policy_t *p, const int32_t *ids, uint32_t n,
                 eval_steps_t *s);

#endif /* EVAL_RUN_H */
