/*
 * eval_policy.c — `kvpage eval`'s policies over the store's policy API (see
 * eval_policy.h).
 */
#include "eval_policy.h"

#include <stdio.h>
#include <string.h>

int eval_policy_parse(const char *spec, eval_policy_t *out, char *err, size_t err_len)
{
    if (!spec || !out)
        return KV_EINVAL;
    kv_policy_t *p = NULL;
    char msg[200] = "";
    int rc = kv_policy_parse(spec, &p, msg, sizeof msg);
    if (rc) {
        if (err && err_len)
            snprintf(err, err_len, "policy '%s': %s", spec, msg);
        return rc;
    }
    *out = (eval_policy_t){.policy = p};
    if (kv_policy_describe(p, out->spec, sizeof out->spec))
        snprintf(out->spec, sizeof out->spec, "%s", spec);
    return 0;
}

void eval_policy_destroy(eval_policy_t *p)
{
    if (p) {
        kv_policy_destroy(p->policy);
        p->policy = NULL;
    }
}

int eval_policy_attach(const eval_policy_t *p, kv_store_t *st, kv_seq_id_t seq)
{
    return p ? kv_seq_set_policy(st, seq, p->policy) : KV_EINVAL;
}

int eval_policy_prefill_end(const eval_policy_t *p, kv_store_t *st, kv_seq_id_t seq)
{
    return p ? kv_seq_prefill_end(st, seq) : KV_EINVAL;
}

int eval_policy_step_end(const eval_policy_t *p, kv_store_t *st, kv_seq_id_t seq)
{
    return p ? kv_seq_step_end(st, seq) : KV_EINVAL;
}
