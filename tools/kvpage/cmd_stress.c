/* SPDX-License-Identifier: MIT */
/*
 * cmd_stress.c — `kvpage stress`: drive the store like a serving engine
 * under constant memory pressure and verify it continuously (docs/stress.md).
 *
 * This file is the command: its option table, the main loop (iterations
 * until --ops or --seconds, a progress line), and the report (text on
 * stdout unless --json or --md is "-"; --json / --md FILE write the same
 * figures as JSON / a Markdown table, kv_cli.h; a reproducer command line
 * on failure). The workload is
 * stress_gen.c, the policy mix stress_mix.c, the serving loop
 * stress_driver.c + stress_step.c, the checks stress_verify.c. Public API
 * only.
 *
 * With --offload the store gets a page file (stress_offload.c drives it):
 * a new file (FILE, or a unique name in DIR) that this command creates
 * through the store and removes, with its index, at the end (also when the
 * store cannot start); an existing file is refused (usage error) and never
 * touched.
 *
 * With --prefix-cache the store's prefix cache is on and requests share
 * system prompts (stress_prefix.c; with --offload its nodes also live on
 * the page file); --remote adds its remote tier, and with
 * --remote local this command starts, kills and restarts a private
 * redis-server and writes corrupt values into it (stress_remote.c,
 * stress_chaos_step), stopping it at the end.
 *
 * Exit codes: 0 clean, 1 a violation or leak (or the store failed), 2 usage.
 */
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "kv_cli.h"
#include "stress_driver.h"
#include "stress_remote.h"

#define STRESS_NOT_GIVEN UINT64_MAX

typedef struct stress_opts {
    double seconds;        /* 0: not given                        */
    uint64_t ops;          /* 0: not given                        */
    uint64_t seed, pool, layers, kv_heads, q_heads, head_dim, max_seqs;
    uint64_t verify_every;
    uint64_t faults;       /* ppm; STRESS_NOT_GIVEN when absent   */
    uint64_t offload_pages; /* 0: 2 x pool                        */
    double rate;
    const char *policy, *dist;
    const char *offload;   /* --offload FILE_OR_DIR, or NULL      */
    int progress, offload_pread;
    int prefix;            /* --prefix-cache                      */
    int prefix_compressed; /* --prefix-compressed                 */
    uint64_t prefix_prompts, prefix_len, prefix_salts;
    double prefix_share;
    const char *remote;    /* --remote URL|local, or NULL         */
    uint64_t remote_timeout, remote_restarts, remote_corrupt;
    kv_cli_outs_t out;     /* --json, --md                        */
    kv_cli_remote_t ropt;  /* --remote-password-*, --remote-tls-*, */
                           /* --remote-ns, --remote-mac*          */
    char offload_file[4096]; /* the page file (a name in DIR)     */
    char remote_shown[1024]; /* --remote as printed: no password  */
} stress_opts_t;

#define OPT(name, kind, field, lo, hi, arg, help) \
    {name, kind, offsetof(stress_opts_t, field), lo, hi, 0, 0, arg, help}
#define OPTD(name, field, dlo, dhi, arg, help) \
    {name, KV_CLI_DOUBLE, offsetof(stress_opts_t, field), 0, 0, dlo, dhi, arg, help}

static const kv_cli_opt_t stress_opt_table[] = {
    OPTD("--seconds", seconds, 0.001, 1e7, "S",
         "stop after S seconds (default 10 when --ops is not given)"),
    OPT("--ops", KV_CLI_UINT, ops, 1, UINT64_MAX / 2, "N",
        "stop at the first iteration boundary at or after N ops\n"
        "(public calls); deterministic: same options, same run"),
    OPT("--seed", KV_CLI_UINT, seed, 0, UINT64_MAX, "N",
        "seed of arrivals, lengths, policies and every K/V/Q value (default 1)"),
    OPT("--pool", KV_CLI_UINT, pool, 16, 1u << 26, "PAGES",
        "pool capacity in pages (default 2048 = 8 MiB at head_dim 64: a few\n"
        "average requests, so KV_ENOMEM is routine)"),
    OPT("--policy", KV_CLI_STR, policy, 0, 0, "LIST",
        "policies separated by '|', one drawn per request (default none =\n"
        "no policy); e.g. 'none|kivi2|h2o:hh=0.1,rw=0.1+cam' (docs/policies.md)"),
    OPT("--dist", KV_CLI_STR, dist, 0, 0, "D",
        "request lengths: sharegpt (log-normal, means 161 in / 338 out,\n"
        "each clipped to [4, 1024]; default), fixed:N,M, uniform:a-b,c-d"),
    OPTD("--rate", rate, 0.001, 64, "R", "mean Poisson arrivals per iteration (default 0.5)"),
    OPT("--layers", KV_CLI_UINT, layers, 1, STRESS_MAX_LAYERS, "N", "layers (default 4)"),
    OPT("--kv-heads", KV_CLI_UINT, kv_heads, 1, 64, "N", "kv heads (default 2)"),
    OPT("--q-heads", KV_CLI_UINT, q_heads, 1, 512, "N",
        "query heads, a multiple of --kv-heads (default 2; 4 for GQA groups\n"
        "of 2, at twice the attention cost)"),
    OPT("--head-dim", KV_CLI_UINT, head_dim, 16, 256, "N",
        "head dim, a multiple of 16 (default 64)"),
    OPT("--max-seqs", KV_CLI_UINT, max_seqs, 1, 4096, "N",
        "the store's max_seqs (default 64; KV_ELIMIT beyond)"),
    OPT("--verify-every", KV_CLI_UINT, verify_every, 0, UINT64_MAX / 2, "N",
        "ops between full verifications of every live sequence (default\n"
        "5000; 0: only at the end)"),
    OPT("--offload", KV_CLI_STR, offload, 0, 0, "FILE_OR_DIR",
        "give the store a page file and offload/prefetch sequences at\n"
        "random (FILE: created, must not exist; DIR: a new file in it);\n"
        "removed at the end (default: no page file)"),
    OPT("--offload-pages", KV_CLI_UINT, offload_pages, 1, 1u << 26, "N",
        "slots of the page file (default 2 x --pool)"),
    OPT("--offload-pread", KV_CLI_FLAG, offload_pread, 0, 0, NULL,
        "the pread/pwrite I/O queue instead of io_uring (exact replays\n"
        "with --faults)"),
    OPT("--faults", KV_CLI_UINT, faults, 0, 1000000, "PPM",
        "faults injected per million page-file I/Os (one page each),\n"
        "split evenly over EIO, ENOSPC, short, torn, bit flip, EAGAIN,\n"
        "EINTR (kv_config_t.offload_fault_ppm); needs --offload"),
    OPT("--prefix-cache", KV_CLI_FLAG, prefix, 0, 0, NULL,
        "shared prefixes: prompts start with one of a few system prompts\n"
        "under one of a few salts; matched (kv_seq_prefix_match) and\n"
        "published (kv_seq_prefix_publish) through the store's prefix cache"),
    OPT("--prefix-prompts", KV_CLI_UINT, prefix_prompts, 1, STRESS_PFX_MAX_PROMPTS, "N",
        "system prompts (default 4)"),
    OPT("--prefix-len", KV_CLI_UINT, prefix_len, 2, STRESS_LEN_MAX, "N",
        "the longest system prompt's tokens; the others spread down to\n"
        "N/2 (default 512)"),
    OPT("--prefix-salts", KV_CLI_UINT, prefix_salts, 1, STRESS_PFX_MAX_SALTS, "N",
        "salts (tenants) requests are spread over (default 2)"),
    OPTD("--prefix-share", prefix_share, 0, 1, "F",
         "fraction of requests that start with a system prompt (default 0.9)"),
    OPT("--prefix-compressed", KV_CLI_FLAG, prefix_compressed, 0, 0, NULL,
        "system prompts as compressed contexts: requests under a policy\n"
        "(not none or minicache) match, or compress and publish, their\n"
        "system prompt with kv_seq_prefix_*_compressed; needs --prefix-cache"),
    OPT("--remote", KV_CLI_STR, remote, 0, 0, "URL|local",
        "the prefix cache's remote tier: a Redis/Valkey URL\n"
        "(redis://host:port[,...]; rediss://: TLS; redis://user@host:port:\n"
        "AUTH as user, the password from --remote-password-*; reports show\n"
        "a url's password as ***), or 'local': a private redis-server this\n"
        "run starts (needed for --remote-restarts)"),
    KV_CLI_REMOTE_OPTS(stress_opts_t, ropt),
    OPT("--remote-timeout", KV_CLI_UINT, remote_timeout, 1, 60000, "MS",
        "bound of one remote fetch (kv_config_t.prefix_remote_timeout_ms,\n"
        "default 200)"),
    OPT("--remote-restarts", KV_CLI_UINT, remote_restarts, 0, 100000, "N",
        "kill (SIGKILL) and restart the local server N times, spread over\n"
        "the run (needs --remote local)"),
    OPT("--remote-corrupt", KV_CLI_UINT, remote_corrupt, 0, UINT32_MAX, "N",
        "overwrite N existing values in the server with corrupt ones\n"
        "(hiredis, not kvpage's client), spread over the first 90% of the run"),
    KV_CLI_OUT_OPTS(stress_opts_t, out),
    OPT("--progress", KV_CLI_FLAG, progress, 0, 0, NULL,
        "progress line on stderr about once a second (default: when stderr is a tty)"),
};

static const char stress_synopsis[] =
    "Drives the store like a serving engine under memory pressure (Poisson arrivals,\n"
    "prefill, batched decode, forks, preemption, policies) and verifies it continuously\n"
    "against a shadow of everything appended. Exit 0 clean, 1 violation, 2 usage.";

/* The remote tier's chaos (--remote): our server, killed and restarted on
 * a schedule, and corrupt values written into it (stress_remote.h). */
typedef struct stress_chaos {
    stress_redis_t red;
    int have;          /* red is in use (--remote local, or --remote-corrupt) */
    uint32_t down;     /* iterations left with the server killed (0: up)      */
    uint64_t kills;
} stress_chaos_t;

static void stress_progress(const stress_driver_t *d, const stress_chaos_t *ch, double t)
{
    kv_stats_t st = {.struct_size = sizeof st};
    kv_store_stats(d->st, &st);
    if (d->cfg.pfx.on) {
        fprintf(stderr, "\rstress %6.1f s  ops %llu  live %u  pages %llu/%llu  prefix hits "
                "%llu/%llu  nodes %llu  remote hits %llu bad %llu errors %llu  restarts %llu  "
                "corrupt %llu  violations %llu ", t, (unsigned long long)d->ops, d->n_live,
                (unsigned long long)st.pages_used, (unsigned long long)st.pages_capacity,
                (unsigned long long)d->pfx.n.hits, (unsigned long long)d->pfx.n.matches,
                (unsigned long long)st.prefix_nodes, (unsigned long long)st.prefix_remote_hits,
                (unsigned long long)st.prefix_remote_bad,
                (unsigned long long)st.prefix_remote_errors,
                (unsigned long long)ch->red.restarts, (unsigned long long)ch->red.injected,
                (unsigned long long)d->vf.violations);
        return;
    }
    fprintf(stderr,
            "\rstress %6.1f s  ops %llu  live %u  queued %u  pages %llu/%llu  enomem %llu  "
            "preempted %llu  violations %llu ",
            t, (unsigned long long)d->ops, d->n_live, d->q_len,
            (unsigned long long)st.pages_used, (unsigned long long)st.pages_capacity,
            (unsigned long long)d->alloc_failures,
            (unsigned long long)d->ev_count[STRESS_EV_PREEMPTED],
            (unsigned long long)d->vf.violations);
}

/* CPU seconds this process used (the machine may be shared: ops_per_s is
 * wall-clock). */
static double stress_cpu_seconds(void)
{
    struct timespec t;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static uint64_t stress_fault_ppm(const stress_opts_t *o)
{
    return o->faults == STRESS_NOT_GIVEN ? 0 : o->faults;
}

#define STRESS_DOWN_ITERS 20u /* iterations the killed server stays down */
#define STRESS_CORRUPT_BURST 256u /* corrupt values per iteration, at most */

/* After an iteration at progress frac (0..1): restart a server that was
 * down long enough; kill it at the k-th of N+1 even steps (the last well
 * before the end); corrupt values on a straight line reaching N at 90%. */
static void stress_chaos_step(const stress_opts_t *o, stress_chaos_t *ch, double frac)
{
    stress_redis_t *r = &ch->red;
    if (!ch->have)
        return;
    if (ch->down && --ch->down == 0)
        stress_redis_restart(r);
    if (o->remote_restarts && !ch->down && ch->kills < o->remote_restarts &&
        frac >= (double)(ch->kills + 1) / (double)(o->remote_restarts + 2)) {
        stress_redis_kill(r);
        ch->kills++;
        ch->down = STRESS_DOWN_ITERS;
    }
    if (o->remote_corrupt && !ch->down) {
        double f = frac / 0.9 < 1 ? frac / 0.9 : 1;
        uint64_t target = (uint64_t)(f * (double)o->remote_corrupt);
        uint64_t want = target > r->injected ? target - r->injected : 0;
        if (want)
            stress_redis_corrupt(r, o->ropt.ns ? o->ropt.ns : "kvp",
                                 want > STRESS_CORRUPT_BURST ? STRESS_CORRUPT_BURST
                                                             : (uint32_t)want);
    }
}

/* The prefix fields of --json / --md: the workload's checks, the store's
 * counters (cumulative, after the final drain; nodes and pages at the
 * stop) and the remote chaos. */
static void stress_fields_prefix(kv_cli_report_t *r, const stress_opts_t *o,
                                 const stress_driver_t *d, const kv_stats_t *st,
                                 const stress_chaos_t *ch)
{
    const stress_pfx_count_t *n = &d->pfx.n;
    const kv_stats_t *f = &d->final;
    kv_cli_rep_b(r, "prefix_cache", o->prefix);
    if (!o->prefix)
        return;
    kv_cli_rep_open(r, "prefix", 0);
    const char *const k[] = {
        "prompts", "prompt_len", "salts", "matches", "hits", "tokens_matched",
        "hits_verified", "own_hits", "publishes", "salt_probes", "drained_nodes",
        "nodes_at_stop", "pages_at_stop", "store_hits", "store_misses", "tokens_reused",
        "published", "evicted", "evicted_pages", "remote_hits", "remote_tokens", "remote_bad",
        "remote_errors", "remote_bytes_in", "remote_put", "remote_dropped", "remote_unauth",
        "ctx_matches", "ctx_hits", "ctx_hits_verified", "ctx_publishes", "ctx_nodes_made",
        "store_ctx_hits", "store_ctx_misses", "store_ctx_published", "file_hits", "file_tokens",
        "file_demoted", "file_dropped", "file_bad"};
    const uint64_t v[] = {
        o->prefix_prompts, o->prefix_len, o->prefix_salts, n->matches, n->hits,
        n->tokens_matched, n->hits_verified, n->own_hits, n->publishes, n->salt_probes,
        n->drained_nodes, st->prefix_nodes, st->prefix_pages, f->prefix_hits,
        f->prefix_misses, f->prefix_tokens_reused, f->prefix_published, f->prefix_evicted,
        f->prefix_evicted_pages, f->prefix_remote_hits, f->prefix_remote_tokens,
        f->prefix_remote_bad, f->prefix_remote_errors, f->prefix_remote_bytes_in,
        f->prefix_remote_put, f->prefix_remote_dropped, f->prefix_remote_unauth,
        n->ctx_matches, n->ctx_hits, n->ctx_hits_verified, n->ctx_publishes, n->ctx_nodes_made,
        f->prefix_ctx_hits, f->prefix_ctx_misses, f->prefix_ctx_published, f->prefix_file_hits,
        f->prefix_file_tokens, f->prefix_file_demoted, f->prefix_file_dropped,
        f->prefix_file_bad};
    _Static_assert(sizeof k / sizeof k[0] == sizeof v / sizeof v[0], "prefix");
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++)
        kv_cli_rep_u(r, k[i], v[i]);
    kv_cli_rep_d(r, "share", o->prefix_share, -1);
    kv_cli_rep_b(r, "compressed", o->prefix_compressed);
    kv_cli_rep_s(r, "remote", o->remote ? (ch->have ? ch->red.url : o->remote_shown) : NULL);
    kv_cli_rep_u(r, "remote_denied", f->prefix_remote_denied);
    kv_cli_rep_u(r, "remote_tls_failures", f->prefix_remote_tls_failures);
    kv_cli_rep_u(r, "remote_restarts", ch->red.restarts);
    kv_cli_rep_u(r, "remote_restart_failures", ch->red.restart_failures);
    kv_cli_rep_u(r, "corrupt_injected", ch->red.injected);
    kv_cli_rep_u(r, "corrupt_no_key", ch->red.no_key);
    kv_cli_rep_open(r, "corrupt_by_kind", 0);
    for (int i = 0; i < STRESS_BAD_COUNT; i++)
        kv_cli_rep_u(r, stress_redis_kind(i), ch->red.by_kind[i]);
    kv_cli_rep_close(r);
    kv_cli_rep_close(r);
}

/* The fields of --json and --md. */
static void stress_fields(kv_cli_report_t *r, const stress_opts_t *o,
                          const stress_driver_t *d, const stress_mix_t *mix,
                          const kv_stats_t *st, const stress_chaos_t *ch, double secs)
{
    kv_cli_rep_s(r, "command", "stress");
    kv_cli_rep_u(r, "seed", o->seed);
    kv_cli_rep_d(r, "seconds", secs, 3);
    kv_cli_rep_d(r, "cpu_seconds", stress_cpu_seconds(), 3);
    kv_cli_rep_u(r, "ops", d->ops);
    kv_cli_rep_d(r, "ops_per_s", secs > 0 ? (double)d->ops / secs : 0.0, 1);
    kv_cli_rep_u(r, "iterations", d->iterations);
    kv_cli_rep_u(r, "violations", d->vf.violations);
    kv_cli_rep_u(r, "leaks", d->vf.leaks);
    kv_cli_rep_u(r, "alloc_failures", d->alloc_failures);
    kv_cli_rep_u(r, "limit_failures", d->limit_failures);
    kv_cli_rep_u(r, "pool_alloc_failures", st->alloc_failures);
    kv_cli_rep_s(r, "policy", o->policy);
    kv_cli_rep_open(r, "policies", 1);
    for (uint32_t i = 0; i < mix->n; i++)
        kv_cli_rep_s(r, NULL, mix->pol[i].spec);
    kv_cli_rep_close(r);
    kv_cli_rep_s(r, "dist", o->dist);
    kv_cli_rep_d(r, "rate", o->rate, -1);
    const char *const shape[] = {"pool", "max_seqs", "layers", "kv_heads", "q_heads",
                                 "head_dim"};
    const uint64_t shape_v[] = {o->pool, o->max_seqs, o->layers, o->kv_heads, o->q_heads,
                                o->head_dim};
    for (size_t i = 0; i < sizeof shape_v / sizeof shape_v[0]; i++)
        kv_cli_rep_u(r, shape[i], shape_v[i]);
    kv_cli_rep_open(r, "op_counts", 0);
    for (int i = 0; i < STRESS_OP_COUNT; i++)
        kv_cli_rep_u(r, stress_op_name((stress_op_t)i), d->op_count[i]);
    kv_cli_rep_close(r);
    kv_cli_rep_open(r, "events", 0);
    for (int i = 0; i < STRESS_EV_COUNT; i++)
        kv_cli_rep_u(r, stress_ev_name((stress_ev_t)i), d->ev_count[i]);
    kv_cli_rep_close(r);
    kv_cli_rep_u(r, "verify_runs", d->verify_runs);
    kv_cli_rep_u(r, "reads", d->vf.reads);
    kv_cli_rep_u(r, "tokens_checked", d->vf.tokens);
    kv_cli_rep_u(r, "merged_by_norm", d->vf.by_norm);
    kv_cli_rep_u(r, "max_live", d->max_live);
    kv_cli_rep_u(r, "pages_peak", st->pages_peak);
    kv_cli_rep_open(r, "max_err", 0);
    kv_cli_rep_d(r, "exact", d->vf.max_err[0], -1);
    kv_cli_rep_d(r, "int2", d->vf.max_err[2], -1);
    kv_cli_rep_d(r, "int4", d->vf.max_err[4], -1);
    kv_cli_rep_close(r);
    kv_cli_rep_open(r, "err_bound", 0);
    kv_cli_rep_d(r, "int2", stress_check_qbound(2), -1);
    kv_cli_rep_d(r, "int4", stress_check_qbound(4), -1);
    kv_cli_rep_close(r);
    const stress_off_count_t *c = &d->off;
    const kv_stats_t *f = &d->final;
    kv_cli_rep_s(r, "offload", o->offload ? o->offload_file : NULL);
    const char *const off[] = {
        "offload_pages", "fault_ppm", "offloads", "prefetches", "waits", "wait_errors",
        "balances", "balance_pages", "syncs", "sync_errors", "file_full", "enotres_checked",
        "read_back", "skipped_reads", "pages_out", "pages_in", "io_errors", "lost_reports",
        "pages_lost", "lost_recovered", "lost_seqs", "faults_injected"};
    const uint64_t off_v[] = {
        f->offload_slots, stress_fault_ppm(o), c->offloads, c->prefetches, c->waits,
        c->wait_errors, c->balances, c->balance_pages, c->syncs, c->sync_errors, c->file_full,
        c->enotres_checked + d->vf.enotres, c->read_back, d->vf.skipped, f->pages_out,
        f->pages_in, f->io_errors, c->lost_reports, c->pages_lost, c->lost_recovered,
        c->lost_seqs, f->offload_faults};
    _Static_assert(sizeof off / sizeof off[0] == sizeof off_v / sizeof off_v[0], "off");
    for (size_t i = 0; i < sizeof off_v / sizeof off_v[0]; i++)
        kv_cli_rep_u(r, off[i], off_v[i]);
    stress_fields_prefix(r, o, d, st, ch);
    kv_cli_rep_b(r, "ok", !d->vf.violations && !d->vf.leaks);
}

static void stress_report_text(const stress_opts_t *o, const stress_driver_t *d,
                               const kv_stats_t *st, const stress_chaos_t *ch, double secs)
{
    printf("kvpage stress: seed %llu, %.1f s (%.1f s CPU), policy '%s', dist %s, pool %llu "
           "pages\n\n", (unsigned long long)o->seed, secs, stress_cpu_seconds(), o->policy, o->dist,
           (unsigned long long)o->pool);
    printf("  %-28s %14llu  (%.0f/s)\n", "ops (public calls)", (unsigned long long)d->ops,
           secs > 0 ? (double)d->ops / secs : 0.0);
    for (int i = 0; i < STRESS_OP_COUNT; i++)
        printf("    %-26s %14llu\n", stress_op_name((stress_op_t)i),
               (unsigned long long)d->op_count[i]);
    printf("  %-28s %14llu\n", "KV_ENOMEM returned", (unsigned long long)d->alloc_failures);
    printf("  %-28s %14llu\n", "KV_ELIMIT returned", (unsigned long long)d->limit_failures);
    printf("  %-28s %14llu\n", "pool allocations refused", (unsigned long long)st->alloc_failures);
    for (int i = 0; i < STRESS_EV_COUNT; i++)
        printf("  %-28s %14llu\n", stress_ev_name((stress_ev_t)i),
               (unsigned long long)d->ev_count[i]);
    printf("  %-28s %14u\n", "most live sequences", d->max_live);
    printf("  %-28s %14llu\n", "pages peak", (unsigned long long)st->pages_peak);
    printf("  %-28s %14llu  (%llu lists read, %llu tokens checked, %llu merged ones "
           "by norm)\n", "full verifications", (unsigned long long)d->verify_runs,
           (unsigned long long)d->vf.reads, (unsigned long long)d->vf.tokens,
           (unsigned long long)d->vf.by_norm);
    printf("  %-28s exact %g, int2 %g <= %g, int4 %g <= %g\n", "max |read - appended|",
           d->vf.max_err[0], d->vf.max_err[2], stress_check_qbound(2), d->vf.max_err[4],
           stress_check_qbound(4));
    if (o->offload) {
        const stress_off_count_t *c = &d->off;
        const kv_stats_t *f = &d->final;
        printf("  %-28s %s (%llu slots), faults %llu ppm\n", "page file", o->offload_file,
               (unsigned long long)f->offload_slots, (unsigned long long)stress_fault_ppm(o));
        printf("  %-28s %14llu  (%llu -ENOSPC: file full)\n", "offloads",
               (unsigned long long)c->offloads, (unsigned long long)c->file_full);
        printf("  %-28s %14llu  (%llu verified right after coming back)\n", "prefetches",
               (unsigned long long)c->prefetches, (unsigned long long)c->read_back);
        printf("  %-28s %14llu  (%llu returned an I/O error)\n", "waits",
               (unsigned long long)c->waits, (unsigned long long)c->wait_errors);
        printf("  %-28s %14llu  (%llu pages written)\n", "balances",
               (unsigned long long)c->balances, (unsigned long long)c->balance_pages);
        printf("  %-28s %14llu  (%llu failed)\n", "syncs", (unsigned long long)c->syncs,
               (unsigned long long)c->sync_errors);
        printf("  %-28s %14llu  (%llu lists not read: page-in in flight)\n",
               "KV_ENOTRES checked", (unsigned long long)(c->enotres_checked + d->vf.enotres),
               (unsigned long long)d->vf.skipped);
        printf("  %-28s %llu out, %llu in, %llu I/O errors, %llu faults injected\n",
               "pages", (unsigned long long)f->pages_out, (unsigned long long)f->pages_in,
               (unsigned long long)f->io_errors, (unsigned long long)f->offload_faults);
        printf("  %-28s %llu reports (%llu pages), %llu recovered, %llu sequences freed\n",
               "lost pages", (unsigned long long)c->lost_reports,
               (unsigned long long)c->pages_lost, (unsigned long long)c->lost_recovered,
               (unsigned long long)c->lost_seqs);
    }
    if (o->prefix) {
        const stress_pfx_count_t *n = &d->pfx.n;
        const kv_stats_t *f = &d->final;
        printf("  %-28s %u prompts of up to %u tokens, %u salts, share %.2f\n",
               "shared prefixes", (unsigned)o->prefix_prompts, (unsigned)o->prefix_len,
               (unsigned)o->prefix_salts, o->prefix_share);
        printf("  %-28s %14llu  (%llu hits, %llu tokens; %llu verified at once, %llu own "
               "blocks)\n", "prefix matches", (unsigned long long)n->matches,
               (unsigned long long)n->hits, (unsigned long long)n->tokens_matched,
               (unsigned long long)n->hits_verified, (unsigned long long)n->own_hits);
        printf("  %-28s %14llu  (%llu nodes made, %llu evicted, %llu drained at the end)\n",
               "prefix publishes", (unsigned long long)n->publishes,
               (unsigned long long)f->prefix_published, (unsigned long long)f->prefix_evicted,
               (unsigned long long)n->drained_nodes);
        printf("  %-28s %14llu  (each matched nothing)\n", "salt probes",
               (unsigned long long)n->salt_probes);
        if (o->offload)
            printf("  %-28s %14llu  (nodes read back, %llu tokens; %llu demoted, %llu "
                   "dropped, %llu failed a check)\n", "prefix nodes on the file",
                   (unsigned long long)f->prefix_file_hits,
                   (unsigned long long)f->prefix_file_tokens,
                   (unsigned long long)f->prefix_file_demoted,
                   (unsigned long long)f->prefix_file_dropped,
                   (unsigned long long)f->prefix_file_bad);
        if (o->prefix_compressed)
            printf("  %-28s %14llu  (%llu hits, %llu equal to their publisher; %llu "
                   "publishes made %llu nodes)\n", "compressed contexts",
                   (unsigned long long)n->ctx_matches, (unsigned long long)n->ctx_hits,
                   (unsigned long long)n->ctx_hits_verified,
                   (unsigned long long)n->ctx_publishes, (unsigned long long)n->ctx_nodes_made);
        if (o->remote)
            printf("  %-28s %s: %llu nodes fetched (%llu tokens), %llu bad values refused, "
                   "%llu keys unanswered, %llu queued, %llu dropped; %llu restarts (%llu "
                   "failed), %llu corrupt values written; %llu keys refused, %llu TLS "
                   "failures\n", "remote",
                   ch->have ? ch->red.url : o->remote_shown,
                   (unsigned long long)f->prefix_remote_hits,
                   (unsigned long long)f->prefix_remote_tokens,
                   (unsigned long long)f->prefix_remote_bad,
                   (unsigned long long)f->prefix_remote_errors,
                   (unsigned long long)f->prefix_remote_put,
                   (unsigned long long)f->prefix_remote_dropped,
                   (unsigned long long)ch->red.restarts,
                   (unsigned long long)ch->red.restart_failures,
                   (unsigned long long)ch->red.injected,
                   (unsigned long long)f->prefix_remote_denied,
                   (unsigned long long)f->prefix_remote_tls_failures);
    }
    printf("  %-28s %14llu\n", "violations", (unsigned long long)d->vf.violations);
    printf("  %-28s %14llu\n", "leaks", (unsigned long long)d->vf.leaks);
}

static void stress_repro(const stress_opts_t *o, uint64_t ops)
{
    fprintf(stderr,
            "kvpage stress: FAILED; reproduce with:\n  kvpage stress --seed %llu --ops %llu "
            "--pool %llu --policy '%s' --dist '%s' --rate %.17g --layers %llu --kv-heads %llu "
            "--q-heads %llu --head-dim %llu --max-seqs %llu --verify-every %llu%s\n",
            (unsigned long long)o->seed, (unsigned long long)ops, (unsigned long long)o->pool,
            o->policy, o->dist, o->rate, (unsigned long long)o->layers,
            (unsigned long long)o->kv_heads, (unsigned long long)o->q_heads,
            (unsigned long long)o->head_dim, (unsigned long long)o->max_seqs,
            (unsigned long long)o->verify_every, o->offload || o->prefix ? " \\" : "");
    if (o->prefix)
        fprintf(stderr, "    --prefix-cache --prefix-prompts %llu --prefix-len %llu "
                "--prefix-salts %llu --prefix-share %.17g%s%s%s (the remote's chaos is not "
                "replayed exactly)\n", (unsigned long long)o->prefix_prompts,
                (unsigned long long)o->prefix_len, (unsigned long long)o->prefix_salts,
                o->prefix_share, o->prefix_compressed ? " --prefix-compressed" : "",
                o->remote ? " --remote " : "", o->remote ? o->remote_shown : "");
    if (o->offload) {
        fprintf(stderr, "    --offload '%s' --offload-pages %llu", o->offload,
                (unsigned long long)o->offload_pages);
        if (o->faults != STRESS_NOT_GIVEN)
            fprintf(stderr, " --faults %llu", (unsigned long long)o->faults);
        fprintf(stderr, "%s\n", o->offload_pread ? " --offload-pread" : "");
    }
}

/* The page file of --offload: the path itself, or a new name in a
 * directory; 0 or -1 (message printed). */
static int stress_offload_file(stress_opts_t *o)
{
    struct stat sb;
    int n;
    if (stat(o->offload, &sb) == 0 && S_ISDIR(sb.st_mode))
        n = snprintf(o->offload_file, sizeof o->offload_file, "%s/kvpage-stress-%ld-%llu.kvp",
                     o->offload, (long)getpid(), (unsigned long long)o->seed);
    else
        n = snprintf(o->offload_file, sizeof o->offload_file, "%s", o->offload);
    if (n <= 0 || (size_t)n >= sizeof o->offload_file - 8) {
        fprintf(stderr, "kvpage stress: --offload: path too long or empty\n");
        return -1;
    }
    if (access(o->offload_file, F_OK) == 0) { /* never remove what we did not create */
        fprintf(stderr, "kvpage stress: --offload: %s exists (give a new file or a "
                        "directory)\n", o->offload_file);
        return -1;
    }
    if (!o->offload_pages)
        o->offload_pages = o->pool * 2 < (1u << 26) ? o->pool * 2 : (1u << 26);
    return 0;
}

/* Remove the page file this run created, with its index. */
static void stress_offload_remove(const stress_opts_t *o)
{
    char idx[sizeof o->offload_file + 8];
    unlink(o->offload_file);
    snprintf(idx, sizeof idx, "%s.idx", o->offload_file);
    unlink(idx);
}

/* Options into cfg (mix parsed into *mix). 0, 1 (--help), or 2. */
static int stress_setup(int argc, char **argv, stress_opts_t *o, stress_mix_t *mix,
                        stress_cfg_t *cfg)
{
    *o = (stress_opts_t){.seed = 1, .pool = 2048, .layers = 4, .kv_heads = 2, .q_heads = 2,
                         .head_dim = 64, .max_seqs = 64, .verify_every = 5000,
                         .faults = STRESS_NOT_GIVEN, .rate = 0.5, .policy = "none",
                         .dist = "sharegpt", .prefix_prompts = 4, .prefix_len = 512,
                         .prefix_salts = 2, .prefix_share = 0.9, .remote_timeout = 200};
    int rc = kv_cli_parse("stress", stress_synopsis, stress_opt_table,
                          sizeof stress_opt_table / sizeof stress_opt_table[0], argc, argv, o);
    if (rc)
        return rc;
    if (!o->offload && (o->faults != STRESS_NOT_GIVEN || o->offload_pages ||
                        o->offload_pread)) {
        fprintf(stderr, "kvpage stress: --faults, --offload-pages and --offload-pread need "
                        "--offload FILE_OR_DIR (a page file)\n");
        return 2;
    }
    if (o->offload && stress_offload_file(o))
        return 2;
    if (!o->prefix && (o->remote || o->prefix_compressed)) {
        fprintf(stderr, "kvpage stress: --remote and --prefix-compressed need --prefix-cache\n");
        return 2;
    }
    if (kv_cli_remote_given(&o->ropt) && (!o->remote || !strcmp(o->remote, "local"))) {
        fprintf(stderr, "kvpage stress: --remote-password-* and --remote-tls-* need "
                        "--remote URL (not local: that server has no password or TLS)\n");
        return 2;
    }
    kv_cli_remote_shown(o->remote, o->remote_shown, sizeof o->remote_shown);
    if ((o->remote_restarts && (!o->remote || strcmp(o->remote, "local"))) ||
        (o->remote_corrupt && !o->remote)) {
        fprintf(stderr, "kvpage stress: --remote-restarts needs --remote local (a server "
                        "this run owns), --remote-corrupt needs --remote\n");
        return 2;
    }
    if (kv_cli_remote_check("stress", &o->ropt, o->remote))
        return 2;
    if (o->prefix && o->faults != STRESS_NOT_GIVEN) {
        fprintf(stderr, "kvpage stress: --faults and --prefix-cache are not combined yet (the "
                        "final drain of the page file cannot tell an injected ENOSPC from a "
                        "full file)\n");
        return 2;
    }
    if (o->q_heads % o->kv_heads || o->head_dim % 16) {
        fprintf(stderr, "kvpage stress: --q-heads must be a multiple of --kv-heads and "
                        "--head-dim a multiple of 16\n");
        return 2;
    }
    if (!o->ops && o->seconds == 0)
        o->seconds = 10;
    char err[512];
    *cfg = (stress_cfg_t){.layers = (uint32_t)o->layers, .kv_heads = (uint32_t)o->kv_heads,
                          .q_heads = (uint32_t)o->q_heads, .head_dim = (uint32_t)o->head_dim,
                          .pool = o->pool, .max_seqs = (uint32_t)o->max_seqs,
                          .seed = o->seed, .rate = o->rate, .verify_every = o->verify_every,
                          .mix = mix, .offload_path = o->offload ? o->offload_file : NULL,
                          .offload_pages = (uint32_t)o->offload_pages,
                          .fault_ppm = (uint32_t)stress_fault_ppm(o),
                          .offload_pread = o->offload_pread,
                          .pfx = {.on = o->prefix, .prompts = (uint32_t)o->prefix_prompts,
                                  .prompt_len = (uint32_t)o->prefix_len,
                                  .salts = (uint32_t)o->prefix_salts,
                                  .share = o->prefix_share,
                                  .compressed = o->prefix_compressed, .remote = o->remote,
                                  .ropt = o->ropt,
                                  .timeout_ms = (uint32_t)o->remote_timeout}};
    if (stress_dist_parse(o->dist, &cfg->dist, err, sizeof err) ||
        stress_mix_parse(o->policy, cfg->layers, mix, err, sizeof err)) {
        fprintf(stderr, "kvpage stress: %s\n", err);
        return 2;
    }
    return 0;
}

int kv_cmd_stress(int argc, char **argv)
{
    stress_opts_t o;
    stress_mix_t mix;
    stress_cfg_t cfg;
    memset(&mix, 0, sizeof mix);
    int rc = stress_setup(argc, argv, &o, &mix, &cfg);
    if (rc)
        return rc == 1 ? 0 : 2;
    if (kv_cli_outs_open("stress", &o.out)) { /* outputs before the work */
        stress_mix_destroy(&mix);
        return 2;
    }
    stress_driver_t d;
    stress_chaos_t ch = {0};
    char err[512];
    if (o.remote) { /* our server, or the injector's connection to theirs */
        rc = !strcmp(o.remote, "local") ? stress_redis_spawn(&ch.red, o.seed, err, sizeof err)
             : o.remote_corrupt ? stress_redis_attach(&ch.red, o.remote, o.seed, err, sizeof err)
                                : 0;
        ch.have = !rc && (!strcmp(o.remote, "local") || o.remote_corrupt);
        if (!strcmp(o.remote, "local") && !rc)
            cfg.pfx.remote = ch.red.url;
        if (rc) {
            fprintf(stderr, "kvpage stress: %s\n", err);
            kv_cli_outs_finish("stress", &o.out, NULL);
            stress_mix_destroy(&mix);
            return 2;
        }
    }
    rc = stress_driver_create(&cfg, &d, stderr, err, sizeof err);
    if (rc) {
        fprintf(stderr, "kvpage stress: %s\n", err);
        stress_redis_stop(&ch.red);
        if (o.offload)
            stress_offload_remove(&o); /* it did not exist before */
        kv_cli_outs_finish("stress", &o.out, NULL);
        stress_mix_destroy(&mix);
        return rc == KV_ENOMEM || rc == KV_EIO ? 1 : 2;
    }
    const int progress = o.progress || isatty(2);
    const double t0 = kv_cli_now();
    double now = t0, shown = t0;
    for (;;) {
        stress_driver_step(&d);
        now = kv_cli_now();
        if ((o.ops && d.ops >= o.ops) || (o.seconds > 0 && now - t0 >= o.seconds))
            break;
        stress_chaos_step(&o, &ch, o.ops ? (double)d.ops / (double)o.ops
                                         : (now - t0) / o.seconds);
        if (progress && now - shown >= 1.0) {
            stress_progress(&d, &ch, now - t0);
            shown = now;
        }
    }
    if (ch.down) /* the run ended with the server down: bring it back */
        stress_redis_restart(&ch.red);
    if (progress)
        fprintf(stderr, "\n");
    const uint64_t ops_at_stop = d.ops;
    kv_stats_t st = {.struct_size = sizeof st};
    kv_store_stats(d.st, &st);
    stress_driver_finish(&d);
    double secs = kv_cli_now() - t0;
    kv_cli_report_t rep = {.cmd = "stress"};
    stress_fields(&rep, &o, &d, &mix, &st, &ch, secs);
    if (o.out.plain)
        stress_report_text(&o, &d, &st, &ch, secs);
    int bad = d.vf.violations || d.vf.leaks;
    int lost = kv_cli_outs_finish("stress", &o.out, &rep);
    if (bad)
        stress_repro(&o, ops_at_stop);
    stress_driver_destroy(&d);
    stress_redis_stop(&ch.red);
    if (o.offload)
        stress_offload_remove(&o);
    stress_mix_destroy(&mix);
    return bad || lost ? 1 : 0;
}
