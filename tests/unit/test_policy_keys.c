/* SPDX-License-Identifier: MIT */
/*
 * test_policy_keys.c — docs/policies.md's key table is the library's: for
 * every row (method, key, kind, range, default) of the table under
 * "Grammar", the default is what kv_policy_value reports for the method
 * alone, both ends of the range parse and one step outside each end does
 * not, and the keys of each method are exactly those kv_policy_describe
 * writes, in the same order. Read from the source tree (KV_TEST_SOURCE_DIR).
 */
#include <ctype.h>
#include <inttypes.h>
#include <string.h>

#include "kv_test.h"

#define MAX_ROWS 64

typedef struct row {
    char method[32], key[16], kind[48], range[32], dflt[16];
} row_t;

/* Cell i (0-based) of a "| a | b | ... |" line into out, backticks and
 * surrounding spaces removed. */
static void cell(const char *line, int i, char *out, size_t cap)
{
    const char *p = line; /* the '|' before cell 0 */
    for (int k = 0; k < i && p; k++)
        p = strchr(p + 1, '|');
    size_t n = 0;
    if (p) {
        const char *e = strchr(p + 1, '|');
        for (const char *c = p + 1; e && c < e && n + 1 < cap; c++)
            if (*c != '`')
                out[n++] = *c;
    }
    out[n] = '\0';
    while (n && out[n - 1] == ' ')
        out[--n] = '\0';
    size_t lead = strspn(out, " ");
    memmove(out, out + lead, strlen(out + lead) + 1);
}

static uint32_t read_table(row_t *rows)
{
    FILE *f = fopen(KV_TEST_SOURCE_DIR "/docs/policies.md", "r");
    CHECK(f != NULL);
    if (!f)
        return 0;
    char line[512], method[32] = "";
    uint32_t n = 0;
    int in = 0;
    while (fgets(line, sizeof line, f) && n < MAX_ROWS) {
        if (!in) {
            in = !strncmp(line, "| method | key | kind | range | default |", 41);
            continue;
        }
        if (line[0] != '|')
            break;
        if (!strncmp(line, "|---", 4))
            continue;
        row_t *r = &rows[n];
        cell(line, 0, r->method, sizeof r->method);
        if (r->method[0])
            snprintf(method, sizeof method, "%s", r->method);
        else
            snprintf(r->method, sizeof r->method, "%s", method);
        cell(line, 1, r->key, sizeof r->key);
        cell(line, 2, r->kind, sizeof r->kind);
        cell(line, 3, r->range, sizeof r->range);
        cell(line, 4, r->dflt, sizeof r->dflt);
        n++;
    }
    fclose(f);
    return n;
}

/* "2^20", "65536", "2^64 - 1", "0.5" as a long double. */
static long double num(const char *s)
{
    if (!strncmp(s, "2^", 2)) {
        long double v = 1;
        for (int e = atoi(s + 2); e > 0; e--)
            v *= 2;
        return strstr(s, "- 1") ? v - 1 : v;
    }
    return strtold(s, NULL);
}

/* A spec that has method m alone where it can be alone. */
static void base(const char *m, char *out, size_t cap)
{
    snprintf(out, cap, "%s%s", !strcmp(m, "cam") ? "h2o+" : "", m);
}

static int parses(const char *m, const char *key, const char *value)
{
    char spec[128];
    base(m, spec, sizeof spec);
    size_t n = strlen(spec);
    snprintf(spec + n, sizeof spec - n, ":%s=%s", key, value);
    kv_policy_t *p = NULL;
    int rc = kv_policy_parse(spec, &p, NULL, 0);
    kv_policy_destroy(p);
    return rc == 0;
}

/* An integer bound as text, also one past 2^64 - 1. */
static void int_text(long double v, char *out, size_t cap)
{
    if (v > 18446744073709551615.0L)
        snprintf(out, cap, "18446744073709551616");
    else
        snprintf(out, cap, "%" PRIu64, (uint64_t)v);
}

static void check_row(const row_t *r, const char *m)
{
    char spec[64];
    base(m, spec, sizeof spec);
    kv_policy_t *p = NULL;
    CHECK_OK(kv_policy_parse(spec, &p, NULL, 0));
    double v = -1;
    CHECK_OK(kv_policy_value(p, m, r->key, &v));
    double want = !strcmp(r->dflt, "decode") ? 0 : strtod(r->dflt, NULL);
    if (v != want)
        fprintf(stderr, "  %s:%s default %.17g, docs say %s\n", m, r->key, v, r->dflt);
    CHECK(v == want);
    kv_policy_destroy(p);
    const char *dots = strstr(r->range, " .. ");
    if (!dots)
        return; /* amounts and named values: no range column */
    char lo_s[32], hi_s[32], a[48], b[48];
    snprintf(lo_s, sizeof lo_s, "%.*s", (int)(dots - r->range), r->range);
    snprintf(hi_s, sizeof hi_s, "%s", dots + 4);
    long double lo = num(lo_s), hi = num(hi_s);
    int integer = !strncmp(r->kind, "integer", 7);
    if (integer) {
        int_text(lo, a, sizeof a), int_text(hi, b, sizeof b);
    } else {
        snprintf(a, sizeof a, "%.17Lg", lo), snprintf(b, sizeof b, "%.17Lg", hi);
    }
    int ok = parses(m, r->key, a) && parses(m, r->key, b);
    if (integer) {
        int_text(hi + 1, b, sizeof b);
        ok &= !parses(m, r->key, b);
        if (lo > 0) {
            int_text(lo - 1, a, sizeof a);
            ok &= !parses(m, r->key, a);
        }
    } else {
        snprintf(a, sizeof a, "%.17Lg", lo - 0.001L);
        snprintf(b, sizeof b, "%.17Lg", hi + 0.001L);
        ok &= !parses(m, r->key, a) && !parses(m, r->key, b);
    }
    if (!ok)
        fprintf(stderr, "  %s:%s: range %s not the library's\n", m, r->key, r->range);
    CHECK(ok);
}

/* The keys kv_policy_describe writes for method m alone, ","-joined. */
static void described_keys(const char *m, char *out, size_t cap)
{
    char spec[64], d[512];
    base(m, spec, sizeof spec);
    kv_policy_t *p = NULL;
    out[0] = '\0';
    /* rot, ada and alpha are quiet keys (described only when set): set
     * each where the method has it */
    char use[200];
    snprintf(use, sizeof use, "%s", spec);
    static const char *const quiet[] = {"rot=1", "ada=1", "alpha=0.5"};
    for (size_t i = 0; i < sizeof quiet / sizeof quiet[0]; i++) {
        char q[sizeof use];
        int w = snprintf(q, sizeof q, "%s%s%s", use, strchr(use, ':') ? "," : ":", quiet[i]);
        if (w > 0 && (size_t)w < sizeof q && !kv_policy_parse(q, &p, NULL, 0))
            memcpy(use, q, (size_t)w + 1);
        kv_policy_destroy(p);
        p = NULL;
    }
    if (kv_policy_parse(use, &p, NULL, 0) || kv_policy_describe(p, d, sizeof d)) {
        kv_policy_destroy(p);
        return;
    }
    kv_policy_destroy(p);
    size_t ml = strlen(m);
    char *save = NULL;
    for (char *part = strtok_r(d, "+", &save); part; part = strtok_r(NULL, "+", &save)) {
        if (strncmp(part, m, ml) || (part[ml] != ':' && part[ml] != '\0'))
            continue;
        size_t n = 0;
        for (char *k = part[ml] ? part + ml + 1 : part + ml; *k;) {
            size_t kl = strcspn(k, "=");
            n += (size_t)snprintf(out + n, cap - n, "%s%.*s", n ? "," : "", (int)kl, k);
            k += kl + strcspn(k + kl, ",");
            k += *k == ',';
        }
    }
}

int main(void)
{
    row_t rows[MAX_ROWS];
    uint32_t n = read_table(rows);
    CHECK(n >= 20);
    uint32_t methods = 0;
    for (uint32_t i = 0; i < n; i++) {
        /* "kivi2, kivi4, int2, int4": every method of the row */
        char list[sizeof rows[i].method];
        memcpy(list, rows[i].method, sizeof list);
        char *save = NULL;
        for (char *m = strtok_r(list, ", ", &save); m; m = strtok_r(NULL, ", ", &save)) {
            char m_s[32];
            snprintf(m_s, sizeof m_s, "%s", m);
            if (strcmp(rows[i].key, "—"))
                check_row(&rows[i], m_s);
            if (i > 0 && !strcmp(rows[i - 1].method, rows[i].method))
                continue; /* its keys were compared at its first row */
            methods++;
            char want[256] = "", got[256];
            for (uint32_t j = i; j < n && !strcmp(rows[j].method, rows[i].method); j++)
                if (strcmp(rows[j].key, "—"))
                    snprintf(want + strlen(want), sizeof want - strlen(want), "%s%s",
                             want[0] ? "," : "", rows[j].key);
            described_keys(m_s, got, sizeof got);
            if (strcmp(want, got))
                fprintf(stderr, "  %s: docs list keys '%s', describe writes '%s'\n", m_s,
                        want, got);
            CHECK(!strcmp(want, got));
        }
    }
    CHECK_EQ(methods, 14); /* every method of the grammar */
    return kv_test_end();
}
