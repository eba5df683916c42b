/*
 * plan_spec.c — canonical-spec queries for `kvpage plan` (see
 * plan_spec.h).
 */
#include "plan_spec.h"

#include <stdio.h>
#include <stdlib.h>
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

/* The part of canon whose method is m: *args points after ':' (or at the
 * part's end), *end at the part's end; NULL when absent. */
static const char *find_part(const char *canon, const char *m, const char **args,
                             const char **end)
{
    size_t ml = strlen(m);
    for (const char *p = canon; p && *p;) {
        const char *e = p + strcspn(p, "+");
        size_t nl = strcspn(p, ":+");
        if (nl == ml && !strncmp(p, m, ml)) {
            *args = p + nl + (p[nl] == ':');
            *end = e;
            return p;
        }
        p = *e ? e + 1 : NULL;
    }
    return NULL;
}

int plan_spec_has(const char *canon, const char *m)
{
    const char *a, *e;
    return canon && m && find_part(canon, m, &a, &e) != NULL;
}

double plan_spec_num(const char *canon, const char *m, const char *k, double dflt)
{
    const char *a, *e;
    if (!canon || !m || !k || !find_part(canon, m, &a, &e))
        return dflt;
    size_t kl = strlen(k);
    while (a < e) {
        const char *ke = a + strcspn(a, ",+");
        if ((size_t)(ke - a) > kl && !strncmp(a, k, kl) && a[kl] == '=') {
            char *num_end = NULL;
            double v = strtod(a + kl + 1, &num_end);
            return num_end == ke ? v : dflt;
        }
        a = ke + 1;
    }
    return dflt;
}

const char *plan_spec_format(const char *canon)
{
    static const char *const fmts[] = {"kivi2", "kivi4", "int2", "int4"};
    for (size_t i = 0; i < sizeof fmts / sizeof fmts[0]; i++)
        if (plan_spec_has(canon, fmts[i]))
            return fmts[i];
    return NULL;
}
