/* SPDX-License-Identifier: MIT */
/*
 * plan_evalq.c — quality costs from `kvpage eval` reports (see
 * plan_evalq.h): a JSON scanner for the few fields needed, the per-policy
 * summary, and the newest-report search.
 *
 * The scanner is recursive descent over a NUL-terminated buffer with a
 * depth limit; strings longer than their field are truncated, \u escapes
 * become '?', numbers go through strtod. strcasestr and st_mtim need
 * _GNU_SOURCE, which the build defines everywhere.
 */
#include "plan_evalq.h"

#include <ctype.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "kvpage/kvpage.h"
#include "kv_cli.h"

#define JS_MAX_DEPTH 64
#define EVALQ_MAX_FILES 64
#define EVALQ_MAX_BYTES (64u << 20)

const char *const plan_evalq_tasks[PLAN_EVALQ_TASKS] = {"passkey", "needle", "vt"};

typedef struct js {
    const char *p;
} js_t;

static void js_ws(js_t *j)
{
    while (*j->p && isspace((unsigned char)*j->p))
        j->p++;
}

/* A string at j->p into buf (NULL: skip). */
static int js_string(js_t *j, char *buf, size_t cap)
{
    size_t n = 0;
    if (*j->p != '"')
        return -1;
    for (j->p++; *j->p != '"'; j->p++) {
        char c = *j->p;
        if (!c || (unsigned char)c < 0x20)
            return -1;
        if (c == '\\') {
            c = *++j->p;
            if (c == 'u') {
                for (int i = 1; i <= 4; i++)
                    if (!isxdigit((unsigned char)j->p[i]))
                        return -1;
                j->p += 4;
                c = '?';
            } else if (c == 'n' || c == 't' || c == 'r' || c == 'b' || c == 'f') {
                c = ' ';
            } else if (c != '"' && c != '\\' && c != '/') {
                return -1;
            }
        }
        if (buf && n + 1 < cap)
            buf[n++] = c;
    }
    j->p++;
    if (buf && cap)
        buf[n] = 0;
    return 0;
}

static int js_number(js_t *j, double *out)
{
    char *end = NULL;
    if (*j->p != '-' && !isdigit((unsigned char)*j->p))
        return -1;
    double v = strtod(j->p, &end);
    if (end == j->p)
        return -1;
    j->p = end;
    if (out)
        *out = v;
    return 0;
}

static int js_skip(js_t *j, int depth);

/* Object or array at j->p; for objects, on_key(user, key, j) parses (or
 * skips) each value. */
typedef int (*js_key_fn)(void *user, const char *key, js_t *j, int depth);

static int js_object(js_t *j, int depth, js_key_fn on_key, void *user)
{
    if (*j->p != '{' || depth > JS_MAX_DEPTH)
        return -1;
    j->p++;
    js_ws(j);
    if (*j->p == '}') {
        j->p++;
        return 0;
    }
    for (;;) {
        char key[64];
        js_ws(j);
        if (js_string(j, key, sizeof key))
            return -1;
        js_ws(j);
        if (*j->p++ != ':')
            return -1;
        js_ws(j);
        if (on_key ? on_key(user, key, j, depth + 1) : js_skip(j, depth + 1))
            return -1;
        js_ws(j);
        if (*j->p == '}') {
            j->p++;
            return 0;
        }
        if (*j->p++ != ',')
            return -1;
    }
}

/* Array at j->p; each element through on_elem (NULL: skip). */
typedef int (*js_elem_fn)(void *user, js_t *j, int depth);

static int js_array(js_t *j, int depth, js_elem_fn on_elem, void *user)
{
    if (*j->p != '[' || depth > JS_MAX_DEPTH)
        return -1;
    j->p++;
    js_ws(j);
    if (*j->p == ']') {
        j->p++;
        return 0;
    }
    for (;;) {
        js_ws(j);
        if (on_elem ? on_elem(user, j, depth + 1) : js_skip(j, depth + 1))
            return -1;
        js_ws(j);
        if (*j->p == ']') {
            j->p++;
            return 0;
        }
        if (*j->p++ != ',')
            return -1;
    }
}

static int js_skip(js_t *j, int depth)
{
    static const char *const lits[] = {"true", "false", "null"};
    if (depth > JS_MAX_DEPTH)
        return -1;
    switch (*j->p) {
    case '"':
        return js_string(j, NULL, 0);
    case '{':
        return js_object(j, depth, NULL, NULL);
    case '[':
        return js_array(j, depth, NULL, NULL);
    default:
        for (size_t i = 0; i < 3; i++)
            if (!strncmp(j->p, lits[i], strlen(lits[i]))) {
                j->p += strlen(lits[i]);
                return 0;
            }
        return js_number(j, NULL);
    }
}

/* ---- the report's fields -------------------------------------------------- */

static int row_key(void *user, const char *key, js_t *j, int depth)
{
    plan_evalq_row_t *r = user;
    if (*j->p == '"') {
        if (!strcmp(key, "policy"))
            return js_string(j, r->policy, sizeof r->policy);
        if (!strcmp(key, "task"))
            return js_string(j, r->task, sizeof r->task);
        if (!strcmp(key, "text"))
            return js_string(j, r->text, sizeof r->text);
    } else if (!strcmp(key, "ctx")) {
        return js_number(j, &r->ctx);
    } else if (!strcmp(key, "value")) {
        return js_number(j, &r->value);
    }
    return js_skip(j, depth);
}

static int row_elem(void *user, js_t *j, int depth)
{
    plan_evalq_file_t *f = user;
    plan_evalq_row_t r;
    memset(&r, 0, sizeof r);
    r.value = -1;
    if (js_object(j, depth, row_key, &r))
        return -1;
    plan_evalq_row_t *rows = realloc(f->rows, (f->n_rows + 1) * sizeof *rows);
    if (!rows)
        return -1;
    f->rows = rows;
    f->rows[f->n_rows++] = r;
    return 0;
}

static int top_key(void *user, const char *key, js_t *j, int depth)
{
    plan_evalq_file_t *f = user;
    if (!strcmp(key, "model") && *j->p == '"')
        return js_string(j, f->model, sizeof f->model);
    if (!strcmp(key, "results") && *j->p == '[')
        return js_array(j, depth, row_elem, f);
    return js_skip(j, depth);
}

int plan_evalq_parse(const char *json, plan_evalq_file_t *out)
{
    memset(out, 0, sizeof *out);
    if (!json)
        return -1;
    js_t j = {json};
    js_ws(&j);
    int rc = js_object(&j, 0, top_key, out);
    js_ws(&j);
    if (rc || *j.p) {
        plan_evalq_free(out);
        return -1;
    }
    return 0;
}

void plan_evalq_free(plan_evalq_file_t *f)
{
    if (f) {
        free(f->rows);
        memset(f, 0, sizeof *f);
    }
}

/* ---- quality of one policy ------------------------------------------------ */

/* 1 when spec parses to the canonical spec canon. */
static int same_policy(const char *spec, const char *canon)
{
    kv_policy_t *p = NULL;
    char buf[512];
    if (kv_policy_parse(spec, &p, NULL, 0))
        return 0;
    int same = !kv_policy_describe(p, buf, sizeof buf) && !strcmp(buf, canon);
    kv_policy_destroy(p);
    return same;
}

void plan_evalq_quality(const plan_evalq_file_t *f, const char *file, const char *canon,
                        plan_quality_t *q)
{
    memset(q, 0, sizeof *q);
    double ppl_sum = 0, dppl_sum = 0, acc_sum[PLAN_EVALQ_TASKS] = {0};
    uint32_t n_ppl = 0, n_acc[PLAN_EVALQ_TASKS] = {0};
    for (size_t i = 0; i < f->n_rows; i++) {
        const plan_evalq_row_t *r = &f->rows[i];
        if (r->value < 0 || !same_policy(r->policy, canon))
            continue;
        for (int t = 0; t < PLAN_EVALQ_TASKS; t++)
            if (!strcmp(r->task, plan_evalq_tasks[t])) {
                acc_sum[t] += r->value;
                n_acc[t]++;
            }
        if (strcmp(r->task, "ppl"))
            continue;
        for (size_t k = 0; k < f->n_rows; k++) {
            const plan_evalq_row_t *b = &f->rows[k];
            if (!strcmp(b->task, "ppl") && b->ctx == r->ctx && !strcmp(b->text, r->text) &&
                b->value >= 0 && same_policy(b->policy, "fp16")) {
                ppl_sum += r->value;
                dppl_sum += r->value - b->value;
                q->ppl_ctx = r->ctx;
                n_ppl++;
                break;
            }
        }
    }
    if (n_ppl) {
        q->have_ppl = 1;
        q->ppl = ppl_sum / n_ppl;
        q->delta_ppl = dppl_sum / n_ppl;
    }
    q->have = q->have_ppl;
    for (int t = 0; t < PLAN_EVALQ_TASKS; t++)
        if (n_acc[t]) {
            q->have_acc[t] = 1;
            q->acc[t] = acc_sum[t] / n_acc[t];
            q->have = 1;
        }
    snprintf(q->file, sizeof q->file, "%s", file ? file : "");
}

/* ---- the newest report ---------------------------------------------------- */

typedef struct evalq_ent {
    char name[256];
    long long mtime_ns;
} evalq_ent_t;

static int ent_newer_first(const void *a, const void *b)
{
    const evalq_ent_t *x = a, *y = b;
    if (x->mtime_ns != y->mtime_ns)
        return x->mtime_ns < y->mtime_ns ? 1 : -1;
    return strcmp(y->name, x->name);
}

/* The report at path, NUL-terminated (malloc), or NULL: not a regular
 * file, too big, unreadable (such files are skipped, as unparsable ones). */
static char *read_file(const char *path)
{
    char *buf;
    size_t len;
    return kv_cli_read_file(NULL, "report", path, EVALQ_MAX_BYTES - 1, &buf, &len) ? NULL : buf;
}

void plan_evalq_find(const char *dir, const char *model, const char *canon,
                     plan_quality_t *q)
{
    memset(q, 0, sizeof *q);
    DIR *d = dir ? opendir(dir) : NULL;
    if (!d)
        return;
    evalq_ent_t ents[EVALQ_MAX_FILES];
    size_t n = 0;
    char path[1024];
    for (struct dirent *e; (e = readdir(d)) && n < EVALQ_MAX_FILES;) {
        size_t len = strlen(e->d_name);
        struct stat sb;
        if (strncmp(e->d_name, "eval-", 5) || len < 10 || strcmp(e->d_name + len - 5, ".json") ||
            len >= sizeof ents[n].name)
            continue;
        int w = snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        if (w < 0 || (size_t)w >= sizeof path || stat(path, &sb) || !S_ISREG(sb.st_mode))
            continue;
        snprintf(ents[n].name, sizeof ents[n].name, "%s", e->d_name);
        ents[n++].mtime_ns = (long long)sb.st_mtim.tv_sec * 1000000000ll + sb.st_mtim.tv_nsec;
    }
    closedir(d);
    qsort(ents, n, sizeof ents[0], ent_newer_first);
    /* The newest report with a perplexity for the policy; else the newest
     * with any result for it (retrieval-only reports, e.g. a 4K sweep). */
    plan_quality_t any = {0};
    for (size_t i = 0; i < n && !q->have_ppl; i++) {
        int w = snprintf(path, sizeof path, "%s/%s", dir, ents[i].name);
        char *json = w > 0 && (size_t)w < sizeof path ? read_file(path) : NULL;
        plan_evalq_file_t f;
        if (json && !plan_evalq_parse(json, &f)) {
            if (model && strcasestr(f.model, model)) {
                plan_evalq_quality(&f, ents[i].name, canon, q);
                if (q->have && !q->have_ppl && !any.have)
                    any = *q;
            }
            plan_evalq_free(&f);
        }
        free(json);
    }
    if (!q->have_ppl)
        *q = any;
}
