/* SPDX-License-Identifier: MIT */
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
    char msg[200] = "", base[256];
    const size_t n = strlen(spec), ns = sizeof EVAL_POLICY_I8 - 1;
    const int i8 = n > ns && !strcmp(spec + n - ns, EVAL_POLICY_I8);
    if (n - (i8 ? ns : 0) >= sizeof base) {
        if (err && err_len)
            snprintf(err, err_len, "policy '%.40s...': too long", spec);
        return KV_EINVAL;
    }
    snprintf(base, sizeof base, "%.*s", (int)(n - (i8 ? ns : 0)), spec);
    int rc = kv_policy_parse(base, &p, msg, sizeof msg);
    if (rc) {
        if (err && err_len)
            snprintf(err, err_len, "policy '%s': %s", spec, msg);
        return rc;
    }
    *out = (eval_policy_t){.policy = p, .store_flags = i8 ? KV_CONFIG_INT8_ATTN : 0};
    if (kv_policy_describe(p, out->spec, sizeof out->spec - ns))
        snprintf(out->spec, sizeof out->spec - ns, "%.*s", (int)(sizeof out->spec - ns - 1), base);
    if (i8)
        strcat(out->spec, EVAL_POLICY_I8);
    out->share = eval_policy_share(p);
    kv_policy_info_t in;
    out->kvzip = !kv_policy_info(p, 1, 0, &in) && (in.methods & KV_POLICY_KVZIP);
    return 0;
}

/* *rows = max(*rows, key of method) when the policy has it */
static void rows_max(const kv_policy_t *p, const char *method, const char *key, uint32_t *rows)
{
    double v;
    if (!kv_policy_value(p, method, key, &v) && v > *rows)
        *rows = (uint32_t)v;
}

eval_share_t eval_policy_share(const kv_policy_t *p)
{
    const uint32_t fmt = KV_POLICY_KIVI2 | KV_POLICY_KIVI4 | KV_POLICY_INT2 | KV_POLICY_INT4;
    const uint32_t sel = KV_POLICY_STREAMINGLLM | KV_POLICY_H2O | KV_POLICY_SNAPKV |
                         KV_POLICY_MINIKV | KV_POLICY_EATTN | KV_POLICY_KVZIP;
    const uint32_t known = fmt | sel | KV_POLICY_FP16 | KV_POLICY_SIMLAYERKV |
                           KV_POLICY_MINICACHE | KV_POLICY_CAM;
    kv_policy_info_t in;
    eval_share_t sh = {0};
    if (kv_policy_info(p, 1, 0, &in) || (in.methods & ~known) || /* unknown here: own pass */
        ((in.methods & fmt) && !(in.methods & sel)))             /* KIVI while appending  */
        return sh;
    sh.shares = 1;
    sh.all_rows = (in.methods & (KV_POLICY_H2O | KV_POLICY_MINIKV | KV_POLICY_CAM)) != 0;
    double w;
    if (!kv_policy_value(p, "eattn", "w", &w) && w == 0)
        sh.all_rows = 1; /* query moments of every prompt row */
    rows_max(p, "snapkv", "w", &sh.rows);
    rows_max(p, "eattn", "w", &sh.rows);
    double mode;
    if (!kv_policy_value(p, "simlayerkv", "mode", &mode) && mode == 1) /* prefill */
        rows_max(p, "simlayerkv", "rows", &sh.rows);
    return sh;
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
