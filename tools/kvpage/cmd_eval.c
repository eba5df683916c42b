/* SPDX-License-Identifier: MIT */
/*
 * cmd_eval.c — `kvpage eval`: what each KV cache policy costs in quality, on
 * identical inputs, with SmolLM2-135M-Instruct running through the store.
 *
 *   ppl       prefill P tokens of a long Debian text, then teacher-forced
 *             decoding of G more, one token at a time (kv_model_decode, the
 *             policy's step end after each): perplexity over those G
 *   passkey / needle / vt
 *             retrieval items (eval_task.h) in each --haystack (eval_hay.h),
 *             fitted to each --ctx token budget, --items per (task, ctx,
 *             haystack) with the needle at the --depths in turn; chat
 *             template + answer prefix; greedy; exact match. --questions
 *             questions per context; --setting agnostic (default): the
 *             context is prefilled and compressed (kv_seq_prefill_end)
 *             first, then each question is appended in a fork of it;
 *             aware: context + question prefilled whole, then compressed
 *   fidelity  during the ppl decode of each policy, the attention output of
 *             every layer for the last --probe-rows rows against FP16's
 *             (post_attn hook): ||out - out_fp16|| / ||out_fp16|| per layer
 *
 * Every item is run under every policy before the next item (fp16 first: it
 * is the reference), each in a fresh store holding that one sequence, so
 * kv_store_stats at the end of the item is that sequence's footprint. The
 * policies whose prompt pass is FP16's replay the reference's instead of
 * running the model (eval_run.h; --no-share turns that off).
 * Progress with an ETA on stderr; results as JSON / Markdown / SVG
 * (eval_report.h). --dump-items writes the retrieval items as JSON lines
 * (eval_dump.h) instead of running anything.
 * Exit codes: 0 ok, 1 failure, 2 usage.
 */
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "eval_dump.h"
#include "eval_hay.h"
#include "eval_policy.h"
#include "eval_report.h"
#include "eval_run.h"
#include "eval_task.h"
#include "kv_cli.h"
#include "kv_model.h"
#include "kv_sha256.h"
#include "kv_tok.h"
#include "kvpage/kvpage.h"

#define EVAL_MAX_LIST 64u /* entries of a comma list */
#define EVAL_TEXT_DIR "/usr/share/common-licenses/"
#define EVAL_TEXT_MAX (16u << 20) /* bytes of one --texts file, read whole */
/* 4 texts x 128 scored tokens; each >= 5K tokens, so --ppl-prefill 4000 fits */
#define EVAL_TEXTS "GPL-3,LGPL-2.1,GFDL-1.3,/usr/share/games/fortunes/literature"

typedef struct eval_opts {
    const char *model, *policies, *texts, *ctx, *depths, *tasks, *haystack;
    const char *json, *md, *svg, *setting, *dump;
    uint64_t ppl_prefill, ppl_gen, seed, threads, probe_rows, items, questions;
    int no_share;
} eval_opts_t;

#define EVAL_U(name, field, lo, hi, arg, help) \
    {name, KV_CLI_UINT, offsetof(eval_opts_t, field), lo, hi, 0, 0, arg, help}
#define EVAL_S(name, field, arg, help) \
    {name, KV_CLI_STR, offsetof(eval_opts_t, field), 0, 0, 0, 0, arg, help}
static const kv_cli_opt_t eval_opts[] = {
    EVAL_S("--policies", policies, "LIST", "comma-separated policy specs (default fp16,"
           "kivi4,kivi2,minicache);\nfp16 is always run first, as the reference"),
    EVAL_S("--tasks", tasks, "LIST", "of ppl,passkey,needle,vt,fidelity (default: all)"),
    EVAL_S("--texts", texts, "LIST", "perplexity texts: names under " EVAL_TEXT_DIR
           " or paths\n(default " EVAL_TEXTS ")"),
    EVAL_U("--ppl-prefill", ppl_prefill, 1, 1u << 20, "P",
           "prompt tokens before the scored ones (default 1024)"),
    EVAL_U("--ppl-gen", ppl_gen, 1, 1u << 20, "G", "teacher-forced tokens scored (default 128)"),
    EVAL_U("--probe-rows", probe_rows, 0, 1u << 16, "N",
           "fidelity: last decode rows compared (default 16)"),
    EVAL_S("--ctx", ctx, "LIST", "retrieval token budgets (default 1024)"),
    EVAL_S("--depths", depths, "LIST", "needle depths in percent, taken in turn by the items\n"
           "(default 0,25,50,75,100)"),
    EVAL_U("--items", items, 1, 1000, "N", "retrieval items per (task, ctx, haystack) (default 20)"),
    EVAL_S("--setting", setting, "S", "retrieval: agnostic (the context compressed before each\n"
           "question, answered in a fork) or aware (context + question\nprefilled, then "
           "compressed) (default agnostic)"),
    EVAL_U("--questions", questions, 1, EVAL_QUESTIONS, "N",
           "retrieval questions per context, each about its own fact (default 2)"),
    EVAL_S("--haystack", haystack, "LIST", "retrieval haystacks: of filler, licenses, fortunes\n"
           "(default licenses,fortunes)"),
    {"--no-share", KV_CLI_FLAG, offsetof(eval_opts_t, no_share), 0, 0, 0, 0, NULL,
     "run every policy's prompt through the model (default: the\npolicies whose prompt pass is "
     "FP16's replay fp16's)"},
    EVAL_U("--seed", seed, 0, UINT64_MAX, "N", "item generator seed (default 1)"),
    EVAL_U("--threads", threads, 0, 1024, "N", "compute threads (default: all CPUs)"),
    EVAL_S("--model", model, "FILE", "the .gguf file (as for kvpage run)"),
    {"--json", KV_CLI_OUT, offsetof(eval_opts_t, json), 0, 0, 0, 0, "FILE", KV_CLI_JSON_HELP},
    {"--md", KV_CLI_OUT, offsetof(eval_opts_t, md), 0, 0, 0, 0, "FILE", KV_CLI_MD_HELP
     "\n(stdout gets the Markdown table unless --json or --md is -)"},
    EVAL_S("--svg", svg, "FILE", "write the plot of quality against KV bytes"),
    {"--dump-items", KV_CLI_OUT, offsetof(eval_opts_t, dump), 0, 0, 0, 0, "FILE",
     "write the retrieval items (text and token ids, one JSON object\na line) to FILE "
     "(- = stdout) and run nothing else"},
};

/* 0 ok, 1 help printed, 2 usage error. */
static int eval_parse(int argc, char **argv, eval_opts_t *o)
{
    *o = (eval_opts_t){.policies = "fp16,kivi4,kivi2,minicache",
                       .tasks = "ppl,passkey,needle,vt,fidelity", .texts = EVAL_TEXTS,
                       .ctx = "1024", .depths = "0,25,50,75,100", .ppl_prefill = 1024,
                       .ppl_gen = 128, .seed = 1, .probe_rows = 16, .items = 20,
                       .haystack = "licenses,fortunes", .setting = "agnostic",
                       .questions = 2};
    return kv_cli_parse("eval", NULL, eval_opts, sizeof eval_opts / sizeof eval_opts[0],
                        argc, argv, o);
}

/* Split a comma list into at most EVAL_MAX_LIST pieces of buf (modified). */
static uint32_t split_list(char *buf, char **out)
{
    uint32_t n = 0;
    for (char *p = buf; p && n < EVAL_MAX_LIST;) {
        char *c = strchr(p, ',');
        if (c)
            *c = 0;
        if (*p)
            out[n++] = p;
        p = c ? c + 1 : NULL;
    }
    return n;
}

/* A comma list of integers in [lo, hi]; -1 after a message on error. */
static int parse_uints(const char *opt, const char *val, uint64_t lo, uint64_t hi,
                       uint32_t *out, uint32_t *n)
{
    char buf[1024], *parts[EVAL_MAX_LIST];
    snprintf(buf, sizeof buf, "%s", val);
    *n = split_list(buf, parts);
    if (!*n) {
        fprintf(stderr, "kvpage eval: %s needs at least one value\n", opt);
        return -1;
    }
    for (uint32_t i = 0; i < *n; i++) {
        uint64_t x;
        if (kv_cli_uint(opt, parts[i], lo, hi, &x))
            return -1;
        out[i] = (uint32_t)x;
    }
    return 0;
}

/* ---- the run state --------------------------------------------------------- */

typedef struct eval_state {
    const eval_opts_t *o;
    kv_model_t *m;
    kv_tok_t *tok;
    const kv_model_hparams_t *hp;
    eval_env_t env;
    eval_policy_t pol[EVAL_MAX_LIST];
    const char *pol_names[EVAL_MAX_LIST];
    uint32_t n_pol;
    int share;                     /* replay fp16's prompt pass where exact  */
    int aware;                     /* retrieval setting: 1 query-aware       */
    eval_prompt_t rec;             /* fp16's prompt pass of the current input */
    eval_hay_t hays[EVAL_HAY_COUNT];
    uint32_t n_hays;
    float *logits;                 /* [vocab] */
    eval_result_t *res;
    uint32_t n_res, cap_res;
    eval_item_rec_t *items;
    uint32_t n_items, cap_items;
    /* fidelity */
    uint32_t probe_rows;
    float *ref;                    /* [probe_rows][n_layers][QD] of fp16   */
    double *fid_err;               /* [n_pol][n_texts][n_layers]          */
    eval_fidelity_t *fid;
    uint32_t n_fid;
    /* progress: runs, and their estimated cost (eval_cost) */
    uint32_t done, total;
    double cost_done, cost_total;
    double t0;
    int tty;
    FILE *dump;                    /* --dump-items: write items, run nothing */
} eval_state_t;

/* Estimated cost of one run, in prompt-token forward passes: its own
 * prompt pass, or a replay: appends (1/64), and for all_rows the prompt's
 * attention with statistics, which grows with the prompt (measured on 2
 * CPUs: 0.35 of a forward pass at 1K tokens, 1.26 at 4K); plus decode steps
 * (a step costs about 6 prompt tokens; a query-agnostic question's own
 * tokens are counted among its steps); KVzip adds its reconstruction pass
 * (a forward pass and scoring like all_rows). */
static double eval_cost(const eval_state_t *E, uint32_t p, uint32_t n_prompt, uint32_t steps)
{
    const eval_share_t *sh = &E->pol[p].share;
    double prompt = !E->share || p == 0 || !sh->shares ? n_prompt
                    : sh->all_rows ? n_prompt * (n_prompt / 3300.0)
                                   : n_prompt / 64.0;
    if (E->pol[p].kvzip) /* a reconstruction pass, and its scoring */
        prompt += n_prompt * (1.0 + n_prompt / 3300.0);
    return prompt + 6.0 * steps;
}

static void progress(eval_state_t *E, uint32_t p, const char *task, const char *hay,
                     uint32_t ctx, int depth, double cost)
{
    E->done++;
    E->cost_done += cost;
    char d[24] = "", eta[32] = "";
    if (depth >= 0)
        snprintf(d, sizeof d, " depth %3d%%", depth);
    double el = kv_cli_now() - E->t0;
    if (E->cost_done > 0 && E->done < E->total) {
        double left = el * (E->cost_total - E->cost_done) / E->cost_done;
        unsigned sec = left > 0 ? (unsigned)(left + 0.5) : 0;
        snprintf(eta, sizeof eta, ", ETA %u:%02u:%02u", sec / 3600, sec / 60 % 60, sec % 60);
    }
    fprintf(stderr, "%s[eval %4u/%u] %-12s %-8s %s ctx %5u%s  %6.1f s%s%s", E->tty ? "\r" : "",
            E->done, E->total, E->pol_names[p], task, hay, ctx, d, el, eta,
            E->tty ? "   " : "\n");
    fflush(stderr);
}

static void *grow(void *p, uint32_t *cap, uint32_t n, size_t size)
{
    if (n < *cap)
        return p;
    uint32_t c = *cap ? *cap * 2 : 64;
    void *q = realloc(p, (size_t)c * size);
    if (q)
        *cap = c;
    return q;
}

/* Start policy p's run over ids[0..n): fp16 records its prompt pass when
 * sharing, the policies that share replay it (eval_run.h). */
static int run_start(eval_state_t *E, uint32_t p, const int32_t *ids, uint32_t n,
                     uint32_t max_tokens, eval_run_t *r)
{
    int rec = 0;
    if (p == 0) { /* the reference comes first: a new input */
        E->rec.n = 0;
        for (uint32_t i = 1; i < E->n_pol; i++)
            rec |= E->share && E->pol[i].share.shares;
    }
    return eval_run_start(&E->env, &E->pol[p], ids, n, max_tokens,
                          p > 0 && E->rec.n ? &E->rec : NULL, rec ? &E->rec : NULL,
                          eval_prompt_q0(E->pol + 1, E->n_pol - 1, n), E->logits, r);
}

/* The footprint of the run's one sequence, into res (summed; see finish). */
static int run_account(eval_run_t *r, eval_result_t *res)
{
    kv_stats_t st = {.struct_size = sizeof st};
    int rc = kv_store_check(r->st);
    if (rc || (rc = kv_store_stats(r->st, &st)))
        return rc;
    res->kv_bytes += st.kv_bytes;
    res->fp16_bytes += st.fp16_bytes;
    res->meta_bytes += st.meta_bytes;
    for (unsigned f = 0; f < KV_FMT_COUNT; f++)
        if (st.pages_by_format[f])
            res->formats |= 1u << f;
    return 0;
}

static void res_average(eval_result_t *res, uint32_t n)
{
    if (n > 1) {
        res->kv_bytes = (res->kv_bytes + n / 2) / n;
        res->fp16_bytes = (res->fp16_bytes + n / 2) / n;
        res->meta_bytes = (res->meta_bytes + n / 2) / n;
    }
}

static int push_result(eval_state_t *E, const eval_result_t *res)
{
    eval_result_t *p = grow(E->res, &E->cap_res, E->n_res, sizeof *p);
    if (!p)
        return KV_ENOMEM;
    E->res = p;
    E->res[E->n_res++] = *res;
    return 0;
}

/* ---- perplexity + fidelity ------------------------------------------------- */

typedef struct probe {
    eval_state_t *E;
    int ref;             /* 1: record into E->ref; 0: compare with it      */
    int64_t row;         /* probe row of the current decode step, or -1    */
    double *num, *den;   /* [n_layers] squared norms (compare mode)        */
} probe_t;

static int probe_post(void *user, const kv_model_layer_io_t *io, const float *out)
{
    probe_t *pr = user;
    if (io->n != 1 || pr->row < 0)
        return 0;
    const kv_model_hparams_t *hp = pr->E->hp;
    size_t qd = (size_t)hp->n_q_heads * hp->head_dim;
    float *ref = pr->E->ref + ((size_t)pr->row * hp->n_layers + io->layer) * qd;
    if (pr->ref) {
        memcpy(ref, out, qd * sizeof *out);
        return 0;
    }
    for (size_t i = 0; i < qd; i++) {
        double d = (double)out[i] - ref[i];
        pr->num[io->layer] += d * d;
        pr->den[io->layer] += (double)ref[i] * ref[i];
    }
    return 0;
}

/* Before decode step i: which probe row it is (the last probe_rows). */
static int probe_before(void *user, uint32_t i, const float *logits)
{
    (void)logits;
    probe_t *pr = user;
    uint32_t G = (uint32_t)pr->E->o->ppl_gen, R = pr->E->probe_rows;
    pr->row = i + R >= G ? (int64_t)(i + R - G) : -1;
    return 0;
}

static int eval_ppl_text(eval_state_t *E, uint32_t t, const int32_t *ids, int fidelity)
{
    const uint32_t P = (uint32_t)E->o->ppl_prefill, G = (uint32_t)E->o->ppl_gen;
    const uint32_t L = E->hp->n_layers;
    double *num = NULL, *den = NULL;
    if (fidelity && (!(num = calloc(L, sizeof *num)) || !(den = calloc(L, sizeof *den)))) {
        free(num);
        return KV_ENOMEM;
    }
    int rc = 0;
    for (uint32_t p = 0; p < E->n_pol && !rc; p++) {
        eval_run_t r;
        if ((rc = run_start(E, p, ids, P, P + G, &r)))
            break;
        probe_t pr = {.E = E, .ref = p == 0, .row = -1, .num = num, .den = den};
        if (fidelity) {
            memset(num, 0, L * sizeof *num);
            memset(den, 0, L * sizeof *den);
            kv_model_hook_t hook = {.post_attn = probe_post, .user = &pr};
            kv_model_session_set_hook(r.s, &hook);
        }
        eval_steps_t st = {.force = ids + P, .n = G, .logits = E->logits,
                           .before = fidelity ? probe_before : NULL, .user = &pr};
        rc = eval_run_steps(&r, &E->pol[p], &st);
        eval_result_t res = {.policy = p, .task = EVAL_RES_PPL, .ctx = P + G, .text = t,
                             .nll = st.nll / G, .value = exp(st.nll / G)};
        if (!rc)
            rc = run_account(&r, &res);
        eval_run_close(&r);
        if (!rc)
            rc = push_result(E, &res);
        if (!rc && fidelity && p > 0) {
            double *e = E->fid_err + ((size_t)E->n_fid) * L;
            for (uint32_t l = 0; l < L; l++)
                e[l] = den[l] > 0 ? sqrt(num[l] / den[l]) : 0;
            E->fid[E->n_fid++] = (eval_fidelity_t){.policy = p, .text = t,
                                                   .rows = E->probe_rows, .rel_err = e};
        }
        progress(E, p, "ppl", "-", P + G, -1, eval_cost(E, p, P, G));
    }
    free(num);
    free(den);
    return rc;
}

/* Read, hash and tokenize a text; ids gets P + G + 1 tokens (malloc). */
static int load_text(eval_state_t *E, const char *name, eval_text_t *t, int32_t **ids)
{
    *t = (eval_text_t){.name = name};
    snprintf(t->path, sizeof t->path, "%s%s", strchr(name, '/') ? "" : EVAL_TEXT_DIR, name);
    char *buf;
    size_t len;
    if (kv_cli_read_file("eval", "text", t->path, EVAL_TEXT_MAX, &buf, &len)) {
        fprintf(stderr, "kvpage eval: --texts takes names under " EVAL_TEXT_DIR
                " or paths of regular files up to %u MiB\n", EVAL_TEXT_MAX >> 20);
        return KV_ENOENT;
    }
    kv_sha256_t h;
    uint8_t d[32];
    kv_sha256_init(&h);
    kv_sha256_update(&h, buf, len);
    kv_sha256_final(&h, d);
    kv_sha256_hex(d, t->sha256);
    t->bytes = len;
    size_t n = 0;
    int rc = kv_tok_encode(E->tok, buf, len, 0, NULL, 0, &n);
    if (!rc && !(*ids = malloc((n ? n : 1) * sizeof **ids)))
        rc = KV_ENOMEM;
    if (!rc && (rc = kv_tok_encode(E->tok, buf, len, 0, *ids, n, &n))) {
        free(*ids);
        *ids = NULL;
    }
    free(buf);
    if (rc)
        return rc;
    t->tokens = (uint32_t)n;
    uint64_t need = E->o->ppl_prefill + E->o->ppl_gen + 1;
    if (n < need) {
        fprintf(stderr, "kvpage eval: text %s has %zu tokens; --ppl-prefill + --ppl-gen + 1 = "
                "%llu needed\n", t->path, n, (unsigned long long)need);
        free(*ids);
        *ids = NULL;
        return KV_ERANGE;
    }
    return 0;
}

/* ---- retrieval ------------------------------------------------------------- */

/* The ids of the item's whole prompt for question qi (chat template,
 * context + question, answer prefix) into *ids (malloc, *n of them), or
 * only their count (ids NULL); *n_head: the ids through the context, the
 * same for every question (kv_tok_chat_split). */
static int item_ids(eval_state_t *E, const eval_item_t *it, uint32_t qi, int32_t **ids,
                    uint32_t *n, uint32_t *n_head)
{
    const eval_question_t *q = &it->q[qi];
    size_t a = 0, b = 0, head = 0;
    int rc = kv_tok_chat_split(E->tok, NULL, it->user, q->text, NULL, 0, &a, &head);
    if (!rc)
        rc = kv_tok_encode(E->tok, q->prime, strlen(q->prime), 0, NULL, 0, &b);
    if (rc || !ids) {
        *n = (uint32_t)(a + b);
        return rc;
    }
    if (!(*ids = malloc((a + b) * sizeof **ids)))
        return KV_ENOMEM;
    if (!(rc = kv_tok_chat_split(E->tok, NULL, it->user, q->text, *ids, a, &a, &head)))
        rc = kv_tok_encode(E->tok, q->prime, strlen(q->prime), 0, *ids + a, b, &b);
    if (rc) {
        free(*ids);
        *ids = NULL;
        return rc;
    }
    *n = (uint32_t)(a + b);
    *n_head = (uint32_t)head;
    return 0;
}

/* Tokens of the item's longest whole prompt (eval_count_fn). */
static long count_item(void *user, const eval_item_t *it)
{
    uint32_t most = 0;
    for (uint32_t qi = 0; qi < it->n_q; qi++) {
        uint32_t n = 0, head = 0;
        int rc = item_ids(user, it, qi, NULL, &n, &head);
        if (rc)
            return rc;
        most = n > most ? n : most;
    }
    return most;
}

/* A retrieval cell. */
typedef struct item_cell {
    eval_task_kind_t kind;
    uint32_t ctx, hay;
} item_cell_t;

/* Question qi's answer (st->out) by policy p: decoded, scored, recorded
 * as an item of cell c (n_tokens: its whole prompt); res counts it. */
static int record_answer(eval_state_t *E, uint32_t p, const item_cell_t *c,
                         const eval_question_t *q, uint32_t qi, uint32_t n_tokens,
                         const eval_steps_t *st, eval_result_t *res)
{
    eval_item_rec_t *ir = grow(E->items, &E->cap_items, E->n_items, sizeof *ir);
    if (!ir)
        return KV_ENOMEM;
    E->items = ir;
    eval_item_rec_t *rec = &E->items[E->n_items++];
    *rec = (eval_item_rec_t){.policy = p, .task = (int)c->kind, .ctx = c->ctx, .hay = c->hay,
                             .tokens = n_tokens, .depth_pct = q->depth_pct, .question = qi};
    char text[512];
    size_t len = 0;
    if (kv_tok_decode(E->tok, st->out, st->n_out, text, sizeof text - 1, &len))
        len = 0;
    text[len] = 0;
    rec->ok = eval_item_score(q, text, len);
    size_t keep = len < sizeof rec->got - 1 ? len : sizeof rec->got - 1;
    memcpy(rec->got, text, keep);
    rec->got[keep] = 0;
    snprintf(rec->expect, sizeof rec->expect, "%s", q->answer);
    res->n_items++;
    res->n_correct += (uint32_t)rec->ok;
    return 0;
}

/* One retrieval item's prompts: ids[qi] ([n[qi]]) per question, the first
 * n_head of each the context's. */
typedef struct item_prompts {
    int32_t *ids[EVAL_QUESTIONS];
    uint32_t n[EVAL_QUESTIONS];
    uint32_t n_head;
} item_prompts_t;

/* Query-aware: question qi's whole prompt prefilled, then compressed, then
 * greedy decoding. */
static int run_aware(eval_state_t *E, uint32_t p, const item_cell_t *c, const eval_item_t *it,
                     uint32_t qi, const item_prompts_t *pr, eval_result_t *res)
{
    const eval_question_t *q = &it->q[qi];
    eval_run_t r;
    int rc = run_start(E, p, pr->ids[qi], pr->n[qi], pr->n[qi] + q->max_new, &r);
    if (rc)
        return rc;
    eval_steps_t st = {.n = q->max_new, .tok = E->tok, .logits = E->logits};
    if (!(rc = eval_run_prefill_end(&r, &E->pol[p])) &&
        !(rc = eval_run_steps(&r, &E->pol[p], &st)))
        rc = run_account(&r, res);
    eval_run_close(&r);
    return rc ? rc : record_answer(E, p, c, q, qi, pr->n[qi], &st, res);
}

/* Query-agnostic: the context prefilled and compressed once; each question
 * then appended in a fork of it and answered. The footprint is taken with
 * the context and one answered question held: kv_bytes the pages of both
 * (shared pages once), fp16_bytes the FP16 size of the fork's tokens (the
 * context's as the fork holds them, the question and the answer). */
static int run_agnostic(eval_state_t *E, uint32_t p, const item_cell_t *c,
                        const eval_item_t *it, const item_prompts_t *pr, eval_result_t *res)
{
    uint32_t most = pr->n_head;
    for (uint32_t qi = 0; qi < it->n_q; qi++)
        most = pr->n[qi] + it->q[qi].max_new > most ? pr->n[qi] + it->q[qi].max_new : most;
    eval_run_t r;
    int rc = run_start(E, p, pr->ids[0], pr->n_head, most, &r);
    if (rc)
        return rc;
    kv_stats_t ctx = {.struct_size = sizeof ctx}; /* the compressed context alone */
    if (!(rc = eval_run_prefill_end(&r, &E->pol[p])))
        rc = kv_store_stats(r.st, &ctx);
    for (uint32_t qi = 0; qi < it->n_q && !rc; qi++) {
        const eval_question_t *q = &it->q[qi];
        eval_steps_t st = {.n = q->max_new, .tok = E->tok, .logits = E->logits};
        eval_run_t child;
        if ((rc = eval_run_fork(&r, &child)))
            break;
        if (!(rc = eval_run_ask(&child, &E->pol[p], pr->ids[qi] + pr->n_head,
                                pr->n[qi] - pr->n_head, &st)) &&
            !(rc = run_account(&child, res)))
            res->fp16_bytes -= ctx.fp16_bytes; /* the child's tokens only: the */
                                               /* context's counted once       */
        eval_run_close_fork(&child);
        if (!rc)
            rc = record_answer(E, p, c, q, qi, pr->n[qi], &st, res);
    }
    eval_run_close(&r);
    return rc;
}

/* Steps a retrieval question runs at most (for the ETA). */
#define EVAL_STEPS_EST 16u
/* Tokens of a question after its context (for the ETA). */
#define EVAL_QUESTION_EST 40u

/* The ETA cost of one policy's work on one item of ctx tokens. */
static double item_cost(const eval_state_t *E, uint32_t p, uint32_t ctx, uint32_t n_q)
{
    if (E->aware)
        return n_q * eval_cost(E, p, ctx, EVAL_STEPS_EST);
    return eval_cost(E, p, ctx, n_q * (EVAL_STEPS_EST + EVAL_QUESTION_EST / 6));
}

/* --items items of one (task, ctx, haystack), item k's needle at depth
 * depths[k mod n_depths]. */
static int eval_retrieval(eval_state_t *E, eval_task_kind_t kind, uint32_t ctx, uint32_t h,
                          const uint32_t *depths, uint32_t n_depths)
{
    eval_result_t res[EVAL_MAX_LIST];
    const eval_hay_t *hay = &E->hays[h];
    const char *hname = eval_hay_name(hay->kind);
    const item_cell_t cell = {.kind = kind, .ctx = ctx, .hay = h};
    for (uint32_t p = 0; p < E->n_pol; p++)
        res[p] = (eval_result_t){.policy = p, .task = (int)kind, .ctx = ctx, .hay = h};
    int rc = 0;
    for (uint32_t k = 0; k < E->o->items && !rc; k++) {
        const uint32_t depth = depths[k % n_depths];
        uint64_t s = E->o->seed ^ ((uint64_t)kind << 56) ^ ((uint64_t)ctx << 24) ^
                     ((uint64_t)hay->kind << 20) ^ k;
        eval_item_spec_t spec = {.kind = kind, .seed = eval_mix64(&s), .depth_pct = depth,
                                 .hay = hay, .questions = (uint32_t)E->o->questions};
        eval_item_t it;
        uint32_t n_tok = 0;
        if ((rc = eval_item_fit(&spec, ctx, count_item, E, &it, &n_tok))) {
            if (rc == KV_ERANGE)
                fprintf(stderr, "kvpage eval: --ctx %u is too small for a %s item\n", ctx,
                        eval_task_name(kind));
            break;
        }
        item_prompts_t pr = {.n_head = 0};
        for (uint32_t qi = 0; qi < it.n_q && !rc; qi++)
            rc = item_ids(E, &it, qi, &pr.ids[qi], &pr.n[qi], &pr.n_head);
        if (E->dump && !rc) {
            eval_dump_ids_t d = {.n_head = pr.n_head};
            for (uint32_t qi = 0; qi < it.n_q; qi++) {
                d.ids[qi] = pr.ids[qi];
                d.n[qi] = pr.n[qi];
            }
            if (eval_dump_item(E->dump, &spec, hname, ctx, k, &it, &d)) {
                fprintf(stderr, "kvpage eval: writing %s failed: the output is incomplete\n",
                        strcmp(E->o->dump, "-") ? E->o->dump : "to standard output");
                rc = KV_EIO;
            }
        }
        for (uint32_t qi = 0; qi < (E->aware ? it.n_q : 1) && !rc && !E->dump; qi++)
            for (uint32_t p = 0; p < E->n_pol && !rc; p++) {
                rc = E->aware ? run_aware(E, p, &cell, &it, qi, &pr, &res[p])
                              : run_agnostic(E, p, &cell, &it, &pr, &res[p]);
                progress(E, p, eval_task_name(kind), hname, ctx, (int)depth,
                         item_cost(E, p, ctx, E->aware ? 1 : it.n_q));
            }
        for (uint32_t qi = 0; qi < EVAL_QUESTIONS; qi++)
            free(pr.ids[qi]);
        eval_item_free(&it);
    }
    for (uint32_t p = 0; p < E->n_pol && !rc && !E->dump; p++) {
        res[p].value = res[p].n_items ? (double)res[p].n_correct / res[p].n_items : 0;
        res_average(&res[p], res[p].n_items);
        rc = push_result(E, &res[p]);
    }
    return rc;
}

/* ---- the command ---------------------------------------------------------- */

/* Write a report into f (opened before the work; NULL: not asked for). */
static int write_out(FILE *f, const char *path, int (*fn)(FILE *, const eval_report_t *),
                     const eval_report_t *r)
{
    if (!f)
        return 0;
    int rc = fn(f, r);
    return kv_cli_out_close("eval", path, f) || rc ? -1 : 0;
}

/* Parse policies (fp16 first, added if missing) and tasks. */
static int setup_lists(eval_state_t *E, char *pbuf, int *want)
{
    char *parts[EVAL_MAX_LIST], err[320] = "";
    int n = kv_cli_split_specs("--policies", pbuf, parts, EVAL_MAX_LIST - 1);
    if (n < 0)
        return -1;
    E->pol_names[E->n_pol++] = "fp16";
    for (int i = 0; i < n; i++)
        if (strcmp(parts[i], "fp16"))
            E->pol_names[E->n_pol++] = parts[i];
    for (uint32_t i = 0; i < E->n_pol; i++)
        if (eval_policy_parse(E->pol_names[i], &E->pol[i], err, sizeof err)) {
            fprintf(stderr, "kvpage eval: %s\n", err);
            return -1;
        }
    char tbuf[256], *tparts[EVAL_MAX_LIST];
    snprintf(tbuf, sizeof tbuf, "%s", E->o->tasks);
    uint32_t nt = split_list(tbuf, tparts);
    if (nt == 0) {
        fprintf(stderr, "kvpage eval: --tasks names no task (ppl, passkey, needle, vt, "
                "fidelity)\n");
        return -1;
    }
    for (uint32_t i = 0; i < nt; i++) {
        eval_task_kind_t k;
        if (!strcmp(tparts[i], "ppl"))
            want[EVAL_TASK_COUNT] = 1;
        else if (!strcmp(tparts[i], "fidelity"))
            want[EVAL_TASK_COUNT + 1] = 1;
        else if (!eval_task_parse(tparts[i], strlen(tparts[i]), &k))
            want[k] = 1;
        else {
            fprintf(stderr, "kvpage eval: unknown task '%s' (ppl, passkey, needle, vt, "
                    "fidelity)\n", tparts[i]);
            return -1;
        }
    }
    return 0;
}

/* The --haystack list into E->hays (loaded) when a retrieval task runs;
 * -1 after a message. */
static int parse_hays(eval_state_t *E, const int *want)
{
    char buf[256], *parts[EVAL_MAX_LIST];
    snprintf(buf, sizeof buf, "%s", E->o->haystack);
    uint32_t n = split_list(buf, parts);
    int retrieval = 0;
    for (unsigned k = 0; k < EVAL_TASK_COUNT; k++)
        retrieval |= want[k];
    if (!n && retrieval) {
        fprintf(stderr, "kvpage eval: --haystack is empty\n");
        return -1;
    }
    for (uint32_t i = 0; i < n; i++) {
        eval_hay_kind_t k;
        if (eval_hay_parse(parts[i], strlen(parts[i]), &k)) {
            fprintf(stderr, "kvpage eval: unknown haystack '%s' (filler, licenses, fortunes)\n",
                    parts[i]);
            return -1;
        }
        for (uint32_t j = 0; j < E->n_hays; j++)
            if (E->hays[j].kind == k) {
                fprintf(stderr, "kvpage eval: haystack '%s' given twice\n", parts[i]);
                return -1;
            }
        if (retrieval)
            E->hays[E->n_hays++].kind = k; /* loaded by load_hays */
    }
    return 0;
}

/* Load the haystacks parse_hays chose; -1 after a message. */
static int load_hays(eval_state_t *E)
{
    char err[700] = "";
    for (uint32_t h = 0; h < E->n_hays; h++)
        if (eval_hay_load(E->hays[h].kind, &E->hays[h], err, sizeof err)) {
            fprintf(stderr, "kvpage eval: %s\n", err);
            return -1;
        }
    return 0;
}

int kv_cmd_eval(int argc, char **argv)
{
    eval_opts_t o;
    int prc = eval_parse(argc, argv, &o);
    if (prc)
        return prc == 1 ? 0 : 2;
    eval_state_t E = {.o = &o, .t0 = kv_cli_now(), .tty = isatty(2), .share = !o.no_share,
                      .aware = !strcmp(o.setting, "aware")};
    if (!E.aware && strcmp(o.setting, "agnostic")) {
        fprintf(stderr, "kvpage eval: --setting takes agnostic or aware, not '%s'\n", o.setting);
        return 2;
    }
    char pbuf[4096], xbuf[1024], *tnames[EVAL_MAX_LIST];
    if (strlen(o.policies) >= sizeof pbuf || strlen(o.texts) >= sizeof xbuf) {
        fprintf(stderr, "kvpage eval: --policies (< %zu bytes) or --texts (< %zu bytes) "
                "too long\n", sizeof pbuf, sizeof xbuf);
        return 2;
    }
    snprintf(pbuf, sizeof pbuf, "%s", o.policies);
    snprintf(xbuf, sizeof xbuf, "%s", o.texts);
    int want[EVAL_TASK_COUNT + 2] = {0}; /* tasks..., ppl, fidelity */
    int plain;
    if (kv_cli_outs_check("eval", o.json, o.md, &plain))
        return 2;
    const char *md = o.md;
    FILE *out_json = NULL, *out_md = NULL, *out_svg = NULL; /* opened before the work */
    char path[4096], err[512] = "";
    int pinned = 0, rc, ret = 1;
    eval_text_t texts[EVAL_MAX_LIST];
    int32_t *text_ids[EVAL_MAX_LIST] = {0};
    uint32_t n_loaded = 0;
    uint32_t ctx[EVAL_MAX_LIST], depths[EVAL_MAX_LIST], n_ctx = 0, n_depths = 0;
    uint32_t n_texts = split_list(xbuf, tnames);
    if (setup_lists(&E, pbuf, want) || parse_hays(&E, want) ||
        parse_uints("--ctx", o.ctx, 64, 1u << 20, ctx, &n_ctx) ||
        parse_uints("--depths", o.depths, 0, 100, depths, &n_depths)) {
        for (uint32_t i = 0; i < E.n_pol; i++) /* unparsed ones are zeroed */
            eval_policy_destroy(&E.pol[i]);
        return 2;
    }
    if (want[EVAL_TASK_COUNT + 1] && !want[EVAL_TASK_COUNT]) {
        fprintf(stderr, "kvpage eval: the fidelity probes run inside ppl: add ppl to --tasks\n");
        ret = 2;
        goto done;
    }
    if (want[EVAL_TASK_COUNT] && !n_texts) {
        fprintf(stderr, "kvpage eval: --texts is empty\n");
        ret = 2;
        goto done;
    }
    if ((o.json && !(out_json = kv_cli_out_open("eval", "--json", o.json))) ||
        (md && !(out_md = kv_cli_out_open("eval", "--md", md))) ||
        (o.svg && !(out_svg = kv_cli_out_open("eval", "--svg", o.svg))) ||
        (o.dump && !(E.dump = kv_cli_out_open("eval", "--dump-items", o.dump)))) {
        ret = 2;
        goto done;
    }
    if ((rc = kv_model_find(o.model, path, sizeof path, &pinned, err, sizeof err)) ||
        (rc = kv_model_verify(path, pinned, err, sizeof err))) {
        fprintf(stderr, "kvpage eval: %s\n", err);
        goto done;
    }
    if ((rc = kv_model_load(path, &E.m, err, sizeof err)) ||
        (rc = kv_tok_from_gguf(kv_model_gguf(E.m), &E.tok, err, sizeof err))) {
        fprintf(stderr, "kvpage eval: %s\n", err);
        goto done;
    }
    E.hp = kv_model_hparams(E.m);
    for (uint32_t p = 0; p < E.n_pol; p++) { /* eattn undoes the engine's RoPE: its base */
        double th;
        if (!kv_policy_value(E.pol[p].policy, "eattn", "theta", &th) &&
            th != (double)E.hp->rope_theta)
            fprintf(stderr, "kvpage eval: warning: policy '%s': eattn theta=%g but the "
                    "model's RoPE base is %g (add theta=%g)\n", E.pol[p].spec, th,
                    (double)E.hp->rope_theta, (double)E.hp->rope_theta);
    }
    E.env = (eval_env_t){.m = E.m, .tok = E.tok, .threads = o.threads ? (uint32_t)o.threads
                                                         : (uint32_t)sysconf(_SC_NPROCESSORS_ONLN)};
    for (uint32_t i = 0; i < n_ctx; i++)
        if (ctx[i] + 64 > E.hp->n_ctx) {
            fprintf(stderr, "kvpage eval: --ctx %u: the model's context is %u tokens (and "
                    "answers need up to 64)\n", ctx[i], E.hp->n_ctx);
            ret = 2;
            goto done;
        }
    if (want[EVAL_TASK_COUNT] && o.ppl_prefill + o.ppl_gen > E.hp->n_ctx) {
        fprintf(stderr, "kvpage eval: --ppl-prefill + --ppl-gen exceed the model's context of "
                "%u tokens\n", E.hp->n_ctx);
        ret = 2;
        goto done;
    }
    uint32_t L = E.hp->n_layers, QD = E.hp->n_q_heads * E.hp->head_dim;
    E.probe_rows = (uint32_t)(o.probe_rows < o.ppl_gen ? o.probe_rows : o.ppl_gen);
    int fidelity = want[EVAL_TASK_COUNT + 1] && E.probe_rows > 0;
    if (!(E.logits = malloc((size_t)E.hp->vocab * sizeof *E.logits)) ||
        (fidelity && (!(E.ref = calloc((size_t)E.probe_rows * L * QD, sizeof *E.ref)) ||
                      !(E.fid_err = calloc((size_t)E.n_pol * n_texts * L, sizeof(double))) ||
                      !(E.fid = calloc((size_t)E.n_pol * n_texts, sizeof *E.fid))))) {
        fprintf(stderr, "kvpage eval: out of memory\n");
        goto done;
    }
    if (load_hays(&E))
        goto done;
    if (want[EVAL_TASK_COUNT] && !E.dump)
        for (; n_loaded < n_texts; n_loaded++)
            if ((rc = load_text(&E, tnames[n_loaded], &texts[n_loaded], &text_ids[n_loaded])))
                goto done;
    uint32_t n_tasks = 0, n_shared = 0;
    for (unsigned k = 0; k < EVAL_TASK_COUNT; k++)
        n_tasks += (uint32_t)want[k];
    n_tasks = E.n_hays ? n_tasks : 0;
    for (uint32_t p = 0; p < E.n_pol; p++) {
        n_shared += p > 0 && E.share && E.pol[p].share.shares;
        E.cost_total += n_loaded * eval_cost(&E, p, (uint32_t)o.ppl_prefill, (uint32_t)o.ppl_gen);
        for (uint32_t c = 0; c < n_ctx; c++)
            E.cost_total += n_tasks * E.n_hays * o.items *
                            item_cost(&E, p, ctx[c], (uint32_t)o.questions);
    }
    E.total = E.n_pol * (n_loaded + n_tasks * n_ctx * E.n_hays * (uint32_t)o.items *
                                        (E.aware ? (uint32_t)o.questions : 1));
    if (E.dump)
        fprintf(stderr, "kvpage eval: model %s, writing the items to %s\n", path,
                strcmp(o.dump, "-") ? o.dump : "standard output");
    else
        fprintf(stderr, "kvpage eval: model %s, %u policies (%u replay fp16's prompt pass), "
                "%u runs, %u threads\n", path, E.n_pol, n_shared, E.total, E.env.threads);
    for (uint32_t t = 0; t < n_loaded && !rc; t++)
        rc = eval_ppl_text(&E, t, text_ids[t], fidelity);
    E.env.forks = E.aware ? 0 : 1; /* a question's fork beside its context */
    for (unsigned k = 0; k < EVAL_TASK_COUNT && n_tasks && !rc; k++)
        for (uint32_t c = 0; c < n_ctx && want[k] && !rc; c++)
            for (uint32_t h = 0; h < E.n_hays && !rc; h++)
                rc = eval_retrieval(&E, (eval_task_kind_t)k, ctx[c], h, depths, n_depths);
    if (E.tty)
        fputc('\n', stderr);
    if (rc) {
        fprintf(stderr, "kvpage eval: failed: %s (%d)\n", kv_strerror(rc), rc);
        goto done;
    }
    if (E.dump) {
        FILE *d = E.dump;
        E.dump = NULL;
        if (!kv_cli_out_close("eval", o.dump, d))
            ret = 0;
        goto done;
    }
    eval_report_t rep = {.model = path, .model_sha256 = pinned ? KV_MODEL_FILE_SHA256 : NULL,
                         .policies = E.pol_names, .n_policies = E.n_pol, .n_layers = L,
                         .seed = o.seed, .ppl_prefill = (uint32_t)o.ppl_prefill,
                         .ppl_gen = (uint32_t)o.ppl_gen, .threads = E.env.threads,
                         .items_per_cell = (uint32_t)o.items, .shared = E.share,
                         .setting = n_tasks ? (E.aware ? "query-aware" : "query-agnostic")
                                            : NULL,
                         .questions = (uint32_t)o.questions,
                         .hays = E.hays, .n_hays = E.n_hays,
                         .wall_s = kv_cli_now() - E.t0, .texts = texts, .n_texts = n_loaded,
                         .results = E.res, .n_results = E.n_res, .items = E.items,
                         .n_items = E.n_items, .fidelity = E.fid, .n_fidelity = E.n_fid};
    int w = write_out(out_json, o.json, eval_report_json, &rep);
    w |= write_out(out_md, md, eval_report_md, &rep);
    w |= write_out(plain ? stdout : NULL, "-", eval_report_md, &rep); /* the usual report */
    w |= write_out(out_svg, o.svg, eval_report_svg, &rep);
    out_json = out_md = out_svg = NULL;
    if (!w)
        ret = 0;
    fprintf(stderr, "kvpage eval: done in %.1f s\n", rep.wall_s);
done:
    FILE *unwritten[4] = {out_json, out_md, out_svg, E.dump}; /* the work failed */
    for (int i = 0; i < 4; i++)
        if (unwritten[i] && unwritten[i] != stdout)
            fclose(unwritten[i]);
    for (uint32_t i = 0; i < n_loaded; i++)
        free(text_ids[i]);
    for (uint32_t i = 0; i < E.n_pol; i++)
        eval_policy_destroy(&E.pol[i]);
    for (uint32_t h = 0; h < E.n_hays; h++)
        eval_hay_free(&E.hays[h]);
    eval_prompt_free(&E.rec);
    free(E.res);
    free(E.items);
    free(E.fid);
    free(E.fid_err);
    free(E.ref);
    free(E.logits);
    kv_tok_destroy(E.tok);
    kv_model_free(E.m);
    return ret;
}
