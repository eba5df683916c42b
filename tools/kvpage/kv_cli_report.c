/* SPDX-License-Identifier: MIT */
/*
 * kv_cli_report.c — one report, two forms: the --json / --md outputs of the
 * `kvpage` commands whose report is a list of fields (run, demo, stress).
 *
 * A command adds its fields once, in order (kv_cli_rep_*: numbers, strings,
 * booleans, nested objects and arrays of scalars), into a fixed array of
 * KV_CLI_REPORT_MAX entries (no allocation: a report that does not fit sets
 * overflow and the writers refuse it). kv_cli_report_json writes one JSON
 * object (strings through kv_cli_json_strn; a non-finite number is null);
 * kv_cli_report_md writes the same fields, same order, same number
 * formats, as a two-column Markdown table: "obj.key" for a nested field,
 * an array's values in one cell, '|' escaped and newlines as <br>.
 *
 * kv_cli_outs_* are the --json FILE / --md FILE options' files: opened
 * before the work (a bad path fails at once), written and closed with
 * every write checked after it (kv_cli_out_close).
 */
#include <math.h>
#include <string.h>

#include "kv_cli.h"

#define REP_DEPTH 8 /* nesting of objects/arrays */

static kv_cli_field_t *rep_add(kv_cli_report_t *r, const char *key, kv_cli_fkind_t kind)
{
    if (r->n >= KV_CLI_REPORT_MAX) {
        r->overflow = 1;
        return NULL;
    }
    kv_cli_field_t *f = &r->f[r->n++];
    *f = (kv_cli_field_t){.key = key, .kind = kind};
    return f;
}

void kv_cli_rep_u(kv_cli_report_t *r, const char *key, uint64_t v)
{
    kv_cli_field_t *f = rep_add(r, key, KV_CLI_F_U64);
    if (f)
        f->u = v;
}

void kv_cli_rep_d(kv_cli_report_t *r, const char *key, double v, int prec)
{
    kv_cli_field_t *f = rep_add(r, key, KV_CLI_F_DBL);
    if (f) {
        f->d = v;
        f->prec = prec;
    }
}

void kv_cli_rep_sn(kv_cli_report_t *r, const char *key, const char *s, size_t n)
{
    kv_cli_field_t *f = rep_add(r, key, KV_CLI_F_STR);
    if (f) {
        f->s = s;
        f->n = s ? n : 0;
    }
}

void kv_cli_rep_s(kv_cli_report_t *r, const char *key, const char *s)
{
    kv_cli_rep_sn(r, key, s, s ? strlen(s) : 0);
}

void kv_cli_rep_b(kv_cli_report_t *r, const char *key, int v)
{
    kv_cli_field_t *f = rep_add(r, key, KV_CLI_F_BOOL);
    if (f)
        f->u = v != 0;
}

void kv_cli_rep_open(kv_cli_report_t *r, const char *key, int array)
{
    rep_add(r, key, array ? KV_CLI_F_ARR : KV_CLI_F_OBJ);
}

void kv_cli_rep_close(kv_cli_report_t *r)
{
    rep_add(r, NULL, KV_CLI_F_END);
}

/* Fits, balanced, not too deep, arrays hold scalars only: 0, else -1 after
 * a message (a bug in the command, never the user's input). */
static int rep_valid(const kv_cli_report_t *r)
{
    int depth = 0, in_arr = 0, ok = !r->overflow;
    for (size_t i = 0; ok && i < r->n; i++) {
        kv_cli_fkind_t k = r->f[i].kind;
        if (k == KV_CLI_F_OBJ || k == KV_CLI_F_ARR) {
            ok = !in_arr && ++depth <= REP_DEPTH;
            in_arr = k == KV_CLI_F_ARR;
        } else if (k == KV_CLI_F_END) {
            ok = depth-- > 0;
            in_arr = 0;
        }
    }
    if (ok && depth == 0)
        return 0;
    fprintf(stderr, "kvpage %s: internal error: the report's fields %s\n", r->cmd,
            r->overflow ? "do not fit (KV_CLI_REPORT_MAX)" : "are not nested right");
    return -1;
}

/* A scalar's value as JSON or (md) as a Markdown cell. */
static void rep_value(FILE *out, const kv_cli_field_t *f, int md)
{
    switch (f->kind) {
    case KV_CLI_F_U64:
        fprintf(out, "%llu", (unsigned long long)f->u);
        return;
    case KV_CLI_F_DBL:
        if (!isfinite(f->d))
            fputs("null", out);
        else if (f->prec < 0)
            fprintf(out, "%g", f->d);
        else
            fprintf(out, "%.*f", f->prec, f->d);
        return;
    case KV_CLI_F_BOOL:
        fputs(f->u ? "true" : "false", out);
        return;
    case KV_CLI_F_STR:
        if (!f->s) {
            fputs("null", out);
        } else if (!md) {
            kv_cli_json_strn(out, f->s, f->n);
        } else {
            for (size_t i = 0; i < f->n; i++) {
                char c = f->s[i];
                if (c == '\n')
                    fputs("<br>", out);
                else if (c == '|' || c == '\\' || c == '`')
                    fprintf(out, "\\%c", c);
                else if ((unsigned char)c >= 0x20 && c != 0x7f)
                    fputc(c, out);
            }
        }
        return;
    default:
        return;
    }
}

int kv_cli_report_json(FILE *out, const kv_cli_report_t *r)
{
    if (rep_valid(r))
        return -1;
    int first[REP_DEPTH + 1] = {1}, depth = 0;
    char close[REP_DEPTH + 1] = {'}'};
    fputc('{', out);
    for (size_t i = 0; i < r->n; i++) {
        const kv_cli_field_t *f = &r->f[i];
        if (f->kind == KV_CLI_F_END) {
            fputc(close[depth--], out);
            continue;
        }
        if (!first[depth])
            fputc(',', out);
        first[depth] = 0;
        if (close[depth] == '}')
            fprintf(out, "\"%s\":", f->key);
        if (f->kind == KV_CLI_F_OBJ || f->kind == KV_CLI_F_ARR) {
            depth++;
            first[depth] = 1;
            close[depth] = f->kind == KV_CLI_F_OBJ ? '}' : ']';
            fputc(f->kind == KV_CLI_F_OBJ ? '{' : '[', out);
        } else {
            rep_value(out, f, 0);
        }
    }
    fputs("}\n", out);
    return 0;
}

int kv_cli_report_md(FILE *out, const kv_cli_report_t *r)
{
    if (rep_valid(r))
        return -1;
    const char *path[REP_DEPTH + 1]; /* the open objects' keys */
    int depth = 0, arr_n = -1;       /* arr_n: values so far in an open array */
    fprintf(out, "## kvpage %s\n\n| field | value |\n|---|---|\n", r->cmd);
    for (size_t i = 0; i < r->n; i++) {
        const kv_cli_field_t *f = &r->f[i];
        if (f->kind == KV_CLI_F_END) {
            if (arr_n >= 0)
                fputs(" |\n", out);
            arr_n = -1;
            depth--;
            continue;
        }
        if (arr_n >= 0) { /* an element of the open array */
            fputs(arr_n++ ? ", " : "", out);
            rep_value(out, f, 1);
            continue;
        }
        if (f->kind == KV_CLI_F_OBJ) {
            path[depth++] = f->key;
            continue;
        }
        fputs("| ", out);
        for (int d = 0; d < depth; d++)
            fprintf(out, "%s.", path[d]);
        fprintf(out, "%s | ", f->key);
        if (f->kind == KV_CLI_F_ARR) {
            path[depth++] = f->key;
            arr_n = 0;
            continue;
        }
        rep_value(out, f, 1);
        fputs(" |\n", out);
    }
    return 0;
}

int kv_cli_outs_open(const char *cmd, kv_cli_outs_t *o)
{
    o->fj = o->fm = NULL;
    if (kv_cli_outs_check(cmd, o->json, o->md, &o->plain))
        return 2;
    if (o->json && !(o->fj = kv_cli_out_open(cmd, "--json", o->json)))
        return 2;
    if (o->md && !(o->fm = kv_cli_out_open(cmd, "--md", o->md))) {
        if (o->fj && o->fj != stdout)
            fclose(o->fj);
        o->fj = NULL;
        return 2;
    }
    return 0;
}

int kv_cli_outs_finish(const char *cmd, kv_cli_outs_t *o, const kv_cli_report_t *r)
{
    const char *paths[2] = {o->json, o->md};
    FILE *fs[2] = {o->fj, o->fm};
    int (*const writers[2])(FILE *, const kv_cli_report_t *) = {kv_cli_report_json,
                                                                kv_cli_report_md};
    int bad = 0;
    for (int k = 0; k < 2; k++) {
        if (!fs[k])
            continue;
        if (r)
            bad |= writers[k](fs[k], r) | kv_cli_out_close(cmd, paths[k], fs[k]);
        else if (fs[k] != stdout)
            fclose(fs[k]); /* the work failed: nothing written */
    }
    o->fj = o->fm = NULL;
    return bad ? -1 : 0;
}
