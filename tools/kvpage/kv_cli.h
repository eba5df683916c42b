/* SPDX-License-Identifier: MIT */
/*
 * kv_cli.h — what the subcommands of the `kvpage` tool share.
 *
 * The tool uses only the public API (include/kvpage/kvpage.h), like any
 * client. Each subcommand is `int kv_cmd_<name>(int argc, char **argv)`,
 * argv[0] being the subcommand's name, returning the process exit code
 * (0 ok, 1 failure, 2 usage error).
 */
#ifndef KV_CLI_H
#define KV_CLI_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "kvpage/kvpage.h"

int kv_cmd_demo(int argc, char **argv);
int kv_cmd_run(int argc, char **argv);
int kv_cmd_eval(int argc, char **argv);
int kv_cmd_stress(int argc, char **argv);
int kv_cmd_plan(int argc, char **argv);

/* Monotonic clock in seconds. */
double kv_cli_now(void);

/* Parse a non-negative integer option value in [lo, hi]; on error prints a
 * message naming the option and returns -1. */
int kv_cli_uint(const char *opt, const char *val, uint64_t lo, uint64_t hi,
                uint64_t *out);

/* ---- files (kv_cli_io.c) ------------------------------------------------ */

/* Read the regular file at path whole into *buf (malloc, NUL-terminated;
 * *len bytes), at most max bytes (size checked before reading). Returns 0,
 * or -1 after a message "kvpage <cmd>: <what> '<path>' ..." saying why (no
 * such file, a directory / FIFO / device, too big, an I/O error); no
 * message when cmd is NULL. Never blocks on a FIFO. */
int kv_cli_read_file(const char *cmd, const char *what, const char *path, size_t max,
                     char **buf, size_t *len);
/* Open an output file given as option opt ("-" = stdout) before the work:
 * NULL after a message if it is a directory or cannot be opened. */
FILE *kv_cli_out_open(const char *cmd, const char *opt, const char *path);
/* Flush and close an output (stdout: flushed, left open); 0, or -1 after a
 * message if any write to it failed. NULL: 0. */
int kv_cli_out_close(const char *cmd, const char *path, FILE *f);
/* rel, a path relative to the directory of the running executable
 * (/proc/self/exe, links resolved), into buf: "<exe dir>/<rel>". 0, or -1
 * (unreadable link, too long). */
int kv_cli_exe_path(const char *rel, char *buf, size_t len);
/* main.c, after every command: flush and close stdout; -1 after a message
 * if output was lost (then the command exits 1). */
int kv_cli_stdout_close(const char *cmd);

/* Write s[0..n) / the string s as a JSON string, quotes included
 * (kv_cli_json.c). */
void kv_cli_json_strn(FILE *f, const char *s, size_t n);
void kv_cli_json_str(FILE *f, const char *s);

/* ---- options (kv_cli_opt.c) ---------------------------------------------
 * Every subcommand describes its options in one table and parses argv with
 * kv_cli_parse; the same table prints the usage text. Values land in the
 * command's options struct at `off`: int (FLAG: set to 1), uint64_t (UINT),
 * double (DOUBLE), const char * (STR, TEXT: points into argv). An empty
 * value is a usage error except for TEXT (e.g. `--model ''` does not fall
 * back to the default). An ALIAS entry is a short name for another entry:
 * {"-m", KV_CLI_ALIAS, .arg = "--model"} makes "-m FILE" mean "--model
 * FILE"; the usage shows "-m, --model". */
typedef enum kv_cli_kind {
    KV_CLI_FLAG = 0,   /* no value                                  */
    KV_CLI_UINT = 1,   /* integer in [lo, hi]                       */
    KV_CLI_DOUBLE = 2, /* finite number in [dlo, dhi]               */
    KV_CLI_STR = 3,    /* a non-empty string                        */
    KV_CLI_TEXT = 4,   /* any string, empty included                */
    KV_CLI_ALIAS = 5,  /* another name of the entry named by arg    */
    KV_CLI_OUT = 6,    /* an output file, "-" = stdout; a value that */
                       /* starts with '-' otherwise is refused       */
} kv_cli_kind_t;

/* --json and --md mean the same in every subcommand that has them: the
 * report as JSON / as Markdown written to FILE, "-" = stdout; both may be
 * given, not both "-". Without "-" on either, stdout gets the command's
 * usual report. Declare them with these (KV_CLI_OUT entries). */
#define KV_CLI_JSON_HELP "write the report as JSON to FILE (- = stdout)"
#define KV_CLI_MD_HELP "write the report as Markdown to FILE (- = stdout)"
/* 0, or 2 after a message when both are "-"; *plain = stdout gets the
 * usual report (neither is "-"). */
int kv_cli_outs_check(const char *cmd, const char *json, const char *md, int *plain);

/* ---- reports as JSON and Markdown (kv_cli_report.c) -----------------------
 * A command whose report is a list of fields (run, demo, stress) builds it
 * once as a kv_cli_report_t; --json writes it as one JSON object, --md as a
 * two-column Markdown table of the same fields in the same order (a nested
 * object's fields as "obj.key" rows, an array as one row of its values), so
 * the two cannot disagree. Plan and eval, whose reports are tables of their
 * own, write them with their own writers and share only the options. */
#define KV_CLI_REPORT_MAX 192 /* fields, nesting marks included */

typedef enum kv_cli_fkind {
    KV_CLI_F_U64 = 0, /* u                                         */
    KV_CLI_F_DBL = 1, /* d, prec digits after the point (-1: %g)   */
    KV_CLI_F_STR = 2, /* s[0..n); s NULL: null                      */
    KV_CLI_F_BOOL = 3, /* u != 0                                    */
    KV_CLI_F_OBJ = 4, /* opens an object, to the next END          */
    KV_CLI_F_ARR = 5, /* opens an array (its fields' keys unused)   */
    KV_CLI_F_END = 6, /* closes the innermost OBJ/ARR              */
} kv_cli_fkind_t;

typedef struct kv_cli_field {
    const char *key; /* a JSON-safe name: [a-z0-9_]; not copied   */
    kv_cli_fkind_t kind;
    int prec;        /* DBL: digits after the point, -1: %g        */
    uint64_t u;
    double d;
    const char *s;   /* STR: not copied; lives until written       */
    size_t n;        /* STR: bytes                                 */
} kv_cli_field_t;

typedef struct kv_cli_report {
    const char *cmd;  /* "run": the Markdown heading "## kvpage run" */
    kv_cli_field_t f[KV_CLI_REPORT_MAX];
    size_t n;
    int overflow;     /* a field did not fit: the writers fail       */
} kv_cli_report_t;

void kv_cli_rep_u(kv_cli_report_t *r, const char *key, uint64_t v);
void kv_cli_rep_d(kv_cli_report_t *r, const char *key, double v, int prec);
void kv_cli_rep_s(kv_cli_report_t *r, const char *key, const char *s); /* NULL: null */
void kv_cli_rep_sn(kv_cli_report_t *r, const char *key, const char *s, size_t n);
void kv_cli_rep_b(kv_cli_report_t *r, const char *key, int v);
void kv_cli_rep_open(kv_cli_report_t *r, const char *key, int array);
void kv_cli_rep_close(kv_cli_report_t *r);
/* The report as one JSON object and a newline / as "## kvpage <cmd>" and a
 * Markdown table "| field | value |". 0, or -1 (overflowed or unbalanced:
 * a message on stderr, nothing written). Write errors show in ferror(f). */
int kv_cli_report_json(FILE *f, const kv_cli_report_t *r);
int kv_cli_report_md(FILE *f, const kv_cli_report_t *r);

/* The --json / --md outputs of a command with a kv_cli_report_t. */
typedef struct kv_cli_outs {
    const char *json, *md; /* the option values (NULL: not given; "-": stdout) */
    FILE *fj, *fm;         /* opened by kv_cli_outs_open                      */
    int plain;             /* stdout gets the command's usual report          */
} kv_cli_outs_t;
/* Check (kv_cli_outs_check) and open both before the work: 0, or 2 after a
 * message (nothing left open). */
int kv_cli_outs_open(const char *cmd, kv_cli_outs_t *o);
/* The two option-table entries, for an options struct holding a
 * kv_cli_outs_t named field: KV_CLI_OUT_OPTS(run_opts_t, out). */
#define KV_CLI_OUT_OPTS(type, field)                                                   \
    {"--json", KV_CLI_OUT, offsetof(type, field.json), 0, 0, 0, 0, "FILE",             \
     KV_CLI_JSON_HELP},                                                                \
    {"--md", KV_CLI_OUT, offsetof(type, field.md), 0, 0, 0, 0, "FILE", KV_CLI_MD_HELP}
/* Write r (NULL: the work failed, write nothing) to the opened outputs and
 * close them (stdout: flushed). 0, or -1 after a message naming what
 * failed (a write error, a full disk). */
int kv_cli_outs_finish(const char *cmd, kv_cli_outs_t *o, const kv_cli_report_t *r);

typedef struct kv_cli_opt {
    const char *name;   /* "--seconds" (also matched as "--seconds=V")   */
    kv_cli_kind_t kind;
    size_t off;         /* offsetof(options struct, field)               */
    uint64_t lo, hi;    /* UINT range                                    */
    double dlo, dhi;    /* DOUBLE range                                  */
    const char *arg;    /* value name in the usage, e.g. "N", "SPEC";    */
                        /* ALIAS: the name of the entry it stands for    */
    const char *help;   /* usage text; may hold '\n' for more lines      */
} kv_cli_opt_t;

/* The remote tier's options that the commands taking --remote share (run,
 * stress; kv_cli_remote.c): credentials and TLS, as kv_config_t's
 * prefix_remote_password_file/_env and prefix_remote_tls_*, and the
 * deployment's key prefix and MAC key sources, as prefix_remote_ns, _mac,
 * _mac_prev. NULL: not given. */
typedef struct kv_cli_remote {
    const char *password_file, *password_env, *tls_ca, *tls_cert, *tls_key;
    const char *ns, *mac, *mac_prev;
} kv_cli_remote_t;
#define KV_CLI_REMOTE_NS_HELP                                                          \
    "key prefix of this deployment's remote values: keys are NS:<hash>\n"              \
    "(default kvp; an ACL user limited to ~NS:* suffices; docs/prefix.md)"
#define KV_CLI_REMOTE_MAC_HELP                                                         \
    "sign every remote value with HMAC-SHA-256 and accept only values\n"               \
    "signed so; SRC = file:PATH or env:NAME holding the key as 64..128\n"              \
    "hex digits (e.g. `openssl rand -hex 32`); refused values are misses,\n"           \
    "counted (prefix_remote_unauth)"
#define KV_CLI_REMOTE_PREV_HELP                                                        \
    "the key before a rotation (same SRC syntax): values it signed are\n"              \
    "still accepted, new ones are signed with --remote-mac"
/* The option-table entries, for an options struct holding a kv_cli_remote_t
 * named field: KV_CLI_REMOTE_OPTS(run_opts_t, ropt). */
#define KV_CLI_REMOTE_OPTS(type, field)                                                \
    {"--remote-password-file", KV_CLI_STR, offsetof(type, field.password_file), 0, 0, 0, \
     0, "FILE", "the remote's AUTH password: the first line of FILE\n"                   \
     "(user, if any, in the URL: redis://user@host:port)"},                            \
    {"--remote-password-env", KV_CLI_STR, offsetof(type, field.password_env), 0, 0, 0,  \
     0, "NAME", "the remote's AUTH password: environment variable NAME"},              \
    {"--remote-tls-ca", KV_CLI_STR, offsetof(type, field.tls_ca), 0, 0, 0, 0, "FILE",   \
     "rediss://: CA certificates (PEM) that verify the server\n"                       \
     "(default: the system's store)"},                                                 \
    {"--remote-tls-cert", KV_CLI_STR, offsetof(type, field.tls_cert), 0, 0, 0, 0,       \
     "FILE", "rediss://: client certificate (PEM), with --remote-tls-key"},            \
    {"--remote-tls-key", KV_CLI_STR, offsetof(type, field.tls_key), 0, 0, 0, 0, "FILE", \
     "rediss://: the client certificate's private key (PEM)"},                         \
    {"--remote-ns", KV_CLI_STR, offsetof(type, field.ns), 0, 0, 0, 0, "NS",             \
     KV_CLI_REMOTE_NS_HELP},                                                           \
    {"--remote-mac", KV_CLI_STR, offsetof(type, field.mac), 0, 0, 0, 0, "SRC",          \
     KV_CLI_REMOTE_MAC_HELP},                                                          \
    {"--remote-mac-prev", KV_CLI_STR, offsetof(type, field.mac_prev), 0, 0, 0, 0,       \
     "SRC", KV_CLI_REMOTE_PREV_HELP}
/* 1 if a credential or TLS option was given (--remote-password-*,
 * --remote-tls-*). */
int kv_cli_remote_given(const kv_cli_remote_t *r);
/* 0, or 2 after a message on stderr: an option given without --remote
 * (remote NULL), --remote-mac-prev without --remote-mac. */
int kv_cli_remote_check(const char *cmd, const kv_cli_remote_t *r, const char *remote);
/* Set c's eight fields from r. */
void kv_cli_remote_apply(const kv_cli_remote_t *r, kv_config_t *c);
/* url as reports and messages show it: its password hidden
 * (kv_prefix_remote_redact), in buf; NULL for NULL. */
const char *kv_cli_remote_shown(const char *url, char *buf, size_t cap);

/* Parse argv[1..argc) (argv[0] = the subcommand) into o. Every argument
 * must be a known option. Returns 0; 1 when --help/-h printed the usage to
 * stdout (exit 0); 2 after printing to stderr why an argument is wrong
 * (naming the option and the accepted range). */
int kv_cli_parse(const char *cmd, const char *synopsis, const kv_cli_opt_t *opts,
                 size_t n_opts, int argc, char **argv, void *o);

/* Print "usage: kvpage <cmd> [options]", the synopsis (may be NULL), and one
 * line per option with its argument name and help. */
void kv_cli_usage(FILE *f, const char *cmd, const char *synopsis,
                  const kv_cli_opt_t *opts, size_t n_opts);

/* Split a comma-separated list of policy specs in place (buf is modified;
 * out[i] point into it). Commas separate specs and also the keys of one
 * spec ("h2o:hh=0.1,rw=0.1,kivi2" is two specs): a piece whose first '='
 * comes before any ':' or '+' continues the previous spec. Empty pieces are
 * skipped. Returns the number of specs, or -1 (message on stderr naming
 * opt) if there are more than max or the list starts with a key=value. */
int kv_cli_split_specs(const char *opt, char *buf, char **out, uint32_t max);

/* ---- chart axes (kv_cli_axis.c) -------------------------------------------
 * A round axis for the SVG charts: ticks every `step` = 1, 2 or 5 x 10^k,
 * from lo to hi (the data range widened outward to whole steps), n steps
 * (n + 1 ticks), n <= max_steps. An empty range becomes [lo, lo + |lo|]
 * (or [0, 1]); a NaN or infinite bound gives [0, 1]. */
typedef struct kv_cli_axis {
    double lo, hi, step; /* lo, hi: multiples of step              */
    int n;               /* steps; ticks are lo + i * step, i 0..n */
} kv_cli_axis_t;

kv_cli_axis_t kv_cli_axis(double lo, double hi, int max_steps);
/* Tick i (0..n), exactly 0 where it rounds to zero. */
double kv_cli_axis_tick(const kv_cli_axis_t *a, int i);
/* The label of tick i in units of scale (e.g. 1e6 for MB): "0.5", "10",
 * "1500" — no more digits than the step needs. */
void kv_cli_axis_label(const kv_cli_axis_t *a, int i, double scale, char *buf, size_t len);

#endif /* KV_CLI_H */
