/* SPDX-License-Identifier: MIT */
/*
 * test_eval_agnostic.c — the query-agnostic setting of `kvpage eval`
 * (tools/kvpage/eval_run.c, cmd_eval.c): a context is prefilled and
 * compressed (kv_seq_prefill_end) before any question exists, then each
 * question is appended in a fork of it and answered.
 *
 *   ids    kv_tok_chat_split: the context's ids are the same for both
 *          questions, and equal kv_tok_chat's of the joined message (the
 *          context ends at a pre-tokenizer boundary), so both settings read
 *          the same tokens
 *   fp16   nothing is compressed: asking after prefill end in a fork gives
 *          the same answer as prefilling context + question whole, and the
 *          same first logits up to rounding (chunk boundaries differ)
 *   snapkv the context's kept tokens do not depend on the question (the
 *          parent's lists are the same before, between and after the two
 *          forks, and hold only context positions); the fork holds them
 *          followed by the question's and answer's; and the query-aware
 *          run keeps other tokens (its window is the question), which is
 *          what the setting changes
 *
 * A needle item with two questions on the filler haystack (about 330
 * context tokens). Skipped (77) without the model.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kv_model_test.h"
#include "tools/kvpage/eval_policy.h"
#include "tools/kvpage/eval_run.h"
#include "tools/kvpage/eval_task.h"

static const kv_model_t *M;
static const kv_tok_t *T;

/* Every list's positions (length first), into a malloc'd array. */
static int32_t *positions(const eval_run_t *r, size_t *n)
{
    const kv_model_hparams_t *hp = kv_model_hparams(M);
    size_t cap = 1024, o = 0;
    int32_t *out = malloc(cap * sizeof *out);
    CHECK(out != NULL);
    for (uint32_t l = 0; l < hp->n_layers; l++)
        for (uint32_t h = 0; h < hp->n_kv_heads; h++) {
            uint32_t len = 0;
            CHECK_OK(kv_seq_len(r->st, r->seq, l, h, &len));
            while (o + 1 + len > cap) {
                cap *= 2;
                out = realloc(out, cap * sizeof *out);
                CHECK(out != NULL);
            }
            out[o++] = (int32_t)len;
            if (len)
                CHECK_OK(kv_read(r->st, r->seq, l, h, 0, len, NULL, NULL, out + o));
            o += len;
        }
    *n = o;
    return out;
}

/* The positions below H of every list of a positions() array, in place;
 * returns the new length. */
static size_t below(int32_t *pos, size_t n, int32_t H)
{
    size_t w = 0;
    for (size_t o = 0; o < n;) {
        int32_t len = pos[o++], kept = 0;
        size_t at = w++;
        for (int32_t t = 0; t < len; t++, o++)
            if (pos[o] < H) {
                pos[w++] = pos[o];
                kept++;
            }
        pos[at] = kept;
    }
    return w;
}

/* Question qi's whole prompt (chat + context + question + prime). */
static int32_t *prompt_ids(const eval_item_t *it, uint32_t qi, uint32_t *n, uint32_t *head)
{
    const eval_question_t *q = &it->q[qi];
    size_t a = 0, b = 0, h = 0;
    CHECK_OK(kv_tok_chat_split(T, NULL, it->user, q->text, NULL, 0, &a, &h));
    CHECK_OK(kv_tok_encode(T, q->prime, strlen(q->prime), 0, NULL, 0, &b));
    int32_t *ids = malloc((a + b) * sizeof *ids);
    CHECK(ids != NULL);
    CHECK_OK(kv_tok_chat_split(T, NULL, it->user, q->text, ids, a, &a, &h));
    CHECK_OK(kv_tok_encode(T, q->prime, strlen(q->prime), 0, ids + a, b, &b));
    /* the joined message tokenizes the same */
    char *joined = malloc(it->user_len + strlen(q->text) + 1);
    CHECK(joined != NULL);
    strcpy(joined, it->user);
    strcat(joined, q->text);
    uint32_t nj;
    int32_t *j = kvt_chat(T, joined, &nj);
    CHECK_EQ(nj, a);
    CHECK(!memcmp(j, ids, a * sizeof *ids));
    free(j);
    free(joined);
    *n = (uint32_t)(a + b);
    *head = (uint32_t)h;
    return ids;
}

typedef struct answer {
    int32_t out[EVAL_STEPS_OUT];
    uint32_t n_out;
    float *first;      /* [vocab]: the logits the answer starts from */
} answer_t;

static void keep(answer_t *a, const eval_steps_t *s, const float *first, uint32_t vocab)
{
    memcpy(a->out, s->out, sizeof a->out);
    a->n_out = s->n_out;
    a->first = malloc(vocab * sizeof *a->first);
    CHECK(a->first != NULL);
    memcpy(a->first, first, vocab * sizeof *a->first);
}

/* Query-aware: the whole prompt, then prefill end, then the answer. The
 * kept positions after prefill end into *pos (if not NULL). */
static void run_aware(const eval_env_t *e, const eval_policy_t *p, const int32_t *ids,
                      uint32_t n, uint32_t max_new, answer_t *a, int32_t **pos, size_t *n_pos)
{
    const uint32_t vocab = kv_model_hparams(M)->vocab;
    float *logits = malloc(vocab * sizeof *logits);
    CHECK(logits != NULL);
    eval_run_t r;
    CHECK_OK(eval_run_start(e, p, ids, n, n + max_new, NULL, NULL, 0, logits, &r));
    CHECK_OK(eval_run_prefill_end(&r, p));
    if (pos)
        *pos = positions(&r, n_pos);
    float *first = malloc(vocab * sizeof *first);
    CHECK(first != NULL);
    memcpy(first, logits, vocab * sizeof *first);
    eval_steps_t s = {.n = max_new, .tok = T, .logits = logits};
    CHECK_OK(eval_run_steps(&r, p, &s));
    keep(a, &s, first, vocab);
    free(first);
    eval_run_close(&r);
    free(logits);
}

int main(void)
{
    kv_tok_t *tok;
    kv_model_t *m = kvt_load(&tok);
    M = m;
    T = tok;
    const uint32_t vocab = kv_model_hparams(m)->vocab;
    eval_env_t env = {.m = m, .threads = 2, .forks = 1};

    eval_item_spec_t spec = {.kind = EVAL_TASK_NEEDLE, .seed = 5, .n_units = 60,
                             .depth_pct = 25, .questions = 2};
    eval_item_t it;
    CHECK_OK(eval_item_make(&spec, &it));
    uint32_t n[2], head[2];
    int32_t *ids[2];
    for (uint32_t qi = 0; qi < 2; qi++)
        ids[qi] = prompt_ids(&it, qi, &n[qi], &head[qi]);
    CHECK_EQ(head[0], head[1]);
    CHECK(!memcmp(ids[0], ids[1], head[0] * sizeof *ids[0]));
    const uint32_t H = head[0];
    fprintf(stderr, "context %u tokens, questions %u and %u tokens\n", H, n[0] - H, n[1] - H);
    CHECK(H > 256 && n[0] - H > 8 && n[1] - H > 8);

    static const char *const specs[] = {"fp16", "snapkv:c=0.2"};
    for (size_t k = 0; k < 2; k++) {
        eval_policy_t p;
        char err[320];
        CHECK_OK(eval_policy_parse(specs[k], &p, err, sizeof err));
        /* agnostic: one compression, two questions in forks */
        float *logits = malloc(vocab * sizeof *logits);
        CHECK(logits != NULL);
        eval_run_t r;
        CHECK_OK(eval_run_start(&env, &p, ids[0], H, n[0] + 16, NULL, NULL, 0, logits, &r));
        CHECK_OK(eval_run_prefill_end(&r, &p));
        size_t np0;
        int32_t *pos0 = positions(&r, &np0);
        for (size_t i = 0, o = 0; o < np0; i++) { /* context positions only */
            int32_t len = pos0[o++];
            for (int32_t t = 0; t < len; t++, o++)
                CHECK(pos0[o] >= 0 && pos0[o] < (int32_t)H);
        }
        answer_t ag[2], aw[2];
        for (uint32_t qi = 0; qi < 2; qi++) {
            eval_run_t child;
            CHECK_OK(eval_run_fork(&r, &child));
            eval_steps_t s = {.n = it.q[qi].max_new, .tok = tok, .logits = logits};
            /* the answer's first logits are the question's last row */
            CHECK_OK(kv_model_forward(child.s, ids[qi] + H, n[qi] - H, logits, 1));
            float *first = malloc(vocab * sizeof *first);
            CHECK(first != NULL);
            memcpy(first, logits, vocab * sizeof *first);
            CHECK_OK(eval_policy_step_end(&p, child.st, child.seq));
            CHECK_OK(eval_run_steps(&child, &p, &s));
            keep(&ag[qi], &s, first, vocab);
            free(first);
            /* the fork: the context's kept tokens, then its own */
            size_t npc;
            int32_t *pc = positions(&child, &npc);
            for (size_t o0 = 0, oc = 0; o0 < np0 && oc < npc;) {
                int32_t l0 = pos0[o0++], lc = pc[oc++];
                CHECK(lc > l0);
                CHECK(!memcmp(pos0 + o0, pc + oc, (size_t)l0 * sizeof *pc));
                CHECK_EQ(pc[oc + l0], (int32_t)H);
                o0 += (size_t)l0;
                oc += (size_t)lc;
            }
            free(pc);
            eval_run_close_fork(&child);
            size_t np;
            int32_t *pos = positions(&r, &np); /* the parent did not change */
            CHECK(np == np0 && !memcmp(pos, pos0, np * sizeof *pos));
            free(pos);
            CHECK_OK(kv_store_check(r.st));
        }
        eval_run_close(&r);
        free(logits);
        /* aware: each question's whole prompt */
        int32_t *posw = NULL;
        size_t npw = 0;
        for (uint32_t qi = 0; qi < 2; qi++)
            run_aware(&env, &p, ids[qi], n[qi], it.q[qi].max_new, &aw[qi],
                      qi == 0 ? &posw : NULL, &npw);
        for (uint32_t qi = 0; qi < 2; qi++) {
            double diff = 0;
            for (uint32_t v = 0; v < vocab; v++)
                diff = fmax(diff, fabs((double)ag[qi].first[v] - aw[qi].first[v]));
            fprintf(stderr, "%s question %u: agnostic %u tokens, aware %u tokens, first "
                    "logits max |diff| %.3g\n", specs[k], qi, ag[qi].n_out, aw[qi].n_out, diff);
            if (k == 0) { /* fp16: the same cache either way */
                CHECK(diff < 1e-3);
                CHECK_EQ(ag[qi].n_out, aw[qi].n_out);
                CHECK(!memcmp(ag[qi].out, aw[qi].out, ag[qi].n_out * sizeof *ag[qi].out));
            } else { /* snapkv: the question chose what the aware run kept */
                CHECK(diff > 1e-3);
            }
            free(ag[qi].first);
            free(aw[qi].first);
        }
        /* the context tokens each setting kept: all of them in fp16; other ones
         * under SnapKV when the question is in its window */
        npw = below(posw, npw, (int32_t)H);
        int differs = npw != np0 || memcmp(posw, pos0, np0 * sizeof *pos0);
        CHECK(k == 0 ? !differs : differs);
        free(posw);
        free(pos0);
        eval_policy_destroy(&p);
    }
    for (uint32_t qi = 0; qi < 2; qi++)
        free(ids[qi]);
    eval_item_free(&it);
    kv_tok_destroy(tok);
    kv_model_free(m);
    return kv_test_end();
}
