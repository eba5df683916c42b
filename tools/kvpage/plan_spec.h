/*
 * plan_spec.h — what `kvpage plan` reads from a policy's canonical spec.
 *
 * The canonical spec (kv_policy_describe: "method:key=value,...+method...")
 * is the only view of a policy the tool has (the parsed kv_policy_t is
 * opaque). plan_spec_* read methods and keys from it: which data the
 * simulation must craft (SimLayerKV's lazy layers, MiniCache's retained
 * tokens), when attention statistics are needed, and the closed form.
 *
 * A spec is parsed as `kvpage eval` parses its policies (eval_policy.h):
 * the same messages, the same canonical form.
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

/* 1 when the canonical spec has method m ("minicache", "int4", ...). */
int plan_spec_has(const char *canon, const char *m);
/* The value of key k of method m, or dflt when the spec has no such key. */
double plan_spec_num(const char *canon, const char *m, const char *k, double dflt);
/* The format method of the spec: "kivi2", "kivi4", "int2", "int4", or NULL. */
const char *plan_spec_format(const char *canon);

#endif /* PLAN_SPEC_H */
