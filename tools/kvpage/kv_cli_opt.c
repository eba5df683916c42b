/* SPDX-License-Identifier: MIT */
/*
 * kv_cli_opt.c — the option parser every `kvpage` subcommand shares.
 *
 * A subcommand describes its options once, in a kv_cli_opt_t table (name,
 * kind, where the value goes, range, help); kv_cli_parse fills the options
 * struct from argv and kv_cli_usage prints the same table as the usage text,
 * so the help can never disagree with the parser. Short names ("-m") are
 * ALIAS entries that stand for a long one ("--model"). Values are checked against
 * their range here, with a message naming the option; semantic checks that
 * span several options stay in the subcommand.
 *
 * Ownership: STR values point into argv (valid for the process's life).
 */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kv_cli.h"

int kv_cli_uint(const char *opt, const char *val, uint64_t lo, uint64_t hi,
                uint64_t *out)
{
    char *end = NULL;
    errno = 0;
    if (!val || !*val || *val == '-' || *val == '+' || *val == ' ') {
        fprintf(stderr, "kvpage: %s needs a non-negative integer, got '%s'\n", opt,
                val ? val : "");
        return -1;
    }
    unsigned long long x = strtoull(val, &end, 10);
    if (errno || *end || x < lo || x > hi) {
        fprintf(stderr, "kvpage: %s must be an integer in [%llu, %llu], got '%s'\n",
                opt, (unsigned long long)lo, (unsigned long long)hi, val);
        return -1;
    }
    *out = x;
    return 0;
}

static int cli_double(const char *opt, const char *val, double lo, double hi,
                      double *out)
{
    char *end = NULL;
    errno = 0;
    double x = val && *val ? strtod(val, &end) : NAN;
    if (errno || !end || *end || !isfinite(x) || x < lo || x > hi) {
        fprintf(stderr, "kvpage: %s must be a number in [%g, %g], got '%s'\n", opt, lo,
                hi, val ? val : "");
        return -1;
    }
    *out = x;
    return 0;
}

/* The entry named by the first len bytes of name; an alias gives the entry
 * it stands for. */
static const kv_cli_opt_t *cli_lookup(const kv_cli_opt_t *opts, size_t n, const char *name,
                                      size_t len)
{
    for (size_t i = 0; i < n; i++) {
        if (strlen(opts[i].name) != len || strncmp(opts[i].name, name, len))
            continue;
        if (opts[i].kind != KV_CLI_ALIAS)
            return &opts[i];
        for (size_t j = 0; j < n; j++)
            if (opts[j].kind != KV_CLI_ALIAS && !strcmp(opts[j].name, opts[i].arg))
                return &opts[j];
    }
    return NULL;
}

/* The table entry named by arg ("--name" or "--name=value"); *val is set to
 * the text after '=' or NULL. */
static const kv_cli_opt_t *cli_find(const kv_cli_opt_t *opts, size_t n, const char *arg,
                                    const char **val)
{
    const char *eq = strchr(arg, '=');
    const kv_cli_opt_t *op = cli_lookup(opts, n, arg, eq ? (size_t)(eq - arg) : strlen(arg));
    if (op)
        *val = eq ? eq + 1 : NULL;
    return op;
}

static int cli_store(const kv_cli_opt_t *op, const char *val, void *o)
{
    char *dst = (char *)o + op->off;
    switch (op->kind) {
    case KV_CLI_UINT:
        return kv_cli_uint(op->name, val, op->lo, op->hi, (uint64_t *)(void *)dst);
    case KV_CLI_DOUBLE:
        return cli_double(op->name, val, op->dlo, op->dhi, (double *)(void *)dst);
    case KV_CLI_STR:
        if (!*val) {
            fprintf(stderr, "kvpage: %s needs a value, got an empty string\n", op->name);
            return -1;
        }
        *(const char **)(void *)dst = val;
        return 0;
    case KV_CLI_TEXT:
        *(const char **)(void *)dst = val;
        return 0;
    case KV_CLI_OUT:
        if (!*val || (val[0] == '-' && val[1])) {
            fprintf(stderr, "kvpage: %s takes a FILE ('-' = stdout), got '%s'\n", op->name,
                    val);
            return -1;
        }
        *(const char **)(void *)dst = val;
        return 0;
    case KV_CLI_FLAG:
        *(int *)(void *)dst = 1;
        return 0;
    case KV_CLI_ALIAS: /* resolved by cli_find */
        break;
    }
    return -1;
}

int kv_cli_parse(const char *cmd, const char *synopsis, const kv_cli_opt_t *opts,
                 size_t n_opts, int argc, char **argv, void *o)
{
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *val = NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            kv_cli_usage(stdout, cmd, synopsis, opts, n_opts);
            return 1;
        }
        const kv_cli_opt_t *op = cli_find(opts, n_opts, a, &val);
        if (!op) {
            fprintf(stderr, "kvpage %s: unknown option '%s' (--help lists them)\n", cmd, a);
            return 2;
        }
        if (op->kind == KV_CLI_FLAG && val) {
            fprintf(stderr, "kvpage %s: %s takes no value\n", cmd, op->name);
            return 2;
        }
        if (op->kind != KV_CLI_FLAG && !val) {
            if (i + 1 >= argc) {
                fprintf(stderr, "kvpage %s: %s needs a value (--help lists the options)\n",
                        cmd, op->name);
                return 2;
            }
            val = argv[++i];
        }
        if (cli_store(op, val, o))
            return 2;
    }
    return 0;
}

void kv_cli_usage(FILE *f, const char *cmd, const char *synopsis,
                  const kv_cli_opt_t *opts, size_t n_opts)
{
    fprintf(f, "usage: kvpage %s [options]\n", cmd);
    if (synopsis)
        fprintf(f, "%s\n", synopsis);
    for (size_t i = 0; i < n_opts; i++) {
        if (opts[i].kind == KV_CLI_ALIAS)
            continue;
        const char *alias = "";
        for (size_t j = 0; j < n_opts; j++)
            if (opts[j].kind == KV_CLI_ALIAS && !strcmp(opts[j].arg, opts[i].name))
                alias = opts[j].name;
        char head[64];
        snprintf(head, sizeof head, "%s%s%s%s%s", alias, *alias ? ", " : "", opts[i].name,
                 opts[i].arg ? " " : "", opts[i].arg ? opts[i].arg : "");
        fprintf(f, "  %-20s ", head);
        for (const char *p = opts[i].help ? opts[i].help : ""; *p; p++) {
            fputc(*p, f);
            if (*p == '\n')
                fprintf(f, "  %-20s ", "");
        }
        fputc('\n', f);
    }
    fprintf(f, "  %-20s %s\n", "--help", "this text");
}

/* Does this piece continue the previous spec (key=value before any ':'/'+')? */
static int cli_is_key(const char *p)
{
    size_t eq = strcspn(p, "="), sep = strcspn(p, ":+");
    return p[eq] == '=' && eq < sep;
}

int kv_cli_split_specs(const char *opt, char *buf, char **out, uint32_t max)
{
    uint32_t n = 0;
    int prev_spec = 0; /* the piece before this one was a spec or its key */
    for (char *p = buf; p;) {
        char *c = strchr(p, ',');
        if (c)
            *c = 0;
        if (*p && cli_is_key(p)) {
            if (!prev_spec) {
                fprintf(stderr, "kvpage: %s: '%s' has no method before it\n", opt, p);
                return -1;
            }
            p[-1] = ','; /* it continues the previous spec */
        } else if (*p) {
            if (n >= max) {
                fprintf(stderr, "kvpage: %s: more than %u policies\n", opt, max);
                return -1;
            }
            out[n++] = p;
        }
        prev_spec = *p != 0;
        p = c ? c + 1 : NULL;
    }
    return (int)n;
}

int kv_cli_outs_check(const char *cmd, const char *json, const char *md, int *plain)
{
    int js = json && !strcmp(json, "-"), ms = md && !strcmp(md, "-");
    *plain = !js && !ms;
    if (js && ms) {
        fprintf(stderr, "kvpage %s: --json - and --md - both ask for stdout: give one a FILE\n",
                cmd);
        return 2;
    }
    return 0;
}
