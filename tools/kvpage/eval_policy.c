/*
 * eval_policy.c — `kvpage eval`'s policies over the store's policy API (see
 * eval_policy.h).
 */
#include "eval_policy.h"

#include <stdio.h>
#include <stdlib.h>
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
        snprintf(out->spec, sizeof out->spec, "%s", spec); /* then: shares nothing */
    else
        out->share = eval_policy_share(out->spec);
    return 0;
}

/* The value of key in one part's "k=v,k=v" list, or NULL. */
static const char *key_val(const char *keys, size_t len, const char *key, size_t *vlen)
{
    size_t kl = strlen(key);
    for (size_t i = 0; i < len;) {
        size_t e = i;
        while (e < len && keys[e] != ',')
            e++;
        if (e - i > kl && !memcmp(keys + i, key, kl) && keys[i + kl] == '=') {
            *vlen = e - i - kl - 1;
            return keys + i + kl + 1;
        }
        i = e + 1;
    }
    return NULL;
}

/* *rows = max(*rows, the whole-number value of key) */
static void rows_max(const char *keys, size_t len, const char *key, uint32_t *rows)
{
    size_t vl;
    const char *v = key_val(keys, len, key, &vl);
    unsigned long x = v ? strtoul(v, NULL, 10) : 0;
    if (x > *rows)
        *rows = (uint32_t)x;
}

static int is_method(const char *m, size_t len, const char *name)
{
    return strlen(name) == len && !memcmp(m, name, len);
}

eval_share_t eval_policy_share(const char *spec)
{
    eval_share_t sh = {.shares = 1};
    int fmt = 0, sel = 0;
    for (const char *p = spec; p && *p;) {
        const char *plus = strchr(p, '+');
        size_t len = plus ? (size_t)(plus - p) : strlen(p);
        const char *colon = memchr(p, ':', len);
        size_t ml = colon ? (size_t)(colon - p) : len, kl = colon ? len - ml - 1 : 0, vl = 0;
        const char *keys = colon ? colon + 1 : "", *v;
        if (is_method(p, ml, "kivi2") || is_method(p, ml, "kivi4") || is_method(p, ml, "int2") ||
            is_method(p, ml, "int4")) {
            fmt = 1;
        } else if (is_method(p, ml, "h2o") || is_method(p, ml, "minikv")) {
            sel = sh.all_rows = 1;
        } else if (is_method(p, ml, "cam")) {
            sh.all_rows = 1;
        } else if (is_method(p, ml, "streamingllm")) {
            sel = 1;
        } else if (is_method(p, ml, "snapkv")) {
            sel = 1;
            rows_max(keys, kl, "w", &sh.rows);
        } else if (is_method(p, ml, "simlayerkv")) {
            if ((v = key_val(keys, kl, "mode", &vl)) && vl == 7 && !memcmp(v, "prefill", 7))
                rows_max(keys, kl, "rows", &sh.rows);
        } else if (!is_method(p, ml, "minicache") && !is_method(p, ml, "fp16")) {
            sh.shares = 0; /* unknown to this table: run it on its own */
        }
        p = plus ? plus + 1 : NULL;
    }
    if (fmt && !sel)
        sh.shares = 0;
    if (!sh.shares)
        sh = (eval_share_t){0};
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
