/*
 * eval_policy.h — what `kvpage eval` calls a policy: a spec string parsed by
 * the store (kv_policy_parse: "fp16", "kivi4", "kivi2", "minicache",
 * "h2o:hh=0.1,rw=0.1+cam", ...; docs/policies.md), attached to a store
 * sequence before its first append (kv_seq_set_policy), told when the prompt
 * is in (kv_seq_prefill_end) and when each decode step is done
 * (kv_seq_step_end). A thin wrapper, so the evaluation has one path for
 * every spec.
 *
 * Ownership: eval_policy_t owns its parsed kv_policy_t (eval_policy_destroy
 * frees it; a zeroed struct is safe to destroy). Errors: 0 or a negative
 * KV_E* code.
 */
#ifndef EVAL_POLICY_H
#define EVAL_POLICY_H

#include <stddef.h>

#include "kvpage/kvpage.h"

typedef struct eval_policy {
    char spec[256];      /* the canonical spec (kv_policy_describe)  */
    kv_policy_t *policy; /* owned                                    */
} eval_policy_t;

/* Parse spec; KV_EINVAL with the store's message in err for a bad one. */
int eval_policy_parse(const char *spec, eval_policy_t *out, char *err, size_t err_len);
void eval_policy_destroy(eval_policy_t *p);

/* Before the sequence's first append. */
int eval_policy_attach(const eval_policy_t *p, kv_store_t *st, kv_seq_id_t seq);
/* After the prompt's forward pass. */
int eval_policy_prefill_end(const eval_policy_t *p, kv_store_t *st, kv_seq_id_t seq);
/* After each decode step. */
int eval_policy_step_end(const eval_policy_t *p, kv_store_t *st, kv_seq_id_t seq);

#endif /* EVAL_POLICY_H */
