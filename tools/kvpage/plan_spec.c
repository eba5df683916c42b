/* SPDX-License-Identifier: MIT */
/*
 * plan_spec.c — the policies of `kvpage plan` (see plan_spec.h).
 */
#include "plan_spec.h"

#include <stdio.h>
#include <string.h>

int plan_spec_parse(const char *given, plan_spec_t *out, char *err, size_t err_len)
{
    if (!given || !out)
        return KV_EINVAL;
    if (strlen(given) >= PLAN_SPEC_LEN) {
        snprintf(err, err_len, "policy '%.40s...': longer than %u bytes", given,
                 PLAN_SPEC_LEN - 1);
        return KV_ERANGE;
    }
    eval_policy_t ep;
    int rc = eval_policy_parse(given, &ep, err, err_len);
    if (rc)
        return rc;
    memset(out, 0, sizeof *out);
    snprintf(out->given, sizeof out->given, "%s", given);
    out->ep = ep;
    return 0;
}

void plan_spec_destroy(plan_spec_t *s)
{
    if (s)
        eval_policy_destroy(&s->ep);
}

uint32_t plan_spec_methods(const kv_policy_t *p)
{
    kv_policy_info_t pi;
    return p && !kv_policy_info(p, 1, 0, &pi) ? pi.methods : 0;
}

double plan_spec_value(const kv_policy_t *p, const char *m, const char *k, double dflt)
{
    double v;
    return kv_policy_value(p, m, k, &v) ? dflt : v;
}
