/* SPDX-License-Identifier: MIT */
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
#include <stdint.h>

#include "kvpage/kvpage.h"

/* How a policy's prompt pass relates to FP16's, from its methods and keys
 * (kv_policy_info, kv_policy_value; docs/eval.md argues each case against
 * store/kv_policy_*.c):
 *   shares    the prompt pass is FP16's exactly: every page stays FP16 and
 *             nothing is evicted, merged or converted before
 *             kv_seq_prefill_end (every selection method, SimLayerKV and
 *             MiniCache without a format part). Not: a format part without
 *             a selection (KIVI converts while the prompt is appended:
 *             kivi2/4, int2/4, simlayerkv+kivi*, minicache+int4), and any
 *             method this table does not know.
 *   all_rows  the policy sums statistics over every prompt row
 *             (accumulated attention: h2o, minikv, cam; query moments:
 *             eattn w=0)
 *   rows      else: it keeps the statistics of the last `rows` query rows of
 *             each layer's last prefill call (snapkv: w; eattn: w > 0;
 *             simlayerkv mode=prefill: rows); 0: it collects nothing from
 *             the prompt */
typedef struct eval_share {
    int shares;
    int all_rows;
    uint32_t rows;
} eval_share_t;

typedef struct eval_policy {
    char spec[256];      /* the canonical spec (kv_policy_describe)  */
                         /* + "@i8" with KV_CONFIG_INT8_ATTN          */
    kv_policy_t *policy; /* owned                                    */
    eval_share_t share;  /* eval_policy_share(policy)                */
    uint32_t store_flags; /* kv_config_t.flags of its stores         */
    int kvzip;           /* 1: KVzip: reconstruction passes before   */
                         /* kv_seq_prefill_end (eval_run.h)          */
} eval_policy_t;

/* The eval-only suffix of a spec: "kivi2@i8" runs kivi2 on a store
 * created with KV_CONFIG_INT8_ATTN (approximate int8 attention over INT
 * pages), so one report compares it with "kivi2". */
#define EVAL_POLICY_I8 "@i8"

/* Parse spec (with EVAL_POLICY_I8 or not); KV_EINVAL with the store's
 * message in err for a bad one. */
int eval_policy_parse(const char *spec, eval_policy_t *out, char *err, size_t err_len);
/* The sharing class of a parsed policy (eval_share_t). */
eval_share_t eval_policy_share(const kv_policy_t *policy);
void eval_policy_destroy(eval_policy_t *p);

/* Before the sequence's first append. */
int eval_policy_attach(const eval_policy_t *p, kv_store_t *st, kv_seq_id_t seq);
/* After the prompt's forward pass. */
int eval_policy_prefill_end(const eval_policy_t *p, kv_store_t *st, kv_seq_id_t seq);
/* After each decode step. */
int eval_policy_step_end(const eval_policy_t *p, kv_store_t *st, kv_seq_id_t seq);

#endif /* EVAL_POLICY_H */
