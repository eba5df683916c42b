/* SPDX-License-Identifier: MIT */
/*
 * plan_spec.h — the policies `kvpage plan` compares.
 *
 * A spec is parsed as `kvpage eval` parses its policies (eval_policy.h):
 * the same messages, the same canonical form (kv_policy_describe), which
 * the report prints and the quality lookup matches. What the plan needs to
 * know about a policy (which methods, a key's value, budgets, formats) it
 * asks the library (kv_policy_info, kv_policy_value); nothing here reads
 * the spec's text.
 *
 * Ownership: plan_spec_t owns its parsed policy (plan_spec_destroy; a
 * zeroed struct is safe to destroy).
 */
#ifndef PLAN_SPEC_H
#define PLAN_SPEC_H

#include <stddef.h>
#include <stdint.h>

#include "eval_policy.h"
#include "kvpage/kvpage.h"

#define PLAN_SPEC_LEN 512u  /* bytes of a given spec, with the NUL */
#define PLAN_MAX_POLICIES 16u

typedef struct plan_spec {
    char given[PLAN_SPEC_LEN]; /* as typed in --policies                  */
    eval_policy_t ep;          /* owned: ep.spec the canonical spec       */
                               /* (kv_policy_describe), ep.policy parsed  */
} plan_spec_t;

/* Parse one spec (kv_policy_parse) and describe it. KV_EINVAL with the
 * store's message in err for a bad spec, KV_ERANGE for one of
 * PLAN_SPEC_LEN bytes or more. */
int plan_spec_parse(const char *given, plan_spec_t *out, char *err, size_t err_len);
void plan_spec_destroy(plan_spec_t *s);

/* The policy's methods (KV_POLICY_* bits of kv_policy_info), 0 for NULL. */
uint32_t plan_spec_methods(const kv_policy_t *p);
/* The value of key k of method m (kv_policy_value), or dflt when the policy
 * does not have m (or m has no key k). */
double plan_spec_value(const kv_policy_t *p, const char *m, const char *k, double dflt);

#endif /* PLAN_SPEC_H */
