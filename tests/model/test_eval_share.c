/* SPDX-License-Identifier: MIT */
/*
 * test_eval_share.c — `kvpage eval`'s shared prompt pass (tools/kvpage/
 * eval_run.c, in kvtool) gives bit for bit what the
 * policy's own forward pass gives, for every sharing class:
 *
 *   none      streamingllm, streamingllm+int4, simlayerkv (decode mode),
 *             minicache
 *   all rows  h2o, h2o+cam, minikv (INT2 at prefill end), eattn (w 0,
 *             ada=1: query moments of every row)
 *   rows      snapkv (w 32), snapkv w 64 + int2 (w longer than the last
 *             chunk), simlayerkv mode=prefill, eattn w 48 + int4
 *
 * A ~300-token chat prompt (two forward chunks of 256 and the rest), then
 * 8 teacher-forced decode steps with the policy's step end after each. Per
 * policy, once unshared (its own forward pass) and once replaying fp16's
 * recorded pass; equal: the logits before every step, the summed NLL, the
 * store's counters (pages by format, KV, FP16 and metadata bytes, tokens)
 * and every list's K, V and positions (kv_read). The windowed policies run
 * twice: from a recording that kept every query row, and from one that kept
 * only the rows they need. A recording with one key perturbed must change
 * the result (the replay is what the run used). The sharing classes of the
 * policy specs, the non-sharing ones included (kivi2, minicache+int4,
 * simlayerkv+kivi4), are checked too. Skipped (77) without the model.
 * KV_EVAL_SHARE_QUICK=1 (the sanitizer build sets it: the full set runs
 * past its time limit under ASan) checks one policy per sharing class:
 * streamingllm, h2o, snapkv w 64 + int2 (from both recordings), and eattn.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kv_model_test.h"
#include "tools/kvpage/eval_policy.h"
#include "tools/kvpage/eval_run.h"

#define STEPS 8u

static const kv_model_t *M;

typedef struct trace {
    uint64_t h[STEPS];   /* FNV-1a of the logits before each step */
    double nll;
    kv_stats_t st;
    float *kv;           /* every list's K, V (FP32) and positions */
    size_t n_kv;
} trace_t;

static int hash_logits(void *user, uint32_t i, const float *logits)
{
    trace_t *t = user;
    const unsigned char *b = (const unsigned char *)logits;
    uint64_t h = 1469598103934665603ull;
    for (size_t j = 0; j < (size_t)kv_model_hparams(M)->vocab * sizeof *logits; j++)
        h = (h ^ b[j]) * 1099511628211ull;
    t->h[i] = h;
    return 0;
}

/* Everything the sequence holds, list by list, into t->kv. */
static void dump(const eval_run_t *r, trace_t *t)
{
    const kv_model_hparams_t *hp = kv_model_hparams(M);
    size_t total = 0;
    for (uint32_t l = 0; l < hp->n_layers; l++)
        for (uint32_t h = 0; h < hp->n_kv_heads; h++) {
            uint32_t len;
            CHECK_OK(kv_seq_len(r->st, r->seq, l, h, &len));
            total += 1 + (size_t)len * (2 * hp->head_dim + 1);
        }
    t->kv = calloc(total, sizeof *t->kv);
    CHECK(t->kv != NULL);
    size_t o = 0;
    for (uint32_t l = 0; l < hp->n_layers; l++)
        for (uint32_t h = 0; h < hp->n_kv_heads; h++) {
            uint32_t len;
            CHECK_OK(kv_seq_len(r->st, r->seq, l, h, &len));
            t->kv[o++] = (float)len;
            if (!len)
                continue;
            int32_t *pos = malloc(len * sizeof *pos);
            CHECK(pos != NULL);
            CHECK_OK(kv_read(r->st, r->seq, l, h, 0, len, t->kv + o,
                             t->kv + o + (size_t)len * hp->head_dim, pos));
            o += (size_t)len * 2 * hp->head_dim;
            for (uint32_t i = 0; i < len; i++)
                t->kv[o++] = (float)pos[i];
            free(pos);
        }
    t->n_kv = o;
}

/* One run of p over ids (n prompt tokens, then STEPS forced ones). */
static void run(const eval_env_t *e, const eval_policy_t *p, const int32_t *ids, uint32_t n,
                const eval_prompt_t *replay, eval_prompt_t *record, uint32_t q0, trace_t *t)
{
    float *logits = malloc((size_t)kv_model_hparams(M)->vocab * sizeof *logits);
    CHECK(logits != NULL);
    eval_run_t r;
    *t = (trace_t){0};
    CHECK_OK(eval_run_start(e, p, ids, n, n + STEPS, replay, record, q0, logits, &r));
    eval_steps_t s = {.force = ids + n, .n = STEPS, .logits = logits, .before = hash_logits,
                      .user = t};
    CHECK_OK(eval_run_prefill_end(&r, p));
    CHECK_OK(eval_run_steps(&r, p, &s));
    t->nll = s.nll;
    CHECK_OK(kv_store_check(r.st));
    t->st.struct_size = sizeof t->st;
    CHECK_OK(kv_store_stats(r.st, &t->st));
    dump(&r, t);
    eval_run_close(&r);
    free(logits);
}

static int same(const trace_t *a, const trace_t *b)
{
    int eq = !memcmp(a->h, b->h, sizeof a->h) && !memcmp(&a->nll, &b->nll, sizeof a->nll) &&
             a->st.kv_bytes == b->st.kv_bytes && a->st.fp16_bytes == b->st.fp16_bytes &&
             a->st.meta_bytes == b->st.meta_bytes && a->st.tokens == b->st.tokens &&
             !memcmp(a->st.pages_by_format, b->st.pages_by_format,
                     sizeof a->st.pages_by_format) &&
             a->n_kv == b->n_kv && !memcmp(a->kv, b->kv, a->n_kv * sizeof *a->kv);
    return eq;
}

static void parse(const char *spec, eval_policy_t *p)
{
    char err[320];
    if (eval_policy_parse(spec, p, err, sizeof err)) {
        fprintf(stderr, "%s\n", err);
        exit(1);
    }
}

static void test_classes(void)
{
    static const struct {
        const char *spec;
        int shares, all_rows;
        uint32_t rows;
    } cases[] = {
        {"fp16", 1, 0, 0},
        {"kivi2", 0, 0, 0},
        {"kivi4", 0, 0, 0},
        {"int4", 0, 0, 0},
        {"minicache", 1, 0, 0},
        {"minicache+int4", 0, 0, 0},
        {"simlayerkv", 1, 0, 0},
        {"simlayerkv+kivi4", 0, 0, 0},
        {"simlayerkv:mode=prefill,rows=48", 1, 0, 48},
        {"simlayerkv:mode=prefill+snapkv:w=16", 1, 0, 32},
        {"simlayerkv+snapkv+int2", 1, 0, 32},
        {"streamingllm", 1, 0, 0},
        {"streamingllm+int4", 1, 0, 0},
        {"streamingllm+cam", 1, 1, 0},
        {"h2o", 1, 1, 0},
        {"h2o+kivi2", 1, 1, 0},
        {"minikv", 1, 1, 0},
        {"snapkv:w=64", 1, 0, 64},
        {"eattn", 1, 1, 0},
        {"eattn:w=48+int4", 1, 0, 48},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        eval_policy_t p;
        parse(cases[i].spec, &p);
        if (p.share.shares != cases[i].shares || p.share.all_rows != cases[i].all_rows ||
            p.share.rows != cases[i].rows) {
            fprintf(stderr, "%s (%s): shares %d all_rows %d rows %u\n", cases[i].spec, p.spec,
                    p.share.shares, p.share.all_rows, p.share.rows);
            CHECK(0);
        }
        eval_policy_destroy(&p);
    }
}

int main(void)
{
    test_classes();
    kv_tok_t *tok;
    kv_model_t *m = kvt_load(&tok);
    M = m;
    eval_env_t env = {.m = m, .threads = 2};
    char user[4096] = "Read this and remember the pass key. ";
    for (int i = 0; i < 19; i++)
        strcat(user, i == 9 ? "The pass key is 48213. Remember it. "
                            : "The grass is green. The sky is blue. The sun is yellow. ");
    strcat(user, "What is the pass key? The pass key is 48213. The grass is green.");
    uint32_t total;
    int32_t *ids = kvt_chat(tok, user, &total);
    CHECK(total > 256 + 40 + STEPS + 1);
    const uint32_t n = total - STEPS - 1; /* 2 chunks: 256 + the rest */
    fprintf(stderr, "prompt %u tokens (last chunk %u)\n", n, n - 256);

    static const char *const specs[] = {
        "fp16",
        "streamingllm:recent=0.3",
        "streamingllm:recent=0.3+int4",
        "simlayerkv:w=64,delta=0.5",
        "minicache",
        "h2o:hh=0.2,rw=0.1",
        "h2o:hh=0.2,rw=0.1+cam",
        "minikv:hh=0.25,rw=0.25",
        "eattn:c=0.3,theta=100000,ada=1",
        "snapkv:c=0.4",
        "snapkv:w=64,c=0.4+int2",
        "simlayerkv:w=64,delta=0.5,mode=prefill",
        "eattn:w=48,c=0.4,theta=100000+int4",
    };
    enum { N = sizeof specs / sizeof specs[0] };
    eval_policy_t pol[N];
    for (int i = 0; i < N; i++) {
        parse(specs[i], &pol[i]);
        CHECK(pol[i].share.shares);
    }
    /* fp16's pass, recorded for all of them (queries of every row) and for
     * the windowed ones only (queries of the last rows) */
    eval_prompt_t all = {0}, win = {0};
    trace_t ref, ref2;
    uint32_t q_all = eval_prompt_q0(pol + 1, N - 1, n), q_win = eval_prompt_q0(pol + 9, 4, n);
    CHECK_EQ(q_all, 0);
    CHECK_EQ(q_win, n - (n - 256 < 64 ? n - 256 : 64));
    run(&env, &pol[0], ids, n, NULL, &all, q_all, &ref);
    run(&env, &pol[0], ids, n, NULL, &win, q_win, &ref2);
    CHECK(same(&ref, &ref2)); /* recording changes nothing */
    free(ref2.kv);
    CHECK_EQ(all.n, n);
    CHECK_EQ(win.q0, q_win);

    const char *qe = getenv("KV_EVAL_SHARE_QUICK");
    const int quick = qe && *qe && strcmp(qe, "0") != 0;
    for (int i = 1; i < N; i++) {
        if (quick && i != 1 && i != 5 && i != 8 && i != 10)
            continue; /* one per class: none, all rows, rows; eattn */
        trace_t own, shared;
        run(&env, &pol[i], ids, n, NULL, NULL, 0, &own);
        run(&env, &pol[i], ids, n, &all, NULL, 0, &shared);
        int ok = same(&own, &shared);
        fprintf(stderr, "%-40s own vs shared: %s (kv %llu bytes, nll %.6f)\n", specs[i],
                ok ? "identical" : "DIFFERENT", (unsigned long long)own.st.kv_bytes,
                own.nll / STEPS);
        CHECK(ok);
        free(shared.kv);
        if (i >= 9) { /* windowed: from the recording of the last rows only */
            run(&env, &pol[i], ids, n, &win, NULL, 0, &shared);
            CHECK(same(&own, &shared));
            free(shared.kv);
        }
        free(own.kv);
    }
    /* the replay is what the run used: a perturbed key changes the result */
    trace_t own, bad;
    run(&env, &pol[5], ids, n, NULL, NULL, 0, &own);
    all.k[(size_t)all.KD * 3] += 0.5f;
    run(&env, &pol[5], ids, n, &all, NULL, 0, &bad);
    CHECK(!same(&own, &bad));
    free(own.kv);
    free(bad.kv);
    /* a recording of another length is refused */
    float *lg = malloc((size_t)kv_model_hparams(m)->vocab * sizeof *lg);
    eval_run_t r;
    CHECK(lg != NULL);
    CHECK_EQ(eval_run_start(&env, &pol[5], ids, n - 1, n + STEPS, &all, NULL, 0, lg, &r),
             KV_EINVAL);
    /* windowed recording, policy that needs every row: refused, not wrong */
    CHECK_EQ(eval_run_start(&env, &pol[5], ids, n, n + STEPS, &win, NULL, 0, lg, &r), KV_EINVAL);
    free(lg);

    free(ref.kv);
    eval_prompt_free(&all);
    eval_prompt_free(&win);
    for (int i = 0; i < N; i++)
        eval_policy_destroy(&pol[i]);
    free(ids);
    kv_tok_destroy(tok);
    kv_model_free(m);
    return 0;
}
