/* SPDX-License-Identifier: MIT */
/*
 * test_prefix_ctx_model.c — compressed contexts on the real model
 * (SmolLM2-135M; kvpage.h, "compressed contexts"): a hit on a compressed
 * context gives the cache, the logits and the tokens of a cold run of the
 * same request, bit for bit, for every query-agnostic selection method and
 * compositions with INT4 pages.
 *
 * A request is a context (the first CTXN = 170 tokens of a chat prompt:
 * not a block multiple) and a rest (the next 24 tokens, as a question
 * would be). Per policy, in one store with the cache on:
 *   A (cold, publishing): forward the context in chunks of 128 (KVzip: its
 *     scoring pass, kv_model_kvzip_score), kv_seq_prefill_end, publish the
 *     compressed context; forward the rest as one chunk, kv_seq_step_end,
 *     then DEC greedy decode steps, each followed by kv_seq_step_end;
 *   B (hit): kv_model_session_context (no forward, no scoring pass, no
 *     pages allocated by the match), then the same rest and decode;
 *   C (cold, not publishing): A's calls without the publish (its pages are
 *     never shared, so appends fill its partial pages in place).
 * B's and C's rest-row logits and decode logits must equal A's (memcmp),
 * and the lists every sequence holds at the end must be the same length.
 */
#include <string.h>

#include "kv_model_test.h"

#define CTXN 170
#define REST 24
#define DEC 3
#define MAXCTX 224

static kv_model_session_t *session(const kv_model_t *m, kv_store_t *st, const char *spec)
{
    kv_model_session_opts_t o = {.store = st, .max_ctx = MAXCTX, .chunk = 128};
    kv_model_session_t *s = NULL;
    if (kv_model_session_create(m, &o, &s))
        exit(1);
    kv_seq_id_t q;
    kv_policy_t *p = NULL;
    char err[128];
    CHECK_OK(kv_model_session_seq(s, &q));
    CHECK_OK(kv_policy_parse(spec, &p, err, sizeof err));
    CHECK_OK(kv_seq_set_policy(st, q, p));
    kv_policy_destroy(p);
    return s;
}

/* The context, cold: forward, scoring pass (KVzip), prefill end. */
static void context(kv_model_session_t *s, kv_store_t *st, const kv_tok_t *tok,
                    const int32_t *ids, int kvzip)
{
    kv_seq_id_t q;
    CHECK_OK(kv_model_session_seq(s, &q));
    CHECK_OK(kv_model_forward(s, ids, CTXN, NULL, 0));
    if (kvzip)
        CHECK_OK(kv_model_kvzip_score(s, tok, ids, CTXN, 0, KV_MODEL_KVZIP_CHUNK));
    CHECK_OK(kv_seq_prefill_end(st, q));
}

/* The rest: one chunk, a step end, DEC decode steps with step ends;
 * out = [1 + DEC][V] logits (the rest's last row, then each step's). */
static void rest(kv_model_session_t *s, kv_store_t *st, const int32_t *ids, float *out,
                 uint32_t V)
{
    kv_seq_id_t q;
    CHECK_OK(kv_model_session_seq(s, &q));
    CHECK_OK(kv_model_forward(s, ids + CTXN, REST, out, 1));
    CHECK_OK(kv_seq_step_end(st, q));
    for (uint32_t i = 0; i < DEC; i++) {
        const float *last = out + (size_t)i * V;
        CHECK_OK(kv_model_decode(s, kv_model_argmax(last, V), out + (size_t)(i + 1) * V));
        CHECK_OK(kv_seq_step_end(st, q));
    }
}

static uint32_t kept(kv_store_t *st, kv_model_session_t *s)
{
    kv_seq_id_t q;
    uint32_t n = 0, all = 0;
    CHECK_OK(kv_model_session_seq(s, &q));
    kv_config_t c;
    CHECK_OK(kv_store_config(st, &c));
    for (uint32_t l = 0; l < c.n_layers; l++)
        for (uint32_t h = 0; h < c.n_kv_heads; h++) {
            CHECK_OK(kv_seq_len(st, q, l, h, &n));
            all += n;
        }
    return all;
}

static void one_policy(const kv_model_t *m, const kv_tok_t *tok, const int32_t *ids,
                       const char *spec)
{
    const uint32_t V = kv_model_hparams(m)->vocab;
    const int kvzip = strncmp(spec, "kvzip", 5) == 0;
    static const char fp[] = "SmolLM2-135M test fingerprint";
    kv_config_t cfg;
    kv_store_t *st = NULL;
    CHECK_OK(kv_model_store_config(m, MAXCTX + kv_model_kvzip_room(CTXN), 4, 0, &cfg));
    cfg.residual = 128;
    cfg.prefix_cache = 1;
    cfg.prefix_model = fp;
    cfg.prefix_model_len = sizeof fp - 1;
    if (kv_store_create(&cfg, &st))
        exit(1);
    const size_t rows = (size_t)(1 + DEC) * V;
    float *la = malloc(rows * 4), *lb = malloc(rows * 4), *lc = malloc(rows * 4);
    if (!la || !lb || !lc)
        exit(1);

    kv_model_session_t *a = session(m, st, spec);
    kv_seq_id_t qa;
    CHECK_OK(kv_model_session_seq(a, &qa));
    context(a, st, tok, ids, kvzip);
    CHECK_OK(kv_seq_prefix_publish_compressed(st, qa, ids, CTXN, NULL, 0));
    const uint32_t kept_ctx = kept(st, a);
    rest(a, st, ids, la, V);

    kv_stats_t s0 = {.struct_size = sizeof s0}, s1 = {.struct_size = sizeof s1};
    kv_store_stats(st, &s0);
    kv_model_session_t *b = session(m, st, spec);
    uint32_t got = 0;
    CHECK_OK(kv_model_session_context(b, ids, CTXN, NULL, 0, &got));
    CHECK_EQ(got, CTXN);
    CHECK_EQ(kv_model_session_pos(b), CTXN);
    kv_store_stats(st, &s1);
    CHECK_EQ(s1.pages_used, s0.pages_used); /* the match allocates no page */
    CHECK_EQ(kept(st, b), kept_ctx);
    rest(b, st, ids, lb, V);

    kv_model_session_t *c = session(m, st, spec);
    context(c, st, tok, ids, kvzip);
    rest(c, st, ids, lc, V);

    const int hit_same = memcmp(la, lb, rows * 4) == 0, cold_same = memcmp(la, lc, rows * 4) == 0;
    CHECK(hit_same);
    CHECK(cold_same);
    CHECK_EQ(kept(st, b), kept(st, a));
    CHECK_EQ(kept(st, c), kept(st, a));
    CHECK_OK(kv_store_check(st));
    kv_store_stats(st, &s1);
    CHECK_EQ(s1.prefix_ctx_hits, 1);
    printf("%-28s context %u tokens -> %u kept of %u (all lists); hit == cold publisher: %s; "
           "cold without publish == publisher: %s\n",
           spec, CTXN, kept_ctx, CTXN * cfg.n_layers * cfg.n_kv_heads, hit_same ? "yes" : "NO",
           cold_same ? "yes" : "NO");
    kv_model_session_free(a);
    kv_model_session_free(b);
    kv_model_session_free(c);
    CHECK_OK(kv_store_check(st));
    kv_store_destroy(st);
    free(la), free(lb), free(lc);
}

int main(void)
{
    kv_tok_t *tok = NULL;
    kv_model_t *m = kvt_load(&tok);
    uint32_t n = 0;
    int32_t *ids = kvt_prefix_prompt(tok, &n);
    CHECK(n >= CTXN + REST);
    static const char *const specs[] = {
        "snapkv:c=0.3,w=16,ada=1+int4",
        "h2o:hh=0.15,rw=0.15",
        "minikv:hh=0.15,rw=0.15",
        "streamingllm:sink=4,recent=0.3",
        "eattn:c=0.3",
        "kvzip:c=0.2,ada=1+int4",
    };
    for (size_t i = 0; n >= CTXN + REST && i < sizeof specs / sizeof *specs; i++)
        one_policy(m, tok, ids, specs[i]);
    free(ids);
    kv_tok_destroy(tok);
    kv_model_free(m);
    return kv_test_end();
}
