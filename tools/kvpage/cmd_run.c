/* SPDX-License-Identifier: MIT */
/*
 * cmd_run.c — `kvpage run`: generate text with SmolLM2-135M-Instruct whose
 * KV cache lives in a kvpage store.
 *
 * Finds and checks the model file (kv_model_find/verify: --model, then
 * $KVPAGE_MODEL, $KVPAGE_MODEL_DIR, the user cache), renders the prompt with
 * the instruct chat template, prefills it through the store, then samples
 * (greedy unless --temp > 0) and streams each token to stdout as it comes,
 * stopping at a control token (<|im_end|>) or --max-new. Then prints the
 * memory and speed table. --json / --md FILE write the same figures (and the
 * text) as JSON / a Markdown table (kv_cli.h); with either one "-", stdout
 * gets only that report: no stream, no table.
 * Its compression ratio is against an unpaged FP16 cache of every token the
 * sequence has seen (prompt + decoded), so a policy that evicts tokens gets
 * credit for them; ratio_held is against the tokens still held (formats and
 * page packing only).
 * Progress and errors go to stderr. Exit codes: 0 ok, 1 failure (model
 * missing or damaged included), 2 usage.
 */
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kv_cli.h"
#include "kv_model.h"
#include "kv_tok.h"
#include "kvpage/kvpage.h"

#define RUN_DEFAULT_PROMPT "Explain in three sentences why the sky is blue."

typedef struct run_opts {
    const char *prompt, *system, *model, *policy, *salt, *remote;
    const char *offload;   /* --offload FILE, or NULL */
    uint64_t max_new, seed, threads, runs, offload_pages;
    double temp;
    kv_cli_outs_t out; /* --json, --md */
    kv_cli_remote_t ropt; /* --remote-password-*, --remote-tls-*, --remote-ns, --remote-mac* */
    int prefix_cache;
    int prefix_compressed; /* the context published compressed */
} run_opts_t;

static const kv_cli_opt_t run_opts[] = {
    {"--prompt", KV_CLI_TEXT, offsetof(run_opts_t, prompt), 0, 0, 0, 0, "TEXT",
     "the user message (default: \"" RUN_DEFAULT_PROMPT "\")"},
    {"--system", KV_CLI_TEXT, offsetof(run_opts_t, system), 0, 0, 0, 0, "TEXT",
     "the system message (default: SmolLM's)"},
    {"--max-new", KV_CLI_UINT, offsetof(run_opts_t, max_new), 0, 1u << 20, 0, 0, "N",
     "most tokens to generate (default 64)"},
    {"--temp", KV_CLI_DOUBLE, offsetof(run_opts_t, temp), 0, 0, 0, 100, "T",
     "sampling temperature; 0 = greedy (default 0)"},
    {"--seed", KV_CLI_UINT, offsetof(run_opts_t, seed), 0, UINT64_MAX, 0, 0, "N",
     "sampling seed (default 1)"},
    {"--threads", KV_CLI_UINT, offsetof(run_opts_t, threads), 0, 1024, 0, 0, "N",
     "compute threads (default: all CPUs)"},
    {"--model", KV_CLI_STR, offsetof(run_opts_t, model), 0, 0, 0, 0, "FILE",
     "the .gguf file (default: $KVPAGE_MODEL, else\n$KVPAGE_MODEL_DIR or "
     "~/.cache/kvpage/" KV_MODEL_FILE_NAME ")"},
    {"--policy", KV_CLI_STR, offsetof(run_opts_t, policy), 0, 0, 0, 0, "SPEC",
     "KV cache policy (default fp16), e.g. kivi2, h2o:hh=0.1,rw=0.1,\n"
     "minikv:hh=0.25,rw=0.25,pyramid=7 (see docs/policies.md)"},
    KV_CLI_OUT_OPTS(run_opts_t, out),
    {"--prefix-cache", KV_CLI_FLAG, offsetof(run_opts_t, prefix_cache), 0, 0, 0, 0, NULL,
     "publish the prompt's blocks and match them in later runs\n"
     "(docs/prefix.md; with --runs 2 the second run skips them)"},
    {"--prefix-compressed", KV_CLI_FLAG, offsetof(run_opts_t, prefix_compressed), 0, 0, 0, 0,
     NULL,
     "with --prefix-cache: the context (the chat template through\n"
     "the system message, up to the user message) is compressed by\n"
     "the policy at its end and published compressed; later runs\n"
     "with the same system message skip its prefill, scoring and\n"
     "compression (docs/prefix.md, \"Compressed contexts\")"},
    {"--remote", KV_CLI_STR, offsetof(run_opts_t, remote), 0, 0, 0, 0, "URL",
     "prefix cache shared through Redis/Valkey: redis://host:port,\n"
     "or a cluster's seeds redis://h1:p1,h2:p2 (with --prefix-cache);\n"
     "rediss://: TLS; redis://user@host:port: AUTH as user (the password\n"
     "from --remote-password-*; reports show a url's password as ***)"},
    KV_CLI_REMOTE_OPTS(run_opts_t, ropt),
    {"--offload", KV_CLI_STR, offsetof(run_opts_t, offload), 0, 0, 0, 0, "FILE",
     "give the store a page file (and FILE.idx): created when absent,\n"
     "else opened and its contents restored. With --prefix-cache the\n"
     "cache's nodes are kept on it (evicted ones, and every node at\n"
     "exit), so a later run in another process matches them\n"
     "(docs/prefix.md, \"The page-file tier\")"},
    {"--offload-pages", KV_CLI_UINT, offsetof(run_opts_t, offload_pages), 1, 1u << 26, 0, 0,
     "N", "slots of a new page file, one page each (default 65536)"},
    {"--salt", KV_CLI_STR, offsetof(run_opts_t, salt), 0, 0, 0, 0, "S",
     "prefix-cache isolation key: runs with other salts never share"},
    {"--runs", KV_CLI_UINT, offsetof(run_opts_t, runs), 1, 64, 0, 0, "N",
     "run the request N times in one store (default 1)"},
    /* short names, as llama.cpp users type them */
    {"-m", KV_CLI_ALIAS, 0, 0, 0, 0, 0, "--model", NULL},
    {"-p", KV_CLI_ALIAS, 0, 0, 0, 0, 0, "--prompt", NULL},
    {"-n", KV_CLI_ALIAS, 0, 0, 0, 0, 0, "--max-new", NULL},
    {"-t", KV_CLI_ALIAS, 0, 0, 0, 0, 0, "--threads", NULL},
};

/* 0 ok, 1 help printed, 2 usage error. */
static int run_parse(int argc, char **argv, run_opts_t *o)
{
    *o = (run_opts_t){.prompt = RUN_DEFAULT_PROMPT, .policy = "fp16", .max_new = 64,
                      .seed = 1, .runs = 1, .offload_pages = 65536};
    int rc = kv_cli_parse("run", "Fetch the model once with scripts/fetch_model.sh "
                                 "(make run does it).",
                          run_opts, sizeof run_opts / sizeof run_opts[0], argc, argv, o);
    if (rc)
        return rc;
    if ((o->salt || o->remote || o->prefix_compressed) && !o->prefix_cache) {
        fprintf(stderr, "kvpage run: --salt, --remote and --prefix-compressed need "
                        "--prefix-cache\n");
        return 2;
    }
    if (kv_cli_remote_check("run", &o->ropt, o->remote))
        return 2;
    if (o->offload_pages != 65536 && !o->offload) {
        fprintf(stderr, "kvpage run: --offload-pages needs --offload FILE\n");
        return 2;
    }
    kv_policy_t *pol = NULL;
    char perr[256] = "";
    if (kv_policy_parse(o->policy, &pol, perr, sizeof perr)) {
        fprintf(stderr, "kvpage run: --policy '%s': %s (grammar: docs/policies.md)\n",
                o->policy, perr);
        return 2;
    }
    kv_policy_destroy(pol);
    return kv_cli_outs_open("run", &o->out); /* outputs before the work */
}


typedef struct run_stream {
    const kv_tok_t *tok;
    int print;          /* stream pieces to stdout                        */
    kv_store_t *store;  /* the policy's sequence: prefill end at the first */
    kv_seq_id_t seq;    /* token, a step end after every later one        */
    uint32_t n_seen;    /* tokens seen so far                             */
    int rc;             /* a policy call's error (stops generation)       */
    const int32_t *ids; /* the prompt [n_ids], published (--prefix-cache) */
    uint32_t n_ids;     /* before the prefill end, at the first token     */
    const char *salt;
    double t0, ttft;    /* the request's start; seconds to the 1st token  */
    kv_model_session_t *sess; /* KVzip: its reconstruction passes run on  */
    const int32_t *prompt;    /* the whole prompt [n_prompt] (KVzip only) */
    uint32_t n_prompt;
    int ctx;            /* the context was prefill-ended (--prefix-      */
                        /* compressed): the prompt's end is a step end    */
} run_stream_t;


/* Tell the policy where generation stands (the first token comes from the
 * prompt's logits; each later one from a decode step); stop at any control
 * token (<|im_end|>, <|endoftext|>, ...); else print. */
static int run_on_token(void *user, int32_t id)
{
    run_stream_t *rs = user;
    if (rs->n_seen == 0) {
        rs->ttft = kv_cli_now() - rs->t0;
        if (rs->ids) {
            int prc = kv_seq_prefix_publish(rs->store, rs->seq, rs->ids, rs->n_ids, rs->salt,
                                            rs->salt ? strlen(rs->salt) : 0);
            rs->rc = prc < 0 ? prc : 0;
            if (rs->rc)
                return 1;
        }
    }
    if (rs->n_seen == 0 && rs->prompt) /* KVzip: score the prompt first */
        rs->rc = kv_model_kvzip_score(rs->sess, rs->tok, rs->prompt, rs->n_prompt, 0,
                                      KV_MODEL_KVZIP_CHUNK);
    if (rs->rc)
        return 1;
    rs->rc = rs->n_seen++ || rs->ctx ? kv_seq_step_end(rs->store, rs->seq)
                                     : kv_seq_prefill_end(rs->store, rs->seq);
    if (rs->rc)
        return 1;
    if (kv_tok_type(rs->tok, id) == KV_TOK_CONTROL)
        return 1;
    const char *p;
    size_t len;
    if (rs->print && !kv_tok_piece(rs->tok, id, &p, &len)) {
        fwrite(p, 1, len, stdout);
        fflush(stdout);
    }
    return 0;
}

/* --prefix-compressed: the context ids[0, n) from the cache, or computed
 * (forward, KVzip's scoring pass, prefill end) and published compressed.
 * *matched: n on a hit, else 0. */
static int run_context(kv_model_session_t *s, kv_store_t *store, kv_seq_id_t seq,
                       const kv_tok_t *tok, const int32_t *ids, uint32_t n, int kvzip,
                       const char *salt, uint32_t *matched)
{
    const size_t sl = salt ? strlen(salt) : 0;
    int rc = kv_model_session_context(s, ids, n, salt, sl, matched);
    if (rc || *matched)
        return rc;
    if (!(rc = kv_model_forward(s, ids, n, NULL, 0)) && kvzip)
        rc = kv_model_kvzip_score(s, tok, ids, n, 0, KV_MODEL_KVZIP_CHUNK);
    if (!rc)
        rc = kv_seq_prefill_end(store, seq);
    return rc ? rc : kv_seq_prefix_publish_compressed(store, seq, ids, n, salt, sl);
}

static int run_fail(const char *what, int rc, const char *err)
{
    if (err && *err)
        fprintf(stderr, "kvpage run: %s\n", err);
    else
        fprintf(stderr, "kvpage run: %s failed: %s (%d)\n", what, kv_strerror(rc), rc);
    return 1;
}

typedef struct run_out {
    const run_opts_t *o;
    const char *path;
    uint32_t threads;
    const kv_stats_t *st;
    const kv_model_gen_result_t *g;
    int stopped_control;
    const char *text;
    size_t text_len;
    uint32_t n_lists;          /* layers x kv heads */
    uint32_t head_dim;
    double ttft;               /* seconds from the request to its first token */
    uint32_t matched;          /* prompt tokens the prefix cache gave (last run) */
    uint32_t n_prompt;         /* prompt tokens (cached or computed)             */
} run_out_t;

/* The table on stdout; then --json and --md (the same figures): 0, or 1
 * after a message (a write failed). */
static int run_report(const run_out_t *r, kv_cli_outs_t *out)
{
    const kv_stats_t *st = r->st;
    const kv_model_gen_result_t *g = r->g;
    double pf = g->prefill_s > 0 ? g->n_prompt / g->prefill_s : 0;
    double dc = g->decode_s > 0 ? g->n_decoded / g->decode_s : 0;
    /* every token whose K/V went into the store: the prompt and each token
     * fed back by a decode step; K and V, FP16, of every list */
    uint64_t seen = (uint64_t)r->n_prompt + g->n_decoded;
    uint64_t fp16_seen = seen * r->n_lists * 2u * r->head_dim * 2u;
    double ratio = st->kv_bytes ? (double)fp16_seen / (double)st->kv_bytes : 0;
    double ratio_held = st->kv_bytes ? (double)st->fp16_bytes / (double)st->kv_bytes : 0;
    const char *stop = r->stopped_control ? "eos" : "max_new";
    kv_cli_report_t rep = {.cmd = "run"};
    kv_cli_rep_s(&rep, "command", "run");
    kv_cli_rep_s(&rep, "model", r->path);
    kv_cli_rep_s(&rep, "policy", r->o->policy);
    kv_cli_rep_u(&rep, "threads", r->threads);
    kv_cli_rep_d(&rep, "temp", r->o->temp, -1);
    kv_cli_rep_u(&rep, "seed", r->o->seed);
    kv_cli_rep_u(&rep, "prompt_tokens", r->n_prompt);
    kv_cli_rep_u(&rep, "generated_tokens", g->n_new - (r->stopped_control ? 1u : 0u));
    kv_cli_rep_s(&rep, "stop", stop);
    kv_cli_rep_sn(&rep, "text", r->text, r->text_len);
    kv_cli_rep_u(&rep, "tokens_seen", seen);
    kv_cli_rep_u(&rep, "fp16_seen_bytes", fp16_seen);
    kv_cli_rep_u(&rep, "kv_bytes", st->kv_bytes);
    kv_cli_rep_u(&rep, "fp16_bytes", st->fp16_bytes);
    kv_cli_rep_d(&rep, "ratio", ratio, 4);
    kv_cli_rep_d(&rep, "ratio_held", ratio_held, 4);
    kv_cli_rep_u(&rep, "page_bytes", st->page_bytes);
    kv_cli_rep_u(&rep, "pages_used", st->pages_used);
    kv_cli_rep_u(&rep, "pages_capacity", st->pages_capacity);
    kv_cli_rep_s(&rep, "tier", "host");
    kv_cli_rep_d(&rep, "prefill_tokens_per_s", pf, 2);
    kv_cli_rep_d(&rep, "decode_tokens_per_s", dc, 2);
    kv_cli_rep_d(&rep, "prefill_s", g->prefill_s, 3);
    kv_cli_rep_d(&rep, "decode_s", g->decode_s, 3);
    kv_cli_rep_d(&rep, "ttft_s", r->ttft, 3);
    kv_cli_rep_u(&rep, "runs", r->o->runs);
    kv_cli_rep_b(&rep, "prefix_cache", r->o->prefix_cache);
    kv_cli_rep_u(&rep, "prefix_tokens_matched", r->matched);
    kv_cli_rep_u(&rep, "prefix_hits", st->prefix_hits);
    kv_cli_rep_u(&rep, "prefix_misses", st->prefix_misses);
    kv_cli_rep_u(&rep, "prefix_tokens_reused", st->prefix_tokens_reused);
    kv_cli_rep_u(&rep, "prefix_nodes", st->prefix_nodes);
    kv_cli_rep_b(&rep, "prefix_compressed", r->o->prefix_compressed);
    kv_cli_rep_u(&rep, "prefix_ctx_hits", st->prefix_ctx_hits);
    kv_cli_rep_u(&rep, "prefix_ctx_misses", st->prefix_ctx_misses);
    kv_cli_rep_u(&rep, "prefix_remote_tokens", st->prefix_remote_tokens);
    kv_cli_rep_u(&rep, "prefix_remote_bad", st->prefix_remote_bad);
    kv_cli_rep_u(&rep, "prefix_remote_unauth", st->prefix_remote_unauth);
    kv_cli_rep_u(&rep, "prefix_remote_errors", st->prefix_remote_errors);
    kv_cli_rep_u(&rep, "prefix_remote_denied", st->prefix_remote_denied);
    kv_cli_rep_u(&rep, "prefix_remote_tls_failures", st->prefix_remote_tls_failures);
    char shown[1024];
    kv_cli_rep_s(&rep, "remote", kv_cli_remote_shown(r->o->remote, shown, sizeof shown));
    kv_cli_rep_u(&rep, "prefix_file_tokens", st->prefix_file_tokens);
    kv_cli_rep_u(&rep, "prefix_file_nodes", st->prefix_file_nodes);
    kv_cli_rep_u(&rep, "prefix_file_demoted", st->prefix_file_demoted);
    kv_cli_rep_u(&rep, "prefix_file_bad", st->prefix_file_bad);
    if (r->o->out.plain) {
        printf("\n\nkvpage run: %u prompt + %u generated tokens (stopped at %s), policy %s, "
               "%u threads, CPU backend\n\n",
               r->n_prompt, g->n_new - (r->stopped_control ? 1u : 0u), stop,
               r->o->policy, r->threads);
        printf("  %-36s %16s\n", "metric", "value");
        printf("  %-36s %16llu\n", "KV bytes held (pages)", (unsigned long long)st->kv_bytes);
        printf("  %-36s %16llu\n", "FP16 bytes of all tokens seen", (unsigned long long)fp16_seen);
        printf("  %-36s %16llu\n", "FP16 bytes of the tokens held",
               (unsigned long long)st->fp16_bytes);
        printf("  %-36s %16.3f\n", "compression ratio (seen / held)", ratio);
        printf("  %-36s %16.3f\n", "held ratio (FP16 of held / held)", ratio_held);
        printf("  %-36s %16u\n", "page bytes", st->page_bytes);
        printf("  %-36s %9llu / %llu\n", "pages used / capacity (tier host)",
               (unsigned long long)st->pages_used, (unsigned long long)st->pages_capacity);
        printf("  %-36s %16.1f\n", "prefill tokens/s", pf);
        printf("  %-36s %16.1f\n", "decode tokens/s", dc);
        printf("  %-36s %16.3f\n", "time to first token (s)", r->ttft);
        if (r->o->prefix_cache) {
            printf("  %-36s %9u / %u\n", "prompt tokens from the prefix cache", r->matched,
                   r->n_prompt);
            printf("  %-36s %9llu / %llu\n", "prefix hits / misses (all runs)",
                   (unsigned long long)st->prefix_hits, (unsigned long long)st->prefix_misses);
            printf("  %-36s %16llu\n", "prefix cache nodes",
                   (unsigned long long)st->prefix_nodes);
            if (r->o->prefix_compressed)
                printf("  %-36s %9llu / %llu\n", "compressed context hits / misses",
                       (unsigned long long)st->prefix_ctx_hits,
                       (unsigned long long)st->prefix_ctx_misses);
            if (st->prefix_file_nodes || st->prefix_file_hits || st->prefix_file_demoted)
                printf("  %-36s %16llu\n  %-36s %9llu / %llu\n",
                       "tokens from the page file (all runs)",
                       (unsigned long long)st->prefix_file_tokens,
                       "nodes on the file / demoted", (unsigned long long)st->prefix_file_nodes,
                       (unsigned long long)st->prefix_file_demoted);
            if (r->o->remote)
                printf("  %-36s %s\n  %-36s %16llu\n  %-36s %9llu / %llu / %llu\n"
                       "  %-36s %9llu / %llu\n",
                       "remote", shown, "tokens from the remote (all runs)",
                       (unsigned long long)st->prefix_remote_tokens,
                       "remote values bad / unauth / errors",
                       (unsigned long long)st->prefix_remote_bad,
                       (unsigned long long)st->prefix_remote_unauth,
                       (unsigned long long)st->prefix_remote_errors,
                       "remote keys refused / TLS failures",
                       (unsigned long long)st->prefix_remote_denied,
                       (unsigned long long)st->prefix_remote_tls_failures);
        }
        printf("\n(ratio < 1 for plain FP16 pages: the last page of each of the %u "
               "(layer, kv head) lists is partly filled)\n",
               r->n_lists);
    }
    return kv_cli_outs_finish("run", out, &rep) ? 1 : 0;
}

int kv_cmd_run(int argc, char **argv)
{
    run_opts_t o;
    int prc = run_parse(argc, argv, &o);
    if (prc)
        return prc == 1 ? 0 : 2;
    char path[4096], err[512] = "";
    int pinned = 0, rc, ret = 1;
    const char *what = "finding the model";
    if (!(rc = kv_model_find(o.model, path, sizeof path, &pinned, err, sizeof err))) {
        fprintf(stderr, "kvpage run: model %s\n", path);
        what = "checking the model";
        rc = kv_model_verify(path, pinned, err, sizeof err);
    }
    if (rc) {
        kv_cli_outs_finish("run", &o.out, NULL); /* opened by run_parse */
        return run_fail(what, rc, err);
    }
    kv_model_t *m = NULL;
    kv_tok_t *tok = NULL;
    kv_store_t *store = NULL;
    kv_model_session_t *s = NULL;
    kv_policy_t *pol = NULL;
    int32_t *ids = NULL, *out = NULL;
    char *text = NULL;
    if ((rc = kv_model_load(path, &m, err, sizeof err))) {
        fprintf(stderr, "kvpage run: %s%s%s\n", err, pinned ? "; " : "",
                pinned ? KV_MODEL_FETCH_HINT : "");
        goto done;
    }
    if ((rc = kv_tok_from_gguf(kv_model_gguf(m), &tok, err, sizeof err))) {
        run_fail("building the tokenizer", rc, err);
        goto done;
    }
    size_t n_prompt = 0, n_ctx = 0; /* n_ctx: the ids before the user message */
    if ((rc = kv_tok_chat_split(tok, o.system, "", o.prompt, NULL, 0, &n_prompt, &n_ctx)) ||
        !(ids = malloc(n_prompt * sizeof *ids)) ||
        (rc = kv_tok_chat_split(tok, o.system, "", o.prompt, ids, n_prompt, &n_prompt,
                                &n_ctx))) {
        run_fail("tokenizing the prompt", rc ? rc : KV_ENOMEM, NULL);
        goto done;
    }
    const kv_model_hparams_t *hp = kv_model_hparams(m);
    if (n_prompt + o.max_new > hp->n_ctx) {
        fprintf(stderr, "kvpage run: prompt (%zu tokens) + --max-new %llu exceed the model's "
                "context of %u tokens\n", n_prompt, (unsigned long long)o.max_new, hp->n_ctx);
        ret = 2;
        goto done;
    }
    if ((rc = kv_policy_parse(o.policy, &pol, err, sizeof err))) {
        run_fail("attaching the policy", rc, NULL);
        goto done;
    }
    kv_policy_info_t pin;
    const int kvzip = !kv_policy_info(pol, 1, 0, &pin) && (pin.methods & KV_POLICY_KVZIP);
    uint32_t max_tokens = (uint32_t)(n_prompt + o.max_new);
    kv_config_t cfg;
    char fp[65];
    /* room for the cache's copy of a prompt beside the running sequence,
     * and for KVzip's reconstruction pass (a chunk and its instruction) */
    if ((rc = kv_model_store_config(m, max_tokens + (kvzip ? kv_model_kvzip_room(
                                                             KV_MODEL_KVZIP_CHUNK) : 0),
                                    1 + (o.prefix_cache != 0) + kvzip, (uint32_t)o.threads,
                                    &cfg))) {
        run_fail("creating the store", rc, NULL);
        goto done;
    }
    if (o.prefix_cache) {
        if ((rc = kv_model_file_sha256(path, pinned, fp))) {
            run_fail("fingerprinting the model", rc, NULL);
            goto done;
        }
        cfg.prefix_cache = 1;
        cfg.prefix_model = fp;
        cfg.prefix_model_len = 64;
        cfg.prefix_remote = o.remote;
        kv_cli_remote_apply(&o.ropt, &cfg);
    }
    if (o.offload) { /* an existing file is opened, its contents restored */
        cfg.offload_path = o.offload;
        cfg.offload_pages = (uint32_t)o.offload_pages;
        cfg.offload_flags = access(o.offload, F_OK) == 0 ? KV_OFFLOAD_OPEN : 0;
    }
    if ((rc = kv_store_create(&cfg, &store)) || (rc = kv_store_config(store, &cfg))) {
        run_fail("creating the store", rc, NULL);
        goto done;
    }
    out = malloc((o.max_new ? o.max_new : 1) * sizeof *out);
    if (!out) {
        run_fail("allocating", KV_ENOMEM, NULL);
        goto done;
    }
    kv_model_gen_result_t gr;
    run_stream_t rs;
    uint32_t matched = 0;
    for (uint64_t run = 0; run < o.runs; run++) {
        kv_model_session_free(s);
        s = NULL;
        kv_model_session_opts_t so = {.store = store, .max_ctx = max_tokens,
                                      .n_threads = (int)o.threads};
        kv_seq_id_t seq;
        if ((rc = kv_model_session_create(m, &so, &s))) {
            run_fail("creating the session", rc, NULL);
            break;
        }
        if ((rc = kv_model_session_seq(s, &seq)) || (rc = kv_seq_set_policy(store, seq, pol))) {
            run_fail("attaching the policy", rc, NULL);
            break;
        }
        rs = (run_stream_t){.tok = tok, .print = o.out.plain, .store = store, .seq = seq,
                            .salt = o.salt, .t0 = kv_cli_now(), .sess = s,
                            .prompt = kvzip ? ids : NULL, .n_prompt = (uint32_t)n_prompt};
        matched = 0;
        if (o.prefix_compressed) {
            rs.prompt = NULL; /* scored with the context */
            rs.ctx = 1;
            if ((rc = run_context(s, store, seq, tok, ids, (uint32_t)n_ctx, kvzip, o.salt,
                                  &matched))) {
                run_fail("the compressed context", rc, NULL);
                break;
            }
        } else if (o.prefix_cache) {
            rs.ids = ids;
            rs.n_ids = (uint32_t)n_prompt;
            if ((rc = kv_model_session_prefix(s, ids, (uint32_t)n_prompt, o.salt,
                                              o.salt ? strlen(o.salt) : 0, &matched))) {
                run_fail("matching the prefix cache", rc, NULL);
                break;
            }
        }
        const size_t from = o.prefix_compressed ? n_ctx : matched;
        fprintf(stderr, "kvpage run: %zu prompt tokens (%u from the prefix cache%s), "
                "prefilling %zu...\n", n_prompt, matched,
                o.prefix_compressed ? ", compressed" : "", n_prompt - from);
        kv_model_gen_opts_t go = {.max_new = (uint32_t)o.max_new, .temp = (float)o.temp,
                                  .seed = o.seed, .on_token = run_on_token, .user = &rs};
        if ((rc = kv_model_generate(s, ids + from, (uint32_t)(n_prompt - from), &go, out,
                                    &gr)) ||
            (rc = rs.rc)) {
            run_fail("generation", rc, NULL);
            break;
        }
        if (o.runs > 1)
            fprintf(stderr, "%skvpage run: run %llu: time to first token %.3f s, prefill %u "
                    "tokens, %u reused from the prefix cache\n", o.out.plain ? "\n" : "",
                    (unsigned long long)run + 1, rs.ttft, gr.n_prompt, matched);
    }
    if (rc)
        goto done;
    if ((rc = kv_store_check(store))) {
        run_fail("kv_store_check", rc, NULL);
        goto done;
    }
    int stopped_control = gr.stopped && gr.n_new && kv_tok_type(tok, out[gr.n_new - 1]) ==
                                                        KV_TOK_CONTROL;
    size_t n_text_ids = gr.n_new - (stopped_control ? 1u : 0u), text_len = 0;
    kv_tok_decode(tok, out, n_text_ids, NULL, 0, &text_len);
    text = malloc(text_len + 1);
    if (!text || kv_tok_decode(tok, out, n_text_ids, text, text_len, &text_len)) {
        run_fail("decoding the output", KV_ENOMEM, NULL);
        goto done;
    }
    kv_stats_t st = {.struct_size = sizeof st};
    kv_store_stats(store, &st);
    run_out_t ro = {.o = &o, .path = path, .threads = cfg.n_threads, .st = &st, .g = &gr,
                    .stopped_control = stopped_control, .text = text, .text_len = text_len,
                    .n_lists = hp->n_layers * hp->n_kv_heads, .head_dim = cfg.head_dim,
                    .ttft = rs.ttft, .matched = matched,
                    .n_prompt = (uint32_t)n_prompt};
    ret = run_report(&ro, &o.out);
done:
    kv_cli_outs_finish("run", &o.out, NULL); /* a failure: close what was opened */
    free(text);
    free(out);
    free(ids);
    kv_model_session_free(s);
    kv_policy_destroy(pol);
    kv_store_destroy(store);
    kv_tok_destroy(tok);
    kv_model_free(m);
    return ret;
}
